"""Heatmaps over images: overlays, figures with a colour bar, and method x class grids.

Everything here draws with matplotlib's object API (`matplotlib.figure.Figure`, no pyplot
state), imported only inside the functions that draw, so `import explain.viz` stays light
and figures made in a loop are freed as soon as they are dropped.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch
from torch import Tensor

from explain.errors import ExplainError, InputError
from explain.io import atomic_write
from explain.viz.literal import literal_text
from explain.viz.scaling import DIVERGING, SEQUENTIAL, FigureScale, scale_maps

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "DEFAULT_DPI",
    "Explained",
    "batch_figure",
    "check_style",
    "explanation_grid",
    "grid_figure",
    "heatmap_figure",
    "overlay",
    "save_figure",
    "save_image",
]


class Explained(Protocol):
    """What a grid reads of an `explain.Explanation` (results import the pictures of
    them, never the reverse): the explained classes and the heatmaps."""

    target: Tensor

    def heatmap(
        self, size: tuple[int, int] | int | None = None, *, normalize: bool = True
    ) -> Tensor: ...


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


def check_style(cmap: str | None, alpha: float) -> None:
    """Raise ExplainError for an unknown colormap or an opacity outside [0, 1].

    Lets callers that draw many pictures (the CLI) fail before any work. `cmap=None`
    stands for the figure's default (inferno, or RdBu_r for signed relevance).
    """
    if cmap is not None:
        _colormap(cmap)
    if not 0.0 <= alpha <= 1.0:
        raise ExplainError(f"alpha is the heatmap's opacity and must be in [0, 1], got {alpha}")


def _colormap(cmap: str):
    from matplotlib import colormaps

    try:
        return colormaps[cmap]
    except KeyError:
        raise ExplainError(
            f"unknown colormap {cmap!r}; use a matplotlib name such as 'inferno', 'viridis' "
            "or, for signed relevance, 'RdBu_r'"
        ) from None


def overlay(
    image: Tensor | np.ndarray,
    heatmap: Tensor | np.ndarray,
    cmap: str | None = None,
    alpha: float = 0.8,
    *,
    signed: bool = False,
) -> np.ndarray:
    """Colour an RGB image in [0, 1] by a heatmap, with opacity following the relevance.

    `heatmap` (H, W) is in [0, 1], as `Explanation.heatmap()` returns it, or with `signed`
    in [-1, 1]. Each pixel's colour is `cmap(heat)` (signed: `cmap(0.5 + heat / 2)`, a
    diverging map centred at zero) blended over the image with opacity `alpha * |heat|`:
    where the relevance is 0 the image keeps its own colours, so an object's colour is
    never mistaken for relevance. `cmap` defaults to inferno (perceptually uniform), or
    RdBu_r when `signed`. `image` is (3, H, W), (H, W, 3) or grey (H, W). Returns an
    (H, W, 3) float array in [0, 1].
    """
    check_style(cmap, alpha)
    rgb = _to_hwc(image)
    heat = _to_map(heatmap)
    if heat.shape != rgb.shape[:2]:
        raise InputError(
            f"heatmap {heat.shape} and image {rgb.shape[:2]} differ in size; upsample the map "
            "with Explanation.heatmap(size=(H, W))"
        )
    low = -1.0 if signed else 0.0
    heat = np.clip(heat, low, 1.0)
    colormap = _colormap(cmap or (DIVERGING if signed else SEQUENTIAL))
    colored = colormap(0.5 + 0.5 * heat if signed else heat)[..., :3]
    opacity = (alpha * np.abs(heat))[..., None]
    return (1.0 - opacity) * rgb + opacity * colored


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
_BAR_INCHES = 1.1  # right of the panels: the colour bar, its ticks and its label
_CAPTION_INCHES = 0.3  # below the panels: the figure's normalisation rule


def _panel_figure(
    shape: Sequence[int], aspect: float, *, colorbar: bool, labels: bool
) -> tuple[Figure, list[list], object]:
    """A figure with `shape[i]` panels in row i, each `aspect` (height / width) high, and a
    caption line below them.

    Returns the figure, its panels row by row, and the box (left, bottom, width, height
    in figure fractions) of the colour key, or None; it spans every row.
    """
    from matplotlib.figure import Figure

    panel_w = _PANEL_INCHES
    panel_h = _PANEL_INCHES * min(max(aspect, 0.25), 4.0)
    left = _LABEL_INCHES if labels else _GAP_INCHES
    columns = max(shape)
    panels_w = columns * panel_w + (columns - 1) * _GAP_INCHES
    width = left + panels_w + (_BAR_INCHES if colorbar else _GAP_INCHES)
    height = len(shape) * (panel_h + _TITLE_INCHES) + _CAPTION_INCHES
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
        top = height - _TITLE_INCHES
        bottom = height - len(shape) * (panel_h + _TITLE_INCHES)
        bar = box(left + panels_w + 0.15, bottom, 0.15, top - bottom)
    return figure, rows, bar


def _draw_colorbar(
    figure: Figure, area: tuple[float, float, float, float], scale: FigureScale, cmap: str | None
) -> None:
    """The colour keys of the figure's rule in `area`: relevance values on a shared scale,
    else the ends of each map's own range; the sequential key above the diverging one
    when the figure has both unsigned and signed maps."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    keys = scale.keys()
    left, bottom, width, height = area
    gap = 0.06 * height if len(keys) > 1 else 0.0
    each = (height - gap * (len(keys) - 1)) / len(keys)
    for index, signed in enumerate(keys):
        axis = figure.add_axes((left, bottom + (len(keys) - 1 - index) * (each + gap), width, each))
        colormap = _colormap(DIVERGING if signed else cmap or SEQUENTIAL)
        mappable = ScalarMappable(norm=Normalize(-1.0 if signed else 0.0, 1.0), cmap=colormap)
        bar = figure.colorbar(mappable, cax=axis)
        ticks, labels = scale.key_ticks(signed)
        bar.set_ticks(ticks, labels=labels)
        bar.set_label(scale.key_label(signed), fontsize=8)
        bar.ax.tick_params(labelsize=7)


def _draw_caption(figure: Figure, scale: FigureScale) -> None:
    figure.text(
        0.5, 0.1 / figure.get_figheight(), scale.caption(), ha="center", va="bottom", fontsize=7
    )


def _draw_panel(
    axis,
    image: np.ndarray,
    heat: np.ndarray | None,
    cmap: str | None,
    alpha: float,
    *,
    signed: bool = False,
    note: str | None = None,
) -> None:
    # `cmap` colours unsigned maps; signed ones always get the diverging map.
    cmap = None if signed else cmap
    shown = image if heat is None else overlay(image, heat, cmap=cmap, alpha=alpha, signed=signed)
    axis.imshow(shown)
    axis.set_xticks([])
    axis.set_yticks([])
    if note is not None:  # nothing to see, and saying so beats an unexplained plain image
        axis.text(
            0.5,
            0.5,
            note,
            transform=axis.transAxes,
            ha="center",
            va="center",
            fontsize=8,
            bbox={"boxstyle": "round,pad=0.3", "facecolor": "white", "alpha": 0.85},
        )


@literal_text
def heatmap_figure(
    image: Tensor | np.ndarray,
    heatmap: Tensor | np.ndarray,
    *,
    cmap: str | None = None,
    alpha: float = 0.8,
    colorbar: bool = True,
    title: str | None = None,
) -> Figure:
    """One image with its relevance map overlaid, a title and (by default) a colour key.

    The map (H, W) is scaled on its own (min-max, or by its largest magnitude when it has
    negative values: see explain.viz.scaling) and the rule is written below it.
    """
    rgb = _to_hwc(image)
    scale = scale_maps([_to_map(heatmap)])
    figure, rows, bar = _panel_figure(
        [1], rgb.shape[0] / rgb.shape[1], colorbar=colorbar, labels=False
    )
    _draw_panel(
        rows[0][0], rgb, scale.maps[0], cmap, alpha, signed=scale.signed[0], note=scale.notes[0]
    )
    if title:
        rows[0][0].set_title(title, fontsize=9)
    if bar is not None:
        _draw_colorbar(figure, bar, scale, cmap)
    _draw_caption(figure, scale)
    return figure


@literal_text
def grid_figure(
    image: Tensor | np.ndarray,
    heatmaps: Tensor | np.ndarray | Sequence[Sequence[Tensor | np.ndarray]],
    *,
    rows: Sequence[str],
    columns: Sequence[str],
    cmap: str | None = None,
    alpha: float = 0.8,
    colorbar: bool = True,
    show_image: bool = True,
    scale: str = "per_map",
) -> Figure:
    """One image explained in a grid: `heatmaps[i][j]` (H, W) is row `rows[i]`, column
    `columns[j]`, e.g. methods x classes (the papers' "cat and dog" figure).

    The maps are raw relevance (any range); `scale` is the figure's one normalisation rule,
    "per_map" or "shared" (explain.viz.scaling), written below the grid and matched by the
    colour key. With `show_image` the plain image opens every row, so the eye can compare
    each map with what it covers.
    """
    rgb = _to_hwc(image)
    if len(rows) == 0 or len(columns) == 0:
        raise InputError("a grid needs at least one row and one column")
    if len(heatmaps) != len(rows) or any(len(row) != len(columns) for row in heatmaps):
        raise InputError(
            f"heatmaps must be {len(rows)} rows x {len(columns)} columns to match the labels"
        )
    scaled = scale_maps([_to_map(m) for row in heatmaps for m in row], scale)
    first = 1 if show_image else 0
    figure, panels, bar = _panel_figure(
        [len(columns) + first] * len(rows),
        rgb.shape[0] / rgb.shape[1],
        colorbar=colorbar,
        labels=True,
    )
    for i, label in enumerate(rows):
        if show_image:
            _draw_panel(panels[i][0], rgb, None, cmap, alpha)
            if i == 0:
                panels[i][0].set_title("input", fontsize=9)
        panels[i][0].set_ylabel(label, fontsize=9)
        for j, column in enumerate(columns):
            k = i * len(columns) + j
            axis = panels[i][first + j]
            _draw_panel(
                axis,
                rgb,
                scaled.maps[k],
                cmap,
                alpha,
                signed=scaled.signed[k],
                note=scaled.notes[k],
            )
            if i == 0:
                axis.set_title(column, fontsize=9)
    if bar is not None:
        _draw_colorbar(figure, bar, scaled, cmap)
    _draw_caption(figure, scaled)
    return figure


@literal_text
def explanation_grid(
    image: Tensor | np.ndarray,
    explanations: Mapping[str, Explained],
    *,
    sample: int = 0,
    class_names: Sequence[str] | None = None,
    transpose: bool = False,
    cmap: str | None = None,
    alpha: float = 0.8,
    colorbar: bool = True,
    scale: str = "per_map",
) -> Figure:
    """Methods x classes for sample `sample`: one row per `explanations` entry (method name
    -> Explanation of the same images and targets), one column per explained class.

    With a (B, K) target each Explanation holds K classes per image and the grid has K
    columns, titled with the class names when `class_names` is given. `transpose` puts the
    classes in rows and the methods in columns (wide rather than tall, for many methods).
    The relevance is upsampled straight to the size of `image` and coloured by `scale`
    (see grid_figure).
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
        maps = explanation.heatmap(size=size, normalize=False)[sample]
        heatmaps.append(list(maps) if maps.dim() == 3 else [maps])
    methods = list(explanations)
    if transpose:
        heatmaps = [list(column) for column in zip(*heatmaps, strict=True)]
        methods, classes = classes, methods
    return grid_figure(
        image,
        heatmaps,
        rows=methods,
        columns=classes,
        cmap=cmap,
        alpha=alpha,
        colorbar=colorbar,
        scale=scale,
    )


@literal_text
def batch_figure(
    pictures: Tensor | np.ndarray | Sequence[Tensor | np.ndarray],
    explanations: Mapping[str, Explained],
    *,
    class_names: Sequence[str] | None = None,
    cmap: str | None = None,
    alpha: float = 0.8,
    colorbar: bool = True,
    scale: str = "per_map",
) -> Figure:
    """Several images at once: the pictures in the first row, titled with the class each
    is explained for, then one row of overlays per method (`explanations`: method name ->
    Explanation of these images, one class per image), coloured by `scale` (see
    grid_figure).

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
    raw = []
    for name, explanation in explanations.items():
        if not torch.equal(explanation.target, first.target):
            raise InputError(f"explanation {name!r} explains other classes than the first one")
        by_size: dict[tuple[int, int], Tensor] = {}  # one upsampling per picture size
        for picture in shown:
            size = picture.shape[:2]
            if size not in by_size:
                by_size[size] = explanation.heatmap(size=size, normalize=False)
        raw.append([_to_map(by_size[p.shape[:2]][b]) for b, p in enumerate(shown)])
    scaled = scale_maps([m for row in raw for m in row], scale)
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
    for row, name in enumerate(explanations, start=1):
        for b, picture in enumerate(shown):
            k = (row - 1) * len(shown) + b
            _draw_panel(
                panels[row][b],
                picture,
                scaled.maps[k],
                cmap,
                alpha,
                signed=scaled.signed[k],
                note=scaled.notes[k],
            )
        panels[row][0].set_ylabel(name, fontsize=9)
    if bar is not None:
        _draw_colorbar(figure, bar, scaled, cmap)
    _draw_caption(figure, scaled)
    return figure


def _class_label(index: int, class_names: Sequence[str] | None) -> str:
    """An explained class as a title that cannot be misread: "class 2 (target)",
    "circle (class 0, target)"."""
    if index < 0:
        return "custom score (target)"
    name = None
    if class_names is not None and index < len(class_names):
        name = class_names[index].split(",")[0].strip()
    if not name or name == str(index):
        return f"class {index} (target)"
    return f"{name} (class {index}, target)"


def save_figure(
    figure: Figure, path: str | os.PathLike[str], dpi: int = DEFAULT_DPI
) -> tuple[int, int]:
    """Render `figure` to a PNG at `dpi`, atomically; returns its (width, height) in pixels."""
    from PIL import Image

    with atomic_write(path) as handle:
        figure.savefig(handle, format="png", dpi=dpi)
    with Image.open(path) as saved:  # matplotlib rounds the canvas size its own way
        return saved.size
