"""explain.evaluation.recall_answers on a small random Llama over the recall vocabulary,
saved as a zoo folder: the cached greedy answers equal a plain argmax loop, accuracy counts
exact matches of the whole answer, and the evidence check refuses a model with no right
answer and tabulates its shares."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch

from explain.data import recall
from explain.evaluation.recall_answers import (
    EvidenceCheck,
    answer_accuracy,
    evidence_check,
    greedy_answers,
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
        "family": "hf_llama",
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
    assert 0 <= accuracy <= 1
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
