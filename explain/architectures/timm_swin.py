"""timm's Swin Transformers: `SwinTransformer` (v1) and `SwinTransformerV2`.

Each stage is a patch merging (none before the first stage) followed by blocks that
attend within windows of the stage's grid, every other block after a cyclic shift. On
timm's explicit attention path (`fused_attn = False`, v1; v2 has only that path) the
post-softmax probabilities, relative position bias and shift mask included, are the
output of `block.attn.attn_drop`, (B * windows, H, w, w): the very tensor that multiplies
the values. Each block's grid, window and shift are read off the block
(`input_resolution`, `window_size`, `shift_size`, which timm has already clipped to the
grid), so the layout (explain.architectures.windows, explain.layout) is the model's own.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from explain.architectures.base import Adapter, mean_rows, validate_image_batch
from explain.architectures.timm_vit import (
    headless_timm_model,
    is_timm_class,
    timm_attention_sites,
)
from explain.architectures.windows import (
    WINDOWED_METHODS,
    windowed_layout,
)
from explain.errors import InputError, UnsupportedModelError
from explain.layout import AttentionSite, FlagSetting, Prepared, WindowedBlock
from explain.lrp.weights import base_layer

__all__ = ["TimmSwin"]

_CLASSES = ("SwinTransformer", "SwinTransformerV2")


class TimmSwin(Adapter):
    family = "timm SwinTransformer and SwinTransformerV2 (windowed attention, mean-pooled)"
    methods = WINDOWED_METHODS

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        if model.global_pool != "avg":
            raise UnsupportedModelError(
                f"timm {type(model).__name__} with global_pool={model.global_pool!r} is not "
                "supported: the readout must be the mean of the last stage's tokens ('avg')"
            )
        if not isinstance(model.layers[0].downsample, nn.Identity):
            raise UnsupportedModelError(
                f"timm {type(model).__name__} merges patches before its first stage; the "
                "relevance is returned over the patch grid, which that would hide"
            )
        self._blocks = [block for stage in model.layers for block in stage.blocks]
        self._channels = base_layer(model.patch_embed.proj).in_channels  # also under LoRA

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return any(is_timm_class(model, name) for name in _CLASSES)

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self._blocks

    @property
    def feature_output(self) -> str | None:
        return headless_timm_model(self.model)

    def attention_sites(self) -> Sequence[AttentionSite]:
        return timm_attention_sites(self._blocks)

    def path_flags(self) -> Sequence[FlagSetting]:
        flags = [
            FlagSetting(block.attn, "fused_attn", False)
            for block in self._blocks
            if hasattr(block.attn, "fused_attn")
        ]
        # Checkpointing would rerun every block in the backward and fire the hooks twice.
        for owner in (self.model, *self.model.layers):
            if hasattr(owner, "grad_checkpointing"):
                flags.append(FlagSetting(owner, "grad_checkpointing", False))
        return flags

    def prepare(self, inputs: object) -> Prepared:
        images = validate_image_batch(inputs, self._channels, self.parameter)
        height, width = images.shape[-2:]
        expected = tuple(self.model.patch_embed.img_size)
        if (height, width) != expected:
            raise InputError(
                f"this model takes {expected[0]}x{expected[1]} images, got {height}x{width}; "
                "resize the input (its windows are laid out for that size)"
            )
        layout = windowed_layout(
            [_geometry(block) for block in self._blocks], (height, width), self.family
        )
        return Prepared(batch_size=images.shape[0], layout=layout, arguments={"x": images})

    def forward(self, prepared: Prepared) -> Tensor:
        return self.model(prepared.arguments["x"])

    def readout(self, prepared: Prepared) -> Tensor:
        layout = prepared.layout
        tokens = layout.windows[-1].num_tokens  # the head averages the last stage's tokens
        return mean_rows(prepared.batch_size, tokens, range(tokens), self.parameter)


def _geometry(block: nn.Module) -> WindowedBlock:
    return WindowedBlock(
        grid=tuple(int(n) for n in block.input_resolution),
        window=tuple(int(n) for n in block.window_size),
        shift=tuple(int(n) for n in block.shift_size),
    )
