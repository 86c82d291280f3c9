"""Your own transformer through `TransformerSpec`: two hand-written models (a ViT-style
and a text-style one), every attention method, generic and rollout against an
independent computation, promises, wrappers, and the errors that say what to do."""

from __future__ import annotations

import pytest
import reference_backbones as refb
import torch
import torch.distributed as dist
from tolerances import FLOAT32, FLOAT64
from torch import nn

from explain import (
    METHODS,
    Explainer,
    ExplainError,
    InputError,
    TransformerSpec,
    UnsupportedModelError,
    explain,
)
from explain.rules import Need
from explain.testing import (
    HandWrittenViT,
    ModelState,
    tiny_custom_text,
    tiny_custom_vit,
)

ATTENTION_METHODS = ["raw_attention", "rollout", "generic", "attention_gradcam", "random"]


def _images(batch=2):
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(2))


def _texts():
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 40, (3, 7), generator=generator)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 6 + [0]])
    return {"input_ids": ids * mask, "attention_mask": mask}


@pytest.mark.parametrize("method", ["generic", "rollout"])
def test_vit_matches_independent_computation(method):
    model, spec = tiny_custom_vit()
    model, images = model.double(), _images().double()
    start = 1 if method == "rollout" else 0
    result = Explainer(model, spec=spec).explain(images, method=method, start_layer=start)
    for b in range(images.shape[0]):
        attentions, grads, logits = refb.hooked_attentions_and_gradients(
            model,
            lambda m: [layer.mixer.probs for layer in m.layers],
            lambda m, b=b: m(images[b : b + 1]),
        )
        assert result.target[b] == logits.argmax()
        row = torch.zeros(attentions[0].shape[-1], dtype=torch.float64)
        row[0] = 1.0
        expected = refb.method(method, attentions, grads, row, start)
        torch.testing.assert_close(result.relevance[b], expected[1:].reshape(4, 4), **FLOAT64)


@pytest.mark.parametrize("method", ["generic", "rollout"])
def test_text_matches_independent_computation_with_padding(method):
    model, spec = tiny_custom_text()
    model, texts = model.double(), _texts()
    result = Explainer(model, spec=spec).explain(texts, method=method, target=1)
    for b, length in enumerate(texts["attention_mask"].sum(dim=1).tolist()):
        ids = texts["input_ids"][b : b + 1, :length]  # the text alone, unpadded
        attentions, grads, _ = refb.hooked_attentions_and_gradients(
            model,
            lambda m: [block.attention.probs for block in m.encoder.blocks],
            lambda m, ids=ids: m(input_ids=ids),
            target=1,
        )
        row = torch.full((length,), 1.0 / length, dtype=torch.float64)  # the token mean
        expected = refb.method(method, attentions, grads, row)
        torch.testing.assert_close(result.relevance[b, :length], expected, **FLOAT64)
        assert (result.relevance[b, length:] == 0).all()  # padding exactly 0


@pytest.mark.parametrize("method", ATTENTION_METHODS)
def test_every_attention_method_batch_equals_single_and_no_side_effects(method):
    for build, inputs, single in (
        (tiny_custom_vit, _images(3), lambda x, b: x[b : b + 1]),
        (tiny_custom_text, _texts(), lambda x, b: {k: v[b : b + 1] for k, v in x.items()}),
    ):
        model, spec = build()
        model.train()  # mid-training: the text model's attention dropout must stay off
        explainer = Explainer(model, spec=spec)
        before = ModelState.capture(model)
        batch = explainer.explain(inputs, method=method, target=2)
        assert before.differences(ModelState.capture(model)) == []
        if method == "random":  # reproducible per seed and batch, not per sample
            continue
        for b in range(batch.relevance.shape[0]):
            alone = explainer.explain(single(inputs, b), method=method, target=2)
            torch.testing.assert_close(batch.relevance[b], alone.relevance[0], **FLOAT32)


def test_probabilities_seen_as_the_input_of_a_module():
    model, spec = tiny_custom_vit()
    images = _images()
    as_input = TransformerSpec(
        blocks="layers.*",
        attention="mixer.mix",
        probabilities="input",
        patch_size=8,
        prefix_tokens=1,
    )
    for method in ("generic", "rollout"):
        expected = Explainer(model, spec=spec).explain(images, method=method).relevance
        actual = Explainer(model, spec=as_input).explain(images, method=method).relevance
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    wrong = TransformerSpec(
        blocks="layers", attention="mixer.out", probabilities="input", patch_size=8
    )
    with pytest.raises(ExplainError, match=r"the first input of attention='mixer.out'"):
        Explainer(model, spec=wrong).explain(images)


def test_one_shot_explain_takes_the_spec():
    model, spec = tiny_custom_vit()
    images = _images()
    once = explain(model, images, spec=spec, method="rollout")
    explained = Explainer(model, spec=spec).explain(images, method="rollout")
    torch.testing.assert_close(once.relevance, explained.relevance, rtol=0, atol=0)


def test_trace_and_readout_options():
    model, spec = tiny_custom_text()
    texts = _texts()
    trace = Explainer(model, spec=spec).trace(texts)
    assert len(trace.attentions) == 2 and trace.attentions[0].shape == (3, 2, 7, 7)
    assert len(trace.hidden_states) == 3
    last = TransformerSpec(blocks="encoder.blocks.*", attention="attention.probs", readout="last")
    explainer = Explainer(model, spec=last)
    row = explainer.adapter.readout(explainer.adapter.prepare(texts))
    assert row.argmax(dim=1).tolist() == [6, 3, 5]  # each text's last real token
    nested = TransformerSpec(blocks="*.blocks.*", attention="attention.probs")
    assert Explainer(model, spec=nested).adapter.blocks == list(model.encoder.blocks)
    first = TransformerSpec(blocks=list(model.encoder.blocks), attention="attention.probs")
    explanation = Explainer(model, spec=first).explain(texts, method="raw_attention")
    assert explanation.relevance.shape == (3, 7)


def test_wrapped_models_are_explained_through_their_wrappers(tmp_path):
    model, spec = tiny_custom_vit()
    images = _images()
    expected = Explainer(model, spec=spec).explain(images).relevance
    # the wrappers forward to the model itself (compiled code never runs): the same numbers
    for wrapped in (nn.DataParallel(model), torch.compile(model)):
        explained = Explainer(wrapped, spec=spec).explain(images)
        torch.testing.assert_close(explained.relevance, expected, rtol=0, atol=0)

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(model)
        explained = Explainer(ddp, spec=spec).explain(images)
        torch.testing.assert_close(explained.relevance, expected, rtol=0, atol=0)
    finally:
        dist.destroy_process_group()


def test_fused_attention_gets_an_error_that_says_what_to_do():
    model, spec = tiny_custom_vit(fused=True)
    with pytest.raises(ExplainError, match=r"never ran in the forward pass.*nn\.Identity"):
        Explainer(model, spec=spec).explain(_images())
    layer = nn.TransformerEncoderLayer(32, 4, batch_first=True)
    encoder = nn.Sequential(nn.TransformerEncoder(layer, num_layers=2), nn.Linear(32, 3))
    with pytest.raises(ExplainError, match=r"need_weights=False.*write the block yourself"):
        Explainer(encoder, spec=TransformerSpec(blocks="0.layers.*", attention="self_attn"))
    with pytest.raises(ExplainError, match=r"nn\.MultiheadAttention"):
        Explainer(
            encoder, spec=TransformerSpec(blocks=[encoder[0]], attention="layers.0.self_attn")
        )


def test_spec_mistakes_get_errors_that_say_what_to_do():
    model, _ = tiny_custom_vit()
    images = _images()
    with pytest.raises(ExplainError, match="children: patchify, layers, norm, head"):
        Explainer(model, spec=TransformerSpec(blocks="blocks.*", attention="mixer.probs"))
    with pytest.raises(ExplainError, match="children: patchify, layers, norm, head"):
        Explainer(model, spec=TransformerSpec(blocks="blocks", attention="mixer.probs"))
    with pytest.raises(ExplainError, match="not a module path of _ViTBlock"):
        Explainer(model, spec=TransformerSpec(blocks="layers.*", attention="attn.drop"))
    scores = TransformerSpec(blocks="layers", attention="mixer.query", patch_size=8)
    with pytest.raises(ExplainError, match=r"shape \(2, 17, 32\)"):
        Explainer(model, spec=scores).explain(images)
    prefix = TransformerSpec(blocks="layers", attention="mixer.probs", patch_size=8)
    with pytest.raises(ExplainError, match=r"17 tokens, but the input has 16.*prefix_tokens"):
        Explainer(model, spec=prefix).explain(images)
    coarse = TransformerSpec(
        blocks="layers", attention="mixer.probs", patch_size=16, prefix_tokens=1
    )
    with pytest.raises(ExplainError, match=r"input has 5 \(1 prefix token \+ patches\)"):
        Explainer(model, spec=coarse).explain(images)
    no_patch = TransformerSpec(blocks="layers", attention="mixer.probs")
    with pytest.raises(ExplainError, match="patch_size"):
        Explainer(model, spec=no_patch).explain(images)
    with pytest.raises(ExplainError, match="readout must be"):
        TransformerSpec(blocks="layers", attention="mixer.probs", readout="cls").adapter(model)
    _, spec = tiny_custom_vit()
    with pytest.raises(UnsupportedModelError):
        Explainer(model, spec=spec).explain(images, method="transformer_attribution")
    # An image model given text: refused before its forward (issue 37: a raw TypeError
    # from forward(input_ids=...), or conv2d on token ids)
    texts = _texts()
    for given in (texts, texts["input_ids"]):
        with pytest.raises(InputError, match=r"takes images \(B, C, H, W\).*patch_size \(8\)"):
            Explainer(model, spec=spec).explain(given)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(patch_size=0), "patch_size must be a positive int"),
        (dict(patch_size=(8, 0)), "patch_size must be a positive int"),
        (dict(patch_size=(8, 8, 8)), "patch_size must be a positive int"),
        (dict(patch_size=8.0), "patch_size must be a positive int"),
        (dict(patch_size=True), "patch_size must be a positive int"),
        (dict(blocks=None), "blocks must be a dotted name"),
        (dict(blocks=3), "blocks must be a dotted name"),
        (dict(attention=None), "attention must name the module"),
        (dict(prefix_tokens="1"), "prefix_tokens must be an int"),
    ],
)
def test_spec_fields_of_the_wrong_kind_are_clear_errors(change, message):
    model, spec = tiny_custom_vit()
    bad = TransformerSpec(**{**vars(spec), **change})
    with pytest.raises(ExplainError, match=message):
        Explainer(model, spec=bad)


def test_unsupported_models_point_to_the_spec():
    with pytest.raises(UnsupportedModelError, match="TransformerSpec"):
        Explainer(HandWrittenViT())


def test_methods_list_is_covered():
    # The LRP walks, the Gradient x Input rules and the methods that read the input
    # embeddings need a family's own modules: refused.
    embeddings = {Need.EMBEDDING_GRADIENTS, Need.EMBEDDING_COPIES}
    rules = {
        name
        for name, spec in METHODS.items()
        if spec.lrp_rules is not None or spec.needs & embeddings
    }
    assert set(ATTENTION_METHODS) | rules == set(METHODS)
