"""Hugging Face image classifiers beyond ViT and DeiT: DINOv2 (with and without register
tokens), BEiT and SigLIP's vision tower.

Blocks, attention modules and the eager path come from `HFAdapter`. What differs
between the families is the token layout (class and register tokens before the patches)
and how the classification head reads the last hidden state, which fixes the readout row:

- `Dinov2ForImageClassification`, `Dinov2WithRegistersForImageClassification`: a linear
  layer on the concatenation of the class token and the mean of the patch tokens
  (registers excluded), so the class token and the patch mean are read equally: 1/2 at
  the class token and 1/(2 P) at each of the P patches.
- `BeitForImageClassification`: the mean of the patch tokens (`use_mean_pooling`, the
  default), or the class token.
- `SiglipForImageClassification`: the mean of all tokens (SigLIP has no class token).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import ClassVar

import torch
from torch import Tensor, nn

from explain.architectures.base import validate_image_batch
from explain.architectures.hf_common import (
    HFAdapter,
    is_transformers_class,
    sdpa_attention_flags,
    split_heads,
)
from explain.errors import InputError
from explain.layout import FusedAttentionSite, FusedPath, Prepared, TokenLayout

__all__ = [
    "HFBeit",
    "HFDinov2",
    "HFImageClassifier",
    "HFSiglipClassifier",
]


class HFImageClassifier(HFAdapter):
    """A transformers image classifier over `prefix_tokens` + patch tokens; subclasses say
    which models they take, how many prefix tokens there are and how the head reads them."""

    fused: ClassVar[bool] = True
    """Whether the attention modules have q, k, v and output projections around a kernel
    that takes no bias (so the fused path can recompute the probabilities)."""

    any_size: ClassVar[bool] = False
    """Whether the model interpolates its position embeddings to any image size (a
    multiple of the patch size); otherwise it takes `config.image_size` only."""

    def prefix_tokens(self) -> int:
        """Tokens before the patches (class and register tokens)."""
        return 0

    def readout_weights(self, row: Tensor, prefix: int) -> None:
        """Fill the (B, N) zero `row` with the head's weight of each token."""
        raise NotImplementedError

    def prepare(self, inputs: object) -> Prepared:
        # SigLIP's classifier keeps the vision settings in a sub-config.
        config = getattr(self.model.config, "vision_config", self.model.config)
        images = validate_image_batch(inputs, config.num_channels, self.parameter)
        height, width = images.shape[-2:]
        patch = _pair(config.patch_size)
        size = _pair(config.image_size)
        if self.any_size:
            if height % patch[0] or width % patch[1]:
                raise InputError(
                    f"image size {height}x{width} is not a multiple of the patch size "
                    f"{patch[0]}x{patch[1]}; resize or crop the input"
                )
        elif (height, width) != size:
            raise InputError(
                f"this model takes {size[0]}x{size[1]} images, got {height}x{width}; "
                "resize the input"
            )
        grid = (height // patch[0], width // patch[1])
        layout = TokenLayout.image(grid, (height, width), self.prefix_tokens())
        return Prepared(
            batch_size=images.shape[0], layout=layout, arguments={"pixel_values": images}
        )

    def forward(self, prepared: Prepared) -> Tensor:
        return self.model(**prepared.arguments).logits

    def readout(self, prepared: Prepared) -> Tensor:
        parameter = self.parameter
        row = torch.zeros(
            prepared.batch_size,
            prepared.layout.num_tokens,
            device=parameter.device,
            dtype=parameter.dtype,
        )
        self.readout_weights(row, prepared.layout.num_prefix_tokens)
        return row

    def to_input_space(self, token_relevance: Tensor, layout: TokenLayout) -> Tensor:
        return layout.patch_grid(token_relevance)

    def fused_path(self) -> FusedPath | None:
        """The sdpa kernel (explain.engine.fused): q, k, v are the outputs of the q, k and v
        projections, the kernel's output enters the output projection; images have no
        attention mask."""
        if not self.fused:
            return None
        sites = []
        for layer, attention in enumerate(self._attention_modules):
            heads = partial(split_heads, attention.head_dim)
            output = attention.o_proj if hasattr(attention, "o_proj") else attention.out_proj
            scale = attention.scaling if hasattr(attention, "scaling") else attention.scale
            sites.append(
                FusedAttentionSite(
                    layer=layer,
                    query=attention.q_proj,
                    key=attention.k_proj,
                    value=attention.v_proj,
                    values=heads,
                    output=output,
                    heads=heads,
                    scale=float(scale),
                    queries=heads,
                    keys=heads,
                )
            )
        return FusedPath(sites=sites, flags=sdpa_attention_flags(self.model))


class HFDinov2(HFImageClassifier):
    family = (
        "Hugging Face Dinov2ForImageClassification and "
        "Dinov2WithRegistersForImageClassification (class token + patch mean head)"
    )
    any_size = True

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(
            model, "dinov2", ("Dinov2ForImageClassification",)
        ) or is_transformers_class(
            model, "dinov2_with_registers", ("Dinov2WithRegistersForImageClassification",)
        )

    def prefix_tokens(self) -> int:
        return 1 + getattr(self.model.config, "num_register_tokens", 0)

    def readout_weights(self, row: Tensor, prefix: int) -> None:
        # logits = W [h_cls ; mean_patches h]: the class token and the patch mean equally.
        row[:, 0] = 0.5
        row[:, prefix:] = 0.5 / (row.shape[1] - prefix)


class HFBeit(HFImageClassifier):
    family = "Hugging Face BeitForImageClassification (patch mean or class token head)"
    fused = False  # the relative position bias enters the kernel, and no module shows it

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(model, "beit", ("BeitForImageClassification",))

    def prefix_tokens(self) -> int:
        return 1

    def readout_weights(self, row: Tensor, prefix: int) -> None:
        if self.model.config.use_mean_pooling:
            row[:, prefix:] = 1.0 / (row.shape[1] - prefix)
        else:
            row[:, 0] = 1.0


class HFSiglipClassifier(HFImageClassifier):
    family = "Hugging Face SiglipForImageClassification (mean of all tokens)"

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(model, "siglip", ("SiglipForImageClassification",))

    def readout_weights(self, row: Tensor, prefix: int) -> None:
        row[:, :] = 1.0 / row.shape[1]


def _pair(value: int | Sequence[int]) -> tuple[int, int]:
    """A config's image or patch size, an int or a (height, width) pair, as a pair."""
    if isinstance(value, int):
        return value, value
    height, width = value
    return int(height), int(width)
