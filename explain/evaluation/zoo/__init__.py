"""The zoo's models as evaluation knows them: one module per model in this package.

Each module (named after its model, dashes as underscores: `NAME.py`) declares
`MODEL = ZooEvaluation(...)`: how its held-out accuracy is measured (the number its card
quotes), the check a test makes of it, and the held-out evaluation sets it has. The
modules are found here by `pkgutil` and imported on first use, like timm's registered
models: no table outside a model's module is keyed by its name, so adding a zoo model
adds one module here (and its folder `models/NAME/`, which `explain.loading.zoo` reads).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from explain.errors import OptionError
from explain.evaluation.datasets.base import EvaluationDataset
from explain.loading.loaded_model import LoadedModel

__all__ = [
    "ZooEvaluation",
    "answer_dataset",
    "heldout_dataset",
    "zoo_evaluation",
    "zoo_evaluations",
]

ImageSets = Callable[[tuple[int, int] | None], EvaluationDataset]
"""A held-out set, made at the model's image size (None: the set's own)."""

AnswerSets = Callable[[LoadedModel, int | None], EvaluationDataset]
"""Held-out prompts with answers and known evidence, made with the loaded model's tokenizer
or processor; the int is the prompt length in tokens for a language model (None: its own
default), ignored by a vision-language model."""


@dataclass(frozen=True)
class ZooEvaluation:
    """One zoo model's evaluation.

    name: the zoo model's (its folder's) name.
    headline: what its held-out accuracy counts, as its card says it.
    accuracy: (loaded model, count) -> (accuracy, details): the card's measurement on the
        first `count` held-out examples.
    secondary: (loaded model, count) -> details measured on other held-out inputs than
        the headline's, which cost more than it (a recall model's other prompt lengths);
        `heldout_accuracy(..., secondary=False)` skips them, for a check of the headline.
    count: how many held-out examples the card's number is measured on.
    check: (examples, margin): tests measure it on that many examples and ask for at
        least the card's number less the margin (a margin says how many misses it allows).
    heldout: its held-out set with labels and masks (or rationales), for the image and
        text protocols.
    two_objects: its held-out set of two-object scenes (the class-specific test).
    answers: its held-out prompts with known evidence (the language- and
        vision-language-evidence tests).
    evidence_check: (loaded model, count) -> a check whose `table()` the card quotes: that
        the answers rest on the evidence the examples record (on `count` examples).
    """

    name: str
    headline: str
    accuracy: Callable[[LoadedModel, int], tuple[float, dict[str, float]]]
    count: int
    check: tuple[int, float]
    secondary: Callable[[LoadedModel, int], dict[str, float]] | None = None
    heldout: ImageSets | None = None
    two_objects: ImageSets | None = None
    answers: AnswerSets | None = None
    evidence_check: Callable[[LoadedModel, int], Any] | None = None


@functools.cache
def zoo_evaluations() -> dict[str, ZooEvaluation]:
    """Every zoo model's evaluation by name, from this package's modules."""
    found = {}
    for module in pkgutil.iter_modules(__path__):
        model = importlib.import_module(f"{__name__}.{module.name}").MODEL
        found[model.name] = model
    return dict(sorted(found.items()))


def zoo_evaluation(name: str) -> ZooEvaluation:
    """The evaluation of zoo model `name` (with or without the `zoo:` prefix)."""
    evaluations = zoo_evaluations()
    name = name.removeprefix("zoo:")
    if name not in evaluations:
        raise OptionError(
            f"{name!r} is no zoo model with an evaluation (those with one: "
            f"{', '.join(evaluations)})"
        )
    return evaluations[name]


def _with(kind: str) -> list[str]:
    return [name for name, model in zoo_evaluations().items() if getattr(model, kind)]


def heldout_dataset(
    name: str, image_size: tuple[int, int] | None = None, *, two_objects: bool = False
) -> EvaluationDataset:
    """The held-out evaluation set of zoo model `name` (with or without the `zoo:` prefix)
    at `image_size`; `two_objects` asks for its two-object scenes (the class-specific test)."""
    kind = "two_objects" if two_objects else "heldout"
    model = zoo_evaluations().get(name.removeprefix("zoo:"))
    sets = getattr(model, kind) if model else None
    if sets is None:
        what = "two-object evaluation set" if two_objects else "built-in evaluation set"
        hint = "" if two_objects else "; pass --data"
        raise OptionError(
            f"{name.removeprefix('zoo:')!r} has no {what} (zoo models with one: "
            f"{', '.join(_with(kind))}){hint}"
        )
    return sets(image_size)


def answer_dataset(name: str, loaded: LoadedModel, length: int | None = None) -> EvaluationDataset:
    """The held-out prompts with known evidence of zoo model `name` (with or without the
    `zoo:` prefix), made with `loaded`'s tokenizer or processor; `length`: the prompts'
    length in tokens for a language model (None: its own default)."""
    model = zoo_evaluations().get(name.removeprefix("zoo:"))
    if model is None or model.answers is None:
        raise OptionError(
            f"{name.removeprefix('zoo:')!r} has no built-in prompts with known evidence (zoo "
            f"models with them: {', '.join(_with('answers')) or 'none yet'}); pass --data with "
            "a JSON lines file of answer examples"
        )
    return model.answers(loaded, length)
