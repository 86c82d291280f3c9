"""The generation matrix figure says what the generation page says: rows scaled without
the readout token, unread tokens blank, the method named."""

from __future__ import annotations

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
