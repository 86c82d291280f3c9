"""`explain serve` as a server: it reads only files under DATA, checks uploads before
decoding them, answers malformed requests with a 4xx and a message (never a traceback),
writes only under its cache folder, serves concurrent requests without blocking the
page, and reuses cached results on a second visit. Also the `explain serve` command
itself: it prints its address, binds to the loopback address, and stops on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from serve_fixtures import request, serving, wait_for_gallery
from tolerances import FLOAT32

from explain import Explainer, InputError
from explain.inputs import read_image
from explain.loading.specs import load_model
from explain.serve.data import OutsideDataError, read_data, resolve
from explain.serve.demo import scene_folder
from explain.serve.uploads import MAX_BYTES

SECRET = b"not for the browser"


@pytest.fixture(scope="module")
def shapes_vit():
    return load_model("zoo:shapes-vit")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """DATA with 3 labelled scenes, a symbolic link to a file outside it and one to a
    folder outside it; a secret next to DATA."""
    root = tmp_path_factory.mktemp("serve-security")
    data = scene_folder(root / "data", 3)
    outside = root / "outside"
    outside.mkdir()
    (root / "secret.png").write_bytes(SECRET)
    (outside / "secret.png").write_bytes(SECRET)
    (data / "notes.txt").write_bytes(SECRET)  # under DATA, but not an image of the gallery
    (data / "circle" / ".hidden.png").write_bytes(SECRET)
    (data / "link_out.png").symlink_to(root / "secret.png")
    (data / "linked_folder").symlink_to(outside, target_is_directory=True)
    return root, data


@pytest.fixture(scope="module")
def server(setup, shapes_vit):
    root, data = setup
    with serving(shapes_vit, "zoo:shapes-vit", data, root / "cache") as running:
        wait_for_gallery(running.url)
        yield running


def error_of(status, body):
    """The message of a JSON error answer (and that it is one: no traceback)."""
    answer = json.loads(body)
    assert set(answer) == {"error"}, answer
    assert "Traceback" not in answer["error"] and 'File "' not in answer["error"]
    return answer["error"]


def test_the_gallery_lists_only_real_files_under_data(server):
    gallery = wait_for_gallery(server.url)
    paths = [item["path"] for item in gallery["items"]]
    assert len(paths) == 3 and all(not p.startswith(("link", "linked")) for p in paths)
    labels = {item["label"] for item in gallery["items"]}
    assert labels == {p.split("/")[0] for p in paths}


TRAVERSALS = [
    "../secret.png",
    "circle/../../secret.png",
    "%2e%2e/secret.png",
    "..%2fsecret.png",
    "/etc/passwd",
    "link_out.png",
    "linked_folder/secret.png",
    "",
    "circle\\..\\..\\secret.png",
    "C:/secret.png",
    "circle/%00.png",
    "notes.txt",
    "circle/.hidden.png",
]


@pytest.mark.parametrize("name", TRAVERSALS)
def test_no_path_reaches_outside_data(server, setup, name):
    root, _ = setup
    for route in ("api/file?path=", "api/view?item="):
        status, body, _ = request(server.url + route + name)
        assert status == 404, (route, name, body)
        assert SECRET not in body
        error_of(status, body)
    absolute = str(root / "secret.png")
    status, body, _ = request(server.url + "api/file?path=" + absolute)
    assert status == 404 and SECRET not in body
    status, body, _ = request(
        server.url + "api/explain/image", {"item": name or absolute, "methods": ["generic"]}
    )
    assert status == 404, body
    error_of(status, body)


def test_a_text_file_server_serves_no_files(setup, tmp_path):
    root, _ = setup
    sentences = root / "sentences.txt"
    sentences.write_text("one sentence\n")
    source = read_data(sentences)
    assert source.kind == "texts" and source.root is None
    for name in ("sentences.txt", "secret.png"):
        with pytest.raises(OutsideDataError):
            source.image_file(name)


def test_resolve_refuses_what_the_server_refuses(setup):
    _, data = setup
    root = read_data(data).root
    assert resolve(root, "circle/scene_0.png") == (data / "circle" / "scene_0.png").resolve()
    for name in ["../secret.png", "link_out.png", "linked_folder/secret.png", "/etc/passwd"]:
        with pytest.raises(Exception, match="served folder"):
            resolve(root, name)


def test_files_under_data_are_served_as_they_are(server, setup):
    _, data = setup
    name = wait_for_gallery(server.url)["items"][0]["path"]
    path = data / name
    status, body, headers = request(server.url + "api/file?path=" + name)
    assert status == 200 and body == path.read_bytes()
    assert headers["x-content-type-options"] == "nosniff"


def _png_header(width: int, height: int) -> bytes:
    """A PNG signature and header chunk declaring width x height RGB pixels, and a
    tiny compressed body: what a decompression bomb looks like before decoding."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 1024))
        + chunk(b"IEND", b"")
    )


def _png(seed: int = 0) -> bytes:
    import io

    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (40, 48, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


UPLOAD = {"X-Explain-Upload": "1"}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"", 400, "empty"),
        (b"GIF89a but not really", 415, "not an image"),
        (b"%PDF-1.4 a document", 415, "not an image"),
        (_png_header(50_000, 50_000), 413, "too many pixels"),  # Pillow's own limit
        (_png_header(7_000, 7_000), 413, "declares 7000 x 7000 pixels: too many"),  # ours
        (_png()[:200], 400, "cannot be decoded"),
    ],
)
def test_bad_uploads_are_refused_with_a_message(server, body, status, message):
    answer = request(server.url + "api/upload", body, UPLOAD)
    assert answer[0] == status
    assert message in error_of(answer[0], answer[1])


def test_oversized_uploads_are_refused_before_they_are_read_in_full(server):
    status, body, _ = request(server.url + "api/upload", b"\0" * (MAX_BYTES + 1), UPLOAD)
    assert status == 413 and "MiB" in error_of(status, body)


def test_an_upload_needs_its_header(server):
    status, body, _ = request(server.url + "api/upload", _png(), {})
    assert status == 400 and "X-Explain-Upload" in error_of(status, body)


def test_a_good_upload_is_stored_in_the_cache_and_explained(server, shapes_vit):
    status, body, _ = request(server.url + "api/upload", _png(3), UPLOAD)
    assert status == 200
    answer = json.loads(body)
    sha = answer["item"].removeprefix("upload/")
    stored = server.workbench.cache.uploads / f"{sha}.png"
    assert stored.is_file()
    logits = Explainer(shapes_vit.model).explain(
        shapes_vit.preprocessing([read_image(stored)]), method="generic"
    )
    assert answer["prediction"]["index"] == int(logits.target[0])


JSON = "application/json"
BAD_REQUESTS = [
    ("api/explain/image", b"{not json", "application/json", 400, "not valid JSON"),
    ("api/explain/image", b"[1, 2]", "application/json", 400, "JSON object"),
    ("api/explain/image", b'{"item": "x"}', "text/plain", 415, "as JSON"),
    ("api/explain/image", b"{}", "application/json", 400, "needs 'item'"),
    ("api/explain/image", b'{"item": 3}', "application/json", 400, "'item' has the wrong type"),
    (
        "api/explain/image",
        b'{"item": "I", "methods": ["nope"]}',
        "application/json",
        400,
        "unknown method 'nope'",
    ),
    (
        "api/explain/image",
        b'{"item": "I", "classes": [99]}',
        "application/json",
        400,
        "out of range",
    ),
    ("api/explain/image", b'{"item": "I", "classes": [true]}', "application/json", 400, "indices"),
    ("api/explain/image", b'{"item": "I", "top": 0}', "application/json", 400, "top must be"),
    (
        "api/explain/image",
        b'{"item": "I", "rule": "loud"}',
        "application/json",
        400,
        "normalisation",
    ),
    ("api/explain/text", b'{"text": "a b"}', "application/json", 400, "image model"),
    ("api/export", b'{"format": "exe", "item": "I"}', "application/json", 400, "npz or json"),
    ("api/export", b'{"format": "npz"}', "application/json", 400, "names the `item`"),
    ("api/export", b'{"format": "npz", "item": "I", "captions": ["a"]}', JSON, 400, "no clip view"),
    # Class indices no int64 holds, and negative ones: out of range, before any work.
    ("api/export", b'{"format": "npz", "item": "I", "classes": [%d]}' % 10**30, JSON, 400, "range"),
    ("api/export", b'{"format": "json", "item": "I", "classes": [%d]}' % 2**63, JSON, 400, "range"),
    ("api/export", b'{"format": "npz", "item": "I", "classes": [-1]}', JSON, 400, "range"),
    ("api/explain/image", b'{"item": "I", "classes": [%d]}' % 2**63, JSON, 400, "range"),
    # 100,000 levels of nesting in 200 KB: Python's JSON parser runs out of stack.
    ("api/export", b"[" * 100_000 + b"]" * 100_000, JSON, 400, "nested too deeply"),
    ("api/explain/image", b'{"item": ' * 50_000 + b"1" + b"}" * 50_000, JSON, 400, "nested"),
]


@pytest.mark.parametrize(("route", "body", "kind", "status", "message"), BAD_REQUESTS)
def test_malformed_requests_get_a_4xx_with_a_message(server, route, body, kind, status, message):
    item = wait_for_gallery(server.url)["items"][0]["path"]
    body = body.replace(b'"I"', json.dumps(item).encode())
    answer = request(server.url + route, body, {"Content-Type": kind})
    assert answer[0] == status, answer[1]
    assert message in error_of(answer[0], answer[1])


def test_unknown_routes_and_methods(server):
    status, body, _ = request(server.url + "api/nothing")
    assert status == 404 and error_of(status, body)
    status, body, _ = request(server.url + "api/explain/image")  # GET on a POST route
    assert status == 405 and error_of(status, body)
    status, body, _ = request(server.url + "static/../app.py")
    assert status == 404


def test_an_unexpected_failure_is_a_500_without_a_traceback(server, monkeypatch):
    def broken(*args):
        raise RuntimeError("secret internals at /home/user/model.py line 3")

    monkeypatch.setattr(server.workbench, "view_png", broken)
    item = wait_for_gallery(server.url)["items"][0]["path"]
    status, body, _ = request(server.url + "api/view?item=" + item)
    assert status == 500
    message = error_of(status, body)
    assert "RuntimeError" in message and "secret internals" not in message


def test_an_export_takes_at_most_as_many_classes_as_a_view(server, monkeypatch):
    """Each class is a backward pass and a map in the file: 1,000 took seconds and 20,000
    gigabytes. Refused before the model runs, as the explain views refuse them."""

    def refused(*args, **kwargs):
        raise AssertionError("the model ran for a refused export")

    monkeypatch.setattr(server.workbench.explainer, "explain", refused)
    item = wait_for_gallery(server.url)["items"][0]["path"]
    for classes in ([0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4], list(range(6)) * 20_000):
        body = {"format": "npz", "item": item, "classes": classes}
        status, answer, _ = request(server.url + "api/export", body)
        assert status == 400
        assert f"at most 10 classes at once, got {len(classes)}" in error_of(status, answer)


@pytest.mark.parametrize("host", ["evil.example:80", "evil.example", "127.0.0.1.evil.example",
                                  "127.0.0.1@evil.example", "[::2]:80", "", "[::1"])  # fmt: skip
def test_another_host_name_is_refused(server, host):
    """DNS rebinding: a web page's own host name pointed at 127.0.0.1 gets nowhere; the
    refusal is a JSON error like every other."""
    status, body, _ = request(server.url + "api/info", headers={"Host": host})
    assert status == 400
    assert "does not answer to the host" in error_of(status, body)


def test_the_loopback_names_are_accepted_with_or_without_a_port(server):
    port = server.url.rsplit(":", 1)[1].strip("/")
    for host in ("127.0.0.1", f"127.0.0.1:{port}", "localhost", "LOCALHOST:1", "[::1]", "[::1]:80"):
        assert request(server.url + "api/info", headers={"Host": host})[0] == 200, host


def test_a_client_that_leaves_mid_upload_is_one_line_in_the_log(setup, shapes_vit, capfd):
    import socket
    import time

    root, data = setup
    with serving(shapes_vit, "zoo:shapes-vit", data, root / "cache-gone") as running:
        host, port = running.url.removeprefix("http://").strip("/").split(":")
        with socket.create_connection((host, int(port))) as connection:
            connection.sendall(
                b"POST /api/upload HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Explain-Upload: 1\r\n"
                b"Content-Length: 1000000\r\n\r\n" + _png()[:1000]
            )
            time.sleep(0.2)  # the server is reading the body
        deadline = time.monotonic() + 10
        log = ""
        while "closed the connection" not in log and time.monotonic() < deadline:
            time.sleep(0.05)
            log += capfd.readouterr().err
        assert request(running.url + "api/info")[0] == 200  # and it serves on
    log += capfd.readouterr().err
    lines = [line for line in log.splitlines() if line.strip()]
    assert lines == [
        "explain serve: POST /api/upload: the client closed the connection before the "
        "request was complete"
    ], log


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in folder.rglob("*")
        if "cache" not in p.relative_to(folder).parts
    }


def test_nothing_is_written_outside_the_cache(setup, shapes_vit, tmp_path):
    root, data = setup
    before = _tree(root)
    cache = tmp_path / "cache"
    with serving(shapes_vit, "zoo:shapes-vit", data, cache) as running:
        item = wait_for_gallery(running.url)["items"][0]["path"]
        request(running.url + "api/upload", _png(5), UPLOAD)
        request(running.url + "api/explain/image", {"item": item, "methods": ["generic", "lrp"]})
        status, _, _ = request(running.url + "api/export", {"format": "npz", "item": item})
        assert status == 200
    assert _tree(root) == before
    assert {p.name for p in cache.iterdir()} == {"results", "uploads", "exports"}
    assert any((cache / "exports").iterdir()) and any((cache / "uploads").iterdir())


def test_a_long_explanation_does_not_block_the_page(server, monkeypatch):
    """While one request holds the model, the page's other requests are answered."""
    started, release = threading.Event(), threading.Event()
    explain = server.workbench.explainer.explain

    def slow(*args, **kwargs):
        started.set()
        assert release.wait(30)
        return explain(*args, **kwargs)

    monkeypatch.setattr(server.workbench.explainer, "explain", slow)
    item = wait_for_gallery(server.url)["items"][1]["path"]
    answers = []
    body = {"item": item, "methods": ["attention_gradcam"], "classes": [2]}
    worker = threading.Thread(
        target=lambda: answers.append(request(server.url + "api/explain/image", body))
    )
    worker.start()
    assert started.wait(30)
    for route in ("api/info", "api/gallery", "", "static/serve.js"):
        assert request(server.url + route)[0] == 200
    release.set()
    worker.join(30)
    assert answers and answers[0][0] == 200


def test_concurrent_requests_equal_sequential_explanations(server, setup, shapes_vit):
    _, data = setup
    items = [item["path"] for item in wait_for_gallery(server.url)["items"]]
    jobs = [
        (path, method, k) for path in items for method in ("rollout", "attnlrp") for k in (3, 4)
    ]
    answers: dict[tuple, dict] = {}

    def ask(job):
        path, method, k = job
        status, body, _ = request(
            server.url + "api/explain/image", {"item": path, "methods": [method], "classes": [k]}
        )
        assert status == 200, body
        answers[job] = json.loads(body)

    threads = [threading.Thread(target=ask, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(answers) == len(jobs)
    explainer = Explainer(shapes_vit.model)
    for (path, method, k), answer in answers.items():
        images = shapes_vit.preprocessing([read_image(data / path)])
        expected = explainer.explain(images, target=k, method=method).relevance[0]
        shown = torch.tensor(answer["methods"][0]["maps"][0]["values"], dtype=torch.float32)
        torch.testing.assert_close(shown, expected, **FLOAT32)


def test_a_second_visit_uses_the_cache(setup, shapes_vit, tmp_path, monkeypatch):
    _, data = setup
    cache = tmp_path / "cache"
    with serving(shapes_vit, "zoo:shapes-vit", data, cache) as first:
        item = wait_for_gallery(first.url)["items"][0]["path"]
        body = {"item": item, "methods": ["generic", "rollout"], "top": 2}
        status, answer, _ = request(first.url + "api/explain/image", body)
        assert status == 200
    with serving(shapes_vit, "zoo:shapes-vit", data, cache) as second:

        def refused(*args, **kwargs):
            raise AssertionError("the model ran although the results are cached")

        monkeypatch.setattr(second.workbench.explainer, "explain", refused)
        gallery = wait_for_gallery(second.url)
        assert all(entry.get("prediction") for entry in gallery["items"])
        status, again, _ = request(second.url + "api/explain/image", body)
        assert status == 200 and json.loads(again) == json.loads(answer)
    # The key holds the model: another spec over the same cache computes afresh.
    stored = len(list((cache / "results").iterdir()))
    with serving(shapes_vit, "zoo:shapes-vit@other", data, cache) as third:
        wait_for_gallery(third.url)
    assert len(list((cache / "results").iterdir())) == stored + 2 * 3  # logits, map


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize(
    ("host", "address"),
    [
        (None, "http://127.0.0.1:"),
        pytest.param(
            "::1",
            "http://[::1]:",
            marks=pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here"),
        ),
    ],
)
def test_the_command_prints_its_address_writes_only_its_cache_and_stops_on_ctrl_c(
    setup, tmp_path, host, address
):
    """Also on the IPv6 loopback address, a local address: the Host header is checked
    there too. Nothing is written in HOME or TMPDIR (`import timm` made the inductor's
    $TMPDIR/torchinductor_$USER): only under --cache."""
    _, data = setup
    home, scratch = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    scratch.mkdir()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "MPL", "TORCHINDUCTOR"))
    }
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(Path.cwd()), HOME=str(home), TMPDIR=str(scratch))
    command = [sys.executable, "-m", "explain.cli", "serve", str(data), "--model", "zoo:shapes-vit"]
    command += ["--port", "0", "--cache", str(tmp_path / "cache")]
    command += ["--host", host] if host else []
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        line = process.stdout.readline()
        assert f" on {address}" in line, line + process.stderr.read()
        url = line.rsplit(" on ", 1)[1].strip()
        assert f"cache folder {tmp_path / 'cache'}" in process.stdout.readline()
        status, body, _ = request(url + "api/info")
        assert status == 200 and json.loads(body)["kind"] == "image"
        status, body, _ = request(url + "api/info", headers={"Host": "attacker.example"})
        assert status == 400 and "attacker.example" in error_of(status, body)
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
        assert "stopped" in process.stderr.read()
        assert not any(home.iterdir())
        assert not any(scratch.iterdir())
        assert (tmp_path / "cache" / "torchinductor").is_dir()
    finally:
        process.kill()
        process.wait()


def test_another_host_is_used_only_when_asked_and_then_warned_about():
    from explain.cli.serve import listen_on

    assert listen_on(None) == ("127.0.0.1", None)
    assert listen_on("localhost") == ("localhost", None)
    host, warning = listen_on("0.0.0.0")
    assert host == "0.0.0.0" and "anyone who can reach this machine" in warning


def test_the_command_refuses_data_of_the_wrong_kind(setup, tmp_path, capsys):
    from explain.cli import main

    sentences = tmp_path / "sentences.txt"
    sentences.write_text("a sentence\n")
    command = ["serve", str(sentences), "--model", "zoo:shapes-vit", "--port", "0"]
    assert main([*command, "--cache", str(tmp_path / "cache")]) == 2
    assert "give it a folder of images" in capsys.readouterr().err
    _, data = setup
    assert main(["serve", str(data / "nothing"), "--model", "zoo:shapes-vit"]) == 2
    assert "no such folder or file" in capsys.readouterr().err


def test_a_single_label_gallery_is_right_when_the_top_class_is_the_label(tmp_path):
    """digits-vit (softmax): right means the top class is the folder's label; the
    confidence is that class's probability, as the model gives it."""
    from PIL import Image

    from explain.data import digits

    loaded = load_model("zoo:digits-vit")
    images, labels = digits.load("heldout")
    data = tmp_path / "data"
    for index in range(4):
        label = int(labels[index]) if index else (int(labels[index]) + 1) % 10  # one mislabelled
        (data / str(label)).mkdir(parents=True, exist_ok=True)
        pixels = (images[index].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        Image.fromarray(pixels).save(data / str(label) / f"digit_{index}.png")
    with serving(loaded, "zoo:digits-vit", data, tmp_path / "cache") as running:
        gallery = wait_for_gallery(running.url)
    explainer = Explainer(loaded.model)
    for item in gallery["items"]:
        photo = read_image(data / item["path"])
        logits = explainer.explain(loaded.preprocessing([photo])).logits[0]
        probabilities = logits.double().softmax(dim=-1)
        top = int(logits.argmax())
        assert item["prediction"]["index"] == top
        assert item["prediction"]["confidence"] == pytest.approx(float(probabilities[top]))
        confidence = pytest.approx(float(probabilities[top]))
        assert item["prediction"]["present"] == [
            {"name": loaded.classes[top], "confidence": confidence}
        ]
        assert item["correct"] == (loaded.classes[top] == item["label"])
    assert [item["correct"] for item in gallery["items"]].count(False) >= 1


def test_results_of_an_overwritten_checkpoint_are_not_reused(tmp_path):
    """A local model's cache key holds its files' sizes and times: a checkpoint saved
    again at the same path gets fresh results."""
    import time

    from explain.serve.cache import model_identity
    from explain.testing.tiny_lm import save_tiny_lm

    folder = save_tiny_lm(tmp_path / "model", "llama")
    before = model_identity(str(folder))
    assert before[0] == str(folder) and any(entry[0] == "config.json" for entry in before[1:])
    assert model_identity(str(folder)) == before
    time.sleep(0.01)
    (folder / "config.json").write_text((folder / "config.json").read_text())
    assert model_identity(str(folder)) != before
    assert model_identity("zoo:shapes-vit") == ["zoo:shapes-vit"]


def test_a_vision_language_model_is_refused_with_the_command_that_explains_it(tmp_path):
    from explain.loading.loaded_model import LoadedModel
    from explain.serve import ResultCache, Workbench
    from explain.testing.tiny_vlm import tiny_llava, tiny_vlm_tokenizer

    loaded = LoadedModel(
        name="tiny-llava",
        model=tiny_llava(),
        modality="vision_language",
        tokenizer=tiny_vlm_tokenizer(),
    )
    with pytest.raises(InputError, match="explain generate --image"):
        Workbench(loaded, ResultCache(tmp_path / "cache"), "tiny-llava")


def test_an_object_detector_is_refused_with_the_command_that_explains_it(tmp_path):
    """A detector comes with its own image processor (variable sizes, padded batches),
    which the gallery's views do not draw."""
    from explain.loading.loaded_model import LoadedModel
    from explain.serve import ResultCache, Workbench
    from explain.testing import tiny_vit

    loaded = LoadedModel(name="detector", model=tiny_vit(), modality="image", image_processor=1)
    with pytest.raises(InputError, match="explain detect"):
        Workbench(loaded, ResultCache(tmp_path / "cache"), "detector")
