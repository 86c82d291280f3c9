"""The viewer's text requests (issues 44 and 46): a text with a lone surrogate is a 400
JSON error, not a 500; texts are limited in tokens (at least the zoo's trained lengths,
at most what the model's positions reach), in the views and in exports alike; `top` is
a whole number of classes, 1 or more, or a 400 that says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serve_fixtures import request, serving

from explain.errors import InputError
from explain.loading.specs import load_model
from explain.serve.workbench import MAX_TOKENS

pytest.importorskip("transformers")

MODELS = Path(__file__).resolve().parents[1] / "models"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    loaded = load_model("zoo:minilm-sentiment")
    with serving(loaded, "zoo:minilm-sentiment", None, tmp_path_factory.mktemp("cache")) as s:
        yield s


SURROGATE = b'"a \\ud800 b"'  # JSON's escape of a lone surrogate: valid JSON, no Unicode


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("api/explain/text", b'{"text": %s}' % SURROGATE, "lone surrogate"),
        ("api/export", b'{"format": "json", "text": %s}' % SURROGATE, "lone surrogate"),
    ],
)
def test_bad_texts_are_400_json_errors(server, path, body, message):
    headers = {"Content-Type": "application/json"}
    status, answer, _ = request(server.url + path, body, headers)
    assert status == 400, answer
    assert message in json.loads(answer)["error"]


@pytest.mark.parametrize("path", ["api/explain/text", "api/export"])
def test_a_text_past_the_models_positions_is_refused_in_tokens(server, path):
    # MiniLM reads 512 positions: the limit is the model's, below the viewer's own
    limit = server.workbench.max_tokens
    assert limit == 512 < MAX_TOKENS
    info = json.loads(request(server.url + "api/info")[1])
    assert info["max_tokens"] == limit  # what the page says in its text boxes
    fits = "a " * (limit - 2)  # with [CLS] and [SEP]: exactly the limit
    status, answer, _ = request(server.url + path, {"format": "json", "text": fits})
    assert status == 200, answer
    status, answer, _ = request(server.url + path, {"format": "json", "text": fits + "a"})
    assert status == 400
    error = json.loads(answer)["error"]
    assert error.startswith(f"the text has {limit + 1} tokens; this view takes at most {limit}")
    assert "position embeddings" in error


@pytest.mark.parametrize(
    ("top", "message"),
    [
        (0, "top must be a whole number of classes, 1 or more; got 0"),
        (-1, "got -1"),
        (1.5, "got 1.5"),
        ("2", "got '2'"),
        (True, "got True"),
        (3, "top must be 1..2, got 3"),  # the model's two classes
    ],
)
def test_a_bad_top_is_a_400_that_says_what_top_takes(server, top, message):
    body = {"text": "A warm, funny film.", "top": top}
    status, answer, _ = request(server.url + "api/explain/text", body)
    assert status == 400, answer
    assert message in json.loads(answer)["error"]


def _trained_lengths(value) -> list[int]:
    """Every "length" a zoo model's config records (its task's and its training's)."""
    if isinstance(value, dict):
        found = [v for k, v in value.items() if k == "length" and isinstance(v, int)]
        return found + [n for v in value.values() for n in _trained_lengths(v)]
    if isinstance(value, list):
        return [n for v in value for n in _trained_lengths(v)]
    return []


def test_the_viewer_takes_the_zoos_longest_trained_prompt(tmp_path):
    from explain.data.recall import examples
    from explain.serve import ResultCache, Workbench

    lengths = [
        n
        for config in MODELS.glob("*/config.json")
        for n in _trained_lengths(json.loads(config.read_text()))
    ]
    assert lengths and max(lengths) <= MAX_TOKENS  # recall-llama: 2,048
    workbench = Workbench(load_model("zoo:recall-llama"), ResultCache(tmp_path), "zoo:recall-llama")
    assert workbench.max_tokens == MAX_TOKENS  # its positions reach further (16,384)
    (example,) = examples("heldout", 1, 2048)
    assert workbench.checked_text(example.text) == example.text
    longer = " ".join([example.text] * 2)  # 4,094 words and <s>: 4,095 tokens, still in
    assert workbench.checked_text(longer) == longer
    past = f"{longer} {' '.join(example.text.split()[:2])}"
    with pytest.raises(InputError, match=f"has {MAX_TOKENS + 1} tokens; .* at most {MAX_TOKENS} "):
        workbench.checked_text(past)
