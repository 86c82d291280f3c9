"""Explanations leave the tool intact: save/load in every format, to_numpy, to_dict."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from explain import Explainer, Explanation
from explain.errors import ExplainError, InputError, OptionError
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


def _tampered(tmp_path, suffix, header=None, tensors=None, drop=(), original=None):
    """A saved explanation (`_text_like`'s by default) with header fields or tensors
    replaced, and the tensors and header fields named in `drop` left out."""
    from explain.export import write_payload

    original = original or _text_like()
    path = tmp_path / f"tampered.{suffix}"
    tensors = {**original._tensors(), **(tensors or {})}
    header = {**original._header(), **(header or {})}
    for name in drop:
        tensors.pop(name, None)
        header.pop(name, None)
    write_payload(path, tensors, header)
    return path


@pytest.mark.parametrize("suffix", ["npz", "safetensors", "json"])
@pytest.mark.parametrize(
    ("header", "tensors", "message"),
    [
        ({"method": 123}, None, "method is 123, not a name"),
        ({"score": None}, None, "score is None"),
        ({"input_size": [0, 4]}, None, "input_size"),
        ({"input_size": [True, 4]}, None, "input_size"),
        ({"tokens": [["a"], [1]]}, None, "tokens is not a list of token strings"),
        ({"tokens": [["a"]]}, None, "tokens hold 1 samples; the logits 2"),
        ({"relevances": "text"}, None, "relevances is not a list"),
        ({"settings": [1]}, None, "settings is not a JSON object"),
        ({"version": 7}, None, "format version 7"),
        (None, {"target": torch.tensor([1, 0, 1])}, r"target has shape \(3,\)"),
        (None, {"target": torch.tensor([1, 5])}, r"target holds classes outside -1\.\.1"),
        (None, {"target": torch.tensor([1.0, 0.0])}, "target is torch.float32, not integers"),
        (None, {"relevance": torch.ones(2, 4, dtype=torch.complex64)}, "not real floating"),
        (None, {"relevance": torch.ones(2, 4, dtype=torch.int32)}, "not real floating"),
        (None, {"relevance": torch.ones(2, 4, dtype=torch.uint64)}, "not real floating"),
        (None, {"relevance": torch.ones(3, 4)}, r"relevance has shape \(3, 4\)"),
        (None, {"logits": torch.ones(2)}, r"logits are torch.float32 of shape \(2,\)"),
        (None, {"relevances.image": torch.ones(1, 4, 4)}, r"relevances\['image'\] has shape"),
    ],
)
def test_load_refuses_contents_that_are_not_an_explanations(
    tmp_path, suffix, header, tensors, message
):
    complex_values = tensors is not None and any(t.is_complex() for t in tensors.values())
    if suffix == "json" and complex_values:
        pytest.skip("JSON has no complex numbers: such a file cannot be written")
    path = _tampered(tmp_path, suffix, header, tensors)
    with pytest.raises(InputError, match=message):
        Explanation.load(path)


@pytest.mark.parametrize("suffix", ["npz", "safetensors", "json"])
@pytest.mark.parametrize("damage", ["cut in half", "cut by one byte", "first bytes", "zeros"])
def test_damaged_files_raise_one_clear_error(tmp_path, suffix, damage):
    path = tmp_path / f"r.{suffix}"
    _text_like().save(path)
    data = path.read_bytes()
    damaged = {
        "cut in half": data[: len(data) // 2],
        "cut by one byte": data[:-1] if suffix != "json" else data[:-3],
        "first bytes": data[:7],
        "zeros": bytes(len(data)),
    }[damage]
    path.write_bytes(damaged)
    with pytest.raises(InputError, match=r"damaged|no valid explanation|no explanation"):
        Explanation.load(path)


def test_missing_tensors_and_deep_nesting_are_clear_errors(tmp_path):
    from explain.export import write_payload

    original = _text_like()
    path = tmp_path / "r.safetensors"
    tensors = original._tensors()
    del tensors["relevance"]
    write_payload(path, tensors, original._header())
    with pytest.raises(InputError, match="it has no relevance"):
        Explanation.load(path)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(InputError, match="nests too deeply"):
        Explanation.load(deep)


def test_npz_reads_only_its_own_members_and_checks_sizes_before_inflating(tmp_path):
    import tracemalloc
    import zipfile

    path = tmp_path / "r.npz"
    original = _text_like()
    original.save(path)
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("extra.npy", bytes(256 * 2**20))  # 256 MiB of zeros, ~250 KB stored
        archive.writestr("also_not_npy.npy", b"not an array")
    assert path.stat().st_size < 2**20
    tracemalloc.start()
    try:
        _assert_same(Explanation.load(path), original)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20  # the extra member was never inflated
    # A member of its own whose zip entry claims more than its array header says.
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as out:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == "relevance.npy":
                data += bytes(256 * 2**20)
            out.writestr(info.filename, data)
    with pytest.raises(InputError, match="relevance declares"):
        Explanation.load(bomb)


@pytest.mark.parametrize("suffix", ["npz", "safetensors", "json"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), {1, 2}, object()])
def test_settings_that_json_cannot_hold_are_refused_before_writing(tmp_path, suffix, value):
    result = Explanation(**{**vars(_text_like()), "settings": {"ratio": value}})
    with pytest.raises(OptionError, match="cannot be written as JSON"):
        result.save(tmp_path / f"r.{suffix}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("suffix", ["npz", "safetensors", "json"])
def test_a_modality_whose_map_the_file_lacks_is_refused_not_filled_in(tmp_path, suffix):
    """`save` writes the map of the modality `relevance` is (here "text") once, as
    `relevance`, and names it in the header; every other modality's map must be there.
    (Issue 37: a missing map was filled with `relevance`, a (2, 4) text map for images.)"""
    original = _text_like()
    assert original._header()["saved_as_relevance"] == "text"
    assert "relevances.text" not in original._tensors()  # the one map left out on purpose
    _assert_same(Explanation.load(_tampered(tmp_path, suffix)), original)
    cut = _tampered(tmp_path, suffix, drop=["relevances.image"])
    with pytest.raises(InputError, match="names the modality 'image', whose map it lacks"):
        Explanation.load(cut)
    extra = _tampered(tmp_path, suffix, header={"relevances": ["text", "image", "audio"]})
    with pytest.raises(InputError, match="'audio', whose map it lacks"):
        Explanation.load(extra)
    # A batch cut into samples (as --save writes them) holds every map: none may be missing.
    sliced = Explanation(
        **{**vars(original), "relevances": {k: v[:] for k, v in original.relevances.items()}}
    )
    assert sliced._header()["saved_as_relevance"] is None
    for name in ("relevances.text", "relevances.image"):
        with pytest.raises(InputError, match="whose map it lacks"):
            Explanation.load(_tampered(tmp_path, suffix, drop=[name], original=sliced))
    named = _tampered(tmp_path, suffix, header={"saved_as_relevance": "audio"})
    with pytest.raises(InputError, match="saved_as_relevance is 'audio'"):
        Explanation.load(named)


@pytest.mark.parametrize("suffix", ["npz", "safetensors", "json"])
def test_a_file_written_before_the_header_named_its_left_out_map_still_loads(tmp_path, suffix):
    """Such a file left out at most one map, the one `relevance` is; two missing are refused."""
    original = _text_like()
    path = _tampered(tmp_path, suffix, drop=["saved_as_relevance"])
    loaded = Explanation.load(path)
    _assert_same(loaded, original)
    assert loaded.relevances["text"] is loaded.relevance
    both = _tampered(tmp_path, suffix, drop=["saved_as_relevance", "relevances.image"])
    with pytest.raises(InputError, match="whose map it lacks"):
        Explanation.load(both)


def test_one_sample_cut_from_a_batch_saves_in_every_format(tmp_path):
    """`explain image --save` writes each image's sample of the batch's result: its
    `relevance` and its modality's entry are views of one tensor, which safetensors
    refuses to write as they are (issue 37's sweep: a raw RuntimeError)."""
    batch = _image_explanation()
    one = Explanation(
        **{
            **vars(batch),
            "relevance": batch.relevance[1:2],
            "logits": batch.logits[1:2],
            "target": batch.target[1:2],
            "relevances": {"image": batch.relevance[1:2]},
        }
    )
    for suffix in ("npz", "safetensors", "json"):
        one.save(tmp_path / f"one.{suffix}")
        _assert_same(Explanation.load(tmp_path / f"one.{suffix}"), one)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("path", ["/proc/explain-test/result.npz", "/proc/result.json"])
def test_saving_where_no_file_can_be_written_is_a_clear_error(path):
    """A folder that cannot be made (/proc takes no new folder) or written into (nor a new
    file): an InputError naming the folder, not a raw FileNotFoundError (issue 37)."""
    with pytest.raises(InputError, match=r"cannot be written: its folder /proc"):
        _text_like().save(path)


@pytest.mark.parametrize("suffix", ["npz", "safetensors", "json"])
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16], ids=str)
def test_low_precision_relevance_saves_and_loads(tmp_path, suffix, dtype):
    """float8 has no isfinite kernel and numpy has no float8 nor bfloat16: such maps are
    checked and written widened to float32 (exact: it holds each of their values), and come
    back in their own dtype where the format keeps it (safetensors, JSON)."""
    values = torch.tensor([[0.0, 0.5, -0.25, 448.0], [0.0, 1.0, 0.0, -2.0]])
    original = Explanation(**{**vars(_text_like()), "relevance": values.to(dtype)})
    with pytest.raises(ExplainError, match="not finite"):  # the check widens, not skips
        Explanation(**{**vars(original), "relevance": values.clone().fill_(float("nan")).to(dtype)})
    original.save(tmp_path / f"r.{suffix}")
    loaded = Explanation.load(tmp_path / f"r.{suffix}")
    kept = dtype if suffix != "npz" else torch.float32
    assert loaded.relevance.dtype == kept
    assert torch.equal(loaded.relevance, original.relevance.to(kept))
    assert np.array_equal(original.to_numpy(), values.to(dtype).float().numpy())
