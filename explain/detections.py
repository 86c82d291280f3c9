"""Detections (DETR): which objects an explanation explains, and their maps on the image.

An explanation of a detector has one column per explained detection: `relevance` is
(B, K, gh, gw) over the encoder's feature grid, and `Explanation.detections` says, per
column, which query it is, its label, score and box. The image processor resized each
image and padded the batch to one size; `maps_on_images` undoes both, so each map lies
on its own original image, as the processor's `post_process_object_detection` puts boxes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from explain.errors import InputError
from explain.normalize import normalize_per_sample

__all__ = ["Detections", "maps_on_images"]


@dataclass(frozen=True)
class Detections:
    """The explained detections, one per column K of the relevance.

    Attributes:
        queries: (B, K) the decoder query of each detection.
        labels: (B, K) its class (the query's most probable real class), -1 in the
            columns past an image's last detection (there the relevance is 0).
        scores: (B, K) the probability of that class, as the model's post-processing
            scores it (DETR: softmax over the classes and "no object"; Conditional DETR:
            the class's sigmoid).
        boxes: (B, K, 4) the predicted box, (centre x, centre y, width, height) as
            fractions of the image before padding, as DETR predicts it.
        valid: (B, K) True where the column is a detection.
        image_sizes: (B, 2) (height, width) in input pixels of each image before the
            processor's padding (from the pixel mask).
    """

    queries: Tensor
    labels: Tensor
    scores: Tensor
    boxes: Tensor
    valid: Tensor
    image_sizes: Tensor

    def corners(self, sizes: Tensor | Sequence[tuple[int, int]] | None = None) -> Tensor:
        """(B, K, 4) boxes as (x0, y0, x1, y1) pixels of images of `sizes` (B, 2) (height,
        width): the original images before the processor resized them, or by default
        the model's input without its padding."""
        scale = self.image_sizes if sizes is None else _sizes(sizes, self.boxes.shape[0])
        height, width = scale[:, 0, None].to(self.boxes), scale[:, 1, None].to(self.boxes)
        cx, cy, w, h = self.boxes.unbind(-1)
        return torch.stack(
            (
                (cx - w / 2) * width,
                (cy - h / 2) * height,
                (cx + w / 2) * width,
                (cy + h / 2) * height,
            ),
            dim=-1,
        )


def _sizes(sizes: Tensor | Sequence[tuple[int, int]], batch: int) -> Tensor:
    table = torch.as_tensor(sizes, dtype=torch.long)
    if table.shape != (batch, 2) or bool((table <= 0).any()):
        raise InputError(
            f"give one (height, width) of positive pixels per image, shape ({batch}, 2); "
            f"got {tuple(table.shape)}"
        )
    return table


def maps_on_images(
    relevance: Tensor,
    detections: Detections,
    input_size: tuple[int, int],
    sizes: Tensor | Sequence[tuple[int, int]] | None = None,
) -> list[Tensor]:
    """Each image's detection maps on that image, min-max normalised to [0, 1]: (K, h, w)
    per image for `relevance` (B, K, gh, gw) over the feature grid of inputs of
    `input_size`. The grid is upsampled bilinearly to the padded input, the padding is
    cut off (`image_sizes`), and the rest resized to the image's `sizes` (original
    (height, width) pixels, as given to the processor's post-processing; default: the
    unpadded input). Columns past an image's last detection are 0."""
    batch = relevance.shape[0]
    targets = detections.image_sizes if sizes is None else _sizes(sizes, batch)
    padded = F.interpolate(
        relevance.float().flatten(0, 1)[:, None],
        size=input_size,
        mode="bilinear",
        align_corners=False,
    ).reshape(batch, -1, *input_size)
    maps = []
    for index in range(batch):
        height, width = (int(v) for v in detections.image_sizes[index])
        crop = padded[index, :, :height, :width]
        size = tuple(int(v) for v in targets[index])
        if crop.shape[-2:] != size:
            crop = F.interpolate(crop[:, None], size=size, mode="bilinear", align_corners=False)[
                :, 0
            ]
        keep = detections.valid[index, :, None, None].to(crop)
        maps.append(normalize_per_sample(crop, sample_dims=2) * keep)
    return maps
