"""The fields of a zoo model's `config.json`, checked when the file is read.

A zoo config is data written by `save_zoo_model` (from a training script's settings) and
read by the loader, `explain models`, the evaluation of its model and, where the model's
measurements chose the default method of a kind of model, `explain.defaults` (its
`default_evidence`). Each field is checked here once, so that a damaged file fails at
load with one line naming the file and the field, never later with a KeyError or a
dataclass's TypeError.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from explain.errors import ModelLoadError

__all__ = ["MODALITIES", "check_config", "require"]

MODALITIES = ("image", "text", "image_text", "vision_language")
"""What `LoadedModel.modality` may be (what `Explainer.explain` takes as inputs)."""


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _line(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip()) and "\n" not in value


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "builder": (lambda value: isinstance(value, str), "a builder's name"),
    "modality": (lambda value: value in MODALITIES, f"one of {', '.join(MODALITIES)}"),
    "summary": (_line, "a one-line sentence"),
    "classes": (_optional(_strings), "a list of class names or null"),
    "multi_label": (lambda value: isinstance(value, bool), "true or false"),
    "preprocessing": (_optional(lambda value: isinstance(value, dict)), "an object or null"),
    "tokenizer_files": (_strings, "a list of file names"),
    "processor_files": (_strings, "a list of file names"),
    "trained": (_optional(_strings), "a list of tensor name prefixes or null"),
    "sha256": (
        _optional(lambda value: isinstance(value, str) and bool(_SHA256.fullmatch(value))),
        "64 hexadecimal digits or null",
    ),
    "training": (lambda value: isinstance(value, dict), "an object"),
    "training.script": (lambda value: isinstance(value, str), "a script's path"),
    "training.arguments": (_strings, "a list of the script's arguments"),
    "task": (lambda value: isinstance(value, dict), "an object"),
    "task.data": (lambda value: isinstance(value, str), "a data module's name"),
    "task.length": (_count, "a positive number of tokens"),
    "task.facts": (_count, "a positive count"),
    "task.answer_tokens": (_count, "a positive count"),
    "task.hops": (_count, "a positive count"),
    "default_evidence": (lambda value: isinstance(value, dict), "an object"),
    "default_evidence.kind": (_line, "a kind of model, as explain.defaults names it"),
    "default_evidence.method": (_line, "a method's name"),
    "default_evidence.measured": (_line, "a one-line sentence"),
}
"""Each field a zoo config may have (dotted: inside an object), with its check and what the
check expects, said in the error."""

_REQUIRED = ("builder", "modality", "preprocessing.image_size", "preprocessing.mean")
_REQUIRED += ("preprocessing.std", "task.data", "task.length")
_REQUIRED += ("default_evidence.kind", "default_evidence.method", "default_evidence.measured")
"""Fields without which the config describes no model: the top-level ones always, the
dotted ones whenever their object is there."""


def _lookup(config: dict[str, Any], field: str) -> tuple[bool, Any]:
    """Whether the dotted `field` is in `config` (its object being there), and its value."""
    value: Any = config
    for part in field.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _parent_present(config: dict[str, Any], field: str) -> bool:
    parent = field.rpartition(".")[0]
    return not parent or isinstance(_lookup(config, parent)[1], dict)


def require(config: dict[str, Any], path: Path, fields: Collection[str]) -> None:
    """ModelLoadError unless every one of `fields` (dotted) is in the config read from
    `path`."""
    for field in fields:
        if not _lookup(config, field)[0]:
            raise ModelLoadError(f"zoo config {path} has no {field!r}")


def check_config(config: Any, path: Path, builders: Collection[str]) -> dict[str, Any]:
    """`config` (parsed from `path`) if every field it has is well formed, its required
        fields are there and its builder is one of `builders`; else ModelLoadError naming the
        file and the first wrong field. The values of a builder's arguments are its
    constructor's to check, and the preprocessing's `ImagePreprocessing`'s."""
    if not isinstance(config, dict):
        raise ModelLoadError(f"zoo config {path} is not a JSON object")
    require(config, path, [field for field in _REQUIRED if _parent_present(config, field)])
    for field, (check, expected) in _FIELDS.items():
        present, value = _lookup(config, field)
        if present and not check(value):
            raise ModelLoadError(
                f"zoo config {path}: {field!r} must be {expected}, got {value!r:.80}"
            )
    if config["builder"] not in builders:
        raise ModelLoadError(
            f"zoo config {path}: unknown builder {config['builder']!r}; known builders: "
            f"{', '.join(builders)}"
        )
    return config
