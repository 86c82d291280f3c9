"""The shape every evaluation protocol has, so one runner can chunk, resume and shard them all.

A protocol turns a chunk of examples into per-example records (JSON-able columns, one
entry per example) and turns the records of the whole dataset, in dataset order, into
the summary numbers. Keeping per-example records rather than running sums makes a merged
run exactly equal to a single run however the chunks were spread over processes.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from explain.api import Explainer
from explain.engine.session import Session
from explain.errors import OptionError
from explain.evaluation.datasets.base import ImageExample
from explain.rules import get_method

__all__ = [
    "Column",
    "EvaluationProtocol",
    "Field",
    "ImageProtocol",
    "Records",
    "as_terms",
    "concatenate_records",
    "method_options",
    "records_problem",
]

Records = dict[str, list[Any]]
"""Column name -> one JSON-able value per example."""


@dataclass(frozen=True)
class Column:
    """A summary number shown in the tables.

    Attributes:
        header: the column's title.
        better: "higher" or "lower" for a number that ranks methods (it gets a bootstrap
            standard error, and the best value and the values within noise of it are
            marked); None for one that does not (e.g. the model's own accuracy).
    """

    header: str
    better: Literal["higher", "lower"] | None = None

    @property
    def title(self) -> str:
        """The header with an arrow that says which way is better."""
        arrow = {"higher": " ↑", "lower": " ↓", None: ""}[self.better]
        return self.header + arrow


@dataclass(frozen=True)
class Field:
    """One column of per-example records as a protocol writes it: what a stored chunk
    must hold to be trusted when a run resumes.

    Attributes:
        kind: int (booleans as 0/1 included) or float (ints accepted), never bool or None.
        low, high: the range every value lies in (inclusive); floats must be finite.
        width: None for one number per example, else a list of that many numbers.
    """

    kind: type[int] | type[float]
    low: float = -math.inf
    high: float = math.inf
    width: int | None = None

    def problem(self, value: Any) -> str | None:
        """What is wrong with one example's `value`, or None."""
        values = [value] if self.width is None else value
        if self.width is not None and not (isinstance(value, list) and len(value) == self.width):
            return f"{value!r:.60} is not a list of {self.width} numbers"
        for number in values:
            kinds = (int,) if self.kind is int else (int, float)
            if isinstance(number, bool) or not isinstance(number, kinds):
                return f"{number!r:.60} is not {'an int' if self.kind is int else 'a number'}"
            if not (math.isfinite(number) and self.low <= number <= self.high):
                return f"{number!r} is outside {self.low}..{self.high}"
        return None


def records_problem(records: Any, fields: Mapping[str, Field], count: int) -> str | None:
    """What is wrong with `records` as the records of `count` examples with `fields`
    (missing or extra keys, a column of another length, a value of the wrong type or out
    of range), or None when they could have been written by the protocol."""
    if not isinstance(records, dict):
        return f"the records are a {type(records).__name__}, not a JSON object"
    if set(records) != set(fields):
        missing, extra = sorted(set(fields) - set(records)), sorted(set(records) - set(fields))
        return f"keys missing: {missing}, unexpected: {extra}"
    for key, field in fields.items():
        column = records[key]
        if not isinstance(column, list) or len(column) != count:
            return f"{key} is not a list of {count} values"
        for value in column:
            problem = field.problem(value)
            if problem is not None:
                return f"{key}: {problem}"
    return None


def as_terms(values: Sequence[Any]) -> Tensor:
    """One per-example column of records as a (n,) float64 tensor (for `terms`)."""
    return torch.tensor(values, dtype=torch.float64)


def concatenate_records(parts: Sequence[Records]) -> Records:
    """Join the records of consecutive chunks into the records of all their examples."""
    if not parts:
        return {}
    return {key: [value for part in parts for value in part[key]] for key in parts[0]}


def method_options(method: str, seed: int) -> dict[str, Any]:
    """Options for `Explainer.explain`: `seed` for the methods that take one (`random`),
    none for the others."""
    return {"seed": seed} if "seed" in get_method(method).options() else {}


class EvaluationProtocol(ABC):
    """One test (perturbation, segmentation, class-specific, rationale) bound to one model."""

    name: ClassVar[str]
    """The protocol's name in results files and on the command line."""

    explainer: Explainer
    """Explains the model under test (and holds it: `explainer.model`)."""

    @abstractmethod
    def evaluate(self, method: str, examples: Sequence[Any], *, seed: int = 0) -> Records:
        """Per-example records of `method` on a chunk of examples.

        `seed` seeds methods that draw random numbers (see `method_options`); the runner
        passes the chunk's first index, so every chunk gets its own noise, the same
        however the chunks are spread over processes.
        """

    @abstractmethod
    def summarize(self, records: Records) -> dict[str, Any]:
        """The protocol's numbers for one method from the records of all examples; its
        ranking numbers are `totals(*summed(records))`, i.e. `from_sums` of the terms' totals."""

    @abstractmethod
    def terms(self, records: Records) -> dict[str, Tensor]:
        """Per-example additive quantities, each (n,) float64, from whose sums
        `from_sums` computes every ranking number: the bootstrap re-weights these rows
        (explain.evaluation.bootstrap), so it never re-reads the records."""

    @abstractmethod
    def from_sums(self, sums: Mapping[str, Tensor], count: int) -> dict[str, Tensor]:
        """The ranking numbers (the `columns` with a `better`) from sums of `terms` over
        `count` examples. Each sum may have leading dimensions (one entry per bootstrap
        draw), which the results keep."""

    def summed(self, records: Records) -> tuple[dict[str, Tensor], int]:
        """The totals of `terms` over all the examples, and how many examples there are."""
        terms = self.terms(records)
        count = len(next(iter(terms.values())))
        return {name: values.sum() for name, values in terms.items()}, count

    def totals(self, sums: Mapping[str, Tensor], count: int) -> dict[str, float]:
        """The ranking numbers, as floats, from the totals that `summed` gives."""
        return {key: float(value) for key, value in self.from_sums(sums, count).items()}

    columns: ClassVar[Mapping[str, Column]]
    """Summary keys shown in the markdown table, with their columns."""

    fields: ClassVar[Mapping[str, Field]]
    """Every key of the records `evaluate` returns, with the type and range of its values
    (stored chunks are checked against them before a resumed run trusts them)."""

    def settings(self) -> dict[str, Any]:
        """Everything besides the model and data that changes the records (for resuming)."""
        return {}

    def scale(self) -> str | None:
        """One sentence that says how to read the numbers (e.g. what an AUC integrates
        over), printed under every table; None when the column titles say it all."""
        return None


class ImageProtocol(EvaluationProtocol):
    """Shared by the image tests: the model, its input normalisation and batching.

    Args:
        model: a supported image model; it is left exactly as it was found.
        mean, std: the model's per-channel input normalisation, applied after any
            perturbation of the [0, 1] pixels.
        forward_batch: most (perturbed) images per forward pass of `logits`; None puts
            all of them in one pass.
    """

    def __init__(
        self,
        model: nn.Module,
        mean: Sequence[float],
        std: Sequence[float],
        forward_batch: int | None = None,
    ) -> None:
        if forward_batch is not None and forward_batch < 1:
            raise OptionError(f"forward_batch must be a positive number, got {forward_batch}")
        self.explainer = Explainer(model)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.forward_batch = forward_batch

    @property
    def device(self) -> torch.device:
        return self.explainer.adapter.parameter.device

    def normalize(self, pixels: Tensor) -> Tensor:
        """(B, 3, H, W) pixels in [0, 1] -> model input, on the model's device."""
        pixels = pixels.to(self.device)
        mean = torch.tensor(self.mean, device=pixels.device, dtype=pixels.dtype)
        std = torch.tensor(self.std, device=pixels.device, dtype=pixels.dtype)
        return (pixels - mean[:, None, None]) / std[:, None, None]

    multi_label: bool = False
    """True when each logit is an independent yes/no decision (a class's probability is its
    sigmoid), False for one softmax over the classes (set by the tests that read
    probabilities)."""

    def probabilities(self, logits: Tensor) -> Tensor:
        """(M, classes) float64 probabilities: sigmoid per class or softmax over the classes."""
        logits = logits.double()
        return logits.sigmoid() if self.multi_label else logits.softmax(dim=-1)

    def classify(self, pixels: Tensor) -> Tensor:
        """Predicted classes of (M, 3, H, W) [0, 1] pixels, `forward_batch` at a time."""
        return self.logits(pixels).argmax(dim=-1)

    def logits(self, pixels: Tensor) -> Tensor:
        """(M, classes) logits of (M, 3, H, W) [0, 1] pixels, `forward_batch` at a time,
        on the CPU."""
        adapter = self.explainer.adapter
        pieces = pixels.split(self.forward_batch or len(pixels))
        # The recorder (forward only) gives the eval mode, path flags and clean-up that
        # every other call on the model gets.
        with Session(adapter):
            logits = [adapter.forward(adapter.prepare(self.normalize(piece))) for piece in pieces]
        return torch.cat(logits).cpu()

    @staticmethod
    def stack(examples: Sequence[ImageExample]) -> tuple[Tensor, Tensor]:
        """(B, 3, H, W) pixels and (B,) labels of a chunk."""
        pixels = torch.stack([example.image.float() for example in examples])
        labels = torch.tensor([example.label for example in examples], dtype=torch.long)
        return pixels, labels

    def settings(self) -> dict[str, Any]:
        return {"mean": list(self.mean), "std": list(self.std)}
