"""scripts/bench_at2.py's AT2 experiment: its per-head features are the attention maps of
the model's own eager forward (`output_attentions=True`, nothing of explain), read at the
positions that predict the answer and summed over each span's tokens; its two fits
recover head weights built into hand-made ablations (least squares exactly, the
correlation fit to a correlation of 1)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from script_modules import script_module

from explain import Explainer
from explain.data import recall
from explain.loading import load_model


@pytest.fixture(scope="module")
def bench_at2():
    """scripts/bench_at2.py as a module (it imports bench_cite and bench)."""
    with script_module("bench_at2") as module:
        yield module


def test_head_features_are_the_eager_attention_at_the_answer_positions(bench_at2):
    model = load_model("zoo:recall-llama").model
    explainer = Explainer(model, tokenizer=recall.build_tokenizer())
    (example,) = recall.examples("heldout", 1, 64)
    prompt = bench_at2.read_prompt(explainer, example, 16)
    features = bench_at2.head_features(explainer, prompt)

    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    ids = torch.cat([prompt.prompt_ids, prompt.answer_ids])[None]
    with torch.no_grad():
        maps = eager(input_ids=ids, output_attentions=True).attentions  # L x (1, H, N, N)
    width, answer = prompt.prompt_ids.shape[0], prompt.answer_ids.shape[0]
    expected = torch.zeros(prompt.count, len(maps) * maps[0].shape[1], dtype=torch.float64)
    for layer, attention in enumerate(maps):
        for head in range(attention.shape[1]):
            column = layer * attention.shape[1] + head
            for t in range(answer):  # the position predicting answer token t
                for position in range(width):
                    span = int(prompt.token_spans[position])
                    if span >= 0:
                        expected[span, column] += float(attention[0, head, width - 1 + t, position])
    expected /= answer
    assert features.shape == expected.shape == (prompt.count, 8)
    torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-6)
    # Each head's attention sums to 1 over the prompt; the spans hold all but the tokens
    # of no span (the start token and the question).
    assert bool((features.sum(dim=0) <= 1 + 1e-6).all())


def hand_built(bench_at2, weights, prompts=6, spans=9, ablations=40):
    """Ablations whose log p(answer) is exactly the kept spans' features @ `weights`
    (plus a constant per prompt), for random non-negative features."""
    generator = torch.Generator().manual_seed(0)
    features, keeps, values = [], [], []
    for _ in range(prompts):
        feature = torch.rand(spans, weights.shape[0], generator=generator, dtype=torch.float64)
        keep = torch.rand(ablations, spans, generator=generator) < 0.5
        keep[0] = True
        constant = -10 * torch.rand(1, generator=generator, dtype=torch.float64)
        features.append(feature)
        keeps.append(keep)
        values.append(constant + keep.double() @ (feature @ weights))
    return bench_at2.Calibration(features, keeps, values, 0.0)


def test_least_squares_recovers_the_head_weights(bench_at2):
    weights = torch.tensor([2.0, -1.0, 0.0, 0.5], dtype=torch.float64)
    data = hand_built(bench_at2, weights)
    torch.testing.assert_close(bench_at2.least_squares_weights(data), weights)


def test_the_correlation_fit_reaches_the_hand_built_weights_correlation(bench_at2):
    weights = torch.tensor([2.0, -1.0, 0.0, 0.5], dtype=torch.float64)
    data = hand_built(bench_at2, weights)
    assert float(bench_at2.mean_correlation(data, weights)) == pytest.approx(1.0)
    start = torch.full_like(weights, 0.25)
    fitted = bench_at2.correlation_weights(data)
    assert float(bench_at2.mean_correlation(data, start)) < 0.9
    assert float(bench_at2.mean_correlation(data, fitted)) > 0.99


def test_pearson_against_numpy(bench_at2):
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(2, 30, generator=generator, dtype=torch.float64)
    expected = np.corrcoef(x.numpy(), y.numpy())[0, 1]
    assert float(bench_at2.pearson(x, y)) == pytest.approx(expected)
