"""Heatmaps over images: overlays, figures with a colour bar, and method x class grids.

Everything here draws with matplotlib's object API (`matplotlib.figure.Figure`, no pyplot
state), imported only inside the functions that draw, so `import explain.viz` stays light
and figures made in a loop are freed as soon as they are dropped.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch
from torch import Tensor

from explain.errors import ExplainError, InputError
from explain.export import atomic_write
from explain.viz.literal import literal_text
from explain.viz.scaling import DIVERGING, SEQUENTIAL, FigureScale, scale_maps

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "BACKGROUNDS",
    "CLASS_AGNOSTIC",
    "DEFAULT_DPI",
    "MAPS_PER_ROW",
    "Explained",
    "batch_figure",
    "caption_lines",
    "check_style",
    "class_agnostic_note",
    "class_label",
    "explanation_grid",
    "figure_caption",
    "greyed",
    "grid_figure",
    "heatmap_figure",
    "method_label",
    "overlay",
    "prediction",
    "save_figure",
    "save_image",
]


class Explained(Protocol):
    """What a grid reads of an `explain.Explanation` (results import the pictures of
    them, never the reverse): the explained classes, the logits (whether a class is the
    prediction, or which rank it has) and the heatmaps."""

    target: Tensor
    logits: Tensor

    @property
    def class_agnostic(self) -> bool: ...

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


BACKGROUNDS = ("grey", "colour")
"""What an overlay is drawn on: "grey" (the default), the image's brightness compressed into
a mid-grey band, so that every colour in the picture is relevance and a red object or a
white pen stroke cannot pass for heat; or "colour", the image's own colours."""

_GREY_BAND = (0.2, 0.7)
"""The brightness range a "grey" background is mapped to: no black (the colormap's zero
end) and no white (its hot end), so the image never reads as either."""


def greyed(image: Tensor | np.ndarray) -> np.ndarray:
    """The image as an overlay's "grey" background: (H, W, 3) in the mid-grey band, its
    brightness (Rec. 601 luma) kept, its colours dropped."""
    rgb = _to_hwc(image)
    luma = rgb @ np.array([0.299, 0.587, 0.114], dtype=rgb.dtype)
    low, high = _GREY_BAND
    return np.repeat((low + (high - low) * luma)[..., None], 3, axis=-1)


def _to_map(heatmap: Tensor | np.ndarray) -> np.ndarray:
    heat = (
        heatmap.detach().cpu().float().numpy()
        if isinstance(heatmap, Tensor)
        else np.asarray(heatmap, dtype=np.float32)
    )
    if heat.ndim != 2:
        raise InputError(f"a heatmap is one (H, W) map, got shape {heat.shape}")
    return heat


def check_style(cmap: str | None, alpha: float, background: str = "grey") -> None:
    """Raise ExplainError for an unknown colormap or background, or an opacity outside
    [0, 1].

    Lets callers that draw many pictures (the CLI) fail before any work. `cmap=None`
    stands for the figure's default (inferno, or RdBu_r for signed relevance).
    """
    if cmap is not None:
        _colormap(cmap)
    if not 0.0 <= alpha <= 1.0:
        raise ExplainError(f"alpha is the heatmap's opacity and must be in [0, 1], got {alpha}")
    if background not in BACKGROUNDS:
        raise ExplainError(
            f"unknown background {background!r}; use one of {', '.join(BACKGROUNDS)}"
        )


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
    background: str = "grey",
) -> np.ndarray:
    """Colour an image in [0, 1] by a heatmap, with opacity following the relevance.

    `heatmap` (H, W) is in [0, 1], as `Explanation.heatmap()` returns it, or with `signed`
    in [-1, 1]. Each pixel's colour is `cmap(heat)` (signed: `cmap(0.5 + heat / 2)`, a
    diverging map centred at zero) blended over the background with opacity
    `alpha * |heat|`. The background is the image in grey by default (`greyed`), so that
    every colour in the picture is relevance: a red object is never taken for heat, nor a
    white stroke for inferno's hot end; `background="colour"` keeps the image's colours.
    `cmap` defaults to inferno (perceptually uniform), or RdBu_r when `signed`. `image` is
    (3, H, W), (H, W, 3) or grey (H, W). Returns an (H, W, 3) float array in [0, 1].
    """
    check_style(cmap, alpha, background)
    rgb = greyed(image) if background == "grey" else _to_hwc(image)
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
_BAR_INCHES = 1.3  # right of the panels: the colour bar, its ticks and its (wrapped) label
_CAPTION_LINE_INCHES = 0.14  # one line of the caption below the panels (7 pt)
_CAPTION_CHAR_INCHES = 0.056  # a 7 pt character, on average, with room to spare
_MAX_PANEL_INCHES = 6.0  # a single map drawn at its own resolution up to this edge

MAPS_PER_ROW = 4
"""Maps in one row of a grid: more columns wrap into further rows, the input opening each,
so that a figure of every method stays readable at normal zoom (about 2000 px wide)."""


_TITLE_CHAR_INCHES = 0.072  # a 9 pt title character, on average, with room to spare
_TITLE_LINE_INCHES = 0.18


def caption_lines(text: str, width_inches: float, *, title: bool = False) -> list[str]:
    """`text` wrapped to lines that fit `width_inches` at the caption's 7 pt (or, with
    `title`, a title's 9 pt): a long model path must not run off the figure."""
    import textwrap

    char = _TITLE_CHAR_INCHES if title else _CAPTION_CHAR_INCHES
    return textwrap.wrap(text, max(20, int((width_inches - 0.2) / char)))


def _panel_figure(
    shape: Sequence[int],
    aspect: float,
    *,
    colorbar: bool,
    labels: bool,
    caption: str,
    panel_inches: float = _PANEL_INCHES,
    title_lines: int = 1,
    title: str | None = None,
) -> tuple[Figure, list[list], object]:
    """A figure with `shape[i]` panels in row i, each `aspect` (height / width) high,
    `title` above them and `caption` below them, both wrapped to the figure's width.

    Returns the figure, its panels row by row, and the box (left, bottom, width, height
    in figure fractions) of the colour key, or None; it spans every row.
    """
    from matplotlib.figure import Figure

    title_h = _TITLE_INCHES + _TITLE_LINE_INCHES * (title_lines - 1)
    panel_w = panel_inches
    panel_h = panel_inches * min(max(aspect, 0.25), 4.0)
    left = _LABEL_INCHES if labels else _GAP_INCHES
    columns = max(shape)
    panels_w = columns * panel_w + (columns - 1) * _GAP_INCHES
    width = left + panels_w + (_BAR_INCHES if colorbar else _GAP_INCHES)
    lines = caption_lines(caption, width)
    caption_h = 0.1 + _CAPTION_LINE_INCHES * len(lines)
    heading = caption_lines(title, width, title=True) if title else []
    heading_h = 0.1 + _TITLE_LINE_INCHES * len(heading) if heading else 0.0
    top = len(shape) * (panel_h + title_h) + caption_h  # the panels' top edge
    height = top + heading_h
    figure = Figure(figsize=(width, height))
    figure.text(0.5, 0.06 / height, "\n".join(lines), ha="center", va="bottom", fontsize=7)
    if heading:
        figure.text(0.5, 1 - 0.06 / height, "\n".join(heading), ha="center", va="top",
                    fontsize=9)  # fmt: skip

    def box(x: float, y: float, w: float, h: float) -> tuple[float, float, float, float]:
        return (x / width, y / height, w / width, h / height)

    rows = []
    for i, count in enumerate(shape):
        bottom = top - (i + 1) * (panel_h + title_h)
        rows.append(
            [
                figure.add_axes(box(left + j * (panel_w + _GAP_INCHES), bottom, panel_w, panel_h))
                for j in range(count)
            ]
        )
    bar = None
    if colorbar:
        bottom = top - len(shape) * (panel_h + title_h)
        bar = box(left + panels_w + 0.15, bottom, 0.15, top - title_h - bottom)
    return figure, rows, bar


def _reading_order_panels(
    image: Tensor | np.ndarray,
    heatmaps: Sequence[Tensor | np.ndarray],
    titles: Sequence[str],
    *,
    title: str | None = None,
    opening: str | None = None,
    note: str | None = None,
    per_row: int = MAPS_PER_ROW,
    cmap: str | None = None,
    alpha: float = 0.8,
    background: str = "grey",
    signed: bool | None = None,
) -> tuple[Figure, list]:
    """One image's maps side by side in reading order under `title`: the plain image
    first when `opening` names it (its panel title), then each of `heatmaps` (raw
    relevance, each scaled on its own) titled with `titles`, `per_row` maps to a row (one
    more panel with the opening image), so that many maps stay readable instead of a
    wide strip; a colour key at the right and the rule below, followed by `note` (what
    else the panels show). Returns the figure and the maps' panels, in order (e.g. to
    draw a box on each). `signed`: the maps' one kind of scale (`scale_maps`), or None to
    decide it per map."""
    rgb = _to_hwc(image)
    if not heatmaps or len(heatmaps) != len(titles):
        raise InputError(
            f"give one title per map and at least one map (got {len(heatmaps)} maps, "
            f"{len(titles)} titles)"
        )
    if per_row < 1:
        raise InputError(f"per_row must be at least 1, got {per_row}")
    check_style(cmap, alpha, background)
    scaled = scale_maps([_to_map(m) for m in heatmaps], signed=signed)
    count = len(heatmaps) + (opening is not None)
    columns = per_row + (opening is not None)
    shape = [min(columns, count - start) for start in range(0, count, columns)]
    figure, rows, bar = _panel_figure(
        shape,
        rgb.shape[0] / rgb.shape[1],
        colorbar=True,
        labels=False,
        caption=" ".join(filter(None, [figure_caption(scaled, background), note])),
        title=title,
    )
    panels = [axis for row in rows for axis in row]
    if opening is not None:
        _draw_panel(panels[0], rgb, None, cmap, alpha)
        panels[0].set_title(opening, fontsize=9)
        panels = panels[1:]
    mark = len(scaled.keys()) > 1
    for k, (axis, name) in enumerate(zip(panels, titles, strict=True)):
        _draw_scaled(axis, rgb, scaled, k, cmap, alpha, background=background, mark_signed=mark)
        axis.set_title(name, fontsize=9)
    assert bar is not None
    _draw_colorbar(figure, bar, scaled, cmap)
    return figure, panels


_KEY_CHAR_INCHES = 0.085
"""An 8 pt key label character along its bar, generously (so that wrapped labels fit)."""


def _draw_colorbar(
    figure: Figure, area: tuple[float, float, float, float], scale: FigureScale, cmap: str | None
) -> None:
    """The colour keys of the figure's rule in `area`: relevance values on a shared scale
    (one per kind of map), else the ends of each map's own range; the sequential key above
    the diverging one when the figure has both unsigned and signed maps (the signed panels
    are marked ±)."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    keys = scale.keys()
    left, bottom, width, height = area
    gap = 0.12 * height if len(keys) > 1 else 0.0  # room for both keys' end ticks
    each = (height - gap * (len(keys) - 1)) / len(keys)
    for index, signed in enumerate(keys):
        axis = figure.add_axes((left, bottom + (len(keys) - 1 - index) * (each + gap), width, each))
        colormap = _colormap(DIVERGING if signed else cmap or SEQUENTIAL)
        mappable = ScalarMappable(norm=Normalize(-1.0 if signed else 0.0, 1.0), cmap=colormap)
        bar = figure.colorbar(mappable, cax=axis)
        ticks, labels = scale.key_ticks(signed)
        bar.set_ticks(ticks, labels=labels)
        label = scale.key_label(signed)
        if len(keys) > 1:  # two keys share the height: each label wrapped to its own bar's
            room = int(each * figure.get_figheight() / _KEY_CHAR_INCHES)
            label = textwrap.fill(label, max(room, 8), break_long_words=False)
        bar.set_label(label, fontsize=8)
        bar.ax.tick_params(labelsize=7)


def figure_caption(scale: FigureScale, background: str) -> str:
    """The line below a figure: its normalisation rule and what the picture is drawn on."""
    if background == "grey":
        return scale.caption() + " The input is shown in grey: every colour is relevance."
    return scale.caption()


def _draw_panel(
    axis,
    image: np.ndarray,
    heat: np.ndarray | None,
    cmap: str | None,
    alpha: float,
    *,
    signed: bool = False,
    note: str | None = None,
    background: str = "grey",
    mark_signed: bool = False,
) -> None:
    # `cmap` colours unsigned maps; signed ones always get the diverging map.
    cmap = None if signed else cmap
    shown = (
        image
        if heat is None
        else overlay(image, heat, cmap=cmap, alpha=alpha, signed=signed, background=background)
    )
    axis.imshow(shown)
    axis.set_xticks([])
    axis.set_yticks([])
    box = {"boxstyle": "round,pad=0.3", "facecolor": "white", "alpha": 0.85}
    if note is not None:  # nothing to see, and saying so beats an unexplained plain image
        axis.text(0.5, 0.5, note, transform=axis.transAxes, ha="center", va="center", fontsize=8,
                  bbox=box)  # fmt: skip
    if mark_signed and signed:  # the figure has two keys: this panel reads the diverging one
        axis.text(0.96, 0.96, "±", transform=axis.transAxes, ha="right", va="top", fontsize=9,
                  bbox=box)  # fmt: skip


def _draw_scaled(
    axis,
    image: np.ndarray,
    scale: FigureScale,
    k: int,
    cmap: str | None,
    alpha: float,
    *,
    background: str,
    mark_signed: bool = False,
) -> None:
    """`_draw_panel` of the figure's k-th scaled map, with its sign and note."""
    _draw_panel(
        axis,
        image,
        scale.maps[k],
        cmap,
        alpha,
        signed=scale.signed[k],
        note=scale.notes[k],
        background=background,
        mark_signed=mark_signed,
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
    background: str = "grey",
    note: str | None = None,
) -> Figure:
    """One image with its relevance map overlaid, a title, a colour key (by default) and
    the normalisation rule written below, followed by `note` (e.g. what part of the photo
    the model saw).

    The map (H, W) is scaled on its own (min-max, or by a high percentile of its
    magnitude when it has negative values: see explain.viz.scaling). The panel shows the
    image at its own resolution at DEFAULT_DPI, between 2.4 and 6 inches wide.
    """
    rgb = _to_hwc(image)
    scale = scale_maps([_to_map(heatmap)])
    height, width = rgb.shape[:2]
    inches = min(max(width / DEFAULT_DPI, _PANEL_INCHES), _MAX_PANEL_INCHES)
    heading = caption_lines(title, inches, title=True) if title else []
    figure, rows, bar = _panel_figure(
        [1],
        height / width,
        colorbar=colorbar,
        labels=False,
        caption=" ".join(filter(None, [figure_caption(scale, background), note])),
        panel_inches=inches,
        title_lines=max(1, len(heading)),
    )
    _draw_scaled(
        rows[0][0],
        rgb,
        scale,
        0,
        cmap,
        alpha,
        background=background,
    )
    if heading:
        rows[0][0].set_title("\n".join(heading), fontsize=9)
    if bar is not None:
        _draw_colorbar(figure, bar, scale, cmap)
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
    background: str = "grey",
    maps_per_row: int = MAPS_PER_ROW,
    note: str | None = None,
    title: str | None = None,
) -> Figure:
    """One image explained in a grid: `heatmaps[i][j]` (H, W) is row `rows[i]`, column
    `columns[j]`, e.g. methods x classes (the papers' "cat and dog" figure), under `title`
    (e.g. what the model is), wrapped to the figure's width.

    The maps are raw relevance (any range); `scale` is the figure's one normalisation rule,
    "per_map" or "shared" (explain.viz.scaling), written below the grid (then `note`, e.g.
    what part of the photo the model saw) and matched by the colour key; when the figure
    has both unsigned and signed maps, the signed panels are marked ± and read the
    diverging key. With `show_image` the plain image (in colour)
    opens every row, so the eye can compare each map with what it covers. More than
    `maps_per_row` columns wrap: columns `maps_per_row` onwards form a further block of
    the same rows below, with their own titles.
    """
    rgb = _to_hwc(image)
    if len(rows) == 0 or len(columns) == 0:
        raise InputError("a grid needs at least one row and one column")
    if len(heatmaps) != len(rows) or any(len(row) != len(columns) for row in heatmaps):
        raise InputError(
            f"heatmaps must be {len(rows)} rows x {len(columns)} columns to match the labels"
        )
    if maps_per_row < 1:
        raise InputError(f"maps_per_row must be at least 1, got {maps_per_row}")
    check_style(cmap, alpha, background)
    scaled = scale_maps([_to_map(m) for row in heatmaps for m in row], scale)
    mark = len(scaled.keys()) > 1
    first = 1 if show_image else 0
    blocks = [
        range(start, min(start + maps_per_row, len(columns)))
        for start in range(0, len(columns), maps_per_row)
    ]
    figure, panels, bar = _panel_figure(
        [len(block) + first for block in blocks for _ in rows],
        rgb.shape[0] / rgb.shape[1],
        colorbar=colorbar,
        labels=True,
        caption=" ".join(filter(None, [figure_caption(scaled, background), note])),
        title=title,
    )
    for b, block in enumerate(blocks):
        for i, label in enumerate(rows):
            line = panels[b * len(rows) + i]
            if show_image:
                _draw_panel(line[0], rgb, None, cmap, alpha)
                if i == 0:
                    line[0].set_title("input", fontsize=9)
            line[0].set_ylabel(label, fontsize=9)
            for j, column in enumerate(block):
                k = i * len(columns) + column
                axis = line[first + j]
                _draw_scaled(
                    axis,
                    rgb,
                    scaled,
                    k,
                    cmap,
                    alpha,
                    background=background,
                    mark_signed=mark,
                )
                if i == 0:
                    axis.set_title(columns[column], fontsize=9)
    if bar is not None:
        _draw_colorbar(figure, bar, scaled, cmap)
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
    background: str = "grey",
    maps_per_row: int = MAPS_PER_ROW,
    multi_label: bool = False,
    title: str | None = None,
) -> Figure:
    """Methods x classes for sample `sample`: one row per `explanations` entry (method name
    -> Explanation of the same images and targets), one column per explained class.

    With a (B, K) target each Explanation holds K classes per image and the grid has K
    columns, titled with the class names when `class_names` is given and with each class's
    rank among the model's outputs ("predicted", "ranked 2nd"), or for a `multi_label`
    model its probability of presence ("present 98.8%", `class_label`). `transpose` puts the
    classes in rows and the methods in columns (wide rather than tall, for many methods;
    more than `maps_per_row` methods wrap). The relevance is upsampled straight to the
    size of `image` and coloured by `scale` (see grid_figure). A class-agnostic method's
    maps are headed "METHOD (class-agnostic)" (`method_label`), and the caption says what
    the mark means (`class_agnostic_note`). `title` heads the figure (grid_figure).
    """
    if not explanations:
        raise InputError("explanation_grid needs at least one explanation")
    size = _to_hwc(image).shape[:2]
    first = next(iter(explanations.values()))
    targets = first.target[sample].reshape(-1).tolist()
    logits = first.logits[sample]
    classes = [class_label(int(t), class_names, logits, multi_label) for t in targets]
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
    methods = [method_label(name, e.class_agnostic) for name, e in explanations.items()]
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
        background=background,
        maps_per_row=maps_per_row,
        note=class_agnostic_note(e.class_agnostic for e in explanations.values()),
        title=title,
    )


@literal_text
def batch_figure(
    pictures: Tensor | np.ndarray | Sequence[Tensor | np.ndarray],
    explanations: Mapping[str, Explained],
    *,
    class_names: Sequence[str] | None = None,
    labels: Sequence[int] | Tensor | None = None,
    cmap: str | None = None,
    alpha: float = 0.8,
    colorbar: bool = True,
    scale: str = "per_map",
    background: str = "grey",
    multi_label: bool = False,
    title: str | None = None,
) -> Figure:
    """Several images at once: the pictures in the first row, titled with the class each
    is explained for and its rank among the model's outputs ("predicted", "ranked 2nd")
    or, for a `multi_label` model, its probability of presence ("present 98.8%",
    `class_label`), and with `labels` (the true classes) the label; then one row of
    overlays per method (`explanations`: method name -> Explanation of these images, one
    class per image), coloured by `scale` (see grid_figure), under `title`.

    `pictures[b]` is image b in [0, 1] as it should be shown; the maps are upsampled to it.
    """
    if not explanations:
        raise InputError("batch_figure needs at least one explanation")
    check_style(cmap, alpha, background)
    shown = [_to_hwc(picture) for picture in pictures]
    first = next(iter(explanations.values()))
    if first.target.dim() != 1 or len(shown) != first.target.shape[0]:
        raise InputError(
            f"batch_figure shows one class per image: got {len(shown)} pictures and targets "
            f"of shape {tuple(first.target.shape)}"
        )
    if labels is not None and len(labels) != len(shown):
        raise InputError(f"{len(shown)} pictures but {len(labels)} labels")
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
        caption=" ".join(
            filter(
                None,
                [
                    figure_caption(scaled, background),
                    class_agnostic_note(e.class_agnostic for e in explanations.values()),
                ],
            )
        ),
        title_lines=1 if labels is None else 2,  # the label on a second line
        title=title,
    )
    for b, picture in enumerate(shown):
        _draw_panel(panels[0][b], picture, None, cmap, alpha)
        title = class_label(int(first.target[b]), class_names, first.logits[b], multi_label)
        if labels is not None:
            title += f"\nlabel: {_class_name(int(labels[b]), class_names)}"
        panels[0][b].set_title(title, fontsize=8)
    panels[0][0].set_ylabel("input", fontsize=9)
    mark = len(scaled.keys()) > 1
    for row, name in enumerate(explanations, start=1):
        for b, picture in enumerate(shown):
            k = (row - 1) * len(shown) + b
            _draw_scaled(
                panels[row][b],
                picture,
                scaled,
                k,
                cmap,
                alpha,
                background=background,
                mark_signed=mark,
            )
        panels[row][0].set_ylabel(method_label(name, explanations[name].class_agnostic), fontsize=9)
    if bar is not None:
        _draw_colorbar(figure, bar, scaled, cmap)
    return figure


def _class_name(index: int, class_names: Sequence[str] | None) -> str:
    """A class by its name (first synonym) and index, or its index alone."""
    name = None
    if class_names is not None and 0 <= index < len(class_names):
        name = class_names[index].split(",")[0].strip()
    if not name or name == str(index):
        return f"class {index}"
    return f"{name} (class {index})"


def _ordinal(rank: int) -> str:
    suffix = "th" if 10 <= rank % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(rank % 10, "th")
    return f"{rank}{suffix}"


CLASS_AGNOSTIC = (
    "class-agnostic: the method does not read the explained class, so every class gets the same map"
)
"""What the mark of `method_label` means, for a caption or a tooltip."""


def method_label(method: str, class_agnostic: bool) -> str:
    """A method's name as the figures and the viewer head its maps: "rollout
    (class-agnostic)" for a method whose map is the same for every class
    (`Explanation.class_agnostic`), so that two identical maps are read as the method's
    doing, not as the classes' likeness."""
    return f"{method} (class-agnostic)" if class_agnostic else method


def class_agnostic_note(marked: Iterable[bool]) -> str | None:
    """The caption's sentence on the mark of `method_label` when any of the drawn methods
    carries it (`marked`: each method's `class_agnostic`), else None."""
    return f"{CLASS_AGNOSTIC[0].upper()}{CLASS_AGNOSTIC[1:]}." if any(marked) else None


def class_label(
    index: int, class_names: Sequence[str] | None, logits: Tensor, multi_label: bool = False
) -> str:
    """An explained class as a title that cannot be misread: whether it is the model's
    prediction or which rank it has, e.g. "circle (class 0), predicted", "class 3, ranked
    2nd"; for a `multi_label` model (each logit a yes/no) the probability that the class
    is present, e.g. "circle (class 0), present 98.8%", since a rank would undersell
    several classes present at once."""
    if index < 0:
        return "custom score"
    if multi_label:
        present = float(torch.sigmoid(logits.detach()[index].float()))
        return f"{_class_name(index, class_names)}, present {present:.1%}"
    rank = int((logits.detach() > logits.detach()[index]).sum()) + 1
    return f"{_class_name(index, class_names)}, " + (
        "predicted" if rank == 1 else f"ranked {_ordinal(rank)}"
    )


def prediction(logits: Tensor, class_names: Sequence[str] | None, multi_label: bool) -> str:
    """What the model predicts from one input's `logits`, for the terminal: the top class
    and its softmax probability, e.g. "circle (class 0) 91.2%"; for a `multi_label`
    model every class it finds present (probability at least 50%, most likely first) or,
    when none is, the likeliest."""
    scores = logits.detach().float()
    if not multi_label:
        probabilities = scores.softmax(dim=-1)
        top = int(probabilities.argmax())
        return f"{_class_name(top, class_names)} {float(probabilities[top]):.1%}"
    probabilities = torch.sigmoid(scores)
    order = probabilities.argsort(descending=True).tolist()
    present = [c for c in order if probabilities[c] >= 0.5] or order[:1]
    found = ", ".join(
        f"{_class_name(c, class_names)} {float(probabilities[c]):.1%}" for c in present
    )
    return (
        f"present: {found}"
        if probabilities[present[0]] >= 0.5
        else f"none present (likeliest: {found})"
    )


def save_figure(
    figure: Figure, path: str | os.PathLike[str], dpi: int = DEFAULT_DPI
) -> tuple[int, int]:
    """Render `figure` to a PNG at `dpi`, atomically; returns its (width, height) in pixels."""
    from PIL import Image

    with atomic_write(path) as handle:
        figure.savefig(handle, format="png", dpi=dpi)
    with Image.open(path) as saved:  # matplotlib rounds the canvas size its own way
        return saved.size
