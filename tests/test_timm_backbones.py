"""timm Eva (EVA-02, DINOv3), Beit and DINOv2-style VisionTransformer: generic and
rollout equal an independent computation, no side effects, batch equals single, and
the attention paths."""

from __future__ import annotations

import pytest
import reference_backbones as refb
import torch
from tolerances import FLOAT64

from explain import Explainer, OptionError, UnsupportedModelError
from explain.testing import tiny_beit, tiny_eva, tiny_vit

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
    "siglip-vit-map": (tiny_vit, dict(global_pool="map", class_token=False), (32, 32)),
    "vit-map-registers": (tiny_vit, dict(global_pool="map", reg_tokens=2), (32, 32)),
    "eva-map": (tiny_eva, dict(global_pool="map"), (32, 32)),
}


def _case(name):
    build, kwargs, (height, width) = CONFIGS[name]
    images = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(4))
    model = build(**kwargs)
    if (
        getattr(model, "attn_pool", None) is not None
    ):  # spread the pooling head's weights: far from uniform
        generator = torch.Generator().manual_seed(6)
        for parameter in (model.attn_pool.latent, model.attn_pool.kv.weight):
            with torch.no_grad():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return model, images


def _probe_row(model, image, num_tokens: int) -> torch.Tensor:
    """Attention pooling's readout row: the probe's softmax(q k^T / sqrt(d)) over the
    tokens entering the pool (caught with a pre-hook), mean over heads, 0 elsewhere."""
    pool, seen = model.attn_pool, []
    handle = pool.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    with torch.no_grad():
        model.eval()(image[None])
    handle.remove()
    x = seen[0][0]
    heads, dim = pool.num_heads, pool.head_dim
    q = pool.q(pool.latent[0, 0]).reshape(heads, dim)
    k = pool.kv(x)[:, : heads * dim].reshape(-1, heads, dim).transpose(0, 1)
    weights = torch.stack([(k[h] @ q[h] / dim**0.5).softmax(dim=0) for h in range(heads)])
    row = torch.zeros(num_tokens, dtype=image.dtype)
    row[num_tokens - x.shape[0] :] = weights.mean(dim=0)
    return row


def _row(model, num_tokens: int, image) -> torch.Tensor:
    """The readout row, written from the models' pooling code."""
    row = torch.zeros(num_tokens, dtype=image.dtype)
    if getattr(model, "attn_pool", None) is not None:
        return _probe_row(model, image, num_tokens)
    if model.global_pool == "token":
        row[0] = 1.0
    else:  # "avg": the mean over the patch tokens, prefix tokens excluded
        row[model.num_prefix_tokens :] = 1.0 / (num_tokens - model.num_prefix_tokens)
    return row


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("method", ["generic", "rollout"])
def test_matches_independent_computation(name, method):
    model, images = (value.double() for value in _case(name))
    start = 1 if method == "rollout" else 0  # rollout from block 1, as the papers evaluate
    result = Explainer(model).explain(images, method=method, start_layer=start)
    grid = model.patch_embed.dynamic_feat_size(tuple(images.shape[-2:]))
    for b in range(images.shape[0]):
        attentions, grads, logits = refb.timm_attentions_and_gradients(model, images[b])
        torch.testing.assert_close(result.logits[b], logits[0], **FLOAT64)
        row = _row(model, attentions[0].shape[-1], images[b])
        expected = refb.method(method, attentions, grads, row, start)
        prefix = model.num_prefix_tokens
        torch.testing.assert_close(result.relevance[b], expected[prefix:].reshape(grid), **FLOAT64)


@pytest.mark.parametrize("name", ["eva02", "beit", "dinov3-eva", "siglip-vit-map"])
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
    torch.testing.assert_close(auto.relevance, explicit.relevance, rtol=0, atol=0)  # one path
    for build in (tiny_eva, tiny_beit):
        with pytest.raises(OptionError, match="attention_path='fused' is not available"):
            Explainer(build(), attention_path="fused").explain(images, method="generic")


@pytest.mark.parametrize("pool", ["max", "avgmax"])
def test_nonlinear_pooling_is_refused(pool):
    with pytest.raises(UnsupportedModelError, match="global_pool"):
        Explainer(tiny_eva(global_pool=pool))


def test_attention_pooling_has_no_lrp_rule():
    model, images = _case("siglip-vit-map")
    with pytest.raises(UnsupportedModelError, match="no LRP rule for attention pooling"):
        Explainer(model).explain(images, method="transformer_attribution")


@pytest.mark.parametrize("build", [tiny_eva, tiny_beit])
def test_lrp_methods_are_refused_naming_the_supported_ones(build):
    with pytest.raises(UnsupportedModelError, match=r"not available for timm .*supported methods"):
        Explainer(build()).explain(torch.randn(1, 3, 32, 32), method="transformer_attribution")
