"""Synthetic scenes: one to three shapes on textured, cluttered backgrounds.

Why synthetic: every pixel's owner is known, so explanations can be scored against true
object masks, and a scene with two kinds of object is the "cat and dog" test of a
class-specific method (the map for each class should light up its own object).

A scene is a pure function of its integer seed. Seeds are split into disjoint ranges
(`SPLITS`): models train on "train" seeds and are measured on "heldout" seeds only.

Labels are multi-label: one entry per kind, 1 when at least one object of that kind is in
the scene. The objects of a scene are of distinct kinds and never overlap, so the mask of
a class is exactly one object's mask.

Each kind has a signature hue (`KIND_HUES`, jittered by a few degrees) besides its shape,
and objects are bright and saturated on dark, nearly grey backgrounds. Why: with shape as
the only cue, the zoo's small ViT (150k parameters) had not passed 12% exact-set accuracy
after 1,200 training steps on 2 CPU cores; with hue and shape it learns the kinds in
minutes. The explanation tests do not get easier: a map for one class must still point at
that class's object and not at the other objects, the clutter or the texture.

Clutter is never an object: thin line segments (about one pixel wide) and small dots (at
most 5 pixels across) in muted colours, while every object is a filled or ringed shape at
least 16 pixels across (at the default 64 x 64 size), so the two cannot be confused.

Free colours (`colours="free"`): the same scene (background, clutter, kinds, places,
sizes, rotations) with each object's hue one of the six `COLOURS`, distinct within the
scene and drawn independently of its kind, so that "what colour is the star?" is a real
question (explain.data.shapes_questions). The colours come from a random stream of their
own, so the default scenes, on which the zoo's image models were trained, are unchanged.

A scene is rendered in two steps: `scene_layout` draws everything random (a `Layout`:
the backdrop, each object's kind, colour, place, size and rotation, the pixel noise) and
`render_layout` paints it. An edited layout (an object removed, recoloured or reshaped,
with `dataclasses.replace`) renders the same scene with only that object changed: the
known-evidence checks of the zoo's vision-language model rest on it.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

__all__ = [
    "COLOURS",
    "KINDS",
    "KIND_HUES",
    "MEAN",
    "SPLITS",
    "STD",
    "Layout",
    "Scene",
    "SceneObject",
    "ShapesDataset",
    "render_layout",
    "render_scene",
    "scene_layout",
    "scene_seed",
]

KINDS: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross", "ring")
"""The object kinds, in the order of the label vector and of a classifier's logits."""

KIND_HUES: tuple[float, ...] = (0.0, 1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6)
"""Signature hue of each kind (HSV hue in [0, 1)): red circles, yellow squares, green
triangles, cyan stars, blue crosses, magenta rings."""

COLOURS: tuple[str, ...] = ("red", "yellow", "green", "cyan", "blue", "magenta")
"""The name of each hue of KIND_HUES, in that order: an object's colour is an index into
both (with the default colours, its kind's index)."""

COLOUR_MODES = ("kind", "free")
"""How objects are coloured: "kind", each in its kind's signature hue (the default, the
scenes the zoo's image models know); "free", hues drawn independently of the kinds."""

SPLITS: dict[str, range] = {
    "train": range(0, 1_000_000),
    "heldout": range(1_000_000, 1_100_000),
}
"""Disjoint seed ranges: a scene's seed says which split it belongs to."""

MEAN = (0.5, 0.5, 0.5)
STD = (0.25, 0.25, 0.25)
"""Normalisation the zoo's shapes models are trained with."""

_SUPERSAMPLE = 3  # coverage from a 3x3 sub-pixel grid: smooth edges, exact-enough masks
_HUE_JITTER = 1 / 36  # +-10 degrees: neighbouring kinds' hues stay 40 degrees apart
_BACKGROUND_MAX = 0.45  # every background channel; objects' brightest channel is >= 0.85


@dataclass(frozen=True)
class Scene:
    """One rendered scene with its ground truth.

    Attributes:
        image: (H, W, 3) float32 RGB in [0, 1].
        masks: (K, H, W) bool, the pixels of each of the K objects (at least half covered).
        kinds: the kind index (into KINDS) of each object; distinct within a scene.
        seed: the seed the scene was rendered from.
        colours: the colour index (into COLOURS) of each object; with the default
            colours, its kind.
    """

    image: np.ndarray
    masks: np.ndarray
    kinds: tuple[int, ...]
    seed: int
    colours: tuple[int, ...] = field(default=())

    @property
    def labels(self) -> np.ndarray:
        """(len(KINDS),) float32 multi-hot vector: 1 for each kind present."""
        labels = np.zeros(len(KINDS), dtype=np.float32)
        labels[list(self.kinds)] = 1.0
        return labels

    def class_mask(self, kind: int | str) -> np.ndarray:
        """(H, W) bool: the pixels of the objects of `kind` (all False when absent)."""
        index = KINDS.index(kind) if isinstance(kind, str) else kind
        mask = np.zeros(self.image.shape[:2], dtype=bool)
        for object_kind, object_mask in zip(self.kinds, self.masks, strict=True):
            if object_kind == index:
                mask |= object_mask
        return mask


def scene_seed(split: str, index: int) -> int:
    """The seed of scene `index` of `split`; raises ValueError outside the split's range."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {sorted(SPLITS)}")
    seeds = SPLITS[split]
    if not 0 <= index < len(seeds):
        raise ValueError(f"index {index} is outside split {split!r} (0..{len(seeds) - 1})")
    return seeds[index]


# --- shapes, in coordinates where the object's bounding circle is the unit disc ---------


def _convex(u: np.ndarray, v: np.ndarray, vertices: np.ndarray) -> np.ndarray:
    """Inside a convex polygon (vertices in either winding order)."""
    following = np.roll(vertices, -1, axis=0)
    area = np.sum(vertices[:, 0] * following[:, 1] - following[:, 0] * vertices[:, 1])
    if area < 0:  # the half-plane test below wants counter-clockwise vertices
        vertices = vertices[::-1]
    inside = np.ones(u.shape, dtype=bool)
    for (ax, ay), (bx, by) in zip(vertices, np.roll(vertices, -1, axis=0), strict=True):
        inside &= (bx - ax) * (v - ay) - (by - ay) * (u - ax) >= 0
    return inside


def _regular(count: int, radius: float, offset: float = np.pi / 2) -> np.ndarray:
    angles = offset + 2 * np.pi * np.arange(count) / count
    return radius * np.stack([np.cos(angles), np.sin(angles)], axis=1)


_STAR_OUTER = _regular(5, 1.0)
_STAR_INNER = _regular(5, 0.42, offset=np.pi / 2 + np.pi / 5)


def _star(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    # A five-pointed star is its inner pentagon plus five spike triangles.
    inside = _convex(u, v, _STAR_INNER)
    for k in range(5):
        inside |= _convex(u, v, np.stack([_STAR_INNER[k - 1], _STAR_OUTER[k], _STAR_INNER[k]]))
    return inside


def _inside(kind: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    radius2 = u * u + v * v
    if kind == "circle":
        return radius2 <= 0.95**2
    if kind == "ring":
        return (radius2 <= 1.0) & (radius2 >= 0.55**2)
    if kind == "square":
        return np.maximum(np.abs(u), np.abs(v)) <= 0.7
    if kind == "triangle":
        return _convex(u, v, _regular(3, 1.0))
    if kind == "star":
        return _star(u, v)
    if kind == "cross":
        au, av = np.abs(u), np.abs(v)
        return ((au <= 0.3) & (av <= 0.95)) | ((av <= 0.3) & (au <= 0.95))
    raise ValueError(f"unknown kind {kind!r}")


def _window(centre: np.ndarray, reach: float, size: int) -> tuple[slice, slice]:
    """The pixel rows and columns within `reach` of `centre`, clipped to the image."""
    low = np.clip(np.floor(centre - reach).astype(int), 0, size)
    high = np.clip(np.ceil(centre + reach).astype(int) + 1, 0, size)
    return slice(low[1], high[1]), slice(low[0], high[0])


def _coverage(inside, centre: np.ndarray, reach: float, size: int):
    """Fraction of each pixel near `centre` covered by a shape, from a sub-pixel grid.

    `inside(dx, dy)` says which sub-pixel offsets from the centre are in the shape; only
    the window within `reach` of the centre is evaluated (rendering cost ~ object size).
    Returns (rows, columns, coverage) with coverage of the window's shape, float32.
    """
    rows, columns = _window(centre, reach, size)
    ys = (np.arange(rows.start * _SUPERSAMPLE, rows.stop * _SUPERSAMPLE) + 0.5) / _SUPERSAMPLE
    xs = (np.arange(columns.start * _SUPERSAMPLE, columns.stop * _SUPERSAMPLE) + 0.5) / _SUPERSAMPLE
    dy, dx = np.meshgrid(ys - centre[1], xs - centre[0], indexing="ij")
    hits = inside(dx, dy).astype(np.float32)
    height, width = rows.stop - rows.start, columns.stop - columns.start
    coverage = hits.reshape(height, _SUPERSAMPLE, width, _SUPERSAMPLE).mean(axis=(1, 3))
    return rows, columns, coverage


def _shape(kind: str, radius: float, angle: float):
    """The `inside(dx, dy)` test of a shape of bounding radius `radius`, rotated by `angle`."""
    cos, sin = np.cos(angle), np.sin(angle)

    def inside(dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
        u = (cos * dx + sin * dy) / radius
        v = (-sin * dx + cos * dy) / radius
        return _inside(kind, u, v)

    return inside


# --- backgrounds and clutter ---------------------------------------------------------------


def _smooth_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """(size, size, 3) bilinear interpolation of a coarse random grid: blotchy texture."""
    coarse = rng.normal(size=(cells + 1, cells + 1, 3))
    t = np.linspace(0, cells, size)
    low = np.minimum(np.floor(t).astype(int), cells - 1)
    w = (t - low)[:, None, None]
    rows = coarse[low] * (1 - w) + coarse[low + 1] * w
    w = (t - low)[None, :, None]
    return rows[:, low] * (1 - w) + rows[:, low + 1] * w


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    # Dark and nearly grey (a tint of at most 0.06 per channel): objects are bright and
    # saturated, so every object's outline is a dark-to-bright edge and its hue stands out.
    def muted(grey: float) -> np.ndarray:
        return np.clip(grey + rng.uniform(-0.06, 0.06, size=3), 0, _BACKGROUND_MAX)

    base = muted(rng.uniform(0.05, 0.3))
    other = muted(rng.uniform(0.05, 0.38))
    y, x = np.mgrid[0:size, 0:size] / size
    style = rng.integers(3)
    if style == 0:  # blotchy noise
        texture = _smooth_noise(rng, size, int(rng.integers(3, 9)))
        image = base + 0.12 * texture
    elif style == 1:  # stripes of any orientation and frequency
        angle = rng.uniform(0, np.pi)
        frequency = rng.uniform(3, 10)
        phase = np.sin(2 * np.pi * frequency * (x * np.cos(angle) + y * np.sin(angle)))
        mix = (0.5 + 0.5 * phase)[..., None]
        image = base * (1 - mix) + other * mix
    else:  # a linear colour gradient
        angle = rng.uniform(0, 2 * np.pi)
        ramp = x * np.cos(angle) + y * np.sin(angle)
        ramp = ((ramp - ramp.min()) / (np.ptp(ramp) + 1e-9))[..., None]
        image = base * (1 - ramp) + other * ramp
    return np.broadcast_to(image, (size, size, 3)).astype(np.float32)


def _paint(image: np.ndarray, rows: slice, columns: slice, coverage, colour) -> None:
    alpha = coverage[..., None]
    window = image[rows, columns]
    window *= 1 - alpha
    window += alpha * colour


def _segment(half: np.ndarray, half_width: float):
    """The `inside(dx, dy)` test of a thick segment from -half to +half around its middle."""
    squared_length = float(half @ half)

    def inside(dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
        t = np.clip((dx * half[0] + dy * half[1]) / squared_length, -1, 1)
        return (dx - t * half[0]) ** 2 + (dy - t * half[1]) ** 2 <= half_width**2

    return inside


def _clutter(rng: np.random.Generator, image: np.ndarray, size: int) -> None:
    """Thin line segments and small dots in muted colours: texture that is not an object."""
    scale = size / 64
    for _ in range(int(rng.integers(3, 9))):
        colour = np.clip(rng.uniform(0.1, 0.7) + rng.uniform(-0.1, 0.1, size=3), 0, 1)
        if rng.random() < 0.5:
            angle = rng.uniform(0, 2 * np.pi)
            half = rng.uniform(4, 15) * scale * np.array([np.cos(angle), np.sin(angle)])
            half_width = 0.6 * scale
            inside, reach = _segment(half, half_width), float(np.hypot(*half)) + half_width
        else:
            radius = rng.uniform(1.0, 2.5) * scale
            inside, reach = (lambda dx, dy, r=radius: dx * dx + dy * dy <= r * r), radius
        rows, columns, coverage = _coverage(inside, rng.uniform(0, size, size=2), reach, size)
        _paint(image, rows, columns, coverage, colour)


# --- scenes --------------------------------------------------------------------------------


def _place(rng: np.random.Generator, count: int, size: int) -> list[tuple[np.ndarray, float]]:
    """Centres and radii of `count` objects inside the image that do not overlap."""
    placed: list[tuple[np.ndarray, float]] = []
    low, high = 0.13 * size, 0.22 * size
    while len(placed) < count:
        for _ in range(200):
            radius = rng.uniform(low, high)
            centre = rng.uniform(radius + 1, size - radius - 1, size=2)
            if all(np.linalg.norm(centre - c) >= radius + r + 2 for c, r in placed):
                placed.append((centre, radius))
                break
        else:  # crowded: start over with smaller objects
            placed.clear()
            high = max(low, 0.9 * high)
    return placed


@dataclass(frozen=True)
class SceneObject:
    """One object of a layout: what it is, where, and how it looks.

    Attributes:
        kind: index into KINDS.
        colour: index into COLOURS (its base hue, COLOUR_HUES = KIND_HUES).
        centre: (x, y) in pixels.
        radius: its bounding circle's radius in pixels.
        angle: its rotation in radians.
        hue_shift, saturation, value: its jitter around the base hue, and its HSV
            saturation and value (a recoloured object keeps them).
    """

    kind: int
    colour: int
    centre: np.ndarray
    radius: float
    angle: float
    hue_shift: float
    saturation: float
    value: float

    @property
    def rgb(self) -> np.ndarray:
        """(3,) RGB in [0, 1]: bright and saturated, near the hue of `colour`."""
        hue = (KIND_HUES[self.colour] + self.hue_shift) % 1.0
        return np.array(colorsys.hsv_to_rgb(hue, self.saturation, self.value))


@dataclass(frozen=True)
class Layout:
    """Everything random about a scene, before the objects are painted.

    Attributes:
        seed: the scene's seed.
        backdrop: (H, W, 3) float32, the background with its clutter.
        objects: the objects, painted in this order (they never overlap).
        noise: (H, W, 3) float32 pixel noise, added last.
    """

    seed: int
    backdrop: np.ndarray
    objects: tuple[SceneObject, ...]
    noise: np.ndarray


def scene_layout(seed: int, size: int = 64, colours: str = "kind") -> Layout:
    """Draw the layout of the scene of `seed` at `size` x `size` pixels (deterministic).

    One to three objects of distinct kinds, of random size and rotation, on a dark noise,
    stripe or gradient background with muted clutter. `colours` is one of COLOUR_MODES:
    "kind" colours each object in its kind's hue; "free" gives the same layout distinct
    hues drawn from a stream of their own (seeded by `seed`), independent of the kinds.
    """
    if size < 32:
        raise ValueError(f"scenes need at least 32 x 32 pixels, got {size}")
    if colours not in COLOUR_MODES:
        raise ValueError(f"colours must be one of {COLOUR_MODES}, got {colours!r}")
    rng = np.random.default_rng(seed)
    backdrop = _background(rng, size).copy()
    _clutter(rng, backdrop, size)
    count = int(rng.integers(1, 4))
    kinds = tuple(int(k) for k in rng.choice(len(KINDS), size=count, replace=False))
    if colours == "free":  # its own stream: the default scenes' draws stay as they were
        hues = np.random.default_rng([seed, 1]).choice(len(COLOURS), size=count, replace=False)
    else:
        hues = np.array(kinds)
    objects = []
    for kind, hue, (centre, radius) in zip(kinds, hues, _place(rng, count, size), strict=True):
        angle = rng.uniform(0, 2 * np.pi)
        shift = rng.uniform(-_HUE_JITTER, _HUE_JITTER)
        saturation, value = rng.uniform(0.7, 1.0), rng.uniform(0.85, 1.0)
        objects.append(SceneObject(kind, int(hue), centre, radius, angle, shift, saturation, value))
    noise = rng.normal(0, 0.03, size=backdrop.shape).astype(np.float32)
    return Layout(seed=seed, backdrop=backdrop, objects=tuple(objects), noise=noise)


def render_layout(layout: Layout) -> Scene:
    """Paint a layout's objects on its backdrop, add its noise: the scene and its masks."""
    image = layout.backdrop.copy()
    size = image.shape[0]
    masks = np.zeros((len(layout.objects), size, size), dtype=bool)
    for index, item in enumerate(layout.objects):
        rows, columns, coverage = _coverage(
            _shape(KINDS[item.kind], item.radius, item.angle), item.centre, item.radius, size
        )
        _paint(image, rows, columns, coverage, item.rgb)
        masks[index, rows, columns] = coverage >= 0.5
    image += layout.noise
    return Scene(
        image=np.clip(image, 0, 1),
        masks=masks,
        kinds=tuple(item.kind for item in layout.objects),
        seed=layout.seed,
        colours=tuple(item.colour for item in layout.objects),
    )


def render_scene(seed: int, size: int = 64, colours: str = "kind") -> Scene:
    """Render the scene of `seed` at `size` x `size` pixels (deterministic).

    One to three objects of distinct kinds, each bright in its kind's hue (or, with
    `colours="free"`, in distinct hues independent of the kinds), of random size and
    rotation, on a dark noise, stripe or gradient background with muted clutter, plus
    mild pixel noise.
    """
    return render_layout(scene_layout(seed, size, colours))


def normalise(image: np.ndarray) -> Tensor:
    """(H, W, 3) image in [0, 1] -> (3, H, W) float32 tensor normalised with MEAN and STD."""
    tensor = torch.from_numpy(np.ascontiguousarray(image, dtype=np.float32)).permute(2, 0, 1)
    return (tensor - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]


class ShapesDataset(Dataset):
    """Scenes `start .. start + length - 1` of a split, as (normalised image, multi-hot labels).

    Scenes are rendered on access (about a millisecond each), so any length costs no memory.
    """

    def __init__(self, split: str, length: int, *, start: int = 0, size: int = 64) -> None:
        scene_seed(split, start)
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        if length:
            scene_seed(split, start + length - 1)
        self.split, self.length, self.start, self.size = split, length, start, size

    def __len__(self) -> int:
        return self.length

    def scene(self, index: int) -> Scene:
        """The full scene (image in [0, 1], masks, kinds) of item `index`."""
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} scenes")
        return render_scene(scene_seed(self.split, self.start + index), self.size)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        scene = self.scene(index)
        return normalise(scene.image), torch.from_numpy(scene.labels)
