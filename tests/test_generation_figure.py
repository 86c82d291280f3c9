"""The generation matrix figure says what the generation page says: rows scaled without
the readout token, unread tokens blank, the method named."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
import torch

from explain.errors import InputError
from explain.viz.generation_figure import generation_figure, scale_generation_rows


def test_rows_are_scaled_without_the_readout_token_and_unread_tokens_are_blank():
    prompt, count = 3, 2
    matrix = np.arange(1.0, 11.0).reshape(count, prompt + count)  # (2, 5)
    shown = scale_generation_rows(matrix, prompt)
    assert shown.shape == (2, 4)  # the last token, read by nothing, has no column
    # row 0 explains token 3: reads 0..2, token 2 is its readout (off the scale)
    assert np.allclose(shown[0, :2], matrix[0, :2] / 2.0)
    assert np.isnan(shown[0, 2:]).all()
    # row 1 explains token 4: reads 0..3, token 3 is its readout
    assert np.allclose(shown[1, :3], matrix[1, :3] / 8.0)
    assert np.isnan(shown[1, 3:]).all()


def test_a_signed_row_keeps_its_signs_and_an_empty_one_is_zero():
    matrix = np.array([[-4.0, 2.0, 9.0, 0.0], [0.0, 0.0, 0.0, 5.0]])
    shown = scale_generation_rows(matrix, 2)
    assert np.allclose(shown[0, :1], [-1.0]) and np.isnan(shown[0, 1:]).all()
    assert np.allclose(shown[1, :2], [0.0, 0.0])


def test_the_figure_names_the_method_and_draws_future_cells_blank():
    tokens = ["a", "b", "c", "d", "e"]
    matrix = torch.rand(2, 5, generator=torch.Generator().manual_seed(0))
    figure = generation_figure(matrix, tokens, 3, method="generic", title="tiny")
    texts = " ".join(t.get_text() for t in figure.texts)
    assert "tiny (generic)" in texts and "without the readout token" in texts
    axis = figure.axes[0]
    drawn = axis.get_images()[0].get_array()
    assert drawn.shape == (2, 4) and drawn.mask[0, 2:].all() and not drawn.mask[1, :3].any()
    assert axis.get_images()[0].get_cmap().name.startswith("inferno")
    assert [t.get_text() for t in axis.get_yticklabels()] == ["d", "e"]
    assert [t.get_text() for t in axis.get_xticklabels()] == ["a", "b", "c", "d"]
    assert len(axis.patches) == 2  # one hatched readout cell per row


def test_shapes_that_do_not_fit_are_refused():
    with pytest.raises(InputError, match="do not fit"):
        generation_figure(torch.zeros(3, 4), ["a", "b", "c", "d"], 2, method="generic")
    with pytest.raises(InputError, match="NaN"):
        generation_figure(torch.full((1, 3), float("nan")), ["a", "b", "c"], 2, method="generic")


def test_the_prompts_end_is_drawn_over_and_apart_from_the_readout_cells():
    # Row 0's readout cell ends at the prompt's end and row 1's starts there: the line
    # must be seen as the boundary, not as the hatched cells' outline, nor cross a label.
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    tokens = ["a", "b", "c", "d", "e", "f"]
    matrix = torch.rand(3, 6, generator=torch.Generator().manual_seed(1))
    figure = generation_figure(matrix, tokens, 3, method="generic")
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    axis = figure.axes[0]
    (line,) = [line for line in axis.lines if line.get_gid() == "prompt-end"]
    cells = [patch for patch in axis.patches if patch.get_gid() == "readout"]
    assert len(cells) == 3
    boundary = line.get_window_extent(renderer)
    panel = axis.get_window_extent(renderer)
    assert boundary.y0 < panel.y0 and boundary.y1 > panel.y1  # past the panel's edges
    x = (boundary.x0 + boundary.x1) / 2
    assert x == pytest.approx(axis.transData.transform((2.5, 0))[0])  # between c and d
    for cell in cells:
        assert cell.get_zorder() < line.get_zorder()
        box = cell.get_window_extent(renderer)
        assert box.x1 < boundary.x0 or box.x0 > boundary.x1, "a readout cell touches the line"
    for label in axis.get_xticklabels():
        box = label.get_window_extent(renderer)
        assert not box.overlaps(boundary), f"the line crosses the label {label.get_text()!r}"


def test_columns_are_as_narrow_as_their_labels_allow_and_no_two_labels_touch():
    # A long prompt's figure is as wide as its columns: each must hold its rotated 8 pt
    # label with room to spare and no more (the README shows a 48-token prompt's figure
    # at page width), and the labels, ranks' digits included, must stay apart.
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    tokens = ["<s>", *(f"w{n % 10}" for n in range(46)), "flags"]
    matrix = torch.rand(2, len(tokens), generator=torch.Generator().manual_seed(2))
    figure = generation_figure(matrix, tokens, len(tokens) - 2, method="cp_lrp")
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    axis = figure.axes[0]
    boxes = [label.get_window_extent(renderer) for label in axis.get_xticklabels()]
    pitch = (axis.get_window_extent(renderer).width) / len(boxes)
    widest = max(box.width for box in boxes)
    assert widest < pitch < 2 * widest
    for left, right in pairwise(boxes):
        assert left.x1 < right.x0, "two token labels touch"
