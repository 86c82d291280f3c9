"""What the viewer's browser tests and its README screenshots share: a labelled folder of
held-out shapes scenes to serve, and a fresh headless chromium to look at the page with.

The browser is the system's chromium (Debian: `apt-get install chromium`) driven by
Playwright's Python package; Playwright's own browser downloads are never used, so
nothing is fetched from a network.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from explain.errors import ExplainError

__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "BrowserUnavailable", "headless_chromium", "scene_folder"]

CHROMIUM = "/usr/bin/chromium"
"""Debian's chromium."""
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
"""No sandbox (CI runs as root), no GPU, and nothing that reaches out to a network."""


class BrowserUnavailable(ExplainError):
    """No browser to drive: Playwright's package or the system chromium is missing."""


def scene_folder(folder: str | Path, count: int) -> Path:
    """`count` held-out shapes scenes as PNGs under `folder`, each in the subfolder of
    its first object's kind (its label, as the gallery reads it)."""
    from PIL import Image

    from explain.data.shapes import KINDS, SPLITS, render_scene

    folder = Path(folder)
    for index in range(count):
        scene = render_scene(SPLITS["heldout"][index])
        label = folder / KINDS[scene.kinds[0]]
        label.mkdir(parents=True, exist_ok=True)
        pixels = (scene.image * 255).round().astype(np.uint8)
        Image.fromarray(pixels).save(label / f"scene_{index}.png")
    return folder


@contextlib.contextmanager
def headless_chromium(executable: str = CHROMIUM) -> Iterator[Any]:
    """A Playwright browser context of a fresh headless chromium with its own empty
    profile (removed afterwards), downloads accepted; BrowserUnavailable if there is none."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise BrowserUnavailable(
            "the playwright package is not installed (pip install 'explain-transformers[dev]')"
        ) from None
    if not Path(executable).exists():
        raise BrowserUnavailable(f"no chromium at {executable} (as root: apt-get install chromium)")
    profile = tempfile.mkdtemp(prefix="explain-chromium-")
    try:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                profile,
                executable_path=executable,
                headless=True,
                args=list(CHROMIUM_ARGS),
                accept_downloads=True,
                viewport={"width": 1280, "height": 900},
            )
            context.set_default_timeout(20_000)
            try:
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
