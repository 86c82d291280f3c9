"""AttnLRP and CP-LRP equal LXT 2.1, the authors' reference implementation, on the same
weights: explain on a padded batch here, LXT on each text alone in its own environment
(tests/lxt_reference.py run by the Python of scripts/lxt_env.sh's virtual environment,
since LXT needs transformers 4.x and patches it for the whole process)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from reference_hf import padded_batch, tiny_text_model

from explain import Explainer

LXT_ENV = Path(os.environ.get("EXPLAIN_LXT_ENV", Path.home() / ".cache/explain-lxt/venv"))
LXT_PYTHON = LXT_ENV / "bin" / "python"

pytestmark = pytest.mark.skipif(
    not (LXT_ENV / "ready").exists(),
    reason=f"no LXT 2.1 environment at {LXT_ENV}: build it with scripts/lxt_env.sh",
)

TEXTS = [[2, 17, 5, 33, 8, 41, 3], [2, 9, 28, 3], [2, 50, 11, 6, 3]]
TARGETS = [1, 2, 0]
# (tiny model, rule set, padding side): LXT 2.1 has AttnLRP for BERT, both for GPT-2.
CASES = [
    ("bert-classifier", "attnlrp", "right"),
    ("gpt2", "attnlrp", "left"),
    ("gpt2", "cp_lrp", "left"),
]


@pytest.fixture(scope="module")
def lxt_results(tmp_path_factory):
    """LXT's relevance for every case, computed in parallel subprocesses."""
    folder = tmp_path_factory.mktemp("lxt")
    processes = {}
    for name, rules, _ in CASES:
        model = tiny_text_model(name)
        weights = folder / f"{name}.pt"
        if not weights.exists():
            torch.save(model.state_dict(), weights)
        config = {**model.config.to_diff_dict(), "model_type": model.config.model_type}
        config.pop("transformers_version", None)
        request = folder / f"{name}-{rules}.json"
        request.write_text(
            json.dumps(
                dict(
                    model=type(model).__name__,
                    config=config,
                    weights=str(weights),
                    rules=rules,
                    texts=TEXTS,
                    targets=TARGETS,
                )
            )
        )
        script = Path(__file__).parent / "lxt_reference.py"
        processes[name, rules] = subprocess.Popen(
            [str(LXT_PYTHON), str(script), str(request)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"},
        )
    results = {}
    for key, process in processes.items():
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, f"LXT failed on {key}:\n{err[-3000:]}"
        results[key] = [torch.tensor(row) for row in json.loads(out)]
    return results


@pytest.mark.parametrize(("name", "rules", "side"), CASES)
def test_equals_lxt_on_a_padded_batch(lxt_results, name, rules, side):
    model = tiny_text_model(name)
    batch = padded_batch(TEXTS, side)
    result = Explainer(model).explain(batch, method=rules, target=TARGETS)
    for b, expected in enumerate(lxt_results[name, rules]):
        mask = batch["attention_mask"][b].bool()
        found = result.relevance[b][mask]
        scale = expected.abs().max()
        torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-4 * float(scale))
        assert (result.relevance[b][~mask] == 0).all()
