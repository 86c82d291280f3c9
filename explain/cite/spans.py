"""Splitting a context into spans: sentences, paragraphs, lines, or given pieces.

A span is a stretch of the context `[start, end)` in characters; the spans of a context
cover it without gaps or overlaps, so `"".join(span.text for span in spans)` is the
context. Each span holds its content and the whitespace before it (the first span also
holds any whitespace at the start, the last one any at the end): subword tokenizers
write a word's leading space into the word's token (" The"), so with the whitespace
in front a token almost never straddles two spans.

The sentence splitter is written here (no dependency) and follows fixed rules, stated so
that its results can be predicted:

- a sentence ends after a word that ends in `.`, `!`, `?`, `…` or `‽` (in any run, such
  as `?!` or `...`), optionally followed by closing quotes or brackets, when whitespace
  follows it; a period after a known abbreviation (`ABBREVIATIONS`: "Dr.", "e.g.",
  "U.S.", ...) or a single capital letter (an initial, "J. R. R.") ends no sentence;
  a period inside a word ("3.14", "example.com") is no end, as no whitespace follows it;
- a sentence ends at every line break (as ContextCite's splitter does: contexts are
  split line by line first), so the lines of a list are sentences of their own;
- the full stops of Chinese and Japanese (`。`, `！`, `？`, `．`) end a sentence without
  whitespace after them.

Paragraphs end at blank lines (a line break, optional spaces, a line break), lines at
every line break; blank lines belong to the span after them. Documents and chat turns
are pieces the caller gives (`split(..., starts=...)`): their starts are span starts
whatever the kind, and the finer kinds split inside them.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from explain.errors import InputError, OptionError

__all__ = ["ABBREVIATIONS", "KINDS", "Span", "SpanKind", "split", "split_starts"]

SpanKind = Literal["sentences", "paragraphs", "lines", "documents", "turns"]
KINDS: tuple[str, ...] = ("sentences", "paragraphs", "lines", "documents", "turns")
"""The kinds of span: split by the rules above, or the given pieces (documents of a list,
turns of a chat) as they are."""

ABBREVIATIONS: frozenset[str] = frozenset({
    "mr", "mrs", "ms", "mx", "dr", "prof", "sr", "jr", "st", "mt", "ft", "rev", "hon", "gen",
    "col", "capt", "lt", "sgt", "cmdr", "gov", "pres", "sen", "rep",
    "vs", "cf", "al", "e.g", "i.e", "viz", "ca", "approx", "est", "no", "nos", "vol", "vols",
    "p", "pp", "fig", "figs", "eq", "eqs", "ch", "sec", "art",
    "dept", "univ", "inc", "ltd", "co", "corp", "bros", "assn",
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
    "mon", "tue", "tues", "wed", "thu", "thur", "thurs", "fri", "sat", "sun",
    "a.m", "p.m", "u.s", "u.k", "u.n", "e.u", "ph.d", "m.d", "b.a", "m.a", "b.sc", "m.sc", "d.c",
})  # fmt: skip
"""Words (lower case, without their final period) whose period ends no sentence. "etc."
is left out: it ends sentences at least as often as not."""

_TERMINATORS = ".!?…‽"
_CLOSERS = "\"'”’»)]}」』）"
_WIDE_STOPS = "。！？．"
_WORD = re.compile(r"\S+")
_ENDS_SENTENCE = re.compile(f"[{re.escape(_TERMINATORS + _WIDE_STOPS)}]+[{re.escape(_CLOSERS)}]*$")
_WIDE_STOP = re.compile(f"[{_WIDE_STOPS}][{re.escape(_CLOSERS)}]*(?=\\S)")
_BLANK_LINE = re.compile(r"\n[^\S\n]*\n")


@dataclass(frozen=True)
class Span:
    """`text` is `context[start:end]`: the span's content with the whitespace before it."""

    text: str
    start: int
    end: int


def _ends_sentence(word: str) -> bool:
    """Whether `word` (no whitespace) closes a sentence when whitespace follows it."""
    if not _ENDS_SENTENCE.search(word):
        return False
    bare = word.rstrip(_CLOSERS)
    if not bare.endswith(".") or bare.endswith(".."):  # "!", "?", an ellipsis: always
        return True
    stem = bare[:-1].lstrip("\"'“‘«([{")
    if len(stem) == 1 and stem.isalpha() and stem.isupper():  # an initial: "J."
        return False
    return stem.lower() not in ABBREVIATIONS


def _content_starts(text: str, kind: str) -> list[int]:
    """Where each span's content (its first non-whitespace character) begins, for the
    kinds the rules split."""
    words = list(_WORD.finditer(text))
    starts = []
    for index, word in enumerate(words):
        gap = text[words[index - 1].end() : word.start()] if index else "\n"
        if kind == "sentences":
            new = "\n" in gap or _ends_sentence(words[index - 1].group())
        elif kind == "paragraphs":
            new = not index or _BLANK_LINE.search(gap) is not None
        else:  # lines
            new = "\n" in gap
        if new:
            starts.append(word.start())
        if kind == "sentences":  # wide full stops end sentences inside a word
            starts.extend(word.start() + m.end() for m in _WIDE_STOP.finditer(word.group()))
    return starts


def _leading_whitespace(text: str, position: int) -> int:
    """The start of the whitespace run that ends at `position`."""
    while position > 0 and text[position - 1].isspace():
        position -= 1
    return position


def split_starts(text: str, kind: str, starts: Iterable[int] = ()) -> list[int]:
    """The start offsets of the spans of `text` of `kind` (see `split`), sorted, the first 0."""
    if kind not in KINDS:
        raise OptionError(f"spans must be one of {', '.join(KINDS)}; got {kind!r}")
    given = sorted(set(starts) | {0})
    if given[-1] >= len(text) or given[0] < 0:
        raise InputError(f"span starts {given} do not all lie inside a text of {len(text)}")
    found = set(given)
    if kind in ("sentences", "paragraphs", "lines"):
        for content in _content_starts(text, kind):
            piece = given[bisect.bisect_right(given, content) - 1]  # a given piece's start
            found.add(max(piece, _leading_whitespace(text, content)))
    return sorted(found)


def split(text: str, kind: str = "sentences", starts: Sequence[int] = ()) -> list[Span]:
    """`text` as consecutive spans of `kind` that cover it exactly.

    Args:
        text: the context (at least one non-whitespace character).
        kind: "sentences", "paragraphs" or "lines" (split by the module's rules), or
            "documents" / "turns" (only the given `starts`).
        starts: offsets where a span must start whatever the kind: the starts of the
            documents of a list or the turns of a chat; 0 is always one.
    """
    if not text.strip():
        raise InputError("the context is empty: there is nothing to attribute the answer to")
    bounds = [*split_starts(text, kind, starts), len(text)]
    return [Span(text[a:b], a, b) for a, b in itertools.pairwise(bounds)]
