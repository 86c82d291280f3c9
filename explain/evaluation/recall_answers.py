"""A recall language model's answers: held-out accuracy at several lengths, and the check
that each answer rests on the evidence its example records.

For the examples of `explain.data.recall`: `greedy_answers` runs the model greedily for as
many tokens as each answer has; `answer_accuracy` is exact match of the whole answer;
`recall_accuracy` measures a model saved as a zoo folder (whose config names the length it
was trained at) at that length, `other_lengths_accuracy` at a quarter, half, 2x and 4x it.
`evidence_check` asks the model again on two counterfactual contexts of each held-out
example it answers right (the evidence of a wrong answer is not known):
`with_evidence_replaced` (the asked value replaced by a fresh one: the answer must
change) and `with_distractors_replaced` (every other fact's key and value replaced: the
answer must stay). A two-hop model (its config's task says `hops: 2`) is measured on
two-hop prompts, and `chain_check` proves that each of the chain's two facts is needed:
removing either one changes the answer, redirecting the bridge to another chain's makes
the answer that chain's value, and replacing the distractors keeps it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

import torch
from torch import nn

from explain.data import recall
from explain.loading.loaded_model import LoadedModel
from explain.loading.zoo import CONFIG, read_config, zoo_root
from explain.loading.zoo_config import require

__all__ = [
    "ChainCheck",
    "EvidenceCheck",
    "answer_accuracy",
    "chain_check",
    "evidence_check",
    "greedy_answers",
    "other_lengths_accuracy",
    "recall_accuracy",
    "trained_hops",
    "trained_length",
]


def _task(loaded: LoadedModel) -> dict:
    """The task of a zoo recall model's config (its `length` and `hops` checked when read)."""
    folder = zoo_root() / loaded.name.removeprefix("zoo:")
    config = read_config(folder)
    require(config, folder / CONFIG, ["task"])
    return config["task"]


def trained_length(loaded: LoadedModel) -> int:
    """The prompt length in tokens a zoo recall model was trained at (its config's task)."""
    return int(_task(loaded)["length"])


def trained_hops(loaded: LoadedModel) -> int:
    """The hops of the questions a zoo recall model was trained on (1 unless its config's
    task says otherwise)."""
    return int(_task(loaded).get("hops", 1))


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
                    cache=output.cache,
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


def recall_accuracy(loaded: LoadedModel, count: int) -> tuple[float, dict[str, float]]:
    """Greedy exact match of the whole answer on the first `count` held-out prompts of the
    trained length (no details: `other_lengths_accuracy` measures those)."""
    length, hops = trained_length(loaded), trained_hops(loaded)
    examples = recall.examples("heldout", count, length, hops=hops)
    return answer_accuracy(loaded.model, examples), {}


def other_lengths_accuracy(loaded: LoadedModel, count: int) -> dict[str, float]:
    """`recall_accuracy`'s measure at a quarter, half, 2x and 4x the trained length, on
    the first `count` held-out prompts of each (4x costs about 8 times the headline)."""
    length, hops = trained_length(loaded), trained_hops(loaded)
    details = {}
    for factor in (0.25, 0.5, 2, 4):
        tokens = int(factor * length)
        details[
            f"{factor:g}x the trained length ({tokens} tokens, "
            f"{recall.default_facts(tokens)} facts)"
        ] = answer_accuracy(loaded.model, recall.examples("heldout", count, tokens, hops=hops))
    return details


def _answered_right(
    model: nn.Module, count: int, length: int, hops: int
) -> list[recall.RecallExample]:
    """The first `count` held-out prompts of `length` tokens that `model` answers right."""
    examples = recall.examples("heldout", count, length, hops=hops)
    answers = greedy_answers(model, examples)
    right = [e for a, e in zip(answers, examples, strict=True) if a == e.answer]
    if not right:
        raise ValueError(f"the model answers none of the {count} held-out prompts right")
    return right


def _check_table(count: int, length: int, right: int, shares: dict[str, float]) -> str:
    """A check's markdown table: one row; each cell a share of the right answers, and how many."""
    return "\n".join(
        [
            "| prompts | answered right | " + " | ".join(shares) + " |",
            "|---" * (2 + len(shares)) + "|",
            f"| {count} of {length} tokens | {right} | "
            + " | ".join(f"{100 * share:.1f}% ({right})" for share in shares.values())
            + " |",
        ]
    )


@dataclass(frozen=True)
class EvidenceCheck:
    """How a model's right answers respond to replacing the evidence and the distractors.

    Attributes:
        count: held-out examples looked at.
        length: their length in tokens.
        right: how many of them the model answers right (the checks count over these).
        evidence_changes: replacing the asked value changes the answer.
        evidence_followed: ... and the new answer is the replacing value.
        distractors_kept: replacing every distractor fact leaves the answer unchanged.
    """

    count: int
    length: int
    right: int
    evidence_changes: float
    evidence_followed: float
    distractors_kept: float

    def table(self) -> str:
        """A markdown table: one row; each cell a share of the right answers, and how many."""
        return _check_table(
            self.count,
            self.length,
            self.right,
            {
                "asked value replaced: the answer changes": self.evidence_changes,
                "... to the new value": self.evidence_followed,
                "every distractor fact replaced: the answer stays": self.distractors_kept,
            },
        )


def evidence_check(loaded: LoadedModel, count: int, length: int | None = None) -> EvidenceCheck:
    """Answer the first `count` held-out prompts of `length` tokens (default: the trained
    length), then the two counterfactuals of each one answered right (module docstring)."""
    length = trained_length(loaded) if length is None else length
    model = loaded.model
    right = _answered_right(model, count, length, trained_hops(loaded))
    replaced = [recall.with_evidence_replaced(e) for e in right]
    after = greedy_answers(model, [*replaced, *map(recall.with_distractors_replaced, right)])
    after_evidence, after_distractors = after[: len(right)], after[len(right) :]
    return EvidenceCheck(
        count=count,
        length=length,
        right=len(right),
        evidence_changes=sum(a != e.answer for a, e in zip(after_evidence, right, strict=True))
        / len(right),
        evidence_followed=sum(a == e.answer for a, e in zip(after_evidence, replaced, strict=True))
        / len(right),
        distractors_kept=sum(a == e.answer for a, e in zip(after_distractors, right, strict=True))
        / len(right),
    )


@dataclass(frozen=True)
class ChainCheck:
    """How a two-hop model's right answers respond to removing or changing each fact of
    the asked chain `a b .` `b c .`, and to replacing the distractors.

    Attributes:
        count: held-out examples looked at.
        length: their length in tokens.
        right: how many of them the model answers right (the checks count over these).
        bridge_removed: removing `a b` (read as filler) changes the answer.
        answer_fact_removed: removing `b c` changes the answer.
        bridge_redirected: `a b` made `a b2` (another chain's bridge): the answer is that
            chain's value c2.
        value_replaced: `b c`'s value replaced by a fresh one: the answer is the new value.
        distractors_kept: replacing every other fact leaves the answer unchanged.
    """

    count: int
    length: int
    right: int
    bridge_removed: float
    answer_fact_removed: float
    bridge_redirected: float
    value_replaced: float
    distractors_kept: float

    def table(self) -> str:
        """A markdown table: one row; each cell a share of the right answers, and how many."""
        return _check_table(
            self.count,
            self.length,
            self.right,
            {
                "`a b` removed: the answer changes": self.bridge_removed,
                "`b c` removed: the answer changes": self.answer_fact_removed,
                "`a b` made `a b2`: the answer is c2": self.bridge_redirected,
                "c replaced: the answer is the new value": self.value_replaced,
                "every distractor fact replaced: the answer stays": self.distractors_kept,
            },
        )


def chain_check(loaded: LoadedModel, count: int, length: int | None = None) -> ChainCheck:
    """Answer the first `count` two-hop held-out prompts of `length` tokens (default: the
    trained length), then the five counterfactuals of each one answered right (ChainCheck)."""
    length = trained_length(loaded) if length is None else length
    right = _answered_right(loaded.model, count, length, hops=2)
    first = [recall.without_fact(e, e.asked[0]) for e in right]
    second = [recall.without_fact(e, e.asked[1]) for e in right]
    redirected = [recall.with_bridge_redirected(e) for e in right]
    replaced = [recall.with_evidence_replaced(e) for e in right]
    kept = [recall.with_distractors_replaced(e) for e in right]
    edits = [first, second, redirected, replaced, kept]
    answers = greedy_answers(loaded.model, [e for edit in edits for e in edit])
    n = len(right)
    after = [answers[i * n : (i + 1) * n] for i in range(len(edits))]

    def share(got: list, wanted: list[recall.RecallExample], same: bool) -> float:
        return sum((a == e.answer) == same for a, e in zip(got, wanted, strict=True)) / n

    return ChainCheck(
        count=count,
        length=length,
        right=n,
        bridge_removed=share(after[0], right, same=False),
        answer_fact_removed=share(after[1], right, same=False),
        bridge_redirected=share(after[2], redirected, same=True),
        value_replaced=share(after[3], replaced, same=True),
        distractors_kept=share(after[4], right, same=True),
    )
