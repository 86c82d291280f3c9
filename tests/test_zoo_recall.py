"""The zoo's recall-llama: loads offline with its tokenizer, explains a next token, answers
held-out questions from their evidence, and its card states what it measures."""

from __future__ import annotations

import functools

import pytest
import torch

from explain import Explainer
from explain.data import recall
from explain.evaluation.recall_checks import answer_accuracy, evidence_checks, greedy_answers
from explain.loading import load_model
from explain.zoo import read_config, zoo_root

pytest.importorskip("transformers")

NAME = "recall-llama"


@functools.cache
def _loaded():
    return load_model(f"zoo:{NAME}")


@functools.cache
def _length() -> int:
    return read_config(zoo_root() / NAME)["task"]["length"]


def test_loads_offline_with_its_word_level_tokenizer():
    from transformers import LlamaForCausalLM

    loaded = _loaded()
    assert isinstance(loaded.model, LlamaForCausalLM) and not loaded.model.training
    assert loaded.modality == "text"
    example = recall.make_example(recall.SPLITS["heldout"][0], _length())
    assert loaded.tokenizer(example.text)["input_ids"] == list(example.input_ids)
    assert len(loaded.tokenizer) == loaded.model.config.vocab_size == len(recall.VOCABULARY)
    weights = zoo_root() / NAME / "model.safetensors"
    assert weights.stat().st_size <= 5e6


def test_explains_the_next_token_of_a_held_out_question():
    loaded = _loaded()
    example = recall.examples("heldout", 1, _length())[0]
    explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
    result = explainer.explain(example.text, method="generic")
    assert result.relevance.shape == (1, example.length)
    assert torch.isfinite(result.relevance).all()
    # what is explained is the model's next token: its greedy first answer word
    assert result.target.flatten().tolist() == [greedy_answers(loaded.model, [example])[0][0]]


def test_answers_held_out_questions_above_a_floor_no_broken_model_reaches():
    """A model that copied a random value of its context would answer 1 in 16 (the facts
    of a prompt); 0.8 leaves room for a few misses among 40 questions only."""
    examples = recall.examples("heldout", 40, _length())
    assert answer_accuracy(_loaded().model, examples) >= 0.8


def test_answers_rest_on_the_recorded_evidence():
    checks = evidence_checks(_loaded().model, recall.examples("heldout", 30, _length()))
    assert checks.count == 30
    assert checks.evidence_changes >= 0.8
    assert checks.distractors_kept >= 0.9


def test_greedy_answers_equal_step_by_step_argmax_without_the_cache():
    """The cached greedy loop against an independent one: full forwards, one token at a time."""
    model = _loaded().model
    examples = [*recall.examples("heldout", 3, 128), *recall.examples("heldout", 2, 256, hops=2)]
    expected = []
    with torch.no_grad():
        for example in examples:
            ids = list(example.input_ids)
            for _ in example.answer:
                ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            expected.append(tuple(ids[example.length :]))
    assert greedy_answers(model, examples, batch_size=2) == expected
