"""scripts/results.py: the lines under each table (the best methods within noise, the
methods worse than `random`) and the measured readings, each tied to a table it runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "results.py"


@pytest.fixture(scope="module")
def results():
    spec = importlib.util.spec_from_file_location("results_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def summary(errors: dict[str, float], **numbers: float) -> dict:
    return {"accuracy": 1.0, **numbers, "standard_errors": errors}


def test_findings_name_the_best_and_the_methods_worse_than_random(results):
    road = {
        "results": {
            # MoRF: lower is better; LeRF: higher is better
            "a": summary({"morf_auc": 1.0, "lerf_auc": 1.0}, morf_auc=20.0, lerf_auc=85.0),
            "b": summary({"morf_auc": 2.0, "lerf_auc": 0.5}, morf_auc=70.0, lerf_auc=60.0),
            "random": summary({"morf_auc": 1.5, "lerf_auc": 1.5}, morf_auc=65.0, lerf_auc=66.0),
        },
        "ties": {"morf_auc": ["a"], "lerf_auc": ["a"]},
    }
    assert results.findings(road, "road").splitlines() == [
        "- Best MoRF AUC, with every method tied with it: `a` 20.00 ± 1.00.",
        "- Best LeRF AUC, with every method tied with it: `a` 85.00 ± 1.00.",
        "- MoRF AUC: worse than `random` (65.00 ± 1.50): `b` 70.00 ± 2.00.",
        "- LeRF AUC: worse than `random` (66.00 ± 1.50): `b` 60.00 ± 0.50.",
    ]


def test_findings_without_random_name_only_the_best(results):
    saco = {
        "results": {
            "a": summary({"saco": 0.01}, saco=0.9),
            "b": summary({"saco": 0.02}, saco=0.89),
        },
        "ties": {"saco": ["a", "b"]},
    }
    assert results.findings(saco, "saco") == (
        "- Best SaCo, with every method tied with it: `a` 0.900 ± 0.010, `b` 0.890 ± 0.020."
    )


def test_every_reading_belongs_to_a_table_the_script_makes(results):
    tables = {
        (model, protocol, results.run_label(options)) for model, protocol, options in results.RUNS
    }
    assert set(results.READINGS) <= tables
    assert all(text.endswith("\n") for text in results.READINGS.values())
