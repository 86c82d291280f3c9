"""timm Eva (EVA-02, DINOv3), Beit and DINOv2-style VisionTransformer: generic and
rollout equal an independent computation, no side effects, batch equals single, and
the attention paths."""

from __future__ import annotations

import pytest
import reference_backbones as refb
import torch

from explain import Explainer, OptionError, UnsupportedModelError
from explain.testing import tiny_beit, tiny_eva, tiny_vit

TOL = dict(rtol=1e-5, atol=1e-6)

# name -> (builder, kwargs, input (H, W))
CONFIGS = {
    "eva02": (tiny_eva, {}, (32, 32)),
    "eva02-token": (tiny_eva, dict(global_pool="token"), (32, 32)),
    "dinov3-eva": (
        tiny_eva,
        dict(
            num_reg_tokens=4,
            use_abs_pos_emb=False,
            rope_type="dinov3",
            rope_rotate_half=True,
            qkv_bias=False,
            init_values=1.0,
            global_pool="token",
            dynamic_img_size=True,
            swiglu_mlp=False,
            scale_mlp=False,
            mlp_ratio=4.0,
        ),
        (40, 24),
    ),
    "beit": (tiny_beit, {}, (32, 32)),
    "beit-token": (tiny_beit, dict(global_pool="token", use_abs_pos_emb=True), (32, 32)),
    "dinov2-vit-registers": (
        tiny_vit,
        dict(reg_tokens=4, no_embed_class=True, init_values=1.0, global_pool="token"),
        (32, 32),
    ),
}


def _case(name):
    build, kwargs, (height, width) = CONFIGS[name]
    images = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(4))
    return build(**kwargs), images


def _row(model, num_tokens: int) -> torch.Tensor:
    """The readout row, written from the models' pooling code."""
    row = torch.zeros(num_tokens)
    if model.global_pool == "token":
        row[0] = 1.0
    else:  # "avg": the mean over the patch tokens, prefix tokens excluded
        row[model.num_prefix_tokens :] = 1.0 / (num_tokens - model.num_prefix_tokens)
    return row


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("method", ["generic", "rollout"])
def test_matches_independent_computation(name, method):
    model, images = _case(name)
    start = 1 if method == "rollout" else 0  # rollout from block 1, as the papers evaluate
    result = Explainer(model).explain(images, method=method, start_layer=start)
    grid = model.patch_embed.dynamic_feat_size(tuple(images.shape[-2:]))
    for b in range(images.shape[0]):
        attentions, grads, logits = refb.timm_attentions_and_gradients(model, images[b])
        torch.testing.assert_close(result.logits[b], logits[0], **TOL)
        row = _row(model, attentions[0].shape[-1])
        expected = refb.method(method, attentions, grads, row, start)
        prefix = model.num_prefix_tokens
        torch.testing.assert_close(result.relevance[b], expected[prefix:].reshape(grid), **TOL)


@pytest.mark.parametrize("name", ["eva02", "beit", "dinov3-eva"])
def test_no_side_effects_and_batch_equals_single(name):
    model, images = _case(name)
    refb.check_no_side_effects_and_batches(model, images)


def test_fused_attention_is_switched_off_for_the_call_and_fused_path_refused():
    model, images = _case("eva02")
    for block in model.blocks:
        block.attn.fused_attn = True
    explicit = Explainer(model).explain(images, method="generic", target=2)
    assert all(block.attn.fused_attn for block in model.blocks)
    auto = Explainer(model, attention_path="auto").explain(images, method="generic", target=2)
    torch.testing.assert_close(auto.relevance, explicit.relevance)
    for build in (tiny_eva, tiny_beit):
        with pytest.raises(OptionError, match="attention_path='fused' is not available"):
            Explainer(build(), attention_path="fused").explain(images, method="generic")


@pytest.mark.parametrize("pool", ["max", "avgmax"])
def test_nonlinear_pooling_is_refused(pool):
    with pytest.raises(UnsupportedModelError, match="global_pool"):
        Explainer(tiny_eva(global_pool=pool))
