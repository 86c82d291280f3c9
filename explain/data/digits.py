"""scikit-learn's handwritten digits (real data shipped with scikit-learn), as small images.

The 1797 grey 8 x 8 digits (values 0-16) are scaled to [0, 1], upsampled bilinearly to
32 x 32 and repeated over three channels, so that a standard RGB ViT with 4 x 4 patches sees
an 8 x 8 token grid. The split is fixed: a seeded permutation puts 1397 images in "train"
and the other 400 in "heldout", with every digit in both.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from explain.errors import ExplainError

__all__ = ["CLASSES", "IMAGE_SIZE", "MEAN", "SPLITS", "STD", "load", "normalise", "split_indices"]

CLASSES: tuple[str, ...] = tuple(str(digit) for digit in range(10))
IMAGE_SIZE = 32
MEAN = (0.5, 0.5, 0.5)
STD = (0.5, 0.5, 0.5)
SPLITS = ("train", "heldout")
_HELDOUT = 400
_SPLIT_SEED = 0


def split_indices(split: str) -> np.ndarray:
    """Indices into scikit-learn's `load_digits()` of the images in `split` (sorted)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {list(SPLITS)}")
    order = np.random.default_rng(_SPLIT_SEED).permutation(1797)
    chosen = order[_HELDOUT:] if split == "train" else order[:_HELDOUT]
    return np.sort(chosen)


def load(split: str, size: int = IMAGE_SIZE) -> tuple[Tensor, Tensor]:
    """The images of `split` in [0, 1], (N, 3, size, size) float32, and labels (N,) long."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:  # an install without the zoo extra
        raise ExplainError(
            "the handwritten digits come with scikit-learn, which is not installed: "
            '`pip install "explain-transformers[zoo]"` (or only `pip install scikit-learn`)'
        ) from None
    data = load_digits()
    indices = split_indices(split)
    pixels = torch.from_numpy(data.images[indices].astype(np.float32) / 16.0)[:, None]
    images = F.interpolate(pixels, size=(size, size), mode="bilinear", align_corners=False)
    return images.repeat(1, 3, 1, 1).clamp(0, 1), torch.from_numpy(data.target[indices]).long()


def normalise(images: Tensor) -> Tensor:
    """[0, 1] images -> the normalised input of the zoo's digits model."""
    mean = torch.tensor(MEAN, dtype=images.dtype)[:, None, None]
    std = torch.tensor(STD, dtype=images.dtype)[:, None, None]
    return (images - mean) / std
