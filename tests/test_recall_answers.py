"""explain.evaluation.recall_answers on a small random Llama over the recall vocabulary,
saved as a zoo folder: the cached greedy answers equal a plain argmax loop, accuracy counts
exact matches of the whole answer, and the evidence check refuses a model with no right
answer and tabulates its shares. The two-hop chain check runs on hand-written models whose
route is known: one that follows the chain (every check passes), one that skips the
bridge (it reads the answer fact by position) and one that ignores the context."""

from __future__ import annotations

import functools
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from explain.data import recall
from explain.evaluation.recall_answers import (
    ChainCheck,
    EvidenceCheck,
    answer_accuracy,
    chain_check,
    evidence_check,
    greedy_answers,
    other_lengths_accuracy,
    recall_accuracy,
    trained_length,
)

pytest.importorskip("transformers")

LENGTH = 64


@functools.cache
def loaded():
    """A 2-block Llama of width 32 (random weights) saved and loaded as a zoo folder whose
    task says it was trained at LENGTH tokens."""
    import tempfile
    from pathlib import Path

    from explain.loading.zoo import build_model, load_zoo_folder, save_zoo_model

    tokenizer = recall.build_tokenizer()
    config = {
        "builder": "hf_llama",
        "modality": "text",
        "classes": None,
        "llama": {
            "vocab_size": len(recall.VOCABULARY),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "max_position_embeddings": 8 * LENGTH,
            "tie_word_embeddings": True,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        "task": {"data": "explain.data.recall", "length": LENGTH},
        "tokenizer_files": ["tokenizer.json", "tokenizer_config.json"],
    }
    torch.manual_seed(0)
    folder = Path(tempfile.mkdtemp()) / "recall"
    tokenizer.save_pretrained(folder)
    save_zoo_model(folder, build_model(config).eval(), config, trained=["model."])
    return load_zoo_folder(folder)


def test_a_zoo_folder_says_its_trained_length_and_reads_the_prompts():
    model = loaded()
    assert trained_length(model) == LENGTH
    example = recall.examples("heldout", 1, LENGTH)[0]
    assert model.tokenizer(example.text)["input_ids"] == list(example.input_ids)


def test_greedy_answers_equal_step_by_step_argmax_without_the_cache():
    """The cached, batched greedy loop against an independent one: a full forward per
    token, one prompt at a time (prompts of two lengths, batched by length)."""
    model = loaded().model
    examples = [*recall.examples("heldout", 3, 64), *recall.examples("heldout", 2, 96)]
    expected = []
    with torch.no_grad():
        for example in examples:
            ids = list(example.input_ids)
            for _ in example.answer:
                ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            expected.append(tuple(ids[example.length :]))
    assert greedy_answers(model, examples, batch_size=2) == expected


def test_accuracy_is_exact_match_of_the_whole_answer():
    model = loaded().model
    examples = recall.examples("heldout", 4, LENGTH)
    said = greedy_answers(model, examples)
    # examples whose answer is what the model says, half of them with one word changed
    answers = [said[0], (said[1][0], -1), said[2], (-1, said[3][1])]
    ones = [replace(e, answer=a) for e, a in zip(examples, answers, strict=True)]
    assert answer_accuracy(model, ones) == 0.5
    accuracy, details = recall_accuracy(loaded(), 3)
    assert 0 <= accuracy <= 1 and details == {}
    details = other_lengths_accuracy(loaded(), 3)
    assert list(details) == [
        "0.25x the trained length (16 tokens, 2 facts)",
        "0.5x the trained length (32 tokens, 2 facts)",
        "2x the trained length (128 tokens, 4 facts)",
        "4x the trained length (256 tokens, 8 facts)",
    ]
    assert all(0 <= share <= 1 for share in details.values())


def test_the_evidence_check_needs_right_answers_and_tabulates_its_shares():
    with pytest.raises(ValueError, match="answers none of the 3 held-out prompts right"):
        evidence_check(loaded(), 3)
    table = EvidenceCheck(10, 512, 8, 1.0, 0.875, 0.75).table()
    assert table.splitlines()[-1] == (
        "| 10 of 512 tokens | 8 | 100.0% (8) | 87.5% (8) | 75.0% (8) |"
    )


END, ASK_TWO_HOPS = (recall.VOCABULARY.index(word) for word in (".", "??"))


class Reader(torch.nn.Module):
    """A hand-written two-hop answerer with greedy_answers' interface (a `cache` of the
    ids so far). `route` says how it finds the answer of `?? a`: "chain" follows `a b .`
    then `b c .`; "last fact" answers the value of the context's last fact whose key is
    not a (no bridge read); "constant" always answers the first value words."""

    def __init__(self, route: str):
        super().__init__()
        self.route = route
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # the device greedy_answers reads

    def _answer(self, ids: list[int]) -> list[int]:
        ask = len(ids) - 1 - ids[::-1].index(ASK_TWO_HOPS)
        context, key = ids[:ask], tuple(ids[ask + 1 : ask + 3])
        facts = {
            tuple(context[i : i + 2]): tuple(context[i + 2 : i + 4])
            for i in range(len(context) - 4)
            if context[i + 4] == END
        }
        if self.route == "constant":
            return [recall.VOCABULARY.index(recall.NUMBERS[0])] * 2
        if self.route == "last fact":
            return list([value for k, value in facts.items() if k != key][-1])
        bridge = facts.get(key)
        return list(facts.get(bridge, (0, 0)))  # <pad> when the chain is broken

    def forward(self, input_ids, cache=None, use_cache=False):
        ids = input_ids if cache is None else torch.cat([cache, input_ids], 1)
        logits = torch.zeros(*ids.shape, len(recall.VOCABULARY))
        for row, sequence in enumerate(ids.tolist()):
            ask = len(sequence) - 1 - sequence[::-1].index(ASK_TWO_HOPS)
            said = len(sequence) - (ask + 3)  # answer tokens already generated
            logits[row, -1, self._answer(sequence)[said]] = 1.0
        return SimpleNamespace(logits=logits, cache=ids)


def test_the_chain_check_passes_a_model_that_follows_the_chain():
    check = chain_check(SimpleNamespace(model=Reader("chain")), 12, length=128)
    assert check == ChainCheck(12, 128, 12, 1.0, 1.0, 1.0, 1.0, 1.0)
    assert check.table().splitlines()[-1] == (
        "| 12 of 128 tokens | 12 | " + " | ".join(["100.0% (12)"] * 5) + " |"
    )


def test_the_chain_check_catches_a_model_that_skips_the_bridge():
    examples = recall.examples("heldout", 40, 128, hops=2)
    reader = Reader("last fact")
    right = [
        e for e, a in zip(examples, greedy_answers(reader, examples), strict=True) if a == e.answer
    ]
    assert right  # it is right when the answer fact happens to be the last
    check = chain_check(SimpleNamespace(model=reader), 40, length=128)
    assert check.right == len(right)
    assert check.bridge_removed == 0.0  # it never read `a b`
    assert check.bridge_redirected == 0.0  # so redirecting it does not move the answer
    assert check.answer_fact_removed == 1.0 and check.value_replaced == 1.0


def test_the_chain_check_needs_right_answers():
    with pytest.raises(ValueError, match="answers none of the 5 held-out prompts right"):
        chain_check(SimpleNamespace(model=Reader("constant")), 5, length=128)
