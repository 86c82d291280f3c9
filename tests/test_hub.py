"""load_model with the specs people copy from timm and the Hugging Face Hub, offline.

A private Hugging Face cache is filled exactly as downloads fill it (repo folders, blobs,
snapshots, refs/main) with tiny models under real repo names; with HF_HUB_OFFLINE=1 the
libraries' own download code (timm's hf-hub loader, transformers' from_pretrained) finds
them there, as on a user's second run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tolerances import FLOAT32

import explain.loading.hub
from explain import Explainer
from explain.errors import (
    GatedRepoError,
    HubUnreachableError,
    ModelLoadError,
    OptionError,
    RepoNotFoundError,
    UnsupportedModelError,
)
from explain.loading.specs import load_model
from explain.testing import HUB_SPECS, cache_hub_repo, fill_hub_cache

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """(cache folder, {spec: the model saved under it})."""
    cache = tmp_path_factory.mktemp("hub")
    return cache, fill_hub_cache(cache)


@pytest.fixture
def hub(filled, monkeypatch):
    """The filled cache as the Hugging Face cache, offline; returns the saved models."""
    cache, models = filled
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return models


def _same_outputs(first, second, inputs) -> None:
    with torch.no_grad():
        expected = first(**inputs) if isinstance(inputs, dict) else first(inputs)
        actual = second(**inputs) if isinstance(inputs, dict) else second(inputs)
    expected = getattr(expected, "logits", expected)
    torch.testing.assert_close(getattr(actual, "logits", actual), expected, **FLOAT32)


def test_timm_name_loads_through_timms_hub_loader_from_the_cache(hub):
    spec = HUB_SPECS["timm"]
    loaded = load_model(spec)
    assert loaded.model.pretrained_cfg["source"] == "hf-hub"  # timm's own loader ran
    assert loaded.model.pretrained_cfg["hf_hub_id"] == f"timm/{spec}"
    assert loaded.model.embed_dim == 32 and not loaded.model.training  # the cached model_args
    _same_outputs(hub[spec], loaded.model, torch.randn(2, 3, 224, 224))
    # timm's ImageNet descriptions name the 1000 classes.
    assert len(loaded.classes) == 1000 and loaded.classes[281] == "tabby, tabby cat"
    # The data config of the checkpoint: resize the shorter side to 224 / 0.9, crop 224.
    pre = loaded.preprocessing
    assert (pre.size, pre.resize, pre.fit) == ((224, 224), (248, 248), "shorter")
    assert pre.mean == (0.5, 0.5, 0.5) and pre.interpolation == "bicubic"
    # Without the pretrained tag, timm's default tag for the architecture: the same repo.
    assert load_model("vit_tiny_patch16_224").model.pretrained_cfg["hf_hub_id"] == f"timm/{spec}"


def test_hf_hub_spec_and_its_repo_id_load_the_timm_model(hub):
    spec = HUB_SPECS["timm_hub"]
    images = torch.randn(1, 3, 224, 224)
    for given in (spec, spec.removeprefix("hf-hub:")):  # config.json says timm
        loaded = load_model(given)
        _same_outputs(hub[spec], loaded.model, images)
        assert loaded.preprocessing.mean == (0.485, 0.456, 0.406)
        assert loaded.classes[0] == "tench, Tinca tinca"


def test_hugging_face_text_classifier_id(hub):
    spec = HUB_SPECS["text"]
    loaded = load_model(spec)
    assert type(loaded.model).__name__ == "DistilBertForSequenceClassification"
    assert loaded.modality == "text" and loaded.classes == ("NEGATIVE", "POSITIVE")
    batch = loaded.tokenizer(["a fine film", "dull"], return_tensors="pt", padding=True)
    _same_outputs(hub[spec], loaded.model, dict(batch))
    result = Explainer(loaded.model, tokenizer=loaded.tokenizer).explain(batch)
    assert result.relevance.shape == batch["input_ids"].shape
    # A revision pins the same files (refs/main names the snapshot).
    assert load_model(f"{spec}@main").classes == ("NEGATIVE", "POSITIVE")


def test_hugging_face_image_classifier_id_with_its_image_processor(hub, tmp_path):
    from PIL import Image

    spec = HUB_SPECS["image"]
    loaded = load_model(spec)
    assert loaded.modality == "image" and loaded.classes[281] == "tabby, tabby cat"
    pre = loaded.preprocessing
    assert (pre.size, pre.fit, pre.mean, pre.interpolation) == (
        (224, 224),
        "exact",
        (0.5, 0.5, 0.5),
        "bilinear",
    )
    photo = Image.new("RGB", (300, 200), (200, 30, 90))
    processor = transformers.AutoImageProcessor.from_pretrained(spec)
    expected = processor(images=photo, return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(pre([photo]), expected, **FLOAT32)  # float32, other code
    _same_outputs(hub[spec], loaded.model, expected)


def test_repo_missing_from_the_cache_while_offline(hub):
    with pytest.raises(HubUnreachableError, match="offline mode is on"):
        load_model("someone/not-cached-model")
    with pytest.raises(HubUnreachableError, match="offline mode is on"):
        load_model("vit_small_patch16_224.augreg_in21k_ft_in1k")  # a timm name, not cached


def test_offline_argument_without_the_environment(filled, monkeypatch):
    cache, _ = filled
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    with pytest.raises(HubUnreachableError, match="offline mode is on"):
        load_model("someone/not-cached-model", offline=True)
    assert load_model(HUB_SPECS["text"], offline=True).classes == ("NEGATIVE", "POSITIVE")
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False  # restored after the call


def _http_error(cls, status: int, url: str):
    """The hub client's error as it raises it for an HTTP answer (the response is a stand-in:
    the error reads only its headers and request)."""
    from types import SimpleNamespace

    response = SimpleNamespace(status_code=status, headers={}, request=None, url=url)
    return cls(f"{status} Client Error for url {url}", response=response)


@pytest.mark.parametrize("spec", [HUB_SPECS["text"], "vit_base_patch16_224", "hf-hub:org/timm"])
def test_gated_repository_says_how_to_give_a_token(spec, hub, monkeypatch):
    def gated(repo_id, filename, **options):
        raise _http_error(
            huggingface_hub.errors.GatedRepoError, 403, f"https://huggingface.co/{repo_id}"
        )

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", gated)
    with pytest.raises(GatedRepoError, match=r"gated.*accept its terms.*hf auth login.*HF_TOKEN"):
        load_model(spec)


def test_no_such_repository_and_no_network_are_told_apart(hub, monkeypatch):
    errors = huggingface_hub.errors

    def missing(repo_id, filename, **options):
        raise _http_error(errors.RepositoryNotFoundError, 404, "https://huggingface.co/x")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", missing)
    with pytest.raises(RepoNotFoundError, match="has no model someone/typo"):
        load_model("someone/typo")

    def unreachable(repo_id, filename, **options):
        raise errors.LocalEntryNotFoundError("cannot find the requested files in the cache")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    # the client's own failure
    monkeypatch.setattr("explain.loading.hub.hub_reachable", lambda: True)
    with pytest.raises(HubUnreachableError, match=r"cannot reach the Hugging Face Hub.*network"):
        load_model("someone/model")


@pytest.fixture
def no_network(filled, monkeypatch):
    """The filled cache, online mode, and a network on which no name resolves (as without
    one): every lookup is counted."""
    import socket

    cache, _ = filled
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", *explain.loading.hub._PROXIES):
        monkeypatch.delenv(name, raising=False)
    lookups = []

    def unresolvable(host, *args, **kwargs):
        lookups.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unresolvable)
    return lookups


def test_without_network_a_hub_name_fails_at_once_and_cached_ones_load(no_network):
    """The hub client retries a failed lookup for about 25 s; one probe tells at once."""
    with pytest.raises(HubUnreachableError, match=r"cannot reach the Hugging Face Hub.*network"):
        load_model("someone/not-cached-model")
    assert no_network == ["huggingface.co"]  # the probe, and no retry after it
    assert load_model(HUB_SPECS["text"]).classes == ("NEGATIVE", "POSITIVE")  # from the cache
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False  # restored after each call


def test_behind_a_proxy_the_hub_is_not_probed(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setattr("socket.create_connection", lambda *a, **k: pytest.fail("probed"))
    assert explain.loading.hub.hub_reachable()


def test_unsupported_architecture_names_the_families_before_any_weights(hub, filled, tmp_path):
    # Only the config is cached: the check must not need the weights.
    cache, _ = filled
    folder = tmp_path / "resnet"
    folder.mkdir()
    config = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 8], depths=[1, 1])
    config.architectures = ["ResNetForImageClassification"]
    config.save_pretrained(folder)
    cache_hub_repo(cache, "microsoft/resnet-50", folder)
    with pytest.raises(UnsupportedModelError, match=r"ResNetForImageClassification.*Supported"):
        load_model("microsoft/resnet-50")
    timm_folder = tmp_path / "timm-resnet"
    timm_folder.mkdir()
    (timm_folder / "config.json").write_text(
        json.dumps({"architecture": "resnet18", "num_classes": 1000, "pretrained_cfg": {}})
    )
    cache_hub_repo(cache, "timm/resnet18.a1_in1k", timm_folder)
    with pytest.raises(UnsupportedModelError, match=r"ResNet.*timm VisionTransformer"):
        load_model("resnet18.a1_in1k")


def test_device_and_dtype(hub):
    loaded = load_model(HUB_SPECS["timm"], device="auto", dtype="bfloat16")
    assert loaded.dtype == torch.bfloat16
    assert loaded.device.type == ("cuda" if torch.cuda.is_available() else loaded.device.type)
    result = Explainer(loaded.model).explain(torch.randn(1, 3, 224, 224))
    assert result.relevance.device == loaded.device and torch.isfinite(result.heatmap()).all()
    with pytest.raises(OptionError, match="unknown dtype"):
        load_model(HUB_SPECS["timm"], dtype="int8")
    with pytest.raises(OptionError, match="unknown device"):
        load_model(HUB_SPECS["timm"], device="tpu-please")
    if not torch.cuda.is_available():
        with pytest.raises(OptionError, match="no usable CUDA"):
            load_model(HUB_SPECS["timm"], device="cuda")


def test_unknown_names_list_every_spec_kind(hub):
    # Offline, a name that is no timm model may still be an uncached Hub id (gpt2).
    with pytest.raises(HubUnreachableError, match=r"zoo:NAME.*file or folder.*timm model.*repo id"):
        load_model("no_such_model_anywhere")
    with pytest.raises(ModelLoadError, match=r"timm model name, hf-hub:org/name.*org/name"):
        load_model("not a model name")  # a space: no repo id either


def test_hub_ids_without_an_organisation_load_like_the_hubs_oldest_models(
    hub, filled, tmp_path, monkeypatch
):
    """`gpt2`, `bert-base-uncased`: no org, as on their model pages."""
    cache, _ = filled
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, num_labels=2,
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path / "bert")
    cache_hub_repo(cache, "tiny-bert-no-org", tmp_path / "bert")
    for spec in ("tiny-bert-no-org", "tiny-bert-no-org@main"):
        loaded = load_model(spec)
        assert isinstance(loaded.model, transformers.BertForSequenceClassification)
        _same_outputs(model, loaded.model, {"input_ids": torch.tensor([[1, 5, 7, 2]])})
    # Not cached while offline: the error names the spec kinds and the cache.
    with pytest.raises(HubUnreachableError, match=r"timm model name, so it was looked up.*offline"):
        load_model("no-such-model")

    def missing(repo_id, filename, **options):
        raise _http_error(
            huggingface_hub.errors.RepositoryNotFoundError, 404, "https://huggingface.co/x"
        )

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", missing)
    with pytest.raises(
        ModelLoadError, match=r"timm model name.*as a Hub repo id:.*no model vit_tyop"
    ):
        load_model("vit_tyop")


CHELSEA = Path(__file__).resolve().parents[1] / "examples" / "images" / "chelsea.jpg"


@pytest.mark.parametrize("kind", ["timm", "timm_hub", "image"])
def test_cli_image_with_every_image_spec_kind(kind, hub, tmp_path, capsys):
    from PIL import Image

    from explain.cli import main

    out = tmp_path / "maps"
    argv = ["image", str(CHELSEA), "--model", HUB_SPECS[kind], "--out", str(out)]
    assert main([*argv, "--target", "tabby cat,top", "--device", "cpu", "--grid", "--bare"]) == 0
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(
        {"chelsea_grid.png", "chelsea_generic_281-tabby.png"}
        | {n for n in written if n.startswith("chelsea_generic_")}
    )
    assert "chelsea_generic_281-tabby.png" in written and len(written) in (2, 3)
    with Image.open(CHELSEA) as photo, Image.open(out / "chelsea_generic_281-tabby.png") as map_:
        assert map_.size == photo.size  # --bare: the overlay alone, on the photo, not the crop


def test_cli_text_with_a_hub_classifier(hub, tmp_path, capsys):
    from explain.cli import main

    html = tmp_path / "text.html"
    spec = HUB_SPECS["text"]
    argv = ["text", "a warm and funny film", "--model", spec, "--html", str(html)]
    assert main([*argv, "--target", "POSITIVE", "--offline", "--dtype", "float32"]) == 0
    assert "POSITIVE (p = " in capsys.readouterr().out
    assert "warm" in html.read_text()


def test_cli_model_help_describes_specs_cache_and_offline(capsys):
    from explain.cli import main

    # hf-hub:org/name is a timm spec: offered only where image classifiers are taken.
    for command, takes_timm in (
        ("image", True),
        ("text", False),
        ("clip", True),
        ("seq2seq", False),
        ("evaluate", True),
    ):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        # argparse wraps lines, also after a hyphen ("hf-" / "hub:"): undo the wrapping.
        text = " ".join(capsys.readouterr().out.split()).replace("- ", "-")
        for needed in ("org/name[@revision]", "HF_HUB_CACHE", "--offline"):
            assert needed in text, (command, needed)
        assert ("hf-hub:org/name" in text) == takes_timm, command
        assert "--device" in text and "--dtype" in text
