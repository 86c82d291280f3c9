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
import torch
from torch import Tensor

from explain.errors import ExplainError, InputError
from explain.io import atomic_write

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from explain.explanation import Explanation

__all__ = [
    "DEFAULT_DPI",
    "batch_figure",
    "check_style",
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


def check_style(cmap: str, alpha: float) -> None:
    """Raise ExplainError for an unknown colormap or an opacity outside [0, 1].

    Lets callers that draw many pictures (the CLI) fail before any work.
    """
    _colormap(cmap)
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
    check_style(cmap, alpha)
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


# Figure layout, in inches. Panels are placed by hand rather than by a layout engine: the
# sizes are then known exactly, and row labels and the colour bar never crowd each other.
_LABEL_INCHES = 0.35  # left of the panels: row labels
_TITLE_INCHES = 0.3  # above each row of panels: titles
_GAP_INCHES = 0.08  # between panels
_BAR_INCHES = 1.0  # right of the panels: the colour bar, its ticks and its label


def _panel_figure(
    shape: Sequence[int], aspect: float, *, colorbar: bool, labels: bool
) -> tuple[Figure, list[list], object]:
    """A figure with `shape[i]` panels in row i, each `aspect` (height / width) high.

    Returns the figure, its panels row by row, and the colour bar's axis (or None), which
    spans every row after the first when there is more than one, else the only row.
    """
    from matplotlib.figure import Figure

    panel_w = _PANEL_INCHES
    panel_h = _PANEL_INCHES * min(max(aspect, 0.25), 4.0)
    left = _LABEL_INCHES if labels else _GAP_INCHES
    columns = max(shape)
    panels_w = columns * panel_w + (columns - 1) * _GAP_INCHES
    width = left + panels_w + (_BAR_INCHES if colorbar else _GAP_INCHES)
    height = len(shape) * (panel_h + _TITLE_INCHES) + _GAP_INCHES
    figure = Figure(figsize=(width, height))

    def box(x: float, y: float, w: float, h: float) -> tuple[float, float, float, float]:
        return (x / width, y / height, w / width, h / height)

    rows = []
    for i, count in enumerate(shape):
        bottom = height - (i + 1) * (panel_h + _TITLE_INCHES)
        rows.append(
            [
                figure.add_axes(box(left + j * (panel_w + _GAP_INCHES), bottom, panel_w, panel_h))
                for j in range(count)
            ]
        )
    bar = None
    if colorbar:
        first = 1 if len(shape) > 1 else 0
        top = height - first * (panel_h + _TITLE_INCHES) - _TITLE_INCHES
        bottom = height - len(shape) * (panel_h + _TITLE_INCHES)
        bar = figure.add_axes(box(left + panels_w + 0.15, bottom, 0.15, top - bottom))
    return figure, rows, bar


def _draw_colorbar(figure: Figure, axis, cmap: str) -> None:
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    mappable = ScalarMappable(norm=Normalize(0.0, 1.0), cmap=_colormap(cmap))
    bar = figure.colorbar(mappable, cax=axis)
    bar.set_label("relevance", fontsize=8)
    bar.ax.tick_params(labelsize=7)


def _draw_panel(axis, image: np.ndarray, heat: np.ndarray | None, cmap: str, alpha: float) -> None:
    axis.imshow(image if heat is None else overlay(image, heat, cmap=cmap, alpha=alpha))
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
    rgb = _to_hwc(image)
    figure, rows, bar = _panel_figure(
        [1], rgb.shape[0] / rgb.shape[1], colorbar=colorbar, labels=False
    )
    _draw_panel(rows[0][0], rgb, _to_map(heatmap), cmap, alpha)
    if title:
        rows[0][0].set_title(title, fontsize=9)
    if bar is not None:
        _draw_colorbar(figure, bar, cmap)
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
    rgb = _to_hwc(image)
    if len(rows) == 0 or len(columns) == 0:
        raise InputError("a grid needs at least one row and one column")
    if len(heatmaps) != len(rows) or any(len(row) != len(columns) for row in heatmaps):
        raise InputError(
            f"heatmaps must be {len(rows)} rows x {len(columns)} columns to match the labels"
        )
    shape = ([1] if show_image else []) + [len(columns)] * len(rows)
    figure, panels, bar = _panel_figure(
        shape, rgb.shape[0] / rgb.shape[1], colorbar=colorbar, labels=True
    )
    if show_image:
        _draw_panel(panels[0][0], rgb, None, cmap, alpha)
        panels[0][0].set_title("input", fontsize=9)
        panels = panels[1:]
    for i, label in enumerate(rows):
        for j, column in enumerate(columns):
            axis = panels[i][j]
            _draw_panel(axis, rgb, _to_map(heatmaps[i][j]), cmap, alpha)
            if i == 0:
                axis.set_title(column, fontsize=9)
            if j == 0:
                axis.set_ylabel(label, fontsize=9)
    if bar is not None:
        _draw_colorbar(figure, bar, cmap)
    return figure


def explanation_grid(
    image: Tensor | np.ndarray,
    explanations: Mapping[str, Explanation],
    *,
    sample: int = 0,
    class_names: Sequence[str] | None = None,
    transpose: bool = False,
    cmap: str = "jet",
    alpha: float = 0.5,
    colorbar: bool = True,
) -> Figure:
    """Methods x classes for sample `sample`: one row per `explanations` entry (method name
    -> Explanation of the same images and targets), one column per explained class.

    With a (B, K) target each Explanation holds K classes per image and the grid has K
    columns, titled with the class names when `class_names` is given. `transpose` puts the
    classes in rows and the methods in columns (wide rather than tall, for many methods).
    The maps are upsampled straight to the size of `image`.
    """
    if not explanations:
        raise InputError("explanation_grid needs at least one explanation")
    size = _to_hwc(image).shape[:2]
    first = next(iter(explanations.values()))
    targets = first.target[sample].reshape(-1).tolist()
    classes = [_class_label(int(t), class_names) for t in targets]
    heatmaps = []
    for name, explanation in explanations.items():
        if explanation.target[sample].reshape(-1).tolist() != targets:
            raise InputError(
                f"explanation {name!r} explains classes "
                f"{explanation.target[sample].reshape(-1).tolist()}, the first one {targets}: "
                "a grid compares methods on the same classes"
            )
        maps = explanation.heatmap(size=size)[sample]
        heatmaps.append(list(maps) if maps.dim() == 3 else [maps])
    methods = list(explanations)
    if transpose:
        heatmaps = [list(column) for column in zip(*heatmaps, strict=True)]
        methods, classes = classes, methods
    return grid_figure(
        image, heatmaps, rows=methods, columns=classes, cmap=cmap, alpha=alpha, colorbar=colorbar
    )


def batch_figure(
    pictures: Tensor | np.ndarray | Sequence[Tensor | np.ndarray],
    explanations: Mapping[str, Explanation],
    *,
    class_names: Sequence[str] | None = None,
    cmap: str = "jet",
    alpha: float = 0.5,
    colorbar: bool = True,
) -> Figure:
    """Several images at once: the pictures in the first row, titled with the class each
    is explained for, then one row of overlays per method (`explanations`: method name ->
    Explanation of these images, one class per image).

    `pictures[b]` is image b in [0, 1] as it should be shown; the maps are upsampled to it.
    """
    if not explanations:
        raise InputError("batch_figure needs at least one explanation")
    shown = [_to_hwc(picture) for picture in pictures]
    first = next(iter(explanations.values()))
    if first.target.dim() != 1 or len(shown) != first.target.shape[0]:
        raise InputError(
            f"batch_figure shows one class per image: got {len(shown)} pictures and targets "
            f"of shape {tuple(first.target.shape)}"
        )
    figure, panels, bar = _panel_figure(
        [len(shown)] * (1 + len(explanations)),
        shown[0].shape[0] / shown[0].shape[1],
        colorbar=colorbar,
        labels=True,
    )
    for b, picture in enumerate(shown):
        _draw_panel(panels[0][b], picture, None, cmap, alpha)
        panels[0][b].set_title(_class_label(int(first.target[b]), class_names), fontsize=9)
    panels[0][0].set_ylabel("input", fontsize=9)
    for row, (name, explanation) in enumerate(explanations.items(), start=1):
        if not torch.equal(explanation.target, first.target):
            raise InputError(f"explanation {name!r} explains other classes than the first one")
        by_size: dict[tuple[int, int], Tensor] = {}  # one upsampling per picture size
        for b, picture in enumerate(shown):
            size = picture.shape[:2]
            if size not in by_size:
                by_size[size] = explanation.heatmap(size=size)
            _draw_panel(panels[row][b], picture, _to_map(by_size[size][b]), cmap, alpha)
        panels[row][0].set_ylabel(name, fontsize=9)
    if bar is not None:
        _draw_colorbar(figure, bar, cmap)
    return figure


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
