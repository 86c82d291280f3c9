"""`explain cite` on a tiny Llama saved with a tiny word-level tokenizer (offline): the
three files, cite.json's spans and check equal to the Python API's, the page and its
choices in a real browser (clicking an answer token changes the highlights; no console
errors), and clear errors for bad contexts."""

from __future__ import annotations

import json
import re

import pytest
import torch
from serve_fixtures import chromium

from explain import Explainer
from explain.cite import Citation, cite
from explain.cli import build_parser, main
from explain.testing import tiny_lm
from explain.viz.cite import cite_html

CONTEXT = "w9 w10 <script> w11. w12 a&b w13!\nw14 w15 w16. w17 w18 w19. w20 w21."
QUESTION = "w30 w31"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_lm.save_tiny_lm(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="module")
def written(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("cited")
    context = out / "context.txt"
    context.write_text(CONTEXT, encoding="utf-8")
    arguments = ["cite", "--model", str(folder), "--context", str(context)]
    arguments += ["--question", QUESTION, "--answer", "w40 w41", "--lds", "6", "--out", str(out)]
    assert main(arguments) == 0
    return out


def test_the_three_files_say_what_the_python_api_says(written, capsys):
    document = json.loads((written / "cite.json").read_text())
    explainer = Explainer(tiny_lm.tiny_causal_lm("llama"), tokenizer=tiny_lm.tiny_tokenizer())
    expected = cite(explainer, CONTEXT, QUESTION, "w40 w41", lds=6)
    assert [(s["text"], s["start"], s["end"]) for s in document["spans"]] == [
        (s.text, s.start, s.end) for s in expected.spans
    ]
    for span in document["spans"]:
        assert CONTEXT[span["start"] : span["end"]] == span["text"]
    scores = torch.tensor([s["score"] for s in document["spans"]], dtype=torch.float64)
    torch.testing.assert_close(scores, expected.scores.double())
    assert Citation.load(written / "cite.json").check == expected.check
    assert document["check"] == expected.check.to_dict()
    assert (written / "cite.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (written / "cite.html").read_text()
    assert "&lt;script&gt;" in page and "a&amp;b" in page
    assert page.count("<script") == 4  # three data blocks and the page's own script
    assert not re.search(r"(src|href)\s*=|https?:|@import|url\(", page)


def test_help_documents_the_command():
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    text = commands.choices["cite"].format_help()
    for option in ("--context", "--question", "--answer", "--spans", "--method", "--lds", "--out"):
        assert option in text
    assert "cite.json" in text and "removes the top-1" in text


def test_bad_context_files_are_refused(folder, tmp_path, capsys):
    base = ["cite", "--model", str(folder), "--question", QUESTION, "--out", str(tmp_path)]
    assert main([*base, "--context", str(tmp_path / "missing.txt")]) == 2
    assert "no such context file" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2", encoding="utf-8")
    assert main([*base, "--context", str(bad)]) == 2
    assert "is not JSON" in capsys.readouterr().err
    deep = tmp_path / "deep.json"  # issue 46: RecursionError escaped
    deep.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    assert main([*base, "--context", str(deep)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("explain: error:") and "too deeply" in err[0]
    documents = tmp_path / "documents.json"
    documents.write_text(json.dumps(["w9 w10.", "w11 w12."]), encoding="utf-8")
    assert main([*base, "--context", str(documents), "--spans", "turns"]) == 2
    assert "not a chat" in capsys.readouterr().err
    assert main([*base, "--context", str(documents), "--spans", "documents"]) == 0
    spans = json.loads((tmp_path / "cite.json").read_text())["spans"]
    assert [s["text"] for s in spans] == ["w9 w10.", "\n\nw11 w12."]


def _colours(page) -> list[str]:
    return page.eval_on_selector_all("span.src", "spans => spans.map(s => s.style.backgroundColor)")


def test_choosing_an_answer_token_changes_the_highlights(tmp_path):
    pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]'")
    rows = torch.tensor([[1.0, -0.5, 0.25], [0.0, 1.0, -1.0], [1.0, 0.0, 0.0]])
    check = {
        "ablation": "removed",
        "target": "log p(answer)",
        "full": -3.0,
        "top_k": [{"k": 1, "drop": 1.5, "random_drop": 0.2, "random_std": 0.1}],
        "random_draws": 16,
        "lds": 0.5,
        "lds_ablations": 8,
        "seed": 0,
    }
    page_text = cite_html(
        ["One <b>span</b>.", " Two.", "\nThree."],
        "Which?",
        ["An", "swer"],
        rows,
        method="generic",
        check=check,
    )
    path = tmp_path / "cite.html"
    path.write_text(page_text, encoding="utf-8")
    with chromium() as context:
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.goto(path.as_uri())
        whole = _colours(page)
        assert "whole answer" in page.locator("#status").inner_text()
        assert page.locator("#top li").first.inner_text().endswith("One <b>span</b>.")
        page.locator("span.choice").nth(1).click()  # answer token 1: span 2 first
        first = _colours(page)
        assert first != whole
        assert "answer token 1: An" in page.locator("#status").inner_text()
        assert page.evaluate("location.hash") == "#2"
        assert "(span 2)" in page.locator("#top li").first.inner_text()
        page.keyboard.press("Tab")  # to answer token 2, chosen with Enter
        page.keyboard.press("Enter")
        assert _colours(page) not in (whole, first)
        assert "answer token 2: swer" in page.locator("#status").inner_text()
        assert page.locator("span.choice[aria-pressed=true]").count() == 1
        page.goto(path.as_uri() + "#3")
        assert "answer token 2" in page.locator("#status").inner_text()
        assert "1.500" in page.locator("table").inner_text()
        assert not errors
