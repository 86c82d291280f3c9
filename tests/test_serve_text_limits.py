"""The viewer's text requests (issue 46): a text with a lone surrogate is a 400 JSON
error, not a 500, and an export of a text keeps the views' length limit."""

from __future__ import annotations

import json

import pytest
from serve_fixtures import request, serving

from explain.loading.specs import load_model
from explain.serve.workbench import MAX_TEXT

pytest.importorskip("transformers")


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
        (
            "api/export",
            json.dumps({"format": "json", "text": "a " * MAX_TEXT}).encode(),
            f"at most {MAX_TEXT}",
        ),
    ],
)
def test_bad_texts_are_400_json_errors(server, path, body, message):
    headers = {"Content-Type": "application/json"}
    status, answer, _ = request(server.url + path, body, headers)
    assert status == 400, answer
    assert message in json.loads(answer)["error"]
