"""What an architecture adapter tells the recorder and the rules about one model family.

An adapter never registers a hook and never computes relevance. It answers questions:
where are the attention blocks, which flags choose their attention path, how is the model
called, which token is read out, and how token relevance maps back onto the input.
"""

from __future__ import annotations

import functools
import importlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from explain.errors import InputError
from explain.finite import check_finite
from explain.tokenizing import encode, is_raw_text, token_strings

__all__ = [
    "Adapter",
    "AttentionSite",
    "Detector",
    "FlagSetting",
    "FusedAttentionSite",
    "FusedPath",
    "LanguageModel",
    "LazyImport",
    "ModuleHook",
    "Pieces",
    "Prepared",
    "TokenLayout",
    "TokenSet",
    "TokenSets",
    "mean_rows",
    "one_hot_rows",
    "refuse_meta_inputs",
    "this_thread_only",
    "validate_image_batch",
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
    seen_in: Literal["output", "input"] = "output"
    """Where the probabilities are: in the module's output (`probabilities` gets the
    output), or among its positional inputs (`probabilities` gets the args tuple), for a
    module the probabilities enter, such as a module that computes A @ V."""
    recomputed: FusedAttentionSite | None = None
    """Where the block's probabilities are no tensor of the model (a packed sequence
    attended piece by piece, explain.architectures.hf_packed_attention): the fused site
    whose q, k, v and output the recorder recomputes them from, and their gradient from
    dO (explain.fused), on either path; `probabilities` is then never called."""


ModuleHook = Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Any], Any]
"""A forward hook (module, args, kwargs, output) -> None that only reads what it is given,
or -> a replacement output equal in value whose gradient follows a rule (explain.lrp.attnlrp)."""


def this_thread_only(hook: Callable[..., Any]) -> Callable[..., Any]:
    """`hook` (a forward hook or pre-hook), acting only in the thread that makes it, the
    one whose call installs it: another thread's forward through a module the model
    shares (a second model with the same vision tower, run or trained meanwhile) runs as
    if the hook were not there, and is never recorded as the call's."""
    owner = threading.get_ident()

    @functools.wraps(hook)
    def in_its_thread(*args: Any, **kwargs: Any) -> Any:
        return hook(*args, **kwargs) if threading.get_ident() == owner else None

    return in_its_thread


@dataclass(frozen=True)
class FlagSetting:
    """An attribute the session (explain.engine.session) sets for the duration of a call
    and then restores."""

    owner: object
    name: str
    value: object


@dataclass(frozen=True)
class Pieces:
    """A block's mask said by its shape: every sequence of the block's batch is cut into
    contiguous pieces of `lengths` tokens (alike in every sequence), and a token attends
    only within its own piece (a packed tower's windows,
    explain.architectures.hf_packed_attention). A fold then takes the pieces one by one
    (explain.engine.spread) and no (N x N) mask is ever built, unless a whole map is
    asked for (`dense`)."""

    lengths: tuple[int, ...]

    def dense(self, device: torch.device) -> Tensor:
        """(1, 1, N, N) bool: True where query and key lie in the same piece."""
        sizes = torch.tensor(self.lengths, device=device)
        piece = torch.arange(len(self.lengths), device=device).repeat_interleave(sizes)
        return (piece[:, None] == piece[None, :])[None, None]


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
    mask (True = attend) or an additive float mask that broadcasts to (B, H, N, N), a
    `Pieces`, or None.
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
    masks: Callable[[tuple[Any, ...], dict[str, Any]], Tensor | Pieces | None] | None = None
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
    context: Callable[[], AbstractContextManager[Any]] | None = None
    """What the path needs in place for the call besides its flags (an entry in a
    library's registry that a flag names), entered before the flags are set and exited
    after they are restored; None: nothing."""


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

    @classmethod
    def image(
        cls, grid: tuple[int, int], input_size: tuple[int, int], num_prefix_tokens: int = 1
    ) -> TokenLayout:
        """The layout of an image: `num_prefix_tokens` (class, distillation, register
        tokens) followed by the patches of a `grid` in row-major order."""
        return cls(
            modality="image",
            num_tokens=num_prefix_tokens + grid[0] * grid[1],
            num_prefix_tokens=num_prefix_tokens,
            grid=(int(grid[0]), int(grid[1])),
            input_size=(int(input_size[0]), int(input_size[1])),
        )

    @classmethod
    def text(cls, mask: Tensor) -> TokenLayout:
        """The layout of a (B, T) text batch: every position a token, pads (mask 0) False."""
        return cls(modality="text", num_tokens=mask.shape[1], token_mask=mask.bool())

    def patch_grid(self, token_relevance: Tensor) -> Tensor:
        """(..., N) relevance over an image's tokens -> (..., gh, gw) over its patch grid
        (the prefix tokens, class and register tokens, dropped)."""
        assert self.grid is not None, "patch_grid needs an image layout"
        patches = token_relevance[..., self.num_prefix_tokens :]
        return patches.reshape(*patches.shape[:-1], *self.grid)

    def unpadded(self, token_relevance: Tensor) -> Tensor:
        """(B, ..., N) relevance over text tokens with every padding position exactly 0."""
        assert self.token_mask is not None, "unpadded needs a text layout"
        mask = self.token_mask
        shape = (mask.shape[0],) + (1,) * (token_relevance.dim() - 2) + (mask.shape[1],)
        return token_relevance * mask.reshape(shape).to(token_relevance.dtype)

    def to_input_space(self, token_relevance: Tensor) -> Tensor:
        """Token relevance on the input: an image's patch grid, or text tokens with pads 0."""
        if self.modality == "image":
            return self.patch_grid(token_relevance)
        return self.unpadded(token_relevance)


@dataclass(frozen=True)
class TokenSet:
    """One set of tokens whose relevance an explanation returns (`Explanation.relevances`).

    A single-stack model has one set, named after its modality; a dual encoder has
    "image" and "text" (each tower explained on its own), an encoder-decoder "source" and
    "target". `layers` are the model-wide numbers of the set's attention sites, `readout`
    (B, N) its readout row, and `default_start_layer` the start layer used when the caller
    gives none (None: the method's own default; -1: the set's last block).
    """

    name: str
    layers: range
    layout: TokenLayout
    readout: Tensor
    default_start_layer: int | None = None


class TokenSets(StrEnum):
    """How a model with two token sets is explained (`Adapter.token_sets`); a str, so it
    compares equal to its value."""

    DUAL_ENCODER = "dual_encoder"
    """Two towers scored by the similarity of their outputs (CLIP): each (image, text)
    pair is explained as its own sample, each tower with the chosen method."""
    IMAGE_TEXT = "image_text"
    """A vision tower feeding image tokens into a decoder-only language model (LLaVA):
    the language model's fold read at the image tokens, optionally continued through the
    tower (explain.engine.plans.image_text); relevances {"image", "text"}."""
    ENCODER_DECODER = "encoder_decoder"
    """An encoder read by a decoder through cross-attention: the two-set rules of
    explain.rules.coattention, read out at a decoder position."""
    DETECTION = "detection"
    """A detector (DETR): an encoder over image tokens read by object queries through
    cross-attention; each detection is explained at its query (explain.engine.plans.detection)."""


@dataclass(frozen=True)
class LazyImport:
    """A function or class named by module and attribute, imported on first use: how an
    adapter declares a capability that lives in explain.lrp (its LRP walk, where the
    AttnLRP and CP-LRP rules attach) without ever importing that code."""

    module: str
    name: str

    def load(self) -> Callable[..., Any]:
        """The named function or class."""
        return getattr(importlib.import_module(self.module), self.name)


@dataclass(frozen=True)
class Prepared:
    """Validated inputs on the model's device and in its dtype, with their token layout."""

    batch_size: int
    layout: TokenLayout
    arguments: dict[str, Tensor]


class Adapter(ABC):
    """One model family: the small contract the engine (explain.engine) runs against.

    A family file subclasses `Adapter`, implements the abstract members below and names
    its class in explain.architectures.registry. Capabilities are declared, never probed:
    `token_sets` (two token sets), `lrp_walk` (the LRP methods), `rule_sites` (AttnLRP
    and CP-LRP), `pooled_by_mean` (a sentence encoder), `reads_text` (a tokenizer serves
    it), `fused_path()` (the fused attention kernel); the defaults describe a single-stack
    image model with none of them. A decoder-only language model subclasses
    `LanguageModel`, whose generations it explains.
    """

    family: ClassVar[str]
    """Human-readable name of the family, used in error messages and `explain models`."""

    token_sets: ClassVar[TokenSets | None] = None
    """None for one token sequence; models with two token sets declare how they are
    explained (relevances {"image", "text"} or {"source", "target"})."""

    lrp_walk: ClassVar[LazyImport | None] = None
    """The family's LRP walk, which the LRP methods need: a class in explain.lrp, called as
    `cls(adapter, to_input=...)`, that satisfies explain.lrp's `Tape`; None: the LRP
    methods are refused."""

    rule_sites: ClassVar[LazyImport | None] = None
    """Where AttnLRP and CP-LRP attach in the family's modules: a function (in
    explain.lrp.attnlrp_sites) from the adapter to its `RuleSites`; None: they are refused."""

    methods: ClassVar[frozenset[str] | None] = None
    """None: every method the family's capabilities allow. A family whose attention only
    some rules can fold (windowed attention, explain.architectures.windows) names them."""

    pooled_by_mean: bool = False
    """The output is a sentence embedding, the mean of the last hidden states over the
    real tokens (explain.text.similarity explains such encoders)."""

    reads_text: bool = False
    """Whether the model reads text, so that an Explainer's tokenizer serves it (raw
    texts, `Explanation.tokens`); a tokenizer given for a model that reads none is
    refused rather than kept unused (explain.engine.check_tokenizer)."""

    reads_images: ClassVar[bool] = False
    """Whether `encode` takes image prompts (an image with a question, or a chat with
    image entries) through the model's processor, the Explainer's tokenizer."""

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
        """The readout row r, shape (B, N): the weight of each token in the model's head.
        `one_hot_rows` builds the common one-hot row."""

    def to_input_space(self, token_relevance: Tensor, layout: TokenLayout) -> Tensor:
        """Map (..., N) token relevance onto the input: the patch grid of an image (prefix
        tokens dropped), or text tokens with pads exactly 0 (`TokenLayout.to_input_space`).
        A family whose input differs overrides it."""
        return layout.to_input_space(token_relevance)

    def path_context(self) -> AbstractContextManager[Any] | None:
        """What the explicit path needs in place for the call besides its flags (as
        `FusedPath.context`: entered before the flags are set, exited after they are
        restored), or None: nothing. Optional: the default is None."""
        return None

    def fused_path(self) -> FusedPath | None:
        """The fused-attention capability (see `FusedAttentionSite`), or None when the
        family only supports the explicit path. Optional: the default is None."""
        return None

    def attention_maps(self, prepared: Prepared) -> list[tuple[int, int, int]] | None:
        """(blocks, maps, tokens) per stack of a model whose stacks attend over sequences
        of their own (a vision-language model's tower and language model): each of the
        stack's `blocks` computes `maps` (tokens x tokens) attention maps over `prepared`
        (its batch times its heads). For the explicit path's memory estimate
        (explain.fused.explicit_map_bytes); None (default): every block attends over
        `prepared.layout`'s tokens, batch times the model's heads maps each."""
        return None

    def sets(self, prepared: Prepared) -> Sequence[TokenSet]:
        """The token sets of `prepared` whose relevance is returned. One stack (default):
        one set named after the modality, over every block, read out by `readout`."""
        layout = prepared.layout
        return [TokenSet(layout.modality, range(self.num_layers), layout, self.readout(prepared))]

    def encode(self, inputs: object, tokenizer: Any) -> object:
        """`inputs` with raw texts (a string or a list of strings) tokenized by the
        Explainer's `tokenizer` into a padded batch (explain.tokenizing.encode); anything else
        as given. A family whose raw inputs look different overrides it."""
        if tokenizer is not None and is_raw_text(inputs):
            return encode(tokenizer, inputs)
        return inputs

    def token_strings(self, prepared: Prepared, tokenizer: Any) -> list[list[str]] | None:
        """`Explanation.tokens`: per sample, the token at every text position, or None when
        the explained input is not text."""
        ids = prepared.arguments.get("input_ids")
        if ids is None or prepared.layout.modality != "text":
            return None
        return token_strings(tokenizer, ids)

    @property
    def feature_output(self) -> str | None:
        """None when the output holds class scores. For a model without a classifier (its
        output is features, e.g. a pooled embedding), a sentence saying so and what to
        explain instead: class targets are then refused (explain.targets)."""
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


class LanguageModel(Adapter):
    """The contract of a decoder-only language model's adapter: `forward` gives the next
    token's logits at each sample's last real token, and a generation (explain.engine's
    `GenerationPlan`, explain.generation) reads them, and their readout rows, at any
    positions of one forward. The wrapped model has Hugging Face's `generate`."""

    reads_text = True

    @abstractmethod
    def logits_at(self, prepared: Prepared, positions: Tensor | slice) -> Tensor:
        """(B, P) positions -> the (B, P, vocab) next-token logits there. A slice of
        positions, the same for every sample (a generation's), is taken by slicing, whose
        backward batched over the positions runs no kernel once per position (an index's
        or a gather's does)."""

    def readout_at(self, prepared: Prepared, positions: Tensor) -> Tensor:
        """(B, T) readout rows, one-hot at each sample's position (B,); or (B, P, T) for
        P positions per sample (B, P), all columns of a generation at once. In the
        model's dtype, on the device of the attention mask."""
        mask = prepared.arguments["attention_mask"]
        tokens = torch.arange(mask.shape[1], device=mask.device)
        return (tokens == positions.to(mask.device)[..., None]).to(self.parameter.dtype)


class Detector(Adapter):
    """The contract of an object detector's adapter (DETR): queries read the image's
    tokens, and each query predicts a box and class scores. A detection plan
    (explain.engine.plans.detection) chooses the detections from `class_probabilities` and
    explains each at its query."""

    token_sets = TokenSets.DETECTION

    @property
    @abstractmethod
    def num_queries(self) -> int:
        """The decoder's object queries."""

    @abstractmethod
    def detect(self, prepared: Prepared) -> tuple[Tensor, Tensor]:
        """(class logits (B, Q, ...), boxes (B, Q, 4) as (centre x, centre y, width,
        height) fractions of the unpadded image) of one forward."""

    @abstractmethod
    def class_probabilities(self, logits: Tensor) -> Tensor:
        """(B, Q, classes): each real class's probability at each query, as the model's
        own post-processing scores it."""


def one_hot_rows(batch: int, num_tokens: int, positions: Tensor | int, parameter: Tensor) -> Tensor:
    """(batch, num_tokens) readout rows, one-hot at `positions` (one int, or (batch,) per
    sample): the row of a head that reads one token (class token, end token, last token).
    On the device and in the dtype of the model's `parameter`."""
    row = torch.zeros(batch, num_tokens, device=parameter.device, dtype=parameter.dtype)
    if isinstance(positions, int):
        row[:, positions] = 1.0
    else:
        row[torch.arange(batch, device=parameter.device), positions.to(parameter.device)] = 1.0
    return row


def mean_rows(batch: int, num_tokens: int, tokens: range, parameter: Tensor) -> Tensor:
    """(batch, num_tokens) readout rows of a head that averages `tokens`: a class token
    (range(0, 1)), a distilled model's class and distillation tokens (range(0, 2)), or
    the patches of a global-average pool. On the model's `parameter` device and dtype."""
    row = torch.zeros(batch, num_tokens, device=parameter.device, dtype=parameter.dtype)
    row[:, tokens.start : tokens.stop] = 1.0 / len(tokens)
    return row


def validate_image_batch(
    images: object, channels: int, parameter: Tensor, *, check_values: bool = True
) -> Tensor:
    """Check that `images` is a finite, non-empty (B, C, H, W) tensor; return it on the
    device and in the dtype of the model's `parameter`, usable by autograd. With
    `check_values` False the values are left to the caller, who reads them from the
    device together with its other checks (one wait instead of two)."""
    if isinstance(images, list | tuple) and not images:
        raise InputError("the batch is empty: pass at least one image")
    if not isinstance(images, Tensor):
        raise InputError(
            f"image models take a (B, {channels}, H, W) tensor, got {type(images).__name__}; "
            "load and normalise images first (e.g. with the model's timm transform)"
        )
    if images.dim() == 3:
        raise InputError(
            f"expected a batch (B, {channels}, H, W), got one image of shape "
            f"{tuple(images.shape)}; add a batch axis with images.unsqueeze(0)"
        )
    if images.dim() != 4 or images.shape[1] != channels:
        raise InputError(
            f"expected images of shape (B, {channels}, H, W), got {tuple(images.shape)}"
        )
    if images.shape[0] == 0:
        raise InputError("the batch is empty: pass at least one image")
    if not images.is_floating_point():
        raise InputError(f"images must be floating point, got {images.dtype}")
    images = images.to(device=parameter.device, dtype=parameter.dtype)
    # Checked after the cast: a value finite in float32 can overflow the model's float16.
    if check_values:
        check_finite(
            images,
            f"the pixel values (as the model's {parameter.dtype})",
            "give normalised images, finite and within the range of the model's dtype",
        )
    if images.is_inference():  # made under inference_mode: autograd cannot save it
        images = images.clone()
    return images


def refuse_meta_inputs(inputs: object, name: str = "an input") -> None:
    """Refuse tensors on the meta device anywhere in `inputs` (a tensor, or mappings and
    lists of them, an image prompt's photos included): they have shapes but no values,
    so every check of the values would fail with PyTorch's own error."""
    if isinstance(inputs, Tensor):
        if inputs.is_meta:
            raise InputError(
                f"{name} is on the meta device, which holds no values: give the tensors "
                "themselves (on the CPU or the model's device)"
            )
    elif isinstance(inputs, Mapping):
        for key, value in inputs.items():
            refuse_meta_inputs(value, key if isinstance(key, str) else name)
    elif isinstance(inputs, list | tuple):
        for value in inputs:
            refuse_meta_inputs(value, name)
