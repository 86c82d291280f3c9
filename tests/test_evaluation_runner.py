"""The evaluation runner: results files, resuming after an interruption, skipping methods
that fail, and a 2-process torchrun run that equals the 1-process run."""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from evaluation_fixtures import MEAN, STD, SquaresDataset, train_squares_model
from evaluation_worker import evaluate_squares

from explain.cli import main
from explain.errors import ExplainError, InputError, OptionError, UnknownMethodError
from explain.evaluation import PerturbationTest, run_evaluation
from explain.evaluation.runner import work_folder

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def model():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield train_squares_model(steps=30)
    torch.set_num_threads(threads)


class CountingTest(PerturbationTest):
    """Counts the chunks it computes; fails on `failing` methods like an unsupported model."""

    def __init__(self, *args, failing=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []
        self.failing = failing

    def evaluate(self, method, examples, *, seed=0):
        if method in self.failing:
            raise NotImplementedError(f"{method} does not support this model")
        self.calls.append((method, len(examples)))
        return super().evaluate(method, examples, seed=seed)


class InterruptedDataset(SquaresDataset):
    """Raises KeyboardInterrupt when example `at` is first read, as a user's Ctrl-C would."""

    def __init__(self, *args, at, **kwargs):
        super().__init__(*args, **kwargs)
        self.at = at

    def __getitem__(self, index):
        if index == self.at:
            self.at = None
            raise KeyboardInterrupt
        return super().__getitem__(index)


def test_results_json_table_and_plot(model, tmp_path):
    output = tmp_path / "out" / "results.json"
    results = run_evaluation(
        PerturbationTest(model, MEAN, STD),
        SquaresDataset(9),
        ["generic", "random"],
        output,
        model_name="squares-vit",
        batch_size=4,
        limit=5,
        progress=False,
    )
    assert json.loads(output.read_text()) == results
    assert {k: results[k] for k in ("protocol", "model", "dataset", "n")} == {
        "protocol": "perturbation",
        "model": "squares-vit",
        "dataset": "squares",
        "n": 5,
    }
    assert list(results["results"]) == ["generic", "random"]
    for summary in results["results"].values():
        for key in ("positive_auc_predicted", "negative_auc_predicted"):
            assert 0.0 <= summary[key] <= 90.0
        for key in ("positive_auc_target", "negative_auc_target"):
            assert 0.0 <= summary[key] <= 90.0
        assert len(summary["curves"]["positive_target"]) == 10
    table = output.with_suffix(".md").read_text()
    assert "| `generic` |" in table and "negative AUC, predicted" in table
    assert output.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    chunks = sorted(p.name for p in (work_folder(output) / "generic").iterdir())
    assert chunks == ["00000000-00000004.json", "00000004-00000005.json"]


def test_resume_after_an_interruption_gives_the_same_json(model, tmp_path):
    methods = ["generic", "rollout"]
    uninterrupted = tmp_path / "whole.json"
    run_evaluation(
        PerturbationTest(model, MEAN, STD),
        SquaresDataset(7),
        methods,
        uninterrupted,
        model_name="tiny",
        batch_size=2,
        progress=False,
    )
    output = tmp_path / "resumed.json"
    first = CountingTest(model, MEAN, STD)
    with pytest.raises(KeyboardInterrupt):
        run_evaluation(
            first,
            InterruptedDataset(7, at=4),
            methods,
            output,
            model_name="tiny",
            batch_size=2,
            progress=False,
        )
    assert not output.exists()  # nothing half-written
    assert first.calls == [("generic", 2), ("rollout", 2), ("generic", 2), ("rollout", 2)]
    second = CountingTest(model, MEAN, STD)
    run_evaluation(
        second,
        SquaresDataset(7),
        methods,
        output,
        model_name="tiny",
        batch_size=2,
        progress=False,
    )
    assert second.calls == [("generic", 2), ("rollout", 2), ("generic", 1), ("rollout", 1)]
    assert output.read_text() == uninterrupted.read_text()


def _tamper_positive_curve(chunk):
    chunk["records"]["positive_predicted"][0][0] = 424962
    return chunk


def _records(change):
    def tamper(chunk):
        change(chunk["records"])
        return chunk

    return tamper


TAMPERED_CHUNKS = {
    "out of range": _tamper_positive_curve,
    "NaN": lambda chunk: json.loads(json.dumps(chunk).replace('"correct": [1', '"correct": [NaN')),
    "string": _records(lambda r: r["label"].__setitem__(0, "3")),
    "null": _records(lambda r: r["predicted"].__setitem__(1, None)),
    "bool": _records(lambda r: r["correct"].__setitem__(0, True)),
    "missing key": _records(lambda r: r.pop("negative_target")),
    "extra key": _records(lambda r: r.__setitem__("bonus", [0, 0])),
    "short curve": _records(lambda r: r["negative_predicted"][0].pop()),
    "short column": _records(lambda r: r["label"].pop()),
    "other run": lambda chunk: {**chunk, "run": "0" * 64},
    "other range": lambda chunk: {**chunk, "examples": [0, 1]},
    "old format": lambda chunk: chunk["records"],
    "not an object": lambda chunk: [chunk],
    "deep": lambda chunk: json.loads("[" * 100 + "]" * 100),
}


@pytest.fixture(scope="module")
def finished_run(model, tmp_path_factory):
    """A finished rollout run over 4 examples in chunks of 2: (its output, its results)."""
    output = tmp_path_factory.mktemp("finished") / "r.json"
    protocol = PerturbationTest(model, MEAN, STD)
    run_evaluation(protocol, SquaresDataset(4), ["rollout"], output, **RUN)
    return output, output.read_text()


RUN = dict(model_name="tiny", batch_size=2, progress=False)


@pytest.mark.parametrize("damage", sorted(TAMPERED_CHUNKS))
def test_chunks_that_cannot_be_trusted_are_not_reused(finished_run, tmp_path, damage, capsys):
    from explain.evaluation.runner import _stored_chunk

    finished, _ = finished_run
    original = work_folder(finished) / "rollout" / "00000000-00000002.json"
    stored = json.loads(original.read_text())
    label = {key: stored[key] for key in ("run", "method", "examples")}
    fields = PerturbationTest.fields
    chunk = tmp_path / "chunk.json"
    chunk.write_text(original.read_text())
    assert _stored_chunk(chunk, label, fields, 2) == stored["records"]
    changed = TAMPERED_CHUNKS[damage](copy.deepcopy(stored))
    chunk.write_text(changed if isinstance(changed, str) else json.dumps(changed))
    assert _stored_chunk(chunk, label, fields, 2) is None
    assert "is damaged" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["out of range", "NaN", "string"])
def test_resume_recomputes_an_untrusted_chunk_only(model, tmp_path, finished_run, damage):
    """Tampered numbers once gave a positive AUC of 424962.5 and flipped the ranking."""
    finished, reference = finished_run
    output = tmp_path / "r.json"
    shutil.copytree(work_folder(finished), work_folder(output))
    chunk = work_folder(output) / "rollout" / "00000000-00000002.json"
    text = chunk.read_text()
    changed = TAMPERED_CHUNKS[damage](json.loads(text))
    chunk.write_text(changed if isinstance(changed, str) else json.dumps(changed))
    protocol = CountingTest(model, MEAN, STD)
    run_evaluation(protocol, SquaresDataset(4), ["rollout"], output, **RUN)
    assert protocol.calls == [("rollout", 2)]  # that chunk only, computed again
    assert output.read_text() == reference
    assert json.loads(chunk.read_text()) == json.loads(text)


def test_results_are_standard_json_even_for_numbers_that_are_not_finite(tmp_path):
    from explain.evaluation.runner import _finite

    results = {"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": -float("inf"), "e": 2}}
    assert json.dumps(_finite(results), allow_nan=False) == (
        '{"a": null, "b": [1.0, null], "c": {"d": null, "e": 2}}'
    )


def test_a_method_that_fails_is_skipped_with_its_reason(model, tmp_path):
    protocol = CountingTest(model, MEAN, STD, failing=("rollout",))
    results = run_evaluation(
        protocol,
        SquaresDataset(4),
        ["rollout", "generic"],
        tmp_path / "r.json",
        model_name="tiny",
        batch_size=2,
        progress=False,
    )
    assert list(results["results"]) == ["generic"]
    assert results["skipped"] == {
        "rollout": "NotImplementedError: rollout does not support this model"
    }
    assert "`rollout` skipped" in (tmp_path / "r.md").read_text()


def test_unknown_methods_and_changed_settings_are_refused(model, tmp_path):
    protocol = PerturbationTest(model, MEAN, STD)
    with pytest.raises(UnknownMethodError, match="unknown method 'nope'"):
        run_evaluation(protocol, SquaresDataset(2), ["nope"], tmp_path / "r.json", model_name="m")
    run_evaluation(
        protocol,
        SquaresDataset(2),
        ["random"],
        tmp_path / "r.json",
        model_name="m",
        batch_size=2,
        progress=False,
    )
    with pytest.raises(ExplainError, match="different run"):
        run_evaluation(
            protocol,
            SquaresDataset(2),
            ["random"],
            tmp_path / "r.json",
            model_name="m",
            batch_size=1,
            progress=False,
        )
    retrained = copy.deepcopy(model)  # same name, other weights: its chunks are not reused
    with torch.no_grad():
        retrained.head.bias.add_(1.0)
    with pytest.raises(ExplainError, match="different run"):
        run_evaluation(
            PerturbationTest(retrained, MEAN, STD),
            SquaresDataset(2),
            ["random"],
            tmp_path / "r.json",
            model_name="m",
            batch_size=2,
            progress=False,
        )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_torchrun_processes_equal_one_process(model, tmp_path):
    evaluate_squares(model, tmp_path / "single")
    weights = tmp_path / "weights.pt"
    torch.save(model.state_dict(), weights)
    launch = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
    ]
    worker = [str(TESTS / "evaluation_worker.py"), str(weights), str(tmp_path / "sharded")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([*launch, *worker], check=True, env=env, cwd=TESTS.parent, timeout=600)
    for protocol in ("perturbation", "segmentation"):
        single = json.loads((tmp_path / "single" / f"{protocol}.json").read_text())
        sharded = tmp_path / "sharded" / f"{protocol}.json"
        assert json.loads(sharded.read_text()) == single
        # rank 0 computed chunks 0 and 2, rank 1 chunks 1 and 3; all four are stored
        assert len(list((work_folder(sharded) / "generic").iterdir())) == 4


def test_identical_curves_stay_visible_and_say_so():
    from matplotlib.figure import Figure

    from explain.evaluation.report import _plot_lines

    axis = Figure().subplots()
    x = [0.0, 0.5, 1.0]
    _plot_lines(
        axis,
        [("a (1.0)", x, [1.0, 0.5, 0.0]), ("b (1.0)", x, [1.0, 0.5, 0.0]), ("c", x, [0.0] * 3)],
    )
    first, second, third = axis.get_lines()
    assert first.get_linestyle() == "-" and second.get_linestyle() == "--"
    assert second.get_zorder() > first.get_zorder()  # drawn on top, not hidden below
    assert axis.get_legend_handles_labels()[1] == ["a (1.0)", "b (1.0) = a", "c"]
    assert third.get_linestyle() == "-"


def test_every_method_skipped_is_an_error_not_an_empty_table(model, tmp_path):
    # Issue 46: data no method could run on gave an empty table and exit status 0.
    protocol = CountingTest(model, MEAN, STD, failing=("rollout", "generic"))
    with pytest.raises(InputError, match=r"no method could run on this data \(rollout: .*generic"):
        run_evaluation(
            protocol,
            SquaresDataset(2),
            ["rollout", "generic"],
            tmp_path / "r.json",
            model_name="tiny",
            progress=False,
        )
    assert "skipped" in json.loads((tmp_path / "r.json").read_text())  # the reasons kept


@pytest.mark.parametrize("suffix", [".md", ".png", ".MD"])
def test_an_output_named_like_its_table_or_plot_is_refused(model, tmp_path, capsys, suffix):
    # Issue 46: --output NAME.md wrote the JSON there, then the table over it.
    output = tmp_path / f"results{suffix}"
    with pytest.raises(OptionError, match="would be overwritten"):
        run_evaluation(
            PerturbationTest(model, MEAN, STD),
            SquaresDataset(2),
            ["rollout"],
            output,
            model_name="tiny",
            progress=False,
        )
    argv = ["evaluate", "perturbation", "--model", "zoo:shapes-vit", "--output", str(output)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("explain: error: the output ")
    assert not output.exists()
