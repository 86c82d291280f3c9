"""The README's screenshots of `explain serve`, taken from the real page in Debian's
headless chromium: the gallery of 16 held-out shapes scenes (zoo:shapes-vit; one filed
under a wrong label), each captioned with every class found in it, and one scene's view
(generic, attnlrp and rollout x its two top classes, over the scene in grey).

    python scripts/serve_screenshots.py            # writes docs/images/serve-*.png
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from playwright.sync_api import expect

from explain.loading.specs import load_model
from explain.serve import BackgroundServer, ResultCache, Workbench, build_app, read_data
from explain.serve.demo import headless_chromium, scene_folder

SPEC = "zoo:shapes-vit"
SCENES = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        data = scene_folder(Path(scratch) / "scenes", SCENES)
        # One scene filed under a kind it does not hold, so the gallery shows a mistake.
        (data / "star").mkdir(exist_ok=True)
        (data / "circle" / "scene_2.png").rename(data / "star" / "scene_2.png")
        workbench = Workbench(load_model(SPEC), ResultCache(Path(scratch) / "cache"), SPEC)
        app = build_app(workbench, read_data(data))
        with BackgroundServer(app) as server, headless_chromium() as browser:
            page = browser.new_page()
            page.set_viewport_size({"width": 1100, "height": 740})
            page.goto(server.url)
            page.wait_for_selector("#progress", state="hidden")
            page.select_option("#sort", "confidence-asc")
            time.sleep(0.5)  # thumbnails decoded
            page.screenshot(path=args.out / "serve-gallery.png", full_page=True)
            page.click(".card >> nth=0")
            page.wait_for_selector("#grid canvas")
            for method in ("attnlrp", "rollout"):
                page.check(f"#methods input[value={method}]")
                page.wait_for_selector(f"#grid canvas[data-method={method}]")
            page.fill("#top", "2")
            page.dispatch_event("#top", "change")
            expect(page.locator("#grid canvas")).to_have_count(6)
            page.set_viewport_size({"width": 1100, "height": 960})
            page.locator("#grid canvas[data-method=generic]").first.hover(
                position={"x": 120, "y": 110}
            )
            page.screenshot(path=args.out / "serve-image.png", full_page=True)
    for name in ("serve-gallery.png", "serve-image.png"):
        print(args.out / name)


if __name__ == "__main__":
    main()
