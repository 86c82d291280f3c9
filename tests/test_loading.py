"""load_model: timm and Hugging Face checkpoints from local files and folders, through the
same code a download takes (timm's pretrained loader, Hugging Face's from_pretrained)."""

from __future__ import annotations

import json

import pytest
import torch

from explain import Explainer
from explain.errors import ExplainError, HubUnreachableError, ModelLoadError
from explain.loading.loaded_model import LoadedModel
from explain.loading.specs import load_model

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

TINY_VIT = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)


def _outputs_equal(first: torch.nn.Module, second: torch.nn.Module, *inputs) -> bool:
    with torch.no_grad():
        return torch.equal(first.eval()(*inputs), second.eval()(*inputs))


@pytest.fixture
def timm_export(tmp_path):
    """A small timm ViT exported the way timm publishes checkpoints (config.json + weights)."""
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **TINY_VIT)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.2)
    folder = tmp_path / "timm-export"
    timm.models.save_for_hf(model, folder, safe_serialization=True)
    return model, folder


def test_timm_folder_loads_through_timm_local_source(timm_export):
    model, folder = timm_export
    loaded = load_model(folder)
    assert isinstance(loaded, LoadedModel)
    assert loaded.model.pretrained_cfg["source"] == "local-dir"  # timm's own loader ran
    assert loaded.modality == "image" and loaded.image_size == (32, 32)
    assert not loaded.model.training
    images = torch.randn(2, 3, 32, 32)
    assert _outputs_equal(model, loaded.model, images)
    # The loaded model is explainable as is.
    assert Explainer(loaded.model).explain(images).relevance.shape == (2, 4, 4)


def test_timm_weights_file_with_config_beside_it(timm_export):
    model, folder = timm_export
    loaded = load_model(folder / "model.safetensors")
    assert loaded.model.pretrained_cfg["file"] == str(folder / "model.safetensors")
    assert _outputs_equal(model, loaded.model, torch.randn(1, 3, 32, 32))


def test_timm_pth_file_with_named_architecture(tmp_path):
    model = timm.create_model("test_vit", pretrained=False)
    path = tmp_path / "checkpoint.pth"
    torch.save(model.state_dict(), path)
    loaded = load_model(path, architecture="test_vit")
    assert _outputs_equal(model, loaded.model, torch.randn(1, 3, 160, 160))
    with pytest.raises(ModelLoadError, match="architecture"):
        load_model(path)  # no config beside it and no architecture named


def test_timm_name_with_weights_file(tmp_path):
    from safetensors.torch import save_file

    model = timm.create_model("test_vit", pretrained=False)
    torch.manual_seed(1)
    with torch.no_grad():
        model.head.weight.normal_()
    images = torch.randn(1, 3, 160, 160)
    weights = tmp_path / "weights.safetensors"
    save_file(model.state_dict(), weights)
    assert _outputs_equal(model, load_model("test_vit", weights=weights).model, images)


def test_timm_name_not_cached_offline_says_so(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(HubUnreachableError, match="offline mode is on"):
        load_model("test_vit.r160_in1k", offline=True)
    random = load_model("test_vit", pretrained=False)
    assert random.image_size == (160, 160)


@pytest.fixture
def bert_folder(tmp_path):
    """A tiny BERT classifier saved with save_pretrained, with a real tokenizer."""
    from explain.loading.zoo import minilm_folder

    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=3,
        id2label={0: "sad", 1: "neutral", 2: "happy"},
        label2id={"sad": 0, "neutral": 1, "happy": 2},
    )
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config).eval()
    folder = tmp_path / "bert"
    model.save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(minilm_folder()).save_pretrained(folder)
    return model, folder


def test_hugging_face_folder_loads_with_from_pretrained(bert_folder):
    model, folder = bert_folder
    loaded = load_model(folder)
    assert type(loaded.model) is type(model)
    assert loaded.modality == "text" and loaded.classes == ("sad", "neutral", "happy")
    batch = loaded.tokenizer(["a fine day", "not good at all"], return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = model(**batch).logits
        assert torch.equal(loaded.model(**batch).logits, expected)


def test_hugging_face_image_folder(tmp_path):
    config = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=4,
    )
    model = transformers.ViTForImageClassification(config).eval()
    model.save_pretrained(tmp_path / "vit")
    transformers.ViTImageProcessor(
        size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    ).save_pretrained(tmp_path / "vit")
    loaded = load_model(tmp_path / "vit")
    assert loaded.modality == "image" and loaded.image_size == (32, 32)
    assert loaded.mean == (0.5, 0.5, 0.5) and loaded.tokenizer is None
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(images).logits, model(images).logits)


def test_errors_are_clear(tmp_path, timm_export):
    _, folder = timm_export
    with pytest.raises(ModelLoadError, match="not a zoo model"):
        load_model("no_such_model_anywhere")
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(tmp_path / "missing.safetensors")
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_model(tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelLoadError, match="not a weights file"):
        load_model(tmp_path / "notes.txt")
    strange = tmp_path / "strange"
    strange.mkdir()
    (strange / "config.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(ModelLoadError, match="names no model"):
        load_model(strange)
    # A truncated timm checkpoint: timm's loader fails, we say which file.
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ExplainError, match="cannot load timm model"):
        load_model(folder)


def test_hugging_face_clip_folder_is_an_image_text_model(tmp_path):
    from explain.data.captions import build_tokenizer

    config = transformers.CLIPConfig(
        text_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "vocab_size": 32,
            "max_position_embeddings": 16,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
        },
        projection_dim=16,
    )
    transformers.CLIPModel(config).eval().save_pretrained(tmp_path / "clip")
    build_tokenizer(16).save_pretrained(tmp_path / "clip")
    loaded = load_model(tmp_path / "clip")
    assert loaded.modality == "image_text" and loaded.image_size == (32, 32)
    assert loaded.tokenizer is not None and loaded.tokenizer("a circle")["input_ids"]


def test_loading_prints_no_transformers_progress_bars(tmp_path, capfd):
    import reference_hf as ref
    from transformers.utils import logging

    ref.tiny_text_model("bert-classifier").save_pretrained(tmp_path)
    capfd.readouterr()
    before = logging.is_progress_bar_enabled()
    assert type(load_model(tmp_path).model).__name__ == "BertForSequenceClassification"
    assert "Loading weights" not in capfd.readouterr().err
    assert logging.is_progress_bar_enabled() == before  # the setting is the user's again
