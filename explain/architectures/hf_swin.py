"""Hugging Face Swin image classifiers: `SwinForImageClassification` and
`Swinv2ForImageClassification`.

Each stage is a run of blocks (`SwinLayer`, `Swinv2Layer`) on one grid followed by a
patch merging (none after the last stage), read out by the mean of the last stage's
tokens. Each block attends within windows of its grid, every other block after a cyclic
shift; the post-softmax probabilities, relative position bias and shift mask included,
are (B * windows, H, w, w). Swin computes them in transformers' eager attention function
and returns them second from its attention module; Swinv2 computes them in its
self-attention and passes them through that module's `dropout`. Swin clips a block's
window to its grid (and drops its shift) when the block runs, writing the clipped values
onto the block: the adapter applies that rule itself, and sets the clipped values as
flags for the call, so the model's attributes are restored afterwards; Swinv2 clips when
it is built.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from explain.architectures.base import Adapter, mean_rows, validate_image_batch, whole_output
from explain.architectures.hf_common import (
    eager_attention_flags,
    is_transformers_class,
    probabilities_at,
)
from explain.architectures.windows import (
    WINDOWED_METHODS,
    windowed_layout,
)
from explain.errors import InputError, UnsupportedModelError
from explain.layout import AttentionSite, FlagSetting, Prepared, WindowedBlock

__all__ = ["HFSwin"]


class HFSwin(Adapter):
    family = "Hugging Face SwinForImageClassification and Swinv2ForImageClassification"
    methods = WINDOWED_METHODS

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self._v2 = is_transformers_class(model, "swinv2", ("Swinv2ForImageClassification",))
        backbone = model.swinv2 if self._v2 else model.swin
        if backbone.pooler is None:
            raise UnsupportedModelError(
                f"{type(model).__name__} without its pooler is not supported: the readout "
                "must be the mean of the last stage's tokens"
            )
        stages = list(backbone.encoder.layers)
        if stages[-1].downsample is not None:
            raise UnsupportedModelError(
                f"{type(model).__name__} merges patches after its last stage; the readout "
                "must be the mean of the last blocks' tokens"
            )
        self._blocks = [block for stage in stages for block in stage.blocks]
        self._probabilities = probabilities_at(1)

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(
            model, "swin", ("SwinForImageClassification",)
        ) or is_transformers_class(model, "swinv2", ("Swinv2ForImageClassification",))

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self._blocks

    def attention_sites(self) -> Sequence[AttentionSite]:
        if self._v2:
            return [
                AttentionSite(layer=i, module=b.attention.self.dropout, probabilities=whole_output)
                for i, b in enumerate(self._blocks)
            ]
        return [
            AttentionSite(layer=i, module=b.attention, probabilities=self._probabilities)
            for i, b in enumerate(self._blocks)
        ]

    def path_flags(self) -> Sequence[FlagSetting]:
        flags = eager_attention_flags(self.model)
        if not self._v2:  # SwinLayer clips its window when it runs: done here, and undone
            for block in self._blocks:
                geometry = self._geometry(block)
                flags.append(FlagSetting(block, "window_size", geometry.window[0]))
                flags.append(FlagSetting(block, "shift_size", geometry.shift[0]))
        return flags

    def prepare(self, inputs: object) -> Prepared:
        config = self.model.config
        images = validate_image_batch(inputs, config.num_channels, self.parameter)
        height, width = images.shape[-2:]
        size = config.image_size
        expected = (size, size) if isinstance(size, int) else tuple(size)
        if (height, width) != expected:
            raise InputError(
                f"this model takes {expected[0]}x{expected[1]} images, got {height}x{width}; "
                "resize the input (its windows are laid out for that size)"
            )
        blocks = [self._geometry(block) for block in self._blocks]
        layout = windowed_layout(blocks, (height, width), self.family)
        return Prepared(
            batch_size=images.shape[0], layout=layout, arguments={"pixel_values": images}
        )

    def _geometry(self, block: nn.Module) -> WindowedBlock:
        grid = (int(block.input_resolution[0]), int(block.input_resolution[1]))
        window, shift = int(block.window_size), int(block.shift_size)
        if not self._v2 and min(grid) <= window:  # SwinLayer.set_shift_and_window_size
            window, shift = min(grid), 0
        return WindowedBlock(grid=grid, window=(window, window), shift=(shift, shift))

    def forward(self, prepared: Prepared) -> Tensor:
        return self.model(**prepared.arguments).logits

    def readout(self, prepared: Prepared) -> Tensor:
        layout = prepared.layout
        tokens = layout.windows[-1].num_tokens  # the pooler averages the last stage's tokens
        return mean_rows(prepared.batch_size, tokens, range(tokens), self.parameter)
