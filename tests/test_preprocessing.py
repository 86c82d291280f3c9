"""ImagePreprocessing: the model's own resize / crop / normalise, and its undoing for overlays.

The overlay test uses a non-square photo with a red square at a known place: the square is
found in what the library's own transform hands the model, mapped back with `to_original`,
and must land on the square of the photo.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tolerances import FLOAT32

from explain.explanation import Explanation
from explain.inputs import read_image
from explain.loading.preprocessing import ImagePreprocessing, load_images

PHOTO_SIZE = (200, 320)  # (H, W): wider than high, as most photos


def _photo(box: tuple[int, int, int, int]):
    """A grey photo with a red rectangle (top, left, bottom, right) and its boolean mask."""
    from PIL import Image

    pixels = np.full((*PHOTO_SIZE, 3), 128, dtype=np.uint8)
    top, left, bottom, right = box
    pixels[top:bottom, left:right] = (230, 20, 20)
    mask = np.zeros(PHOTO_SIZE, dtype=bool)
    mask[top:bottom, left:right] = True
    return Image.fromarray(pixels), mask


def _timm_center_crop():
    pytest.importorskip("timm")
    config = {
        "input_size": (3, 64, 64),
        "interpolation": "bicubic",
        "mean": (0.485, 0.456, 0.406),
        "std": (0.229, 0.224, 0.225),
        "crop_pct": 0.875,
        "crop_mode": "center",
    }
    return ImagePreprocessing.from_timm(config)


def _hf_clip_processor():
    transformers = pytest.importorskip("transformers")
    processor = transformers.CLIPImageProcessor(
        size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64}
    )
    return ImagePreprocessing.from_processor(processor)


def _hf_convnext_processor():
    transformers = pytest.importorskip("transformers")
    processor = transformers.ConvNextImageProcessor(size={"shortest_edge": 64}, crop_pct=0.875)
    return ImagePreprocessing.from_processor(processor)


def _squash():
    return ImagePreprocessing(size=(48, 64), mean=(0.5,) * 3, std=(0.25,) * 3)


PREPROCESSINGS = {
    "timm-center-crop": _timm_center_crop,
    "hf-clip-shortest-edge-crop": _hf_clip_processor,
    "hf-convnext-crop-pct": _hf_convnext_processor,
    "exact-resize": _squash,
}


@pytest.mark.parametrize("kind", sorted(PREPROCESSINGS))
def test_overlay_lands_on_the_object_of_a_non_square_photo(kind):
    preprocessing = PREPROCESSINGS[kind]()
    photo, truth = _photo((60, 190, 130, 250))  # right of centre, inside every crop
    pixels = preprocessing([photo])[0]
    assert pixels.shape == (3, *preprocessing.size)
    raw = pixels * torch.tensor(preprocessing.std)[:, None, None]
    raw = raw + torch.tensor(preprocessing.mean)[:, None, None]
    seen = ((raw[0] - raw[1]) > 0.4).float()  # red, where the model's input has it
    assert seen.sum() > 20
    back = preprocessing.to_original(seen, PHOTO_SIZE).numpy() > 0.5
    iou = (back & truth).sum() / (back | truth).sum()
    assert iou > 0.85, f"the overlay is off the object (IoU {iou:.2f})"


@pytest.mark.parametrize("kind", ["timm-center-crop", "hf-clip-shortest-edge-crop"])
def test_cropped_away_pixels_are_not_explained(kind):
    preprocessing = PREPROCESSINGS[kind]()
    photo, _ = _photo((60, 5, 130, 30))  # at the left edge: a centre crop drops it
    raw = preprocessing([photo])[0]
    assert (raw[0] - raw[1]).max() < 0.4  # the model never sees the red
    heat = preprocessing.heatmap(torch.rand(2, 4, 4), PHOTO_SIZE)
    assert heat.shape == (2, *PHOTO_SIZE) and heat.min() == 0 and heat.max() == 1
    resized, (_, left) = preprocessing.placement(PHOTO_SIZE)
    assert left > 0 and resized[0] == preprocessing.resize[0]  # the shorter side fits
    margin = int(np.floor(left * PHOTO_SIZE[1] / resized[1])) - 1
    assert (heat[:, :, :margin] == 0).all() and (heat[:, :, -margin:] == 0).all()


def test_timm_geometry_matches_timms_own_transform():
    preprocessing = _timm_center_crop()
    # 64 / 0.875 = 73.1 -> the shorter side to 73 (the longer to int(73 * 1.6) = 116),
    # then the centre 64 x 64.
    assert preprocessing.placement(PHOTO_SIZE) == ((73, 116), (4, 26))
    photo, _ = _photo((60, 190, 130, 250))
    resized = photo.resize((116, 73), 3)  # PIL bicubic
    crop = np.asarray(resized, dtype=np.float32)[4:68, 26:90] / 255.0
    expected = torch.from_numpy(crop).permute(2, 0, 1)
    expected = (expected - torch.tensor(preprocessing.mean)[:, None, None]) / torch.tensor(
        preprocessing.std
    )[:, None, None]
    torch.testing.assert_close(preprocessing([photo])[0], expected, rtol=1e-4, atol=1e-5)


def test_exact_resize_matches_load_images_and_explanation_heatmap(tmp_path):
    preprocessing = _squash()
    photo, _ = _photo((60, 190, 130, 250))
    photo.save(tmp_path / "photo.png")
    expected, _ = load_images(
        [tmp_path / "photo.png"], size=(48, 64), mean=preprocessing.mean, std=preprocessing.std
    )
    photo = preprocessing([read_image(tmp_path / "photo.png")])
    torch.testing.assert_close(photo, expected, **FLOAT32)  # float32, two code paths
    # Without a crop, the photo heatmap is Explanation.heatmap at the photo's size.
    relevance = torch.rand(1, 3, 6, 8)
    result = Explanation(
        relevance=relevance,
        logits=torch.zeros(1, 3),
        target=torch.zeros(1, 3, dtype=torch.long),
        method="generic",
        score="logit",
        input_size=(48, 64),
    )
    torch.testing.assert_close(
        preprocessing.heatmap(relevance[0], PHOTO_SIZE),
        result.heatmap(size=PHOTO_SIZE)[0],
        **FLOAT32,
    )
    upsampled = F.interpolate(relevance, size=PHOTO_SIZE, mode="bilinear", align_corners=False)
    torch.testing.assert_close(
        preprocessing.to_original(relevance, PHOTO_SIZE), upsampled, **FLOAT32
    )


def test_an_image_over_pils_decompression_bomb_limit_is_a_clear_error(tmp_path, monkeypatch):
    from PIL import Image as PILImage

    from explain.errors import InputError
    from explain.inputs import read_image

    path = tmp_path / "large.png"
    PILImage.new("RGB", (64, 64)).save(path)
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 100)  # 4096 pixels: over twice the limit
    with pytest.raises(
        InputError, match=r"large\.png is too large to read safely.*MAX_IMAGE_PIXELS"
    ):
        read_image(path)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(size=(0, 32)), "size must be two positive ints"),
        (dict(size=("b", "ig")), "size must be two positive ints"),
        (dict(size=(32, 32), resize=(32,)), "resize must be two positive ints"),
        (dict(std=(0.5, 0.0, 0.5)), "std must be positive"),
        (dict(mean=(0.5, float("nan"), 0.5)), "mean must be a finite number"),
        (dict(mean=()), "mean must be a finite number"),
    ],
)
def test_preprocessing_settings_are_checked_where_they_enter(fields, message):
    from explain.errors import OptionError
    from explain.loading.preprocessing import ImagePreprocessing

    settings = {"size": (32, 32), "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), **fields}
    with pytest.raises(OptionError, match=message):
        ImagePreprocessing(**settings)


def test_a_crop_says_how_much_of_the_photo_the_model_sees():
    from explain.loading.preprocessing import ImagePreprocessing

    square = ImagePreprocessing(
        size=(224, 224), mean=(0.5,) * 3, std=(0.5,) * 3, resize=(224, 224), fit="shorter"
    )
    # 300x120 -> shorter side 224: 560x224, of which the centre 224x224 is kept: the
    # photo's middle 120x120, 120 * 120 / (300 * 120) = 40% of it
    assert square.crop_note((120, 300)) == "centre-cropped 300x120 -> 120x120 (40% of the image)"
    assert square.crop_note((50, 50)) is None  # a square photo is resized whole
    timm = ImagePreprocessing(
        size=(224, 224), mean=(0.5,) * 3, std=(0.5,) * 3, resize=(256, 256), fit="shorter"
    )
    share = (224 / 256) ** 2  # the 0.875 crop of both sides
    assert (
        timm.crop_note((256, 256))
        == f"centre-cropped 256x256 -> 224x224 ({share:.0%} of the image)"
    )
