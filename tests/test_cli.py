"""The `explain` command line: arguments, outputs, errors, exit codes and atomic writes."""

from __future__ import annotations

import argparse
import json
import os
import re

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from explain import Explainer
from explain.cli import build_parser, main
from explain.cli.image import parse_targets, unique_stems
from explain.errors import TargetError
from explain.loading.preprocessing import load_images
from explain.testing import tiny_vit
from explain.viz import heatmap_figure, overlay, save_figure

CLASSES = ["circle", "square", "tabby, tabby cat"]
MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
TIMM_ARGS = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A model folder laid out like the zoo's: config.json and model.safetensors."""
    folder = tmp_path_factory.mktemp("model")
    model = tiny_vit(**TIMM_ARGS)
    config = {
        "builder": "timm_vit",
        "timm": TIMM_ARGS,
        "modality": "image",
        "classes": CLASSES,
        "preprocessing": {"image_size": [32, 32], "mean": list(MEAN), "std": list(STD)},
    }
    (folder / "config.json").write_text(json.dumps(config))
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors"
    )
    return folder


def _write_images(folder, count, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for index in range(count):
        path = folder / f"image{index}.png"
        Image.fromarray(rng.integers(0, 256, (36 + 4 * index, 40, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def _run(capsys, *argv):
    status = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_help_documents_every_option():
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in commands.choices.items():
        text = command.format_help()
        for action in command._actions:
            # A positional with choices documents itself: argparse lists them in the usage.
            documented = action.help or (not action.option_strings and action.choices)
            assert documented, f"`explain {name}` option {action.dest} has no help"
            for option in action.option_strings:
                assert option in text
            # Every option that has a default says what it is (flags default to off).
            if action.default not in (None, False, argparse.SUPPRESS) and action.help:
                assert "default" in action.help, f"`explain {name}` {action.dest}: no default"


def test_no_arguments_print_the_commands_and_a_hint(capsys):
    status, out, err = _run(capsys)
    assert status == 2 and out == ""
    for command in ("clip", "detect", "evaluate", "generate", "image", "models", "text"):
        assert re.search(rf"^    {command} +\w", err, flags=re.MULTILINE), command
    assert "Start with `explain models`" in err and "explain COMMAND --help" in err


@pytest.mark.parametrize("columns", ["60", "80", "100", "132"])
def test_help_never_breaks_a_line_inside_a_hyphenated_word(monkeypatch, columns):
    # argparse wraps with textwrap, which breaks after hyphens: "hf-hub:org/name" came
    # out as "hf- hub:" once the line was re-wrapped.
    monkeypatch.setenv("COLUMNS", columns)
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in commands.choices.items():
        text = command.format_help()
        assert not re.search(r"\w-\n\s*\w", text), name
        assert "hf- " not in text, name
        if any("--model" in action.option_strings for action in command._actions):
            assert "org/name[@revision]" in text, name  # whole, never split


def test_version(capsys):
    from explain import __version__

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"explain {__version__}"


def test_image_save_writes_the_raw_explanation(capsys, tmp_path, model_folder):
    from explain import Explanation

    paths = _write_images(tmp_path / "in", 2)
    out = tmp_path / "out"
    status, stdout, _ = _run(
        capsys, "image", *paths, "--model", model_folder, "--method", "generic,rollout",
        "--target", "top,2", "--save", "npz", "--out", out,
    )  # fmt: skip
    assert status == 0
    model = tiny_vit(**TIMM_ARGS)
    images, _ = load_images(paths, size=(32, 32), mean=MEAN, std=STD)
    for i, path in enumerate(paths):
        for method in ("generic", "rollout"):
            saved = Explanation.load(out / f"image{i}_{method}.npz")
            assert str(out / f"image{i}_{method}.npz") in stdout.split()
            top = int(model(images[i : i + 1]).argmax())
            alone = Explainer(model).explain(
                images[i : i + 1], target=torch.tensor([[top, 2]]), method=method
            )
            torch.testing.assert_close(saved.relevance, alone.relevance)
            assert saved.target.tolist() == [[top, 2]] and saved.method == method
            assert saved.settings == {"model": str(model_folder), "input": str(path)}


def test_models_lists_the_zoo_families_and_methods(capsys):
    from explain.loading.zoo import ZOO
    from explain.rules import METHODS

    status, out, _ = _run(capsys, "models")
    assert status == 0
    for name, entry in ZOO.items():
        assert f"zoo:{name}" in out and entry.summary in out
    assert "timm VisionTransformer" in out
    for method in METHODS:
        assert method in out


def test_models_lists_the_methods_each_family_takes(capsys):
    from explain.architectures import adapter_for
    from explain.architectures.registry import FAMILIES
    from explain.engine import supported_methods
    from explain.testing import TINY_MODELS

    status, out, _ = _run(capsys, "models")
    assert status == 0
    lines = out.splitlines()
    listed = {
        line.strip(): lines[i + 1].strip().removeprefix("methods: ").split(", ")
        for i, line in enumerate(lines[:-1])
        if lines[i + 1].strip().startswith("methods: ")
    }
    swin = "timm SwinTransformer and SwinTransformerV2 (windowed attention, mean-pooled)"
    assert listed[swin] == ["attention_gradcam", "generic", "random", "raw_attention", "rollout"]
    # Each family's line says what its models take: what the engine accepts for the
    # family's tiny model (a model of it, not its declarations read another way).
    for name, family in FAMILIES.items():
        adapter = adapter_for(TINY_MODELS[name]().model)
        assert listed[family.load().family] == supported_methods(adapter), name
    assert len(listed) == len(FAMILIES) + 1  # and your own transformer (TransformerSpec)


def test_image_all_methods_runs_every_method_the_model_takes(capsys, tmp_path):
    from explain.data import shapes
    from explain.viz import save_image

    save_image(shapes.ShapesDataset("heldout", 1).scene(0).image, tmp_path / "scene.png")
    out = tmp_path / "out"
    status, _, err = _run(
        capsys, "image", tmp_path / "scene.png", "--model", "zoo:shapes-swin", "--method", "all",
        "--target", "0", "--out", out,
    )  # fmt: skip
    assert status == 0
    written = sorted(path.name for path in out.iterdir())
    taken = ("attention_gradcam", "generic", "random", "raw_attention", "rollout")
    assert written == [f"scene_{method}_0-circle.png" for method in taken]
    refused = (
        "attnlrp, cp_lrp, gradient_x_input, integrated_gradients, lrp, occlusion, "
        "partial_lrp, smoothgrad, transformer_attribution"
    )
    assert f"--method all: zoo:shapes-swin does not take {refused} (its attention is" in err
    # a method named on its own is refused, naming those the model takes, before any file
    status, _, err = _run(
        capsys, "image", tmp_path / "scene.png", "--model", "zoo:shapes-swin", "--method",
        "generic,attnlrp", "--out", tmp_path / "named",
    )  # fmt: skip
    supported = "attention_gradcam, generic, random, raw_attention, rollout"
    assert status == 2 and "does not take attnlrp (its attention is windowed" in err
    assert err.endswith(f"; it takes {supported}\n")
    assert not (tmp_path / "named").exists() or not any((tmp_path / "named").iterdir())


def test_image_writes_one_overlay_per_image_method_and_class(capsys, tmp_path, model_folder):
    paths = _write_images(tmp_path / "in", 3)
    out = tmp_path / "out"
    status, stdout, _ = _run(
        capsys, "image", tmp_path / "in", "--model", model_folder, "--method", "generic,rollout",
        "--target", "square,TABBY CAT", "--batch-size", "2", "--out", out, "--alpha", "0.4",
        "--bare", "--background", "colour",
    )  # fmt: skip
    assert status == 0
    labels = ["1-square", "2-tabby"]
    expected = {
        f"image{i}_{m}_{label}.png"
        for i in range(3)
        for m in ("generic", "rollout")
        for label in labels
    }
    assert {p.name for p in out.iterdir()} == expected
    written = [line for line in stdout.splitlines() if line.startswith(str(out))]
    assert sorted(written) == sorted(str(out / name) for name in expected)
    predicted = [line for line in stdout.splitlines() if line not in written]
    assert sorted(line.split(": ")[0] for line in predicted) == sorted(map(str, paths))

    # Each file is its own image's map (batches do not mix), drawn at the file's resolution.
    model = tiny_vit(**TIMM_ARGS)
    images, _ = load_images(paths, size=(32, 32), mean=MEAN, std=STD)
    result = Explainer(model).explain(images, target=torch.tensor([[1, 2]] * 3))
    for i, path in enumerate(paths):
        display = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255.0
        height, width = display.shape[:2]
        for k, label in enumerate(labels):
            single = Explainer(model).explain(images[i : i + 1], target=[1, 2][k])
            heat = single.heatmap(size=(height, width))[0]
            with Image.open(out / f"image{i}_generic_{label}.png") as saved:
                assert saved.size == (width, height)
                pixels = np.asarray(saved, dtype=np.float32) / 255.0
            expected = overlay(display, heat, alpha=0.4, background="colour")
            assert np.abs(pixels - expected).max() < 2 / 255
    assert result.relevance.shape == (3, 2, 4, 4)
    # Written through a private temporary file, yet as readable as any file the user writes.
    mask = os.umask(0o022)
    os.umask(mask)
    assert all((p.stat().st_mode & 0o777) == (0o666 & ~mask) for p in out.iterdir())


def test_image_maps_are_figures_that_state_their_scale(capsys, tmp_path, model_folder):
    paths = _write_images(tmp_path / "in", 1)
    out = tmp_path / "out"
    status, _, _ = _run(
        capsys, "image", *paths, "--model", model_folder, "--target", "square", "--out", out
    )  # fmt: skip
    assert status == 0
    written = out / "image0_generic_1-square.png"
    # The same figure heatmap_figure draws: the map over the image in grey, the method and
    # class as its title, a colour key and the normalisation rule.
    model = tiny_vit(**TIMM_ARGS)
    images, _ = load_images(paths, size=(32, 32), mean=MEAN, std=STD)
    display = np.asarray(Image.open(paths[0]).convert("RGB"))
    result = Explainer(model).explain(images, target=1)
    relevance = result.heatmap(size=display.shape[:2], normalize=False)[0]
    rank = int((result.logits[0] > result.logits[0, 1]).sum()) + 1
    title = "generic: square (class 1), " + {1: "predicted", 2: "ranked 2nd", 3: "ranked 3rd"}[rank]
    figure = heatmap_figure(display, relevance, title=title)
    assert [t.get_text() for t in figure.axes[0].texts] == []
    save_figure(figure, tmp_path / "expected.png")
    with Image.open(written) as saved, Image.open(tmp_path / "expected.png") as expected:
        assert saved.size == expected.size and saved.size[0] > display.shape[1]
        difference = np.abs(np.asarray(saved, dtype=float) - np.asarray(expected, dtype=float))
        assert difference.max() <= 2


def test_image_top_targets_follow_each_images_prediction(capsys, tmp_path, model_folder):
    paths = _write_images(tmp_path / "in", 2, seed=5)
    out = tmp_path / "out"
    status, _, _ = _run(
        capsys, "image", *paths, "--model", model_folder, "--target", "top,top3", "--out", out,
        "--grid",
    )  # fmt: skip
    assert status == 0
    images, _ = load_images(paths, size=(32, 32), mean=MEAN, std=STD)
    order = tiny_vit(**TIMM_ARGS)(images).argsort(dim=-1, descending=True)
    names = {p.name for p in out.iterdir()}
    for i in range(2):
        for rank in (0, 2):
            index = order[i, rank].item()
            label = ["circle", "square", "tabby"][index]
            assert f"image{i}_generic_{index}-{label}.png" in names
        assert f"image{i}_grid.png" in names
        with Image.open(out / f"image{i}_grid.png") as grid:
            assert grid.format == "PNG" and grid.size[0] > 300


def test_same_file_names_in_two_folders_do_not_overwrite_each_other(capsys, tmp_path, model_folder):
    _write_images(tmp_path / "a", 1)
    _write_images(tmp_path / "b", 1, seed=1)
    out = tmp_path / "out"
    status, _, _ = _run(
        capsys, "image", tmp_path / "a", tmp_path / "b", "--model", model_folder, "--target", "0",
        "--out", out,
    )  # fmt: skip
    assert status == 0
    assert {p.name for p in out.iterdir()} == {
        "image0_generic_0-circle.png",
        "image0-2_generic_0-circle.png",
    }


def test_output_names_are_unique_for_any_set_of_inputs(capsys, tmp_path, model_folder):
    pixels = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    inputs = [tmp_path / name for name in ("a.png", "a.jpg", "a-2.png", "a.bmp")]
    for path in inputs:
        Image.fromarray(pixels).save(path)
    assert unique_stems(inputs) == ["a", "a-3", "a-2", "a-4"]
    assert unique_stems(inputs) == unique_stems(list(inputs))  # stable
    out = tmp_path / "out"
    status, _, _ = _run(
        capsys, "image", *inputs, "--model", model_folder, "--target", "0", "--save", "npz",
        "--out", out,
    )  # fmt: skip
    assert status == 0
    assert len(list(out.glob("*.npz"))) == len(inputs)
    assert len(list(out.glob("*.png"))) == len(inputs)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("top", [("top", 1)]),
        ("top2,Top3", [("top", 2), ("top", 3)]),
        ("2,circle", [("class", 2), ("class", 0)]),
        ("tabby cat", [("class", 2)]),
        ("Tabby", [("class", 2)]),
        ("circle,0,top,top1", [("class", 0), ("top", 1)]),  # each column once
    ],
)
def test_parse_targets(text, expected):
    assert parse_targets(text, CLASSES, 3) == expected


@pytest.mark.parametrize(
    ("text", "classes", "message"),
    [
        ("3", CLASSES, r"out of range: the model has 3 classes \(0\.\.2\)"),
        ("-1", CLASSES, "out of range"),
        ("top4", CLASSES, r"top1\.\.top3"),
        ("squar", CLASSES, "did you mean square"),
        ("hexagon", CLASSES, "the classes are circle, square"),
        ("circle,", CLASSES, "empty entry"),
        ("cat", None, "no class names; give a class index"),
        ("cat", ["cat", "cat"], "names several classes"),
        ("²", CLASSES, "not a class of this model"),  # a digit to isdigit(), not to int()
        ("1²", CLASSES, "not a class of this model"),
    ],
)
def test_parse_targets_errors(text, classes, message):
    with pytest.raises(TargetError, match=message):
        parse_targets(text, classes, 3)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["{missing}"], "no such file or folder"),
        (["{empty}"], "holds no images"),
        (["{images}", "--method", "gradcam"], "unknown method 'gradcam'; known methods:"),
        (["{images}", "--method", "generc"], r"unknown method 'generc'; did you mean generic\?"),
        (["{images}", "--model", "zoo:nope"], "unknown zoo model 'nope'"),
        (["{images}", "--model", "{nowhere}"], "is not a zoo model"),
        (["{images}", "--target", "hexagon"], "not a class of this model"),
        (["{images}", "--cmap", "nocolours"], "unknown colormap"),
    ],
)
def test_errors_are_one_line_with_exit_status_2(capsys, tmp_path, model_folder, arguments, message):
    images = _write_images(tmp_path / "in", 1)[0]
    (tmp_path / "empty").mkdir()
    places = {
        "missing": tmp_path / "missing.png",
        "empty": tmp_path / "empty",
        "images": images,
        "nowhere": "no_such_model_name",
    }
    argv = ["image", *[a.format(**places) for a in arguments], "--out", tmp_path / "out"]
    if "--model" not in arguments:
        argv += ["--model", model_folder]
    status, stdout, stderr = _run(capsys, *argv)
    assert status == 2
    assert stderr.startswith("explain: error: ")
    assert stderr.strip().count("\n") == 0  # one line: every check runs before the work
    assert re.search(message, stderr)
    assert stdout == ""
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize(
    ("command", "typo", "meant"),
    [
        ("image", "--metod", "--method"),
        ("generate", "--metod", "--method"),
        ("text", "--mdoel", "--model"),
    ],
)
def test_an_unknown_flag_gets_did_you_mean(capsys, command, typo, meant):
    with pytest.raises(SystemExit) as exit:
        main([command, "in", "--model", "zoo:shapes-vit", typo, "x"])
    assert exit.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(
        f"explain: error: unrecognized arguments: {typo} x ({typo}: did you mean"
    )
    assert meant in last.split("did you mean", 1)[1]


def test_a_mistyped_method_flag_with_a_method_name_gets_the_flags_hint_only(capsys):
    # argparse leaves both `--metod` and its value `generic` unparsed, and no --method is set
    with pytest.raises(SystemExit) as exit:
        main(["generate", "x", "--model", "zoo:recall-llama", "--metod", "generic"])
    assert exit.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "explain: error: unrecognized arguments: --metod generic "
        "(--metod: did you mean --method, --model?)"
    )


def test_an_argument_far_from_any_flag_gets_no_suggestion(capsys):
    with pytest.raises(SystemExit):
        main(["models", "extra"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "explain: error: unrecognized arguments: extra"
    )


def test_a_text_model_is_sent_to_explain_text(capsys, tmp_path):
    image = _write_images(tmp_path / "in", 1)[0]
    status, _, stderr = _run(capsys, "image", image, "--model", "zoo:minilm-sentiment")
    assert status == 2
    last = stderr.strip().splitlines()[-1]  # after transformers' own loading bar
    assert last == "explain: error: zoo:minilm-sentiment is a text model; use `explain text`"


@pytest.mark.parametrize(
    "arguments",
    [["--batch-size", "0"], ["--alpha", "1.5"], ["--score", "energy"], []],
)
def test_bad_arguments_exit_with_usage(tmp_path, model_folder, arguments):
    argv = ["image", str(tmp_path), *arguments]
    if arguments:
        argv += ["--model", str(model_folder)]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2


def test_a_failing_batch_leaves_earlier_files_whole_and_no_partial_file(
    capsys, tmp_path, model_folder
):
    folder = tmp_path / "in"
    _write_images(folder, 2)
    (folder / "image2.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    out = tmp_path / "out"
    status, _, stderr = _run(
        capsys, "image", folder, "--model", model_folder, "--batch-size", "2", "--out", out
    )
    assert status == 2
    assert "cannot read" in stderr and "image2.png" in stderr
    assert stderr.strip().splitlines()[-1].startswith("explain: error: ")
    names = sorted(p.name for p in out.iterdir())  # no .partial file among them
    assert len(names) == 2
    assert names[0].startswith("image0_generic_") and names[1].startswith("image1_generic_")
    for name in names:
        with Image.open(out / name) as saved:
            saved.load()  # a complete PNG


def test_a_failure_while_writing_leaves_no_file(monkeypatch, tmp_path, model_folder):
    _write_images(tmp_path / "in", 1)
    out = tmp_path / "out"

    def broken_save(self, handle, *args, **kwargs):
        handle.write(b"\x89PNG half a file")
        raise OSError("disk full")

    monkeypatch.setattr(Image.Image, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        main(["image", str(tmp_path / "in"), "--model", str(model_folder), "--out", str(out)])
    assert list(out.iterdir()) == []


def test_image_notes_that_a_fixed_block_method_ignores_the_start_layer(
    model_folder, tmp_path, capsys
):
    image = _write_images(tmp_path / "in", 1)[0]
    out = tmp_path / "maps"
    argv = ["image", image, "--model", model_folder, "--out", out]
    status, _, err = _run(capsys, *argv, "--method", "raw_attention", "--start-layer", "1")
    assert status == 0
    assert err.splitlines()[0] == (
        "explain: note: raw_attention reads one fixed block; --start-layer is ignored for it"
    )
    assert len(list(out.glob("image0_raw_attention_*.png"))) == 1


def test_image_gives_the_score_only_to_the_methods_that_differentiate_one(
    model_folder, tmp_path, capsys
):
    from explain import METHODS

    image = _write_images(tmp_path / "in", 1)[0]
    out = tmp_path / "maps"
    argv = ["image", image, "--model", model_folder, "--out", out]
    status, _, err = _run(capsys, *argv, "--method", "all", "--score", "probability")
    assert status == 0
    notes = [line for line in err.splitlines() if "--score" in line]
    assert notes == [
        f"explain: note: {name} differentiates no score; --score is ignored for it"
        for name, method in sorted(METHODS.items())
        if not method.takes_score
    ]
    assert len(notes) >= 3  # raw_attention, rollout, random at least
    assert {path.name.split("_")[1] for path in out.glob("*.png")} >= {"generic", "rollout"}


@pytest.mark.parametrize(
    ("option", "destination", "message"),
    [
        ("--out", lambda tmp: tmp / "file.txt" / "maps", "file.txt is a file, not a folder"),
        ("--out", lambda tmp: tmp / "file.txt", "file.txt is a file, not a folder"),
        ("--out", lambda tmp: "/proc/x", "/proc/x cannot be"),
        ("--html", lambda tmp: tmp, "is a folder; give a file name"),
        ("--html", lambda tmp: tmp / "file.txt" / "page.html", "file.txt is a file, not a"),
        ("--output", lambda tmp: tmp / "file.txt" / "r.json", "file.txt is a file, not a"),
    ],
)
def test_unwritable_outputs_fail_before_any_work(tmp_path, capsys, option, destination, message):
    (tmp_path / "file.txt").write_text("a file")
    command = {
        "--out": ["image", tmp_path / "file.txt"],
        "--html": ["text", "a text"],
        "--output": ["evaluate", "perturbation"],
    }[option]
    # The model does not exist: the destination must be refused before it is looked for.
    argv = [*command, "--model", "zoo:no-such-model", option, destination(tmp_path)]
    status, out, err = _run(capsys, *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"explain: error: {option} ")
    assert message in err


def test_dollar_signs_in_class_names_do_not_break_the_grid(capsys, tmp_path, model_folder):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(model_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config["classes"] = ["a $\\x$ b", "$5 note", "tabby, tabby cat"]
    (folder / "config.json").write_text(json.dumps(config))
    _write_images(tmp_path / "images", 1)
    out = tmp_path / "out"
    argv = ["image", tmp_path / "images", "--model", folder, "--target", "0,1", "--grid"]
    status, _, err = _run(capsys, *argv, "--out", out)
    assert status == 0, err
    assert (out / "image0_grid.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("command", "blocked", "message"),
    [
        (
            ["image", "{images}", "--save", "npz", "--method", "generic"],
            "out/image0_generic.npz/",
            "--save",
        ),
        (["image", "{images}", "--grid"], "out/image1_grid.png/", "--grid"),
        (["clip", "{images}", "--text", "a"], "out/image0_clip.png/", "--out"),
        (
            ["text", "a", "--save", "json", "--method", "generic,rollout"],
            "out/text_rollout.json/",
            "--save",
        ),
        (["generate", "a", "--html", "{tmp}/page.html"], "page.png/", "--html"),
        (["generate", "a", "--png", "{tmp}/fig"], "fig/", "--png"),
        (["generate", "a", "--save", "npz"], "out/generation.npz/", "--save"),
        (["seq2seq", "a"], "out/seq2seq_source.png/", "--out"),
        (["evaluate", "perturbation", "--output", "{tmp}/r.json"], "r.md/", "--output"),
        (["evaluate", "perturbation", "--output", "{tmp}/r.json"], "r.png/", "--output"),
        (["evaluate", "perturbation", "--output", "{tmp}/r.json"], "r.json.parts", "--output"),
    ],
)
def test_every_planned_output_is_checked_before_any_work(
    tmp_path, capsys, command, blocked, message
):
    """Each output a command names from its arguments: a folder where a file goes (or a
    file where its work folder goes) is refused before the model is even looked for."""
    _write_images(tmp_path / "images", 2)
    blocker = tmp_path / blocked.rstrip("/")
    if blocked.endswith("/"):
        blocker.mkdir(parents=True)
    else:
        blocker.write_text("a file")
    filled = [part.format(images=tmp_path / "images", tmp=tmp_path) for part in command]
    argv = [*filled, "--model", "zoo:no-such-model"]
    if command[0] != "evaluate":
        argv += ["--out", tmp_path / "out"]
    status, out, err = _run(capsys, *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"explain: error: {message} ")
    assert blocker.name in err


def test_atomic_write_refuses_a_folder_with_a_clear_error(tmp_path):
    from explain.errors import InputError
    from explain.export import atomic_write

    (tmp_path / "taken").mkdir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="is a folder"), atomic_write(tmp_path / "taken"):
        pass
    with (
        pytest.raises(InputError, match="a file is in the way"),
        atomic_write(tmp_path / "file" / "x"),
    ):
        pass


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["evaluate", "perturbation", "--method", ",", "--output", "r.json"],
            "empty entry in --method",
        ),
        (
            ["evaluate", "perturbation", "--methods", "generic,", "--output", "r.json"],
            "empty entry",
        ),
        (["image", "x.png", "--method", ","], "empty entry in --method"),
        (["clip", "{image}", "--text", "a", "--text", " "], "a --text is empty"),
    ],
)
def test_empty_entries_are_refused_not_read_as_every_method(tmp_path, capsys, argv, message):
    _write_images(tmp_path / "images", 1)
    filled = [part.format(image=tmp_path / "images" / "image0.png") for part in argv]
    status, _, err = _run(capsys, *filled, "--model", "zoo:no-such-model")
    assert status == 2 and message in err


@pytest.mark.parametrize(("rank", "printed"), [("0", True), ("3", False)])
def test_under_torchrun_only_rank_zero_reports_an_error(capsys, monkeypatch, rank, printed):
    """torchrun starts N copies that check the same arguments: one line, not N."""
    monkeypatch.setenv("RANK", rank)
    status, _, err = _run(capsys, "image", "missing.png", "--model", "zoo:shapes-vit")
    assert status == 2
    assert err.count("explain: error: no such file or folder: missing.png") == int(printed)
    assert err.count("\n") == int(printed)


@pytest.mark.parametrize(
    ("command", "offers_timm"),
    [("image", True), ("serve", True), ("cite", False), ("generate", False), ("text", False)],
)
def test_model_help_offers_timm_only_where_a_timm_model_is_taken(command, offers_timm):
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(commands.choices[command].format_help().split())
    assert ("a timm model name" in text) == offers_timm
    assert "zoo:NAME" in text


def test_multi_label_titles_and_the_prediction_give_each_class_its_probability():
    import math

    from explain.viz.image import class_label, prediction

    names = ["circle", "square", "star"]
    logits = torch.tensor([4.4, -3.0, 0.5])
    present = [1 / (1 + math.exp(-v)) for v in logits.tolist()]  # sigmoid by hand
    assert class_label(0, names, logits, multi_label=True) == (
        f"circle (class 0), present {present[0]:.1%}"
    )
    assert class_label(1, names, logits, multi_label=True).endswith(f"present {present[1]:.1%}")
    assert class_label(1, names, logits) == "square (class 1), ranked 3rd"
    assert prediction(logits, names, multi_label=True) == (
        f"present: circle (class 0) {present[0]:.1%}, star (class 2) {present[2]:.1%}"
    )
    assert prediction(torch.tensor([-2.0, -1.0, -4.0]), names, multi_label=True) == (
        f"none present (likeliest: square (class 1) {1 / (1 + math.exp(1)):.1%})"
    )
    softmax = torch.tensor([4.4, -3.0, 0.5]).softmax(-1)
    assert prediction(logits, names, multi_label=False) == f"circle (class 0) {softmax[0]:.1%}"


def test_image_prints_each_images_prediction(capsys, tmp_path, model_folder):
    paths = _write_images(tmp_path / "in", 2)
    status, out, _ = _run(capsys, "image", *paths, "--model", model_folder, "--out", tmp_path / "o")
    assert status == 0
    model = tiny_vit(**TIMM_ARGS)
    images, _ = load_images(paths, size=(32, 32), mean=MEAN, std=STD)
    with torch.no_grad():
        probabilities = model(images).softmax(-1)
    for path, row in zip(paths, probabilities, strict=True):
        top = int(row.argmax())
        line = next(line for line in out.splitlines() if line.startswith(f"{path}: "))
        assert line.endswith(f"(class {top}) {float(row[top]):.1%}")


def test_image_heads_a_class_agnostic_method_as_the_figures_do(
    capsys, tmp_path, model_folder, monkeypatch
):
    """`explain image --grid` heads rollout's row and its maps' titles "rollout
    (class-agnostic)" (method_label) and its grid's caption says what the mark means."""
    import explain.viz
    from explain.viz.image import CLASS_AGNOSTIC

    drawn = {}

    def keep(figure, out):
        panels = [axis.get_ylabel() for axis in figure.axes if axis.get_ylabel()]
        titles = [axis.get_title() for axis in figure.axes if axis.get_title()]
        text = " ".join(" ".join(t.get_text() for t in figure.texts).split())
        drawn[os.path.basename(out)] = (panels, titles, text)

    monkeypatch.setattr(explain.viz, "save_figure", keep)
    paths = _write_images(tmp_path / "in", 1)
    status, _, _ = _run(
        capsys, "image", *paths, "--model", model_folder, "--method", "generic,rollout",
        "--target", "0", "--grid", "--out", tmp_path / "out",
    )  # fmt: skip
    assert status == 0
    rows, _, caption = drawn["image0_grid.png"]
    assert rows[:2] == ["generic", "rollout (class-agnostic)"]  # then the colour key's
    assert f"{CLASS_AGNOSTIC[0].upper()}{CLASS_AGNOSTIC[1:]}." in caption
    titles = {name: drawn[name][1] for name in drawn if name != "image0_grid.png"}
    assert [t[0].split(":")[0] for _, t in sorted(titles.items())] == [
        "generic",
        "rollout (class-agnostic)",
    ]
    drawn.clear()
    status, _, _ = _run(
        capsys, "image", *paths, "--model", model_folder, "--method", "generic", "--grid",
        "--out", tmp_path / "alone",
    )  # fmt: skip
    assert status == 0 and "lass-agnostic" not in drawn["image0_grid.png"][2]


def test_a_cropped_photo_is_said_in_the_terminal_and_in_every_figure(
    capsys, tmp_path, model_folder, monkeypatch
):
    """A 300x120 photo is centre-cropped to its middle square: the prediction's line and
    the caption of each map's figure and of the grid say what the model saw, in the same
    words (ImagePreprocessing.crop_note)."""
    import dataclasses

    import explain.cli.image
    import explain.viz
    from explain.cli.options import load
    from explain.loading.preprocessing import ImagePreprocessing

    # The model folder's preprocessing resizes a photo whole; this one keeps the shorter
    # side and crops the centre, as timm's and the Hugging Face processors' do.
    cropping = ImagePreprocessing(size=(32, 32), mean=MEAN, std=STD, resize=(32, 32), fit="shorter")
    monkeypatch.setattr(
        explain.cli.image,
        "load",
        lambda *a, **k: dataclasses.replace(load(*a, **k), preprocessing=cropping),
    )
    path = tmp_path / "wide.png"
    Image.fromarray(np.full((120, 300, 3), 90, dtype=np.uint8)).save(path)
    note = cropping.crop_note((120, 300))
    assert note == "centre-cropped 300x120 -> 120x120 (40% of the image)"
    captions = []

    def keep_caption(figure, out):
        captions.append(" ".join(" ".join(t.get_text() for t in figure.texts).split()))

    monkeypatch.setattr(explain.viz, "save_figure", keep_caption)
    argv = ("image", path, "--model", model_folder, "--grid", "--out", tmp_path / "o")
    status, out, _ = _run(capsys, *argv)
    assert status == 0
    assert next(line for line in out.splitlines() if line.startswith(f"{path}: ")).endswith(
        f"({note})"
    )
    assert len(captions) == 2  # the predicted class's map and the grid
    assert all(f"The model saw only part of the photo: {note}." in text for text in captions)
    square = tmp_path / "square.png"
    Image.fromarray(np.full((64, 64, 3), 90, dtype=np.uint8)).save(square)
    captions.clear()
    assert _run(capsys, "image", square, "--model", model_folder, "--out", tmp_path / "s")[0] == 0
    assert captions and not any("part of the photo" in text for text in captions)
