"""The plan of a single-stack model, and what every plan shares.

A plan answers, for one kind of model (the adapter contract it `serves`), the questions a pass
(explain.engine.passes) asks: which inputs the recorded forward runs on, which score
columns one forward yields (one per explained target), which fold receives the columns'
blocks, and how the columns' results become one relevance per token set. It also
declares which passes it accepts (`Plan.passes`), which explain.engine.run checks once,
before any forward. The passes never ask what kind of model they run.

`Plan`: one token sequence. Column k is target k of every sample; the folds are
the method's, over the set's blocks. It accepts every pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from explain.architectures.base import Adapter, refuse_meta_inputs
from explain.detections import Detections
from explain.engine.passes import (
    AttentionGradientPass,
    Columns,
    EmbeddingCopiesPass,
    EmbeddingGradientPass,
    ForwardPass,
    LrpWalkPass,
    Pass,
    Relevances,
)
from explain.engine.session import Session
from explain.engine.targets import (
    Contrast,
    Request,
    Score,
    StartLayer,
    check_score,
    integer_option,
    require_explicit_target,
    resolve_foil,
    resolve_targets,
    select_scores,
)
from explain.errors import ExplainError, OptionError, TargetError
from explain.layout import Prepared, TokenLayout, TokenSet
from explain.lrp.attnlrp import AttnLrpSites, Embedding
from explain.rules.registry import LRP_NEEDS, METHODS, Fold, Method, RowSum, RuleContext, SpreadMode

__all__ = [
    "Plan",
    "SetFolds",
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


class SetFolds:
    """The call's fold from its folds, one per token set: routes the model-wide layers of
    each set to its fold, renumbered from 0; `result()` is every column's token relevance
    by set name, (C, B, N) each."""

    def __init__(self, folds: dict[str, Fold], sets: Sequence[TokenSet]) -> None:
        self._folds = folds
        self._route = {
            token_set.layers[local]: (folds[token_set.name], local)
            for token_set in sets
            for local in folds[token_set.name].layers
        }
        self.layers = sorted(self._route)

    @property
    def spread(self) -> SpreadMode | None:
        """Its folds' one spread: every set's fold is the same method's."""
        (spread,) = {fold.spread for fold in self._folds.values()}
        return spread

    def add(self, layer: int, columns: slice, attention: Tensor, gradients: Tensor | None) -> None:
        found = self._route.get(layer)  # a forward hands over the blocks no fold reads too
        if found is not None:
            found[0].add(found[1], columns, attention, gradients)

    def fold(
        self, layer: int, columns: slice, spread: Callable[[Tensor], Tensor], rowsum: RowSum
    ) -> None:
        fold, local = self._route[layer]
        fold.fold(local, columns, spread, rowsum)

    def add_input(self, columns: slice, *relevance: Tensor) -> None:
        """The input relevance of full LRP and of AttnLRP (one-stack models: one fold)."""
        (fold,) = self._folds.values()
        fold.add_input(columns, *relevance)

    def result(self) -> dict[str, Tensor]:
        return {name: fold.result() for name, fold in self._folds.items()}


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


def masked_columns(relevances: Mapping[str, Tensor], valid: Tensor) -> dict[str, Tensor]:
    """Each set's relevance of every column (B, K, ...), zero where `valid` (B, K) is
    False: a column past an input's last real one (a padded answer token, a detection the
    input does not have) explains nothing."""
    result = {}
    for name, relevance in relevances.items():
        keep = valid.reshape(*valid.shape, *(1,) * (relevance.dim() - 2))
        result[name] = relevance * keep.to(relevance.dtype)
    return result


class Plan:
    """The plan of a single-stack model, and the base of the others (module docstring).

    Args:
        adapter: the model's adapter.
        spec: the method, or None for a trace.
        request: the call's request.
        tokenizer: the Explainer's tokenizer, for raw texts and `Explanation.tokens`.
    """

    serves: ClassVar[type[Adapter]] = Adapter
    """The kind of model this plan explains: the adapter contract its adapters subclass
    (explain.architectures.base)."""

    passes: ClassVar[frozenset[type[Pass]]] = frozenset(
        {
            ForwardPass,
            AttentionGradientPass,
            LrpWalkPass,
            EmbeddingGradientPass,
            EmbeddingCopiesPass,
        }
    )
    """The passes this kind of model can be explained through (explain.engine.passes)."""

    methods: ClassVar[frozenset[str] | None] = None
    """The only methods this kind takes, where the call's fold is its own rather than the
    method's (an encoder-decoder's two-set fold); None: any method of an accepted pass."""

    known_columns: int | None = None
    """How many score columns the forward will yield, where the inputs alone say it (a
    generation's plan sets it in `prepare`: one per generated position); None: the targets
    are resolved from the output (`columns`), so only the forward says it."""

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
        """Validate the inputs (raw texts tokenized with the Explainer's tokenizer). A
        tensor on the meta device is refused first, naming it, in the inputs or in the
        request's target, start layers or options: a meta tensor's first read would be
        PyTorch's NotImplementedError or RuntimeError, wherever it happened to be read."""
        refuse_meta_inputs(inputs)
        request = self.request
        given = request.target
        given = (given.target, given.foil) if isinstance(given, Contrast) else given
        refuse_meta_inputs(given, "the target", TargetError)
        start = request.start_layer
        for token_set, layer in (start if isinstance(start, Mapping) else {None: start}).items():
            name = "start_layer" if token_set is None else f"start_layer[{token_set!r}]"
            refuse_meta_inputs(layer, name, OptionError)
        for name, value in request.options.items():
            refuse_meta_inputs(value, f"option {name}", OptionError)
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

    # -- folds --------------------------------------------------------------------------

    def call_fold(self) -> Fold:
        """The call's fold: the method's fold of every token set, for every column (which
        all read out the same rows here)."""
        return self._set_folds(self.sets, [token_set.readout[None] for token_set in self.sets])

    def _set_folds(self, sets: Sequence[TokenSet], readouts: Sequence[Tensor]) -> SetFolds:
        """The method's folds of `sets`, read out by `readouts` (R, B, N) each."""
        assert self.spec is not None
        spec = self.spec
        starts = per_set(self.request.start_layer, [s.name for s in sets])
        folds = {}
        for token_set, readout in zip(sets, readouts, strict=True):
            count = len(token_set.layers)
            given = starts[token_set.name]
            if given is None and spec.default_start_layer is not None:
                given = token_set.default_start_layer
            context = RuleContext(
                readout=readout,
                layout=token_set.layout,
                num_layers=count,
                start_layer=resolve_start_layer(spec, given, count, token_set.layout.modality),
            )
            folds[token_set.name] = spec.fold(context, dict(self.request.options))
        return SetFolds(folds, sets)

    def read(self, fold: Fold) -> Relevances:
        """Every column's token relevance per set, (B, C, N), from the call's fold (the
        engine then maps it onto the input)."""
        return {name: result.transpose(0, 1) for name, result in fold.result().items()}

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

    def finish(self, relevances: Relevances, columns: Columns) -> dict[str, Tensor]:
        """The relevance per set from every column's ((B, K, ...) on the input): (B, ...),
        or (B, K, ...) with K targets per input."""
        if columns.classes.dim() == 1:
            return {name: relevance[:, 0] for name, relevance in relevances.items()}
        return dict(relevances)

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
