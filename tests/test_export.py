"""Explanations leave the tool intact: save/load in every format, to_numpy, to_dict."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

from explain import Explainer, Explanation
from explain.errors import ExplainError
from explain.testing import tiny_vit


def _image_explanation() -> Explanation:
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    result = Explainer(tiny_vit()).explain(images, target=torch.tensor([[1, 3], [0, 4]]))
    return Explanation(**{**vars(result), "settings": {"model": "tiny_vit", "start_layer": 0}})


def _text_like() -> Explanation:
    """Two tokenised texts (padding exactly 0) and two token sets, as CLIP's would be."""
    relevance = torch.tensor([[0.0, 0.5, -0.25, 0.0], [0.0, 1.0, 0.0, 0.0]])
    image = torch.rand(2, 4, 4, generator=torch.Generator().manual_seed(1))
    return Explanation(
        relevance=relevance,
        logits=torch.tensor([[0.1, 2.0], [1.5, -1.0]]),
        target=torch.tensor([1, 0]),
        method="generic",
        score="probability",
        relevances={"text": relevance, "image": image},
        tokens=[["[CLS]", "good", "film", "[SEP]"], ["[CLS]", "bad", "[SEP]", "[PAD]"]],
    )


def _assert_same(loaded: Explanation, original: Explanation) -> None:
    for name in ("relevance", "logits", "target"):
        mine, theirs = getattr(loaded, name), getattr(original, name)
        assert mine.dtype == theirs.dtype and torch.equal(mine, theirs)
    assert set(loaded.relevances) == set(original.relevances)
    for name, tensor in original.relevances.items():
        assert torch.equal(loaded.relevances[name], tensor)
    assert (loaded.method, loaded.score, loaded.tokens) == (
        original.method,
        original.score,
        original.tokens,
    )
    assert loaded.input_size == original.input_size
    assert dict(loaded.settings) == dict(original.settings)


@pytest.mark.parametrize("suffix", ["npz", "safetensors", "json"])
@pytest.mark.parametrize("make", [_image_explanation, _text_like], ids=["image", "text"])
def test_save_load_round_trip(tmp_path, suffix, make):
    original = make()
    path = tmp_path / f"result.{suffix}"
    original.save(path)
    loaded = Explanation.load(path)
    _assert_same(loaded, original)
    if original.input_size is not None:  # what a loaded explanation is for: drawing it
        assert torch.equal(loaded.heatmap(), original.heatmap())
    assert list(tmp_path.iterdir()) == [path]  # atomic: no temporary file left


def test_files_are_readable_without_explain(tmp_path):
    original = _text_like()
    original.save(tmp_path / "r.npz")
    original.save(tmp_path / "r.safetensors")
    original.save(tmp_path / "r.json")
    with np.load(tmp_path / "r.npz", allow_pickle=False) as arrays:
        assert np.array_equal(arrays["relevance"], original.relevance.numpy())
        assert np.array_equal(arrays["relevances.image"], original.relevances["image"].numpy())
        assert json.loads(str(arrays["__explain__"]))["tokens"][1][1] == "bad"
    with safe_open(str(tmp_path / "r.safetensors"), framework="np") as handle:
        assert np.array_equal(handle.get_tensor("logits"), original.logits.numpy())
        assert json.loads(handle.metadata()["explain"])["method"] == "generic"
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["tensors"]["relevance"][0] == [0.0, 0.5, -0.25, 0.0]
    assert document["tokens"][0] == ["[CLS]", "good", "film", "[SEP]"]


def test_to_numpy_and_to_dict():
    original = _text_like()
    array = original.to_numpy()
    assert isinstance(array, np.ndarray) and np.array_equal(array, original.relevance.numpy())
    bf16 = Explanation(**{**vars(original), "relevance": original.relevance.bfloat16()})
    assert bf16.to_numpy().dtype == np.float32
    plain = original.to_dict()
    assert json.loads(json.dumps(plain)) == plain  # JSON-serialisable as it is
    assert plain["relevance"][0] == [0.0, 0.5, -0.25, 0.0]
    assert plain["target"] == [1, 0] and plain["score"] == "probability"
    assert set(plain["relevances"]) == {"text", "image"}
    assert plain["tokens"] == original.tokens and plain["input_size"] is None


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("result.png", None, "suffixes .npz, .safetensors, .json"),
        ("missing.npz", None, "no such file"),
        ("broken.json", "{not json", "not an explanation file"),
        ("other.json", '{"tensors": {}, "dtypes": {}}', "no explanation"),
    ],
)
def test_load_errors_say_what_to_do(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(ExplainError, match=message):
        Explanation.load(path)


def test_save_refuses_an_unknown_format(tmp_path):
    with pytest.raises(ExplainError, match="suffixes"):
        _text_like().save(tmp_path / "result.pt")
    assert list(tmp_path.iterdir()) == []
