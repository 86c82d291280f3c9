"""`explain cite` on a tiny Llama saved with a tiny word-level tokenizer (offline): the
three files, cite.json's spans and check equal to the Python API's, the page and its
choices in a real browser (clicking an answer token changes the highlights; no console
errors), and clear errors for bad contexts."""

from __future__ import annotations

import html
import json
import re

import pytest
import torch
from serve_fixtures import chromium

from explain import Explainer
from explain.cite import Citation, cite
from explain.cite.page import cite_html
from explain.cli import build_parser, main
from explain.testing import tiny_lm

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
    assert page.count("<script") == 5  # four data blocks and the page's own script
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
        "top_k": [
            {
                "k": 1,
                "drop": 1.5,
                "random_drop": 0.2,
                "random_std": 0.1,
                "random_sets": 3,
                "random_exact": True,
                "tied": False,
            }
        ],
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
        assert "1.50" in page.locator("table").inner_text()
        assert page.locator("p.verdict").inner_text().startswith("Verdict: supported: top-1")
        assert not errors


def _said(out, printed: str) -> tuple[str, str, str]:
    """The verdict as the terminal, cite.json and the page say it."""
    terminal = [line for line in printed.splitlines() if line.startswith("verdict: ")]
    assert len(terminal) == 1
    check = json.loads((out / "cite.json").read_text())["check"]
    page = (out / "cite.html").read_text()
    shown = re.search(r'<p class="verdict">Verdict: <b>(.*?)</b>: (.*?)</p>', page)
    assert shown is not None
    return (
        terminal[0].removeprefix("verdict: "),
        f"{check['verdict']}: {check['verdict_reason']}",
        html.unescape(f"{shown[1]}: {shown[2]}"),
    )


def test_terminal_page_and_json_say_the_same_verdict(folder, tmp_path, capsys):
    context = tmp_path / "context.txt"
    context.write_text(CONTEXT, encoding="utf-8")
    arguments = ["cite", "--model", str(folder), "--context", str(context), "--question"]
    arguments += [QUESTION, "--answer", "w40 w41", "--lds", "6", "--out", str(tmp_path)]
    assert main(arguments) == 0
    terminal, document, page = _said(tmp_path, capsys.readouterr().out)
    expected = Citation.load(tmp_path / "cite.json").check.verdict
    assert terminal == document == page == str(expected)


def test_a_hand_built_answer_no_span_carries_is_not_supported_everywhere(
    folder, tmp_path, capsys, monkeypatch
):
    # Every span costs the answer the same when removed: no ranking beats chance.
    from explain.cite import check as check_module

    def targets(adapter, prompt_ids, token_spans, answers, keep, batch_tokens):
        return -1.0 - 0.5 * (~keep).sum(dim=1).double()

    monkeypatch.setattr(check_module, "ablated_targets", targets)
    context = tmp_path / "context.txt"
    context.write_text(CONTEXT, encoding="utf-8")
    arguments = ["cite", "--model", str(folder), "--context", str(context), "--question"]
    assert main([*arguments, QUESTION, "--answer", "w40", "--out", str(tmp_path)]) == 0
    said = _said(tmp_path, capsys.readouterr().out)
    assert len(set(said)) == 1
    assert said[0].startswith("not supported by ablation: removing the top-ranked ones moves")
    assert "top-1 drop 0.500 against 0.500 ± 0 (all 5 sets)" in said[0]


def _hand_built_check(top_1: float, top_3: float) -> dict:
    def row(k: int, drop: float, sets: int, exact: bool, tied: bool) -> dict:
        return {
            "k": k,
            "drop": drop,
            "random_drop": 0.2,
            "random_std": 0.1,
            "random_sets": sets,
            "random_exact": exact,
            "tied": tied,
        }

    return {
        "ablation": "removed",
        "target": "log p(answer)",
        "full": -3.0,
        "top_k": [row(1, top_1, 6, True, False), row(3, top_3, 16, False, True)],
        "random_draws": 16,
        "lds": None,
        "lds_ablations": 0,
        "seed": 0,
    }


@pytest.mark.parametrize(
    ("top_1", "top_3", "explained"), [(1.5, 0.8020679468, True), (0.25, 1.5, False)]
)
def test_the_page_explains_a_top_3_drop_below_the_top_1_drop(top_1, top_3, explained):
    rows = torch.tensor([[1.0, 0.5, 0.5, 0.5]] * 2)
    spans = ["A.", " B.", " C.", " D."]
    page = cite_html(
        spans, "Q?", ["x"], rows, method="cp_lrp", check=_hand_built_check(top_1, top_3)
    )
    note = "The top-3 drop (0.802) is below the top-1 drop (1.50)"
    assert (note in page) is explained
    assert "0.8020679468" not in page.split('<script type="application/json"')[0]
    assert "<td>all 6 sets</td>" in page and "<td>16 random sets</td>" in page
    assert "<td>tied at the cut</td>" in page
    word = "supported" if explained else "not supported by ablation"
    assert f"Verdict: <b>{word}</b>" in page
    from explain.cite.figure import cite_figure

    figure = cite_figure(spans, ["x"], rows, method="cp_lrp", check=_hand_built_check(top_1, top_3))
    caption = " ".join(" ".join(text.get_text().split()) for text in figure.texts)
    assert f"Verdict: {word}." in caption and "16 random sets" in caption
