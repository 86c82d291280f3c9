"""Answer statements (explain.cite.statements): an answer split by the context's sentence
splitter, and the matrix answer sentence x source. Each row equals citing that sentence
alone as the answer (the sentences before it read as part of the question), for text
spans; for a photo's regions, the first row equals citing that sentence alone and the
next ones equal the answer cut after them (another forward and backward each); the rows
add up to the whole answer's one-pass scores (`ablate=0`: the statement rows keep the
method's relevance where `ablate` rescores spans by their drops); the tokens are placed in
the answer's characters by the tokenizer's offsets or by decoding; cite.json keeps the
matrix; the pages' sentence choices in a real browser (no console errors)."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
from serve_fixtures import chromium

from explain import Explainer, InputError
from explain.cite import Citation, cite
from explain.cite.image import RegionCitation, cite_image
from explain.cite.page import cite_html
from explain.cite.regions import grid_regions
from explain.cite.regions_page import regions_html
from explain.cite.saved import VERSION
from explain.cite.spans import split
from explain.cite.statements import UNLOCATED, answer_statements, statement_sums
from explain.cli import main
from explain.data import recall
from explain.testing.tiny_lm import save_tiny_lm, tiny_causal_lm, tiny_tokenizer
from explain.testing.tiny_vlm import tiny_llava, tiny_llava_processor

CONTEXT = "w9 w10 w11. w12 w13! w14 w15 w16.\nw17 w18 w19 w20. w21 w22 w23. w24 w25."
QUESTION = "w30 w31"
ANSWER = "w40 w41. w42 w43! w44 w45"
LINEAR = ("attnlrp", "cp_lrp")


@functools.cache
def _explainer() -> Explainer:
    return Explainer(tiny_causal_lm("llama").double(), tokenizer=tiny_tokenizer())


@pytest.mark.parametrize("method", [*LINEAR, "generic"])
def test_each_row_is_citing_that_sentence_alone(method):
    result = cite(_explainer(), CONTEXT, QUESTION, ANSWER, method=method, check=False, ablate=0)
    sentences = split(ANSWER, "sentences")
    assert [s.text for s in result.sentences] == [s.text for s in sentences]
    assert result.statement_relevance.shape == (3, len(result.spans))
    for n, sentence in enumerate(sentences):
        # The sentences before this one are read as the question's end: the same tokens.
        question = QUESTION + ("" if n == 0 else " " + ANSWER[: sentence.start])
        alone = cite(
            _explainer(),
            CONTEXT,
            question,
            sentence.text.strip(),
            method=method,
            check=False,
            ablate=0,
        )
        prompt_ids = torch.cat([result.prompt_ids, result.answer_ids])[: alone.prompt_ids.numel()]
        assert torch.equal(alone.prompt_ids, prompt_ids)
        torch.testing.assert_close(result.statement_relevance[n], alone.scores)


def test_the_rows_add_up_to_the_whole_answer_and_follow_its_tokens():
    result = cite(_explainer(), CONTEXT, QUESTION, ANSWER, method="cp_lrp", check=False, ablate=0)
    assert result.token_sentences.tolist() == [0, 0, 1, 1, 2, 2]
    torch.testing.assert_close(result.statement_relevance.sum(dim=0), result.scores)
    expected = torch.stack([result.span_relevance[g : g + 2].sum(dim=0) for g in (0, 2, 4)])
    torch.testing.assert_close(result.statement_relevance, expected)
    assert "sentences" not in result.settings  # every token was placed


def test_an_answer_of_one_sentence_is_one_row():
    result = cite(
        _explainer(), CONTEXT, QUESTION, "w40 w41 w42", method="attnlrp", check=False, ablate=0
    )
    assert len(result.sentences) == 1 and result.sentences[0].text == "w40 w41 w42"
    assert result.statement_relevance.shape == (1, len(result.spans))
    torch.testing.assert_close(result.statement_relevance[0], result.scores)


def test_a_contrasts_foil_tokens_belong_to_no_sentence():
    result = cite(
        _explainer(),
        CONTEXT,
        QUESTION,
        ANSWER,
        foil="w50 w51",
        method="attnlrp",
        check=False,
        ablate=0,
    )
    assert result.token_sentences.tolist() == [0, 0, 1, 1, 2, 2, -1, -1]
    torch.testing.assert_close(
        result.statement_relevance.sum(dim=0), result.span_relevance[:6].sum(dim=0)
    )


def test_a_generated_answer_is_split_as_decoded():
    result = cite(
        _explainer(), CONTEXT, QUESTION, method="cp_lrp", max_new_tokens=4, check=False, ablate=0
    )
    assert "".join(s.text for s in result.sentences) == result.answer
    assert result.token_sentences.shape == (len(result.answer_tokens),)
    assert bool((result.token_sentences >= 0).all())


def test_tokens_are_placed_by_decoding_where_the_text_tokenizes_otherwise():
    tokenizer = tiny_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("</s>")
    # A special token among the ids: tokenizing the text gives other ids, decoding gives it.
    ids = torch.tensor([40, eos, 41, 42])
    found = answer_statements(tokenizer, "w40 w41 w42", ids)
    assert found.located and found.token_sentences.tolist() == [0, 0, 0, 0]
    words = recall.build_tokenizer()  # a word-level tokenizer that has "."
    text = "17 cups . 42 bowls"
    ids = words(text, add_special_tokens=False)["input_ids"]
    ids.insert(3, words.eos_token_id)
    found = answer_statements(words, text, torch.tensor(ids))
    # The special token adds no character: it counts as the one at its start, 9.
    assert found.located and found.token_sentences.tolist() == [0, 0, 0, 1, 1, 1]
    assert [s.text for s in found.sentences] == ["17 cups .", " 42 bowls"]
    lost = answer_statements(tokenizer, "w40. w41", torch.tensor([43, 44]))
    assert not lost.located and [s.text for s in lost.sentences] == ["w40. w41"]
    assert lost.token_sentences.tolist() == [0, 0]
    assert UNLOCATED.startswith("one:")


def test_statement_sums_sum_rows_and_skip_tokens_of_no_sentence():
    rows = torch.arange(12.0).reshape(4, 3)  # small integers: the sums are exact
    sums = statement_sums(rows, torch.tensor([1, 1, -1, 0]), 2)
    assert torch.equal(sums, torch.stack([rows[3], rows[0] + rows[1]]))


@pytest.mark.parametrize("suffix", ["json", "npz"])
def test_the_statements_save_and_load(tmp_path, suffix):
    result = cite(
        _explainer(), CONTEXT, QUESTION, ANSWER, foil="w50", method="attnlrp", check=False, ablate=0
    )
    path = tmp_path / f"cite.{suffix}"
    result.save(path)
    loaded = Citation.load(path)
    assert loaded.sentences == result.sentences
    assert torch.equal(loaded.token_sentences, result.token_sentences)
    assert torch.equal(loaded.statement_relevance, result.statement_relevance)
    if suffix == "json":
        document = json.loads(path.read_text())
        assert document["version"] == VERSION
        first = document["sentences"][1]
        assert document["answer"][first["start"] : first["end"]] == first["text"]
        assert len(document["tensors"]["statement_relevance"]) == 3


def _damaged(tmp_path, document, edit):
    document = json.loads(json.dumps(document))
    edit(document)
    path = tmp_path / "cite.json"
    path.write_text(json.dumps(document))
    return path


def test_damaged_statements_are_refused_and_version_1_reads_as_one(tmp_path):
    saved = tmp_path / "saved.json"
    result = cite(_explainer(), CONTEXT, QUESTION, ANSWER, method="attnlrp", check=False, ablate=0)
    result.save(saved)
    document = json.loads(saved.read_text())
    damage = {
        "sentence index": (
            lambda d: d["tensors"]["token_sentences"].__setitem__(0, 3),
            r"token_sentences is not one sentence index in -1..2",
        ),
        "sentence text": (
            lambda d: d["sentences"][0].update(text="other"),
            "sentence 0's text is not the answer's",
        ),
        "sentences short": (lambda d: d["sentences"].pop(), "the sentences end at"),
        "matrix rows": (
            lambda d: d["tensors"]["statement_relevance"].pop(),
            r"statement_relevance is .* \(3, 6\)",
        ),
    }
    for edit, named in damage.values():
        with pytest.raises(InputError, match=f"holds no valid citation: {named}"):
            Citation.load(_damaged(tmp_path, document, edit))

    def version_1(d):
        d["version"] = 1
        del d["sentences"], d["tensors"]["token_sentences"], d["tensors"]["statement_relevance"]

    old = Citation.load(_damaged(tmp_path, document, version_1))
    assert [s.text for s in old.sentences] == [ANSWER]
    torch.testing.assert_close(old.statement_relevance[0], result.scores)


@pytest.fixture(scope="module")
def llava():
    return Explainer(tiny_llava("clip").double(), tokenizer=tiny_llava_processor("clip"))


PHOTO = (np.random.default_rng(3).random((40, 60, 3)) * 255).astype(np.uint8)


@pytest.mark.parametrize("method", LINEAR)
def test_a_photos_statements_are_each_sentence_cited_after_the_ones_before(llava, method):
    answer = "w14 w15. w16 w17. w18"
    result = cite_image(llava, PHOTO, "w12 w13", answer, method=method, check=False)
    assert [s.text for s in result.sentences] == ["w14 w15.", " w16 w17.", " w18"]
    assert result.statement_relevance.shape == (3, len(result.regions))
    first = cite_image(llava, PHOTO, "w12 w13", "w14 w15.", method=method, check=False)
    torch.testing.assert_close(result.statement_relevance[0], first.scores)
    # Sentence 2 read after sentence 1, the answer cut after it: another forward and backward.
    cut = cite_image(llava, PHOTO, "w12 w13", "w14 w15. w16 w17.", method=method, check=False)
    torch.testing.assert_close(result.statement_relevance[1], cut.statement_relevance[1])
    torch.testing.assert_close(result.statement_relevance[1], cut.region_relevance[2:].sum(dim=0))
    torch.testing.assert_close(result.statement_relevance.sum(dim=0), result.scores)


def test_a_photos_statements_save_and_load(llava, tmp_path):
    result = cite_image(llava, PHOTO, "w12 w13", "w14 w15. w16 w17", check=False)
    result.save(tmp_path / "cite.json")
    loaded = RegionCitation.load(tmp_path / "cite.json")
    assert loaded.sentences == result.sentences
    assert torch.equal(loaded.statement_relevance, result.statement_relevance)
    assert torch.equal(loaded.token_sentences, result.token_sentences)


def test_the_cli_writes_the_statements_and_their_choices(tmp_path):
    folder = save_tiny_lm(tmp_path / "tiny-llama")
    context = tmp_path / "context.txt"
    context.write_text(CONTEXT, encoding="utf-8")
    arguments = ["cite", "--model", str(folder), "--context", str(context), "--question"]
    assert main([*arguments, QUESTION, "--answer", ANSWER, "--out", str(tmp_path)]) == 0
    document = json.loads((tmp_path / "cite.json").read_text())
    assert [s["text"] for s in document["sentences"]] == ["w40 w41.", " w42 w43!", " w44 w45"]
    page = (tmp_path / "cite.html").read_text()
    assert page.count('class="choice sentence"') == 3
    assert main([*arguments, QUESTION, "--answer", "w40 w41", "--out", str(tmp_path)]) == 0
    assert 'class="choice sentence"' not in (tmp_path / "cite.html").read_text()


def _colours(page) -> list[str]:
    return page.eval_on_selector_all("span.src", "spans => spans.map(s => s.style.backgroundColor)")


def _watched(context) -> tuple[object, list[str]]:
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    return page, errors


def test_clicking_a_sentence_lights_up_its_spans(tmp_path):
    pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]'")
    whole, tokens = [1.0, 1.0, 0.0], [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    sentences = [[1.0, 0.0, 0.0], [0.0, 1.0, -0.5]]
    rows = torch.tensor([whole, *tokens, *sentences])
    page_text = cite_html(
        ["One.", " Two.", " Three."],
        "Which?",
        ["A.", "B"],
        rows,
        method="cp_lrp",
        sentences=["A.", " B"],
    )
    path = tmp_path / "cite.html"
    path.write_text(page_text, encoding="utf-8")
    with chromium() as context:
        page, errors = _watched(context)
        page.goto(path.as_uri())
        shown = _colours(page)
        assert "whole answer" in page.locator("#status").inner_text()  # the default view
        page.locator("span.choice.sentence").nth(1).click()
        second = _colours(page)
        assert second != shown and second[0] == "rgb(255, 255, 255)"
        assert "sentence 2 of the answer: B" in page.locator("#status").inner_text()
        assert page.evaluate("location.hash") == "#5"
        assert "(span 2)" in page.locator("#top li").first.inner_text()
        page.locator("span.choice").first.focus()  # whole answer, then Tab to sentence 1
        page.keyboard.press("Tab")
        page.keyboard.press("Enter")
        assert "sentence 1 of the answer: A." in page.locator("#status").inner_text()
        assert _colours(page) not in (shown, second)
        assert page.locator("span.choice[aria-pressed=true]").count() == 1
        assert not errors


def test_clicking_a_sentence_shows_its_regions(tmp_path):
    pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]'")
    cells = grid_regions((40, 60), 1, 2)
    page_text = regions_html(
        PHOTO,
        cells,
        [1.0, 1.0],
        "q",
        "A. B",
        sentences=["A.", " B"],
        sentence_scores=[[1.0, 0.0], [0.0, 1.0]],
    )
    path = tmp_path / "cite.html"
    path.write_text(page_text, encoding="utf-8")
    with chromium() as context:
        page, errors = _watched(context)
        page.goto(path.as_uri())
        whole = page.get_attribute("#regions", "src")
        assert "whole answer" in page.locator("#status").inner_text()
        page.locator("span.choice").nth(2).click()
        assert page.get_attribute("#regions", "src") != whole
        ranked = page.locator("ol.ranked:visible li").first.inner_text()
        assert cells[1].name in ranked and "+1" in ranked
        page.keyboard.press("Shift+Tab")
        page.keyboard.press("Enter")
        assert cells[0].name in page.locator("ol.ranked:visible li").first.inner_text()
        assert page.locator("ol.ranked:visible").count() == 1
        assert "sentence 1 of the answer" in page.locator("#status").inner_text()
        assert not errors
    with pytest.raises(InputError, match="2 sentences but 1 rows"):
        regions_html(
            PHOTO, cells, [1.0, 1.0], "q", "a", sentences=["A.", " B"], sentence_scores=[[1.0, 0.0]]
        )
