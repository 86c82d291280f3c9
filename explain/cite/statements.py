"""An answer as statements: its sentences, the sentence each answer token belongs to, and
the matrix answer sentence x source.

The answer is split by the context's own sentence splitter (explain.cite.spans.split,
kind "sentences"), so a statement ends where a context sentence would. A token belongs to
the sentence that holds its first non-whitespace character, as a prompt token belongs to
its span (explain.cite.prompt.assign_tokens). The tokens' characters come from the
tokenizer's offset mapping of the answer's text when it tokenizes that text to the
answer's ids (a given answer, with a fast tokenizer); otherwise (a generated answer, a
slow tokenizer) from decoding the ids one prefix at a time, token g covering the
characters that decoding its prefix adds, when decoding the ids gives the answer's text.
Where neither holds, the whole answer is one statement (`Statements.located` is False).

Row n of the matrix is the sum of the per-token source relevances (G, S) over sentence
n's tokens: the sources' scores with that sentence's tokens as the target, each read
after the prompt and the sentences before it. For the methods linear in the score
(AttnLRP, CP-LRP) that is exactly the relevance of the sentence's log-probability. It
costs nothing beyond the citation's one forward and one batched backward: its rows are
sums of the rows that backward gives. Tokens of no sentence (a foil's, in a contrast)
enter no row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from explain.cite.prompt import assign_tokens, span_sums
from explain.cite.spans import Span, split

__all__ = ["UNLOCATED", "Statements", "answer_statements", "statement_sums"]

UNLOCATED = "one: the tokenizer places the answer's tokens in no characters of its text"
"""What a citation's settings say of its sentences where the tokens could not be placed."""


@dataclass(frozen=True)
class Statements:
    """The answer's sentences and each answer token's sentence.

    Attributes:
        sentences: the answer's N sentences, their offsets into the answer's text.
        token_sentences: (G,) each answer token's sentence index (-1: none).
        located: whether the tokens were placed in the text (else one sentence, the whole
            answer, holds every token; module doc).
    """

    sentences: tuple[Span, ...]
    token_sentences: Tensor
    located: bool


def _character_offsets(tokenizer: Any, answer: str, ids: list[int]) -> list[tuple[int, int]] | None:
    """Each token's (start, end) in `answer`, or None where they cannot be placed."""
    try:
        encoded = tokenizer(
            answer, add_special_tokens=False, return_offsets_mapping=True, verbose=False
        )
    except NotImplementedError:  # a Python tokenizer has no offset mapping
        encoded = None
    if encoded is not None and list(encoded["input_ids"]) == ids:
        return [tuple(pair) for pair in encoded["offset_mapping"]]  # type: ignore[misc]
    if tokenizer.decode(ids, skip_special_tokens=True) != answer:
        return None
    ends = [len(tokenizer.decode(ids[: g + 1], skip_special_tokens=True)) for g in range(len(ids))]
    offsets, start = [], 0
    for end in ends:  # a prefix that decodes to less (a split character) adds nothing yet
        end = min(max(end, start), len(answer))
        offsets.append((start, end))
        start = end
    return offsets


def answer_statements(
    tokenizer: Any, answer: str, answer_ids: Tensor, extra_tokens: int = 0
) -> Statements:
    """The statements of `answer` (G answer ids `answer_ids`), for G + `extra_tokens`
    relevance rows: the rows after the answer's (a foil's) belong to no sentence."""
    ids = answer_ids.tolist()
    offsets = _character_offsets(tokenizer, answer, ids)
    located = offsets is not None
    if offsets is None:
        sentences = (Span(answer, 0, len(answer)),)
        offsets = [(0, len(answer))] * len(ids)
    else:
        sentences = tuple(split(answer, "sentences"))
    # Every answer token is in a sentence: one of no characters (a character split over
    # tokens, a bare word marker) counts as the one at its start, the answer's end too.
    widened = [(a, max(b, a + 1)) for a, b in offsets]
    owners = assign_tokens(answer, widened, [s.start for s in sentences], len(answer) + 1)
    if extra_tokens:
        owners = torch.cat([owners, owners.new_full((extra_tokens,), -1)])
    return Statements(sentences, owners, located)


def statement_sums(source_relevance: Tensor, token_sentences: Tensor, count: int) -> Tensor:
    """(N, S): the sum of `source_relevance` (G, S) over each sentence's tokens
    (`token_sentences` (G,), -1 for a token of no sentence)."""
    return span_sums(source_relevance.T, token_sentences.to(source_relevance.device), count).T
