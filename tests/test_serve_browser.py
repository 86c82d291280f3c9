"""`explain serve` in a real browser: Debian's chromium, headless, driven by Playwright
through the flows a user takes (gallery, one image, class and method switches, hover,
upload, export, text, generation, CLIP), asserting on what is drawn and on the values the
page shows, which must equal `Explainer.explain` (or `explain_generation`) for that input.
"""

from __future__ import annotations

import base64
import io
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from serve_fixtures import chromium, serving

from explain import Explainer, Explanation
from explain.inputs import read_image
from explain.loading.specs import load_model
from explain.serve.demo import scene_folder

SCENES = 10
expect = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]'").expect


@pytest.fixture(scope="module")
def browser():
    with chromium() as context:
        yield context


@pytest.fixture(scope="module")
def shapes_vit():
    return load_model("zoo:shapes-vit")


@pytest.fixture(scope="module")
def image_server(tmp_path_factory, shapes_vit):
    root = tmp_path_factory.mktemp("serve-images")
    data = scene_folder(root / "data", SCENES)
    # One scene filed under a kind it does not hold: a mistake for the filter to find.
    (data / "star").mkdir(exist_ok=True)
    (data / "circle" / "scene_2.png").rename(data / "star" / "scene_2.png")
    with serving(shapes_vit, "zoo:shapes-vit", data, root / "cache") as server:
        server.data = data
        yield server


def open_page(browser, url):
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    # Console errors include the browser's own: a Content-Security-Policy violation, a
    # failed request. The page runs under its real policy (no eval, no inline code).
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    # Offline: everything the page loads comes from the server (or is made in the page).
    page.on(
        "request",
        lambda sent: (
            sent.url.startswith((url, "data:", "blob:"))
            or errors.append(f"request outside the server: {sent.url}")
        ),
    )
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]")
    page.errors = errors
    return page


def settled(page):
    """Wait until no request of the page is in flight, then check it reported no error."""
    page.wait_for_selector("body:not(.busy)")
    assert page.is_hidden("#message"), page.inner_text("#message")
    assert not page.errors


def canvas_pixels(page, selector):
    """The RGBA pixels drawn on the canvas `selector`, as a numpy array."""
    url = page.eval_on_selector(selector, "c => c.toDataURL('image/png')")
    return png_pixels(base64.b64decode(url.split(",", 1)[1]))


def png_pixels(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGBA"))


def reference(loaded, photo, method, classes):
    """(K, gh, gw) relevance of `photo` for `classes` with `method`, by Explainer.explain."""
    images = loaded.preprocessing([photo])
    result = Explainer(loaded.model).explain(images, target=torch.tensor([classes]), method=method)
    return result.relevance[0]


def hover_value(page, canvas, readout, x, y):
    page.locator(canvas).hover(position={"x": x, "y": y})
    value = float(page.get_attribute(readout, "data-value"))
    return (
        value,
        int(page.get_attribute(readout, "data-row")),
        int(page.get_attribute(readout, "data-column")),
    )


def test_gallery_fills_sorts_and_filters(browser, image_server):
    page = open_page(browser, image_server.url)
    expect(page.locator(".card .verdict[data-confidence]")).to_have_count(SCENES)
    page.wait_for_selector("#progress", state="hidden")
    settled(page)
    gallery = json.loads(page.evaluate("fetch('/api/gallery').then(r => r.text())"))
    shown = page.eval_on_selector_all(".card", "cards => cards.map(c => c.dataset.path)")
    assert shown == sorted(item["path"] for item in gallery["items"])
    # Thumbnails are drawn (decoded by the browser), not broken links: once every image
    # has finished loading (the page's busy flag follows its API requests, not images).
    page.wait_for_function("[...document.querySelectorAll('.card img')].every(i => i.complete)")
    widths = page.eval_on_selector_all(".card img", "images => images.map(i => i.naturalWidth)")
    assert widths == [64] * SCENES

    page.select_option("#sort", "confidence-asc")
    confidences = page.eval_on_selector_all(
        ".card .verdict", "vs => vs.map(v => Number(v.dataset.confidence))"
    )
    assert confidences == sorted(confidences)
    expected = {item["path"]: item["prediction"]["confidence"] for item in gallery["items"]}
    assert sorted(confidences) == pytest.approx(sorted(expected.values()))

    page.check("#mistakes")
    wrong = sorted(item["path"] for item in gallery["items"] if item["correct"] is False)
    assert "star/scene_2.png" in wrong
    shown = page.eval_on_selector_all(".card", "cards => cards.map(c => c.dataset.path)")
    assert sorted(shown) == wrong
    assert all(page.eval_on_selector_all(".card", "cs => cs.map(c => c.matches('.wrong'))"))
    page.close()


def test_the_first_pass_shows_its_progress_and_fills_the_gallery(browser, shapes_vit, tmp_path):
    data = scene_folder(tmp_path / "data", 3)
    release = threading.Event()

    def held(workbench):
        predict = workbench.predict_images

        def wait_then_predict(*args):
            assert release.wait(30)
            return predict(*args)

        workbench.predict_images = wait_then_predict

    with serving(shapes_vit, "zoo:shapes-vit", data, tmp_path / "cache", held) as server:
        page = open_page(browser, server.url)
        page.wait_for_selector("#progress:not([hidden])")
        assert page.inner_text("#progress-text") == "explaining the folder: 0 of 3"
        assert page.locator(".card").count() == 3
        assert page.locator(".card .verdict[data-confidence]").count() == 0
        release.set()
        page.wait_for_selector("#progress", state="hidden")
        expect(page.locator(".card .verdict[data-confidence]")).to_have_count(3)
        settled(page)
        page.close()


def test_image_view_switch_hover_compare_and_export(browser, image_server, shapes_vit, tmp_path):
    page = open_page(browser, image_server.url)
    path = "circle/scene_0.png"
    page.click(f".card[data-path='{path}']")
    page.wait_for_selector("#grid canvas[data-method=generic]")
    settled(page)
    photo = read_image(image_server.data / path)
    first = "#grid canvas[data-method=generic] >> nth=0"
    predicted = int(page.get_attribute(first, "data-class"))
    assert predicted == int(reference_logits(shapes_vit, photo).argmax())
    before = canvas_pixels(page, "#grid canvas[data-method=generic]")

    # Hover: the value shown is the engine's value for that patch.
    maps = reference(shapes_vit, photo, "generic", [predicted])
    value, row, column = hover_value(page, first, "#hover", 150, 40)
    assert (row, column) == (int(40 / 224 * 8), int(150 / 224 * 8))
    torch.testing.assert_close(torch.tensor(value), maps[0, row, column])

    # The top two classes: one column each, in the model's order.
    page.fill("#top", "2")
    page.dispatch_event("#top", "change")
    expect(page.locator("#grid canvas")).to_have_count(2)
    settled(page)
    shown = page.eval_on_selector_all("#grid canvas", "cs => cs.map(c => Number(c.dataset.class))")
    assert shown == reference_logits(shapes_vit, photo).argsort(descending=True)[:2].tolist()

    # Switch the class by name: the map is redrawn for that class.
    other = 1 if predicted != 1 else 2
    name = shapes_vit.classes[other]
    page.select_option("#class", label=f"{name} ({other})")
    page.wait_for_selector(f"#grid canvas[data-class='{other}']")
    settled(page)
    assert page.locator("#grid canvas").count() == 1
    assert page.locator("#grid th", has_text=name).count() == 1
    after = canvas_pixels(page, "#grid canvas[data-method=generic]")
    assert np.abs(after.astype(int) - before.astype(int)).max() > 30
    value, row, column = hover_value(page, first, "#hover", 100, 100)
    expected = reference(shapes_vit, photo, "generic", [other])[0, row, column]
    torch.testing.assert_close(torch.tensor(value), expected)

    # Compare two methods side by side under one stated normalisation.
    page.check("#methods input[value=rollout]")
    page.wait_for_selector("#grid canvas[data-method=rollout]")
    page.select_option("#rule", "shared")
    expect(page.locator("#caption")).to_contain_text("One scale for every map")
    settled(page)
    assert "One scale for every map" in page.inner_text("#caption")
    assert page.locator("#keys .key").count() == 1
    where = "cs => cs.map(c => c.getBoundingClientRect().y)"
    tops = page.eval_on_selector_all("#grid canvas", where)
    assert len(tops) == 2 and tops[0] == tops[1]  # side by side
    rollout = "#grid canvas[data-method=rollout] >> nth=0"
    value, row, column = hover_value(page, rollout, "#hover", 60, 180)
    expected = reference(shapes_vit, photo, "rollout", [other])[0, row, column]
    torch.testing.assert_close(torch.tensor(value), expected)
    assert page.inner_text("#hover").startswith(f"rollout · {name}: patch ({row}, {column})")

    # Export: the view as PNG, the relevance through Explanation.save (npz and json).
    with page.expect_download() as download:
        page.click("#export-png")
    picture = png_pixels(Path(download.value.path()).read_bytes())
    assert picture.shape[1] > 2 * 224  # two 224-pixel maps side by side, with labels
    assert picture[..., :3].std() > 20  # drawn, not blank
    for fmt in ("npz", "json"):
        with page.expect_download() as download:
            page.click(f"#export-{fmt}")
        saved = tmp_path / download.value.suggested_filename
        download.value.save_as(saved)
        assert saved.suffix == f".{fmt}"
        loaded = Explanation.load(saved)
        assert loaded.method == "generic" and loaded.target.tolist() == [[other]]
        torch.testing.assert_close(
            loaded.relevance[0].float(), reference(shapes_vit, photo, "generic", [other])
        )
    page.close()


def reference_logits(loaded, photo):
    result = Explainer(loaded.model).explain(loaded.preprocessing([photo]), method="generic")
    return result.logits[0]


def test_upload_by_drop_and_by_file_input(browser, image_server, shapes_vit, tmp_path):
    from PIL import Image

    from explain.data.shapes import SPLITS, render_scene

    scene = render_scene(SPLITS["heldout"][SCENES + 1])
    upload = tmp_path / "upload.png"
    Image.fromarray((scene.image * 255).round().astype(np.uint8)).save(upload)
    photo = read_image(upload)
    predicted = int(reference_logits(shapes_vit, photo).argmax())
    page = open_page(browser, image_server.url)

    # Drag and drop: a file dropped on the drop zone.
    page.evaluate(
        """async (data) => {
            const bytes = Uint8Array.from(atob(data), c => c.charCodeAt(0));
            const transfer = new DataTransfer();
            transfer.items.add(new File([bytes], 'dropped.png', {type: 'image/png'}));
            const zone = document.getElementById('drop');
            zone.dispatchEvent(new DragEvent('drop', {dataTransfer: transfer, bubbles: true}));
        }""",
        base64.b64encode(upload.read_bytes()).decode(),
    )
    page.wait_for_selector("#grid canvas[data-method=generic]")
    settled(page)
    assert page.inner_text("#image-title").startswith("upload/")
    canvas = "#grid canvas[data-method=generic] >> nth=0"
    assert int(page.get_attribute(canvas, "data-class")) == predicted
    value, row, column = hover_value(page, canvas, "#hover", 30, 200)
    expected = reference(shapes_vit, photo, "generic", [predicted])[0, row, column]
    torch.testing.assert_close(torch.tensor(value), expected)

    # The file chooser; a file that is not an image is refused with a message.
    page.click("#back")
    not_image = tmp_path / "notes.png"
    not_image.write_text("not an image")
    page.set_input_files("#upload", str(not_image))
    page.wait_for_selector("#message:not([hidden])")
    assert "not an image" in page.inner_text("#message")
    page.close()


def test_text_view_token_relevance(browser, tmp_path):
    loaded = load_model("zoo:minilm-sentiment")
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("a dull and tedious film\nthe acting was <b>superb</b>\n")
    with serving(loaded, "zoo:minilm-sentiment", sentences, tmp_path / "cache") as server:
        page = open_page(browser, server.url)
        page.click("#sentences li >> nth=1")  # markup in a sentence is shown as text
        page.wait_for_selector("#text-results .token")
        settled(page)
        text = "the acting was <b>superb</b>"
        result = Explainer(loaded.model, tokenizer=loaded.tokenizer).explain(
            [text], method="generic"
        )
        tokens = page.eval_on_selector_all(
            "#text-results .token", "ts => ts.map(t => t.textContent)"
        )
        assert tokens == result.tokens[0]
        assert page.locator("#text-results b").count() == 0
        label = page.inner_text("#text-results .row-label")
        assert label.startswith(f"generic · {loaded.classes[int(result.target[0])]}")
        for index in (2, 5):
            page.hover(f"#text-results .token >> nth={index}")
            shown = float(page.get_attribute("#text-hover", "data-value"))
            torch.testing.assert_close(torch.tensor(shown), result.relevance[0, index])

        # Both classes, two methods: one row each, coloured differently.
        page.fill("#text-top", "2")
        page.dispatch_event("#text-top", "change")
        expect(page.locator("#text-results .token-row")).to_have_count(2)
        page.check("#text-methods input[value=attnlrp]")
        expect(page.locator("#text-results .token-row")).to_have_count(4)
        settled(page)
        colours = page.eval_on_selector_all(
            "#text-results .token-row",
            "rows => rows.map(r => r.querySelector('.token:nth-child(3)').style.backgroundColor)",
        )
        assert len(set(colours)) > 1

        # Export: the view as PNG (tokens on their colours), the relevance as json.
        with page.expect_download() as download:
            page.click("#text-export-png")
        picture = png_pixels(Path(download.value.path()).read_bytes())
        assert picture[..., :3].std() > 20  # drawn, not blank
        with page.expect_download() as download:
            page.click("#text-export-json")
        saved = tmp_path / download.value.suggested_filename
        download.value.save_as(saved)
        exported = Explanation.load(saved)
        assert exported.method == "attnlrp"  # the first method ticked
        both = result.logits.argsort(descending=True)[:, :2]
        expected = Explainer(loaded.model, tokenizer=loaded.tokenizer).explain(
            [text], target=both, method="attnlrp"
        )
        assert exported.tokens == expected.tokens and exported.target.tolist() == both.tolist()
        torch.testing.assert_close(exported.relevance.float(), expected.relevance)
        page.close()


def test_generation_view_click_a_word(browser, tmp_path):
    from explain.generation import explain_generation
    from explain.testing.tiny_lm import save_tiny_lm

    folder = save_tiny_lm(tmp_path / "tiny-llama", "llama")
    loaded = load_model(folder)
    with serving(loaded, str(folder), None, tmp_path / "cache") as server:
        page = open_page(browser, server.url)
        page.fill("#prompt", "w10 w11 a&b <script>")
        page.fill("#max-new-tokens", "4")
        page.click("#generate")
        page.wait_for_selector("#generation .token.generated")
        settled(page)
        explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
        found = explain_generation(explainer, "w10 w11 a&b <script>", max_new_tokens=4)
        tokens = page.eval_on_selector_all("#generation .token", "ts => ts.map(t => t.textContent)")
        width = found.generation.prompt_length
        count = int(found.generation.generated[0].sum())
        assert tokens == found.explanation.tokens[0][: width + count]
        assert "<script>" in tokens and page.locator("#generation script").count() == 0
        page.click("#generation .token.generated >> nth=1")
        coloured = page.eval_on_selector_all(
            "#generation .token", "ts => ts.map(t => t.style.backgroundColor !== '')"
        )
        assert coloured == [i < width + 1 for i in range(len(tokens))]
        for index in (0, width):
            page.hover(f"#generation .token >> nth={index}")
            shown = float(page.get_attribute("#gen-hover", "data-value"))
            torch.testing.assert_close(
                torch.tensor(shown), found.explanation.relevance[0, 1, index]
            )
        with page.expect_download() as download:
            page.click("#gen-export-png")
        assert png_pixels(Path(download.value.path()).read_bytes())[..., :3].std() > 20
        page.close()


def test_clip_view_captions(browser, tmp_path):
    loaded = load_model("zoo:shapes-clip")
    data = scene_folder(tmp_path / "data", 2)
    captions = ["a red circle", "a green triangle"]
    with serving(loaded, "zoo:shapes-clip", data, tmp_path / "cache") as server:
        page = open_page(browser, server.url)
        page.click(".card >> nth=0")
        page.fill("#captions", "\n".join(captions))
        page.click("#explain-clip")
        page.wait_for_selector("#clip-results canvas")
        settled(page)
        path = page.inner_text("#clip-title")
        photo = read_image(data / path)
        texts = loaded.tokenizer(captions, padding=True, return_tensors="pt")
        result = Explainer(loaded.model, tokenizer=loaded.tokenizer).explain(
            {**texts, "pixel_values": loaded.preprocessing([photo])},
            target=torch.arange(2)[None],
            method="generic",
        )
        assert page.locator("#clip-results canvas").count() == 2
        labels = page.eval_on_selector_all(
            "#clip-results .row-label", "ls => ls.map(l => l.textContent)"
        )
        probabilities = result.logits.softmax(dim=-1)[0]
        pairs = zip(captions, probabilities, strict=True)
        assert labels == [f"{c} (p = {float(p):.3f})" for c, p in pairs]
        for k in range(2):
            value, row, column = hover_value(
                page, f"#clip-results canvas >> nth={k}", "#clip-hover", 120, 90
            )
            torch.testing.assert_close(torch.tensor(value), result.relevance[0, k, row, column])
        images = [
            canvas_pixels(page, f"#clip-results .clip-caption:nth-child({k + 1}) canvas")
            for k in range(2)
        ]
        assert np.abs(images[0].astype(int) - images[1].astype(int)).max() > 30

        # Export: the image and text relevance for every caption (Explanation.save).
        with page.expect_download() as download:
            page.click("#clip-export-npz")
        saved = tmp_path / download.value.suggested_filename
        download.value.save_as(saved)
        exported = Explanation.load(saved)
        assert exported.settings["captions"] == captions
        torch.testing.assert_close(exported.relevance, result.relevance)
        torch.testing.assert_close(exported.relevances["text"], result.relevances["text"])
        page.close()
