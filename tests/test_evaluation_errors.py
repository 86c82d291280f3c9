"""`explain evaluate` with a bad device, or resuming from a damaged work folder: one clear
line, or the damaged chunk computed again."""

from __future__ import annotations

import json
import re

import pytest
from evaluation_fixtures import MEAN, STD, SquaresDataset, squares_model

from explain.cli import main
from explain.errors import ExplainError
from explain.evaluation import PerturbationTest, run_evaluation
from explain.evaluation.runner import work_folder


def _run(output):
    return run_evaluation(
        PerturbationTest(squares_model(), MEAN, STD),
        SquaresDataset(4),
        ["rollout"],
        output,
        model_name="squares",
        batch_size=1,
        progress=False,
    )


DAMAGE = {
    "cut": lambda text: text[: len(text) // 2],
    "empty list": lambda text: "[]",
    "not JSON": lambda text: "\x00\x01",
    "too few records": lambda text: json.dumps({k: [] for k in json.loads(text)}),
}


def test_damaged_chunks_are_computed_again(tmp_path, capsys):
    output = tmp_path / "results.json"
    expected = _run(output)
    chunks = sorted((work_folder(output) / "rollout").iterdir())
    originals = [chunk.read_text() for chunk in chunks]
    for chunk, damage in zip(chunks, DAMAGE.values(), strict=True):  # one kind per chunk
        chunk.write_text(damage(chunk.read_text()))
    output.unlink()
    assert _run(output) == expected
    err = capsys.readouterr().err
    for chunk, original in zip(chunks, originals, strict=True):
        assert re.search(
            rf"{re.escape(str(chunk))} is damaged \(.+?\); computing that chunk again", err
        )
        assert chunk.read_text() == original


def test_a_damaged_run_file_is_named(tmp_path):
    output = tmp_path / "results.json"
    _run(output)
    run_file = work_folder(output) / "run.json"
    run_file.write_text('{"protocol": "pertu')
    with pytest.raises(ExplainError, match=rf"{run_file} is damaged .*delete .*\.parts to start"):
        _run(output)


def test_an_unknown_device_is_one_line(tmp_path, capsys):
    output = tmp_path / "results.json"
    argv = ["evaluate", "perturbation", "--model", "zoo:shapes-vit", "--device", "tpu9"]
    status = main([*argv, "--output", str(output)])
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == "explain: error: unknown device 'tpu9'; use one of auto, cpu, cuda, mps (or cuda:N)"
    )
    assert not output.exists()
