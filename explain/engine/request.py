"""What one call asks of the engine."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from explain.architectures.base import refuse_meta_inputs
from explain.engine.fused import AttentionPath
from explain.engine.targets import Contrast, Score, Target
from explain.errors import OptionError, TargetError

__all__ = ["Request", "StartLayer", "integer_option"]

StartLayer = int | Mapping[str, int] | None
"""The first block a method aggregates over: one for every token set, or one per set by
name ({"image": s, "text": s} for a dual encoder); None uses the defaults."""


@dataclass(frozen=True)
class Request:
    """One explanation (or trace) request, as `Explainer.explain` and `Explainer.trace`
    receive it. `method` names the method an explanation runs (its fronts resolve a
    call that names none through explain.defaults); None for a trace, which runs
    no method. A tensor on the meta device in its target, start layers or options is
    refused when it is made."""

    method: str | None = None
    target: Target = None
    score: Score | None = None
    """None: the default of whatever takes a score (the logit; `trace`: the probability);
    methods that differentiate no score refuse one (explain.engine.plans.resolve_score)."""
    start_layer: StartLayer = None
    options: Mapping[str, Any] = field(default_factory=dict)
    attention_path: AttentionPath = "auto"
    memory_budget: int | None = None
    """Bytes the attention maps may take (explain.engine.fused.choose_path: the explicit path
    where its maps fit, the streamed fold's chunks); None: the device's default
    (explain.engine.fused.default_memory_budget)."""
    prompt_length: int | None = None
    """A generation (explain.generation): the inputs are prompts of this padded width
    followed by decoder-only language-model continuations, and every continuation token
    is explained, each read out at the position before it (explain.engine.plans
    `GenerationPlan`); the targets are the generated tokens themselves. None: any other
    call."""

    def __post_init__(self) -> None:
        # Before anything reads a value: a meta tensor's first read is PyTorch's
        # NotImplementedError or RuntimeError, wherever an option happens to be read.
        target = self.target
        given = (target.target, target.foil) if isinstance(target, Contrast) else target
        refuse_meta_inputs(given, "the target", TargetError)
        start_layer = self.start_layer
        starts = start_layer if isinstance(start_layer, Mapping) else {None: start_layer}
        for token_set, start in starts.items():
            name = "start_layer" if token_set is None else f"start_layer[{token_set!r}]"
            refuse_meta_inputs(start, name, OptionError)
        for name, value in self.options.items():
            refuse_meta_inputs(value, f"option {name}", OptionError)


def integer_option(name: str, value: object) -> int:
    """`value` as an int when it is integer-like (an int, a NumPy integer, a 0-d integer
    tensor: anything with `__index__`), as targets are; OptionError for bools, floats and
    anything else."""
    if isinstance(value, bool):
        raise OptionError(f"{name} must be an int, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise OptionError(f"{name} must be an int, got {value!r}") from None
