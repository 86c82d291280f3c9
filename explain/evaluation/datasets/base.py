"""What an evaluation dataset yields: images with labels (and masks), or words with rationales.

Datasets are plain sequences (`len`, indexing) of examples, so the runner can cut them into
chunks by index, shard the chunks over processes and resume a run chunk by chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

from torch import Tensor

from explain.errors import InputError

__all__ = ["EvaluationDataset", "ImageExample", "TextExample", "TwoObjectExample"]


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


Example = TypeVar("Example", ImageExample, TextExample, covariant=True)


@runtime_checkable
class EvaluationDataset(Protocol[Example]):
    """A sequence of examples with a name that identifies it in results and resume files."""

    name: str

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Example: ...
