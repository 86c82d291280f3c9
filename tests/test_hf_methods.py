"""Every attention method on Hugging Face models equals the reference computation.

The explained batch is padded (right, and left for GPT-2); the reference runs each text
alone, unpadded, on the model's own eager path (reference_hf). Padding positions must be
exactly 0 and must not change any other token's relevance.
"""

from __future__ import annotations

import functools

import pytest
import reference_hf as ref
import torch
from tolerances import FLOAT32

from explain import Explainer, InputError
from explain.testing import ModelState

METHODS = ["raw_attention", "rollout", "generic", "attention_gradcam"]
TEXTS = [[2, 14, 7, 33, 9, 21, 3], [2, 41, 3], [2, 5, 17, 28, 3]]
TARGETS = [1, 0, 2]

# (model name, padding side)
TEXT_CASES = [(name, "right") for name in ref.TEXT_MODELS] + [("gpt2", "left")]


@functools.cache
def _text_case(name: str, side: str):
    model = ref.tiny_text_model(name)
    kind = ref.TEXT_MODELS[name][2]
    batch = ref.padded_batch(TEXTS, side)
    references = [
        ref.reference(model, {"input_ids": torch.tensor([text])}, kind, target, "logit")
        for text, target in zip(TEXTS, TARGETS, strict=True)
    ]
    return model, batch, references


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("name", "side"), TEXT_CASES)
def test_text_methods_match_reference(name, side, method):
    model, batch, references = _text_case(name, side)
    result = Explainer(model).explain(batch, target=TARGETS, method=method)
    assert result.relevance.shape == batch["input_ids"].shape
    assert result.relevances == {"text": result.relevance}
    assert result.input_size is None
    for b, found in enumerate(references):
        real = ref.real_positions(batch["attention_mask"][b])
        kept = torch.ones(len(real), dtype=torch.bool)
        expected = ref.method(method, found, kept)
        torch.testing.assert_close(result.relevance[b, real], expected, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(result.logits[b], found.logits, rtol=1e-4, atol=1e-5)
        pads = ~batch["attention_mask"][b].bool()
        assert (result.relevance[b, pads] == 0).all()


@pytest.mark.parametrize("start", [1, -1])
@pytest.mark.parametrize("method", ["generic", "rollout"])
def test_start_layer_matches_reference(method, start):
    model, batch, references = _text_case("bert-classifier", "right")
    result = Explainer(model).explain(batch, target=TARGETS, method=method, start_layer=start)
    for b, found in enumerate(references):
        real = ref.real_positions(batch["attention_mask"][b])
        expected = ref.method(method, found, None, start=start % len(found.attentions))
        torch.testing.assert_close(result.relevance[b, real], expected, rtol=1e-4, atol=1e-6)


IMAGE_TARGETS = [4, 1]


@functools.cache
def _image_case(name: str):
    model = ref.tiny_image_model(name)
    generator = torch.Generator().manual_seed(3)
    images = torch.randn(2, 3, ref.IMAGE_SIZE, ref.IMAGE_SIZE, generator=generator)
    kind = "image-teacher" if name == "deit-teacher" else "image"
    references = [
        ref.reference(model, {"pixel_values": images[b : b + 1]}, kind, target, "logit")
        for b, target in enumerate(IMAGE_TARGETS)
    ]
    return model, images, references


@pytest.mark.parametrize("name", sorted(ref.IMAGE_MODELS))
@pytest.mark.parametrize("method", METHODS)
def test_image_methods_match_reference(name, method):
    model, images, references = _image_case(name)
    prefix = 2 if name == "deit-teacher" else 1
    result = Explainer(model).explain(images, target=IMAGE_TARGETS, method=method)
    grid = ref.IMAGE_SIZE // 4
    assert result.relevance.shape == (2, grid, grid)
    assert result.heatmap().shape == (2, ref.IMAGE_SIZE, ref.IMAGE_SIZE)
    for b, found in enumerate(references):
        kept = torch.arange(found.row.shape[0]) >= prefix
        expected = ref.method(method, found, kept)[prefix:].reshape(grid, grid)
        torch.testing.assert_close(result.relevance[b], expected, rtol=1e-4, atol=1e-6)


def test_image_size_must_match():
    model, _, _ = _image_case("vit")
    with pytest.raises(InputError, match="takes 16x16 images"):
        Explainer(model).explain(torch.randn(1, 3, 32, 32))


def test_default_target_is_the_prediction():
    model, batch, references = _text_case("gpt2", "left")
    result = Explainer(model).explain(batch)
    assert result.target.tolist() == [int(found.logits.argmax()) for found in references]


def test_several_targets_per_text():
    model, batch, _ = _text_case("distilbert-classifier", "right")
    explainer = Explainer(model)
    both = explainer.explain(batch, target=torch.tensor([[0, 2]] * 3))
    assert both.relevance.shape == (3, 2, batch["input_ids"].shape[1])
    for k, target in enumerate([0, 2]):
        alone = explainer.explain(batch, target=target)
        torch.testing.assert_close(both.relevance[:, k], alone.relevance, **FLOAT32)


def test_sdpa_restored_and_nothing_changed():
    model, batch, _ = _text_case("bert-classifier", "right")
    assert model.config._attn_implementation == "sdpa"
    before = ModelState.capture(model)
    Explainer(model).explain(batch, target=TARGETS)
    assert before.differences(ModelState.capture(model)) == []
    assert model.config._attn_implementation == "sdpa"


def test_albert_reuses_one_layer_for_every_block():
    model, _, _ = _text_case("albert-classifier", "right")
    adapter = Explainer(model).adapter
    assert adapter.num_layers == model.config.num_hidden_layers == 3
    assert len({id(block) for block in adapter.blocks}) == 1


def test_any_attention_implementation_is_switched_and_restored():
    """A model loaded for flash attention (a kernel this CPU test never runs) is explained on
    the eager path all the same, and keeps its setting."""
    model = ref.tiny_text_model("distilbert-classifier")
    batch = ref.padded_batch(TEXTS)
    expected = Explainer(model).explain(batch, target=TARGETS).relevance
    model.config._attn_implementation_internal = "flash_attention_2"
    before = ModelState.capture(model)
    result = Explainer(model).explain(batch, target=TARGETS)
    assert before.differences(ModelState.capture(model)) == []
    assert model.config._attn_implementation == "flash_attention_2"
    torch.testing.assert_close(result.relevance, expected, **FLOAT32)
