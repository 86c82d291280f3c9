"""Prompts with the answers a generative model should give, as one batch: the answers'
log-probabilities under the model for many copies of the prompts at once, and the
explanation of every answer token (what the language- and vision-language-evidence tests
share).

An answer of G tokens is scored teacher-forced: its log-probability is the sum over its
tokens of log p(token | prompt, the answer's tokens before it), from ONE forward over
prompt + answer, and the model answers it (is "right") when each answer token is the
model's most likely next token there, i.e. when greedy decoding writes exactly that
answer. Prompts are padded on the left (as generation pads), answers on the right.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from explain.api import Explainer
from explain.architectures import Adapter
from explain.engine import Session, require_causal_lm
from explain.errors import OptionError
from explain.evaluation.evidence import RECALL_K
from explain.evaluation.perturbation import FRACTIONS
from explain.evaluation.protocol import (
    EvaluationProtocol,
    Field,
    Records,
    as_terms,
    method_options,
)
from explain.generation import Generation, GenerationExplanation, explain_generation

__all__ = [
    "ANSWER_FIELDS",
    "AnswerBatch",
    "AnswerProtocol",
    "answer_scores",
    "explain_answers",
    "forward_batch_size",
    "log_probability_curve",
    "over_answer",
    "removal_copies",
    "weighted_mean",
    "weighted_terms",
]


ANSWER_FIELDS: Mapping[str, Field] = {
    "right": Field(int, 0, 1),
    "log_probability": Field(float, high=0.0),
    "positive": Field(float, high=0.0, width=len(FRACTIONS)),
    "negative": Field(float, high=0.0, width=len(FRACTIONS)),
    "evidence": Field(int, 0, 1),
    "hits": Field(float, 0.0, 1.0, width=len(RECALL_K)),
    "rank": Field(float, low=0.0),
}
"""The records both tests write per example: answered right, the answer's log-probability
as it is and along both removal orders, and the evidence recall (`recall_records`)."""


def forward_batch_size(forward_batch: int | None, default: int) -> int:
    """`forward_batch` checked (a positive number), or `default` when None."""
    if forward_batch is None:
        return default
    if isinstance(forward_batch, bool) or not isinstance(forward_batch, int) or forward_batch < 1:
        raise OptionError(f"forward_batch must be a positive number, got {forward_batch!r}")
    return forward_batch


@dataclass(frozen=True)
class AnswerBatch:
    """A chunk of prompts (left-padded to P tokens) with their answers (right-padded to G).

    Attributes:
        input_ids, attention_mask: (B, P) the prompts.
        answer, answer_mask: (B, G) the answers' tokens and which are real.
        padding: (B,) how many pads precede each prompt: its position p is p + padding.
        extra: the model's other per-prompt inputs (a vision-language model's
            `pixel_values` (B, 3, H, W), and `token_type_ids` (B, P) where it takes them).
    """

    input_ids: Tensor
    attention_mask: Tensor
    answer: Tensor
    answer_mask: Tensor
    padding: Tensor
    extra: Mapping[str, Tensor] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        prompts: Sequence[Sequence[int]],
        answers: Sequence[Sequence[int]],
        pad_id: int,
        *,
        token_types: Sequence[Sequence[int]] | None = None,
        pixel_values: Tensor | None = None,
    ) -> AnswerBatch:
        """The batch of `prompts` and `answers` (token ids), padded with `pad_id`; token
        types are padded with 0."""
        width = max(len(prompt) for prompt in prompts)
        answer_width = max(len(answer) for answer in answers)
        padding = torch.tensor([width - len(prompt) for prompt in prompts])
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        answer = torch.full((len(prompts), answer_width), pad_id, dtype=torch.long)
        answer_mask = torch.zeros(len(prompts), answer_width, dtype=torch.long)
        extra: dict[str, Tensor] = {}
        if token_types is not None:
            extra["token_type_ids"] = torch.zeros(len(prompts), width, dtype=torch.long)
        for b, (prompt, tokens) in enumerate(zip(prompts, answers, strict=True)):
            start = int(padding[b])
            ids[b, start:] = torch.tensor(list(prompt))
            mask[b, start:] = 1
            answer[b, : len(tokens)] = torch.tensor(list(tokens))
            answer_mask[b, : len(tokens)] = 1
            if token_types is not None:
                extra["token_type_ids"][b, start:] = torch.tensor(list(token_types[b]))
        if pixel_values is not None:
            extra["pixel_values"] = pixel_values
        return cls(ids, mask, answer, answer_mask, padding, extra)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def prompt_length(self) -> int:
        """P, the padded width of the prompts."""
        return self.input_ids.shape[1]

    def marks(self, positions: Sequence[Sequence[int]]) -> Tensor:
        """(B, P) bool: True at each prompt's given positions (counted in the unpadded
        prompt)."""
        marked = torch.zeros(self.input_ids.shape, dtype=torch.bool)
        for b, chosen in enumerate(positions):
            if chosen:
                marked[b, torch.tensor(list(chosen)) + int(self.padding[b])] = True
        return marked

    def generation(self, adapter: Adapter) -> Generation:
        """The prompts followed by their answers, to be explained token by token."""
        extra = dict(self.extra)
        if adapter.reads_images:  # token types run along the answer too
            extra = adapter.continued(extra, self.answer.shape[1])  # type: ignore[attr-defined]
        return Generation(
            input_ids=torch.cat([self.input_ids, self.answer], dim=1),
            attention_mask=torch.cat([self.attention_mask, self.answer_mask], dim=1),
            prompt_length=self.prompt_length,
            extra=extra,
        )


def answer_scores(
    adapter: Adapter,
    batch: AnswerBatch,
    rows: Tensor,
    *,
    input_ids: Tensor | None = None,
    pixel_values: Tensor | None = None,
    forward_batch: int,
) -> tuple[Tensor, Tensor]:
    """The answers' log-probabilities for M copies of the batch's prompts, `forward_batch`
    copies per forward pass: copy m is prompt `rows[m]` with its answer, read with
    `input_ids[m]` (M, P) and `pixel_values[m]` where given (the prompt's own otherwise).

    Returns (M,) float64 log-probabilities and (M,) bool: whether each copy's greedy
    answer is the answer. The forwards run on the model's fused attention path where it
    has one (the same numbers as its explicit path, faster at long contexts), in a
    session that leaves the model as it was.
    """
    device = adapter.parameter.device
    scores, right = [], []
    with Session(adapter, fused=adapter.fused_path()):
        for start in range(0, len(rows), forward_batch):
            piece = slice(start, start + forward_batch)
            chosen = rows[piece]
            ids = batch.input_ids[chosen] if input_ids is None else input_ids[piece]
            extra = {name: value[chosen] for name, value in batch.extra.items()}
            if pixel_values is not None:
                extra["pixel_values"] = pixel_values[piece]
            copies = AnswerBatch(
                ids,
                batch.attention_mask[chosen],
                batch.answer[chosen],
                batch.answer_mask[chosen],
                batch.padding[chosen],
                extra,
            ).generation(adapter)
            inputs = {name: value.to(device) for name, value in copies.inputs().items()}
            prepared = adapter.prepare(inputs)
            width = batch.prompt_length
            stop = width + batch.answer.shape[1] - 1
            logits = adapter.logits_at(prepared, slice(width - 1, stop))  # type: ignore[attr-defined]
            logits = logits.detach().double().cpu()
            answer, real = batch.answer[chosen], batch.answer_mask[chosen].bool()
            tokens = logits.log_softmax(dim=-1).gather(2, answer[..., None])[..., 0]
            scores.append(torch.where(real, tokens, 0.0).sum(dim=1))
            right.append(((logits.argmax(dim=-1) == answer) | ~real).all(dim=1))
    return torch.cat(scores), torch.cat(right)


def explain_answers(
    explainer: Explainer,
    batch: AnswerBatch,
    method: str,
    score: Any,
    options: Mapping[str, Any],
) -> GenerationExplanation:
    """Every answer token of the batch explained over the prompt and the answer's tokens
    before it (explain.generation), in one forward and one batched backward."""
    return explain_generation(
        explainer, batch.generation(explainer.adapter), method=method, score=score, **options
    )


def removal_copies(
    counts: Tensor, orders: Tensor, totals: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The distinct copies that removal requests ask for, each once.

    Request (b, r) removes the first `counts[b, r]` of example b's `totals[b]` removable
    elements in its order number `orders[r]` (the caller's: most relevant first, least
    relevant first, ...). Removing none or all of them is the same copy in every order
    (order 0). Returns the copies' examples, orders and counts, each (M,), and the (B, R)
    index of each request's copy.
    """
    base, kinds = int(counts.max()) + 1, int(orders.max()) + 1
    order = torch.where((counts > 0) & (counts < totals[:, None]), orders[None], 0)
    rows = torch.arange(len(counts))[:, None].expand_as(counts)
    codes = ((rows * kinds + order) * base + counts).flatten()
    unique, inverse = torch.unique(codes, return_inverse=True)
    return (
        unique // base // kinds,
        (unique // base) % kinds,
        unique % base,
        inverse.view(counts.shape),
    )


def over_answer(relevance: Tensor, batch: AnswerBatch) -> Tensor:
    """(B, G, ...) relevance, one map per answer token -> (B, ...) float64 on the CPU: the
    relevance for the whole answer, the sum of its real tokens' maps."""
    maps = relevance.detach().double().cpu()
    weights = batch.answer_mask.double().reshape(*batch.answer_mask.shape, *[1] * (maps.dim() - 2))
    return (maps * weights).sum(dim=1)


def weighted_terms(
    values: Mapping[str, Tensor], weight: Tensor, weight_name: str
) -> dict[str, Tensor]:
    """The terms (see `EvaluationProtocol.terms`) of the means of per-example values over
    the examples of 0/1 `weight`: each (n,) value, or each column of an (n, K) value as
    NAME@k, times the weight, and the weight itself as `weight_name`."""
    terms = {weight_name: weight}
    for name, value in values.items():
        if value.dim() == 1:
            terms[name] = value * weight
        else:
            terms.update({f"{name}@{k}": value[:, k] * weight for k in range(value.shape[1])})
    return terms


def weighted_mean(sums: Mapping[str, Tensor], name: str, weight_name: str) -> Tensor:
    """A mean that `weighted_terms` sums, from the totals; NaN where no example counts."""
    count = sums[weight_name]
    return torch.where(count > 0, sums[name] / count.clamp(min=1), torch.nan)


class AnswerProtocol(EvaluationProtocol):
    """Shared by the language- and vision-language-evidence tests: the model with its
    tokenizer (or processor), how answers are explained and scored, and the rule that the
    ranking numbers count the examples the model answers right.

    Args:
        model: a decoder-only language model or a vision-language model; left exactly as
            it was found.
        tokenizer: its tokenizer (a vision-language model's processor): its special
            tokens are never ranked, its pad token pads the chunks.
        score: what the methods that differentiate a score differentiate for each answer
            token (see `Explainer.explain`); None: the method's default, the logit.
        forward_batch: most input copies per forward pass when scoring answers (default
            32).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        score: str | None = None,
        forward_batch: int | None = None,
    ) -> None:
        self.explainer = Explainer(model, tokenizer=tokenizer)
        require_causal_lm(self.explainer.adapter)
        text = getattr(tokenizer, "tokenizer", tokenizer)  # a processor holds its tokenizer
        pad = text.pad_token_id if text.pad_token_id is not None else text.eos_token_id
        if pad is None:
            raise OptionError("the tokenizer has neither a pad nor an end token to pad with")
        self.pad_id = int(pad)
        self.special_ids = torch.tensor(sorted(set(text.all_special_ids)), dtype=torch.long)
        self.score = score
        self.forward_batch = forward_batch_size(forward_batch, 32)

    def settings(self) -> dict[str, Any]:
        return {"score": self.score}

    def explained(self, method: str, batch: AnswerBatch, seed: int, **options: Any) -> Any:
        """The explanation of every answer token of `batch` (its `explanation`)."""
        options = {**options, **method_options(method, seed)}
        return explain_answers(self.explainer, batch, method, self.score, options).explanation

    def special(self, batch: AnswerBatch) -> Tensor:
        """(B, P) bool: the prompts' special tokens and padding."""
        return torch.isin(batch.input_ids, self.special_ids) | ~batch.attention_mask.bool()

    def copy_scores(
        self, batch: AnswerBatch, rows: Tensor, inverse: Tensor, **copies: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The (B, R) log-probabilities of the answers of `removal_copies`' requests, from
        its distinct copies (their `rows`, and their `input_ids` or `pixel_values`), and
        (B,) whether the model answers each prompt right (request 0: the prompt as it is)."""
        scores, right = answer_scores(
            self.explainer.adapter, batch, rows, forward_batch=self.forward_batch, **copies
        )
        return scores[inverse], right[inverse[:, 0]]

    @abstractmethod
    def weighted(self, records: Records, weight: Tensor) -> dict[str, Tensor]:
        """`terms` of the means over the examples of 0/1 `weight` (the right ones, or the
        wrong ones for the JSON's "wrong")."""

    def terms(self, records: Records) -> dict[str, Tensor]:
        return self.weighted(records, as_terms(records["right"]))

    @staticmethod
    def recall_terms(records: Records, weight: Tensor) -> dict[str, Tensor]:
        """The evidence recall's terms over the examples of `weight` that have evidence."""
        recall = {"hits": as_terms(records["hits"]), "rank": as_terms(records["rank"])}
        return weighted_terms(recall, weight * as_terms(records["evidence"]), "scored")

    @staticmethod
    def recall_numbers(sums: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
        """PREFIXhit@k and PREFIXrank from the sums of `recall_terms`."""
        numbers = {
            f"{prefix}hit@{k}": weighted_mean(sums, f"hits@{i}", "scored")
            for i, k in enumerate(RECALL_K)
        }
        return {**numbers, f"{prefix}rank": weighted_mean(sums, "rank", "scored")}

    def summary(self, records: Records) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """The sums over the right examples, and the summary both tests share: the share
        answered right, the ranking numbers, the same numbers over the wrong ones, and
        the mean log-probability curves."""
        right = as_terms(records["right"])
        sums = {key: value.sum() for key, value in self.weighted(records, right).items()}
        wrong = {key: value.sum() for key, value in self.weighted(records, 1.0 - right).items()}
        curves: dict[str, list[float]] = {"fractions": [0.0, *FRACTIONS]}
        for order in ("positive", "negative"):
            curves[order] = [float(v) for v in log_probability_curve(sums, order, "counted")]
        return sums, {
            "accuracy": float(right.mean()),
            "right": int(right.sum()),
            **self.totals(sums, len(right)),
            "wrong": {"count": int(len(right) - right.sum()), **self.totals(wrong, len(right))},
            "curves": curves,
        }


def log_probability_curve(sums: Mapping[str, Tensor], order: str, weight: str) -> list[Tensor]:
    """The mean log-probability at x = 0 and after each fraction of FRACTIONS along
    `order` ("positive" or "negative"), from the sums of `weighted_terms`."""
    return [
        weighted_mean(sums, "log_probability", weight),
        *(weighted_mean(sums, f"{order}@{i}", weight) for i in range(len(FRACTIONS))),
    ]
