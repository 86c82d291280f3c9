"""Hugging Face DINOv2 (with and without registers), BEiT and SigLIP image classifiers:
generic and rollout equal an independent computation (transformers' own
output_attentions + autograd), no side effects, batch equals single, clear errors."""

from __future__ import annotations

import pytest
import reference_backbones as refb
import torch
from tolerances import FLOAT32, FLOAT64

from explain import Explainer, InputError, OptionError
from explain.testing import tiny_hf_vision

# name -> (family, config overrides, input (H, W))
CONFIGS = {
    "dinov2": ("dinov2", {}, (32, 32)),
    "dinov2-any-size": ("dinov2", {}, (40, 24)),
    "dinov2-registers": ("dinov2_with_registers", {}, (32, 32)),
    "beit-mean": ("beit", {}, (32, 32)),
    "beit-cls": ("beit", dict(use_mean_pooling=False), (32, 32)),
    "siglip": ("siglip", {}, (32, 32)),
}


def _case(name):
    family, overrides, (height, width) = CONFIGS[name]
    images = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(5))
    return family, tiny_hf_vision(family, **overrides), images


def _row(family: str, model, num_tokens: int) -> torch.Tensor:
    """The readout row, written from each classifier's pooling code."""
    row = torch.zeros(num_tokens, dtype=torch.float64)
    if family.startswith("dinov2"):  # classifier(cat(cls, mean(patches)))
        prefix = 1 + getattr(model.config, "num_register_tokens", 0)
        row[0] = 0.5
        row[prefix:] = 0.5 / (num_tokens - prefix)
    elif family == "beit":
        if model.config.use_mean_pooling:
            row[1:] = 1.0 / (num_tokens - 1)
        else:
            row[0] = 1.0
    else:  # siglip: mean over every token
        row[:] = 1.0 / num_tokens
    return row


def _call(image):
    def call(model):
        output = model(pixel_values=image[None], output_attentions=True)
        return output.logits, output.attentions

    return call


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("method", ["generic", "rollout"])
def test_matches_independent_computation(name, method):
    family, model, images = _case(name)
    model, images = model.double(), images.double()
    start = 1 if method == "rollout" else 0
    result = Explainer(model).explain(images, method=method, start_layer=start, target=3)
    patch = model.config.patch_size if family != "siglip" else model.config.vision_config.patch_size
    grid = (images.shape[-2] // patch, images.shape[-1] // patch)
    for b in range(images.shape[0]):
        attentions, grads, logits = refb.hf_attentions_and_gradients(
            model, _call(images[b]), target=3
        )
        torch.testing.assert_close(result.logits[b], logits[0], **FLOAT64)
        num_tokens = attentions[0].shape[-1]
        expected = refb.method(method, attentions, grads, _row(family, model, num_tokens), start)
        prefix = num_tokens - grid[0] * grid[1]
        torch.testing.assert_close(result.relevance[b], expected[prefix:].reshape(grid), **FLOAT64)


@pytest.mark.parametrize("name", ["dinov2-registers", "beit-mean", "siglip"])
def test_no_side_effects_and_batch_equals_single(name):
    _, model, images = _case(name)
    refb.check_no_side_effects_and_batches(model, images)


@pytest.mark.parametrize("name", ["dinov2", "dinov2-registers", "siglip"])
def test_fused_path_equals_explicit_path_and_sdpa_is_restored(name):
    _, model, images = _case(name)
    assert model.config._attn_implementation == "sdpa"
    for method in ("generic", "attention_gradcam"):
        explicit = Explainer(model, attention_path="explicit").explain(images, method=method)
        fused = Explainer(model, attention_path="fused").explain(images, method=method)
        torch.testing.assert_close(fused.relevance, explicit.relevance, **FLOAT32)
    assert model.config._attn_implementation == "sdpa"


def test_beit_refuses_the_fused_path():
    _, model, images = _case("beit-mean")
    with pytest.raises(OptionError, match="attention_path='fused' is not available"):
        Explainer(model, attention_path="fused").explain(images)


def test_image_size_errors_say_what_to_do():
    _, beit, _ = _case("beit-mean")
    with pytest.raises(InputError, match="takes 32x32 images, got 40x32; resize"):
        Explainer(beit).explain(torch.randn(1, 3, 40, 32))
    _, dinov2, _ = _case("dinov2")
    with pytest.raises(InputError, match="not a multiple of the patch size 8x8"):
        Explainer(dinov2).explain(torch.randn(1, 3, 36, 32))
