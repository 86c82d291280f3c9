"""A zoo config is checked when it is read: a damaged field fails at load, in one line
naming the file and the field (issue 46), and the zoo is its folders (issue 41)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from explain.errors import ModelLoadError
from explain.loading.specs import load_model
from explain.loading.zoo import CONFIG, ZOO, read_config, zoo_root

pytest.importorskip("timm")

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = zoo_root()  # before a test points $EXPLAIN_ZOO at its own copy


@pytest.fixture
def zoo(tmp_path, monkeypatch):
    """A private zoo holding a copy of digits-vit (the tests damage its config)."""
    shutil.copytree(SHIPPED / "digits-vit", tmp_path / "digits-vit")
    monkeypatch.setenv("EXPLAIN_ZOO", str(tmp_path))
    return tmp_path


def _evidence(**changes) -> dict[str, object]:
    """A well-formed `default_evidence`, with `changes`."""
    return {"kind": "image classifier", "method": "generic", "measured": "it ties", **changes}


def _damage(folder: Path, change) -> Path:
    path = folder / CONFIG
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda c: c.update(modality="audio"), "modality"),
        (lambda c: c.update(builder=3), "builder"),
        (lambda c: c.update(classes="0123456789"), "classes"),
        (lambda c: c.update(multi_label="no"), "multi_label"),
        (lambda c: c.update(trained="all"), "trained"),
        (lambda c: c.update(sha256="b555"), "sha256"),
        (lambda c: c.update(tokenizer_files="tokenizer.json"), "tokenizer_files"),
        (lambda c: c.update(preprocessing=[32, 32]), "preprocessing"),
        (lambda c: c["training"].update(script=["train.py"]), "training.script"),
        (lambda c: c["training"].update(arguments="--hops 2"), "training.arguments"),
        (lambda c: c.update(summary=""), "summary"),
        (lambda c: c.update(default_evidence="generic"), "default_evidence"),
        (
            lambda c: c.update(default_evidence=_evidence(kind=["image classifier"])),
            "default_evidence.kind",
        ),
        (
            lambda c: c.update(default_evidence=_evidence(measured="two\nlines")),
            "default_evidence.measured",
        ),
    ],
)
def test_a_wrong_field_is_named_with_its_file(zoo, change, field):
    path = _damage(zoo / "digits-vit", change)
    with pytest.raises(ModelLoadError, match=rf"^zoo config {path}: {field!r} must be") as caught:
        load_model("zoo:digits-vit")
    assert "\n" not in str(caught.value)
    with pytest.raises(ModelLoadError, match=rf"{field!r} must be"):  # the folder spec too
        load_model(zoo / "digits-vit")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda c: c.pop("modality"), "modality"),
        (lambda c: c.pop("builder"), "builder"),
        (lambda c: c["preprocessing"].pop("std"), "preprocessing.std"),
        (
            lambda c: c.update(default_evidence={"kind": "image classifier"}),
            "default_evidence.method",
        ),
    ],
)
def test_a_missing_field_is_named_with_its_file(zoo, change, field):
    path = _damage(zoo / "digits-vit", change)
    with pytest.raises(ModelLoadError, match=rf"^zoo config {path} has no {field!r}$"):
        read_config(zoo / "digits-vit")


def test_a_builder_is_known_and_has_its_arguments(zoo):
    path = _damage(zoo / "digits-vit", lambda c: c.update(builder="resnet"))
    with pytest.raises(ModelLoadError, match=r"unknown builder 'resnet'; known builders: timm_vit"):
        read_config(zoo / "digits-vit")
    _damage(zoo / "digits-vit", lambda c: c.update(builder="timm_vit", timm="depth=4"))
    with pytest.raises(ModelLoadError, match=rf"{path}: builder 'timm_vit'.*object 'timm'"):
        load_model("zoo:digits-vit")
    _damage(zoo / "digits-vit", lambda c: c.update(timm={"depth": "deep"}))
    with pytest.raises(ModelLoadError, match=rf"{path} describes no model that can be built"):
        load_model("zoo:digits-vit")


def test_a_recall_task_without_its_length_fails_when_read(zoo):
    """Issue 46: it failed with KeyError 'length' only when evaluated."""
    shutil.copytree(SHIPPED / "recall-llama", zoo / "recall-llama")
    path = _damage(zoo / "recall-llama", lambda c: c["task"].pop("length"))
    with pytest.raises(ModelLoadError, match=rf"^zoo config {path} has no 'task.length'$"):
        load_model("zoo:recall-llama")
    _damage(zoo / "recall-llama", lambda c: c["task"].update(length="2048"))
    with pytest.raises(ModelLoadError, match=r"'task.length' must be a positive number"):
        load_model("zoo:recall-llama")
    _damage(zoo / "recall-llama", lambda c: c["task"].update(length=2048, hops=True))
    with pytest.raises(ModelLoadError, match=r"'task.hops' must be a positive count"):
        load_model("zoo:recall-llama")


@pytest.mark.parametrize("content", ["[1, 2]", '"a string"'])
def test_a_config_that_is_no_object_is_named(zoo, content):
    (zoo / "digits-vit" / CONFIG).write_text(content)
    with pytest.raises(ModelLoadError, match=r"digits-vit/config\.json is not a JSON object"):
        load_model("zoo:digits-vit")


def test_the_zoo_is_its_folders(zoo):
    """A folder is a model of the zoo: a copy under another name is listed and loads; a
    damaged folder fails alone, when it is asked for."""
    shutil.copytree(zoo / "digits-vit", zoo / "digits-copy")
    assert list(ZOO) == ["digits-copy", "digits-vit"] and "digits-copy" in ZOO
    assert ZOO["digits-copy"].script == "scripts/train_digits_vit.py"
    assert ZOO["digits-copy"].command == "scripts/train_digits_vit.py"  # no arguments
    _damage(zoo / "digits-copy", lambda c: c["training"].update(arguments=["--seed", "1"]))
    assert ZOO["digits-copy"].command == "scripts/train_digits_vit.py --seed 1"
    assert load_model("zoo:digits-copy").classes[0] == "0"
    path = _damage(zoo / "digits-copy", lambda c: c.pop("summary"))
    with pytest.raises(ModelLoadError, match=rf"{path} has no 'summary'"):
        ZOO["digits-copy"]
    assert ZOO["digits-vit"].summary.startswith("ViT")
    with pytest.raises(KeyError):
        ZOO["cats-vit"]


def test_every_shipped_config_is_well_formed_and_names_its_training_script():
    assert len(ZOO) >= 7
    for name, entry in ZOO.items():
        assert read_config(zoo_root() / name)["summary"] == entry.summary
        assert (ROOT / entry.script).is_file(), f"{name}'s training script {entry.script}"
