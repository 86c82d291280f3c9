"""`explain generate` on a tiny Llama saved with a tiny word-level tokenizer (offline)."""

from __future__ import annotations

import json
import re

import pytest
import torch

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
    spans = re.findall(r'<span class="tok gen" data-t="(\d+)" data-g="(\d+)">', page)
    assert [int(g) for _, g in spans] == [0, 1, 2, 3]
    assert [int(t) for t, _ in spans] == [5, 6, 7, 8]


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
        generation_html(["a", "b"], 2, torch.zeros(1, 2))


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
    torch.testing.assert_close(saved.relevance, direct.explanation.relevance)
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
