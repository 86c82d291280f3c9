"""Heatmap overlays on images."""

from __future__ import annotations

import os

import numpy as np
import torch
from torch import Tensor

from explain.io import atomic_write

__all__ = ["overlay", "save_image"]


def _to_hwc(image: Tensor | np.ndarray) -> np.ndarray:
    array = image.detach().cpu().float().numpy() if isinstance(image, Tensor) else np.asarray(image)
    if array.ndim == 3 and array.shape[0] in (1, 3) and array.shape[-1] not in (1, 3):
        array = array.transpose(1, 2, 0)
    if array.dtype == np.uint8:
        array = array.astype(np.float32) / 255.0
    return np.clip(array, 0.0, 1.0)


def overlay(
    image: Tensor | np.ndarray,
    heatmap: Tensor | np.ndarray,
    cmap: str = "jet",
    alpha: float = 0.5,
) -> np.ndarray:
    """Blend a [0, 1] heatmap (H, W) coloured by `cmap` over an RGB image in [0, 1].

    `image` is (3, H, W) or (H, W, 3); returns an (H, W, 3) float array in [0, 1].
    """
    from matplotlib import colormaps

    rgb = _to_hwc(image)
    heat = heatmap.detach().cpu().float().numpy() if isinstance(heatmap, Tensor) else heatmap
    if heat.shape != rgb.shape[:2]:
        raise ValueError(f"heatmap {heat.shape} and image {rgb.shape[:2]} differ in size")
    colored = colormaps[cmap](np.clip(heat, 0.0, 1.0))[..., :3]
    return (1.0 - alpha) * rgb + alpha * colored


def save_image(array: np.ndarray | Tensor, path: str | os.PathLike[str]) -> None:
    """Save an (H, W, 3) float [0, 1] array as PNG, atomically."""
    from PIL import Image

    if isinstance(array, Tensor):
        array = _to_hwc(torch.as_tensor(array))
    pixels = (np.clip(array, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    with atomic_write(path) as handle:
        Image.fromarray(pixels).save(handle, format="PNG")
