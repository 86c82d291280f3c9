"""Captions of the synthetic shapes scenes, and the word-level tokenizer that reads them.

The zoo's CLIP-style model (`shapes-clip`) is trained to match a scene with a caption
naming its objects ("a circle and a star") and is measured by retrieving, for a held-out
scene, the caption of its exact set of kinds among the captions of all `kind_sets()`.

The tokenizer is a `tokenizers` word-level model over a closed vocabulary: the six kind
names, a few function words and punctuation. Like CLIP's tokenizer it wraps every text in
a start and an end token; CLIP pools the text at its end token, so the model config's
`eos_token_id` must be `tokenizer.eos_token_id`.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from typing import TYPE_CHECKING

import numpy as np

from explain.data.shapes import KINDS

if TYPE_CHECKING:  # transformers is imported only when a tokenizer is built
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "SPECIAL_TOKENS",
    "TEMPLATES",
    "VOCABULARY",
    "build_tokenizer",
    "caption",
    "kind_sets",
]

SPECIAL_TOKENS: dict[str, str] = {
    "pad_token": "<pad>",
    "unk_token": "<unk>",
    "bos_token": "<|startoftext|>",
    "eos_token": "<|endoftext|>",
}
"""The tokenizer's special tokens (CLIP's names for start and end)."""

VOCABULARY: tuple[str, ...] = (
    "<pad>",
    "<unk>",
    *KINDS,
    *("a", "an", "and", "photo", "of", "the", "with", "scene", "shape"),
    *(",", ".", "!", "?"),
    # Last, as in CLIP's vocabulary: the end token has the highest id, so the text is pooled
    # at the same token whichever rule a transformers version applies (the first
    # `eos_token_id`, or the highest id for configs with eos_token_id == 2).
    "<|startoftext|>",
    "<|endoftext|>",
)
"""Every token, in id order."""

TEMPLATES: tuple[str, ...] = ("{}", "a photo of {}", "a scene with {}")
"""Caption templates; `{}` is the list of objects."""


def kind_sets() -> tuple[tuple[int, ...], ...]:
    """Every set of one to three distinct kinds a scene can hold (41), each sorted."""
    return tuple(kinds for count in (1, 2, 3) for kinds in combinations(range(len(KINDS)), count))


def caption(
    kinds: Sequence[int], rng: np.random.Generator | None = None, template: str = "{}"
) -> str:
    """The caption naming `kinds`: "a circle", "a circle and a star", "a circle, a star
    and a ring", inside `template`.

    Canonical (the kinds in KINDS order) without `rng`; with `rng`, the objects are listed
    in a random order, so that a model learns the set and not the order.
    """
    order = sorted(kinds) if rng is None else [kinds[i] for i in rng.permutation(len(kinds))]
    names = [f"a {KINDS[kind]}" for kind in order]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return template.format(listed)


def build_tokenizer(max_length: int) -> PreTrainedTokenizerFast:
    """A fresh word-level tokenizer over VOCABULARY: lower-cased, split at spaces and
    punctuation, wrapped as `<|startoftext|> ... <|endoftext|>`, padded with `<pad>`.

    `max_length` is the model's number of text positions (start and end tokens included).
    """
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocabulary = {token: index for index, token in enumerate(VOCABULARY)}
    tokenizer = Tokenizer(WordLevel(vocabulary, unk_token=SPECIAL_TOKENS["unk_token"]))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    bos, eos = SPECIAL_TOKENS["bos_token"], SPECIAL_TOKENS["eos_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        special_tokens=[(bos, vocabulary[bos]), (eos, vocabulary[eos])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_max_length=max_length, **SPECIAL_TOKENS
    )
