"""The plan of a single-stack model, and what every plan shares.

A plan answers, for one kind of model (`Adapter.token_sets`), the questions a pass
(explain.engine.passes) asks: which inputs the recorded forward runs on, which score
columns one forward yields (one per explained target), which sink receives one column's
blocks, and how the columns' results become one relevance per token set. It also
declares which passes it accepts (`Plan.passes`), which explain.engine.run checks once,
before any forward. The passes never ask what kind of model they run.

`Plan`: one token sequence. Column k is target k of every sample; sinks are
the method's, over the set's blocks. It accepts every pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from explain.architectures.base import Adapter, refuse_meta_inputs
from explain.detections import Detections
from explain.engine.passes import (
    AttentionGradientPass,
    Columns,
    ColumnSink,
    EmbeddingGradientPass,
    ForwardPass,
    IntegratedGradientPass,
    LrpWalkPass,
    OcclusionPass,
    Pass,
)
from explain.engine.request import Request, StartLayer, integer_option
from explain.engine.session import Session
from explain.engine.targets import (
    Contrast,
    Score,
    check_score,
    require_explicit_target,
    resolve_foil,
    resolve_targets,
    select_scores,
)
from explain.errors import ExplainError, OptionError
from explain.layout import Prepared, TokenLayout, TokenSet
from explain.lrp.attnlrp import AttnLrpSites, Embedding
from explain.rules import LRP_NEEDS, METHODS, Method, RuleContext, Sink

__all__ = [
    "Plan",
    "SetSinks",
    "check_contrast",
    "check_tokenizer",
    "custom_scores",
    "masked_columns",
    "no_class",
    "per_set",
    "resolve_score",
    "resolve_start_layer",
]


def resolve_start_layer(spec: Method, start_layer: Any, num_layers: int, modality: str) -> int:
    """The first block `spec` aggregates over in a stack of `num_layers` blocks: the given
    `start_layer` (negative counts from the end), checked, or the method's default."""
    if spec.default_start_layer is None:
        if start_layer is not None:
            raise OptionError(f"method {spec.name!r} reads a fixed block; it takes no start_layer")
        return num_layers - 1
    if start_layer is None:
        return spec.default_start_layer(num_layers, modality)
    start_layer = integer_option("start_layer", start_layer)
    if not -num_layers <= start_layer < num_layers:
        raise OptionError(
            f"start_layer {start_layer} is out of range for a model with {num_layers} "
            f"blocks (use 0..{num_layers - 1}, or negative values from the end)"
        )
    return start_layer % num_layers


def resolve_score(spec: Method | None, score: Score | None, default: Score) -> Score:
    """The score a call explains. Only the methods that differentiate a score or measure
    its drop (`Method.takes_score`) and `trace` take one; None there is `default`. The
    others take none, as a method reading one fixed block takes no start_layer: a
    class-agnostic map is the same for every score, and an LRP walk starts from the
    target's logit, so a score given to them is refused, and they are recorded as
    explaining the logit."""
    if spec is not None and not spec.takes_score:
        if score is not None:
            what = (
                "propagates relevance from the target's logit"
                if spec.class_specific
                else "gives one map whatever the target"
            )
            takers = ", ".join(name for name, m in sorted(METHODS.items()) if m.takes_score)
            raise OptionError(
                f"method {spec.name!r} {what} and differentiates no score, so it takes no "
                f"score; leave score unset (the methods that take one: {takers})"
            )
        return "logit"
    score = default if score is None else score
    check_score(score)
    return score


def check_tokenizer(adapter: Adapter, tokenizer: Any) -> None:
    """Refuse a tokenizer for a model that reads no text: nothing would use it."""
    if tokenizer is not None and not adapter.reads_text:
        raise OptionError(
            f"{type(adapter.model).__name__} reads no text, so it takes no tokenizer "
            "(the tokenizer names and encodes texts); leave tokenizer unset"
        )


def takes_contrast(spec: Method) -> bool:
    """Whether `spec` can explain a `Contrast` (the difference of two classes' scores):
    it differentiates a score or measures its drop, and no LRP walk starts it from one
    class's logit."""
    return spec.takes_score and not spec.needs & LRP_NEEDS


def check_contrast(spec: Method | None, refused_because: str | None) -> None:
    """Refuse a `Contrast` target before any work where it cannot be explained: by a plan
    whose targets are not classes of one output (`refused_because` says why), or by a
    method that differentiates no score or starts an LRP walk from one logit (a trace,
    `spec` None, follows the contrast's score like any other)."""
    if refused_because is not None:
        raise OptionError(f"a contrastive target cannot be explained here: {refused_because}")
    if spec is None or takes_contrast(spec):
        return
    why = (
        "starts its LRP walk from one class's logit"
        if spec.needs & LRP_NEEDS
        else "gives one map whatever the target"
    )
    takers = ", ".join(name for name, m in sorted(METHODS.items()) if takes_contrast(m))
    raise OptionError(
        f"method {spec.name!r} {why}, so it cannot explain a contrast (the difference of "
        f"two classes' scores); the methods that can: {takers}"
    )


def custom_scores(score: Score | None) -> None:
    """A target callable that returns scores has chosen what is explained itself: a
    score given with it would be ignored, so it is refused."""
    if score is not None:
        raise OptionError(
            f"the target callable returned the scores to explain, so score={score!r} would "
            "change nothing; leave score unset, or have the callable return class indices"
        )


class SetSinks:
    """One column's sinks, one per token set: routes the model-wide layers of each set to
    its sink, renumbered from 0; `result()` is the token relevance by set name."""

    def __init__(self, sinks: dict[str, Sink], sets: Sequence[TokenSet]) -> None:
        self._sinks = sinks
        self._sets = sets
        self._route = {
            token_set.layers[local]: (sinks[token_set.name], local)
            for token_set in sets
            for local in range(len(token_set.layers))
        }
        self.layers = sorted(
            token_set.layers[local] for token_set in sets for local in sinks[token_set.name].layers
        )

    def add(self, layer: int, attention: Tensor, gradient: Tensor | None) -> None:
        sink, local = self._route[layer]
        sink.add(local, attention, gradient)

    def parts(self) -> list[tuple[Sequence[int], Sink]]:
        """(the set's model-wide layers, its sink) per token set, in order: the fold of all
        columns at once (explain.engine.spread) stacks the columns' sinks set by set."""
        return [(token_set.layers, self._sinks[token_set.name]) for token_set in self._sets]

    def add_input(self, relevance: Tensor) -> None:
        """The input relevance of full LRP (one-stack models: one sink)."""
        (sink,) = self._sinks.values()
        sink.add_input(relevance)  # type: ignore[attr-defined]  # an InputSink (Need)

    def result(self) -> dict[str, Tensor]:
        return {name: sink.result() for name, sink in self._sinks.items()}


def per_set(start_layer: StartLayer, names: Sequence[str]) -> dict[str, Any]:
    """`start_layer` for each token set by name: one for all, or a mapping by set name
    (names it lacks get None, the default)."""
    if isinstance(start_layer, Mapping):
        unknown = set(start_layer) - set(names)
        if unknown:
            raise OptionError(
                f"start_layer names unknown token sets (towers) {sorted(unknown)}; the "
                "sets are " + ", ".join(names)
            )
        return {name: start_layer.get(name) for name in names}
    return dict.fromkeys(names, start_layer)


def no_class(batch: int, device: torch.device) -> Tensor:
    """Target placeholder (-1) when a callable chose the scores directly."""
    return torch.full((batch,), -1, dtype=torch.long, device=device)


def masked_columns(per_column: Sequence[Mapping[str, Tensor]], valid: Tensor) -> dict[str, Tensor]:
    """Each set's column relevances stacked (B, K, ...), zero where `valid` (B, K) is
    False: a column past an input's last real one (a padded answer token, a detection the
    input does not have) explains nothing."""
    result = {}
    for name in per_column[0]:
        stacked = torch.stack([c[name] for c in per_column], dim=1)
        keep = valid.reshape(*valid.shape, *(1,) * (stacked.dim() - 2))
        result[name] = stacked * keep.to(stacked.dtype)
    return result


class Plan:
    """The plan of a single-stack model, and the base of the others (module docstring).

    Args:
        adapter: the model's adapter.
        spec: the method, or None for a trace.
        request: the call's request.
        tokenizer: the Explainer's tokenizer, for raw texts and `Explanation.tokens`.
    """

    passes: ClassVar[frozenset[type[Pass]]] = frozenset(
        {
            ForwardPass,
            AttentionGradientPass,
            LrpWalkPass,
            EmbeddingGradientPass,
            IntegratedGradientPass,
            OcclusionPass,
        }
    )
    """The passes this kind of model can be explained through (explain.engine.passes)."""

    methods: ClassVar[frozenset[str] | None] = None
    """The only methods this kind takes, where its sinks are its own rather than the
    method's (an encoder-decoder's two-set fold); None: any method of an accepted pass."""

    refused_because: ClassVar[str] = ""
    """Why a pass (or method) this kind does not accept cannot run on it."""

    refusal: ClassVar[type[ExplainError]] = OptionError
    """The error that refuses such a method: the kind refuses it by design (an option)."""

    contrast_refused: ClassVar[str | None] = None
    """Why this kind of model takes no `Contrast` target; None: it takes one (the
    difference of two classes' scores of its one output, `columns`)."""

    trace_score: ClassVar[Score] = "probability"
    """The score `trace` differentiates when none is given."""

    generates: ClassVar[bool] = False
    """Whether the plan also explains generations (`Request.prompt_length`) itself; the
    others leave them to `GenerationPlan`."""

    def __init__(
        self, adapter: Adapter, spec: Method | None, request: Request, tokenizer: Any
    ) -> None:
        self.adapter = adapter
        self.spec = spec
        self.request = request
        self.tokenizer = tokenizer
        default = "logit" if spec is not None else self.trace_score
        self.score: Score = resolve_score(spec, request.score, default)
        if isinstance(request.target, Contrast):
            check_contrast(spec, self.contrast_refused)
        self.foil: Tensor | None = None
        """A contrast's foil classes (B,), once `columns` has resolved them."""
        self.prepared: Prepared
        self.sets: Sequence[TokenSet]

    # -- inputs -------------------------------------------------------------------------

    def prepare(self, inputs: Any) -> None:
        """Validate the inputs (raw texts tokenized with the Explainer's tokenizer)."""
        refuse_meta_inputs(inputs)
        self._use(self.adapter.prepare(self.adapter.encode(inputs, self.tokenizer)))
        class_specific = self.spec is None or self.spec.class_specific
        require_explicit_target(self.request.target, self.adapter.feature_output, class_specific)

    def _use(self, prepared: Prepared) -> None:
        self.prepared = prepared
        # A readout row may cost a forward of its own (an attention pooling head's).
        with Session(self.adapter):
            self.sets = self.adapter.sets(prepared)

    def choose_inputs(self) -> None:
        """Settle what the recorded forward runs on, once options are checked (a dual
        encoder pairs images with texts here)."""

    def forward(self) -> Tensor:
        """The recorded forward: the model output whose `columns` are explained."""
        return self.adapter.forward(self.prepared)

    # -- sinks --------------------------------------------------------------------------

    def sink(self, column: int = 0) -> ColumnSink:
        """A fresh sink for column `column`: the method's sink for every token set, routed
        (every column reads out the same rows, so `column` changes nothing here)."""
        return self._set_sinks(self.sets)

    def forward_sinks(self) -> list[ColumnSink]:
        """The sinks a forward-only method fills during the forward: one, whose
        class-agnostic map serves every column (target)."""
        return [self.sink()]

    def column_sinks(self, count: int) -> list[ColumnSink]:
        """Fresh sinks for columns 0 .. count - 1 (`sink`)."""
        return [self.sink(column) for column in range(count)]

    def _set_sinks(self, sets: Sequence[TokenSet]) -> SetSinks:
        assert self.spec is not None
        spec = self.spec
        starts = per_set(self.request.start_layer, [s.name for s in sets])
        sinks = {}
        for token_set in sets:
            count = len(token_set.layers)
            given = starts[token_set.name]
            if given is None and spec.default_start_layer is not None:
                given = token_set.default_start_layer
            context = RuleContext(
                readout=token_set.readout,
                layout=token_set.layout,
                num_layers=count,
                start_layer=resolve_start_layer(spec, given, count, token_set.layout.modality),
            )
            sinks[token_set.name] = spec.sink(context, dict(self.request.options))
        return SetSinks(sinks, sets)

    def read(self, column: int, sink: ColumnSink) -> dict[str, Tensor]:
        """Column `column`'s token relevance (B, N) per set, from its sink (the engine then
        maps it onto the input)."""
        return sink.result()

    def read_columns(self, sinks: Sequence[ColumnSink]) -> list[dict[str, Tensor]]:
        """Every column's token relevance per set (`read` of each column's sink); a plan
        that can read all columns at once overrides it."""
        return [self.read(column, sink) for column, sink in enumerate(sinks)]

    def embeddings(self, sites: AttnLrpSites) -> list[tuple[Embedding, TokenLayout]]:
        """Where AttnLRP and CP-LRP read relevance, each with the layout of its tokens
        (explain.engine.passes `EmbeddingGradientPass`): the family's embeddings, over the
        prepared inputs' tokens."""
        return [(sites.read, self.prepared.layout)]

    # -- scores -------------------------------------------------------------------------

    def columns(self, output: Tensor) -> Columns:
        """The score columns of the model output (B, C): one per target."""
        classes, custom = resolve_targets(output, self.request.target)
        if classes is None:
            assert custom is not None
            custom_scores(self.request.score)
            return Columns(
                custom[:, None], no_class(output.shape[0], output.device), output, custom=True
            )
        index = classes if classes.dim() == 2 else classes[:, None]
        self.foil = resolve_foil(output, self.request.target)
        return Columns(select_scores(output, index, self.score, self.foil), classes, output)

    def copy_forward(self, copies: int) -> Tensor:
        """The output of one forward (as `forward`'s) over `copies` copies of the inputs
        (`Adapter.repeated`: row c * B + b is copy c of sample b), which the pass changes
        at the embeddings (explain.engine.copies)."""
        inputs = self.prepared
        self.prepared = self.adapter.repeated(inputs, copies)
        try:
            return self.forward()
        finally:
            self.prepared = inputs

    def copy_columns(self, output: Tensor, columns: Columns, copies: int) -> Tensor:
        """(copies * B, K) scores of the copies' `output` (`copy_forward`) for the targets
        `columns` resolved from the inputs themselves: the classes they explain, or a
        target callable's scores, the callable given each copy's B rows as it was given
        the inputs'."""
        if columns.custom:
            rows = output.shape[0] // copies
            scores = [self.columns(output[c * rows : (c + 1) * rows]).scores for c in range(copies)]
            return torch.cat(scores)
        index = columns.classes if columns.classes.dim() == 2 else columns.classes[:, None]
        foil = None if self.foil is None else self.foil.repeat(copies)
        return select_scores(output, index.repeat(copies, 1), self.score, foil)

    def finish(self, per_column: list[dict[str, Tensor]], columns: Columns) -> dict[str, Tensor]:
        """The relevance per set from the columns' (each (B, ...) on the input): (B, ...),
        or (B, K, ...) with K targets per input."""
        if columns.classes.dim() == 1:
            return per_column[0]
        return {name: torch.stack([c[name] for c in per_column], dim=1) for name in per_column[0]}

    def detections(self) -> Detections | None:
        """`Explanation.detections`: what a detector's columns explain; None elsewhere."""
        return None

    def settings(self) -> dict[str, Any]:
        """What else the plan chose that should travel with the result
        (`Explanation.settings`); none by default."""
        return {}

    def tokens(self) -> list[list[str]] | None:
        """`Explanation.tokens`: the token strings of the explained texts."""
        if self.tokenizer is None:
            return None
        return self.adapter.token_strings(self.prepared, self.tokenizer)
