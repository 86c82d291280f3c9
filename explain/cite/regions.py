"""A photo's regions as citation sources, and where each lies among the patches the model saw.

A region is a set of the user's photo's pixels: a cell of a grid over the photo (the
default, 3 x 3), a superpixel (`slic_regions`: scikit-image's SLIC, the `superpixels`
extra), or a box or a mask the user gives (`read_regions`: JSON). A region's
score is the sum of its patches' relevance, each patch weighted by the share of it the
region covers, measured on the photo as the model's own preprocessing maps it
(`patch_shares`): every photo pixel lands, by its centre, on the patch of the model's
input that its resized (and cropped, padded or tiled) copy falls in, so a region in the
photo is the pixels the model saw. A patch's share of a region is the share of the photo
pixels landing on it that belong to the region: the cells of a grid, which cover the
photo, then share out every seen patch's relevance exactly; pixels cropped away land on
no patch (a region only cropped away scores 0), and the padding around a letterboxed
photo belongs to no region.

Removing a region (the check, explain.cite.image) fills its pixels in the photo with one
colour, the photo's mean colour by default (`fill`), before the processor sees it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from explain.errors import InputError, OptionError
from explain.loading.preprocessing import ImagePreprocessing

__all__ = [
    "FILLS",
    "GRID",
    "Region",
    "fill",
    "fill_colour",
    "grid_regions",
    "grid_size",
    "patch_shares",
    "photo_patches",
    "read_regions",
    "region_from",
    "slic_count",
    "slic_regions",
]

GRID = (3, 3)
"""The default regions: a grid of 3 x 3 cells over the photo."""
FILLS = ("mean",)
"""How a removed region is filled: "mean", the photo's mean colour (per channel, over all
its pixels, rounded to a whole 0..255 value)."""


@dataclass(frozen=True, eq=False)
class Region:
    """A part of the photo: `mask` (H, W) bool over the photo's pixels, with a `name` and
    the `box` (left, top, right, bottom: pixels [left, right) x [top, bottom)) that holds it."""

    name: str
    mask: np.ndarray
    box: tuple[int, int, int, int]

    def to_dict(self) -> dict[str, Any]:
        """The region as cite.json holds it: its name, box and pixel count (the mask
        itself is kept apart, as a tensor)."""
        return {"name": self.name, "box": list(self.box), "pixels": int(self.mask.sum())}


def _bounding_box(mask: np.ndarray) -> tuple[int, int, int, int]:
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1


def grid_regions(size: tuple[int, int], rows: int = GRID[0], cols: int = GRID[1]) -> list[Region]:
    """The photo of `size` (H, W) as rows x cols cells in raster order, named "r{row}c{col}"
    (from 1); cell edges at round(i * H / rows) and round(j * W / cols)."""
    height, width = size
    for name, count, side in (("rows", rows, height), ("cols", cols, width)):
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= side:
            raise OptionError(f"a grid's {name} are a whole number from 1 to {side}, got {count!r}")
    if rows * cols < 2:
        raise OptionError("a grid of one cell is the whole photo: give it at least 2 cells")
    tops = [round(i * height / rows) for i in range(rows + 1)]
    lefts = [round(j * width / cols) for j in range(cols + 1)]
    regions = []
    for i in range(rows):
        for j in range(cols):
            mask = np.zeros(size, dtype=bool)
            mask[tops[i] : tops[i + 1], lefts[j] : lefts[j + 1]] = True
            box = (lefts[j], tops[i], lefts[j + 1], tops[i + 1])
            regions.append(Region(f"r{i + 1}c{j + 1}", mask, box))
    return regions


def slic_regions(photo: Any, count: int, compactness: float = 10.0) -> list[Region]:
    """The photo (H, W, 3) as about `count` superpixels: scikit-image's SLIC (k-means on
    colour and position, each segment made connected), `compactness` trading colour for
    shape (higher: squarer). The same photo gives the same regions. Named "superpixel 1"
    .. "superpixel N" in the order of SLIC's labels; they cover the photo, one region a
    pixel."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 2:
        raise OptionError(f"superpixels are a whole number of at least 2, got {count!r}")
    if not compactness > 0:
        raise OptionError(f"compactness is a positive number, got {compactness!r}")
    from explain.bridges import require

    segmentation = require("skimage.segmentation", "superpixels")
    pixels = np.asarray(photo)
    labels = segmentation.slic(
        pixels, n_segments=count, compactness=float(compactness), start_label=1, channel_axis=-1
    )
    # SLIC numbers its segments from its seeds: a seed whose segment merged away leaves a
    # label no pixel holds, dropped here
    masks = [labels == label for label in np.unique(labels)]
    if len(masks) < 2:
        raise OptionError(
            f"SLIC found one superpixel in the {pixels.shape[1]} x {pixels.shape[0]} photo "
            "(a flat or noisy photo has no edges to follow): use a grid or your own regions"
        )
    return [
        Region(f"superpixel {index}", mask, _bounding_box(mask))
        for index, mask in enumerate(masks, start=1)
    ]


def slic_count(text: str) -> int | None:
    """ "slic:N" (e.g. "slic:12") as N, the superpixels asked for; None for any text that
    does not start with "slic:" (a regions file's path)."""
    kind, colon, count = text.partition(":")
    if not colon or kind.lower() != "slic":
        return None
    if not count.strip().isdigit():
        raise OptionError(f"superpixels are slic:N, e.g. slic:12; got {text!r}")
    return int(count)


def region_from(entry: Mapping[str, Any], size: tuple[int, int], index: int = 0) -> Region:
    """One region as a user gives it: {"box": [left, top, right, bottom]} in pixels of the
    photo (right and bottom excluded), or {"mask": ...}, an (H, W) array or nested lists of
    0/1 (or booleans); an optional "name" (default "region {index + 1}")."""
    if not isinstance(entry, Mapping) or ("box" in entry) == ("mask" in entry):
        raise InputError(f"region {index} needs a 'box' or a 'mask' (one of them), got {entry!r}")
    name = entry.get("name", f"region {index + 1}")
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"region {index}'s name must be a text, got {name!r}")
    height, width = size
    if "box" in entry:
        box = entry["box"]
        if (
            not isinstance(box, Sequence)
            or len(box) != 4
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in box)
        ):
            raise InputError(
                f"region {name!r}: a box is [left, top, right, bottom] pixels, got {box!r}"
            )
        left, top, right, bottom = box
        if not (0 <= left < right <= width and 0 <= top < bottom <= height):
            raise InputError(
                f"region {name!r}: the box {list(box)} does not lie inside the {width} x "
                f"{height} photo with left < right and top < bottom"
            )
        mask = np.zeros(size, dtype=bool)
        mask[top:bottom, left:right] = True
        return Region(name, mask, (left, top, right, bottom))
    try:
        mask = np.asarray(entry["mask"])
    except (TypeError, ValueError):
        mask = np.zeros(0)
    if mask.shape != size or not (mask.dtype == bool or np.isin(mask, (0, 1)).all()):
        raise InputError(
            f"region {name!r}: a mask is {height} x {width} values of 0 or 1 (the photo's "
            f"size), got shape {mask.shape}"
        )
    mask = mask.astype(bool)
    if not mask.any():
        raise InputError(f"region {name!r}: its mask holds no pixel")
    return Region(name, mask, _bounding_box(mask))


def read_regions(
    given: str | Path | Sequence[Mapping[str, Any]], size: tuple[int, int]
) -> list[Region]:
    """Regions of a photo of `size` (H, W) from a JSON file (or its parsed list): a list of
    `region_from` entries; a mask may also be the path of an image file (relative to the
    JSON file) whose non-zero pixels are the region. Names must differ."""
    folder = Path(".")
    if isinstance(given, str | Path):
        path = Path(given)
        folder = path.parent
        try:
            given = json.loads(path.read_text(encoding="utf-8"))
        except OSError as error:
            raise InputError(f"cannot read the regions file {path}: {error}") from None
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
            raise InputError(f"{path} is not a JSON list of regions: {error}") from None
    if not isinstance(given, Sequence) or isinstance(given, str) or not given:
        raise InputError("regions are a non-empty list of {'box': ...} or {'mask': ...} entries")
    regions = []
    for index, entry in enumerate(given):
        if isinstance(entry, Mapping) and isinstance(entry.get("mask"), str):
            entry = {**entry, "mask": _mask_file(folder / entry["mask"])}
        regions.append(region_from(entry, size, index))
    names = [region.name for region in regions]
    if len(set(names)) != len(names):
        raise InputError(f"region names must differ, got {names}")
    return regions


def _mask_file(path: Path) -> np.ndarray:
    from explain.inputs import read_image

    return np.asarray(read_image(path)).any(axis=-1)


def photo_patches(
    geometry: ImagePreprocessing, photo_size: tuple[int, int], grid: tuple[int, int]
) -> Tensor:
    """(H, W) long: for each photo pixel, the patch (row-major on the (gh, gw) `grid` over
    the model's input) that its centre lands on as `geometry` resizes and crops or pads
    the photo; -1 where it lands outside the input (cropped away)."""
    height, width = photo_size
    resized, (top, left) = geometry.placement(photo_size)
    size = geometry.size
    rows = (torch.arange(height, dtype=torch.float64) + 0.5) * resized[0] / height - top
    cols = (torch.arange(width, dtype=torch.float64) + 0.5) * resized[1] / width - left
    patch_rows = (rows * grid[0] / size[0]).floor().long()
    patch_cols = (cols * grid[1] / size[1]).floor().long()
    seen = ((patch_rows >= 0) & (patch_rows < grid[0]))[:, None] & (
        (patch_cols >= 0) & (patch_cols < grid[1])
    )[None, :]
    index = patch_rows[:, None] * grid[1] + patch_cols[None, :]
    return torch.where(seen, index, -1)


def patch_shares(
    regions: Sequence[Region],
    geometry: ImagePreprocessing,
    photo_size: tuple[int, int],
    grid: tuple[int, int],
) -> Tensor:
    """(R, gh * gw) float64: the share of each patch's photo pixels (`photo_patches`) that
    each region holds; a region's score is this row times the patches' relevance."""
    landing = photo_patches(geometry, photo_size, grid).flatten()
    seen = landing >= 0
    count = grid[0] * grid[1]
    pixels = torch.zeros(count, dtype=torch.float64).index_add_(
        0, landing[seen], torch.ones(int(seen.sum()), dtype=torch.float64)
    )
    masks = torch.from_numpy(np.stack([region.mask for region in regions])).flatten(1)
    held = torch.zeros(len(regions), count, dtype=torch.float64)
    held.index_add_(1, landing[seen], masks[:, seen].double())
    return held / pixels.clamp(min=1)


def fill_colour(photo: np.ndarray, how: str = "mean") -> np.ndarray:
    """(3,) uint8: the colour removed regions are filled with (`FILLS`)."""
    if how not in FILLS:
        raise OptionError(f"fill must be one of {', '.join(FILLS)}; got {how!r}")
    return np.asarray(photo, dtype=np.float64).reshape(-1, 3).mean(axis=0).round().astype(np.uint8)


def fill(
    photo: np.ndarray, regions: Sequence[Region], removed: Sequence[bool], colour: np.ndarray
) -> np.ndarray:
    """A copy of `photo` (H, W, 3) uint8 with the pixels of every region `removed` says set
    to `colour`."""
    out = np.array(photo, copy=True)
    gone = np.zeros(out.shape[:2], dtype=bool)
    for region, remove in zip(regions, removed, strict=True):
        if remove:
            gone |= region.mask
    out[gone] = colour
    return out


def grid_size(text: str) -> tuple[int, int]:
    """ "RxC" (e.g. "3x3") as (rows, cols)."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(part.strip().isdigit() for part in parts):
        raise OptionError(f"a grid is ROWSxCOLS, e.g. 3x3; got {text!r}")
    return int(parts[0]), int(parts[1])
