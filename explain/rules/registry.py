"""The method registry: a new method is one decorated builder function.

A builder receives a `RuleContext` and the method's options and returns a `Sink`: the
object that receives each block's attention (and gradient) as the recorder sees it, and
turns them into token relevance. Sinks are pure computation over the tensors they are
given; they never see the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor

from explain.architectures.base import TokenLayout
from explain.errors import UnknownMethodError

__all__ = [
    "METHODS",
    "Method",
    "RuleContext",
    "Sink",
    "first_block",
    "get_method",
    "register_method",
]


def first_block(num_layers: int, modality: str) -> int:
    """Default start layer of the aggregating methods: all blocks."""
    return 0


@dataclass(frozen=True)
class RuleContext:
    """What a rule may know: the readout row, the token layout and the block range."""

    readout: Tensor
    """(B, N) weight of each token in the model's head."""
    layout: TokenLayout
    num_layers: int
    start_layer: int
    """First block the method aggregates over (already resolved and validated)."""


class Sink(Protocol):
    """Receives block records and produces token relevance (B, N) over all tokens."""

    layers: range
    """The blocks this sink needs, in forward order (empty for input-free baselines)."""

    def add(self, layer: int, attention: Tensor, gradient: Tensor | None) -> None: ...

    def result(self) -> Tensor: ...


Builder = Callable[..., Sink]


@dataclass(frozen=True)
class Method:
    """A registered relevance method."""

    name: str
    build: Builder
    needs_gradients: bool
    class_specific: bool
    summary: str
    default_start_layer: Callable[[int, str], int] | None
    """(num_layers, modality) -> the start layer used when the caller gives none; None for
    methods that read a fixed block and take no start_layer."""
    lrp_rules: str | None = None
    """LRP methods: the explain.lrp rule set whose relevance pass feeds the sink (each
    block's attention relevance in place of its attention); None for all other methods."""
    gradient_rules: str | None = None
    """Gradient x Input methods with modified gradients (explain.lrp.attnlrp: "attnlrp",
    "cp_lrp"): the rule set the model runs under for the call; the sink receives the
    relevance of the input tokens through `add_input`. None for all other methods."""

    def sink(self, context: RuleContext, options: dict[str, Any]) -> Sink:
        try:
            return self.build(context, **options)
        except TypeError as error:
            if "unexpected keyword" in str(error):
                raise TypeError(f"method {self.name!r}: {error}") from None
            raise


METHODS: dict[str, Method] = {}


def register_method(
    name: str,
    *,
    needs_gradients: bool,
    class_specific: bool,
    default_start_layer: Callable[[int, str], int] | None = None,
    lrp_rules: str | None = None,
    gradient_rules: str | None = None,
) -> Callable[[Builder], Builder]:
    """Decorator: register `builder(context, **options) -> Sink` under `name`.

    Methods that aggregate over blocks pass `default_start_layer`; the others reject a
    `start_layer` argument. LRP methods name their rule set in `lrp_rules`, Gradient x
    Input methods with modified gradients theirs in `gradient_rules`.

    The builder's docstring's first line becomes the method's summary.
    """

    def decorate(builder: Builder) -> Builder:
        summary = (builder.__doc__ or name).strip().splitlines()[0]
        METHODS[name] = Method(
            name=name,
            build=builder,
            needs_gradients=needs_gradients,
            class_specific=class_specific,
            summary=summary,
            default_start_layer=default_start_layer,
            lrp_rules=lrp_rules,
            gradient_rules=gradient_rules,
        )
        return builder

    return decorate


def get_method(name: str) -> Method:
    """The registered method `name`, or an error listing the known ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise UnknownMethodError(
            f"unknown method {name!r}; known methods: {', '.join(sorted(METHODS))}"
        ) from None
