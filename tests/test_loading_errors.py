"""Damaged or malicious model files and wrong specs are a ModelLoadError that names the
file and the problem; the command line prints it as one line."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest
from PIL import Image

from explain.cli import main
from explain.errors import ModelLoadError
from explain.loading import load_model
from explain.zoo import zoo_root

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
