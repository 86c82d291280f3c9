"""Text rendering: escaped HTML with a diverging colour scale, and ANSI terminal output."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
import reference_hf as ref
import torch

from explain import Explainer, ExplainError
from explain.viz.text import colour, document_html, to_html, to_terminal


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def test_script_in_text_renders_as_text():
    tokens = ["<script>", "alert('x')", "</script>", "&amp;", '"quoted"']
    page = document_html([to_html(tokens, [1.0, -1.0, 0.5, 0.0, 0.2], title="<b>t</b>")])
    parsed = _Collect()
    parsed.feed(page)
    assert "script" not in parsed.tags and "b" not in parsed.tags
    shown = "".join(parsed.text)
    for token in tokens:
        assert token in shown  # the characters themselves are displayed
    assert "&lt;script&gt;" in page


def test_diverging_colours():
    assert colour(0.0, 1.0) == (255, 255, 255)
    red, green, blue = colour(1.0, 1.0)
    assert red > green and red > blue
    red, green, blue = colour(-1.0, 1.0)
    assert blue > red and blue > green
    assert colour(0.5, 1.0) != colour(1.0, 1.0)
    assert colour(3.0, 1.0) == colour(1.0, 1.0)  # clipped at the scale
    assert colour(1.0, 0.0) == (255, 255, 255)  # an all-zero text stays white


def test_skip_and_scale_exclude_special_tokens():
    tokens = ["[CLS]", "good", "bad", "[SEP]", "[PAD]"]
    html = to_html(tokens, [100.0, 1.0, -1.0, 50.0, 0.0, 0.0], skip={"[CLS]", "[SEP]", "[PAD]"})
    assert "CLS" not in html and "PAD" not in html
    colours = re.findall(r"rgb\((\d+), (\d+), (\d+)\)", html)
    assert colours == [("178", "24", "43"), ("33", "102", "172")]  # full strength each way


def test_terminal_colours_and_sanitises():
    line = to_terminal(["hi", "\x1b[2Jevil"], [1.0, -0.5])
    assert "\x1b[48;2;178;24;43m" in line
    assert "\x1b[2J" not in line and "\\x1b[2Jevil" in line  # shown, not obeyed


def test_too_few_scores_is_an_error():
    with pytest.raises(Exception, match="only 1 scores"):
        to_html(["a", "b"], [1.0])


def test_explanation_to_html():
    class Tokenizer:  # the two methods Explainer and to_html use
        all_special_tokens = ("[PAD]",)

        def convert_ids_to_tokens(self, ids):
            return ["[PAD]" if i == 0 else f"<t{i}>" for i in ids]

    model = ref.tiny_text_model("bert-classifier")
    batch = ref.padded_batch([[2, 14, 7, 3], [2, 41, 3]])
    result = Explainer(model, tokenizer=Tokenizer()).explain(batch, target=[1, 2])
    page = result.to_html(skip=Tokenizer.all_special_tokens)
    assert page.count('<p class="text">') == 2  # two texts
    assert "&lt;t14&gt;" in page and "[PAD]" not in page
    assert "target 2" in page
    with pytest.raises(ExplainError, match="tokenizer"):
        Explainer(model).explain(batch).to_html()
    assert torch.equal(result.relevance[1, 3:], torch.zeros(1))


def test_page_legend_shows_only_the_colours_it_uses_and_values_without_hovering():
    positive = document_html([to_html(["good", "film"], [2.0, 0.5])])
    assert "rgb(178, 24, 43)" in positive and "no token has negative relevance" in positive
    assert "rgb(33, 102, 172)" not in positive  # no blue on the page, none in its legend
    signed = document_html([to_html(["good", "bad"], [1.0, -1.0])])
    assert "evidence against" in signed and "rgb(33, 102, 172)" in signed
    # every score is on the page (the "show values" switch writes it after its token)
    assert 'data-v="+2"' in positive and 'data-v="+0.5"' in positive
    assert '<input type="checkbox" id="values">' in positive
    assert "#values:checked ~ main .tok::after" in positive


def test_all_zero_text_says_so():
    assert "every relevance is 0" in to_html(["not", "good"], [0.0, 0.0])
    assert "every relevance is 0" not in to_html(["not", "good"], [0.0, 1.0])
    assert to_terminal(["not"], [0.0]).endswith("(every relevance is 0)")
