"""Damaged or malicious model files and wrong specs are a ModelLoadError that names the
file and the problem; the command line prints it as one line."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest
import torch
from PIL import Image

from explain.cli import main
from explain.errors import ModelLoadError, OptionError
from explain.loading.specs import load_model
from explain.loading.zoo import zoo_root

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    """A tiny Hugging Face BERT classifier saved with save_pretrained (safetensors)."""
    config = transformers.BertConfig(
        vocab_size=30,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=20,
        num_labels=2,
    )
    folder = tmp_path_factory.mktemp("bert")
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def _copy(folder, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(folder, target)
    return target


def test_a_truncated_safetensors_file_is_named(bert_folder, tmp_path):
    folder = _copy(bert_folder, tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(
        ModelLoadError, match=rf"cannot load the Hugging Face model {folder} \(model.safetensors\)"
    ):
        load_model(folder)


class _Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_a_malicious_pickle_is_refused_as_a_load_error(bert_folder, tmp_path, capsys):
    folder = _copy(bert_folder, tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"weight": _Payload()}, protocol=2))
    with pytest.raises(ModelLoadError, match=rf"{folder}.*(weights_only|Unpickl|unpickl)"):
        load_model(folder)
    assert "this must never run" not in capsys.readouterr().out


def _zoo_folder(tmp_path, change) -> object:
    folder = tmp_path / "zoo-style"
    shutil.copytree(zoo_root() / "shapes-vit", folder)
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    "change",
    [
        lambda config: config["timm"].update(depth=-3),
        lambda config: config["timm"].update(no_such_argument=1),
        lambda config: config.pop("timm"),
        lambda config: config["timm"].update(embed_dim="wide"),
    ],
    ids=["negative-depth", "unknown-argument", "no-timm-section", "string-width"],
)
def test_a_zoo_style_config_with_bad_values_is_named(tmp_path, change):
    folder = _zoo_folder(tmp_path, change)
    with pytest.raises(ModelLoadError, match=rf"{folder / 'config.json'}"):
        load_model(folder)


@pytest.mark.parametrize("content", ["42", "null", '"a string"', "[1, 2]"])
def test_a_config_that_is_not_an_object_is_named(tmp_path, content):
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(ModelLoadError, match=r"config\.json holds .*, not a JSON object"):
        load_model(tmp_path)


@pytest.mark.parametrize("spec", [None, 3, ["zoo:shapes-vit"]])
def test_a_spec_that_is_no_name_or_path_is_refused(spec):
    with pytest.raises(ModelLoadError, match="a model spec is a string or a path"):
        load_model(spec)


def test_the_cli_prints_a_load_error_as_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text("null")
    image = tmp_path / "image.png"
    Image.new("RGB", (8, 8)).save(image)
    status = main(["image", str(image), "--model", str(tmp_path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err
    assert err.startswith(f"explain: error: {tmp_path / 'config.json'} holds NoneType null")


def test_a_malicious_timm_checkpoint_is_refused_as_a_load_error(tmp_path, capsys):
    """(Already one clear line before: a guard that the timm path stays so.)"""
    weights = tmp_path / "vit.pth"
    weights.write_bytes(pickle.dumps({"weight": _Payload()}, protocol=2))
    with pytest.raises(ModelLoadError, match=rf"{weights}.*weights_only"):
        load_model(weights, architecture="test_vit")
    assert "this must never run" not in capsys.readouterr().out


def _hugging_face_variant(folder, tmp_path, change):
    target = _copy(folder, tmp_path)
    config = json.loads((target / "config.json").read_text())
    change(config)
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(architectures=[123]), r"lists architectures \[123\]"),
        (lambda c: c.update(architectures="BertModel"), "lists architectures"),
        (lambda c: c.update(architectures=["pipeline"]), "'pipeline', which is not a transformers"),
        (lambda c: c.update(id2label=["a", "b"]), "cannot read the Hugging Face config"),
        (lambda c: c.update(id2label={"0": "a", "5": "b"}), r"names classes \[0, 5\]"),
        (lambda c: c.update(num_attention_heads=0), "describes no model that can be built"),
        (lambda c: c.update(hidden_size=-16), "describes no model that can be built"),
    ],
)
def test_a_malformed_hugging_face_config_is_named(bert_folder, tmp_path, change, message):
    folder = _hugging_face_variant(bert_folder, tmp_path, change)
    with pytest.raises(ModelLoadError, match=message):
        load_model(folder)


def test_an_auto_class_in_architectures_loads_the_bare_model(bert_folder, tmp_path):
    folder = _hugging_face_variant(
        bert_folder, tmp_path, lambda c: c.update(architectures=["AutoModel"])
    )
    assert type(load_model(folder).model).__name__ == "BertModel"


def test_a_checkpoint_without_some_weights_is_refused_unless_allowed(bert_folder, tmp_path, capsys):
    """A classifier whose head is not in the checkpoint would be explained at random."""
    from safetensors.torch import load_file, save_file

    folder = _copy(bert_folder, tmp_path)
    weights = load_file(folder / "model.safetensors")
    kept = {k: v for k, v in weights.items() if not k.startswith("classifier.")}
    save_file(kept, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        ModelLoadError,
        match=r"lacks 2 of the model's weights \(classifier\.bias, classifier\.weight\).*"
        r"allow_missing_weights=True",
    ):
        load_model(folder)
    loaded = load_model(folder, allow_missing_weights=True)
    assert type(loaded.model).__name__ == "BertForSequenceClassification"
    assert load_model(bert_folder).model is not None  # a whole checkpoint loads as before
    bare = {k: v for k, v in weights.items() if k.startswith("bert.embeddings.")}
    save_file(bare, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"and \d+ more"):
        load_model(folder)
    capsys.readouterr()
    assert main(["text", "a", "--model", str(folder)]) == 2
    assert "--allow-missing-weights" in capsys.readouterr().err
    assert main(["text", "a", "--model", str(folder), "--allow-missing-weights"]) == 0


@pytest.mark.parametrize(
    ("spec", "options", "error", "message"),
    [
        ("hf-hub:", {}, ModelLoadError, "names no Hub repository"),
        ("hf-hub:not a repo", {}, ModelLoadError, "names no Hub repository"),
        ("x" * 5000, {}, ModelLoadError, r"\.\.\. \(5000 characters\)|is no Hub repo id"),
        ("a/" + "b" * 300, {}, ModelLoadError, "is no Hub repo id"),
        ("zoo:digits-vit", {"dtype": torch.int8}, OptionError, "not a floating point type"),
        ("zoo:digits-vit", {"dtype": 3}, OptionError, "unknown dtype 3"),
        # issue 46: any floating dtype was accepted
        ("zoo:digits-vit", {"dtype": torch.float8_e4m3fn}, OptionError, "no layer computes in"),
        ("zoo:digits-vit", {"dtype": torch.float8_e5m2}, OptionError, "no layer computes in"),
    ],
)
def test_malformed_specs_and_options_are_clear_errors(spec, options, error, message):
    with pytest.raises(error, match=message):
        load_model(spec, **options)


def test_timm_model_args_must_be_an_object(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"architecture": "vit_tiny_patch16_224", "model_args": "depth=2"})
    )
    with pytest.raises(ModelLoadError, match="`model_args` an object"):
        load_model(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["preprocessing"].update(image_size="big"), "image size must be two positive"),
        (lambda c: c["preprocessing"].update(std=[0.5, 0, 0.5]), "std must be positive"),
        (lambda c: c["preprocessing"].update(mean=["a", 0, 0]), "mean must be a finite number"),
        (lambda c: c.update(classes=["zero", "one"]), "names 2 classes but the model's head has 6"),
        (lambda c: c.update(classes="0123456789"), "'classes' must be a list of class names"),
    ],
)
def test_a_zoo_card_with_bad_preprocessing_or_classes_is_named(tmp_path, change, message):
    folder = _zoo_folder(tmp_path, change)
    with pytest.raises(ModelLoadError, match=message):
        load_model(folder)
