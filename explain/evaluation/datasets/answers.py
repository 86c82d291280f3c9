"""Prompts with known answers and evidence for a language model, from a JSON lines file:
the language-evidence test's `--data`.

Each line is one example, in the model's own token ids:
`{"input_ids": [...], "answer": [...], "evidence": [...], "kept": [...]}`: the prompt as
the model reads it (special tokens and chat template included), the answer it should
give, the positions (0-based, in `input_ids`) of the answer's evidence, and the positions
removal must never touch (the question, the template). "evidence" and "kept" may be left
out (empty). Blank lines are skipped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from explain.errors import InputError
from explain.evaluation.datasets.base import AnswerExample

__all__ = ["AnswerFile"]

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
