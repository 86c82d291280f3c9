"""A text context beside the photo (explain.cite.image.cite_image(context=...)): its spans
are sources beside the regions, scored from the one backward (a span's score the sum of
its tokens' relevance, against an explanation computed here and its tokens counted by
hand on the tiny LLaVA's word tokenizer), the regions scored as without it, the
statement rows over both, the check that fills regions and cuts spans in one forward
against the answer's log-probability computed by hand, cite.json, the CLI and the page
in a real browser."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from serve_fixtures import chromium

from explain import Explainer, InputError, OptionError
from explain.cite import cite
from explain.cite.image import RegionCitation, cite_image
from explain.cite.regions import grid_regions
from explain.cite.regions_page import regions_html
from explain.cli import main
from explain.generation import Generation, explain_generation
from explain.testing.tiny_vlm import save_tiny_llava, tiny_llava, tiny_llava_processor

CONTEXT = "w9 w10 w11. w20 w21. w30 w31 w32 w33."
QUESTION = "w12 w13"
FILLED = f"{CONTEXT}\n\n{QUESTION}"  # the default template: the context, a blank line
ANSWER = "w14 w15. w16"


@pytest.fixture(scope="module")
def llava():
    return Explainer(tiny_llava("clip").double(), tokenizer=tiny_llava_processor("clip"))


@pytest.fixture(scope="module")
def photo():
    return (np.random.default_rng(11).random((40, 60, 3)) * 255).astype(np.uint8)


def _encoded(llava, photo, text):
    processor = llava.tokenizer
    message = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    rendered = processor.apply_chat_template(message, add_generation_prompt=True)
    return processor(images=[photo], text=[rendered], return_tensors="pt")


def _hand_spans(llava, ids):
    """(P,) each prompt token's span, counted by hand: the tiny tokenizer reads one token
    per word, and the context's words are the first after the image tokens."""
    image = int((ids == llava.adapter.image_token_id).nonzero()[-1]) + 1
    owners = torch.full((ids.shape[0],), -1)
    at = image
    for s, span in enumerate(CONTEXT.replace(". ", ".|").split("|")):
        words = len(span.split())
        owners[at : at + words] = s
        at += words
    return owners


def test_span_scores_are_their_tokens_relevance_from_the_one_backward(llava, photo):
    cited = cite_image(llava, photo, QUESTION, ANSWER, context=CONTEXT, check=False)
    assert [s.text for s in cited.context.spans] == [
        "w9 w10 w11.",
        " w20 w21.",
        " w30 w31 w32 w33.",
    ]
    encoded = _encoded(llava, photo, FILLED)
    ids = encoded["input_ids"][0]
    owners = _hand_spans(llava, ids)
    assert torch.equal(cited.context.token_spans, owners)
    answer = cited.answer_ids
    generation = Generation(
        input_ids=torch.cat([ids, answer])[None],
        attention_mask=torch.ones(1, ids.shape[0] + answer.shape[0], dtype=torch.long),
        prompt_length=ids.shape[0],
        extra={"pixel_values": encoded["pixel_values"].double()},
    )
    found = explain_generation(llava, generation, method=cited.method, score="log_probability")
    text = found.explanation.relevances["text"][0, : answer.shape[0], : ids.shape[0]].double()
    expected = torch.stack([text[:, owners == s].sum(dim=1) for s in range(3)], dim=1)
    torch.testing.assert_close(cited.context.span_relevance, expected)
    torch.testing.assert_close(cited.context.scores, expected.sum(dim=0))
    image = found.explanation.relevances["image"][0, : answer.shape[0]].double()
    torch.testing.assert_close(cited.scores.sum(), image.sum())  # the same backward's map


def test_the_regions_score_as_without_the_context_as_a_source(llava, photo):
    # the same prompt (the context written into the question) and the same method
    with_context = cite_image(llava, photo, QUESTION, ANSWER, context=CONTEXT, check=False)
    without = cite_image(llava, photo, FILLED, ANSWER, check=False)
    assert without.context is None
    torch.testing.assert_close(with_context.scores, without.scores)
    torch.testing.assert_close(with_context.region_relevance, without.region_relevance)
    torch.testing.assert_close(without.source_scores, without.scores)
    by_cite = cite(llava, CONTEXT, QUESTION, ANSWER, image=photo, check=False)
    torch.testing.assert_close(by_cite.source_scores, with_context.source_scores)


def test_statements_and_ranking_run_over_regions_and_spans(llava, photo):
    cited = cite_image(llava, photo, QUESTION, ANSWER, context=CONTEXT, check=False)
    assert len(cited.sentences) == 2
    rows = cited.statement_sources
    assert rows.shape == (2, 9 + 3)
    for n in range(2):
        tokens = cited.token_sentences == n
        torch.testing.assert_close(rows[n, :9], cited.region_relevance[tokens].sum(dim=0))
        torch.testing.assert_close(rows[n, 9:], cited.context.span_relevance[tokens].sum(dim=0))
    torch.testing.assert_close(rows.sum(dim=0), cited.source_scores)
    ranked = cited.ranked_sources()
    assert len(ranked) == 12 and {kind for kind, _ in ranked} == {"region", "span"}
    values = [
        float(cited.scores[i] if kind == "region" else cited.context.scores[i])
        for kind, i in ranked
    ]
    assert values == sorted(values, reverse=True)


def _log_p(llava, pixel_values, ids, answer):
    """log p(answer) after the prompt `ids`, the model's own forward."""
    whole = torch.cat([ids, answer])[None]
    with torch.no_grad():
        logits = llava.adapter.model(
            input_ids=whole, attention_mask=torch.ones_like(whole), pixel_values=pixel_values
        ).logits[0]
    rows = logits[ids.shape[0] - 1 : -1].double().log_softmax(dim=-1)
    return float(rows.gather(1, answer[:, None]).sum())


def test_the_check_fills_regions_and_cuts_spans_by_hand(llava, photo):
    cited = cite_image(llava, photo, QUESTION, ANSWER, context=CONTEXT, lds=4, seed=2)
    check = cited.check
    assert "spans' tokens cut out" in check.ablation and check.lds_ablations == 4
    colour = photo.reshape(-1, 3).mean(axis=0).round().astype(np.uint8)
    encoded = _encoded(llava, photo, FILLED)
    ids, pixels = encoded["input_ids"][0], encoded["pixel_values"].double()
    owners = _hand_spans(llava, ids)
    answer = cited.answer_ids
    whole = _log_p(llava, pixels, ids, answer)
    assert check.full == pytest.approx(whole, abs=1e-9)

    def without(removed):
        edited = photo.copy()
        for kind, index in removed:
            if kind == "region":
                edited[cited.regions[index].mask] = colour
        kept = torch.ones_like(ids, dtype=torch.bool)
        for kind, index in removed:
            if kind == "span":
                kept &= owners != index
        pixel_values = _encoded(llava, edited, FILLED)["pixel_values"].double()
        return _log_p(llava, pixel_values, ids[kept], answer)

    ranked = cited.ranked_sources()
    for drop in check.drops:
        assert drop.top == pytest.approx(whole - without(ranked[: drop.k]), abs=1e-9)
    # 12 sources: each removed once for k = 1, the exact baseline
    singles = [whole - without([source]) for source in ranked]
    first = check.drops[0]
    assert first.exact and first.sets == 12
    assert first.random == pytest.approx(float(np.mean(singles)), abs=1e-9)
    assert first.random_std == pytest.approx(float(np.std(singles)), abs=1e-9)


def test_a_citation_with_a_context_saves_loads_and_refuses_damage(llava, photo, tmp_path):
    cited = cite_image(llava, photo, QUESTION, ANSWER, context=CONTEXT, lds=4)
    for suffix in ("json", "npz"):
        path = tmp_path / f"cite.{suffix}"
        cited.save(path)
        back = RegionCitation.load(path)
        assert back.context.spans == cited.context.spans and back.context.kind == "sentences"
        for name in ("token_spans", "span_relevance", "scores", "statement_relevance"):
            torch.testing.assert_close(getattr(back.context, name), getattr(cited.context, name))
        assert back.check == cited.check
        torch.testing.assert_close(back.source_scores, cited.source_scores)
    document = json.loads((tmp_path / "cite.json").read_text())
    assert document["version"] == 3
    assert [s["text"] for s in document["context"]["spans"]] == [
        s.text for s in cited.context.spans
    ]
    document["context"]["spans"][1]["start"] += 1
    damaged = tmp_path / "damaged.json"
    damaged.write_text(json.dumps(document))
    with pytest.raises(InputError, match="do not tile"):
        RegionCitation.load(damaged)
    plain = cite_image(llava, photo, QUESTION, ANSWER, check=False)
    plain.save(tmp_path / "plain.json")
    assert RegionCitation.load(tmp_path / "plain.json").context is None


def test_what_a_context_beside_the_photo_refuses(llava, photo):
    chat = [{"role": "user", "content": "w9"}]
    with pytest.raises(OptionError, match="a chat"):
        cite_image(llava, photo, QUESTION, ANSWER, context=chat)
    with pytest.raises(OptionError, match="needs the context as a list of"):
        cite_image(llava, photo, QUESTION, ANSWER, context=CONTEXT, spans="documents")
    with pytest.raises(OptionError, match="template must hold"):
        cite_image(llava, photo, QUESTION, ANSWER, context=CONTEXT, template="{question}")


def test_the_cli_cites_the_photo_and_the_context(tmp_path, photo, capsys):
    folder = save_tiny_llava(tmp_path / "tiny-llava")
    image = tmp_path / "photo.png"
    Image.fromarray(photo).save(image)
    context = tmp_path / "context.txt"
    context.write_text(CONTEXT)
    arguments = ["cite", "--model", str(folder), "--image", str(image), "--context"]
    arguments += [str(context), "--question", QUESTION, "--answer", ANSWER, "--out"]
    assert main([*arguments, str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "random regions and spans" in printed
    explainer = Explainer(tiny_llava(), tokenizer=tiny_llava_processor())
    expected = cite_image(explainer, photo, QUESTION, ANSWER, context=CONTEXT)
    saved = RegionCitation.load(tmp_path / "out" / "cite.json")
    torch.testing.assert_close(saved.source_scores, expected.source_scores, rtol=1e-5, atol=1e-7)
    page = (tmp_path / "out" / "cite.html").read_text()
    assert page.count('class="src"') == 3 and "one scale" in page


def _span_colours(page) -> list[str]:
    return page.eval_on_selector_all("span.src", "spans => spans.map(s => s.style.backgroundColor)")


def test_clicking_a_sentence_lights_up_its_spans_and_regions(tmp_path, photo):
    pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]'")
    cells = grid_regions((40, 60), 1, 2)
    # two regions, then two spans; sentence 1 rests on region 1 and span 2
    page_text = regions_html(
        photo,
        cells,
        [1.0, 0.5, 0.5, 1.0],
        "q",
        "A. B",
        sentences=["A.", " B"],
        sentence_scores=[[1.0, 0.0, 0.0, 1.0], [0.0, 0.5, 0.5, 0.0]],
        spans=["One.", " Two."],
    )
    path = tmp_path / "cite.html"
    path.write_text(page_text, encoding="utf-8")
    with chromium() as context:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.goto(path.as_uri())
        picture, colours = page.get_attribute("#regions", "src"), _span_colours(page)
        page.locator("span.choice").nth(1).click()
        first = _span_colours(page)
        assert page.get_attribute("#regions", "src") != picture and first != colours
        assert first[0] == "rgb(255, 255, 255)"  # span 1 scores 0 for sentence 1
        ranked = page.locator("ol.ranked:visible li")
        assert "r1c1" in ranked.nth(0).inner_text() and "span 2" in ranked.nth(1).inner_text()
        page.locator("span.choice").nth(2).click()
        assert _span_colours(page) not in (colours, first)
        assert "sentence 2 of the answer" in page.locator("#status").inner_text()
        assert not errors
    with pytest.raises(InputError, match="2 regions and 2 spans but 3 scores"):
        regions_html(photo, cells, [1.0, 0.5, 0.5], "q", "a", spans=["One.", " Two."])


@pytest.mark.parametrize("family", ["qwen2_vl", "idefics3", "paligemma"])
def test_the_context_is_placed_after_the_image_tokens_of_other_families(family, photo):
    from explain.testing import tiny_vlm

    model, processor = {
        "qwen2_vl": (tiny_vlm.tiny_qwen2_vl, tiny_vlm.tiny_qwen2_vl_processor),
        "idefics3": (tiny_vlm.tiny_idefics3, tiny_vlm.tiny_idefics3_processor),
        "paligemma": (tiny_vlm.tiny_paligemma, tiny_vlm.tiny_paligemma_processor),
    }[family]
    explainer = Explainer(model().double(), tokenizer=processor())
    lines = "w9 w10\nw11 w12"  # tiny Qwen2-VL's tokenizer reads an unknown word as video
    cited = cite_image(explainer, photo, QUESTION, "w14 w15", context=lines, spans="lines", lds=2)
    ids = cited.explanation.generation.input_ids[0]
    owners = cited.context.token_spans
    words = explainer.tokenizer.tokenizer
    for s, span in enumerate(cited.context.spans):
        expected = words(span.text.strip(), add_special_tokens=False)["input_ids"]
        assert ids[: owners.shape[0]][owners == s].tolist() == expected
    image = (ids == explainer.adapter.image_token_id).nonzero().max()
    assert int(owners.max()) == 1 and (owners >= 0).nonzero().min() > image
    assert cited.check is not None and cited.check.lds_ablations == 2


def test_the_figure_draws_the_pages_picture_on_the_one_scale(photo):
    import base64
    import io
    import re

    from explain.cite.regions_page import region_picture, regions_figure

    cells = grid_regions((40, 60), 1, 2)
    scores = [0.5, -0.25, 2.0, 0.0]  # the top span's |score| sets the one scale
    figure = regions_figure(photo, cells, scores, spans=["One.", " Two."])
    picture = region_picture(photo, cells, scores[:2], 2.0)
    np.testing.assert_allclose(np.asarray(figure.axes[0].images[0].get_array()), picture)
    assert figure.axes[-1].get_ylim() == pytest.approx((-2.0, 2.0))
    bars = [label.get_text() for label in figure.axes[1].get_yticklabels()]
    assert bars[0] == "1. [1] One." and bars[1] == "2. r1c1" and len(bars) == 4
    numbers = [text.get_text() for text in figure.axes[0].texts]
    assert numbers == ["2", "4"]  # r1c1 and r1c2's places in the one ranking
    page = regions_html(photo, cells, scores, "q", "a", spans=["One.", " Two."])
    address = re.search(r'id="regions" src="([^"]+)"', page).group(1)
    shown = Image.open(io.BytesIO(base64.b64decode(address.split(",", 1)[1]))).convert("RGB")
    expected = (np.clip(picture, 0, 1) * 255 + 0.5).astype(np.uint8)
    np.testing.assert_array_equal(np.asarray(shown), expected)
