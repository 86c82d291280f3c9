"""An ImageNet validation folder: one subfolder per class (the WordNet id), images inside.

This is the layout torchvision's ImageNet(split="val") and ImageFolder read: classes are
the subfolder names in sorted order, so class i is the i-th WordNet id, the index the
pretrained ImageNet classifiers use. Images are resized to the model's input size, as
in the perturbation protocol (224 x 224 for ViT-B/16), and kept in [0, 1].
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from explain.errors import InputError
from explain.evaluation.datasets.base import ImageExample

__all__ = ["IMAGE_SUFFIXES", "ImageNetFolder", "read_image"]

IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png", ".bmp", ".webp")


def read_image(path: str | os.PathLike[str], size: tuple[int, int]) -> torch.Tensor:
    """(3, H, W) pixels in [0, 1] of an image file, resized (bilinear) to `size` = (H, W)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            rgb = image.convert("RGB").resize((size[1], size[0]), Image.BILINEAR)
    except FileNotFoundError:
        raise InputError(f"image file not found: {path}") from None
    except (UnidentifiedImageError, OSError) as error:
        raise InputError(f"cannot read {path} as an image: {error}") from None
    return torch.from_numpy(np.asarray(rgb, dtype=np.float32) / 255.0).permute(2, 0, 1)


class ImageNetFolder:
    """The images of an ImageNet-style validation folder, labelled by their class folder.

    Args:
        root: the folder holding one subfolder per class.
        size: (H, W) the images are resized to.
    """

    def __init__(self, root: str | os.PathLike[str], size: tuple[int, int] = (224, 224)) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise InputError(f"ImageNet folder not found: {self.root}")
        self.classes = sorted(p.name for p in self.root.iterdir() if p.is_dir())
        if not self.classes:
            raise InputError(
                f"{self.root} has no class subfolders; expected the ImageNet validation "
                "layout ROOT/<wnid>/<image>.JPEG"
            )
        self.samples = [
            (path, label)
            for label, wnid in enumerate(self.classes)
            for path in sorted((self.root / wnid).iterdir())
            if path.suffix.lower() in IMAGE_SUFFIXES
        ]
        self.size = size
        self.name = f"imagenet-folder:{self.root.resolve()}"

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> ImageExample:
        path, label = self.samples[index]
        return ImageExample(image=read_image(path, self.size), label=label)
