"""The datasets with known ground truth: deterministic, split-disjoint, labels match masks."""

from __future__ import annotations

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
    # A mask covers one flat-coloured object: its pixels share a colour up to pixel noise
    # and anti-aliased edges.
    for mask in scene.masks:
        pixels = scene.image[mask]
        near = np.abs(pixels - np.median(pixels, axis=0)).max(axis=1) < 0.12
        assert near.mean() > 0.85


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
    np.testing.assert_allclose(restored, scene.image, atol=1e-6)
    assert torch.equal(labels, torch.from_numpy(scene.labels))
    with pytest.raises(IndexError):
        dataset.scene(3)
    with pytest.raises(ValueError, match="outside split"):
        shapes.ShapesDataset("heldout", len(shapes.SPLITS["heldout"]) + 1)
