"""The language-evidence test: does the map of a language model's answer find the evidence
the answer rests on, and does the answer rest on what the map ranks first?

Each example (`AnswerExample`) is a prompt, the answer the model should give and the
positions of its evidence. The answer is explained token by token from one forward and
one batched backward (explain.generation), and its map is the sum of its tokens' maps over
the prompt. Then, per example:

- evidence recall (explain.evaluation.evidence): the expected top-k hit (k = 1, 2, 5)
  and the expected rank of the first evidence token among the prompt's tokens, with the
  readout position (the last prompt token, whose next-token prediction is the answer's
  first token) and the tokenizer's special tokens excluded;
- ERASER comprehensiveness and sufficiency (DeYoung et al., ACL 2020): of the n
  removable tokens (the prompt less its special tokens and the positions the example
  keeps: the question and the chat template), the floor(q n) most relevant are replaced
  by the replacement token (comprehensiveness = p(answer | x) - p(answer | x without
  them)), or all the others are (sufficiency = p(answer | x) - p(answer | only them)),
  for q = 1, 5, 10, 20 and 50%; AOPC is the mean over the five q. p is the whole
  answer's probability, the product over its tokens;
- the answer's log-probability as the floor(p n) most (positive order) or least
  (negative order) relevant removable tokens are replaced, p = 0.1 ... 0.9; the AUC is
  100 x the trapezoid area of its mean over x = 0 (the prompt as it is) ... 0.9, as for
  images (`perturbation_auc`). Positive: lower is better; negative: higher is better.

Tokens of equal relevance go in the order they stand in the prompt (a stable sort), as
pixels go in raster order in the image tests. Copies of a prompt that remove the same
tokens are scored once, all copies of a chunk in batched forwards.

Examples the model gets wrong (its greedy answer is not the recorded one) are explained
and scored for the recorded answer like the others, but the ranking numbers are means over
the examples it answers right: the evidence of an answer the model does not give is not
known. The table's "answered right" column says how many count; the same numbers over
the wrong ones are in the results JSON under "wrong". Examples without an evidence token
among the candidates are left out of the evidence recall only ("with evidence" counts
the rest).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from explain.errors import InputError, OptionError
from explain.evaluation.answers import (
    ANSWER_FIELDS,
    AnswerBatch,
    AnswerProtocol,
    log_probability_curve,
    over_answer,
    removal_copies,
    weighted_mean,
    weighted_terms,
)
from explain.evaluation.datasets.base import AnswerExample
from explain.evaluation.evidence import RECALL_K, recall_records
from explain.evaluation.perturbation import (
    FRACTIONS,
    perturbation_auc,
    removal_ranks,
    removed_count,
)
from explain.evaluation.protocol import Column, Field, Records, as_terms

__all__ = ["ERASER_FRACTIONS", "LanguageEvidenceTest", "removed_tokens"]

ERASER_FRACTIONS: tuple[float, ...] = (0.01, 0.05, 0.1, 0.2, 0.5)
"""The shares q of the removable tokens whose removal (comprehensiveness) or keeping
(sufficiency) ERASER's AOPC averages over."""


def removed_tokens(relevance: Tensor, removable: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The tokens each removal request takes out of each prompt, every distinct set once.

    For (B, N) `relevance` and bool `removable`, requests per example (n removable
    tokens): nothing (the prompt as it is); the floor(q n) most relevant for each q of
    ERASER_FRACTIONS (comprehensiveness); the floor(p n) most relevant for each p of
    FRACTIONS (the positive curve); all but the floor(q n) most relevant (sufficiency: the
    complement of comprehensiveness' set); the floor(p n) least relevant (the negative
    curve). Ties go in prompt order, most relevant first and least relevant first alike.

    Returns the copies' examples (M,), their removed tokens (M, N) bool, and the (B, R)
    index of each request's copy.
    """
    total = removable.sum(dim=1)
    forward = removal_ranks(relevance, removable, positive=True)
    backward = removal_ranks(relevance, removable, positive=False)
    # Sufficiency removes the most-relevant-first order from its end.
    reverse = torch.where(removable, total[:, None] - 1 - forward, forward)
    ranks = torch.stack([forward, backward, reverse])
    counts = []
    for n in total.tolist():
        counts.append(
            [0]
            + [removed_count(q, n) for q in ERASER_FRACTIONS]
            + [removed_count(p, n) for p in FRACTIONS]
            + [n - removed_count(q, n) for q in ERASER_FRACTIONS]
            + [removed_count(p, n) for p in FRACTIONS]
        )
    eraser, curve = len(ERASER_FRACTIONS), len(FRACTIONS)
    orders = torch.tensor([0] * (1 + eraser + curve) + [2] * eraser + [1] * curve)
    rows, copy_orders, copy_counts, inverse = removal_copies(torch.tensor(counts), orders, total)
    return rows, ranks[copy_orders, rows] < copy_counts[:, None], inverse


_RECALL_COLUMNS = {
    **{f"hit@{k}": Column(f"evidence hit@{k}", "higher") for k in RECALL_K},
    "rank": Column("evidence rank", "lower"),
}


class LanguageEvidenceTest(AnswerProtocol):
    """The language-evidence test of one decoder-only language model (module doc).

    Args:
        model, tokenizer, score, forward_batch: see `AnswerProtocol`.
        replacement: the token id a removed token is replaced by (stated in the tables):
            a token the model reads as carrying nothing (a filler word of its data, or
            its unknown or pad token).
    """

    name = "language-evidence"

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        replacement: int,
        *,
        score: str | None = None,
        forward_batch: int | None = None,
    ) -> None:
        super().__init__(model, tokenizer, score=score, forward_batch=forward_batch)
        if self.explainer.adapter.reads_images:
            raise OptionError(
                "the language-evidence test is for language models; a vision-language model "
                "takes the vision-language-evidence test"
            )
        vocabulary = self.explainer.model.get_input_embeddings().num_embeddings
        if isinstance(replacement, bool) or not 0 <= replacement < vocabulary:
            raise OptionError(
                f"the replacement token must be a token id in 0..{vocabulary - 1}, got "
                f"{replacement!r}"
            )
        self.replacement = int(replacement)
        self.replacement_word = str(tokenizer.convert_ids_to_tokens(self.replacement))

    columns: ClassVar[Mapping[str, Column]] = {
        "accuracy": Column("answered right"),
        **_RECALL_COLUMNS,
        "comprehensiveness": Column("comprehensiveness", "higher"),
        "sufficiency": Column("sufficiency", "lower"),
        "positive_auc": Column("positive AUC", "lower"),
        "negative_auc": Column("negative AUC", "higher"),
    }

    fields: ClassVar[Mapping[str, Field]] = {
        **ANSWER_FIELDS,
        "tokens": Field(int, low=0),
        "comprehensiveness": Field(float, -1.0, 1.0, width=len(ERASER_FRACTIONS)),
        "sufficiency": Field(float, -1.0, 1.0, width=len(ERASER_FRACTIONS)),
    }

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "replacement": self.replacement}

    def scale(self) -> str:
        return (
            "Over the examples the model answers right (the others are in the JSON under "
            '"wrong"). Evidence hit@k and rank: among the prompt\'s tokens less the readout '
            "position and special tokens, ties broken at random (expected values). Removed "
            f"tokens are replaced by token {self.replacement} ({self.replacement_word!r}); the "
            "question and the template are kept. Comprehensiveness and sufficiency: AOPC of "
            "the answer's probability over 1, 5, 10, 20, 50% of the removable tokens. AUC: "
            "100 x the area under the answer's mean log-probability (nats) from x = 0 "
            "(nothing removed) to x = 0.9."
        )

    def evaluate(self, method: str, examples: Sequence[AnswerExample], *, seed: int = 0) -> Records:
        if not all(isinstance(example, AnswerExample) for example in examples):
            raise InputError("the language-evidence test takes AnswerExample examples")
        batch = AnswerBatch.of(
            [e.input_ids for e in examples], [e.answer for e in examples], self.pad_id
        )
        width = batch.prompt_length
        explanation = self.explained(method, batch, seed)
        relevance = over_answer(explanation.relevance, batch)[:, :width]
        candidates = ~self.special(batch)
        candidates[:, width - 1] = False  # the readout position
        evidence = batch.marks([e.evidence for e in examples])
        records = recall_records(relevance, evidence, candidates)
        removable = candidates & ~batch.marks([e.kept for e in examples])
        log_probabilities, right = self._removal_scores(batch, relevance, removable)
        probabilities = log_probabilities.exp()
        first, eraser = 1, len(ERASER_FRACTIONS)
        columns = {
            name: slice(start, start + size)
            for name, start, size in (
                ("comprehensiveness", first, eraser),
                ("positive", first + eraser, len(FRACTIONS)),
                ("sufficiency", first + eraser + len(FRACTIONS), eraser),
                ("negative", first + 2 * eraser + len(FRACTIONS), len(FRACTIONS)),
            )
        }
        clean = probabilities[:, :1]
        records.update(
            right=right.int().tolist(),
            tokens=removable.sum(dim=1).tolist(),
            log_probability=log_probabilities[:, 0].tolist(),
            comprehensiveness=(clean - probabilities[:, columns["comprehensiveness"]]).tolist(),
            sufficiency=(clean - probabilities[:, columns["sufficiency"]]).tolist(),
            positive=log_probabilities[:, columns["positive"]].tolist(),
            negative=log_probabilities[:, columns["negative"]].tolist(),
        )
        return records

    def _removal_scores(
        self, batch: AnswerBatch, relevance: Tensor, removable: Tensor
    ) -> tuple[Tensor, Tensor]:
        """(B, R) log-probabilities of the answers with the tokens of each request of
        `removed_tokens` replaced, and (B,) whether the model answers each prompt right."""
        rows, removed, inverse = removed_tokens(relevance, removable)
        ids = torch.where(removed, self.replacement, batch.input_ids[rows])
        return self.copy_scores(batch, rows, inverse, input_ids=ids)

    def weighted(self, records: Records, weight: Tensor) -> dict[str, Tensor]:
        keys = ("log_probability", "comprehensiveness", "sufficiency", "positive", "negative")
        answer = {key: as_terms(records[key]) for key in keys}
        return {
            **weighted_terms(answer, weight, "counted"),
            **self.recall_terms(records, weight),
        }

    def from_sums(self, sums: Mapping[str, Tensor], count: int) -> dict[str, Tensor]:
        numbers = self.recall_numbers(sums, prefix="")
        for key in ("comprehensiveness", "sufficiency"):
            per_fraction = [
                weighted_mean(sums, f"{key}@{i}", "counted") for i in range(len(ERASER_FRACTIONS))
            ]
            numbers[key] = sum(per_fraction) / len(per_fraction)
        for order in ("positive", "negative"):
            curve = log_probability_curve(sums, order, "counted")
            numbers[f"{order}_auc"] = perturbation_auc(curve)
        return numbers

    def summarize(self, records: Records) -> dict[str, Any]:
        sums, summary = self.summary(records)
        eraser: dict[str, list[float]] = {"fractions": list(ERASER_FRACTIONS)}
        for key in ("comprehensiveness", "sufficiency"):
            eraser[key] = [
                float(weighted_mean(sums, f"{key}@{i}", "counted"))
                for i in range(len(ERASER_FRACTIONS))
            ]
        return {
            **summary,
            "with_evidence": int(sums["scored"]),
            "removable_tokens": float(as_terms(records["tokens"]).mean()),
            "eraser": eraser,
        }
