"""What an architecture adapter tells the recorder and the rules about one model family.

An adapter never registers a hook and never computes relevance. It answers questions:
where are the attention blocks, which flags choose their attention path, how is the model
called, which token is read out, and how token relevance maps back onto the input.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

__all__ = [
    "Adapter",
    "AttentionSite",
    "FlagSetting",
    "FusedAttentionSite",
    "FusedPath",
    "Prepared",
    "TokenLayout",
    "whole_output",
]

Modality = Literal["image", "text"]


def whole_output(output: Tensor) -> Tensor:
    """`AttentionSite.probabilities` for a module whose whole output is the probabilities
    (a dropout or identity module the probabilities pass on their way to the values)."""
    return output


@dataclass(frozen=True)
class AttentionSite:
    """Where one block's post-softmax attention probabilities can be seen in the forward.

    The recorder puts a forward hook on `module`; `probabilities(output)` picks the
    (B, H, N, N) tensor that the block multiplies with its values out of the module's output.

    Models with two token sets (dual encoders, encoder-decoders) have several stacks of
    blocks: `layer` is then unique over the whole model, `stack` names the block's stack
    (e.g. "image", "text", "source", "target") and `kind` is "self", or "cross" for
    attention whose keys come from another stack (queries (B, H, N_q, N_k)).
    """

    layer: int
    module: nn.Module
    probabilities: Callable[[Any], Tensor]
    stack: str = "main"
    kind: Literal["self", "cross"] = "self"


@dataclass(frozen=True)
class FlagSetting:
    """An attribute the recorder sets for the duration of a call and then restores."""

    owner: object
    name: str
    value: object


@dataclass(frozen=True)
class FusedAttentionSite:
    """Where one block's q, k, v and attention output can be seen on the fused path.

    With a fused scaled-dot-product kernel the attention probabilities never exist as a
    tensor. They are recomputed from q and k, `A = softmax(q k^T * scale)`, and their
    gradient from v and the gradient of the attention output, `dA = dO v^T`. The recorder
    puts forward hooks on `query` and `key` (their outputs are q and k, (B, H, N, d),
    before the scale) and on `value` (`values(output)` picks v, (B, H, N, d), out of its
    output), and a forward pre-hook on `output`, whose first input is the attention output
    that `heads(x)` turns back into (B, H, N, d). Where the query and key modules output
    (B, N, H * d), `queries` and `keys` split the heads. Where the kernel takes an attention
    mask, a forward pre-hook on `mask_module` reads it with `masks(args, kwargs)`: a bool
    mask (True = attend) or an additive float mask that broadcasts to (B, H, N, N), or None.
    """

    layer: int
    query: nn.Module
    key: nn.Module
    value: nn.Module
    values: Callable[[Tensor], Tensor]
    output: nn.Module
    heads: Callable[[Tensor], Tensor]
    scale: float
    queries: Callable[[Tensor], Tensor] | None = None
    keys: Callable[[Tensor], Tensor] | None = None
    mask_module: nn.Module | None = None
    masks: Callable[[tuple[Any, ...], dict[str, Any]], Tensor | None] | None = None
    causal: bool = False
    """Queries attend to keys at or before their own position only, on top of the mask:
    the recomputation then builds the causal mask by chunks of rows (never N x N) and
    skips the keys after a chunk's last row."""


@dataclass(frozen=True)
class FusedPath:
    """An adapter's fused-attention capability: its sites and the flags that keep the
    fused kernel on (and checkpointing off) for the duration of a call."""

    sites: Sequence[FusedAttentionSite]
    flags: Sequence[FlagSetting]


@dataclass(frozen=True)
class TokenLayout:
    """How the model's token sequence relates to the input.

    `token_mask` (B, N) marks the real tokens (False at padding); it is None when every
    token is real, as in images.
    """

    modality: Modality
    num_tokens: int
    num_prefix_tokens: int = 0
    grid: tuple[int, int] | None = None
    input_size: tuple[int, int] | None = None
    token_mask: Tensor | None = None

    def key_mask(self, batch: int, device: torch.device) -> Tensor:
        """(B, N) bool: the tokens a relevance map is over (patches, or real text tokens)."""
        if self.token_mask is not None:
            return self.token_mask.to(device=device, dtype=torch.bool)
        mask = torch.zeros(batch, self.num_tokens, dtype=torch.bool, device=device)
        mask[:, self.num_prefix_tokens :] = True
        return mask

    def patch_grid(self, token_relevance: Tensor) -> Tensor:
        """(..., N) relevance over an image's tokens -> (..., gh, gw) over its patch grid
        (the prefix tokens, class and register tokens, dropped)."""
        assert self.grid is not None, "patch_grid needs an image layout"
        patches = token_relevance[..., self.num_prefix_tokens :]
        return patches.reshape(*patches.shape[:-1], *self.grid)


@dataclass(frozen=True)
class Prepared:
    """Validated inputs on the model's device and in its dtype, with their token layout."""

    batch_size: int
    layout: TokenLayout
    arguments: dict[str, Tensor]


class Adapter(ABC):
    """One model family. Subclasses are registered with `register_adapter`."""

    family: ClassVar[str]
    """Human-readable name of the family, used in error messages and `explain models`."""

    token_sets: ClassVar[Literal["dual_encoder", "encoder_decoder"] | None] = None
    """None for one token sequence; models with two token sets are explained per set by
    explain.token_sets (relevances {"image", "text"} or {"source", "target"})."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @classmethod
    @abstractmethod
    def matches(cls, model: nn.Module) -> bool:
        """Whether `model` belongs to this family (without importing optional packages)."""

    @property
    @abstractmethod
    def blocks(self) -> Sequence[nn.Module]:
        """The attention blocks in forward order; block 0's input is hidden state 0."""

    @abstractmethod
    def attention_sites(self) -> Sequence[AttentionSite]:
        """One site per block, in forward order."""

    @abstractmethod
    def path_flags(self) -> Sequence[FlagSetting]:
        """Flags that select the explicit attention path (and disable checkpointing)."""

    @abstractmethod
    def prepare(self, inputs: object) -> Prepared:
        """Validate `inputs` and move them to the model; raise InputError when unusable."""

    @abstractmethod
    def forward(self, prepared: Prepared) -> Tensor:
        """Call the model and return its output scores, shape (B, C)."""

    @abstractmethod
    def readout(self, prepared: Prepared) -> Tensor:
        """The readout row r, shape (B, N): the weight of each token in the model's head."""

    @abstractmethod
    def to_input_space(self, token_relevance: Tensor, layout: TokenLayout) -> Tensor:
        """Map (..., N) token relevance onto the input: a patch grid, or tokens with pads 0."""

    def fused_path(self) -> FusedPath | None:
        """The fused-attention capability (see `FusedAttentionSite`), or None when the
        family only supports the explicit path. Optional: the default is None."""
        return None

    @property
    def entry_blocks(self) -> Sequence[nn.Module]:
        """The first block of every stack: the recorder makes each one's input a leaf that
        requires grad, which gives that stack's attention maps a graph."""
        return [self.blocks[0]]

    @staticmethod
    def block_output(output: Any) -> Tensor:
        """The hidden state a block returns (blocks that return tuples put it first)."""
        return output[0] if isinstance(output, tuple) else output

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    @property
    def parameter(self) -> Tensor:
        """Any parameter of the model: it tells the device and floating dtype to use."""
        try:
            return next(self.model.parameters())
        except StopIteration:  # a parameter-free model cannot be a transformer
            raise TypeError("the model has no parameters") from None
