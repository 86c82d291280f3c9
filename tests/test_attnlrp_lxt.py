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

from explain import Explainer, UnsupportedModelError
from explain.architectures import adapter_for

LXT_ENV = Path(os.environ.get("EXPLAIN_LXT_ENV", Path.home() / ".cache/explain-lxt/venv"))
LXT_PYTHON = LXT_ENV / "bin" / "python"

pytestmark = pytest.mark.skipif(
    not (LXT_ENV / "ready").exists(),
    reason=f"no LXT 2.1 environment at {LXT_ENV}: build it with scripts/lxt_env.sh",
)

TEXTS = [[2, 17, 5, 33, 8, 41, 3], [2, 9, 28, 3], [2, 50, 11, 6, 3]]
TARGETS = [1, 2, 0]
DECODERS = ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM"]
# (tiny model, rule set, padding side): LXT 2.1 has AttnLRP for BERT, both for the rest.
CASES = [
    ("bert-classifier", "attnlrp", "right"),
    ("gpt2", "attnlrp", "left"),
    ("gpt2", "cp_lrp", "left"),
] + [(name, rules, "left") for name in DECODERS for rules in ("attnlrp", "cp_lrp")]


def tiny_decoder(name: str) -> torch.nn.Module:
    """A small decoder-only LM with grouped-query attention (4 query heads, 2 key-value
    heads); Qwen2 with its qkv biases, Qwen3 and Gemma 3 with qk-norm, Gemma 3 with a
    sliding window shorter than the texts and its scaled embeddings. Norm weights and
    biases are randomised so that every rule has something to act on."""
    import transformers as tf

    common = dict(
        vocab_size=60,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.3,
        attn_implementation="sdpa",
        pad_token_id=0,
    )
    configs = {
        "LlamaForCausalLM": lambda: tf.LlamaConfig(**common),
        "Qwen2ForCausalLM": lambda: tf.Qwen2Config(**common),
        "Qwen3ForCausalLM": lambda: tf.Qwen3Config(**common, head_dim=8),
        "Gemma3ForCausalLM": lambda: tf.Gemma3TextConfig(
            **common,
            head_dim=8,
            sliding_window=3,
            layer_types=["sliding_attention", "full_attention"],
        ),
    }
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = getattr(tf, name)(configs[name]()).eval()
        with torch.no_grad():
            for parameter_name, parameter in model.named_parameters():
                if "norm" in parameter_name:
                    parameter.add_(0.3 * torch.randn_like(parameter))
                elif parameter_name.endswith("bias"):
                    parameter.normal_(0, 0.3)
    return model


def _has_adapter(model: torch.nn.Module) -> bool:
    try:
        adapter_for(model)
    except UnsupportedModelError:
        return False
    return True


def _model(name: str) -> torch.nn.Module:
    return tiny_text_model(name) if name not in DECODERS else tiny_decoder(name)


@pytest.fixture(scope="module")
def lxt_results(tmp_path_factory):
    """LXT's relevance for every case whose model explain takes: one subprocess per rule
    set (LXT patches transformers for the whole process), both running in parallel."""
    folder = tmp_path_factory.mktemp("lxt")
    jobs: dict[str, list[tuple[str, dict]]] = {"attnlrp": [], "cp_lrp": []}
    for name, rules, _ in CASES:
        model = _model(name)
        if not _has_adapter(model):
            continue
        weights = folder / f"{name}.pt"
        torch.save(model.state_dict(), weights)
        config = {**model.config.to_diff_dict(), "model_type": model.config.model_type}
        config.pop("transformers_version", None)
        job = dict(
            model=type(model).__name__,
            config=config,
            weights=str(weights),
            texts=TEXTS,
            targets=TARGETS,
        )
        jobs[rules].append((name, job))
    processes = {}
    for rules, named in jobs.items():
        request = folder / f"{rules}.json"
        request.write_text(json.dumps(dict(rules=rules, jobs=[job for _, job in named])))
        script = Path(__file__).parent / "lxt_reference.py"
        processes[rules] = subprocess.Popen(
            [str(LXT_PYTHON), str(script), str(request)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"},
        )
    results = {}
    for rules, process in processes.items():
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, f"LXT failed on {rules}:\n{err[-3000:]}"
        for (name, _), rows in zip(jobs[rules], json.loads(out), strict=True):
            results[name, rules] = [torch.tensor(row) for row in rows]
    return results


@pytest.mark.parametrize(("name", "rules", "side"), CASES)
def test_equals_lxt_on_a_padded_batch(lxt_results, name, rules, side):
    model = _model(name)
    if not _has_adapter(model):
        pytest.skip(f"no adapter for {name} is registered yet (decoder-only LMs)")
    batch = padded_batch(TEXTS, side)
    result = Explainer(model).explain(batch, method=rules, target=TARGETS)
    for b, expected in enumerate(lxt_results[name, rules]):
        mask = batch["attention_mask"][b].bool()
        found = result.relevance[b][mask]
        scale = expected.abs().max()
        torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-4 * float(scale))
        assert (result.relevance[b][~mask] == 0).all()
