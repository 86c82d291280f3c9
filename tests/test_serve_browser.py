"""`explain serve` in a real browser: Debian's chromium, headless, driven by Playwright
through the flows a user takes (gallery, one image, class and method switches, hover,
upload, export, text, generation, CLIP), asserting on what is drawn and on the values the
page shows, which must equal `Explainer.explain` (or `explain_generation`) for that input.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from serve_fixtures import chromium, request, serving
from tolerances import FLOAT32

from explain import Explainer, Explanation
from explain.engine import Request, supported_methods
from explain.inputs import read_image
from explain.loading import load_model
from explain.serve.demo import scene_folder
from explain.viz.image import greyed

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


def test_the_gallery_shows_every_class_a_multi_label_model_finds(browser, image_server, shapes_vit):
    """shapes-vit scores six independent yes/no classes: a scene of a circle, a star and
    a cross is captioned with all three (each above one half), not with its top class."""
    page = open_page(browser, image_server.url)
    expect(page.locator(".card .verdict[data-confidence]")).to_have_count(SCENES)
    settled(page)
    several = 0
    for path in page.eval_on_selector_all(".card", "cards => cards.map(c => c.dataset.path)"):
        photo = read_image(image_server.data / path)
        confidences = reference_logits(shapes_vit, photo).double().sigmoid()
        present = [int(i) for i in confidences.argsort(descending=True) if confidences[i] > 0.5]
        verdict = page.inner_text(f".card[data-path='{path}'] .verdict")
        listed = ", ".join(
            f"{shapes_vit.classes[i]} ({100 * float(confidences[i]):.1f}%)" for i in present
        )
        assert verdict.startswith(listed), (path, verdict)
        several += len(present) > 1
    assert several >= 5  # most scenes hold two or three kinds
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
    show_top(page, 2, canvases=2)
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
    hovered = f"rollout (class-agnostic) · {name}: patch ({row}, {column})"
    assert page.inner_text("#hover").startswith(hovered)

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


def test_a_class_agnostic_method_is_marked_as_the_figures_mark_it(browser, image_server):
    """Rollout reads no class: its maps of two classes are the same, and its row is
    headed as explanation_grid heads it, the mark explained on hover; generic's is not."""
    from explain.viz.image import CLASS_AGNOSTIC, method_label

    page = open_page(browser, image_server.url)
    open_image(page, "circle/scene_0.png", methods=("generic", "rollout"))
    show_top(page, 2, canvases=4)
    rows = page.eval_on_selector_all(
        "#grid tr th:first-child", "hs => hs.map(h => [h.textContent, h.title])"
    )
    assert rows == [["", ""], ["generic", ""], [method_label("rollout", True), CLASS_AGNOSTIC]]
    assert method_label("rollout", True) == "rollout (class-agnostic)"
    one, two = (
        canvas_pixels(page, f"#grid canvas[data-method=rollout] >> nth={k}") for k in (0, 1)
    )
    assert np.array_equal(one, two)  # what the mark says
    page.close()


@pytest.mark.parametrize(
    ("top", "shown"), [("0", "got 0"), ("1.5", "got 1.5"), ("9", "1..{classes}, got 9")]
)
def test_a_top_the_model_cannot_take_is_refused_with_what_it_takes(
    browser, image_server, shapes_vit, top, shown
):
    """A `top` of 0 once showed the top-1 map without a word: now the page sends what
    was typed and says why the server refuses it, leaving no map of other settings."""
    shown = shown.format(classes=len(shapes_vit.classes))
    page = open_page(browser, image_server.url)
    open_image(page, "circle/scene_0.png")
    ask_top(page, top)
    page.wait_for_selector("#message:not([hidden])")
    message = page.inner_text("#message")
    assert "top must be" in message and shown in message, message
    assert page.locator("#grid canvas").count() == 0
    page.close()


def ask_top(page, top):
    """Type `top` into the page's "top classes" box, as a user does (the box's change event)."""
    page.fill("#top", top)
    page.dispatch_event("#top", "change")


def show_top(page, top, canvases):
    """Ask for the `top` classes and wait until the grid has drawn its `canvases` maps."""
    ask_top(page, str(top))
    expect(page.locator("#grid canvas")).to_have_count(canvases)
    settled(page)


def open_image(page, path, methods=("generic",), rule="per_map"):
    """Open the gallery image `path` with `methods` ticked under `rule`, settled."""
    page.click(f".card[data-path='{path}']")
    page.wait_for_selector("#grid canvas[data-method=generic]")
    for method in methods:
        if method != "generic":
            page.check(f"#methods input[value={method}]")
            page.wait_for_selector(f"#grid canvas[data-method={method}]")
    if rule != "per_map":
        page.select_option("#rule", rule)
        expect(page.locator("#caption")).not_to_contain_text("Each map")
    settled(page)


def chroma(pixels: np.ndarray) -> np.ndarray:
    """How far from grey each pixel is: its largest minus its smallest channel."""
    rgb = pixels[..., :3].astype(int)
    return rgb.max(axis=-1) - rgb.min(axis=-1)


def test_maps_are_drawn_over_the_image_in_grey(browser, image_server):
    """As the figures draw them (explain.viz.image.greyed): every colour on a map is
    relevance, so a red circle under a map is never taken for heat."""
    page = open_page(browser, image_server.url)
    asked = []
    page.on("request", lambda sent: "/api/view" in sent.url and asked.append(sent.url))
    path = "circle/scene_0.png"
    open_image(page, path)
    # The picture under the maps is the figures' grey copy of the image the model sees.
    (under,) = {url for url in asked if "background=grey" in url}
    _, colour, _ = request(f"{image_server.url}api/view?item={path}")
    status, grey, _ = request(under)
    assert status == 200
    colour_pixels = png_pixels(colour)[..., :3]
    expected = np.round(greyed(colour_pixels) * 255)
    assert np.abs(png_pixels(grey)[..., :3] - expected).max() <= 1

    # What is drawn: where the map is transparent (no relevance there or next to it),
    # the canvas is grey although the image is coloured there.
    display = np.array(page.evaluate("state.answer").get("methods")[0]["maps"][0]["display"])
    drawn = canvas_pixels(page, "#grid canvas[data-method=generic]")
    rows, columns = display.shape
    patch = drawn.shape[0] // rows
    seen = chroma(colour_pixels)
    shown, under_colour = [], []
    for r in range(rows):
        for c in range(columns):
            around = display[max(r - 1, 0) : r + 2, max(c - 1, 0) : c + 2]
            if display[r, c] < 0.005 and around.max() < 0.02:
                shown.append(chroma(drawn[r * patch + patch // 2, c * patch + patch // 2]))
                step = colour_pixels.shape[0] // rows
                under_colour.append(seen[r * step + step // 2, c * step + step // 2])
    assert len(shown) > 10
    assert max(under_colour) > 20  # the image is coloured in these places...
    assert max(shown) <= 6  # ...and the map shows it in grey
    page.close()


def test_signed_panels_carry_the_mark_their_key_promises(browser, image_server):
    """AttnLRP's maps are signed, generic's are not: with both on screen, the diverging
    key is titled for the panels marked ±, and exactly the signed panels carry the mark."""
    page = open_page(browser, image_server.url)
    for rule in ("per_map", "shared"):
        open_image(page, "circle/scene_0.png", ("generic", "attnlrp"), rule)
        titles = page.eval_on_selector_all(
            "#keys .key",
            "ks => ks.map(k => [k.dataset.signed, k.querySelector('.title').textContent])",
        )
        assert [signed for signed, _ in titles] == ["false", "true"]
        assert "marked ±" in titles[1][1] and "±" not in titles[0][1]
        panels = page.eval_on_selector_all(
            "#grid .panel",
            """ps => ps.map(p => {
                const canvas = p.querySelector('canvas').getBoundingClientRect();
                const mark = p.querySelector('.mark');
                const box = mark && mark.getBoundingClientRect();
                return [p.querySelector('canvas').dataset.method, mark && mark.textContent,
                        !box || (box.left >= canvas.left && box.right <= canvas.right
                                 && box.top >= canvas.top && box.bottom <= canvas.bottom)];
            })""",
        )
        assert sorted(panels) == [["attnlrp", "±", True], ["generic", None, True]]
        page.click("#back")
    page.close()


def test_signed_and_unsigned_maps_each_get_their_own_shared_scale(
    browser, image_server, shapes_vit
):
    """Under "one scale", generic (peaks near 0.03) and AttnLRP (near 2) are drawn on two
    shared scales, each with its key: on one red-blue scale generic would look blank."""
    page = open_page(browser, image_server.url)
    path = "circle/scene_0.png"
    open_image(page, path, ("generic", "attnlrp"), "shared")
    show_top(page, 2, canvases=4)
    classes = page.eval_on_selector_all(
        "#grid canvas[data-method=generic]", "cs => cs.map(c => Number(c.dataset.class))"
    )
    photo = read_image(image_server.data / path)
    generic = reference(shapes_vit, photo, "generic", classes).double()
    attnlrp = reference(shapes_vit, photo, "attnlrp", classes).double()
    unsigned_peak, signed_peak = float(generic.abs().max()), float(attnlrp.abs().max())
    assert signed_peak > 20 * unsigned_peak  # what made generic invisible on one scale
    keys = page.eval_on_selector_all(
        "#keys .key",
        "ks => ks.map(k => [k.dataset.signed, "
        "[...k.querySelectorAll('.ends span')].map(s => s.textContent)])",
    )
    assert keys == [
        ["false", ["0", f"{unsigned_peak:.3g}"]],
        ["true", [f"{-signed_peak:.3g}", "0", f"{signed_peak:.3g}"]],
    ]
    scales = {"generic": (generic, unsigned_peak), "attnlrp": (attnlrp, signed_peak)}
    for entry in page.evaluate("state.answer")["methods"]:
        maps, peak = scales[entry["method"]]
        for k, shown in enumerate(entry["maps"]):
            assert shown["signed"] == (entry["method"] == "attnlrp")
            np.testing.assert_allclose(shown["display"], maps[k] / peak, rtol=1e-4, atol=1e-6)
    # What is drawn: generic's strongest patch is in full colour, not near-white.
    for k, column in enumerate(classes):
        drawn = canvas_pixels(page, f"#grid canvas[data-method=generic][data-class='{column}']")
        r, c = divmod(int(generic[k].argmax()), generic.shape[-1])
        patch = drawn.shape[0] // generic.shape[-2]
        assert chroma(drawn[r * patch + patch // 2, c * patch + patch // 2]) > 40
    page.close()


def reference_logits(loaded, photo):
    result = Explainer(loaded.model).explain(loaded.preprocessing([photo]), method="generic")
    return result.logits[0]


def test_upload_by_drop_and_by_file_input(browser, image_server, shapes_vit, tmp_path):
    """An upload is explained as a gallery image, and titled by its file's name."""
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
    assert page.inner_text("#image-title") == "dropped.png"  # its name, not its SHA-256
    canvas = "#grid canvas[data-method=generic] >> nth=0"
    assert int(page.get_attribute(canvas, "data-class")) == predicted
    value, row, column = hover_value(page, canvas, "#hover", 30, 200)
    expected = reference(shapes_vit, photo, "generic", [predicted])[0, row, column]
    torch.testing.assert_close(torch.tensor(value), expected)

    # The file chooser. A black image holds no shape: no class reaches one half, and
    # the page says so instead of "predicted" its top class.
    page.click("#back")
    black = tmp_path / "black.png"
    Image.fromarray(np.zeros((64, 64, 3), dtype=np.uint8)).save(black)
    page.set_input_files("#upload", str(black))
    expect(page.locator("#image-title")).to_have_text("black.png")
    page.wait_for_selector("#grid canvas[data-method=generic]")
    settled(page)
    confidences = reference_logits(shapes_vit, read_image(black)).double().sigmoid()
    assert confidences.max() < 0.5
    top = int(confidences.argmax())
    assert page.inner_text("#image-prediction") == (
        f"no class above one half (highest: {shapes_vit.classes[top]} "
        f"({100 * float(confidences[top]):.1f}%))"
    )

    # A file that is not an image is refused with a message.
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
        # AttnLRP's rows are signed, generic's are not: the signed rows carry the ± mark
        # that the diverging key's title promises.
        rows = page.eval_on_selector_all(
            "#text-results .token-row",
            "rows => rows.map(r => [r.dataset.signed, r.querySelectorAll('.mark').length])",
        )
        assert sorted(rows) == [["false", 0]] * 2 + [["true", 1]] * 2
        assert "marked ±" in page.inner_text("#text-keys .key[data-signed=true] .title")

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
        torch.testing.assert_close(exported.relevance.float(), expected.relevance, **FLOAT32)
        page.close()


@contextlib.contextmanager
def generated_page(browser: Any, tmp_path: Path, prompt: str, method: str | None = None):
    """A tiny Llama's page after generating 4 tokens for `prompt` (with `method`, else
    the page's default), and the same generation explained in Python: (page, found)."""
    from explain.generation import explain_generation
    from explain.testing.tiny_lm import save_tiny_lm

    folder = save_tiny_lm(tmp_path / "tiny-llama", "llama")
    loaded = load_model(folder)
    with serving(loaded, str(folder), None, tmp_path / "cache") as server:
        page = open_page(browser, server.url)
        page.fill("#prompt", prompt)
        page.fill("#max-new-tokens", "4")
        if method is not None:
            page.select_option("#gen-method", method)
        page.click("#generate")
        page.wait_for_selector("#generation .token.generated")
        settled(page)
        explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
        yield page, explain_generation(explainer, prompt, max_new_tokens=4, method=method)
        page.close()


def test_generation_view_click_a_word(browser, tmp_path):
    with generated_page(browser, tmp_path, "w10 w11 a&b <script>") as (page, found):
        tokens = page.eval_on_selector_all("#generation .token", "ts => ts.map(t => t.textContent)")
        width = found.generation.prompt_length
        count = int(found.generation.generated[0].sum())
        assert tokens == found.explanation.tokens[0][: width + count]
        assert "<script>" in tokens and page.locator("#generation script").count() == 0
        page.click("#generation .token.generated >> nth=1")
        coloured = page.eval_on_selector_all(
            "#generation .token", "ts => ts.map(t => t.style.backgroundColor !== '')"
        )
        # generated token 1 is read out at generated token 0 (position `width`): that
        # token is hatched, off the scale, as in the figure; the ones before are coloured
        assert coloured == [i < width for i in range(len(tokens))]
        hatched = page.eval_on_selector_all(
            "#generation .token", "ts => ts.map(t => t.classList.contains('readout-token'))"
        )
        assert hatched == [i == width for i in range(len(tokens))]
        for index in (0, width):
            page.hover(f"#generation .token >> nth={index}")
            shown = float(page.get_attribute("#gen-hover", "data-value"))
            torch.testing.assert_close(
                torch.tensor(shown), found.explanation.relevance[0, 1, index], **FLOAT32
            )
        assert "off the scale" in page.inner_text("#gen-hover")
        with page.expect_download() as download:
            page.click("#gen-export-png")
        assert png_pixels(Path(download.value.path()).read_bytes())[..., :3].std() > 20


def test_the_generation_view_says_what_each_token_rests_on_as_the_terminal_does(browser, tmp_path):
    """The page's "generated mostly from" names what `Answer.rests_on` names, as
    `explain generate` prints it (the figure numbers the same cells): the token a
    generated token is read out at is left out, though its own identity term makes it
    the largest of the row."""
    with generated_page(browser, tmp_path, "w10 w11 w12 w13", "generic") as (page, found):
        answer = found.answer()
        tokens = page.eval_on_selector_all("#generation .token", "ts => ts.map(t => t.textContent)")
        assert tokens == answer.tokens
        for g, word in enumerate(answer.generated):
            page.click(f"#generation .token.generated >> nth={g}")
            row, readout = answer.relevance[g], answer.readout(g)
            assert int(row[: readout + 1].argmax()) == readout  # the identity term
            rests = answer.rests_on(g)
            assert rests and readout not in rests
            # by |relevance|, each token with its position and signed value, as printed
            listed = ", ".join(f"{answer.tokens[i]!r}@{i} {float(row[i]):.3g}" for i in rests)
            assert page.inner_text("#gen-hover") == f"{word} was generated mostly from: {listed}"


def test_the_language_model_page_offers_its_methods_keys_its_colours_and_clears_failures(
    browser, tmp_path
):
    """A language model's page: no "classes" from its config's LABEL_0/LABEL_1, only the
    methods that explain its generations (not full `lrp`), a colour key for the token
    clicked, and a failed request leaves none of the previous answer on screen."""
    from explain.generation import explain_generation
    from explain.testing.tiny_lm import save_tiny_lm

    folder = save_tiny_lm(tmp_path / "tiny-llama", "llama")
    loaded = load_model(folder)
    assert loaded.classes  # the config names two, which the page must not show
    explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
    with serving(loaded, str(folder), None, tmp_path / "cache") as server:
        page = open_page(browser, server.url)
        header = page.inner_text("#model")
        assert "language model" in header and "class" not in header
        offered = page.eval_on_selector_all("#gen-method option", "os => os.map(o => o.value)")
        assert offered == supported_methods(explainer.adapter, Request(prompt_length=1))
        assert "lrp" not in offered

        page.fill("#prompt", "w10 w11 w12")
        page.fill("#max-new-tokens", "3")
        page.select_option("#gen-method", "attnlrp")
        page.click("#generate")
        page.wait_for_selector("#generation .token.generated")
        settled(page)
        assert page.locator("#gen-keys .key").count() == 0  # no row coloured yet
        found = explain_generation(explainer, "w10 w11 w12", max_new_tokens=3, method="attnlrp")
        width = found.generation.prompt_length
        for g in range(int(found.generation.generated[0].sum())):
            page.click(f"#generation .token.generated >> nth={g}")
            row = found.explanation.relevance[0, g, : width + g - 1]  # off: the readout
            signed = bool(row.min() < 0)
            key = page.eval_on_selector_all(
                "#gen-keys .key", "ks => ks.map(k => [k.dataset.signed, k.innerText])"
            )
            assert len(key) == 1 and key[0][0] == str(signed).lower()
            assert ("0" in key[0][1]) == signed  # a signed key is centred at zero

        # The page was loaded when `lrp` was offered (a stale page): the server refuses
        # it, and the attnlrp answer leaves the screen with the message.
        page.evaluate("document.getElementById('gen-method').add(new Option('lrp', 'lrp'))")
        page.select_option("#gen-method", "lrp")
        page.click("#generate")
        page.wait_for_selector("#message:not([hidden])")
        assert "not available" in page.inner_text("#message")
        for emptied in ("#generation", "#gen-keys", "#gen-caption"):
            assert page.inner_html(emptied) == "", emptied
        page.close()


def test_the_language_model_view_fits_a_1280_pixel_window_and_says_its_token_limit(
    browser, tmp_path
):
    """A long prompt's tokens wrap inside a 1280-pixel window (no horizontal scrolling),
    and a prompt past the model's positions is refused before any model work, saying how
    many tokens it has and how many the view takes, as the prompt box says beforehand."""
    from explain.testing.tiny_lm import save_tiny_lm

    folder = save_tiny_lm(tmp_path / "tiny-llama", "llama")
    loaded = load_model(folder)
    with serving(loaded, str(folder), None, tmp_path / "cache") as server:
        limit = server.workbench.max_tokens  # the tiny Llama's 64 positions
        page = open_page(browser, server.url)
        page.set_viewport_size({"width": 1280, "height": 800})
        assert f"at most {limit} tokens" in page.get_attribute("#prompt", "placeholder")
        prompt = " ".join(f"w{10 + i % 40}" for i in range(limit - 8))
        page.fill("#prompt", prompt)
        page.fill("#max-new-tokens", "8")
        page.click("#generate")
        page.wait_for_selector("#generation .token.generated")
        settled(page)
        page.click("#generation .token.generated >> nth=0")
        width = "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        scrolled, window = page.evaluate(width)
        assert window == 1280 and scrolled <= window
        rights = page.eval_on_selector_all(
            "#generation .token", "ts => ts.map(t => t.getBoundingClientRect().right)"
        )
        assert max(rights) <= window
        lines = page.eval_on_selector_all(
            "#generation .token", "ts => new Set(ts.map(t => t.getBoundingClientRect().y)).size"
        )
        assert lines > 1  # wrapped, not squeezed

        too_long = " ".join(["w10"] * (limit + 1))
        count = len(loaded.tokenizer(too_long)["input_ids"])
        page.fill("#prompt", too_long)
        page.click("#generate")
        page.wait_for_selector("#message:not([hidden])")
        assert page.inner_text("#message") == (
            f"the text has {count} tokens; this view takes at most {limit} (the model's "
            "position embeddings end there): shorten it"
        )
        assert page.inner_html("#generation") == ""
        page.close()


def test_an_image_page_offers_only_the_methods_its_model_takes(browser, tmp_path):
    """Swin's windowed attention takes some methods and not others: the page offers the
    ones the engine says it takes, and a refused method clears the maps shown before."""
    loaded = load_model("zoo:shapes-swin")
    data = scene_folder(tmp_path / "data", 2)
    with serving(loaded, "zoo:shapes-swin", data, tmp_path / "cache") as server:
        page = open_page(browser, server.url)
        path = page.get_attribute(".card >> nth=0", "data-path")
        open_image(page, path)
        offered = page.eval_on_selector_all("#methods input", "bs => bs.map(b => b.value)")
        assert offered == supported_methods(Explainer(loaded.model).adapter)
        assert len(offered) < len(
            supported_methods(Explainer(load_model("zoo:shapes-vit").model).adapter)
        )
        assert page.locator("#grid canvas").count() == 1

        page.evaluate(
            """() => {
                const box = document.createElement('input');
                box.type = 'checkbox';
                box.value = 'lrp';
                box.addEventListener('change', () => busy(explainImage()));
                document.getElementById('methods').append(box);
            }"""
        )
        page.check("#methods input[value=lrp]")
        page.wait_for_selector("#message:not([hidden])")
        assert "not available" in page.inner_text("#message")
        assert page.locator("#grid canvas").count() == 0
        assert page.inner_html("#keys") == "" and page.inner_text("#caption") == ""
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
            torch.testing.assert_close(
                torch.tensor(value), result.relevance[0, k, row, column], **FLOAT32
            )
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
        torch.testing.assert_close(exported.relevance, result.relevance, **FLOAT32)
        torch.testing.assert_close(
            exported.relevances["text"], result.relevances["text"], **FLOAT32
        )
        page.close()
