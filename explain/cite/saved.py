"""What `Citation.load` accepts: a saved citation's every field checked, its types and
its agreement with the rest (the spans tile the context, which lies in the prompt at its
offset; the token data's lengths and span indices match the spans and the tokens), so
that a damaged or edited file is one InputError naming what is wrong, never a KeyError or
a TypeError in whatever reads it later. Nothing in the file is executed."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from explain.cite.check import Check
from explain.cite.spans import Span
from explain.errors import InputError

__all__ = ["FORMAT", "TENSORS", "citation_fields"]

FORMAT = "explain.Citation"
"""The `format` of a saved citation's header."""
VERSION = 2
"""The format version `Citation.save` writes. Version 1 (before answer statements) had no
`sentences`, `token_sentences` and `statement_relevance`: it reads as one statement, the
whole answer. `ablated` (the spans whose scores are leave-one-out drops) is optional: a
file written before it reads as none."""

_RELEVANCES = ["token_relevance", "span_relevance", "scores", "statement_relevance"]
_INDICES = ["token_spans", "token_sentences", "prompt_ids", "answer_ids", "foil_ids"]
TENSORS = _RELEVANCES + _INDICES
"""The tensors of a saved citation; `foil_ids` only for a contrast."""


def _damaged(path: str | os.PathLike[str], what: str) -> InputError:
    return InputError(
        f"{path} holds no valid citation: {what}; write one with Citation.save or explain cite"
    )


def _is_int(value: object) -> bool:
    return type(value) is int  # a bool is no offset, index or count


def _is_number(value: object) -> bool:
    return (_is_int(value) or type(value) is float) and math.isfinite(value)  # type: ignore[arg-type]


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _spans(
    header: Mapping[str, Any], path: str | os.PathLike[str], name: str = "spans"
) -> tuple[Span, ...]:
    """The spans (`name`: "spans" of the context, "sentences" of the answer), each
    `text[start:end]`, tiling the text in order."""
    context = header["context" if name == "spans" else "answer"]
    given = header.get(name)
    what = name[:-1]
    if not isinstance(given, list) or not given:
        raise _damaged(path, f"{name} is not a non-empty list")
    spans, end = [], 0
    for index, span in enumerate(given):
        text, start, stop = (
            (span.get(k) for k in ("text", "start", "end"))
            if isinstance(span, dict)
            else (None, None, None)
        )
        whole = "context" if name == "spans" else "answer"
        if not (isinstance(text, str) and _is_int(start) and _is_int(stop)):
            raise _damaged(path, f"{what} {index} is not a text with an int start and end")
        if start != end or not start < stop <= len(context):
            raise _damaged(
                path,
                f"{what} {index} covers {start}..{stop}, not the next piece of the "
                f"{whole} after {end} (the {name} tile its {len(context)} characters)",
            )
        if context[start:stop] != text:
            raise _damaged(path, f"{what} {index}'s text is not the {whole}'s {start}..{stop}")
        spans.append(Span(text, start, stop))
        end = stop
    if end != len(context):
        raise _damaged(path, f"the {name} end at {end}, before the {whole}'s end {len(context)}")
    return tuple(spans)


_CHECK_FIELDS = {
    "ablation": lambda v: isinstance(v, str),
    "target": lambda v: isinstance(v, str),
    "full": _is_number,
    "random_draws": lambda v: _is_int(v) and v >= 0,
    "lds": lambda v: v is None or _is_number(v),
    "lds_ablations": lambda v: _is_int(v) and v >= 0,
    "seed": lambda v: _is_int(v) and v >= 0,
    "top_k": lambda v: (
        isinstance(v, list)
        and all(
            isinstance(d, dict)
            and _is_int(d.get("k"))
            and all(_is_number(d.get(name)) for name in ("drop", "random_drop", "random_std"))
            and _is_int(d.get("random_sets"))
            and d["random_sets"] >= 1
            and all(isinstance(d.get(name), bool) for name in ("random_exact", "tied"))
            for d in v
        )
    ),
}
"""A saved check's fields (Check.to_dict), each with what its value must be."""


def _check(given: object, path: str | os.PathLike[str]) -> Check | None:
    if given is None:
        return None
    if not isinstance(given, dict):
        raise _damaged(path, "check is neither null nor an object")
    for name, valid in _CHECK_FIELDS.items():
        if name not in given or not valid(given[name]):
            raise _damaged(path, f"check's {name} is {given.get(name)!r}")
    return Check.from_dict(given)


def _header(header: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Every field of the header of the type `Citation.save` writes."""
    if header.get("version") not in (1, VERSION):
        raise _damaged(
            path, f"format version {header.get('version')!r}; this reads versions 1 and {VERSION}"
        )
    for name in ("context", "kind", "question", "prompt", "answer", "method", "score"):
        if not isinstance(header.get(name), str):
            raise _damaged(path, f"{name} is {header.get(name)!r}, not a text")
    if not (header.get("foil") is None or isinstance(header["foil"], str)):
        raise _damaged(path, f"foil is {header['foil']!r}, neither null nor a text")
    for name in ("prompt_tokens", "answer_tokens"):
        if not _strings(header.get(name)):
            raise _damaged(path, f"{name} is not a list of token strings")
    offset, context, prompt = header.get("context_offset"), header["context"], header["prompt"]
    if not (_is_int(offset) and offset >= 0 and prompt[offset : offset + len(context)] == context):
        raise _damaged(path, f"context_offset {offset!r} is not where the prompt holds the context")
    if not isinstance(header.get("settings"), dict):
        raise _damaged(path, "settings is not a JSON object")


def _vector(tensors: Mapping[str, Tensor], name: str, path: str | os.PathLike[str]) -> Tensor:
    """The integer vector `name` (ids or span indices) as int64."""
    tensor = tensors[name]
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise _damaged(path, f"{name} is {tensor.dtype}, not integers")
    if tensor.dim() != 1 or tensor.dtype == torch.uint64:
        raise _damaged(path, f"{name} has shape {tuple(tensor.shape)}, not one row of ints")
    return tensor.long()


def _tensors(
    tensors: Mapping[str, Tensor],
    header: Mapping[str, Any],
    spans: int,
    sentences: int,
    path: str | os.PathLike[str],
) -> dict[str, Tensor]:
    """The tensors, their types and shapes checked against the header's tokens, spans and
    sentences."""
    contrast = header["foil"] is not None
    missing = [name for name in TENSORS[:-1] if name not in tensors]
    if contrast != ("foil_ids" in tensors):
        missing.append("foil_ids" if contrast else "no foil_ids (it has no foil)")
    if missing:
        raise _damaged(path, f"it lacks {', '.join(missing)}")
    checked = {name: _vector(tensors, name, path) for name in _INDICES if name in tensors}
    prompt, answer = len(header["prompt_tokens"]), len(header["answer_tokens"])
    expected = {
        "token_relevance": (answer, prompt),
        "span_relevance": (answer, spans),
        "scores": (spans,),
        "statement_relevance": (sentences, spans),
    }
    for name, shape in expected.items():
        tensor = tensors[name]
        if not tensor.is_floating_point() or tuple(tensor.shape) != shape:
            raise _damaged(
                path,
                f"{name} is {tensor.dtype} {tuple(tensor.shape)}, not floats {shape} "
                f"for its {answer} answer tokens, {prompt} prompt tokens and {spans} spans",
            )
        checked[name] = tensor
    ids = [checked["answer_ids"], *([checked["foil_ids"]] if contrast else [])]
    if len(checked["prompt_ids"]) != prompt or sum(len(row) for row in ids) != answer:
        raise _damaged(path, "its token ids are not one per prompt token and answer token")
    if any(bool((row < 0).any()) for row in [checked["prompt_ids"], *ids]):
        raise _damaged(path, "it holds a negative token id")
    token_spans = checked["token_spans"]
    inside = token_spans[token_spans >= 0]
    if len(token_spans) != prompt or bool((token_spans < -1).any() | (inside >= spans).any()):
        raise _damaged(path, f"token_spans is not one span index in -1..{spans - 1} per token")
    if bool((inside.diff() < 0).any()):  # the context's tokens run through its spans in order
        raise _damaged(path, "token_spans puts the context's tokens out of their spans' order")
    owners = checked["token_sentences"]
    if len(owners) != answer or bool((owners < -1).any() | (owners >= sentences).any()):
        raise _damaged(
            path, f"token_sentences is not one sentence index in -1..{sentences - 1} per token"
        )
    return checked


def _ablated(
    header: Mapping[str, Any], spans: int, path: str | os.PathLike[str]
) -> tuple[int, ...]:
    """The spans whose scores are leave-one-out drops: distinct indices of the spans."""
    given = header.get("ablated", [])
    if not (
        isinstance(given, list)
        and all(_is_int(s) and 0 <= s < spans for s in given)
        and len(set(given)) == len(given)
    ):
        raise _damaged(path, f"ablated is {given!r}, not distinct span indices in 0..{spans - 1}")
    return tuple(given)


def citation_fields(
    tensors: Mapping[str, Tensor], header: Mapping[str, Any], path: str | os.PathLike[str]
) -> dict[str, Any]:
    """The fields of the `Citation` that a saved file holds (all but its explanation),
    each checked; InputError naming the first that is wrong."""
    if header.get("format") != FORMAT:
        raise InputError(f"{path} is not a citation written by Citation.save")
    _header(header, path)
    spans = _spans(header, path)
    if header["version"] == 1:
        header, tensors = _one_statement(header, tensors)
    sentences = _spans(header, path, "sentences")
    names = ["context", "kind", "question", "prompt", "context_offset", "prompt_tokens"]
    names += ["answer", "answer_tokens", "foil", "method", "score", "settings"]
    return {
        **{name: header[name] for name in names},
        "spans": spans,
        "sentences": sentences,
        "check": _check(header.get("check"), path),
        "ablated": _ablated(header, len(spans), path),
        **_tensors(tensors, header, len(spans), len(sentences), path),
    }


def _one_statement(
    header: Mapping[str, Any], tensors: Mapping[str, Tensor]
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """A version-1 file's header and tensors with the whole answer as its one statement
    (its rows up to the answer's ids; a foil's after them belong to none)."""
    if not all(name in tensors for name in ("span_relevance", "answer_ids")):
        return dict(header), dict(tensors)  # what is missing is named by _tensors
    rows, answer = tensors["span_relevance"], len(tensors["answer_ids"])
    owners = torch.full((rows.shape[0],), -1, dtype=torch.long)
    owners[:answer] = 0
    whole = {"text": header["answer"], "start": 0, "end": len(header["answer"])}
    statement = rows[:answer].sum(dim=0, keepdim=True) if rows.dim() == 2 else rows
    added = {"token_sentences": owners, "statement_relevance": statement}
    return {**header, "sentences": [whole]}, {**tensors, **added}
