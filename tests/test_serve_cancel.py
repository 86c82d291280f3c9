"""The viewer stops the work of a request whose client has gone (issue 46: six cancelled
requests went on computing every method, 111-281 s of work nobody received)."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import pytest
from serve_fixtures import serving

from explain.loading.specs import load_model

pytest.importorskip("transformers")

METHODS = ["generic", "rollout", "attention_gradcam", "raw_attention"]


def test_a_cancelled_request_stops_before_its_next_method(tmp_path):
    loaded = load_model("zoo:minilm-sentiment")
    calls: list[str] = []

    def counted(workbench):
        explain = workbench.explainer.explain

        def slow(*args, **kwargs):  # each method's work takes a while: time to hang up
            calls.append(kwargs.get("method"))
            time.sleep(0.5)
            return explain(*args, **kwargs)

        workbench.explainer.explain = slow

    with serving(loaded, "zoo:minilm-sentiment", None, tmp_path, counted) as server:
        address = urlsplit(server.url)
        body = json.dumps({"text": "a fine film", "methods": METHODS}).encode()
        head = (
            f"POST /api/explain/text HTTP/1.1\r\nHost: {address.hostname}:{address.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        with socket.create_connection((address.hostname, address.port)) as client:
            client.sendall(head.encode() + body)
            time.sleep(0.2)  # inside the first pass's explanation
        # the first pass and at most one method's work are under way when it hangs up
        time.sleep(0.5 * (len(METHODS) + 2))
        assert len(calls) <= 2, calls
