"""Heatmaps over images: overlays, figures with a colour bar, and method x class grids.

Everything here draws with matplotlib's object API (`matplotlib.figure.Figure`, no pyplot
state), imported only inside the functions that draw, so `import explain.viz` stays light
and figures made in a loop are freed as soon as they are dropped.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from explain.errors import ExplainError, InputError
from explain.io import atomic_write

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from explain.explanation import Explanation

__all__ = [
    "DEFAULT_DPI",
    "explanation_grid",
    "grid_figure",
    "heatmap_figure",
    "overlay",
    "save_figure",
    "save_image",
]

DEFAULT_DPI = 150
"""Resolution of saved figures: sharp on screens and in documents, small on disk."""

_PANEL_INCHES = 2.4
"""Edge length of one image panel in a figure."""


def _to_hwc(image: Tensor | np.ndarray) -> np.ndarray:
    array = image.detach().cpu().float().numpy() if isinstance(image, Tensor) else np.asarray(image)
    if array.ndim == 3 and array.shape[0] in (1, 3) and array.shape[-1] not in (1, 3):
        array = array.transpose(1, 2, 0)
    if array.ndim == 2:  # grey scale: repeat into RGB so that overlays can blend colours
        array = np.repeat(array[..., None], 3, axis=-1)
    if array.ndim != 3 or array.shape[-1] not in (1, 3):
        raise InputError(
            f"expected an image of shape (3, H, W), (H, W, 3) or (H, W), got {array.shape}"
        )
    if array.shape[-1] == 1:
        array = np.repeat(array, 3, axis=-1)
    if array.dtype == np.uint8:
        array = array.astype(np.float32) / 255.0
    return np.clip(array, 0.0, 1.0)


def _to_map(heatmap: Tensor | np.ndarray) -> np.ndarray:
    heat = (
        heatmap.detach().cpu().float().numpy()
        if isinstance(heatmap, Tensor)
        else np.asarray(heatmap, dtype=np.float32)
    )
    if heat.ndim != 2:
        raise InputError(f"a heatmap is one (H, W) map, got shape {heat.shape}")
    return heat


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ExplainError(f"alpha is the heatmap's opacity and must be in [0, 1], got {alpha}")


def _colormap(cmap: str):
    from matplotlib import colormaps

    try:
        return colormaps[cmap]
    except KeyError:
        raise ExplainError(
            f"unknown colormap {cmap!r}; use a matplotlib name such as 'jet', 'inferno' or "
            "'viridis'"
        ) from None


def overlay(
    image: Tensor | np.ndarray,
    heatmap: Tensor | np.ndarray,
    cmap: str = "jet",
    alpha: float = 0.5,
) -> np.ndarray:
    """Blend a [0, 1] heatmap (H, W) coloured by `cmap` over an RGB image in [0, 1].

    `image` is (3, H, W), (H, W, 3) or grey (H, W); `alpha` is the heatmap's opacity
    (0 shows only the image, 1 only the heatmap). Returns an (H, W, 3) float array in [0, 1].
    """
    _check_alpha(alpha)
    rgb = _to_hwc(image)
    heat = _to_map(heatmap)
    if heat.shape != rgb.shape[:2]:
        raise InputError(
            f"heatmap {heat.shape} and image {rgb.shape[:2]} differ in size; upsample the map "
            "with Explanation.heatmap(size=(H, W))"
        )
    colored = _colormap(cmap)(np.clip(heat, 0.0, 1.0))[..., :3]
    return (1.0 - alpha) * rgb + alpha * colored


def save_image(array: np.ndarray | Tensor, path: str | os.PathLike[str]) -> None:
    """Save an (H, W, 3) float [0, 1] array as a PNG of exactly H x W pixels, atomically."""
    from PIL import Image

    array = _to_hwc(array)
    pixels = (np.clip(array, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    with atomic_write(path) as handle:
        Image.fromarray(pixels).save(handle, format="PNG")


def _add_colorbar(figure: Figure, axes, cmap: str) -> None:
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    mappable = ScalarMappable(norm=Normalize(0.0, 1.0), cmap=_colormap(cmap))
    bar = figure.colorbar(mappable, ax=axes, shrink=0.8, fraction=0.05)
    bar.set_label("relevance (min-max normalised)")


def _draw_panel(axis, image: np.ndarray, heat: np.ndarray, cmap: str, alpha: float) -> None:
    axis.imshow(overlay(image, heat, cmap=cmap, alpha=alpha))
    axis.set_xticks([])
    axis.set_yticks([])


def heatmap_figure(
    image: Tensor | np.ndarray,
    heatmap: Tensor | np.ndarray,
    *,
    cmap: str = "jet",
    alpha: float = 0.5,
    colorbar: bool = True,
    title: str | None = None,
) -> Figure:
    """One image with its heatmap overlaid, a title and (by default) a colour bar.

    The heatmap is expected in [0, 1], as `Explanation.heatmap()` returns it.
    """
    from matplotlib.figure import Figure

    rgb = _to_hwc(image)
    width = _PANEL_INCHES * (1.3 if colorbar else 1.0)
    figure = Figure(figsize=(width, _PANEL_INCHES + 0.3), layout="constrained")
    axis = figure.add_subplot()
    _draw_panel(axis, rgb, _to_map(heatmap), cmap, alpha)
    if title:
        axis.set_title(title, fontsize=9)
    if colorbar:
        _add_colorbar(figure, axis, cmap)
    return figure


def grid_figure(
    image: Tensor | np.ndarray,
    heatmaps: Tensor | np.ndarray | Sequence[Sequence[Tensor | np.ndarray]],
    *,
    rows: Sequence[str],
    columns: Sequence[str],
    cmap: str = "jet",
    alpha: float = 0.5,
    colorbar: bool = True,
    show_image: bool = True,
) -> Figure:
    """One image explained in a grid: `heatmaps[i][j]` (H, W) is row `rows[i]`, column
    `columns[j]`, e.g. methods x classes (the papers' "cat and dog" figure).

    With `show_image` the plain image comes first, on a row of its own, so the eye can
    compare every map with what it covers.
    """
    from matplotlib.figure import Figure

    rgb = _to_hwc(image)
    if len(rows) == 0 or len(columns) == 0:
        raise InputError("a grid needs at least one row and one column")
    if len(heatmaps) != len(rows) or any(len(row) != len(columns) for row in heatmaps):
        raise InputError(
            f"heatmaps must be {len(rows)} rows x {len(columns)} columns to match the labels"
        )
    extra = 1 if show_image else 0
    figure = Figure(
        figsize=(
            _PANEL_INCHES * len(columns) + (0.8 if colorbar else 0.0) + 0.4,
            _PANEL_INCHES * (len(rows) + extra) + 0.3,
        ),
        layout="constrained",
    )
    axes = figure.subplots(len(rows) + extra, len(columns), squeeze=False)
    if show_image:
        axes[0][0].imshow(rgb)
        axes[0][0].set_title("input", fontsize=9)
        for axis in axes[0]:
            axis.axis("off")
    for i, label in enumerate(rows):
        for j, column in enumerate(columns):
            axis = axes[i + extra][j]
            _draw_panel(axis, rgb, _to_map(heatmaps[i][j]), cmap, alpha)
            if i == 0:
                axis.set_title(column, fontsize=9)
            if j == 0:
                axis.set_ylabel(label, fontsize=9)
    if colorbar:
        _add_colorbar(figure, axes[:, -1].tolist(), cmap)
    return figure


def explanation_grid(
    image: Tensor | np.ndarray,
    explanations: Mapping[str, Explanation],
    *,
    sample: int = 0,
    class_names: Sequence[str] | None = None,
    cmap: str = "jet",
    alpha: float = 0.5,
    colorbar: bool = True,
) -> Figure:
    """Methods x classes for sample `sample`: one row per `explanations` entry (method name
    -> Explanation of the same images and targets), one column per explained class.

    With a (B, K) target each Explanation holds K classes per image and the grid has K
    columns, titled with the class names when `class_names` is given.
    """
    if not explanations:
        raise InputError("explanation_grid needs at least one explanation")
    first = next(iter(explanations.values()))
    targets = first.target[sample].reshape(-1).tolist()
    columns = [_class_label(int(t), class_names) for t in targets]
    heatmaps = []
    for name, explanation in explanations.items():
        if explanation.target[sample].reshape(-1).tolist() != targets:
            raise InputError(
                f"explanation {name!r} explains classes "
                f"{explanation.target[sample].reshape(-1).tolist()}, the first one {targets}: "
                "a grid compares methods on the same classes"
            )
        maps = explanation.heatmap()[sample]
        heatmaps.append(list(maps) if maps.dim() == 3 else [maps])
    return grid_figure(
        image,
        heatmaps,
        rows=list(explanations),
        columns=columns,
        cmap=cmap,
        alpha=alpha,
        colorbar=colorbar,
    )


def _class_label(index: int, class_names: Sequence[str] | None) -> str:
    if index < 0:
        return "custom score"
    if class_names is not None and index < len(class_names):
        return f"{class_names[index]} ({index})"
    return f"class {index}"


def save_figure(
    figure: Figure, path: str | os.PathLike[str], dpi: int = DEFAULT_DPI
) -> tuple[int, int]:
    """Render `figure` to a PNG at `dpi`, atomically; returns its (width, height) in pixels."""
    from PIL import Image

    with atomic_write(path) as handle:
        figure.savefig(handle, format="png", dpi=dpi)
    with Image.open(path) as saved:  # matplotlib rounds the canvas size its own way
        return saved.size
