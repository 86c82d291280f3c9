"""Pictures: heatmap overlays and grids (matplotlib, imported only when drawing)."""

from explain.viz.image import overlay, save_image

__all__ = ["overlay", "save_image"]
