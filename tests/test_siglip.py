"""SiglipModel image-text similarity through the dual-encoder route: image relevance read
out by the attention pooling head's probe attention, text relevance at the last
position; both towers against an independent computation (output_attentions +
autograd), the readout row itself, promises and errors."""

from __future__ import annotations

import copy

import pytest
import torch
from tolerances import FLOAT32, FLOAT64

import reference_vit as ref
from explain import Explainer, InputError
from explain.testing import ModelState, tiny_siglip

GRID = (4, 4)


def _inputs(num_images=2, length=7, seed=0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return {
        "pixel_values": torch.randn(num_images, 3, 32, 32, generator=generator, dtype=dtype),
        "input_ids": torch.randint(3, 50, (num_images, length), generator=generator),
    }


def _reference(model, image, ids):
    """Per-tower (attentions, gradients) of one pair's similarity logit, the probe's
    head-averaged attention (caught on the pooling head's nn.MultiheadAttention) and the
    logit."""
    model = copy.deepcopy(model).eval()
    model.set_attn_implementation("eager")
    probe = []
    model.vision_model.head.attention.register_forward_hook(
        lambda module, args, output: probe.append(output[1][0, 0].detach())
    )
    output = model(pixel_values=image[None], input_ids=ids[None], output_attentions=True)
    towers = {
        "image": output.vision_model_output.attentions,
        "text": output.text_model_output.attentions,
    }
    for attentions in towers.values():
        for attention in attentions:
            attention.retain_grad()
    output.logits_per_image[0, 0].backward()
    maps = {
        tower: ([a[0].detach() for a in atts], [a.grad[0].detach() for a in atts])
        for tower, atts in towers.items()
    }
    return maps, probe[0], output.logits_per_image[0, 0].detach()


@pytest.mark.parametrize("method", ["generic", "rollout"])
def test_both_towers_match_independent_computation(method):
    model, inputs = tiny_siglip().double(), _inputs(dtype=torch.float64)
    result = Explainer(model).explain(inputs, method=method, start_layer=0)
    for b in range(2):
        maps, probe, logit = _reference(model, inputs["pixel_values"][b], inputs["input_ids"][b])
        torch.testing.assert_close(result.logits[b, b], logit, **FLOAT64)
        torch.testing.assert_close(probe.sum(), torch.tensor(1.0, dtype=torch.float64), **FLOAT64)
        text_row = torch.zeros(inputs["input_ids"].shape[1], dtype=torch.float64)
        text_row[-1] = 1.0  # SigLIP pools the last position
        for tower, row in (("image", probe), ("text", text_row)):
            attentions, grads = maps[tower]
            if method == "generic":
                expected = ref.generic(attentions, grads, row)
            else:
                expected = ref.rollout(attentions, row)
            if tower == "image":
                expected = expected.reshape(GRID)
            torch.testing.assert_close(result.relevances[tower][b], expected, **FLOAT64)


def test_image_readout_row_is_the_probe_attention_and_sums_to_one():
    model, inputs = tiny_siglip().double(), _inputs(dtype=torch.float64)
    explainer = Explainer(model)
    prepared = explainer.adapter.prepare(inputs)
    row = explainer.adapter.stack_readout(prepared, "image")
    assert row.shape == (2, GRID[0] * GRID[1])
    torch.testing.assert_close(row.sum(dim=1), torch.ones(2, dtype=torch.float64), **FLOAT64)
    for b in range(2):
        _, probe, _ = _reference(model, inputs["pixel_values"][b], inputs["input_ids"][b])
        # the row comes from the tower's sdpa forward, the probe from its eager one, whose
        # softmax transformers computes in float32 even in a float64 model
        torch.testing.assert_close(row[b], probe, **FLOAT32)
    assert not torch.allclose(row[0], torch.full_like(row[0], 1 / row.shape[1]), atol=1e-3)


def test_zero_shot_batch_equals_single_and_no_side_effects():
    model, inputs = tiny_siglip(), _inputs(num_images=3)
    model.train()  # mid-training, with attention dropout that an explanation must not use
    for module in model.modules():
        if type(module).__name__ == "SiglipAttention":
            module.dropout = 0.2
    explainer = Explainer(model)
    for method in ("generic", "rollout", "raw_attention", "attention_gradcam"):
        before = ModelState.capture(model)
        batch = explainer.explain(inputs, method=method, target=[2, 0, 1])
        assert before.differences(ModelState.capture(model)) == []
        for b, text in enumerate([2, 0, 1]):
            single = explainer.explain(
                {
                    "pixel_values": inputs["pixel_values"][b : b + 1],
                    "input_ids": inputs["input_ids"][text : text + 1],
                },
                method=method,
            )
            for tower in ("image", "text"):
                torch.testing.assert_close(
                    batch.relevances[tower][b], single.relevances[tower][0], **FLOAT32
                )


def test_errors_say_what_to_do():
    model, inputs = tiny_siglip(), _inputs()
    explainer = Explainer(model)
    padded = dict(inputs, attention_mask=torch.tensor([[1] * 7, [1] * 5 + [0] * 2]))
    with pytest.raises(InputError, match="padding='max_length'"):
        explainer.explain(padded)
    with pytest.raises(InputError, match="takes 32x32 images"):
        explainer.explain(dict(inputs, pixel_values=torch.randn(2, 3, 40, 40)))
    with pytest.raises(InputError, match="SiglipProcessor"):
        explainer.explain(inputs["pixel_values"])
