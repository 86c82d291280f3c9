"""One image's detections: a panel per detection, its map over the image and its box.

Matplotlib is imported only when drawing. The maps come from
`explain.detections.maps_on_images` (on the original image), the boxes from
`Detections.corners`. The panels run in reading order, `MAPS_PER_ROW` to a row, under a
title, with a colour key and the scaling rule, as the other figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from explain.errors import InputError
from explain.viz.image import MAPS_PER_ROW, _reading_order_panels
from explain.viz.literal import literal_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["detection_figure"]


@literal_text
def detection_figure(
    image: Tensor | np.ndarray,
    maps: Tensor,
    corners: Tensor,
    labels: Sequence[str],
    scores: Sequence[float],
    *,
    title: str | None = None,
    cmap: str | None = None,
    alpha: float = 0.8,
    background: str = "grey",
    maps_per_row: int = MAPS_PER_ROW,
) -> Figure:
    """The `image` (3, H, W) or (H, W, 3) in [0, 1] once per detection, under `title`
    (e.g. the model, the image and the method): panel k shows `maps[k]` (H, W) over it
    (each map scaled on its own, as the key and the caption say), the box `corners[k]`
    (x0, y0, x1, y1 pixels) and the title "label score"; `maps_per_row` panels to a row."""
    from matplotlib.patches import Rectangle

    count = maps.shape[0]
    if count == 0 or not (len(labels) == len(scores) == corners.shape[0] == count):
        raise InputError(
            f"give one map, box, label and score per detection (got {count} maps, "
            f"{corners.shape[0]} boxes, {len(labels)} labels, {len(scores)} scores; at least one)"
        )
    figure, panels = _reading_order_panels(
        image,
        [m.detach().cpu().double().numpy() for m in maps],
        [f"{label} {score:.2f}" for label, score in zip(labels, scores, strict=True)],
        title=title,
        note="Green: each detection's predicted box.",
        per_row=maps_per_row,
        cmap=cmap,
        alpha=alpha,
        background=background,
    )
    for axis, box in zip(panels, corners.tolist(), strict=True):
        x0, y0, x1, y1 = (float(v) for v in box)
        axis.add_patch(
            Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor="lime", linewidth=1.5)
        )
    return figure
