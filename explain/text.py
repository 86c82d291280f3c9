"""Text explanations in words: adding sub-tokens up to words, and explaining the
similarity of two texts under a sentence encoder (texts are encoded by explain.inputs).

Word pieces are grouped into words by the tokenizers' own markers, so that no
re-tokenization is needed: WordPiece marks a continuation with a leading "##", byte-level
BPE (GPT-2, RoBERTa) and SentencePiece (XLM-R, ALBERT) mark a word start with "Ġ" or "▁".
Special tokens ([CLS], [SEP], <s>, padding, ...) belong to no word.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from explain.api import Explainer
from explain.errors import InputError, OptionError, UnsupportedModelError
from explain.explanation import Explanation
from explain.inputs import encode, skipped_tokens
from explain.rules import get_method

__all__ = [
    "SimilarityExplanation",
    "Word",
    "aligned_cosine",
    "similarity",
    "word_relevance",
    "words",
]

Reduce = Literal["sum", "max"]
_WORD_START = ("Ġ", "▁")


@dataclass(frozen=True)
class Word:
    """A word: its text, its relevance, and the token positions it was made of."""

    text: str
    relevance: float
    positions: tuple[int, ...]


def _starts_word(token: str, marked_starts: bool) -> bool:
    if marked_starts:  # byte-level BPE, SentencePiece: a marker opens each word
        return token.startswith(_WORD_START)
    return not token.startswith("##")  # WordPiece: a marker continues a word


def _strip_marker(token: str) -> str:
    if token.startswith("##"):
        return token[2:]
    return token.lstrip("".join(_WORD_START))


def word_relevance(
    tokens: Sequence[str],
    relevance: Tensor | Sequence[float],
    special: Collection[str],
    reduce: Reduce = "sum",
    join: Callable[[list[str]], str] | None = None,
) -> list[Word]:
    """Group one text's tokens into words and reduce their relevance (sum or max).

    Args:
        tokens: the token strings, one per position.
        relevance: (T,) relevance of the same positions.
        special: token strings that belong to no word (the tokenizer's special tokens).
        reduce: "sum" (the word's share of the total) or "max" (ERASER's token-F1 rule).
        join: makes a word's text from its tokens (default: strip the markers and
            concatenate); `words()` passes the tokenizer's `convert_tokens_to_string`.
    """
    if reduce not in ("sum", "max"):
        raise OptionError(f"reduce must be 'sum' or 'max', got {reduce!r}")
    values = [float(v) for v in relevance]
    if len(values) != len(tokens):
        raise InputError(f"{len(tokens)} tokens but {len(values)} relevance values")
    marked_starts = any(token.startswith(_WORD_START) for token in tokens)
    groups: list[list[int]] = []
    after_special = True
    for position, token in enumerate(tokens):
        if token in special:
            after_special = True
            continue
        if after_special or _starts_word(token, marked_starts) or not groups:
            groups.append([position])
        else:
            groups[-1].append(position)
        after_special = False
    combine = sum if reduce == "sum" else max
    join = join or (lambda pieces: "".join(_strip_marker(piece) for piece in pieces))
    return [
        Word(
            text=join([tokens[p] for p in group]).strip(),
            relevance=combine(values[p] for p in group),
            positions=tuple(group),
        )
        for group in groups
    ]


def words(explanation: Explanation, tokenizer: Any, reduce: Reduce = "sum") -> list[list[Word]]:
    """Word-level relevance of every text of a text explanation (special tokens excluded,
    explain.inputs.skipped_tokens)."""
    if explanation.tokens is None:
        raise InputError("the explanation has no tokens: create the Explainer with a tokenizer")
    if explanation.relevance.dim() != 2:
        raise InputError("words() takes one relevance map per text (B, T); pick a target first")
    special = skipped_tokens(tokenizer)
    return [
        word_relevance(tokens, row, special, reduce, tokenizer.convert_tokens_to_string)
        for tokens, row in zip(explanation.tokens, explanation.relevance.cpu(), strict=True)
    ]


@dataclass(frozen=True)
class SimilarityExplanation:
    """Why two texts are similar: the relevance of each side's tokens for the cosine
    similarity of the two pooled embeddings, the other side held fixed.

    Attributes:
        similarity: (B,) cosine similarity of pair i.
        relevance_a, relevance_b: (B, T) token relevance of each side, pads exactly 0.
        tokens_a, tokens_b: per text, the token strings aligned with the relevance.
    """

    similarity: Tensor
    relevance_a: Tensor
    relevance_b: Tensor
    tokens_a: list[list[str]] | None
    tokens_b: list[list[str]] | None
    method: str


def similarity(
    explainer: Explainer,
    texts_a: str | Sequence[str],
    texts_b: str | Sequence[str],
    method: str | None = None,
    start_layer: int | None = None,
) -> SimilarityExplanation:
    """Explain the cosine similarity of texts_a[i] and texts_b[i] under a sentence encoder.

    As in Chefer et al.'s CLIP text explanations, each side is explained for the
    similarity with the other side's embedding held constant (detached). Both sides are
    one padded batch: one forward and one backward, since a sample's score depends only on
    its own tokens once the other side is a constant.

    Two choices make the maps say which words make the texts similar (docs/methods.md,
    "Sentence similarity"):
    - the explained score is the cosine with the explained side's norm held constant,
      `a / |a| . b / |b|` with `|a|` a constant: the same value, but a plain cosine does
      not change when `a` is scaled, so its gradient is orthogonal to `a` and Gradient x
      Input methods would give relevance that sums to zero. This is LRP's identity rule
      for a normalisation;
    - the aggregating methods (rollout, generic, ...) report `r @ (M - I)`: the readout
      row `r` (each real token's 1/T share in the mean pooling) is the same for every
      token and would otherwise dominate the map.

    Args:
        explainer: an Explainer of a mean-pooled encoder (a bare `...Model`), with a
            tokenizer.
        texts_a, texts_b: one text or B texts each.
        method: a method name from `explain.METHODS`; None: the model kind's default
            (`Explainer.default_method`). `attnlrp` gives the most telling maps (words
            shared in meaning stand out, function words stay near 0).
        start_layer: as in `Explainer.explain`.
    """
    if not explainer.adapter.pooled_by_mean:
        raise UnsupportedModelError(
            "similarity() explains a sentence encoder: pass a bare encoder (e.g. BertModel "
            f"or AutoModel), not {type(explainer.model).__name__}"
        )
    if explainer.tokenizer is None:
        raise InputError(
            "similarity() needs the Explainer's tokenizer: Explainer(model, tokenizer=...)"
        )
    side_a = [texts_a] if isinstance(texts_a, str) else list(texts_a)
    side_b = [texts_b] if isinstance(texts_b, str) else list(texts_b)
    if len(side_a) != len(side_b):
        raise InputError(f"{len(side_a)} texts on one side but {len(side_b)} on the other")
    pairs = len(side_a)
    method = explainer.default_method.method if method is None else method

    def paired_similarity(embeddings: Tensor) -> Tensor:
        a, b = embeddings[:pairs], embeddings[pairs:]
        return torch.cat([aligned_cosine(a, b.detach()), aligned_cosine(b, a.detach())])

    encoded = encode(explainer.tokenizer, side_a + side_b)
    result = explainer.explain(
        encoded, target=paired_similarity, method=method, start_layer=start_layer
    )
    relevance = result.relevance
    if get_method(method).default_start_layer is not None:  # aggregates blocks: r @ M
        mask = encoded["attention_mask"].to(device=relevance.device, dtype=relevance.dtype)
        relevance = relevance - mask / mask.sum(dim=1, keepdim=True)
    embeddings = result.logits
    tokens = result.tokens
    return SimilarityExplanation(
        similarity=torch.nn.functional.cosine_similarity(
            embeddings[:pairs], embeddings[pairs:], dim=-1
        ),
        relevance_a=relevance[:pairs],
        relevance_b=relevance[pairs:],
        tokens_a=tokens[:pairs] if tokens is not None else None,
        tokens_b=tokens[pairs:] if tokens is not None else None,
        method=result.method,
    )


def aligned_cosine(embedding: Tensor, other: Tensor) -> Tensor:
    """cos(embedding, other) per row, with the norm of `embedding` a constant for autograd
    (see `similarity`): the value is the cosine, the gradient that of a dot product."""
    unit_other = other / other.norm(dim=-1, keepdim=True)
    return (embedding * unit_other).sum(dim=-1) / embedding.norm(dim=-1).detach()
