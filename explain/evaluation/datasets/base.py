"""What an evaluation dataset yields: images with labels (and masks), words with
rationales, or prompts with the answer a generative model should give and where its
evidence lies (`AnswerExample` for language models, `ImageAnswerExample` for
vision-language models).

Datasets are plain sequences (`len`, indexing) of examples, so the runner can cut them into
chunks by index, shard the chunks over processes and resume a run chunk by chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

import torch
from torch import Tensor

from explain.errors import InputError

__all__ = [
    "AnswerExample",
    "EvaluationDataset",
    "ImageAnswerExample",
    "ImageExample",
    "TextExample",
    "TwoObjectExample",
]


@dataclass(frozen=True)
class ImageExample:
    """One image for the perturbation or segmentation test.

    Attributes:
        image: (3, H, W) pixels in [0, 1], NOT normalised: the perturbation test zeroes
            pixels before the model's normalisation, as the protocol prescribes.
        label: the ground-truth class.
        mask: (H, W) integer segmentation: 1 foreground, 0 background, negative values
            unlabelled (ignored); None where the data has no masks.
    """

    image: Tensor
    label: int
    mask: Tensor | None = None

    def __post_init__(self) -> None:
        if self.image.dim() != 3 or self.image.shape[0] != 3:
            raise InputError(f"an example image must be (3, H, W), got {tuple(self.image.shape)}")
        if self.mask is not None and tuple(self.mask.shape) != tuple(self.image.shape[-2:]):
            raise InputError(
                f"mask {tuple(self.mask.shape)} and image {tuple(self.image.shape[-2:])} "
                "differ in size"
            )


@dataclass(frozen=True, kw_only=True)
class TwoObjectExample(ImageExample):
    """An image with two objects of different classes, explained for one of them.

    `label` and `mask` are the explained object's (the target's); `other_label` and
    `other_mask` those of the other object, whose pixels are evidence for another class.
    """

    other_label: int
    other_mask: Tensor

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mask is None:
            raise InputError("a two-object example needs the target's mask")
        if tuple(self.other_mask.shape) != tuple(self.mask.shape):
            raise InputError(
                f"the other object's mask {tuple(self.other_mask.shape)} and the target's "
                f"{tuple(self.mask.shape)} differ in size"
            )
        if self.other_label == self.label:
            raise InputError(f"the two objects must be of different classes, both are {self.label}")


@dataclass(frozen=True)
class TextExample:
    """One text for the rationale test: its words, its class, and which words are rationale.

    `rationale[i]` is True when word i belongs to the human (or known) rationale.
    """

    words: tuple[str, ...]
    label: int
    rationale: tuple[bool, ...]

    def __post_init__(self) -> None:
        if not self.words:
            raise InputError("a text example needs at least one word")
        if len(self.rationale) != len(self.words):
            raise InputError(
                f"{len(self.words)} words but {len(self.rationale)} rationale flags; "
                "give one flag per word"
            )


def _positions(name: str, positions: tuple[int, ...], length: int) -> None:
    """Refuse token positions outside a prompt of `length` tokens, or given twice."""
    outside = [p for p in positions if isinstance(p, bool) or not 0 <= p < length]
    if outside:
        raise InputError(f"{name} positions {outside} lie outside the prompt's {length} tokens")
    if len(set(positions)) != len(positions):
        raise InputError(f"{name} positions {list(positions)} name a token twice")


def _prompt_and_answer(input_ids: tuple[int, ...], answer: tuple[int, ...]) -> None:
    if not input_ids:
        raise InputError("an answer example needs a prompt (input_ids is empty)")
    if not answer:
        raise InputError("an answer example needs at least one answer token")


@dataclass(frozen=True)
class AnswerExample:
    """A prompt for a decoder-only language model, the answer it should give, and which
    prompt tokens are the answer's evidence (the language-evidence test).

    Attributes:
        input_ids: the prompt's token ids exactly as the model reads them (special tokens
            and chat template included), unpadded.
        answer: the answer's token ids (at least one), scored teacher-forced after the
            prompt.
        evidence: positions in `input_ids` of the evidence (e.g. the tokens of the asked
            fact); empty when the example has none (such examples are left out of the
            evidence recall, and counted).
        kept: positions that removal never touches: the question and the chat template.
    """

    input_ids: tuple[int, ...]
    answer: tuple[int, ...]
    evidence: tuple[int, ...] = ()
    kept: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _prompt_and_answer(self.input_ids, self.answer)
        _positions("evidence", self.evidence, len(self.input_ids))
        _positions("kept", self.kept, len(self.input_ids))


@dataclass(frozen=True)
class ImageAnswerExample:
    """A question about an image for a vision-language model, the answer it should give,
    the object the answer is about and the question's evidence words (the
    vision-language-evidence test).

    Attributes:
        input_ids: the prompt's token ids as the model's processor makes them (the image
            placeholder expanded to the image tokens, the chat template included),
            unpadded.
        pixel_values: (3, H, W) the image as the model takes it (normalised by the
            processor); one image per prompt.
        answer: the answer's token ids (at least one).
        mask: (H, W) bool on the grid of `pixel_values`: the pixels of the object the
            answer is about; all False when it is about none ("no", "nothing"), and such
            examples are left out of the pointing game and the mIoU (and counted).
        text_evidence: positions in `input_ids` of the question's words the answer rests
            on (e.g. the asked object's name); may be empty.
        token_type_ids: the processor's token types where the model takes them
            (PaliGemma, Gemma 3), else None.
        regions: (R, H, W) bool on the grid of `pixel_values`, the image's regions (the
            objects of a scene), of which `mask`, when it holds pixels, is one
            (`asked_region`); None: the example has no regions (it is left out of the
            region numbers, and counted).
    """

    input_ids: tuple[int, ...]
    pixel_values: Tensor
    answer: tuple[int, ...]
    mask: Tensor
    text_evidence: tuple[int, ...] = ()
    token_type_ids: tuple[int, ...] | None = None
    regions: Tensor | None = None

    @property
    def asked_region(self) -> int | None:
        """The index of the region that is `mask` (the answer's object), or None when the
        example has no regions or its answer is about no object."""
        if self.regions is None or not bool(self.mask.any()):
            return None
        found = (self.regions == self.mask.bool()).flatten(1).all(dim=1).nonzero()
        return int(found[0, 0]) if len(found) else None

    def __post_init__(self) -> None:
        _prompt_and_answer(self.input_ids, self.answer)
        if self.pixel_values.dim() != 3 or self.pixel_values.shape[0] != 3:
            raise InputError(
                "an image answer example takes one (3, H, W) image as pixel_values, got "
                f"{tuple(self.pixel_values.shape)}"
            )
        if tuple(self.mask.shape) != tuple(self.pixel_values.shape[-2:]):
            raise InputError(
                f"mask {tuple(self.mask.shape)} and pixel_values "
                f"{tuple(self.pixel_values.shape[-2:])} differ in size"
            )
        _positions("text evidence", self.text_evidence, len(self.input_ids))
        if self.token_type_ids is not None and len(self.token_type_ids) != len(self.input_ids):
            raise InputError(
                f"{len(self.token_type_ids)} token types for {len(self.input_ids)} tokens"
            )
        if self.regions is not None:
            size = tuple(self.mask.shape)
            if self.regions.dim() != 3 or tuple(self.regions.shape[1:]) != size:
                raise InputError(
                    f"regions are (R, H, W) masks on the image's {size} grid, got "
                    f"{tuple(self.regions.shape)}"
                )
            if self.regions.dtype != torch.bool or not bool(self.regions.flatten(1).any(1).all()):
                raise InputError("regions are bool masks that each hold a pixel")
            if bool(self.mask.any()) and self.asked_region is None:
                raise InputError("the answer's object (mask) is none of the regions")


Example = TypeVar(
    "Example", ImageExample, TextExample, AnswerExample, ImageAnswerExample, covariant=True
)


@runtime_checkable
class EvaluationDataset(Protocol[Example]):
    """A sequence of examples with a name that identifies it in results and resume files."""

    name: str

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Example: ...
