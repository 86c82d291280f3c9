"""What one call asks of the engine (`Request`), and target and score selection: from the
model output to the scalars that are differentiated.

`target` chooses the class per sample; `score` chooses what of that class is
differentiated. Samples never mix: the backward pass runs over the sum of the per-sample
scores, and nothing in an eval-mode transformer couples samples.

A `Contrast` asks why the target rather than a foil: the differentiated score is the
target's score minus the foil's, from the same forward (Yin and Neubig, "Interpreting
Language Models with Contrastive Explanations", 2022; inseq's contrastive attribution).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import torch
from torch import Tensor

from explain.engine.fused import AttentionPath
from explain.errors import OptionError, TargetError
from explain.finite import check_finite

__all__ = [
    "SCORES",
    "Contrast",
    "Request",
    "Score",
    "StartLayer",
    "Target",
    "check_score",
    "integer_option",
    "require_explicit_target",
    "resolve_foil",
    "resolve_targets",
    "select_scores",
]

Score = Literal["logit", "probability", "log_probability"]
SCORES: tuple[str, ...] = ("logit", "probability", "log_probability")

_NONFINITE_ADVICE = (
    "there is nothing to explain: check that these inputs are normalised as the model "
    "expects (too large values overflow the model's dtype) and that its weights are finite"
)

Classes = Union[int, Sequence[int], Tensor]
"""One class for every sample, or one per sample ((B,) ints)."""


@dataclass(frozen=True)
class Contrast:
    """Why `target` rather than `foil`: the explained score of each sample is the
    target's score minus the foil's (with `score="log_probability"` or the default
    "logit", the log-probability difference of the two classes, or next tokens).

    `target` is None (the predicted class) or the classes as a target takes them (an
    int, or one per sample); `foil` the same, never None. Only the methods that
    differentiate a score from one forward take a contrast (explain.engine.plans);
    for those that are linear in the score's gradient (AttnLRP, CP-LRP: Gradient x Input
    under fixed rules) its relevance is the target's minus the foil's.
    """

    target: Classes | None
    foil: Classes


Target = Union[None, int, Sequence[int], Tensor, Callable[[Tensor], Tensor], Contrast]
"""None (the predicted class), an int, B ints, a (B,) or (B, K) tensor, a callable, or a
`Contrast` of two classes.

A callable maps the model output (B, C) to either class indices (an integer tensor of
shape (B,) or (B, K)) or directly to the (B,) scores to explain (a floating tensor, e.g. a
similarity); in the latter case `score` does not apply.
"""


def resolve_targets(output: Tensor, target: Target) -> tuple[Tensor | None, Tensor | None]:
    """Return (classes, custom_scores): classes (B,) or (B, K) long, or scores from a callable.

    Exactly one of the two is not None. `output` is (B, C), or (B, P, C) for P positions
    of each sample checked at once, with a (B, P) tensor of classes as the target.
    """
    if isinstance(target, Contrast):
        return _one_class_each(output, target.target, "the contrast's target"), None
    batch, num_classes = output.shape[0], output.shape[-1]
    output_checked = callable(target) and not isinstance(target, Tensor)
    if output_checked:  # before the callable reads it
        check_finite(output, "the model's output", _NONFINITE_ADVICE)
        chosen = target(output)
        if not isinstance(chosen, Tensor):
            raise TargetError(
                f"a target callable must return a tensor, got {type(chosen).__name__}"
            )
        if chosen.is_complex():
            raise TargetError(
                f"a target callable must return real scores or class indices, got {chosen.dtype}"
            )
        if chosen.is_floating_point():
            if chosen.shape != (batch,):
                raise TargetError(
                    f"a target callable that returns scores must return shape ({batch},), "
                    f"got {tuple(chosen.shape)}"
                )
            check_finite(chosen, "the score the target callable returned", _NONFINITE_ADVICE)
            return None, chosen
        target = chosen
    if target is None:  # the predicted class: in range, the output is all to check
        check_finite(output, "the model's output", _NONFINITE_ADVICE)
        return output.detach().argmax(dim=-1), None
    if isinstance(target, bool):
        raise TargetError("target must be a class index, not a bool")
    if isinstance(target, int):
        _check_class(target, num_classes)  # before torch meets an int beyond 64 bits
        classes = torch.full((batch,), target, dtype=torch.long, device=output.device)
    else:
        if isinstance(target, Set | Mapping):  # no order: which class goes with which input?
            raise TargetError(
                f"target must be an int, a sequence or a tensor of class indices, or a "
                f"callable; got a {type(target).__name__}"
            )
        if any(isinstance(item, str) for item in _items(target)):
            raise TargetError(
                f"target {target!r} names classes; explain takes class indices (B ints or a "
                "tensor): look a name up in the model's class names, e.g. "
                "load_model(SPEC).classes.index('circle') (the command line's --target "
                "takes names)"
            )
        try:
            classes = torch.as_tensor(target, device=output.device)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            for item in _items(target):  # an index beyond 64 bits: say it is out of range
                if isinstance(item, int) and not -(2**63) <= item < 2**63:
                    _check_class(item, num_classes)
            raise TargetError(
                f"cannot read target {target!r} as class indices: give an int, one int per "
                "input, rows of K ints per input (all of one length), an integer tensor, or "
                "a callable"
            ) from None
        if classes.is_floating_point() or classes.is_complex() or classes.dtype == torch.bool:
            raise TargetError(f"target class indices must be integers, got {classes.dtype}")
        classes = classes.long()
        if classes.dim() == 0:
            classes = classes.expand(batch)
        if classes.dim() not in (1, 2) or classes.shape[0] != batch:
            raise TargetError(
                f"target must have shape ({batch},) or ({batch}, K) for a batch of {batch}, "
                f"got {tuple(classes.shape)}"
            )
        if classes.dim() == 2 and classes.shape[1] == 0:
            raise TargetError("a (B, K) target needs at least one class per input (K >= 1)")
    out_of_range = (classes < 0) | (classes >= num_classes)
    valid = ~out_of_range.any()
    if not output_checked:
        valid = valid & output.isfinite().all()
    if not bool(valid):  # one wait for the device; then say what is wrong
        check_finite(output, "the model's output", _NONFINITE_ADVICE)
        _check_class(classes[out_of_range][0].item(), num_classes)
    return classes, None


def _items(target: object) -> Iterator[object]:
    """The entries of a target given as (nested) sequences, or the target itself."""
    if isinstance(target, Sequence) and not isinstance(target, str | bytes):
        for item in target:
            yield from _items(item)
    else:
        yield target


def _one_class_each(output: Tensor, classes: object, what: str) -> Tensor:
    """`classes` of a contrast resolved as a target, one per sample: (B,)."""
    if (callable(classes) and not isinstance(classes, Tensor)) or isinstance(classes, Contrast):
        raise TargetError(f"{what} must be class indices (an int or one per input)")
    found, _ = resolve_targets(output, classes)  # type: ignore[arg-type]
    assert found is not None
    if found.dim() != 1:
        raise TargetError(f"{what} must be one class per input, got {tuple(found.shape)}")
    return found


def resolve_foil(output: Tensor, target: Target) -> Tensor | None:
    """The foil's classes (B,) of a `Contrast` target, None for any other target."""
    if not isinstance(target, Contrast):
        return None
    if target.foil is None:
        raise TargetError("a contrast needs a foil: the class the target is contrasted with")
    return _one_class_each(output, target.foil, "the contrast's foil")


def _check_class(index: int, num_classes: int) -> None:
    if not 0 <= index < num_classes:
        raise TargetError(
            f"target class {index} is out of range: the model has {num_classes} classes "
            f"(0..{num_classes - 1})"
        )


def require_explicit_target(
    target: Target, feature_output: str | None, class_specific: bool = True
) -> None:
    """Refuse the default target (None, "the predicted class") for a model whose output
    holds features, not class scores (`Adapter.feature_output` says what it holds and what
    to do instead): its largest feature is no prediction. An explicit target (a feature
    index or a callable) is explained; class-agnostic methods ignore the target anyway."""
    if target is None and feature_output is not None and class_specific:
        raise TargetError(feature_output)


def select_scores(
    output: Tensor, classes: Tensor, score: Score, foil: Tensor | None = None
) -> Tensor:
    """The differentiated quantity per sample and class: shape of `classes`. `output` is
    (B, C) with (B,) or (B, K) classes, or (B, P, C) with (B, P) classes (one class at
    each of P positions). With a `foil` (B,) (a `Contrast`), each class's score minus
    the foil's."""
    if score == "logit":
        values = output
    elif score == "probability":
        values = output.softmax(dim=-1)
    elif score == "log_probability":
        values = output.log_softmax(dim=-1)
    else:
        raise TargetError(f"score must be one of {', '.join(SCORES)}; got {score!r}")
    one_each = classes.dim() == output.dim() - 1  # one class per row of classes
    picked = values.gather(-1, classes[..., None] if one_each else classes)
    if foil is not None:
        picked = picked - values.gather(-1, foil.reshape(-1, *(1,) * (values.dim() - 1)))
    check_finite(picked, f"the {score} of the target class", _NONFINITE_ADVICE)
    return picked[..., 0] if one_each else picked


def check_score(score: str) -> None:
    """Raise TargetError before any work if `score` is unknown."""
    if score not in SCORES:
        raise TargetError(f"score must be one of {', '.join(SCORES)}; got {score!r}")


StartLayer = int | Mapping[str, int] | None
"""The first block a method aggregates over: one for every token set, or one per set by
name ({"image": s, "text": s} for a dual encoder); None uses the defaults."""


@dataclass(frozen=True)
class Request:
    """One explanation (or trace) request, as `Explainer.explain` and `Explainer.trace`
    receive it. `method` names the method an explanation runs (its fronts resolve a
    call that names none through explain.defaults); None for a trace, which runs
    no method. A tensor on the meta device in its target, start layers or options is
    refused with the inputs' (explain.engine.plans.Plan.prepare), before any value is
    read."""

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
