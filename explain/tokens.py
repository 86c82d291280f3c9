"""Tokenizing checked text and naming tokens: what the engine needs of a tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from explain.errors import InputError

__all__ = ["encode", "is_raw_text", "token_strings"]


def is_raw_text(inputs: object) -> bool:
    """A string, or a non-empty sequence of strings."""
    return isinstance(inputs, str) or (
        isinstance(inputs, Sequence)
        and len(inputs) > 0
        and all(isinstance(text, str) for text in inputs)
    )


def encode(tokenizer: Any, texts: str | Sequence[str]) -> Any:
    """Tokenize `texts` into a padded batch for `Explainer.explain`.

    Empty or blank texts are refused (there is nothing to explain), and nothing is
    truncated silently: a text longer than the model takes is refused when explained.
    """
    batch = [texts] if isinstance(texts, str) else list(texts)
    if not batch:
        raise InputError("no texts given")
    for index, text in enumerate(batch):
        if not isinstance(text, str):
            raise InputError(f"text {index} is a {type(text).__name__}, not a string")
        if not text.strip():
            raise InputError(f"text {index} is empty: there is nothing to explain")
    return tokenizer(batch, padding=True, truncation=False, return_tensors="pt")


def token_strings(tokenizer: Any, input_ids: Tensor) -> list[list[str]]:
    """Per text, the token string at every position (padding included), aligned with the
    relevance."""
    return [tokenizer.convert_ids_to_tokens(row.tolist()) for row in input_ids.cpu()]
