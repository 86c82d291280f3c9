"""A model's image preprocessing, both ways: photo -> input tensor, input-sized map -> photo.

Pretrained image models see a resized, often centre-cropped, normalised version of a photo.
`ImagePreprocessing` records that geometry (from timm's resolved data config or a Hugging
Face image processor) so that a heatmap over the model's input can be drawn back on the
user's original photo, on the pixels the model actually saw; the pixels themselves come
from the library's own transform when there is one, so the model gets exactly what it was
trained and evaluated with. A vision-language processor's geometry is read by
`photo_preprocessing`; `load_images` reads image files as a normalised batch.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from explain.errors import InputError, ModelLoadError, OptionError
from explain.inputs import read_image
from explain.normalize import normalize_per_sample

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImagePreprocessing",
    "load_images",
    "photo_preprocessing",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_PIL_FILTERS = ("nearest", "lanczos", "bilinear", "bicubic", "box", "hamming")
"""Interpolation names by PIL's resampling number (PIL.Image.Resampling order)."""


def _positive_pair(pair: object) -> bool:
    return (
        isinstance(pair, tuple | list)
        and len(pair) == 2
        and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in pair)
    )


def _finite_numbers(values: object) -> bool:
    return (
        isinstance(values, tuple | list)
        and len(values) > 0
        and all(isinstance(v, numbers.Real) and math.isfinite(v) for v in values)
    )


@dataclass(frozen=True)
class ImagePreprocessing:
    """Resize, centre-crop and normalise, as a model's own preprocessing does.

    A photo of (h, w) pixels is resized to `resize` = (H', W') exactly (`fit="exact"`), or
    keeping its aspect ratio so that its shorter (`fit="shorter"`) or longer
    (`fit="longer"`, padded) side fits `resize`; then the centre (H, W) = `size` is
    cropped (or padded), scaled to [0, 1] and normalised with `mean` and `std`.

    Attributes:
        size: (H, W) the model takes.
        mean, std: per-channel normalisation of [0, 1] pixels.
        resize: (H', W') of the resize step (equal to `size` when nothing is cropped).
        fit: how the photo is fitted to `resize` (see above).
        interpolation: the resampling filter ("bicubic", "bilinear", ...).
        transform: the library's own PIL image -> (3, H, W) tensor (timm's eval transform,
            a Hugging Face image processor); None: the steps above with PIL.
    """

    size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    resize: tuple[int, int] | None = None
    fit: Literal["exact", "shorter", "longer"] = "exact"
    interpolation: str = "bicubic"
    transform: Callable[[Any], Tensor] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Checked where a model card or config enters: a size of "big" or a std of 0 would
        # otherwise surface as a PIL error or as infinite pixels on the first image.
        for name in ("size", "resize"):
            pair = getattr(self, name)
            if not (name == "resize" and pair is None) and not _positive_pair(pair):
                raise OptionError(f"image {name} must be two positive ints (H, W), got {pair!r}")
        for name in ("mean", "std"):
            values = getattr(self, name)
            if not _finite_numbers(values):
                raise OptionError(f"image {name} must be a finite number per channel: {values!r}")
        if any(v <= 0 for v in self.std):
            raise OptionError(f"image std must be positive per channel, got {self.std!r}")

    @classmethod
    def from_timm(cls, config: Mapping[str, Any]) -> ImagePreprocessing:
        """The eval preprocessing of a timm data config (`timm.data.resolve_data_config`):
        its geometry, mirroring `transforms_imagenet_eval`, and timm's own transform."""
        from timm.data import create_transform

        size = (int(config["input_size"][1]), int(config["input_size"][2]))
        crop_pct = config.get("crop_pct") or 0.875  # timm's DEFAULT_CROP_PCT
        mode = config.get("crop_mode") or "center"
        resize = (math.floor(size[0] / crop_pct), math.floor(size[1] / crop_pct))
        fit = {"squash": "exact", "border": "longer"}.get(mode, "shorter")
        return cls(
            size=size,
            mean=tuple(float(m) for m in config["mean"]),
            std=tuple(float(s) for s in config["std"]),
            resize=resize,
            fit=fit,
            interpolation=config.get("interpolation", "bicubic"),
            transform=create_transform(**config),
        )

    @classmethod
    def from_processor(cls, processor: Any) -> ImagePreprocessing:
        """The preprocessing of a Hugging Face image processor (its `size`, `crop_size`,
        `do_center_crop`, `crop_pct`, `resample`, `image_mean`, `image_std`); the pixels
        come from the processor itself."""
        size_of = getattr(processor, "size", None) or {}
        height, width = _get(size_of, "height"), _get(size_of, "width")
        shortest = _get(size_of, "shortest_edge")
        if height and width:
            resize, fit = (int(height), int(width)), "exact"
        elif shortest:
            crop_pct = getattr(processor, "crop_pct", None)
            if crop_pct is not None and shortest >= 384:  # ConvNeXt: warp at 384 and above
                resize, fit = (int(shortest), int(shortest)), "exact"
            elif crop_pct is not None:  # ConvNeXt below 384: resize shortest/pct, crop
                edge = int(shortest / crop_pct)
                resize, fit = (edge, edge), "shorter"
            else:
                resize, fit = (int(shortest), int(shortest)), "shorter"
        else:
            raise ModelLoadError(
                f"{type(processor).__name__} sizes images by {dict(_items(size_of))}: explain "
                "handles height/width and shortest_edge"
            )
        size = resize
        crop = getattr(processor, "crop_size", None)
        if getattr(processor, "do_center_crop", False) and crop:
            size = (int(_get(crop, "height")), int(_get(crop, "width")))
        elif getattr(processor, "crop_pct", None) is not None and fit == "shorter":
            size = (int(shortest), int(shortest))
        elif fit == "shorter":
            raise ModelLoadError(
                f"{type(processor).__name__} resizes without cropping to a fixed size; a "
                "transformer needs a fixed input size"
            )
        resample = getattr(processor, "resample", None)
        resample = getattr(resample, "value", resample)
        interpolation = _PIL_FILTERS[resample] if isinstance(resample, int) else "bilinear"

        def transform(photo: Any) -> Tensor:
            return processor(images=photo, return_tensors="pt")["pixel_values"][0]

        return cls(
            size=size,
            mean=tuple(float(m) for m in processor.image_mean),
            std=tuple(float(s) for s in processor.image_std),
            resize=resize,
            fit=fit,
            interpolation=interpolation,
            transform=transform,
        )

    def placement(self, original_size: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
        """Where a photo of `original_size` (h, w) lands: its resized (H', W') and the
        (top, left) of the model's input in it (negative where the input is padded)."""
        height, width = original_size
        target = self.resize or self.size
        if self.fit == "exact":
            resized = target
        elif self.fit == "shorter" and target[0] == target[1]:
            # torchvision's Resize(int) and the Hugging Face processors' shortest_edge: the
            # shorter side exactly, the longer one truncated.
            short, long = sorted((height, width))
            other = int(target[0] * long / short)
            resized = (target[0], other) if height <= width else (other, target[0])
        else:  # timm's ResizeKeepRatio
            ratios = (height / target[0], width / target[1])
            ratio = min(ratios) if self.fit == "shorter" else max(ratios)
            resized = (max(1, round(height / ratio)), max(1, round(width / ratio)))
        # torchvision's CenterCrop (and CenterCropOrPad) rounding, which timm and the
        # Hugging Face processors use.
        top = round((resized[0] - self.size[0]) / 2.0)
        left = round((resized[1] - self.size[1]) / 2.0)
        return resized, (top, left)

    def crop_note(self, original_size: tuple[int, int]) -> str | None:
        """What the model sees of a photo of `original_size` (H0, W0) when the crop cuts
        some of it away, in the photo's pixels, e.g. "centre-cropped 300x120 -> 120x120
        (40% of the image)"; None when it sees the whole photo."""
        height, width = original_size
        resized, _ = self.placement(original_size)
        kept = (min(1.0, self.size[0] / resized[0]), min(1.0, self.size[1] / resized[1]))
        if kept == (1.0, 1.0):
            return None
        seen = (round(height * kept[0]), round(width * kept[1]))
        share = kept[0] * kept[1]
        return f"centre-cropped {width}x{height} -> {seen[1]}x{seen[0]} ({share:.0%} of the image)"

    def __call__(self, photos: Sequence[Any]) -> Tensor:
        """RGB PIL images -> the normalised float32 batch (B, 3, H, W) the model takes."""
        if not photos:
            raise InputError("no images given")
        step = self.transform or self._pil_transform
        return torch.stack([step(photo).float() for photo in photos])

    def _pil_transform(self, photo: Any) -> Tensor:
        from PIL import Image

        resized, (top, left) = self.placement((photo.height, photo.width))
        filter_ = Image.Resampling[self.interpolation.upper()]
        image = photo.resize((resized[1], resized[0]), filter_)
        if (top, left, *resized) != (0, 0, *self.size):
            image = image.crop((left, top, left + self.size[1], top + self.size[0]))
        pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)
        mean = torch.tensor(self.mean)[:, None, None]
        return (pixels - mean) / torch.tensor(self.std)[:, None, None]

    def heatmap(self, relevance: Tensor, original_size: tuple[int, int]) -> Tensor:
        """`Explanation.heatmap` on the original photo: relevance over the model's input
        (..., h, w) upsampled onto the photo's pixels with the crop and resize undone, then
        min-max normalised per map to [0, 1]; pixels the model never saw are 0."""
        return normalize_per_sample(self.to_original(relevance, original_size), sample_dims=2)

    def to_original(self, maps: Tensor, original_size: tuple[int, int]) -> Tensor:
        """Maps over the model's input (..., h, w), any resolution spanning the whole input,
        drawn on the photo's pixels (..., H0, W0): the crop and resize undone, bilinearly.

        Photo pixels the model never saw (cropped away) get the map's minimum, so that a
        min-max normalised map shows them at 0.
        """
        height, width = original_size
        resized, (top, left) = self.placement(original_size)
        # The input-pixel coordinate of each photo pixel's centre, then grid_sample's [-1, 1].
        rows = (torch.arange(height, dtype=torch.float64) + 0.5) * resized[0] / height - top
        cols = (torch.arange(width, dtype=torch.float64) + 0.5) * resized[1] / width - left
        seen = ((rows >= 0) & (rows <= self.size[0]))[:, None] & (
            (cols >= 0) & (cols <= self.size[1])
        )[None, :]
        grid_y = (rows / self.size[0] * 2 - 1)[:, None].expand(height, width)
        grid_x = (cols / self.size[1] * 2 - 1)[None, :].expand(height, width)
        grid = torch.stack([grid_x, grid_y], dim=-1).to(torch.float32)
        lead = maps.shape[:-2]
        flat = maps.detach().reshape(-1, 1, *maps.shape[-2:]).float().cpu()
        drawn = F.grid_sample(
            flat,
            grid.expand(flat.shape[0], height, width, 2),
            mode="bilinear",
            padding_mode="border",
            align_corners=False,
        )
        lowest = flat.amin(dim=(-2, -1), keepdim=True)
        return torch.where(seen, drawn, lowest).reshape(*lead, height, width)


def _get(values: Any, key: str) -> Any:
    """A key of a size mapping (a dict, or transformers' SizeDict)."""
    return values.get(key) if isinstance(values, Mapping) else getattr(values, key, None)


def _items(values: Any) -> list[tuple[str, Any]]:
    items = values.items() if isinstance(values, Mapping) else vars(values).items()
    return [(key, value) for key, value in items if value is not None]


def photo_preprocessing(processor: Any) -> ImagePreprocessing:
    """Where the model's input lies on a photo, from a vision-language processor's image
    processor: its resize and centre crop (`ImagePreprocessing.from_processor`), and
    LLaVA's `do_pad`, which pads the photo to a square before resizing (so the whole
    photo is seen, letterboxed: the "longer" fit).

    Qwen2-VL's processor resizes each photo to whole blocks of `patch_size * merge_size`
    pixels near its own size, cropping nothing: the model's input is the whole photo,
    squashed by less than a block, so a map over it is stretched over the photo (the
    "exact" fit; `size` is then one block, as the input's size varies per photo).
    Idefics3's and SmolVLM's resize each photo to whole tiles (`max_image_size`) near its
    own shape, cropping nothing, and split it into them: the tiles' map spans the whole
    photo alike."""
    images = getattr(processor, "image_processor", processor)
    block = _whole_photo_block(images)
    if block is not None:
        return ImagePreprocessing(
            size=(block, block),
            mean=tuple(float(m) for m in images.image_mean),
            std=tuple(float(s) for s in images.image_std),
            fit="exact",
        )
    found = ImagePreprocessing.from_processor(images)
    if getattr(images, "do_pad", False):
        found = replace(found, resize=found.size, fit="longer")
    return found


def _whole_photo_block(images: Any) -> int | None:
    """The side of the blocks an image processor resizes each whole photo to a number of,
    near its own size, or None: Qwen2-VL's and Qwen2.5-VL's merged blocks of patches
    (`merge_size`, and pixel counts as sizes), Idefics3's and SmolVLM's tiles (the
    photo's longer side resized, then each side up to whole `max_image_size` tiles)."""
    size = getattr(images, "size", None) or {}
    if hasattr(images, "merge_size") and "longest_edge" in size and "height" not in size:
        return int(images.patch_size) * int(images.merge_size)
    tile = getattr(images, "max_image_size", None)
    if isinstance(tile, Mapping) and "longest_edge" in tile:
        return int(tile["longest_edge"])
    return None


def load_images(
    paths: Sequence[str | os.PathLike[str]],
    size: tuple[int, int],
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> tuple[Tensor, Tensor]:
    """Load image files as a normalised batch.

    Each image is converted to RGB, resized (bicubic) to `size` = (H, W), scaled to
    [0, 1] and normalised with `mean` and `std` (a model's own preprocessing, crop
    included, is `LoadedModel.preprocessing`).

    Returns:
        (normalised (B, 3, H, W), unnormalised (B, 3, H, W) in [0, 1] for display).
    """
    plain = ImagePreprocessing(size=tuple(size), mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    raw = plain([read_image(path) for path in paths])
    normalised = (raw - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    return normalised, raw
