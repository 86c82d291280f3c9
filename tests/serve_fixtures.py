"""What the `explain serve` tests share: a labelled folder of shapes scenes, a server
running in a thread, plain HTTP requests, and Debian's chromium driven by Playwright."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def shapes_folder(folder: Path, count: int) -> Path:
    """`count` held-out shapes scenes as PNGs under `folder`, each in the subfolder of
    its first object's kind (its label)."""
    from PIL import Image

    from explain.data.shapes import KINDS, SPLITS, render_scene

    for index in range(count):
        scene = render_scene(SPLITS["heldout"][index])
        label = folder / KINDS[scene.kinds[0]]
        label.mkdir(parents=True, exist_ok=True)
        pixels = (scene.image * 255).round().astype(np.uint8)
        Image.fromarray(pixels).save(label / f"scene_{index}.png")
    return folder


@contextlib.contextmanager
def serving(loaded: Any, spec: str, data: Path | None, cache: Path) -> Iterator[Any]:
    """The app of `loaded` over `data` served from a thread; yields the BackgroundServer
    (its `.url`, and `.workbench`)."""
    from explain.serve import BackgroundServer, ResultCache, Workbench, build_app, read_data

    workbench = Workbench(loaded, ResultCache(cache), spec)
    app = build_app(workbench, read_data(data))
    with BackgroundServer(app) as server:
        server.workbench = workbench
        server.app = app
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
    """A fresh headless Debian chromium (its own empty profile), as a Playwright browser
    context; the test is skipped, saying why, where there is none."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed (pip install -e '.[dev]')")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM} (as root: apt-get install -y chromium)")
    profile = tempfile.mkdtemp(prefix="explain-chromium-")
    try:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                profile,
                executable_path=CHROMIUM,
                headless=True,
                args=CHROMIUM_ARGS,
                accept_downloads=True,
                bypass_csp=True,  # the page forbids eval; Playwright's waits need it
                viewport={"width": 1280, "height": 900},
            )
            context.set_default_timeout(20_000)
            try:
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
