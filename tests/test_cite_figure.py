"""The cite figure's span labels: a span's words whole, or its first and last words around
an ellipsis, and the figure wide enough to show every label whole."""

from __future__ import annotations

import pytest
import torch

from explain.cite.figure import cite_figure, span_label

RECALL_SPAN = "your then one then are her slow boar 55 flags ."
LONG_SPAN = "them his many to with a out on him there when her wild dove 67 books ."


@pytest.mark.parametrize(
    ("index", "text", "label"),
    [
        (0, "a short span .", "[1] a short span ."),
        (2, "  spaced\n\tout  words ", "[3] spaced out words"),  # one line, single spaces
        (3, RECALL_SPAN, f"[4] {RECALL_SPAN}"),  # 47 characters: whole, its fact kept
        (1, LONG_SPAN, "[2] them his many to with a … wild dove 67 books ."),
        (0, "x" * 100, "[1] " + "x" * 23 + " … " + "x" * 22),  # one word: cut inside it
        (0, "y" * 80 + " end", "[1] " + "y" * 23 + " … end"),
        (0, "start " + "z" * 80, "[1] start … " + "z" * 40),
    ],
)
def test_a_label_is_the_span_or_its_start_and_end_cut_at_word_boundaries(index, text, label):
    assert span_label(index, text) == label


def test_no_label_is_longer_than_the_limit_and_each_keeps_both_ends():
    words = [f"w{n}" * (n % 7 + 1) for n in range(60)]
    for count in range(1, 60):
        text = " ".join(words[:count])
        shown = span_label(0, text).removeprefix("[1] ")
        assert len(shown) <= 48
        if shown != text:
            head, tail = shown.split(" … ")
            assert text.startswith(head) and text.endswith(tail)
            # cut at word boundaries: whole words at both ends
            assert text[len(head)] == " " and text[-len(tail) - 1] == " "


def test_the_figure_shows_every_label_whole():
    spans = [RECALL_SPAN, LONG_SPAN, "x" * 100, "a ."]
    rows = torch.tensor([[3.0, 2.0, 1.0, -1.0], [1.0, 1.0, 0.5, -0.5], [2.0, 1.0, 0.5, -0.5]])
    figure = cite_figure(spans, ["55", "flags"], rows, method="cp_lrp", title="explain cite: m")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    ticks = figure.axes[0].get_yticklabels()
    assert [t.get_text() for t in ticks] == [span_label(s, spans[s]) for s in range(4)]
    width = figure.bbox.width
    for tick in ticks:
        box = tick.get_window_extent(canvas.get_renderer())
        assert box.x0 >= 0 and box.x1 <= width


def test_the_matrix_has_its_key_inside_the_figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    spans = [RECALL_SPAN, "a ."]
    rows = torch.tensor([[3.0, -1.0], [1.0, -1.5e-5], [2.0, 0.5]])  # whole answer, 55, flags
    figure = cite_figure(spans, ["55", "flags"], rows, method="cp_lrp")
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    _, grid, key = figure.axes  # the bars, the matrix, its key
    assert key.get_ylim() == pytest.approx((-2.0, 2.0))  # the matrix's largest |value|
    assert [t.get_text() for t in key.get_yticklabels()] == ["-2.00", "0", "2.00"]
    beside = grid.get_window_extent(renderer)
    for tick in key.get_yticklabels():
        box = tick.get_window_extent(renderer)
        assert box.x0 > beside.x1 and box.x1 <= figure.bbox.width, tick.get_text()
