"""What stands in for the input at the embeddings, where integrated gradients' path
starts and what occlusion puts in a token's place: a text's zero embeddings or a stated
token's, an image's zero pixels (docs/methods.md, "The baselines").
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Literal

from explain.errors import OptionError

__all__ = ["EmbeddingBaseline", "embedding_baseline"]


@dataclass(frozen=True)
class EmbeddingBaseline:
    """The baseline's kind: zero embeddings ("zero"), the embedding module applied to an
    input of zeros ("zero_input": zero pixels) or to `token` at every position ("token")."""

    kind: Literal["zero", "zero_input", "token"]
    token: int | None = None

    def describe(self) -> str:
        """The baseline in words, for `Explanation.settings`."""
        if self.kind == "token":
            return f"token {self.token}"
        return "zero embeddings" if self.kind == "zero" else "zero pixels"


def embedding_baseline(baseline_token: object, modality: str) -> EmbeddingBaseline:
    """The baseline of a call on `modality`'s inputs: a text's zero embeddings, or
    `baseline_token`'s embedding (a token id, text only); an image's zero pixels.
    OptionError for a token that is no token id, or one given for images."""
    if baseline_token is None:
        return EmbeddingBaseline("zero" if modality == "text" else "zero_input")
    if modality != "text":
        raise OptionError(
            "baseline_token replaces text tokens; an image's baseline is zero pixels "
            "(leave baseline_token unset)"
        )
    try:
        token = operator.index(baseline_token)  # type: ignore[arg-type]
    except TypeError:
        token = -1
    if isinstance(baseline_token, bool) or token < 0:
        raise OptionError(
            f"baseline_token must be a token id (an int >= 0), got {baseline_token!r}"
        )
    return EmbeddingBaseline("token", token)
