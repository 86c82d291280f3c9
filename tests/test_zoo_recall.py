"""The zoo's recall-llama: it loads offline with its word-level tokenizer, answers held-out
questions far above what a model that does not find the asked fact can, its answers rest on
the facts its examples record (replacing the asked value changes them, replacing every
other fact does not), its held-out prompts are registered for `explain evaluate
language-evidence`, and the explainer explains its answers."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from explain import Explainer
from explain.cli import main
from explain.data import recall
from explain.evaluation.recall_answers import (
    answer_accuracy,
    evidence_check,
    greedy_answers,
    trained_length,
)
from explain.evaluation.zoo import answer_dataset
from explain.loading import load_model
from explain.loading.zoo import CONFIG, WEIGHTS, read_config, zoo_root

pytest.importorskip("transformers")

NAME = "recall-llama"
FLOOR = 0.9
"""Held-out accuracy a model must pass on the test's sample. A model that answers a value of
its context without finding the asked key is right one time in as many facts as the
prompt states (16 at 512 tokens); one that makes up a value, one time in 2,880."""


@functools.cache
def loaded():
    return load_model(f"zoo:{NAME}", offline=True)


def test_it_loads_offline_with_its_tokenizer_and_is_small():
    from transformers import LlamaForCausalLM

    model = loaded()
    assert isinstance(model.model, LlamaForCausalLM) and not model.model.training
    assert model.modality == "text"
    assert model.model.lm_head.weight is model.model.model.embed_tokens.weight  # tied
    folder = zoo_root() / NAME
    assert (folder / WEIGHTS).stat().st_size <= 5e6
    for name in read_config(folder)["tokenizer_files"] + [CONFIG]:
        assert (folder / name).is_file(), name
    example = recall.make_example(recall.SPLITS["heldout"][0], trained_length(model))
    assert model.tokenizer(example.text)["input_ids"] == list(example.input_ids)
    assert len(model.tokenizer) == model.model.config.vocab_size == len(recall.VOCABULARY)


def test_heldout_answers_pass_the_floor():
    examples = recall.examples("heldout", 40, trained_length(loaded()))
    assert answer_accuracy(loaded().model, examples) >= FLOOR


def test_answers_rest_on_the_recorded_evidence():
    check = evidence_check(loaded(), 30)
    assert check.count == 30 and check.right >= FLOOR * 30
    assert check.evidence_changes >= 0.85 and check.distractors_kept >= 0.9, check.table()


def test_registered_prompts_point_at_the_asked_fact():
    """The language-evidence set: the evidence is the key the question asks and the value
    the answer is; the start token and the question are kept; "the" replaces."""
    dataset = answer_dataset(f"zoo:{NAME}", loaded(), 128)
    assert len(dataset) == 1000 and recall.VOCABULARY[dataset.replacement] == "the"
    for index in range(5):
        item = dataset[index]
        question_key = item.input_ids[-recall.KEY_TOKENS :]
        assert tuple(item.input_ids[p] for p in item.evidence) == (*question_key, *item.answer)
        assert item.kept == (0, *range(len(item.input_ids) - recall.QUESTION_TOKENS, 128))
    assert (
        answer_dataset(NAME, loaded())[0].input_ids
        == recall.examples("heldout", 1, trained_length(loaded()))[0].input_ids
    )


def test_explain_evaluate_language_evidence_runs_on_it(tmp_path, capsys):
    output = tmp_path / "recall.json"
    command = ["evaluate", "language-evidence", "--model", f"zoo:{NAME}", "--length", "96",
               "--limit", "2", "--method", "generic", "--output", str(output),
               "--quiet"]  # fmt: skip
    assert main(command) == 0
    results = json.loads(output.read_text())
    assert (results["protocol"], results["n"]) == ("language-evidence", 2)
    assert "replaced by token" in results["scale"] and "('the')" in results["scale"]
    assert list(results["results"]) == ["generic"]
    assert main([*command[:4], "--length", "8", *command[6:]]) == 2
    assert "do not fit in 8 tokens" in capsys.readouterr().err


def test_evaluate_model_leaves_out_excluded_methods(tmp_path):
    from explain.errors import OptionError
    from explain.evaluation.evaluate import evaluate_model

    common = {"limit": 1, "length": 64, "progress": False}
    results = evaluate_model("language-evidence", f"zoo:{NAME}", tmp_path / "r.json",
                             methods=["generic", "occlusion", "random"], exclude=["occlusion"],
                             **common)  # fmt: skip
    assert list(results["results"]) == ["generic", "random"]
    with pytest.raises(OptionError, match="unknown methods \\['occlsion'\\]"):
        evaluate_model("language-evidence", f"zoo:{NAME}", tmp_path / "s.json",
                       exclude=["occlsion"], **common)  # fmt: skip


def test_the_next_token_of_a_heldout_question_is_explained():
    model = loaded()
    example = recall.examples("heldout", 1, 128)[0]
    explainer = Explainer(model.model, tokenizer=model.tokenizer)
    result = explainer.explain(example.text, method="generic")
    assert result.relevance.shape == (1, example.length)
    assert torch.isfinite(result.relevance).all() and result.relevance.abs().sum() > 0
    # what is explained is the model's next token: its greedy first answer word
    assert result.target.flatten().tolist() == [greedy_answers(model.model, [example])[0][0]]


@pytest.mark.parametrize("length", [40_000, 1_000_000_000])
def test_a_length_past_the_models_positions_is_refused_before_any_prompt(
    tmp_path, capsys, monkeypatch, length
):
    # Issue 46: --length past the 16,384 positions skipped every method (exit 0), and
    # --length 1e9 built a billion-token prompt before any check.
    from explain.data import recall

    def no_prompt(*args, **kwargs):
        raise AssertionError("a prompt was built")

    monkeypatch.setattr(recall, "make_example", no_prompt)
    output = tmp_path / "recall.json"
    command = ["evaluate", "language-evidence", "--model", f"zoo:{NAME}", "--length",
               str(length), "--output", str(output), "--quiet"]  # fmt: skip
    assert main(command) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "reads at most 16384 positions" in err[0]
    assert not output.exists()
