"""The method registry: a new method is one decorated builder function.

A builder receives a `RuleContext` and the method's options and returns a `Fold`: the
relevance of every score column of the call, folded from each block's records as the
engine hands them over (explain.rules.fold). Folds are pure computation over the tensors
they are given; they never see the model.
"""

from __future__ import annotations

import difflib
import inspect
import numbers
import operator
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, Literal, Protocol

from torch import Tensor

from explain.errors import OptionError, UnknownMethodError
from explain.layout import TokenLayout

__all__ = [
    "LRP_NEEDS",
    "METHODS",
    "CopiesMethod",
    "CopiesSeen",
    "EmbeddingBaseline",
    "Fold",
    "Method",
    "Need",
    "RowSum",
    "RuleContext",
    "SpreadMode",
    "embedding_baseline",
    "first_block",
    "get_method",
    "register_method",
]


def first_block(num_layers: int, modality: str) -> int:
    """Default start layer of the aggregating methods: all blocks."""
    return 0


class Need(Enum):
    """What a method needs from the model beyond its output: it chooses the pass that
    runs the method (explain.engine.passes), which a kind of model's plan must accept and
    its adapter provide, or the method is refused before any forward. A new family of
    methods with another need is one more member here, one pass class and one entry in
    each plan that accepts it."""

    ATTENTION = "attention maps from the forward pass"
    ATTENTION_GRADIENTS = "the gradient of the target score with respect to each attention map"
    LRP_RELEVANCE = "each block's attention relevance from the family's LRP walk"
    INPUT_RELEVANCE = "the LRP relevance of the input itself (the walk continued to the input)"
    EMBEDDING_GRADIENTS = (
        "the gradient of the target score at the input embeddings, under the method's "
        "gradient rules (explain.lrp.attnlrp) for the call where it names any"
    )
    EMBEDDING_COPIES = (
        "the target score of copies of the inputs changed at the embeddings (blended with "
        "a baseline's, shifted by noise), in batched forwards, with their gradients where "
        "the method asks (its `CopiesMethod`)"
    )


LRP_NEEDS = frozenset({Need.LRP_RELEVANCE, Need.INPUT_RELEVANCE})
"""The needs that the family's LRP walk (`Adapter.lrp_walk`) provides."""


@dataclass(frozen=True)
class RuleContext:
    """What a rule may know: the readout rows, the token layout and the block range."""

    readout: Tensor
    """(R, B, N) weight of each token in the model's head: one row per score column of
    the call (R = C), or one that every column reads out (R = 1)."""
    layout: TokenLayout
    """The tokens; its `token_mask` may have the readout's leading axis too (R, B, N),
    where each column sees its own tokens (a generation's: those before its position)."""
    num_layers: int
    start_layer: int
    """First block the method aggregates over (already resolved and validated)."""


RowSum = Callable[[], Tensor | None]
"""Abar's row sums (B, N), computed only when a split reads them; None where every row
sums to 1."""


class SpreadMode(Enum):
    """The form of a block matrix the engine can apply to rows without the block's maps
    (explain.engine.kernels): a method whose block enters only as `u @ Abar` states its
    form here (`Fold.spread`), and the kernels read it. The kernels compute the form
    themselves, tile by tile from q, k, v and dO, never holding A or dA: a method's Python
    function of whole maps cannot run there, so the forms they know are named here."""

    GRADIENT = "Abar = mean_h (dA * A)+, dA the gradient of the score (generic's)"
    ATTENTION = "Abar = mean_h A, the same for every column (rollout's, raw attention's)"


class Fold(Protocol):
    """What receives every block of a call, for every score column: a method's fold, what
    its builder returns (explain.rules.fold), or the call's, a plan's folds of its token
    sets joined (explain.engine.plans; a fold over both sets at once is one itself,
    explain.rules.coattention.TwoSetFold).

    The engine hands each block of `layers` over once per chunk of columns, as it has
    them: `add` with the whole maps, the attention (B, H, N, N) (or a block's LRP
    relevance in its place) and the gradients of the chunk's columns (c, B, H, N, N)
    (None without a backward), for the columns `columns` (a slice of the call's;
    slice(None): every column, from one forward for them all). A fold whose blocks enter
    only as `u @ Abar` with a standard Abar says so in `spread`, and also takes a block as
    that product (`fold(layer, columns, spread, rowsum)`, explain.rules.fold.ReadoutFold),
    which the engine then streams without maps on the fused path. The fold of a method
    that needs the relevance of the input itself (`Need.INPUT_RELEVANCE`,
    `EMBEDDING_GRADIENTS` or `EMBEDDING_COPIES`) receives it with `add_input`, for the
    columns `columns`: (c, B, ...) at each embedding the plan reads
    (`PlanView.embeddings`). `result()` is every column's relevance, (C, B, ...) in
    column order (the call's: by token set). `fold` is asked only of a fold with a
    `spread`, `add_input` only of a method with those needs.
    """

    layers: Sequence[int]
    """The blocks the fold reads, in forward order (a method's numbered within its token
    set, the call's model-wide; empty for input-free baselines)."""
    spread: SpreadMode | None

    def add(
        self, layer: int, columns: slice, attention: Tensor, gradients: Tensor | None
    ) -> None: ...

    def fold(
        self, layer: int, columns: slice, spread: Callable[[Tensor], Tensor], rowsum: RowSum
    ) -> None: ...

    def add_input(self, columns: slice, *relevance: Tensor) -> None: ...

    def result(self) -> Any: ...


@dataclass(frozen=True)
class EmbeddingBaseline:
    """What stands in for the input at the embeddings (docs/methods.md, "The baselines"):
    zero embeddings ("zero"), the embedding module applied to an input of zeros
    ("zero_input": zero pixels) or to `token` at every position ("token")."""

    kind: Literal["zero", "zero_input", "token"]
    token: int | None = None

    def describe(self) -> str:
        """The baseline in words, for `Explanation.settings`."""
        if self.kind == "token":
            return f"token {self.token}"
        return "zero embeddings" if self.kind == "zero" else "zero pixels"


def embedding_baseline(baseline_token: object, modality: str) -> EmbeddingBaseline:
    """The baseline of a call on `modality`'s inputs: a text's zero embeddings, or
    `baseline_token`'s embedding (a token id, text only); an image's zero pixels.
    OptionError for a token that is no token id, or one given for images."""
    if baseline_token is None:
        return EmbeddingBaseline("zero" if modality == "text" else "zero_input")
    if modality != "text":
        raise OptionError(
            "baseline_token replaces text tokens; an image's baseline is zero pixels "
            "(leave baseline_token unset)"
        )
    try:
        token = operator.index(baseline_token)  # type: ignore[arg-type]
    except TypeError:
        token = -1
    if isinstance(baseline_token, bool) or token < 0:
        raise OptionError(
            f"baseline_token must be a token id (an int >= 0), got {baseline_token!r}"
        )
    return EmbeddingBaseline("token", token)


class CopiesSeen(Protocol):
    """What the engine's copies saw, for a `CopiesMethod`'s `finish`: `difference`,
    e - e0 (B, ...); `tokens(v)`, values v (C, B, ...) at the embeddings summed over the
    hidden size on the call's layout (C, B, N); and `on_layout(r)`, (..., P) relevance
    of the embedded tokens on it (..., N)."""

    @property
    def difference(self) -> Tensor: ...

    def tokens(self, values: Tensor) -> Tensor: ...

    def on_layout(self, relevance: Tensor) -> Tensor: ...


class CopiesMethod(Protocol):
    """The algorithm of a method that runs copies of the inputs changed at the embeddings
    (`Need.EMBEDDING_COPIES`, explain.engine.passes.EmbeddingCopiesPass), built per call
    as `Method.copies(layout, batch, **options)`. The engine runs the inputs themselves,
    and the baseline where `baseline_score`, in one forward without a backward, whose
    scores (B, K) go to `start`; then the `count` copies in chunks sized by the memory
    budget, copy c holding e0 + w (e - e0) for its `weights(copies)` w (c, B or 1, P or
    1), plus its `shift(copies, e)` where not None ((c, B, ...) like the inputs' own
    embeddings e (B, ...), in their dtype and device: noise), each chunk's scores
    (c * B, K) to `add`, with the gradients at the copies' embeddings (C', c * B, ...)
    of the columns `columns` where the class says `backward`. `finish` gives every
    column's token relevance (C, B, N) and what the call's settings record (a (B, K)
    tensor there shaped like the call's target)."""

    backward: ClassVar[bool]
    linear_in_score: ClassVar[bool]
    """Whether the relevance is linear in the explained score (`Method.linear_in_score`)."""
    baseline: EmbeddingBaseline
    baseline_score: bool
    count: int

    def __init__(self, layout: TokenLayout, batch: int, **options: Any) -> None: ...

    def weights(self, copies: range) -> Tensor: ...

    def shift(self, copies: range, inputs: Tensor) -> Tensor | None: ...

    def start(self, scores: Tensor, at_baseline: Tensor | None) -> None: ...

    def add(
        self, copies: range, columns: slice, scores: Tensor, gradients: Tensor | None
    ) -> None: ...

    def finish(self, seen: CopiesSeen) -> tuple[Tensor, dict[str, Any]]: ...


Builder = Callable[..., Fold]


@dataclass(frozen=True)
class Method:
    """A registered relevance method."""

    name: str
    build: Builder
    needs: frozenset[Need]
    class_specific: bool
    summary: str
    default_start_layer: Callable[[int, str], int] | None
    """(num_layers, modality) -> the start layer used when the caller gives none; None for
    methods that read a fixed block and take no start_layer."""
    lrp_rules: str | None = None
    """LRP methods: the explain.lrp rule set whose relevance pass feeds the fold (each
    block's attention relevance in place of its attention); None for all other methods."""
    gradient_rules: str | None = None
    """Methods that need `Need.EMBEDDING_GRADIENTS` with modified gradients (AttnLRP,
    CP-LRP): the rule set of explain.lrp.attnlrp that the model runs under for the call;
    their fold receives (`Fold.add_input`) the token relevance of the embeddings. None for
    all others (plain Gradient x Input among them)."""
    copies: type[CopiesMethod] | None = None
    """Methods that need `Need.EMBEDDING_COPIES`: their algorithm over the copies; None
    for all others."""
    scale_note: str | None = None
    """Why the method's raw values mislead as numbers (e.g. they do not conserve the
    explained score), for wherever values are shown; such values are shown normalised
    per map by default (see `display_values`). None when the values can be read as they
    are."""

    @property
    def needs_gradients(self) -> bool:
        """Whether the method differentiates the target score (one backward per target)."""
        copied = self.copies is not None and self.copies.backward
        return copied or bool(self.needs & {Need.ATTENTION_GRADIENTS, Need.EMBEDDING_GRADIENTS})

    @property
    def takes_score(self) -> bool:
        """Whether the method explains a chosen score (logit, probability, ...): those
        that differentiate it, and those that run copies of the inputs (occlusion measures
        its drop)."""
        return self.needs_gradients or self.copies is not None

    @property
    def linear_in_score(self) -> bool:
        """Whether the relevance is linear in the explained score: Gradient x Input, plain
        or under rules fixed by the forward (AttnLRP, CP-LRP), integrated gradients (a
        sum of such gradients along a path fixed by the inputs) and occlusion (a
        difference of scores), so the relevance of a sum or a difference of scores is the
        sum or difference of their relevances, even across forwards that share the
        input; a copies method says so itself (`CopiesMethod.linear_in_score`). The
        attention rules clamp (generic, attention GradCAM) or ignore the score (rollout),
        and are not."""
        if self.copies is not None:
            return self.copies.linear_in_score
        return Need.EMBEDDING_GRADIENTS in self.needs

    def options(self) -> dict[str, Any]:
        """The method's options (the builder's keyword parameters) with their defaults."""
        parameters = list(inspect.signature(self.build).parameters.values())[1:]
        return {
            p.name: p.default
            for p in parameters
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        }

    def fold(self, context: RuleContext, options: dict[str, Any]) -> Fold:
        """The method's fold for one call; unknown options are refused by name, with the
        options the method does take."""
        unknown = sorted(set(options) - set(self.options()))
        if unknown:
            known = ", ".join(f"{name}={default!r}" for name, default in self.options().items())
            raise OptionError(
                f"method {self.name!r} has no option {', '.join(map(repr, unknown))}; "
                + (f"its options (with defaults): {known}" if known else "it takes no options")
            )
        return self.build(context, **self._checked(options))

    def resolved_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The method's options for a call: its defaults, updated by those of `options`
        it takes, each checked as `fold` checks it; the others (a plan's own, such as a
        vision-language model's depth) are left out. For a pass that runs what the
        options describe (how many path points, which baseline); `fold` has refused the
        unknown ones before any forward."""
        taken = {name: value for name, value in options.items() if name in self.options()}
        return {**self.options(), **self._checked(taken)}

    def _checked(self, options: Mapping[str, Any]) -> dict[str, Any]:
        try:
            hints = typing.get_type_hints(self.build) if options else {}
        except (NameError, TypeError):  # a builder whose annotations cannot be resolved
            hints = {}
        return {
            name: _checked_option(self.name, name, v, hints.get(name))
            for name, v in options.items()
        }


def _checked_option(method: str, name: str, value: Any, declared: Any) -> Any:
    """An option value as the builder declares it (numpy and other integer or real types
    as a Python int or float), or OptionError for one of another kind (an int, a number,
    a bool or one of a Literal's values), before the maths meets it."""
    if declared is bool:
        fits = isinstance(value, bool)
        kind = "True or False"
    elif declared is int:
        fits = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        fits = fits and -(2**63) <= int(value) < 2**63
        kind = "an int (64-bit)"
    elif declared is float:
        fits = isinstance(value, numbers.Real) and not isinstance(value, bool)
        kind = "a number"
    elif typing.get_origin(declared) is typing.Literal:
        choices = typing.get_args(declared)
        fits = isinstance(value, str) and value in choices
        kind = "one of " + ", ".join(map(repr, choices))
    else:
        return value
    if not fits:
        raise OptionError(f"option {name} of {method!r} must be {kind}, got {value!r}")
    return int(value) if declared is int else float(value) if declared is float else value


METHODS: dict[str, Method] = {}


def register_method(
    name: str,
    *,
    class_specific: bool,
    needs: Iterable[Need],
    default_start_layer: Callable[[int, str], int] | None = None,
    lrp_rules: str | None = None,
    gradient_rules: str | None = None,
    copies: type[CopiesMethod] | None = None,
    scale_note: str | None = None,
) -> Callable[[Builder], Builder]:
    """Decorator: register `builder(context, **options) -> Fold` under `name`.

    `needs` states what the method needs (`Need`). Methods that aggregate over blocks
    pass `default_start_layer`; the others reject a `start_layer` argument. LRP methods
    name their rule set in `lrp_rules`, Gradient x Input methods with modified gradients
    theirs in `gradient_rules` (plain Gradient x Input names none), methods that run
    copies of the inputs their algorithm in `copies`. A method whose raw
    values mislead as numbers says why in `scale_note`.

    The builder's docstring's first line becomes the method's summary.
    """
    stated = frozenset(needs)
    if bool(stated & LRP_NEEDS) != (lrp_rules is not None):
        raise TypeError(f"method {name!r}: LRP relevance needs a rule set (lrp_rules) and back")
    if gradient_rules is not None and Need.EMBEDDING_GRADIENTS not in stated:
        raise TypeError(f"method {name!r}: gradient_rules apply to embedding gradients only")
    if (Need.EMBEDDING_COPIES in stated) != (copies is not None):
        raise TypeError(f"method {name!r}: copies of the inputs need their algorithm (copies)")

    def decorate(builder: Builder) -> Builder:
        summary = (builder.__doc__ or name).strip().splitlines()[0]
        METHODS[name] = Method(
            name=name,
            build=builder,
            needs=stated,
            class_specific=class_specific,
            summary=summary,
            default_start_layer=default_start_layer,
            lrp_rules=lrp_rules,
            gradient_rules=gradient_rules,
            copies=copies,
            scale_note=scale_note,
        )
        return builder

    return decorate


def get_method(name: str) -> Method:
    """The registered method `name`, or an error listing the known ones."""
    if not isinstance(name, str):
        raise UnknownMethodError(
            f"method must be a method name (a str), got {name!r}; known methods: "
            f"{', '.join(sorted(METHODS))}"
        )
    try:
        return METHODS[name]
    except KeyError:
        close = difflib.get_close_matches(name, sorted(METHODS), n=3, cutoff=0.7)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise UnknownMethodError(
            f"unknown method {name!r}; {hint}known methods: {', '.join(sorted(METHODS))}"
        ) from None
