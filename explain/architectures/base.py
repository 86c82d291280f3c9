"""What an architecture adapter tells the recorder and the rules about one model family.

An adapter never registers a hook and never computes relevance. It answers questions:
where are the attention blocks, which flags choose their attention path, how is the model
called, which token is read out, and how token relevance maps back onto the input.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from explain.architectures.wrappers import ACCELERATE_HOOK, execution_device
from explain.errors import ExplainError, InputError
from explain.finite import check_finite
from explain.inputs import encode, is_raw_text, token_strings
from explain.layout import (
    AttentionSite,
    FlagSetting,
    FusedPath,
    Prepared,
    TokenLayout,
    TokenSet,
)
from explain.lrp.attnlrp import AttnLrpSites
from explain.lrp.walk import LrpWalk

__all__ = [
    "Adapter",
    "Detector",
    "EncoderDecoder",
    "ImageTextModel",
    "LanguageModel",
    "mean_rows",
    "one_hot_rows",
    "refuse_meta_inputs",
    "this_thread_only",
    "validate_image_batch",
    "whole_output",
]


def whole_output(output: Tensor) -> Tensor:
    """`AttentionSite.probabilities` for a module whose whole output is the probabilities
    (a dropout or identity module the probabilities pass on their way to the values)."""
    return output


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


class Adapter(ABC):
    """One model family: the small contract the engine (explain.engine) runs against.

    A family file subclasses `Adapter`, implements the abstract members below and names
    its class in explain.architectures.registry. Capabilities are declared, never probed:
    `lrp_walk` (the LRP methods) and `attnlrp_sites` (AttnLRP and CP-LRP), optional
    methods defined in the family's own file, `pooled_by_mean` (a sentence encoder),
    `reads_text` (a tokenizer serves it), `fused_path()` (the fused attention kernel); the
    defaults describe a single-stack image model with none of them. A model of another
    kind subclasses that kind's contract, which the engine's plan for it names
    (explain.engine.plans): `LanguageModel` (a decoder-only language model, whose
    generations it explains), `ImageTextModel`, `EncoderDecoder`, `Detector`, or
    explain.architectures.dual_encoder's `DualEncoder`.
    """

    family: ClassVar[str]
    """Human-readable name of the family, used in error messages and `explain models`."""

    lrp_walk: Callable[..., LrpWalk] | None = None
    """Optional method `lrp_walk(*, to_input: bool) -> LrpWalk`: the family's LRP walk
    (explain.lrp.walk), which the LRP methods need; `to_input` also captures what full LRP
    needs to reach the input. A family that has one defines it in its own file; None
    (default): the LRP methods are refused before any forward."""

    lrp_covers: ClassVar[str | None] = None
    """Which of the family's models its LRP walk covers, where not all of them, said where
    the family's methods are listed (`explain models`); None: every model, as far as the
    family can tell without one (`lrp_missing` asks each model)."""

    attnlrp_sites: Callable[[], AttnLrpSites] | None = None
    """Optional method `attnlrp_sites() -> AttnLrpSites`: where the gradient rules of
    AttnLRP and CP-LRP attach in the family's modules (explain.lrp.attnlrp). A family
    that has them defines it in its own file; None (default): they are refused before
    any forward."""

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

    def repeated(self, prepared: Prepared, copies: int) -> Prepared:
        """`prepared` for `copies` copies of its batch in one: copy c of sample b at row
        c * B + b (the methods that run variants of the inputs as copies, integrated
        gradients and occlusion, change them at the embeddings). Here every argument
        and the token mask repeated along their first axis, which holds the batch; a
        family with an argument laid out otherwise overrides it."""
        layout = prepared.layout
        if layout.token_mask is not None:
            layout = dataclasses.replace(layout, token_mask=_tiled(layout.token_mask, copies))
        return dataclasses.replace(
            prepared,
            batch_size=prepared.batch_size * copies,
            layout=layout,
            arguments={name: _tiled(value, copies) for name, value in prepared.arguments.items()},
        )

    def to_input_space(self, token_relevance: Tensor, layout: TokenLayout) -> Tensor:
        """Map (..., N) token relevance onto the input: the patch grid of an image (prefix
        tokens dropped), or text tokens with pads exactly 0 (`TokenLayout.to_input_space`).
        A family whose input differs overrides it."""
        return layout.to_input_space(token_relevance)

    def lrp_missing(self) -> str | None:
        """What the family's LRP walk lacks for this model (a sentence for an error
        message), or None: nothing. Asked before any forward, of a family with a walk
        (`lrp_walk`), so that a model its walk does not cover is refused the LRP methods
        as any other missing capability is. Optional: the default is None."""
        return None

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
        (explain.engine.fused.explicit_map_bytes); None (default): every block attends over
        `prepared.layout`'s tokens, batch times the model's heads maps each."""
        return None

    def sets(self, prepared: Prepared) -> Sequence[TokenSet]:
        """The token sets of `prepared` whose relevance is returned. One stack (default):
        one set named after the modality, over every block, read out by `readout`."""
        layout = prepared.layout
        return [TokenSet(layout.modality, range(self.num_layers), layout, self.readout(prepared))]

    def encode(self, inputs: object, tokenizer: Any) -> object:
        """`inputs` with raw texts (a string or a list of strings) tokenized by the
        Explainer's `tokenizer` into a padded batch (explain.inputs.encode); anything else
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
        explain instead: class targets are then refused (explain.engine.targets)."""
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
        """A tensor that tells the device and the floating dtype to use: the model's first
        floating-point parameter, or, where accelerate dispatches the model (its weights
        perhaps offloaded to the meta device), an empty tensor of that dtype on the
        hooks' execution device, where the inputs go."""
        found = None
        for parameter in self.model.parameters():
            if parameter.is_floating_point():
                found = parameter
                break
            found = found if found is not None else parameter
        if found is None:  # a parameter-free model cannot be a transformer
            raise TypeError("the model has no parameters")
        # Both dispatch_model and cpu_offload / disk_offload hook the root, and a device_map
        # leaves hf_device_map on it: any other model runs where its parameters are.
        hooked = getattr(self.model, ACCELERATE_HOOK, None) is not None
        if not hooked and not hasattr(self.model, "hf_device_map"):
            return found
        device = execution_device(self.model)
        if device is None or device == found.device:
            return found
        return found.new_empty(0, device=device)


class LanguageModel(Adapter):
    """The contract of a decoder-only language model's adapter: `forward` gives the next
    token's logits at each sample's last real token, and a generation (explain.engine's
    `GenerationPlan`, explain.generation) reads them, and their readout rows, at any
    positions of one forward. The wrapped model has Hugging Face's `generate`."""

    reads_text = True
    causal_without_mask: ClassVar[bool] = False
    """Whether the model, given no attention mask and the positions 0..W-1 in every row,
    builds its own causal (and sliding-window) mask: all that right-padded rows need
    (`right_padded_logits_at`)."""

    @abstractmethod
    def logits_at(self, prepared: Prepared, positions: Tensor | slice) -> Tensor:
        """(B, P) positions -> the (B, P, vocab) next-token logits there. A slice of
        positions, the same for every sample (a generation's), is taken by slicing, whose
        backward batched over the positions runs no kernel once per position (an index's
        or a gather's does)."""

    def right_padded_logits_at(
        self, input_ids: Tensor, lengths: Tensor, positions: Tensor
    ) -> Tensor:
        """`logits_at` for (B, W) `input_ids` whose row b holds `lengths[b]` real tokens
        first and padding after them, at (B, P) `positions` on real tokens. Under the causal
        mask no real token attends to a pad on its right, so where the model takes no mask
        (`causal_without_mask`) none is given, and every row counts its positions 0..W-1
        (a pad repeating its row's last position would read to transformers as the start
        of a packed sequence, whose mask is dense again): sdpa then runs its causal kernel
        instead of an explicit mask's (recall-llama at 2,048 tokens, 4 rows: 0.29 s against
        0.49 s of CPU time)."""
        width = input_ids.shape[1]
        mask = (torch.arange(width, device=lengths.device) < lengths[:, None]).long()
        prepared = self.prepare({"input_ids": input_ids, "attention_mask": mask})
        if self.causal_without_mask:
            arguments = prepared.arguments
            del arguments["attention_mask"]
            if "position_ids" in arguments:
                counted = torch.arange(width, device=arguments["position_ids"].device)
                arguments["position_ids"] = counted.expand_as(arguments["position_ids"])
        return self.logits_at(prepared, positions)

    def readout_at(self, prepared: Prepared, positions: Tensor) -> Tensor:
        """(B, T) readout rows, one-hot at each sample's position (B,); or (B, P, T) for
        P positions per sample (B, P), all columns of a generation at once. In the
        model's dtype, on the device of the attention mask."""
        mask = prepared.arguments["attention_mask"]
        tokens = torch.arange(mask.shape[1], device=mask.device)
        return (tokens == positions.to(mask.device)[..., None]).to(self.parameter.dtype)


class ImageTextModel(LanguageModel):
    """The contract of a vision-language model's adapter (LLaVA): a vision tower whose
    image tokens a decoder-only language model reads. `prepare` gives an `ImagePrepared`
    (where each text's image tokens lie and how they go back onto the tower and the
    photo), `sets` the "image" (the tower's blocks) and "text" (the language model's)
    token sets; the image-text plan (explain.engine.plans.image_text) explains the next
    token or an answer over both. explain.architectures.hf_vision_language holds what
    the Hugging Face families share."""


class EncoderDecoder(Adapter):
    """The contract of an encoder-decoder's adapter (BART, T5): an encoder read by a
    decoder through cross-attention. Its attention sites name their stack ("source" or
    "target") and kind ("self" or "cross"); its inputs carry `decoder_input_ids` and
    `decoder_attention_mask`; `sets` are "source" and "target". The encoder-decoder plan
    (explain.engine.plans.encoder_decoder) reads the two-set rules of
    explain.rules.coattention at a decoder position."""


class Detector(Adapter):
    """The contract of an object detector's adapter (DETR): queries read the image's
    tokens, and each query predicts a box and class scores. A detection plan
    (explain.engine.plans.detection) chooses the detections from `class_probabilities` and
    explains each at its query."""

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


def _tiled(tensor: Tensor, copies: int) -> Tensor:
    """`tensor` repeated `copies` times along its first axis."""
    return tensor.repeat(copies, *(1,) * (tensor.dim() - 1))


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


def refuse_meta_inputs(
    inputs: object, name: str = "an input", error: type[ExplainError] = InputError
) -> None:
    """Refuse tensors on the meta device anywhere in `inputs` (a tensor, or mappings and
    lists of them, an image prompt's photos included) with `error`: they have shapes but
    no values, so every check of the values would fail with PyTorch's own error."""
    if isinstance(inputs, Tensor):
        if inputs.is_meta:
            raise error(
                f"{name} is on the meta device, which holds no values: give the tensors "
                "themselves (on the CPU or the model's device)"
            )
    elif isinstance(inputs, Mapping):
        for key, value in inputs.items():
            refuse_meta_inputs(value, key if isinstance(key, str) else name, error)
    elif isinstance(inputs, list | tuple):
        for value in inputs:
            refuse_meta_inputs(value, name, error)
