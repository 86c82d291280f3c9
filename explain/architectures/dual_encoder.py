"""What every CLIP-style dual encoder adapter shares (Hugging Face CLIPModel, open_clip CLIP).

Two stacks of self-attention blocks, "image" (the vision tower, read out at its class
token) and "text" (the text tower, read out at the token it pools, EOS). The score is the
similarity logit of an image with a text. Sites are numbered over the whole model in
forward order: the vision blocks first (both libraries encode the image first), then the
text blocks. explain.token_sets.explain_dual_encoder drives an adapter of this kind.

A subclass names its towers' blocks, where each block's probabilities are seen, which
input arguments belong to the images and which to the texts, and where each text is read
out; the rest is here.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from explain.architectures.base import Adapter, AttentionSite, Prepared, TokenLayout

__all__ = ["DualEncoder"]


class DualEncoder(Adapter):
    """Base class of the CLIP-style adapters (see the module docstring)."""

    token_sets = "dual_encoder"
    stacks: ClassVar[tuple[str, str]] = ("image", "text")

    image_argument: ClassVar[str]
    """The key of the (B, 3, H, W) images in `Prepared.arguments`."""

    text_arguments: ClassVar[tuple[str, ...]]
    """The keys of the per-text tensors in `Prepared.arguments`, token ids first."""

    @property
    @abstractmethod
    def vision_blocks(self) -> Sequence[nn.Module]:
        """The vision tower's blocks in forward order."""

    @property
    @abstractmethod
    def text_blocks(self) -> Sequence[nn.Module]:
        """The text tower's blocks in forward order."""

    @abstractmethod
    def probabilities_site(self, block: nn.Module) -> tuple[nn.Module, Callable[[Any], Tensor]]:
        """The module whose output carries `block`'s attention probabilities, and the
        function that picks them out of that output (see `AttentionSite`)."""

    @abstractmethod
    def readout_positions(self, input_ids: Tensor) -> Tensor:
        """(T,) the position at which the model pools each text, exactly as it does."""

    @abstractmethod
    def text_layout(self, prepared: Prepared) -> TokenLayout:
        """The token layout of the texts in `prepared`."""

    # -- blocks ---------------------------------------------------------------------------

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return [*self.vision_blocks, *self.text_blocks]

    @property
    def entry_blocks(self) -> Sequence[nn.Module]:
        return [self.vision_blocks[0], self.text_blocks[0]]

    def stack_layers(self, stack: str) -> range:
        """The model-wide layer numbers of one tower's blocks."""
        vision = len(self.vision_blocks)
        if stack == "image":
            return range(0, vision)
        return range(vision, vision + len(self.text_blocks))

    def attention_sites(self) -> Sequence[AttentionSite]:
        towers = [("image", block) for block in self.vision_blocks]
        towers += [("text", block) for block in self.text_blocks]
        return [
            AttentionSite(layer, *self.probabilities_site(block), stack=stack)
            for layer, (stack, block) in enumerate(towers)
        ]

    # -- inputs ---------------------------------------------------------------------------

    def encode(self, inputs: object, tokenizer: Any) -> object:
        """`inputs` with raw texts tokenized by `tokenizer`, where the family supports that;
        the default takes inputs as given."""
        return inputs

    def layout(self, prepared: Prepared, stack: str) -> TokenLayout:
        """The token layout of one tower's inputs."""
        return prepared.layout if stack == "image" else self.text_layout(prepared)

    def pair(self, prepared: Prepared, images: Tensor, texts: Tensor) -> Prepared:
        """Inputs whose sample k is image `images[k]` with text `texts[k]`: explaining
        pair k's own similarity then never mixes the gradients of two samples, even when
        several images are explained against the same text."""
        arguments = prepared.arguments
        pixels = arguments[self.image_argument]
        paired = {self.image_argument: pixels[images.to(pixels.device)]}
        for key in self.text_arguments:
            paired[key] = arguments[key][texts.to(arguments[key].device)]
        return Prepared(batch_size=images.shape[0], layout=prepared.layout, arguments=paired)

    def num_texts(self, prepared: Prepared) -> int:
        return prepared.arguments[self.text_arguments[0]].shape[0]

    def token_strings(self, input_ids: Tensor, tokenizer: Any) -> list[list[str]]:
        """The token at every text position, for `Explanation.tokens`."""
        from explain.text import token_strings

        return token_strings(tokenizer, input_ids)

    # -- readout --------------------------------------------------------------------------

    def readout(self, prepared: Prepared) -> Tensor:
        return self.stack_readout(prepared, "image")

    def stack_readout(self, prepared: Prepared, stack: str) -> Tensor:
        """One tower's readout row: the class token of the image, the pooled text token."""
        parameter = self.parameter
        if stack == "image":
            row = torch.zeros(prepared.batch_size, prepared.layout.num_tokens)
            row[:, 0] = 1.0
        else:
            input_ids = prepared.arguments[self.text_arguments[0]]
            row = torch.zeros(input_ids.shape, dtype=parameter.dtype)
            row[torch.arange(row.shape[0]), self.readout_positions(input_ids).cpu()] = 1.0
        return row.to(device=parameter.device, dtype=parameter.dtype)

    def to_input_space(self, token_relevance: Tensor, layout: TokenLayout) -> Tensor:
        if layout.modality == "image":
            return layout.patch_grid(token_relevance)
        assert layout.token_mask is not None
        return token_relevance * layout.token_mask.to(token_relevance.dtype)
