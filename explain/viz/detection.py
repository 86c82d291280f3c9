"""One image's detections: a panel per detection, its map over the image and its box.

Matplotlib is imported only when drawing. The maps come from
`explain.detections.maps_on_images` (on the original image, each min-max normalised on
its own: the caption says so), the boxes from `Detections.corners`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from explain.errors import InputError
from explain.viz.image import overlay

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["detection_figure"]

_PANEL_INCHES = 2.6


def detection_figure(
    image: Tensor | np.ndarray,
    maps: Tensor,
    corners: Tensor,
    labels: Sequence[str],
    scores: Sequence[float],
    *,
    cmap: str | None = None,
    alpha: float = 0.8,
) -> Figure:
    """The `image` (3, H, W) or (H, W, 3) in [0, 1] once per detection: panel k shows
    `maps[k]` (H, W) in [0, 1] over it, the box `corners[k]` (x0, y0, x1, y1 pixels) and
    the title "label score"."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    count = maps.shape[0]
    if count == 0 or not (len(labels) == len(scores) == corners.shape[0] == count):
        raise InputError(
            f"give one map, box, label and score per detection (got {count} maps, "
            f"{corners.shape[0]} boxes, {len(labels)} labels, {len(scores)} scores; at least one)"
        )
    height, width = maps.shape[-2:]
    aspect = height / width
    figure = Figure(figsize=(count * _PANEL_INCHES, _PANEL_INCHES * aspect + 0.7))
    for k in range(count):
        axis = figure.add_subplot(1, count, k + 1)
        axis.imshow(overlay(image, maps[k].detach().cpu().numpy(), cmap=cmap, alpha=alpha))
        axis.set_xticks([])
        axis.set_yticks([])
        x0, y0, x1, y1 = (float(v) for v in corners[k])
        axis.add_patch(
            Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor="lime", linewidth=1.5)
        )
        axis.set_title(f"{labels[k]} {scores[k]:.2f}", fontsize=9)
    figure.text(
        0.5,
        0.02,
        "each detection's map (generic rule, encoder-decoder form), min-max scaled per map",
        ha="center",
        fontsize=7,
    )
    return figure
