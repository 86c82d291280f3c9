"""`explain generate` on a tiny Llama saved with a tiny word-level tokenizer (offline)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from tolerances import FLOAT32

from explain import Explainer
from explain.cli import main
from explain.generation import explain_generation
from explain.testing import tiny_lm
from explain.viz.generation import generation_html

PROMPT = "w10 w11 <script> a&b w12"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_lm.save_tiny_lm(tmp_path_factory.mktemp("tiny-llama"), "llama")


def _embedded_rows(page: str) -> list[list[float]]:
    data = re.search(r'<script type="application/json" id="relevance">(.*?)</script>', page)
    assert data is not None
    return json.loads(data.group(1))


def test_page_and_matrix(folder, tmp_path, capsys):
    page_path = tmp_path / "page.html"
    status = main(
        [
            "generate",
            PROMPT,
            "--model",
            str(folder),
            "--max-new-tokens",
            "4",
            "--html",
            str(page_path),
        ]
    )
    assert status == 0
    printed = capsys.readouterr().out
    assert "continuation:" in printed and str(page_path) in printed
    page = page_path.read_text()
    # Every token escaped; the only scripts are the page's own two; nothing external.
    assert "&lt;script&gt;" in page and "a&amp;b" in page
    assert page.count("<script") == 2
    assert not re.search(r"(src|href)\s*=|https?:|@import|url\(", page)
    png = page_path.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The page's numbers are the explanation of the model's own greedy continuation.
    loaded = tiny_lm.tiny_causal_lm("llama")
    explainer = Explainer(loaded, tokenizer=tiny_lm.tiny_tokenizer())
    expected = explain_generation(explainer, PROMPT, max_new_tokens=4).explanation
    rows = _embedded_rows(page)
    assert len(rows) == 4
    torch.testing.assert_close(
        torch.tensor(rows, dtype=torch.float64),
        expected.relevance[0].double(),
        rtol=1e-4,
        atol=1e-5,
    )
    # Generated tokens are keyboard-reachable buttons; the page names its method.
    spans = re.findall(
        r'<span class="tok gen" data-t="(\d+)" data-g="(\d+)" tabindex="0" role="button"', page
    )
    assert [int(g) for _, g in spans] == [0, 1, 2, 3]
    assert [int(t) for t, _ in spans] == [5, 6, 7, 8]
    assert f"<h2>explain generate: {folder} (cp_lrp)</h2>" in page  # a language model's default
    # Addresses count from 1, as the status line does, and choosing a token updates them.
    assert '"#" + (g + 1)' in page and "asked - 1" in page and "history.replaceState" in page


def test_out_holds_the_page_and_the_figure(folder, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "answers"
    argv = ["generate", PROMPT, "--model", str(folder), "--max-new-tokens", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["generation.html", "generation.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["answers"]  # nothing in the cwd


def test_an_unknown_method_fails_before_the_model_is_loaded(tmp_path, capsys):
    missing = tmp_path / "no-such-model"  # never read: the method is checked first
    assert main(["generate", "w10", "--model", str(missing), "--method", "gneric"]) == 2
    assert "gneric" in capsys.readouterr().err


def test_chat_prompt_goes_through_the_template(folder, tmp_path, capsys):
    page_path = tmp_path / "chat.html"
    args = ["generate", "w10 w11", "--model", str(folder), "--chat", "--html", str(page_path)]
    assert main([*args, "--max-new-tokens", "2"]) == 0
    page = page_path.read_text()
    shown = re.findall(r'<span class="tok" data-t="\d+">([^<]*)</span>', page)
    assert shown == ["&lt;s&gt;", "user", "w10", "w11", "&lt;s&gt;", "assistant"]


def test_the_page_refuses_shapes_that_do_not_fit():
    from explain import InputError

    with pytest.raises(InputError, match="do not fit"):
        generation_html(["a", "b"], 2, torch.zeros(1, 2), method="generic", rests_on=[[0]])


def test_not_a_language_model(tmp_path, capsys):
    import reference_hf as ref

    model = ref.tiny_text_model("bert-classifier")
    model.save_pretrained(tmp_path)
    tiny_lm.tiny_tokenizer().save_pretrained(tmp_path)
    assert main(["generate", "w10", "--model", str(tmp_path)]) == 2
    assert "decoder-only" in capsys.readouterr().err


def test_save_writes_every_generated_tokens_relevance(folder, tmp_path, capsys):
    from explain import Explanation

    page = tmp_path / "page.html"
    argv = ["generate", PROMPT, "--model", str(folder), "--max-new-tokens", "3"]
    assert main([*argv, "--html", str(page), "--save", "npz", "--out", str(tmp_path)]) == 0
    saved = Explanation.load(tmp_path / "generation.npz")
    model = tiny_lm.tiny_causal_lm("llama")
    direct = explain_generation(Explainer(model, tokenizer=tiny_lm.tiny_tokenizer()), PROMPT, 3)
    # float32: the CLI's model loaded from the folder, the test's built here
    torch.testing.assert_close(saved.relevance, direct.explanation.relevance, **FLOAT32)
    assert saved.settings == {"model": str(folder), "prompt": PROMPT, "chat": False}


def test_a_saved_tiny_model_reloads_its_tokenizer_or_says_why_not(tmp_path):
    from transformers import AutoTokenizer

    folder = tiny_lm.save_tiny_lm(tmp_path / "gemma3", "gemma3")
    ids = AutoTokenizer.from_pretrained(folder)("user a&b w9")["input_ids"]
    assert ids == tiny_lm.tiny_tokenizer()("user a&b w9")["input_ids"] == [3, 7, 9]
    # transformers reads Qwen2 folders with Qwen2's own tokenizer, whatever they say.
    with pytest.raises(ValueError, match=r"Qwen2Tokenizer.*save another family"):
        tiny_lm.save_tiny_lm(tmp_path / "qwen2", "qwen2")


def test_a_png_under_a_missing_folder_is_written_there(folder, tmp_path, capsys):
    png = tmp_path / "figures" / "new" / "matrix.png"
    argv = ["generate", "w10 w11", "--model", str(folder), "--max-new-tokens", "2"]
    assert main([*argv, "--html", str(tmp_path / "page.html"), "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_png_that_is_a_folder_is_refused_before_the_page_is_written(folder, tmp_path, capsys):
    argv = ["generate", "w10", "--model", str(folder), "--html", str(tmp_path / "p.html")]
    assert main([*argv, "--png", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--png" in err and "is a folder" in err
    assert not (tmp_path / "p.html").exists()  # refused before anything was written


@pytest.fixture
def drawn(monkeypatch):
    """The figures the command saves, as they are saved."""
    import explain.viz

    figures = []
    save = explain.viz.save_figure
    monkeypatch.setattr(
        explain.viz,
        "save_figure",
        lambda figure, path: figures.append(figure) or save(figure, path),
    )
    return figures


def _page_tokens(page: str, kind: str) -> list[str]:
    """The text of the page's spans of class `kind` (generated tokens, answer words)."""
    import html

    found = re.findall(rf'<span class="{kind}"[^>]*>([^<]*)</span>', page)
    return [html.unescape(token) for token in found]


def _rests(page: str) -> list[str]:
    import html

    return [html.unescape(text) for text in re.findall(r'data-rests="([^"]*)"', page)]


_SOURCE = re.compile(r"""('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")@(\d+) ([^,\s]+)""")
"""One ranked source as the terminal writes it: 'token'@position value."""


def _printed_lines(printed: str) -> list[tuple[str, list[tuple[str, int, float]]]]:
    """The terminal's `'token' <- 'a'@3 0.41, 'b'@0 -0.2` lines, read back: each
    generated token with its (token, position, value) sources, most relevant first."""
    import ast

    lines = []
    for line in printed.splitlines():
        if " <- " in line:
            token, sources = line.split(" <- ")
            found = [
                (ast.literal_eval(t), int(i), float(v)) for t, i, v in _SOURCE.findall(sources)
            ]
            lines.append((ast.literal_eval(token.strip()), found))
    return lines


def _sources_text(sources: list[tuple[str, int, float]]) -> str:
    return ", ".join(f"{token!r}@{i} {v:.3g}" for token, i, v in sources)


def _figure_ranks(figure) -> list[list[int]]:
    """The positions the figure numbers 1, 2, 3 in each row of its matrix."""
    numbered: dict[int, dict[int, int]] = {}
    for text in figure.axes[0].texts:
        x, y = text.get_position()
        numbered.setdefault(round(y), {})[int(text.get_text())] = round(x)
    return [[row[k] for k in sorted(row)] for _, row in sorted(numbered.items())]


def test_the_terminal_page_and_figure_show_the_same_continuation(folder, tmp_path, capsys, drawn):
    # With a chat, the tiny Llama ends its answer with "</s>": a special token it wrote,
    # explained like the others, so every view shows it (the terminal once hid it).
    page_path = tmp_path / "page.html"
    argv = ["generate", "w12 w30 w41", "--model", str(folder), "--chat", "--max-new-tokens"]
    assert main([*argv, "5", "--html", str(page_path)]) == 0
    printed = capsys.readouterr().out
    page = page_path.read_text()
    on_page = _page_tokens(page, "tok gen")
    (figure,) = drawn
    in_figure = [label.get_text() for label in figure.axes[0].get_yticklabels()]
    continuation = next(line for line in printed.splitlines() if line.startswith("continuation:"))
    assert on_page[-1] == "</s>"
    assert continuation.split()[1:] == on_page == in_figure
    assert [token for token, _ in _printed_lines(printed)] == on_page


def test_what_each_token_rests_on_leaves_out_its_readout_token_everywhere(folder, tmp_path, capsys):
    page_path = tmp_path / "page.html"
    # generic: its readout token's identity term tops every row (checked below)
    argv = ["generate", PROMPT, "--model", str(folder), "--max-new-tokens", "4"]
    assert main([*argv, "--method", "generic", "--html", str(page_path)]) == 0
    lines = _printed_lines(capsys.readouterr().out)
    explainer = Explainer(tiny_lm.tiny_causal_lm("llama"), tokenizer=tiny_lm.tiny_tokenizer())
    found = explain_generation(explainer, PROMPT, max_new_tokens=4, method="generic")
    tokens = found.explanation.tokens[0]
    matrix = found.explanation.relevance[0].double().numpy()
    width = found.generation.prompt_length
    readouts = []
    for g, (token, sources) in enumerate(lines):
        # the three largest relevance values among the tokens before the readout token
        # (the one just before the explained token): its own identity term is no evidence
        readout = width + g - 1
        order = np.argsort(-np.abs(matrix[g, :readout]), kind="stable")[:3]
        assert token == tokens[width + g]
        assert [(t, i) for t, i, _ in sources] == [(tokens[i], int(i)) for i in order]
        readouts.append(matrix[g, readout] > matrix[g, :readout].max())
    assert all(readouts)  # the readout token would have come first in every line
    assert _rests(page_path.read_text()) == [_sources_text(sources) for _, sources in lines]


def test_one_ranking_in_the_terminal_the_page_and_the_figure(folder, tmp_path, capsys, drawn):
    """The terminal's lines, the page's status lines and the figure's numbered cells give
    the same tokens in the same order with the same values: the tokens of largest
    |relevance| before the readout token, those against the answer included, by an
    independent ranking of the explanation's rows."""
    page_path = tmp_path / "page.html"
    argv = ["generate", "w10 w11 w12 w13", "--model", str(folder), "--max-new-tokens", "4"]
    assert main([*argv, "--method", "cp_lrp", "--html", str(page_path)]) == 0
    printed = capsys.readouterr().out
    assert (
        "by |relevance| (the token it is read out at left out): 'token'@position value" in printed
    )
    lines = _printed_lines(printed)
    (figure,) = drawn
    explainer = Explainer(tiny_lm.tiny_causal_lm("llama"), tokenizer=tiny_lm.tiny_tokenizer())
    found = explain_generation(explainer, "w10 w11 w12 w13", max_new_tokens=4, method="cp_lrp")
    answer = found.answer()
    expected = []
    for g, row in enumerate(answer.relevance.double().numpy()):
        before = row[: answer.prompt_length + g - 1]
        order = sorted(range(len(before)), key=lambda t: -abs(before[t]))[:3]
        expected.append([(answer.tokens[t], t, before[t]) for t in order])
    assert len(lines) == len(expected) == len(answer.generated)
    for (_, sources), wanted in zip(lines, expected, strict=True):
        assert [(t, i) for t, i, _ in sources] == [(t, i) for t, i, _ in wanted]
        assert [v for *_, v in sources] == [float(f"{v:.3g}") for *_, v in wanted]  # as printed
    assert any(v < 0 for _, sources in lines for *_, v in sources)  # evidence against, named
    assert _rests(page_path.read_text()) == [_sources_text(sources) for _, sources in lines]
    assert _figure_ranks(figure) == [[i for _, i, _ in sources] for _, sources in lines]


@pytest.fixture(scope="module")
def smolvlm_photo(tmp_path_factory):
    """A tiny SmolVLM saved with its processor, and a photo it answers about with tile
    markers among its words (special tokens)."""
    from PIL import Image

    from explain.testing.tiny_vlm import tiny_idefics3, tiny_idefics3_processor

    folder = tmp_path_factory.mktemp("tiny-smolvlm")
    tiny_idefics3(kind="smolvlm").save_pretrained(folder)
    tiny_idefics3_processor("smolvlm").save_pretrained(folder)
    photo = folder / "photo.png"
    pixels = (np.random.default_rng(0).random((40, 60, 3)) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(photo)
    return folder, photo


def test_a_vision_language_answer_is_the_same_in_the_terminal_page_and_figure(
    smolvlm_photo, tmp_path, capsys, drawn
):
    folder, photo = smolvlm_photo
    page_path = tmp_path / "page.html"
    argv = ["generate", "--image", str(photo), "w12 w13", "--model", str(folder)]
    assert main([*argv, "--max-new-tokens", "4", "--html", str(page_path)]) == 0
    printed = capsys.readouterr().out
    page = page_path.read_text()
    words = _page_tokens(page, "word")
    (figure,) = drawn
    titles = [axis.get_title() for axis in figure.axes if axis.get_title()]
    answer = next(line for line in printed.splitlines() if line.startswith("answer:"))
    assert any(word.startswith("<row_") for word in words)  # the tile markers it wrote
    assert answer.split()[1:] == words == titles[1:]
    lines = _printed_lines(printed)
    assert [word for word, _ in lines] == words
    # what each word rests on: the same in the terminal and on the page, among the
    # question's tokens as the page shows them ("[image]" for the photo), the first
    # word's readout token (the question's last) left out
    data = re.search(r'<script type="application/json" id="answer">(.*?)</script>', page)
    rests = [word["rests"] for word in json.loads(data.group(1))]
    assert rests == [_sources_text(sources) for _, sources in lines]
    shown = _page_tokens(page, "tok")
    assert all(shown[i] == token for _, sources in lines for token, i, _ in sources)
    assert len(shown) - 1 not in [i for _, i, _ in lines[0][1]]


def test_the_vision_language_figure_has_a_title_and_says_each_label_once(
    smolvlm_photo, tmp_path, capsys, drawn
):
    folder, photo = smolvlm_photo
    argv = ["generate", "--image", str(photo), "w12 w13", "--model", str(folder)]
    assert main([*argv, "--max-new-tokens", "7", "--out", str(tmp_path)]) == 0
    (figure,) = drawn
    heading = figure.texts[-1].get_text().replace("\n", " ")
    assert f"explain generate: {folder} (attnlrp, depth lm)" in heading  # the kind's default
    assert "question: w12 w13" in heading
    panels = [axis for axis in figure.axes if axis.get_title()]
    titles = [axis.get_title() for axis in panels]
    assert titles[0] == "photo" and titles.count("photo") == 1 and len(titles) == 8
    assert all(axis.get_ylabel() == "" for axis in figure.axes[:-1])  # no row labels
    assert [key.get_ylabel() for key in figure.axes[len(panels) :]] == ["signed maps"]  # attnlrp
    # the photo and 7 words: in rows of 5 (the photo and 4 words, then 4 more), read
    # left to right, top to bottom
    rows = [round(axis.get_position().y0, 3) for axis in panels]
    assert rows == [rows[0]] * 5 + [rows[5]] * 3 and rows[5] < rows[0]


def test_an_answer_drops_its_prompts_padding_and_reads_before_its_readout():
    from explain.generation import rests_on

    tokenizer = tiny_lm.tiny_tokenizer()
    explainer = Explainer(tiny_lm.tiny_causal_lm("llama"), tokenizer=tokenizer)
    found = explain_generation(explainer, ["w10 w11 w12 w13", "w20"], max_new_tokens=3)
    short = found.answer(1)  # its prompt is left-padded to the longer one's width
    alone = tokenizer.convert_ids_to_tokens(tokenizer("w20")["input_ids"])
    assert short.tokens[: short.prompt_length] == alone
    assert short.relevance.shape == (len(short.generated), len(short.tokens))
    assert short.text(tokenizer) == " ".join(short.generated)
    row = torch.tensor([0.5, 3.0, -1.0, 9.0, 7.0, -1.0])
    # by |relevance|: -1.0 before 0.5; 9.0, the readout's, and those after it: out
    assert rests_on(row, readout=3) == [1, 2, 0]
    assert rests_on(row, readout=3, count=1) == [1]
    assert rests_on(row, readout=0) == [] and rests_on(row, readout=9) == [3, 4, 1]
    assert rests_on(row, readout=9, count=5) == [3, 4, 1, 2, 5]  # a tie: the earlier first


def test_no_save_file_where_every_object_has_a_save_method(folder, tmp_path, monkeypatch):
    # Importing nnsight gives every object a `save` method, and argparse sets an option's
    # default only where the namespace lacks the attribute: `--save` read as args.save
    # was nnsight's bound method, written into a file name. Stand-in: a Namespace with one.
    import argparse

    monkeypatch.setattr(argparse.Namespace, "save", lambda self: None, raising=False)
    out = tmp_path / "answers"
    argv = ["generate", PROMPT, "--model", str(folder), "--max-new-tokens", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["generation.html", "generation.png"]
