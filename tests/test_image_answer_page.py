"""The vision-language answer page in a real browser: the address counts words from 1
(as the generation page does), a click or Enter on a word shows it and updates the
address, and every word is reachable from the keyboard."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from serve_fixtures import chromium

from explain.viz.image_answer import answer_html

pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]'")


@pytest.fixture(scope="module")
def page_file(tmp_path_factory):
    photo = np.zeros((8, 12, 3), dtype=np.uint8)
    maps = torch.stack([torch.zeros(8, 12), torch.ones(8, 12)])
    relevance = torch.tensor([[0.5, -0.2, 1.0], [0.1, 0.9, 1.0]])
    html = answer_html(
        photo,
        maps,
        ["a", "[image]", "?"],
        relevance,
        ["red", "circle"],
        2,
        rests_on=[[0, 1], [1, 0]],
    )
    path = tmp_path_factory.mktemp("page") / "answer.html"
    path.write_text(html, encoding="utf-8")
    return path


def _status(page) -> str:
    return page.locator("#status").inner_text()


def test_address_keyboard_and_clicks(page_file):
    with chromium() as context:
        page = context.new_page()
        page.goto(page_file.as_uri() + "#2")
        assert "word 2 of 2: circle" in _status(page)
        page.locator("span.word").nth(0).click()
        assert "word 1 of 2: red" in _status(page)
        assert page.evaluate("location.hash") == "#1"
        page.keyboard.press("Tab")  # from the clicked word 1 to word 2
        page.keyboard.press("Enter")
        assert "word 2 of 2: circle" in _status(page)
        assert page.evaluate("location.hash") == "#2"


def test_the_status_line_names_what_the_chosen_token_rests_on(page_file, tmp_path):
    from explain.viz.generation import generation_html

    # the generation page: token 2 ("d") rests most on "a" then "<b>" (escaped, shown
    # as written), its readout token "c" left out by the caller's rests_on
    rows = torch.tensor([[0.1, 0.9, 2.0, 0.0, 0.0], [0.7, 0.5, 0.1, 3.0, 0.0]])
    text = generation_html(
        ["a", "<b>", "c", "d", "e"], 3, rows, method="generic", rests_on=[[1, 0], [0, 1, 2]]
    )
    generation = tmp_path / "generation.html"
    generation.write_text(text, encoding="utf-8")
    with chromium() as context:
        page = context.new_page()
        page.goto(page_file.as_uri() + "#1")
        # each token (escaped, shown as written) with its position and signed value
        assert _status(page).endswith("word 1 of 2: red rests most on 'a'@0 0.5, '[image]'@1 -0.2")
        page.goto(generation.as_uri() + "#2")
        assert _status(page).endswith("e rests most on 'a'@0 0.7, '<b>'@1 0.5, 'c'@2 0.1")
