"""timm's VisionTransformer family: ViT, DeiT, DeiT III, register and GAP variants, distilled DeiT,
attention pooling (`global_pool="map"`, see explain.architectures.attention_pool).

The attention probabilities are the output of `block.attn.attn_drop` on timm's explicit
attention path (`fused_attn = False`): the very tensor that multiplies the values, so a
tensor hook on it receives dy/dA. The token grid and the prefix count come from the model
and the input, never from constants.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from torch import Tensor, nn

from explain.architectures.attention_pool import check_timm_latent_pool, timm_latent_pool_row
from explain.architectures.base import (
    Adapter,
    LazyImport,
    mean_rows,
    validate_image_batch,
    whole_output,
)
from explain.errors import InputError, UnsupportedModelError
from explain.layout import (
    AttentionSite,
    FlagSetting,
    FusedAttentionSite,
    FusedPath,
    Prepared,
    TokenLayout,
)

__all__ = ["TimmBlocks", "TimmVisionTransformer", "is_timm_class", "validate_image_batch"]

_POOLS = ("token", "avg")


def is_timm_class(model: nn.Module, name: str) -> bool:
    """Whether `model` is (a subclass of) timm's class `name`, without importing timm."""
    return any(
        cls.__name__ == name and cls.__module__.startswith("timm.") for cls in type(model).__mro__
    )


def headless_timm_model(model: nn.Module) -> str | None:
    """Why a timm model loaded without its classifier (num_classes=0) has no predicted
    class and what to do instead (`Adapter.feature_output`); None when it has a head."""
    if model.num_classes > 0:
        return None
    return (
        "this timm model has no classifier (num_classes=0): its output is the pooled "
        "features, so there is no predicted class; give the target explicitly (a "
        "feature index, or a callable that returns one score per image, e.g. lambda "
        "features: features @ direction), or load the model with its head"
    )


def timm_attention_sites(blocks: Sequence[nn.Module]) -> list[AttentionSite]:
    """One site per timm block, in order: the output of its `attn.attn_drop`, which on
    timm's explicit path is the post-softmax probabilities (ViT and Swin blocks alike)."""
    return [
        AttentionSite(layer=index, module=block.attn.attn_drop, probabilities=whole_output)
        for index, block in enumerate(blocks)
    ]


class TimmBlocks(Adapter):
    """timm vision models built from timm's ViT blocks (`model.blocks`, each block's
    `attn.attn_drop` seeing the probabilities on the explicit path, `fused_attn` the
    switch): how VisionTransformer, Eva and Beit are read. The capabilities that depend
    on more than the blocks (the fused path, the LRP walk, the AttnLRP sites) are each
    family's own."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        pool = getattr(model, "global_pool", None)
        self._attention_pool = getattr(model, "attn_pool", None)
        if self._attention_pool is not None:  # global_pool="map"
            check_timm_latent_pool(self._attention_pool)
        elif pool not in _POOLS:
            raise UnsupportedModelError(
                f"timm {type(model).__name__} with global_pool={pool!r} is not supported: the "
                f"readout must be the class token, the patch mean ({', '.join(_POOLS)}) or "
                "attention pooling (map)"
            )
        for index, block in enumerate(model.blocks):
            attn = getattr(block, "attn", None)
            if attn is None or not isinstance(getattr(attn, "attn_drop", None), nn.Module):
                raise UnsupportedModelError(
                    f"block {index} ({type(block).__name__}) has no timm Attention with an "
                    "attn_drop module; supported blocks: timm Block, ResPostBlock and "
                    "LayerScale blocks with timm.layers.Attention"
                )
        self.distilled = is_timm_class(model, "VisionTransformerDistilled")
        """A distilled DeiT: its eval-mode head averages the class and distillation heads."""

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return list(self.model.blocks)

    @property
    def feature_output(self) -> str | None:
        return headless_timm_model(self.model)

    def attention_sites(self) -> Sequence[AttentionSite]:
        return timm_attention_sites(self.model.blocks)

    def path_flags(self) -> Sequence[FlagSetting]:
        flags = [FlagSetting(block.attn, "fused_attn", False) for block in self.model.blocks]
        if hasattr(self.model, "grad_checkpointing"):
            # Checkpointing would rerun every block in the backward and fire the hooks twice.
            flags.append(FlagSetting(self.model, "grad_checkpointing", False))
        return flags

    def prepare(self, inputs: object) -> Prepared:
        patch_embed = self.model.patch_embed
        images = validate_image_batch(inputs, patch_embed.proj.in_channels, self.parameter)
        height, width = images.shape[-2:]
        grid = self._grid(height, width)
        prefix = self.model.num_prefix_tokens
        layout = TokenLayout.image(grid, (height, width), prefix)
        return Prepared(batch_size=images.shape[0], layout=layout, arguments={"x": images})

    def _grid(self, height: int, width: int) -> tuple[int, int]:
        patch_embed = self.model.patch_embed
        patch = tuple(patch_embed.patch_size)
        expected = tuple(patch_embed.img_size) if patch_embed.img_size is not None else None
        dynamic = getattr(self.model, "dynamic_img_size", False)
        if expected is not None and not dynamic and (height, width) != expected:
            raise InputError(
                f"this model takes {expected[0]}x{expected[1]} images, got {height}x{width}; "
                f"resize the input, or build the model with dynamic_img_size=True"
            )
        if not patch_embed.dynamic_img_pad and (height % patch[0] or width % patch[1]):
            raise InputError(
                f"image size {height}x{width} is not a multiple of the patch size "
                f"{patch[0]}x{patch[1]}"
            )
        return tuple(patch_embed.dynamic_feat_size((height, width)))

    def forward(self, prepared: Prepared) -> Tensor:
        return self.model(prepared.arguments["x"])

    def readout(self, prepared: Prepared) -> Tensor:
        layout = prepared.layout
        if self._attention_pool is not None:  # the pooling head's probe attention
            # Eva pools every token; VisionTransformer the patches unless told otherwise.
            include_prefix = getattr(self.model, "pool_include_prefix", True)
            images = prepared.arguments["x"]
            return timm_latent_pool_row(self.model, images, include_prefix).to(self.parameter.dtype)
        if self.distilled:  # the eval-mode head averages the class and distillation heads
            tokens = range(2)
        elif self.model.global_pool == "token":
            tokens = range(1)
        else:  # the mean of the patches (and of the prefix tokens, where timm includes them)
            include = getattr(self.model, "pool_include_prefix", False)
            tokens = range(0 if include else layout.num_prefix_tokens, layout.num_tokens)
        return mean_rows(prepared.batch_size, layout.num_tokens, tokens, self.parameter)


class TimmVisionTransformer(TimmBlocks):
    family = (
        "timm VisionTransformer (ViT, DeiT, DeiT III, augreg, register tokens as in the "
        "DINOv2 checkpoints, global-average pooling, attention pooling as in the SigLIP "
        "checkpoints) and VisionTransformerDistilled"
    )
    lrp_walk = LazyImport("explain.lrp.timm_vit", "TimmVitTape")
    rule_sites = LazyImport("explain.lrp.attnlrp_sites", "timm_sites")

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_timm_class(model, "VisionTransformer")

    def fused_path(self) -> FusedPath:
        # timm's Attention: q, k = q_norm(q), k_norm(k); v is the third slice of qkv's
        # output; the kernel's output (B, H, N, d) -> (B, N, H * d) enters attn.norm.
        # The Explainer calls the model without an attention mask, so none is needed here.
        sites = [
            FusedAttentionSite(
                layer=index,
                query=block.attn.q_norm,
                key=block.attn.k_norm,
                value=block.attn.qkv,
                values=partial(_timm_values, block.attn.num_heads, block.attn.head_dim),
                output=block.attn.norm,
                heads=partial(_timm_heads, block.attn.num_heads, block.attn.head_dim),
                scale=float(block.attn.scale),
            )
            for index, block in enumerate(self.model.blocks)
        ]
        flags = [FlagSetting(block.attn, "fused_attn", True) for block in self.model.blocks]
        if hasattr(self.model, "grad_checkpointing"):
            flags.append(FlagSetting(self.model, "grad_checkpointing", False))
        return FusedPath(sites=sites, flags=flags)


def _timm_values(num_heads: int, head_dim: int, qkv: Tensor) -> Tensor:
    """v (B, H, N, d) from the output (B, N, 3 * H * d) of timm's qkv projection."""
    batch, tokens, _ = qkv.shape
    return qkv.reshape(batch, tokens, 3, num_heads, head_dim)[:, :, 2].transpose(1, 2)


def _timm_heads(num_heads: int, head_dim: int, output: Tensor) -> Tensor:
    """(B, N, H * d) attention output -> (B, H, N, d), undoing timm's transpose + reshape."""
    batch, tokens, _ = output.shape
    return output.reshape(batch, tokens, num_heads, head_dim).transpose(1, 2)
