"""What every CLIP-style dual encoder adapter shares (Hugging Face CLIPModel, open_clip CLIP).

Two stacks of self-attention blocks, "image" (the vision tower, read out at its class
token) and "text" (the text tower, read out at the token it pools, EOS). The score is the
similarity logit of an image with a text. Sites are numbered over the whole model in
forward order: the vision blocks first (both libraries encode the image first), then the
text blocks. `DualEncoder` is the contract of this kind: the engine's dual-encoder plan
(explain.engine.plans.dual_encoder) explains every (image, text) pair as its own sample.

A subclass names its towers' blocks, where each block's probabilities are seen, which
input arguments belong to the images and which to the texts, and where each text is read
out; the rest is here.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from torch import Tensor, nn

from explain.architectures.base import Adapter, one_hot_rows
from explain.inputs import token_strings
from explain.layout import AttentionSite, Prepared, TokenLayout, TokenSet

__all__ = ["DualEncoder"]


class DualEncoder(Adapter):
    """Base class of the CLIP-style adapters (see the module docstring)."""

    reads_text = True
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

    def sets(self, prepared: Prepared) -> list[TokenSet]:
        """One set per tower, each read out at its pooled token and by default explained
        from its last block, as in the reference notebook, whose authors found that with
        every block the ViT-B/16 maps over-expand."""
        return [
            TokenSet(
                stack,
                self.stack_layers(stack),
                self.layout(prepared, stack),
                self.stack_readout(prepared, stack),
                default_start_layer=-1,
            )
            for stack in self.stacks
        ]

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

    def token_strings(self, prepared: Prepared, tokenizer: Any) -> list[list[str]] | None:
        """The tokens of each sample's text, for `Explanation.tokens`."""
        ids = prepared.arguments[self.text_arguments[0]]
        return token_strings(tokenizer, ids)

    # -- readout --------------------------------------------------------------------------

    def readout(self, prepared: Prepared) -> Tensor:
        return self.stack_readout(prepared, "image")

    def stack_readout(self, prepared: Prepared, stack: str) -> Tensor:
        """One tower's readout row: the class token of the image, the pooled text token."""
        if stack == "image":
            return one_hot_rows(prepared.batch_size, prepared.layout.num_tokens, 0, self.parameter)
        input_ids = prepared.arguments[self.text_arguments[0]]
        positions = self.readout_positions(input_ids)
        return one_hot_rows(input_ids.shape[0], input_ids.shape[1], positions, self.parameter)
