"""The ImageNet-segmentation set (Guillaumin et al., IJCV 2014) as the file `gtsegs_ijcv.mat`.

The file is MATLAB v7.3, i.e. HDF5. `/value/img` is an (N, 1) array of object references,
each to a uint8 image stored column-major as (3, W, H); `/value/gt` is an (N, 1) array of
references to 1 x 1 cells whose one reference points at the (W, H) mask (1 foreground,
0 background). Images are resized bilinearly and masks by nearest neighbour to the model's
input size, as in the reference evaluation. The file holds no labels the protocol needs:
the segmentation test explains the predicted class, so every example's label is -1.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from explain.errors import InputError
from explain.evaluation.datasets.base import ImageExample

__all__ = ["ImageNetSegmentation"]


class ImageNetSegmentation:
    """Images and foreground masks from `gtsegs_ijcv.mat` (read with h5py).

    Args:
        path: the .mat (HDF5) file.
        size: (H, W) images and masks are resized to.
    """

    def __init__(self, path: str | os.PathLike[str], size: tuple[int, int] = (224, 224)) -> None:
        import h5py

        self.path = Path(path)
        if not self.path.is_file():
            raise InputError(f"ImageNet-segmentation file not found: {self.path}")
        try:
            with h5py.File(self.path, "r") as handle:
                self._length = len(handle["/value/img"])
                if len(handle["/value/gt"]) != self._length:
                    raise InputError(f"{self.path}: /value/img and /value/gt differ in length")
        except (OSError, KeyError) as error:
            raise InputError(
                f"cannot read {self.path} as gtsegs_ijcv.mat (an HDF5 file with /value/img "
                f"and /value/gt): {error}"
            ) from None
        self.size = size
        self.name = f"imagenet-segmentation:{self.path.resolve()}"
        self._handle: Any = None  # opened on first use, so a dataset can cross processes

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> ImageExample:
        from PIL import Image

        if not 0 <= index < self._length:
            raise IndexError(f"index {index} out of range for {self._length} images")
        if self._handle is None:
            import h5py

            self._handle = h5py.File(self.path, "r")
        handle = self._handle
        image = np.asarray(handle[handle["/value/img"][index, 0]]).transpose(2, 1, 0)
        cell = handle[handle["/value/gt"][index, 0]]
        mask = np.asarray(handle[cell[0, 0]]).transpose(1, 0)
        height, width = self.size
        rgb = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8)).convert("RGB")
        rgb = rgb.resize((width, height), Image.BILINEAR)
        labels = Image.fromarray(np.ascontiguousarray(mask > 0, dtype=np.uint8))
        labels = labels.resize((width, height), Image.NEAREST)
        pixels = torch.from_numpy(np.asarray(rgb, dtype=np.float32) / 255.0).permute(2, 0, 1)
        return ImageExample(
            image=pixels, label=-1, mask=torch.from_numpy(np.asarray(labels, dtype=np.int64))
        )

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handle": None}
