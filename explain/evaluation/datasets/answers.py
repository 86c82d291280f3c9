"""Prompts with known answers and evidence for a language model, from a JSON lines file:
the language-evidence test's `--data`.

Each line is one example, in the model's own token ids:
`{"input_ids": [...], "answer": [...], "evidence": [...], "kept": [...]}`: the prompt as
the model reads it (special tokens and chat template included), the answer it should
give, the positions (0-based, in `input_ids`) of the answer's evidence, and the positions
removal must never touch (the question, the template). "evidence" and "kept" may be left
out (empty). Blank lines are skipped.

`answer_example` builds such a line from text, the evidence and the kept parts marked by
substrings of the prompt; `write_answer_file` writes the lines.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from explain.errors import InputError
from explain.evaluation.datasets.base import AnswerExample
from explain.inputs import unicode_text

__all__ = ["AnswerFile", "answer_example", "write_answer_file"]

_KEYS = {"input_ids", "answer", "evidence", "kept"}


def _ids(value: object, key: str) -> tuple[int, ...]:
    if not isinstance(value, list) or any(
        isinstance(item, bool) or not isinstance(item, int) for item in value
    ):
        raise InputError(f"{key} must be a list of integers, got {value!r:.60}")
    return tuple(value)


class AnswerFile:
    """The examples of a JSON lines file (module doc), read at once.

    Attributes:
        replacement: None: the file names no replacement token (the command's
            `--replacement`, or the tokenizer's unknown token, is used).
    """

    replacement: int | None = None

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise InputError(f"answer examples not found: {self.path} (a JSON lines file)")
        self.examples: list[AnswerExample] = []
        for number, line in enumerate(self.path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict) or not {"input_ids", "answer"} <= set(record):
                    raise InputError("each line needs input_ids and answer")
                unknown = sorted(set(record) - _KEYS)
                if unknown:
                    raise InputError(f"unknown keys {unknown}; the keys are {sorted(_KEYS)}")
                self.examples.append(
                    AnswerExample(**{key: _ids(record.get(key, []), key) for key in sorted(_KEYS)})
                )
            except (json.JSONDecodeError, InputError) as error:
                raise InputError(f"{self.path}:{number}: not an answer example: {error}") from None
        if not self.examples:
            raise InputError(f"{self.path} holds no examples")
        self.name = f"answers:{self.path.resolve()}"

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> AnswerExample:
        return self.examples[index]


def answer_example(
    tokenizer: Any,
    prompt: str,
    answer: str,
    *,
    evidence: Sequence[str] = (),
    kept: Sequence[str] = (),
) -> AnswerExample:
    """An example of the language-evidence test from text: `prompt` as the model reads it
    (chat template applied, if any: the tokenizer adds its special tokens), the `answer`
    the model should give after it, and the prompt's `evidence` and `kept` parts (the
    question, the template) each given as a substring that occurs exactly once in the
    prompt. A part's positions are the prompt tokens that overlap it (the tokenizer's
    character offsets: a fast tokenizer). `write_answer_file` writes examples as `--data`
    takes them."""
    for name, text in (("prompt", prompt), ("answer", answer)):
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"the {name} must be a text with some content, got {text!r:.60}")
        unicode_text(text, f"the {name}")
    if not getattr(tokenizer, "is_fast", False):
        raise InputError(
            "answer_example reads the tokens' character offsets, which only a fast "
            "tokenizer gives (AutoTokenizer.from_pretrained(..., use_fast=True))"
        )
    encoded = tokenizer(prompt, return_offsets_mapping=True, verbose=False)
    answer_ids = tokenizer(answer, add_special_tokens=False, verbose=False)["input_ids"]
    offsets = encoded["offset_mapping"]

    def positions(name: str, parts: Sequence[str]) -> tuple[int, ...]:
        if isinstance(parts, str):
            raise InputError(f"{name} is a list of substrings of the prompt, got one text")
        found: set[int] = set()
        for part in parts:
            if not isinstance(part, str) or not part:
                raise InputError(f"each {name} part is a non-empty text, got {part!r:.60}")
            count = prompt.count(part)
            if count != 1:
                raise InputError(
                    f"the {name} part {part!r:.60} occurs {count} times in the prompt; give "
                    "a substring that occurs exactly once (a longer one)"
                )
            start = prompt.index(part)
            end = start + len(part)
            found |= {i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start}
        return tuple(sorted(found))

    return AnswerExample(
        input_ids=tuple(encoded["input_ids"]),
        answer=tuple(answer_ids),
        evidence=positions("evidence", evidence),
        kept=positions("kept", kept),
    )


def write_answer_file(path: str | os.PathLike[str], examples: Iterable[AnswerExample]) -> Path:
    """The `examples` as a JSON lines file that `AnswerFile` (and `explain evaluate
    language-evidence --data`) reads; returns its path."""
    lines = [
        json.dumps({key: list(getattr(example, key)) for key in sorted(_KEYS)})
        for example in examples
    ]
    if not lines:
        raise InputError("no examples to write")
    target = Path(path)
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target
