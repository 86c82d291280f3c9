"""A recall language model's answers, and checks that they rest on the recorded evidence.

For the examples of `explain.data.recall`: `greedy_answers` runs the model greedily for as
many tokens as each answer has; `answer_accuracy` is exact match of the whole answer;
`evidence_checks` asks the model again on two counterfactual contexts of each example
(`with_evidence_replaced`: the asked value replaced by a fresh one;
`with_distractors_replaced`: every other fact's key and value replaced) and counts how
often its answer changes. The zoo card of `recall-llama` quotes these numbers
(`explain.evaluation.heldout_accuracy`).

Every example counts, those the model answers wrongly included: "the answer changes"
compares the model's own answers before and after, whatever they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

import torch
from torch import nn

from explain.data import recall

__all__ = ["EvidenceChecks", "answer_accuracy", "evidence_checks", "greedy_answers"]


@dataclass(frozen=True)
class EvidenceChecks:
    """How a model's answers respond to replacing the evidence and the distractors.

    Attributes:
        count: the number of examples.
        accuracy: the answer equals the asked value (exact match of every token).
        evidence_changes: replacing the asked value changes the answer.
        evidence_followed: ... and the new answer is the replacing value.
        distractors_kept: replacing every distractor fact leaves the answer unchanged.
    """

    count: int
    accuracy: float
    evidence_changes: float
    evidence_followed: float
    distractors_kept: float


@torch.no_grad()
def greedy_answers(
    model: nn.Module, examples: Sequence[recall.RecallExample], batch_size: int = 50
) -> list[tuple[int, ...]]:
    """The model's greedy continuation of each prompt, as many tokens as its answer.

    Examples are batched by prompt length and answer length (no padding); the model's
    key/value cache carries each batch from one answer token to the next.
    """
    device = next(model.parameters()).device
    answers: dict[int, tuple[int, ...]] = {}

    def shape(index: int) -> tuple[int, int]:
        return examples[index].length, len(examples[index].answer)

    for (_, steps), group in groupby(sorted(range(len(examples)), key=shape), key=shape):
        indices = list(group)
        for start in range(0, len(indices), batch_size):
            batch = indices[start : start + batch_size]
            ids = torch.tensor([examples[i].input_ids for i in batch], device=device)
            output = model(input_ids=ids, use_cache=True)
            tokens = [output.logits[:, -1].argmax(-1)]
            for _ in range(steps - 1):
                output = model(
                    input_ids=tokens[-1][:, None],
                    past_key_values=output.past_key_values,
                    use_cache=True,
                )
                tokens.append(output.logits[:, -1].argmax(-1))
            for row, index in enumerate(torch.stack(tokens, dim=1).tolist()):
                answers[batch[row]] = tuple(index)
    return [answers[i] for i in range(len(examples))]


def answer_accuracy(
    model: nn.Module, examples: Sequence[recall.RecallExample], batch_size: int = 50
) -> float:
    """The fraction of examples whose greedy answer is exactly their answer."""
    answers = greedy_answers(model, examples, batch_size)
    return sum(a == e.answer for a, e in zip(answers, examples, strict=True)) / len(examples)


def evidence_checks(
    model: nn.Module, examples: Sequence[recall.RecallExample], batch_size: int = 50
) -> EvidenceChecks:
    """Answer each example, then its two counterfactuals (module docstring)."""
    replaced = [recall.with_evidence_replaced(e) for e in examples]
    others = [recall.with_distractors_replaced(e) for e in examples]
    answers = greedy_answers(model, [*examples, *replaced, *others], batch_size)
    count = len(examples)
    original, after_evidence, after_distractors = (
        answers[:count],
        answers[count : 2 * count],
        answers[2 * count :],
    )
    return EvidenceChecks(
        count=count,
        accuracy=sum(a == e.answer for a, e in zip(original, examples, strict=True)) / count,
        evidence_changes=sum(a != b for a, b in zip(original, after_evidence, strict=True)) / count,
        evidence_followed=sum(a == e.answer for a, e in zip(after_evidence, replaced, strict=True))
        / count,
        distractors_kept=sum(a == b for a, b in zip(original, after_distractors, strict=True))
        / count,
    )
