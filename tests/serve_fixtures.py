"""What the `explain serve` tests share: a server running in a thread, plain HTTP
requests, and Debian's chromium driven by Playwright (explain.serve.demo)."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@contextlib.contextmanager
def serving(
    loaded: Any,
    spec: str,
    data: Path | None,
    cache: Path,
    prepare: Callable[[Any], None] | None = None,
) -> Iterator[Any]:
    """The app of `loaded` over `data` served from a thread; yields the BackgroundServer
    (its `.url`, and `.workbench`). `prepare(workbench)` runs before the app starts."""
    from explain.serve import BackgroundServer, ResultCache, Workbench, build_app, read_data

    workbench = Workbench(loaded, ResultCache(cache), spec)
    if prepare is not None:
        prepare(workbench)
    app = build_app(workbench, read_data(data))
    with BackgroundServer(app) as server:
        server.workbench = workbench
        yield server


def request(
    url: str,
    body: bytes | dict | None = None,
    headers: dict[str, str] | None = None,
    method: str | None = None,
) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, headers) of one HTTP request; a dict body is sent as JSON."""
    headers = dict(headers or {})
    if isinstance(body, dict):
        body = json.dumps(body).encode()
        headers.setdefault("Content-Type", "application/json")
    call = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(call, timeout=60) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def wait_for_gallery(url: str, timeout: float = 60) -> dict:
    """The gallery once the first pass is done."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        gallery = json.loads(request(url + "api/gallery")[1])
        progress = gallery["progress"]
        if progress["done"] == progress["total"] or time.monotonic() > deadline:
            return gallery
        time.sleep(0.1)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A fresh headless Debian chromium as a Playwright browser context; the test is
    skipped, saying why, where there is none."""
    from explain.serve.demo import BrowserUnavailable, headless_chromium

    with contextlib.ExitStack() as stack:
        try:
            context = stack.enter_context(headless_chromium())
        except BrowserUnavailable as error:
            pytest.skip(str(error))
        yield context
