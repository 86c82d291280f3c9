"""`LoadedModel`: a model ready to explain, with what it takes to feed it and name its outputs.

Its own module so that the loaders (explain.loading.specs for every spec,
explain.loading.zoo for the zoo) both build it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from explain.loading.preprocessing import ImagePreprocessing

__all__ = ["LoadedModel"]


@dataclass(frozen=True)
class LoadedModel:
    """A model in eval mode with what it takes to feed it and to name its outputs.

    Attributes:
        name: the spec it was loaded from.
        model: the torch module, in eval mode, on its device and in its dtype.
        modality: what `Explainer.explain` takes as inputs: "image", "text",
            "image_text" for dual encoders such as CLIP (images and texts together), or
            "vision_language" for models that answer in text about images (LLaVA).
        classes: the name of each output, in logit order (None when unknown).
        preprocessing: how a photo becomes the model's input and how a map on that input
            goes back onto the photo (image models).
        tokenizer: a Hugging Face tokenizer (text models); a vision-language model's
            processor (its tokenizer, image processor and chat template).
        multi_label: True when each logit is an independent yes/no (sigmoid) decision.
        card: the model card, when there is one.
        image_processor: an object detector's own Hugging Face image processor (it
            resizes each image and pads the batch, so there is no fixed `preprocessing`);
            None for every other model.
    """

    name: str
    model: nn.Module
    modality: Literal["image", "text", "image_text", "vision_language"]
    classes: tuple[str, ...] | None = None
    preprocessing: ImagePreprocessing | None = None
    tokenizer: Any = None
    multi_label: bool = False
    card: Path | None = None
    image_processor: Any = None

    @property
    def image_size(self) -> tuple[int, int] | None:
        """(H, W) the model takes (image models)."""
        return self.preprocessing.size if self.preprocessing else None

    @property
    def mean(self) -> tuple[float, ...] | None:
        """Per-channel mean its [0, 1] pixels are normalised with (image models)."""
        return self.preprocessing.mean if self.preprocessing else None

    @property
    def std(self) -> tuple[float, ...] | None:
        """Per-channel standard deviation its pixels are normalised with (image models)."""
        return self.preprocessing.std if self.preprocessing else None

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are, and so where its explanations are computed."""
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The floating-point type of the model's parameters."""
        return next(self.model.parameters()).dtype
