"""Pictures: heatmap overlays, method x class grids and highlighted text.

matplotlib is imported only when something is drawn.
"""

from explain.viz.detection import detection_figure
from explain.viz.image import (
    DEFAULT_DPI,
    batch_figure,
    check_style,
    explanation_grid,
    grid_figure,
    heatmap_figure,
    overlay,
    save_figure,
    save_image,
)
from explain.viz.text_figure import text_figure

__all__ = [
    "DEFAULT_DPI",
    "batch_figure",
    "check_style",
    "detection_figure",
    "explanation_grid",
    "grid_figure",
    "heatmap_figure",
    "overlay",
    "save_figure",
    "save_image",
    "text_figure",
]
