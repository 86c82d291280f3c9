"""`LoadedModel`: what loading a model spec returns. Its own module so that the loaders
(explain.loading) and the zoo (explain.zoo), which loading calls, share it without
importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from torch import nn

__all__ = ["LoadedModel"]


@dataclass(frozen=True)
class LoadedModel:
    """A model in eval mode with what it takes to feed it and to name its outputs.

    Attributes:
        name: the spec it was loaded from.
        model: the torch module, in eval mode.
        modality: what `Explainer.explain` takes as inputs: "image", "text", or
            "image_text" for dual encoders such as CLIP (images and texts together).
        classes: the name of each output, in logit order (None when unknown).
        image_size: (H, W) the model takes (image models).
        mean, std: per-channel normalisation of [0, 1] pixels (image models).
        tokenizer: a Hugging Face tokenizer (text models).
        multi_label: True when each logit is an independent yes/no (sigmoid) decision.
        card: the model card, when there is one.
    """

    name: str
    model: nn.Module
    modality: Literal["image", "text", "image_text"]
    classes: tuple[str, ...] | None = None
    image_size: tuple[int, int] | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    tokenizer: Any = None
    multi_label: bool = False
    card: Path | None = None
