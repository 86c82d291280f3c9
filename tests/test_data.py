"""The datasets with known ground truth: deterministic, split-disjoint, labels match masks."""

from __future__ import annotations

import colorsys

import numpy as np
import pytest
import torch

from explain.data import shapes

SEEDS = [0, 1, 2, 3, 17, 1_000_000, 1_000_123]


def test_shapes_scene_is_a_pure_function_of_its_seed():
    first, second = shapes.render_scene(5), shapes.render_scene(5)
    assert np.array_equal(first.image, second.image)
    assert np.array_equal(first.masks, second.masks)
    assert first.kinds == second.kinds
    assert not np.array_equal(first.image, shapes.render_scene(6).image)


def test_shapes_splits_are_disjoint_and_bounded():
    train, heldout = shapes.SPLITS["train"], shapes.SPLITS["heldout"]
    assert set(train).isdisjoint(heldout)
    assert shapes.scene_seed("train", 0) != shapes.scene_seed("heldout", 0)
    with pytest.raises(ValueError, match="outside split"):
        shapes.scene_seed("train", len(train))
    with pytest.raises(ValueError, match="unknown split"):
        shapes.scene_seed("test", 0)
    train_images = shapes.ShapesDataset("train", 4)
    heldout_images = shapes.ShapesDataset("heldout", 4)
    for index in range(4):
        assert not torch.equal(train_images[index][0], heldout_images[index][0])


@pytest.mark.parametrize("seed", SEEDS)
def test_shapes_labels_and_masks_agree(seed):
    scene = shapes.render_scene(seed)
    count = len(scene.kinds)
    assert 1 <= count <= 3 and len(set(scene.kinds)) == count
    assert scene.image.shape == (64, 64, 3) and scene.image.dtype == np.float32
    assert scene.image.min() >= 0.0 and scene.image.max() <= 1.0
    assert scene.masks.shape == (count, 64, 64)
    # Objects are at least 16 px across (area of the smallest: a triangle of radius 8.3).
    assert (scene.masks.sum(axis=(1, 2)) >= 60).all()
    assert scene.masks.sum(axis=0).max() == 1, "objects never overlap"
    expected = np.zeros(len(shapes.KINDS), dtype=np.float32)
    expected[list(scene.kinds)] = 1
    assert np.array_equal(scene.labels, expected)
    for kind in range(len(shapes.KINDS)):
        class_mask = scene.class_mask(kind)
        if kind in scene.kinds:
            assert np.array_equal(class_mask, scene.masks[scene.kinds.index(kind)])
            assert np.array_equal(class_mask, scene.class_mask(shapes.KINDS[kind]))
        else:
            assert not class_mask.any()
    # A mask covers one flat-coloured object: away from its anti-aliased edge (the mask
    # eroded by one pixel) its pixels share a colour up to the pixel noise (sigma 0.03).
    for mask in scene.masks:
        inner = mask.copy()
        inner[1:] &= mask[:-1]
        inner[:-1] &= mask[1:]
        inner[:, 1:] &= mask[:, :-1]
        inner[:, :-1] &= mask[:, 1:]
        pixels = scene.image[inner]
        near = np.abs(pixels - np.median(pixels, axis=0)).max(axis=1) < 0.12
        assert near.mean() > 0.97


@pytest.mark.parametrize("seed", SEEDS)
def test_shapes_objects_are_bright_in_their_kinds_hue_on_a_dark_background(seed):
    scene = shapes.render_scene(seed)
    background = ~scene.masks.any(axis=0)
    # The background is at most 0.45 per channel; clutter (up to 0.8) and pixel noise
    # brighten a few of its pixels.
    assert np.median(scene.image[background].max(axis=1)) < 0.5
    for kind, mask in zip(scene.kinds, scene.masks, strict=True):
        colour = np.median(scene.image[mask], axis=0)
        hue, saturation, value = colorsys.rgb_to_hsv(*colour)
        distance = abs(hue - shapes.KIND_HUES[kind])
        assert min(distance, 1 - distance) < 1 / 24, "within 15 degrees of the kind's hue"
        assert saturation > 0.55 and value > 0.75


def test_shapes_every_kind_and_count_occurs():
    scenes = [shapes.render_scene(seed) for seed in range(60)]
    assert {kind for scene in scenes for kind in scene.kinds} == set(range(len(shapes.KINDS)))
    assert {len(scene.kinds) for scene in scenes} == {1, 2, 3}


def test_shapes_dataset_items_are_normalised_scenes():
    dataset = shapes.ShapesDataset("heldout", 3, start=10)
    assert len(dataset) == 3
    image, labels = dataset[1]
    scene = dataset.scene(1)
    assert scene.seed == shapes.SPLITS["heldout"][11]
    assert image.shape == (3, 64, 64) and labels.shape == (len(shapes.KINDS),)
    mean = torch.tensor(shapes.MEAN)[:, None, None]
    std = torch.tensor(shapes.STD)[:, None, None]
    restored = (image * std + mean).permute(1, 2, 0).numpy()
    np.testing.assert_allclose(restored, scene.image, rtol=1e-4, atol=1e-6)  # float32
    assert torch.equal(labels, torch.from_numpy(scene.labels))
    with pytest.raises(IndexError):
        dataset.scene(3)
    with pytest.raises(ValueError, match="outside split"):
        shapes.ShapesDataset("heldout", len(shapes.SPLITS["heldout"]) + 1)


def test_digits_split_is_fixed_disjoint_and_covers_every_digit():
    from sklearn.datasets import load_digits

    from explain.data import digits

    train, heldout = digits.split_indices("train"), digits.split_indices("heldout")
    assert len(heldout) == 400 and len(train) == 1397
    assert set(train).isdisjoint(heldout) and set(train) | set(heldout) == set(range(1797))
    assert np.array_equal(heldout, digits.split_indices("heldout"))
    targets = load_digits().target
    assert set(targets[train]) == set(targets[heldout]) == set(range(10))
    with pytest.raises(ValueError, match="unknown split"):
        digits.split_indices("test")


def test_digits_images_are_the_upsampled_scikit_learn_digits():
    from sklearn.datasets import load_digits

    from explain.data import digits

    images, labels = digits.load("heldout")
    assert images.shape == (400, 3, 32, 32) and labels.shape == (400,)
    assert images.min() >= 0 and images.max() <= 1
    data = load_digits()
    index = digits.split_indices("heldout")[7]
    assert labels[7] == data.target[index]
    # Plain-loop bilinear upsampling (half-pixel centres, edges clamped) of the raw digit.
    source = data.images[index] / 16.0
    expected = np.zeros((32, 32))
    for y in range(32):
        for x in range(32):
            sy, sx = max((y + 0.5) / 4 - 0.5, 0), max((x + 0.5) / 4 - 0.5, 0)
            y0, x0 = min(int(sy), 7), min(int(sx), 7)
            y1, x1 = min(y0 + 1, 7), min(x0 + 1, 7)
            wy, wx = sy - y0, sx - x0
            top = source[y0, x0] * (1 - wx) + source[y0, x1] * wx
            bottom = source[y1, x0] * (1 - wx) + source[y1, x1] * wx
            expected[y, x] = top * (1 - wy) + bottom * wy
    for channel in range(3):
        np.testing.assert_allclose(images[7, channel].numpy(), expected, rtol=1e-4, atol=1e-6)


def test_sentiment_sentences_are_deterministic_and_split_disjoint():
    from explain.data import sentiment

    first = sentiment.sentences("train", 50)
    assert first == sentiment.sentences("train", 50)
    heldout = sentiment.sentences("heldout", 50)
    assert {s.seed for s in first}.isdisjoint(s.seed for s in heldout)
    assert set(sentiment.SPLITS["train"]).isdisjoint(sentiment.SPLITS["heldout"])
    with pytest.raises(ValueError, match="outside split"):
        sentiment.sentences("heldout", 2, start=len(sentiment.SPLITS["heldout"]) - 1)


def test_sentiment_labels_follow_from_the_rationale_words():
    from explain.data import sentiment

    examples = sentiment.sentences("heldout", 300)
    assert {s.label for s in examples} == {0, 1}
    assert any("not" in s.words for s in examples)
    for example in examples:
        positive = [w for w in example.words if w in sentiment.POSITIVE]
        negative = [w for w in example.words if w in sentiment.NEGATIVE]
        assert bool(positive) != bool(negative), "one polarity of sentiment words per sentence"
        negated = "not" in example.words
        assert example.label == int(bool(positive) != negated)
        assert not negated or len(positive) == 1, "only a single praise word is negated"
        decisive = [w for w, r in zip(example.words, example.rationale, strict=True) if r]
        assert sorted(decisive) == sorted(positive + negative + ["not"] * negated)
        assert example.text == " ".join(example.words)


def test_sentiment_token_rationales_mark_the_subword_tokens_of_rationale_words():
    from transformers import AutoTokenizer

    from explain.data import sentiment
    from explain.loading.zoo import minilm_folder

    tokenizer = AutoTokenizer.from_pretrained(minilm_folder())
    batch = sentiment.sentences("heldout", 6)
    encoding, labels, rationale = sentiment.encode(batch, tokenizer)
    assert rationale.shape == encoding["input_ids"].shape
    assert labels.tolist() == [s.label for s in batch]
    for row, example in enumerate(batch):
        marked = tokenizer.convert_ids_to_tokens(encoding["input_ids"][row][rationale[row]])
        words = [w for w, r in zip(example.words, example.rationale, strict=True) if r]
        assert tokenizer.convert_tokens_to_string(marked).split() == words
        assert not rationale[row][encoding["attention_mask"][row] == 0].any()
