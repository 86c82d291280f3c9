"""Tokenizing checked text and naming tokens: what the engine needs of a tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from explain.errors import InputError

__all__ = ["checked_texts", "encode", "is_raw_text", "token_strings"]


def is_raw_text(inputs: object) -> bool:
    """A string, or a non-empty list or tuple that holds a string: what a user means as
    text (a mixed list is text with a mistake in it, refused by `checked_texts`)."""
    return isinstance(inputs, str) or (
        isinstance(inputs, list | tuple)
        and len(inputs) > 0
        and any(isinstance(text, str) for text in inputs)
    )


def checked_texts(texts: object) -> list[str]:
    """`texts` (one text or a sequence of texts) as a list of strings with some content,
    or an InputError that says which entry is not."""
    batch = [texts] if isinstance(texts, str) else list(texts)  # type: ignore[call-overload]
    if not batch:
        raise InputError("no texts given: pass a text or a non-empty list of texts")
    for index, text in enumerate(batch):
        if not isinstance(text, str):
            raise InputError(
                f"text {index} is a {type(text).__name__} ({text!r}), not a string; pass "
                "texts as strings only"
            )
        if not text.strip():
            raise InputError(f"text {index} is empty: there is nothing to explain")
    return batch


def encode(tokenizer: Any, texts: str | Sequence[str]) -> Any:
    """Tokenize `texts` into a padded batch for `Explainer.explain`.

    Empty or blank texts are refused (there is nothing to explain), and so are texts of
    which the tokenizer keeps no token (invisible or control characters only). Nothing is
    truncated silently: a text longer than the model takes is refused when explained. The
    batch is padded on the right whatever the tokenizer's `padding_side`: every supported
    model reads right padding, and a classifier that reads the first token needs it.
    """
    batch = checked_texts(texts)
    encoded = tokenizer(
        batch,
        padding=True,
        truncation=False,
        padding_side="right",
        return_special_tokens_mask=True,
        return_tensors="pt",
        verbose=False,  # an over-long text gets explain's error, not a logged warning too
    )
    special = encoded.pop("special_tokens_mask")
    mask = encoded.get("attention_mask")
    real = ~special.bool() if mask is None else mask.bool() & ~special.bool()
    for index in (~real.any(dim=1)).nonzero().flatten().tolist():
        raise InputError(
            f"text {index} ({batch[index]!r}) has no token: the tokenizer drops all of its "
            "characters (invisible or control characters), so there is nothing to explain"
        )
    return encoded


def token_strings(tokenizer: Any, input_ids: Tensor) -> list[list[str]]:
    """Per text, the token string at every position (padding included), aligned with the
    relevance."""
    return [tokenizer.convert_ids_to_tokens(row.tolist()) for row in input_ids.cpu()]
