"""The rationale test for text (ERASER-style token F1, as in Chefer et al.'s BERT results).

A word's score is the maximum relevance over its sub-word tokens (special tokens
excluded). The k highest-scoring words are the predicted rationale, for k = 5, 10, ...,
80 (all scored words when a text has fewer than k); token-level precision, recall and F1
against the human (or known) rationale are computed per instance and averaged over
instances.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from explain.errors import InputError, OptionError
from explain.evaluation.datasets.base import TextExample
from explain.evaluation.protocol import Column, EvaluationProtocol, Field, Records, method_options

__all__ = ["TOP_K", "RationaleTest", "rationale_scores", "word_scores"]

TOP_K: tuple[int, ...] = tuple(range(5, 85, 5))

_RANKED_K = (5, 10, 20, 40, 80)
"""The k whose token F1 the tables show and rank by."""


def word_scores(token_relevance: Tensor, word_ids: Sequence[int | None], num_words: int) -> Tensor:
    """(num_words,) max relevance over each word's tokens; -inf for words with no token
    (cut off by truncation), which therefore never enter a predicted rationale.

    `word_ids[t]` is the word of token t, None for special and padding tokens (a fast
    tokenizer's `BatchEncoding.word_ids(b)`).
    """
    scores = torch.full((num_words,), float("-inf"), dtype=torch.float64)
    for token, word in enumerate(word_ids):
        if word is not None:
            scores[word] = max(scores[word], float(token_relevance[token]))
    return scores


def rationale_scores(
    scores: Tensor, rationale: Sequence[bool], ks: Sequence[int] = TOP_K
) -> dict[str, list[float]]:
    """Precision, recall and F1 of the top-k words of `scores` for every k in `ks`.

    Ties go to the earlier word. Raises InputError for an instance without rationale
    words, whose recall is undefined.
    """
    truth = torch.tensor(list(rationale), dtype=torch.bool)
    relevant = int(truth.sum())
    if relevant == 0:
        raise InputError("an instance without rationale words cannot be scored")
    scored = int(torch.isfinite(scores).sum())
    ranking = torch.sort(scores, descending=True, stable=True).indices
    precision, recall, f1 = [], [], []
    for k in ks:
        chosen = ranking[: min(k, scored)]
        hits = int(truth[chosen].sum())
        p = hits / len(chosen) if len(chosen) else 0.0
        r = hits / relevant
        precision.append(p)
        recall.append(r)
        f1.append(2 * p * r / (p + r) if p + r > 0 else 0.0)
    return {"precision": precision, "recall": recall, "f1": f1}


class RationaleTest(EvaluationProtocol):
    """The rationale test of one text classifier.

    Args:
        model: a supported text model; left exactly as it was found.
        tokenizer: its fast tokenizer (word ids map tokens back to words).
        max_length: longest tokenised text; later words are unscored.
        target: explain the "predicted" class or the "label".
    """

    name = "rationale"

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        max_length: int = 512,
        target: Literal["predicted", "label"] = "predicted",
    ) -> None:
        from explain.api import Explainer

        if target not in ("predicted", "label"):
            raise OptionError(f"target must be 'predicted' or 'label', got {target!r}")
        if not getattr(tokenizer, "is_fast", False):
            raise OptionError("the rationale test needs a fast tokenizer (it maps tokens to words)")
        self.explainer = Explainer(model, tokenizer=tokenizer)
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.target = target

    columns: ClassVar[Mapping[str, Column]] = {
        "accuracy": Column("accuracy"),
        **{f"token_f1@{k}": Column(f"token F1 @{k}", "higher") for k in _RANKED_K},
    }

    fields: ClassVar[Mapping[str, Field]] = {
        "label": Field(int, low=0),
        "predicted": Field(int, low=0),
        **{key: Field(float, 0.0, 1.0, width=len(TOP_K)) for key in ("precision", "recall", "f1")},
    }

    def settings(self) -> dict[str, Any]:
        return {"max_length": self.max_length, "target": self.target}

    def evaluate(self, method: str, examples: Sequence[TextExample], *, seed: int = 0) -> Records:
        encoding = self.tokenizer(
            [list(example.words) for example in examples],
            is_split_into_words=True,
            truncation=True,
            max_length=self.max_length,
            padding=True,
            return_tensors="pt",
        )
        labels = torch.tensor([example.label for example in examples], dtype=torch.long)
        device = self.explainer.adapter.parameter.device
        # Single-text inputs: the token types are all 0, the models' default.
        inputs = {key: encoding[key].to(device) for key in ("input_ids", "attention_mask")}
        target = None if self.target == "predicted" else labels.to(device)
        explanation = self.explainer.explain(
            inputs, target=target, method=method, **method_options(method, seed)
        )
        relevance = explanation.relevance.detach().cpu()
        predicted = explanation.logits.argmax(dim=-1).cpu()
        records: Records = {
            "label": labels.tolist(),
            "predicted": predicted.tolist(),
            "precision": [],
            "recall": [],
            "f1": [],
        }
        for b, example in enumerate(examples):
            scores = word_scores(relevance[b], encoding.word_ids(b), len(example.words))
            for key, values in rationale_scores(scores, example.rationale).items():
                records[key].append(values)
        return records

    def terms(self, records: Records) -> dict[str, Tensor]:
        f1 = torch.tensor(records["f1"], dtype=torch.float64).reshape(-1, len(TOP_K))
        return {f"token_f1@{k}": f1[:, i] for i, k in enumerate(TOP_K) if k in _RANKED_K}

    def from_sums(self, sums: Mapping[str, Tensor], count: int) -> dict[str, Tensor]:
        return {key: total / count for key, total in sums.items()}

    def summarize(self, records: Records) -> dict[str, Any]:
        count = len(records["f1"])
        summary: dict[str, Any] = {
            "accuracy": sum(
                int(p == t) for p, t in zip(records["predicted"], records["label"], strict=True)
            )
            / count
        }
        for key, name in (
            ("f1", "token_f1"),
            ("precision", "token_precision"),
            ("recall", "token_recall"),
        ):
            summary[name] = {
                str(k): sum(row[i] for row in records[key]) / count for i, k in enumerate(TOP_K)
            }
        return {**summary, **self.totals(*self.summed(records))}
