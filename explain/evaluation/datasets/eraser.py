"""The ERASER movie-reviews format (DeYoung et al., 2020): `docs/` and annotation jsonl files.

`docs/<docid>` holds a tokenised review, one sentence per line, tokens separated by spaces.
Each line of `train.jsonl`, `val.jsonl` or `test.jsonl` is an annotation:
`{"annotation_id": ..., "classification": "POS" | "NEG", "evidences": [[{"docid": ...,
"start_token": s, "end_token": e, ...}, ...], ...], ...}`, where token offsets count over
the whole document (sentences joined) and `end_token` is exclusive. Every evidence span
of an annotation belongs to its rationale.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from explain.errors import InputError
from explain.evaluation.datasets.base import TextExample

__all__ = ["EraserMovies"]


class EraserMovies:
    """Reviews, labels and human rationales of one ERASER split.

    Args:
        root: the folder with `docs/` and the split files.
        split: "train", "val" or "test".
        classes: the classification names in the model's label order (index = label).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        split: str = "test",
        classes: Sequence[str] = ("NEG", "POS"),
    ) -> None:
        self.root = Path(root)
        annotations = self.root / f"{split}.jsonl"
        if not annotations.is_file():
            raise InputError(
                f"ERASER annotations not found: {annotations} (expected ROOT/{split}.jsonl "
                "and ROOT/docs/)"
            )
        label_of = {name: index for index, name in enumerate(classes)}
        self.examples: list[TextExample] = []
        for number, line in enumerate(annotations.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                annotation = json.loads(line)
                self.examples.append(self._example(annotation, label_of))
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise InputError(
                    f"{annotations}:{number}: not an ERASER annotation: {error}"
                ) from None
        self.name = f"eraser:{self.root.resolve()}:{split}"

    def _example(self, annotation: dict, label_of: dict[str, int]) -> TextExample:
        evidences = [span for group in annotation["evidences"] for span in group]
        docid = evidences[0]["docid"] if evidences else annotation["annotation_id"]
        path = self.root / "docs" / docid
        if not path.is_file():
            raise InputError(f"ERASER document not found: {path}")
        words = path.read_text().split()
        rationale = [False] * len(words)
        for span in evidences:
            if span["docid"] != docid:
                continue
            for position in range(span["start_token"], min(span["end_token"], len(words))):
                rationale[position] = True
        classification = annotation["classification"]
        if classification not in label_of:
            raise InputError(
                f"classification {classification!r} is not one of {sorted(label_of)}; pass "
                "`classes` in the model's label order"
            )
        return TextExample(
            words=tuple(words), label=label_of[classification], rationale=tuple(rationale)
        )

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> TextExample:
        return self.examples[index]
