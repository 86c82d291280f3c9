"""Review-like sentences whose sentiment-bearing words are known: a text task with rationales.

Each sentence puts one or two sentiment words (from POSITIVE or NEGATIVE) into a neutral
template ("honestly , the soundtrack was {} ."); about one in eight is a negated praise
("was not {good}"), which is negative. The rationale of a sentence is the set of words
that decide its label: the sentiment words and, when present, the negation. Everything
else is neutral by construction, so an explanation can be scored against the rationale
(token F1).

Like the shapes scenes, an example is a pure function of its seed, and the seeds of the
"train" and "heldout" splits never overlap. Words are separated by single spaces,
punctuation included, so that words and the tokenizer's word ids line up exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "CLASSES",
    "NEGATIVE",
    "POSITIVE",
    "SPLITS",
    "Sentence",
    "encode",
    "make_sentence",
    "sentences",
]

CLASSES: tuple[str, ...] = ("negative", "positive")
"""Label names in logit order: 0 negative, 1 positive."""

SPLITS: dict[str, range] = {
    "train": range(0, 1_000_000),
    "heldout": range(1_000_000, 1_100_000),
}

POSITIVE = (
    "good", "great", "excellent", "wonderful", "delightful", "superb", "charming",
    "brilliant", "enjoyable", "lovely", "fantastic", "beautiful", "impressive", "moving",
    "gripping", "hilarious", "stunning", "masterful", "terrific", "engaging",
)  # fmt: skip
NEGATIVE = (
    "bad", "terrible", "awful", "boring", "dull", "dreadful", "horrible", "poor",
    "weak", "disappointing", "tedious", "ugly", "mediocre", "clumsy", "lifeless",
    "pointless", "awkward", "bland", "forgettable", "annoying",
)  # fmt: skip
_SUBJECTS = (
    "the movie", "this film", "the plot", "the acting", "the soundtrack", "the ending",
    "the story", "the script", "the cast", "the dialogue", "the second half", "the show",
    "the pacing", "the camera work", "this sequel", "the final scene",
)  # fmt: skip
_OPENERS = (
    "", "honestly ,", "overall ,", "i thought", "my friends said", "to be fair ,",
    "in the end ,", "as expected ,", "we agreed that", "frankly ,",
)  # fmt: skip
_ADVERBS = ("", "", "really", "quite", "very", "rather", "truly")
_NEGATED_ADVERBS = ("", "", "really", "very", "particularly")  # "not rather good" is not English
_CLOSERS = (".", ".", "!", ", in my opinion .", "from start to finish .", "on the whole .")
_NEGATION = "not"


@dataclass(frozen=True)
class Sentence:
    """One example: its words, label and rationale (which words decide the label)."""

    words: tuple[str, ...]
    label: int
    rationale: tuple[bool, ...]
    seed: int

    @property
    def text(self) -> str:
        return " ".join(self.words)


def _split_words(phrase: str) -> list[str]:
    return phrase.split()


def make_sentence(seed: int) -> Sentence:
    """The sentence of `seed` (deterministic)."""
    rng = np.random.default_rng(seed)
    polarity = int(rng.integers(2))  # the sentiment of the words; the label may be negated
    pool = POSITIVE if polarity == 1 else NEGATIVE
    count = 1 if rng.random() < 0.7 else 2
    adjectives = [str(word) for word in rng.choice(pool, size=count, replace=False)]
    # Only praise is negated, and only a single word: "not good" is negative, while "not
    # bad" or "not good and great" say little for sure.
    negated = bool(rng.random() < 0.35) and polarity == 1 and count == 1

    words: list[str] = []
    rationale: list[bool] = []

    def add(phrase: str, decisive: bool = False) -> None:
        for word in _split_words(phrase):
            words.append(word)
            rationale.append(decisive)

    add(str(rng.choice(_OPENERS)))
    add(str(rng.choice(_SUBJECTS)))
    add(str(rng.choice(("was", "is", "felt", "seemed"))))
    if negated:
        add(_NEGATION, decisive=True)
    add(str(rng.choice(_NEGATED_ADVERBS if negated else _ADVERBS)))
    add(adjectives[0], decisive=True)
    if count == 2:
        add(str(rng.choice(("and", "and also", ", even"))))
        add(adjectives[1], decisive=True)
    add(str(rng.choice(_CLOSERS)))
    label = 1 - polarity if negated else polarity
    return Sentence(words=tuple(words), label=label, rationale=tuple(rationale), seed=seed)


def sentences(split: str, count: int, start: int = 0) -> list[Sentence]:
    """Sentences `start .. start + count - 1` of `split`."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {sorted(SPLITS)}")
    seeds = SPLITS[split]
    if start < 0 or count < 0 or start + count > len(seeds):
        raise ValueError(f"sentences {start}..{start + count - 1} are outside split {split!r}")
    return [make_sentence(seeds[start + index]) for index in range(count)]


def encode(batch: Sequence[Sentence], tokenizer: Any) -> tuple[Any, Tensor, Tensor]:
    """Tokenise sentences word by word (padded batch) with their token-level rationales.

    Returns:
        (encoding with input_ids and attention_mask, labels (B,) long, rationale (B, T)
        bool: True at every sub-word token of a rationale word; special tokens and padding
        are False).
    """
    encoding = tokenizer(
        [list(sentence.words) for sentence in batch],
        is_split_into_words=True,
        padding=True,
        return_tensors="pt",
    )
    rationale = torch.zeros(encoding["input_ids"].shape, dtype=torch.bool)
    for row, sentence in enumerate(batch):
        for position, word in enumerate(encoding.word_ids(row)):
            if word is not None:
                rationale[row, position] = sentence.rationale[word]
    labels = torch.tensor([sentence.label for sentence in batch])
    return encoding, labels, rationale
