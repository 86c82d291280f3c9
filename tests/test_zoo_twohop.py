"""The zoo's twohop-llama: deeper than recall-llama, it loads offline with recall-llama's
tokenizer, answers held-out two-hop questions far above what a model that does not follow
the bridge can, each fact of the asked chain is needed (removing either changes the
answer, redirecting the bridge to another chain's makes the answer that chain's value,
replacing the distractors keeps it), and its registered prompts' evidence is both facts."""

from __future__ import annotations

import functools

import pytest

from explain.data import recall
from explain.evaluation.recall_answers import (
    answer_accuracy,
    chain_check,
    trained_hops,
    trained_length,
)
from explain.evaluation.zoo import answer_dataset
from explain.loading import load_model
from explain.loading.zoo import WEIGHTS, read_config, zoo_root

pytest.importorskip("transformers")

NAME = "twohop-llama"
FLOOR = 0.8
"""Held-out accuracy a model must pass on the test's sample. A model that answers the value
of a chain of its context without following the asked one's bridge is right one time in
as many chains as the prompt states (8 at 512 tokens); one that answers the value of any
fact's key, less often."""


@functools.cache
def loaded():
    return load_model(f"zoo:{NAME}", offline=True)


def test_it_is_deeper_than_recall_llama_small_and_trained_on_two_hops():
    model = loaded()
    recall_llama = read_config(zoo_root() / "recall-llama")["llama"]["num_hidden_layers"]
    assert model.model.config.num_hidden_layers > recall_llama
    assert (zoo_root() / NAME / WEIGHTS).stat().st_size <= 5e6
    assert trained_hops(model) == 2
    example = recall.make_example(recall.SPLITS["heldout"][0], trained_length(model), hops=2)
    assert model.tokenizer(example.text)["input_ids"] == list(example.input_ids)


def test_heldout_two_hop_answers_pass_the_floor():
    examples = recall.examples("heldout", 40, trained_length(loaded()), hops=2)
    assert answer_accuracy(loaded().model, examples) >= FLOOR


def test_each_fact_of_the_chain_is_needed():
    check = chain_check(loaded(), 30)
    assert check.count == 30 and check.right >= FLOOR * 30
    assert check.bridge_removed >= 0.85 and check.answer_fact_removed >= 0.85, check.table()
    assert check.bridge_redirected >= 0.7 and check.distractors_kept >= 0.85, check.table()


def test_registered_prompts_point_at_both_facts():
    dataset = answer_dataset(f"zoo:{NAME}", loaded(), 128)
    assert dataset.name == "recall-heldout-128-tokens-two-hops"
    for index in range(5):
        item = dataset[index]
        example = recall.make_example(recall.SPLITS["heldout"][index], 128, hops=2)
        assert item.input_ids == example.input_ids and item.answer == example.answer
        first, second = (example.facts[i] for i in example.asked)
        assert first.value == second.key and second.value == item.answer
        assert item.evidence == tuple(sorted((*first.positions, *second.positions)))
