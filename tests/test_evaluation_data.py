"""The real-data loaders on tiny files in the real formats, the zoo held-out sets, and
`explain evaluate` from the command line."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
from evaluation_fixtures import MEAN, STD, SquaresDataset, squares_model
from PIL import Image

from explain.cli import main
from explain.errors import InputError
from explain.evaluation.datasets import EraserMovies, ImageNetFolder, ImageNetSegmentation
from explain.evaluation.datasets.zoo import SentimentHeldout, ShapesHeldout
from explain.evaluation.zoo import heldout_dataset
from explain.loading.zoo import save_zoo_model

# -- ImageNet validation folder ----------------------------------------------------------


def write_imagenet_folder(root, examples):
    """examples: (wnid, file name, (H, W, 3) uint8)."""
    for wnid, name, pixels in examples:
        (root / wnid).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(root / wnid / name)


def test_imagenet_folder_labels_by_sorted_class_folder(tmp_path):
    red = np.zeros((6, 4, 3), dtype=np.uint8)
    red[..., 0] = 255
    grey = np.full((5, 5, 3), 128, dtype=np.uint8)
    write_imagenet_folder(
        tmp_path,
        [("n02", "b.png", grey), ("n01", "a.png", red), ("n02", "c.JPEG", grey)],
    )
    (tmp_path / "n02" / "notes.txt").write_text("not an image")
    dataset = ImageNetFolder(tmp_path, size=(8, 8))
    assert dataset.classes == ["n01", "n02"]
    assert len(dataset) == 3
    assert [dataset[i].label for i in range(3)] == [0, 1, 1]
    first = dataset[0]
    assert first.image.shape == (3, 8, 8) and first.mask is None
    # resized (float32 interpolation), still red, in [0, 1]
    assert torch.allclose(first.image[0], torch.ones(8, 8), rtol=1e-4)
    assert torch.allclose(first.image[1:], torch.zeros(2, 8, 8))
    assert dataset[1].image.mean().item() == pytest.approx(128 / 255, abs=1e-6)


def test_imagenet_folder_errors(tmp_path):
    with pytest.raises(InputError, match="not found"):
        ImageNetFolder(tmp_path / "missing")
    with pytest.raises(InputError, match="no class subfolders"):
        ImageNetFolder(tmp_path)


# -- ImageNet-segmentation gtsegs_ijcv.mat -----------------------------------------------


def write_gtsegs(path, images, masks):
    """A MATLAB v7.3 file laid out like gtsegs_ijcv.mat: column-major arrays behind
    object references, the masks one more cell deep."""
    with h5py.File(path, "w") as handle:
        refs = handle.create_group("#refs#")
        image_refs, cell_refs = [], []
        for i, (image, mask) in enumerate(zip(images, masks, strict=True)):
            image_refs.append(refs.create_dataset(f"i{i}", data=image.transpose(2, 1, 0)).ref)
            mask_ref = refs.create_dataset(f"m{i}", data=mask.T).ref
            cell = refs.create_dataset(f"c{i}", data=np.array([[mask_ref]], dtype=h5py.ref_dtype))
            cell_refs.append(cell.ref)
        handle.create_dataset("value/img", data=np.array([[r] for r in image_refs], h5py.ref_dtype))
        handle.create_dataset("value/gt", data=np.array([[r] for r in cell_refs], h5py.ref_dtype))


def test_imagenet_segmentation_reads_images_and_masks_through_references(tmp_path):
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (6, 10, 3), dtype=np.uint8) for _ in range(2)]
    masks = [(rng.random((6, 10)) < 0.4).astype(np.uint8) for _ in range(2)]
    path = tmp_path / "gtsegs_ijcv.mat"
    write_gtsegs(path, images, masks)
    same_size = ImageNetSegmentation(path, size=(6, 10))
    assert len(same_size) == 2
    for index in range(2):
        example = same_size[index]
        expected = torch.from_numpy(images[index]).permute(2, 0, 1).float() / 255
        assert torch.allclose(example.image, expected, rtol=1e-4)  # float32 scaling
        assert torch.equal(example.mask, torch.from_numpy(masks[index]).long())
    resized = ImageNetSegmentation(path, size=(12, 20))[1]
    assert resized.image.shape == (3, 12, 20)
    # nearest-neighbour doubling: every mask pixel becomes a 2 x 2 block
    assert torch.equal(resized.mask[::2, ::2], torch.from_numpy(masks[1]).long())


def test_imagenet_segmentation_rejects_other_files(tmp_path):
    path = tmp_path / "other.mat"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("x", data=np.zeros(3))
    with pytest.raises(InputError, match="gtsegs_ijcv"):
        ImageNetSegmentation(path)


# -- ERASER movie reviews ----------------------------------------------------------------


def write_eraser(root):
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "negR_000.txt").write_text("this film is dull .\nthe plot is a mess .\n")
    (root / "docs" / "posR_001.txt").write_text("a lovely , warm film .\n")
    annotations = [
        {
            "annotation_id": "negR_000.txt",
            "classification": "NEG",
            "evidences": [
                [{"docid": "negR_000.txt", "start_token": 3, "end_token": 4, "text": "dull"}],
                [{"docid": "negR_000.txt", "start_token": 8, "end_token": 10, "text": "a mess"}],
            ],
            "query": "What is the sentiment of this review?",
        },
        {
            "annotation_id": "posR_001.txt",
            "classification": "POS",
            "evidences": [[{"docid": "posR_001.txt", "start_token": 1, "end_token": 2}]],
        },
    ]
    (root / "test.jsonl").write_text("\n".join(json.dumps(a) for a in annotations) + "\n")


def test_eraser_movies_reads_words_labels_and_evidence_spans(tmp_path):
    write_eraser(tmp_path)
    dataset = EraserMovies(tmp_path)
    assert len(dataset) == 2
    first = dataset[0]
    assert first.words == ("this", "film", "is", "dull", ".", "the", "plot", "is", "a", "mess", ".")
    assert first.label == 0
    assert [w for w, r in zip(first.words, first.rationale, strict=True) if r] == [
        "dull",
        "a",
        "mess",
    ]
    assert dataset[1].label == 1 and dataset[1].rationale == (
        False,
        True,
        False,
        False,
        False,
        False,
    )


def test_eraser_errors_name_the_problem(tmp_path):
    with pytest.raises(InputError, match=r"test\.jsonl"):
        EraserMovies(tmp_path)
    write_eraser(tmp_path)
    with pytest.raises(InputError, match="classification 'NEG'"):
        EraserMovies(tmp_path, classes=("negative", "positive"))


# -- zoo held-out sets -------------------------------------------------------------------


def test_shapes_heldout_scenes_hold_one_object_from_heldout_seeds():
    from explain.data import shapes

    dataset = ShapesHeldout(length=5, size=64)
    examples = [dataset[i] for i in range(5)]
    seeds = [dataset.seed(i) for i in range(5)]
    assert all(seed in shapes.SPLITS["heldout"] for seed in seeds)
    for example, seed in zip(examples, seeds, strict=True):
        scene = shapes.render_scene(seed, 64)
        assert scene.kinds == (example.label,)
        assert torch.equal(example.mask.bool(), torch.from_numpy(scene.masks[0]))
    assert torch.equal(ShapesHeldout(length=5)[4].image, examples[4].image)  # by index, any order


def test_sentiment_heldout_rationale_is_the_deciding_words():
    example = SentimentHeldout(length=3)[2]
    chosen = {w for w, r in zip(example.words, example.rationale, strict=True) if r}
    from explain.data import sentiment

    assert chosen and chosen <= set(sentiment.POSITIVE) | set(sentiment.NEGATIVE) | {"not"}
    with pytest.raises(Exception, match="no built-in evaluation set"):
        heldout_dataset("zoo:unknown")


# -- the command line --------------------------------------------------------------------


@pytest.fixture
def tiny_model_folder(tmp_path):
    config = {
        "builder": "timm_vit",
        "timm": dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=4),
        "modality": "image",
        "classes": ["a", "b", "c", "d"],
        "preprocessing": {"image_size": [32, 32], "mean": list(MEAN), "std": list(STD)},
    }
    folder = tmp_path / "model"
    save_zoo_model(folder, squares_model(), config)
    return folder


def test_evaluate_command_on_an_imagenet_folder_and_a_gtsegs_file(tiny_model_folder, tmp_path):
    squares = SquaresDataset(5)
    as_uint8 = [(e.image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8) for e in squares]
    write_imagenet_folder(
        tmp_path / "val",
        [
            (f"n{e.label}", f"{i}.png", pixels)
            for i, (e, pixels) in enumerate(zip(squares, as_uint8, strict=True))
        ],
    )
    output = tmp_path / "results" / "perturbation.json"
    status = main(
        ["evaluate", "perturbation", "--model", str(tiny_model_folder), "--data",
         str(tmp_path / "val"), "--method", "generic,rollout", "--batch-size", "2",
         "--limit", "4", "--output", str(output), "--quiet"]
    )  # fmt: skip
    assert status == 0
    results = json.loads(output.read_text())
    assert (results["protocol"], results["n"], list(results["results"])) == (
        "perturbation",
        4,
        ["generic", "rollout"],
    )
    assert output.with_suffix(".md").exists() and output.with_suffix(".png").exists()

    path = tmp_path / "gtsegs_ijcv.mat"
    write_gtsegs(path, as_uint8, [e.mask.numpy().astype(np.uint8) for e in squares])
    output = tmp_path / "results" / "segmentation.json"
    status = main(
        ["evaluate", "segmentation", "--model", str(tiny_model_folder), "--data", str(path),
         "--method", "random", "--output", str(output), "--quiet"]
    )  # fmt: skip
    assert status == 0
    summary = json.loads(output.read_text())["results"]["random"]
    assert 0.0 <= summary["miou"] <= 1.0 and 0.0 <= summary["map"] <= 1.0
    assert summary["accuracy"] is None  # the file holds masks, not labels


def test_evaluate_command_runs_road_and_saco_on_an_imagenet_folder(tiny_model_folder, tmp_path):
    squares = SquaresDataset(4)
    write_imagenet_folder(
        tmp_path / "val",
        [
            (f"n{e.label}", f"{i}.png", (e.image.permute(1, 2, 0).numpy() * 255).astype(np.uint8))
            for i, e in enumerate(squares)
        ],
    )
    for protocol, keys in (("road", ("morf_auc", "lerf_auc")), ("saco", ("saco",))):
        output = tmp_path / "results" / f"{protocol}.json"
        status = main(
            ["evaluate", protocol, "--model", str(tiny_model_folder), "--data",
             str(tmp_path / "val"), "--method", "generic,random", "--batch-size", "3",
             "--output", str(output), "--quiet"]
        )  # fmt: skip
        assert status == 0
        results = json.loads(output.read_text())
        assert (results["protocol"], results["n"]) == (protocol, 4)
        for summary in results["results"].values():
            assert all(isinstance(summary[key], float) for key in keys)
            assert set(summary["standard_errors"]) == set(keys)
        assert output.with_suffix(".md").exists() and output.with_suffix(".png").exists()


def test_evaluate_command_errors_are_one_line(tiny_model_folder, tmp_path, capsys):
    status = main(
        ["evaluate", "rationale", "--model", str(tiny_model_folder), "--output",
         str(tmp_path / "r.json")]
    )  # fmt: skip
    assert status == 2
    assert "the rationale test is for text models" in capsys.readouterr().err
    status = main(
        ["evaluate", "perturbation", "--model", str(tiny_model_folder), "--output",
         str(tmp_path / "r.json")]
    )  # fmt: skip
    assert status == 2
    assert "no built-in evaluation set" in capsys.readouterr().err
