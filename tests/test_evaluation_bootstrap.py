"""Bootstrap standard errors and ties within noise: against textbook values, explicit
loops, and in the runner's results files and tables."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from evaluation_fixtures import MEAN, STD, SquaresDataset, train_squares_model

from explain.cli import main
from explain.evaluation import (
    ERASER_FRACTIONS,
    FRACTIONS,
    RECALL_K,
    TOP_K,
    ClassSpecificTest,
    LanguageEvidenceTest,
    PerturbationTest,
    RationaleTest,
    ROADTest,
    SaCoTest,
    SegmentationTest,
    VisionLanguageEvidenceTest,
    run_evaluation,
)
from explain.evaluation.bootstrap import (
    LEVEL,
    ROUNDS,
    draws,
    replicates,
    standard_error,
    tied_with_best,
)
from explain.evaluation.perturbation import CURVES as PERTURBATION_CURVES
from explain.evaluation.protocol import concatenate_records
from explain.evaluation.runner import work_folder
from explain.loading.zoo import WEIGHTS, zoo_root


class MeanOf:
    """The smallest protocol for the bootstrap: the mean of one per-example column."""

    def terms(self, records):
        return {"x": torch.tensor(records["x"], dtype=torch.float64)}

    def from_sums(self, sums, count):
        return {"mean": sums["x"] / count}


def test_the_standard_error_of_a_mean_is_the_textbook_one():
    values = torch.randn(400, generator=torch.Generator().manual_seed(0)).tolist()
    drawn = replicates(MeanOf(), {"x": values}, ["mean"])
    assert drawn["mean"].shape == (ROUNDS,)
    textbook = float(np.std(values, ddof=1)) / math.sqrt(400)
    assert standard_error(drawn["mean"]) == pytest.approx(textbook, rel=0.08)


def test_replicates_are_the_numbers_of_the_resampled_examples_draw_by_draw(monkeypatch):
    records = {"x": [1.0, 2.0, 4.0, 8.0]}
    indices = torch.cat(list(draws(4, rounds=5, seed=3)))
    assert indices.shape == (5, 4) and torch.equal(indices, torch.cat(list(draws(4, 5, 3))))
    expected = [sum(records["x"][i] for i in draw) / 4 for draw in indices.tolist()]
    assert replicates(MeanOf(), records, ["mean"], rounds=5, seed=3)["mean"].tolist() == expected
    # Chunked draws (a large data set) are the same draws, cut into pieces.
    monkeypatch.setattr("explain.evaluation.bootstrap._CHUNK_ELEMENTS", 8)  # 2 draws a chunk
    chunks = list(draws(4, rounds=5, seed=3))
    assert [len(chunk) for chunk in chunks] == [2, 2, 1]
    chunked = replicates(MeanOf(), records, ["mean"], rounds=5, seed=3)["mean"]
    assert chunked.tolist() == [
        sum(records["x"][i] for i in draw) / 4 for draw in torch.cat(chunks).tolist()
    ]


def test_ties_are_decided_on_paired_differences():
    generator = torch.Generator().manual_seed(1)
    hardness = torch.rand(200, generator=generator) * 10  # shared by all methods
    per_example = {
        "best": hardness,
        "same_plus_noise": hardness + 0.05 * torch.randn(200, generator=generator),
        "always_worse": hardness - 0.05,  # below the best on every example
    }
    records = {m: {"x": v.tolist()} for m, v in per_example.items()}
    drawn = {m: replicates(MeanOf(), r, ["mean"])["mean"] for m, r in records.items()}
    values = {m: float(v.mean()) for m, v in per_example.items()}
    # Each method's own standard error (about 0.2) dwarfs the 0.05 gap, but the gap is
    # the same on every example: paired, it is not noise.
    assert standard_error(drawn["always_worse"]) > 0.15
    assert tied_with_best(values, drawn, "higher") == ["best", "same_plus_noise"]
    assert tied_with_best(values, drawn, "lower") == ["always_worse"]


def test_identical_methods_tie_and_the_level_is_the_central_share():
    draws = {"a": torch.arange(100.0), "b": torch.arange(100.0), "c": torch.arange(100.0) + 1}
    values = {"a": 1.0, "b": 1.0, "c": 2.0}
    # c - a is 1 on every draw: never 0, whatever the level.
    assert tied_with_best(values, draws, "lower") == ["a", "b"]
    assert tied_with_best(values, draws, "higher") == ["c"]


@pytest.fixture(scope="module")
def model():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield train_squares_model(steps=30)
    torch.set_num_threads(threads)


def test_results_carry_standard_errors_and_ties_that_the_records_reproduce(model, tmp_path):
    output = tmp_path / "results.json"
    methods = ["generic", "rollout", "random"]
    results = run_evaluation(
        PerturbationTest(model, MEAN, STD),
        SquaresDataset(12),
        methods,
        output,
        model_name="squares-vit",
        batch_size=5,
        progress=False,
    )
    assert results["bootstrap"] == {"rounds": ROUNDS, "level": LEVEL}
    assert "from x = 0" in results["scale"]
    indices = torch.cat(list(draws(12))).numpy()
    auc = {}
    for method in methods:
        parts = sorted((work_folder(output) / method).iterdir())
        records = concatenate_records([json.loads(p.read_text())["records"] for p in parts])
        # The positive AUC of every draw, computed here with numpy from the hits.
        hits = np.array(records["positive_predicted"], dtype=float)[indices]  # (R, n, F)
        correct = np.array(records["correct"], dtype=float)[indices]  # (R, n)
        curve = np.concatenate([correct.mean(1)[:, None], hits.mean(1)], axis=1)
        xs = np.array([0.0, *FRACTIONS])
        auc[method] = 100 * ((curve[:, 1:] + curve[:, :-1]) / 2 * np.diff(xs)).sum(1)
        summary = results["results"][method]
        assert summary["standard_errors"]["positive_auc_predicted"] == pytest.approx(
            auc[method].std(ddof=1), rel=1e-9
        )
        assert set(summary["standard_errors"]) == {
            "positive_auc_predicted",
            "negative_auc_predicted",
            "positive_auc_target",
            "negative_auc_target",
        }  # accuracy does not rank methods
    best = min(methods, key=lambda m: results["results"][m]["positive_auc_predicted"])
    tied = [
        m
        for m in methods
        if np.quantile(auc[m] - auc[best], 0.025) <= 0 <= np.quantile(auc[m] - auc[best], 0.975)
    ]
    assert results["ties"]["positive_auc_predicted"] == tied
    table = output.with_suffix(".md").read_text()
    se = results["results"][best]["standard_errors"]["positive_auc_predicted"]
    value = results["results"][best]["positive_auc_predicted"]
    assert f"**{value:.2f} ± {se:.2f}**" in table
    assert "bootstrap standard error (1000 resamples" in table and "at most 90" in table


def test_the_10_to_90_variant_is_an_option_of_the_command(model, tmp_path):
    zoo_model = zoo_root() / "shapes-vit" / WEIGHTS
    if not zoo_model.is_file():
        pytest.skip("shapes-vit is not trained in this checkout")
    outputs = {}
    for span in ("0-90", "10-90"):
        outputs[span] = tmp_path / span / "r.json"
        status = main(
            ["evaluate", "class-specific", "--model", "zoo:shapes-vit", "--method", "rollout",
             "--limit", "4", "--auc-range", span, "--output", str(outputs[span]), "--quiet"]
        )  # fmt: skip
        assert status == 0
    whole, late = (json.loads(outputs[s].read_text()) for s in ("0-90", "10-90"))
    assert "from x = 0.1 to x = 0.9, at most 80" in late["scale"]
    curve = whole["results"]["rollout"]["curves"]["positive"]
    first = 100 * 0.1 * (curve[0] + curve[1]) / 2  # the trapezoid the variant leaves out
    assert late["results"]["rollout"]["positive_auc"] == pytest.approx(
        whole["results"]["rollout"]["positive_auc"] - first
    )
    assert whole["dataset"] == "shapes-heldout-two-objects" and whole["n"] == 4


def _bare(protocol_class, **attributes):
    """A protocol without a model: summarising needs none."""
    protocol = object.__new__(protocol_class)
    protocol.__dict__.update(attributes)
    return protocol


def _random_records(protocol_name, count, generator):
    def ints(high, *shape):
        return torch.randint(high, (count, *shape), generator=generator).tolist()

    def floats(*shape):
        return torch.rand((count, *shape), generator=generator, dtype=torch.float64).tolist()

    segmentation = {
        "correct": ints(900),
        "labelled": [1000] * count,
        "intersection": ints(400, 2),
        "union": (torch.randint(400, 1000, (count, 2), generator=generator)).tolist(),
        "average_precision": floats(),
    }
    if protocol_name == "perturbation":
        records = {"label": ints(3), "predicted": ints(3), "correct": ints(2)}
        records.update({curve: ints(2, len(FRACTIONS)) for curve in PERTURBATION_CURVES})
        return records
    if protocol_name == "segmentation":
        return {"label": ints(3), "predicted": ints(3), **segmentation}
    if protocol_name == "class-specific":
        return {
            "label": ints(3),
            "other_label": ints(3),
            "target_probability": floats(),
            "other_probability": floats(),
            "positive": floats(len(FRACTIONS)),
            "negative": floats(len(FRACTIONS)),
            "other_positive": floats(len(FRACTIONS)),
            "denser_on_target": ints(2),
            **segmentation,
        }
    if protocol_name == "road":
        records = {"label": ints(3), "predicted": ints(3), "correct": ints(2)}
        return {**records, "morf": ints(2, len(FRACTIONS)), "lerf": ints(2, len(FRACTIONS))}
    if protocol_name == "saco":
        return {"label": ints(3), "predicted": ints(3), "saco": floats(), "drops": floats(10)}
    # The evidence tests: numbers over the right examples (about 9 in 10 here, so that
    # every draw holds some), recall over those with evidence.
    answers = {
        "right": (torch.rand(count, generator=generator) < 0.9).int().tolist(),
        "log_probability": [-5 * x for x in floats()],
        "positive": [[-5 * x for x in row] for row in floats(len(FRACTIONS))],
        "negative": [[-5 * x for x in row] for row in floats(len(FRACTIONS))],
        "evidence": (torch.rand(count, generator=generator) < 0.8).int().tolist(),
        "hits": floats(len(RECALL_K)),
        "rank": [1 + 9 * x for x in floats()],
    }
    if protocol_name == "language-evidence":
        eraser = len(ERASER_FRACTIONS)
        return {
            **answers,
            "tokens": ints(100),
            "comprehensiveness": floats(eraser),
            "sufficiency": floats(eraser),
        }
    if protocol_name == "vision-language-evidence":
        on_object = (torch.rand(count, generator=generator) < 0.8).int().tolist()
        regions = {
            "regions": (torch.rand(count, generator=generator) < 0.7).int().tolist(),
            "region_first": floats(),
            "region_removal": floats(),
            "asked_removal": floats(),
        }
        return {**answers, "object": on_object, "pointing": floats(), **segmentation, **regions}
    f1 = floats(len(TOP_K))
    return {"label": ints(2), "predicted": ints(2), "precision": f1, "recall": f1, "f1": f1}


@pytest.mark.parametrize(
    ("protocol_class", "attributes"),
    [
        (PerturbationTest, {"auc_range": "0-90"}),
        (SegmentationTest, {}),
        (ClassSpecificTest, {"auc_range": "10-90", "multi_label": True}),
        (RationaleTest, {}),
        (ROADTest, {"auc_range": "0-90"}),
        (SaCoTest, {"multi_label": False}),
        (LanguageEvidenceTest, {}),
        (VisionLanguageEvidenceTest, {}),
    ],
)
def test_each_draw_equals_summarising_the_resampled_records(protocol_class, attributes):
    """The weighted sums (fast) give exactly what `summarize` gives on a resampled copy
    of the records (the definition), draw by draw, for every ranking number."""
    protocol = _bare(protocol_class, **attributes)
    records = _random_records(protocol.name, 30, torch.Generator().manual_seed(4))
    ranked = [key for key, column in protocol.columns.items() if column.better]
    drawn = replicates(protocol, records, ranked, rounds=6, seed=9)
    for row, draw in enumerate(torch.cat(list(draws(30, rounds=6, seed=9))).tolist()):
        resampled = {key: [values[i] for i in draw] for key, values in records.items()}
        expected = protocol.summarize(resampled)
        for key in ranked:
            assert float(drawn[key][row]) == pytest.approx(expected[key], rel=1e-12, abs=1e-12)
