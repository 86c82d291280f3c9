"""The passes through a model: how a method's needs (`Need`) are met.

A pass is one way of running the model for a method (which forward, which backward, what
the call's fold receives): `ForwardPass` (attention maps only),
`AttentionGradientPass` (maps and their gradients, every column in one batched
backward), `LrpWalkPass` (the family's LRP walk, `Adapter.lrp_walk`),
`EmbeddingGradientPass` (Gradient x Input, plain or under AttnLRP's and CP-LRP's rules
hooked where `Adapter.attnlrp_sites` says), `EmbeddingCopiesPass` (copies of the inputs
changed at the embeddings, by the method's `CopiesMethod`). A method runs the first pass in
`PASSES` that provides one of its needs; each pass says what it needs of an adapter
(`missing`, checked before any forward) and reaches the model only through a plan
(`PlanView`). docs/architecture.md ("The path of one call") says how the passes fold
every column at once and which path they take.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor, nn

from explain.architectures.base import Adapter
from explain.engine.copies import EmbeddingCopies, copy_bytes, copy_chunks
from explain.engine.fused import PathChoice, choose_path, default_memory_budget, explicit_map_bytes
from explain.engine.recorder import Recorder, column_gradients
from explain.engine.session import Session
from explain.engine.spread import FoldFeed
from explain.engine.targets import Request
from explain.errors import OptionError, TargetError
from explain.layout import InputHook, ModuleHook, Prepared, TokenLayout, TokenSet
from explain.lrp import RULE_SETS
from explain.lrp.attnlrp import AttnLrpCall, AttnLrpSites, Embedding, attnlrp_hooks
from explain.rules.registry import EmbeddingBaseline, Fold, Method, Need

__all__ = [
    "PASSES",
    "AttentionGradientPass",
    "Columns",
    "EmbeddingCopiesPass",
    "EmbeddingGradientPass",
    "EmbeddingPass",
    "ForwardPass",
    "LrpWalkPass",
    "Pass",
    "PlanView",
    "Relevances",
    "pass_for",
]


@dataclass(frozen=True)
class Columns:
    """What one forward pass explains: `scores` (B, K), column k differentiated (summed
    over the batch) for target k; `classes` (B,) or (B, K), -1 where a callable chose the
    score; `logits` for `Explanation.logits`; `custom` when a callable chose the scores."""

    scores: Tensor
    classes: Tensor
    logits: Tensor
    custom: bool = False


Relevances = dict[str, Tensor]
"""Every column's token relevance by token set name, (B, C, ...) each."""


class PlanView(Protocol):
    """What a pass may use of a plan (explain.engine.plans): the only way it reaches the
    model's inputs and outputs."""

    prepared: Prepared
    sets: Sequence[TokenSet]

    def forward(self) -> Tensor:
        """The forward pass whose output `columns` explains."""

    def columns(self, output: Tensor) -> Columns:
        """The score columns of the output."""

    def call_fold(self) -> Fold:
        """The call's fold: the method's folds of the token sets, for every column."""

    known_columns: int | None
    """The number of score columns the forward will yield, where the inputs alone say it
    (a generation: one per generated position, set by `prepare`); None: only the forward's
    output says it (an attribute, not a call: the explain call path stays as short)."""

    def read(self, fold: Fold) -> Relevances:
        """Every column's token relevance per set, from the call's fold."""

    def embeddings(self, sites: AttnLrpSites) -> list[tuple[Embedding, TokenLayout]]:
        """Where AttnLRP and CP-LRP read relevance (the family's `sites` offer them), each
        with the layout of its tokens, the one nearest the score first (`AttnLrpCall`)."""

    def copy_forward(self, copies: int) -> Tensor:
        """The output of one forward over `copies` copies of the inputs (row c * B + b:
        copy c of sample b); what the copies differ by is the pass's (a hook at the
        embeddings, explain.engine.copies)."""

    def copy_columns(self, output: Tensor, columns: Columns, copies: int) -> Tensor:
        """(copies * B, K): the explained scores of the copies' output, for the targets
        `columns` resolved from the inputs themselves."""


class Pass(ABC):
    """One way through the model for a method (module docstring).

    Args:
        adapter: the model's adapter (for the session and the recorder, which borrow and
            hook its model; inputs and outputs go through `plan`).
        spec: the method.
        plan: the call's plan, prepared.
        request: the call's request (its attention path).
    """

    provides: ClassVar[frozenset[Need]]
    """The needs this pass meets."""

    def __init__(self, adapter: Adapter, spec: Method, plan: PlanView, request: Request) -> None:
        self.adapter = adapter
        self.spec = spec
        self.plan = plan
        self.request = request
        self.memory_budget = (
            default_memory_budget(adapter.parameter.device)
            if request.memory_budget is None
            else request.memory_budget
        )
        self.taken: str = "explicit"
        """The attention path the run took: "explicit", "fused" or "streamed" (the fused
        path with every block folded from q, k, v and dO, explain.engine.spread)."""

    @property
    def settings(self) -> dict[str, Any]:
        """What `Explanation.settings` records of the run: its path and memory budget."""
        return {"attention_path": self.taken, "memory_budget": self.memory_budget}

    @classmethod
    def missing(cls, adapter: Adapter | type[Adapter]) -> str | None:
        """What `adapter` (a model's, or a family's class: what every model of it has)
        lacks for this pass, said for an error message; None: nothing."""
        return None

    @classmethod
    def check_request(cls, spec: Method, request: Request) -> None:
        """Refuse request options this pass cannot honour (before any forward); every
        option is honoured unless a pass says otherwise."""
        return None

    @property
    def mapped(self) -> bool:
        """Whether the results are already in input space (pixels): no adapter mapping."""
        return False

    def fused(self) -> bool:
        """Whether the call keeps the fused attention kernel (explain.engine.fused.choose_path),
        noted in `taken`."""
        path: PathChoice = choose_path(
            self.adapter,
            self.plan.prepared.layout,
            batch=self.plan.prepared.batch_size,
            needs_gradients=self.spec.needs_gradients,
            requested=self.request.attention_path,
            memory_budget=self.memory_budget,
            reads_attention=bool(self.spec.needs & {Need.ATTENTION, Need.ATTENTION_GRADIENTS}),
            maps=self.adapter.attention_maps(self.plan.prepared),
            columns=self.plan.known_columns,
        )
        self.taken = path
        return path == "fused"

    def _session(
        self,
        *,
        differentiable: bool,
        fused: bool = False,
        hooks: Sequence[tuple[nn.Module, ModuleHook | InputHook]] = (),
    ) -> Session:
        """The session that borrows the model for this pass, on the chosen path."""
        path = self.adapter.fused_path() if fused else None
        return Session(self.adapter, differentiable=differentiable, fused=path, hooks=hooks)

    @abstractmethod
    def run(self) -> tuple[Columns, Relevances]:
        """Run the model: the columns explained and each column's token relevance."""


class ForwardPass(Pass):
    """Class-agnostic methods: one forward under no_grad, no backward at all; one map
    serves every target, unless the plan reads each column out by its own rows. On the
    fused path, where every block folds by its spread, the forward keeps each block's q
    and k only, and the blocks are folded after it, last first, without maps."""

    provides = frozenset({Need.ATTENTION})

    def run(self) -> tuple[Columns, Relevances]:
        plan = self.plan
        fold = plan.call_fold()
        fused = self.fused()
        feed = FoldFeed(fold, self.memory_budget) if fused else None
        stream = feed is not None and feed.streams
        with (
            self._session(differentiable=False, fused=fused) as session,
            Recorder(
                session,
                on_attention=lambda layer, attention: fold.add(layer, slice(None), attention, None),
                stream_forward=stream,
                observed=fold.layers,
            ) as recorder,
        ):
            columns = plan.columns(plan.forward())
            if stream:
                recorder.stream_attention(feed.add)  # type: ignore[union-attr]  # streams
                self.taken = "streamed"
        count = columns.scores.shape[1]
        return columns, {  # a map every column reads out alike serves every target
            name: r if r.shape[1] == count else r.repeat(1, count, *(1,) * (r.dim() - 2))
            for name, r in plan.read(fold).items()
        }


class AttentionGradientPass(Pass):
    """One forward, then one backward of every score column (vectorised over columns,
    chunked to the memory budget), every block handed to the call's fold as its gradients
    arrive, for a chunk of columns at once: a map straight to it, a block
    recorded from q, k and v through explain.engine.spread.FoldFeed."""

    provides = frozenset({Need.ATTENTION_GRADIENTS})

    def run(self) -> tuple[Columns, Relevances]:
        plan = self.plan
        fold = plan.call_fold()
        fused = self.fused()
        with (
            self._session(differentiable=True, fused=fused) as session,
            Recorder(session, track=fold.layers) as recorder,
        ):
            feed = FoldFeed(fold, self.memory_budget) if recorder.recomputes else None
            on_block = fold.add if feed is None else feed.add
            columns = plan.columns(plan.forward())
            if columns.scores.shape[1] == 1:
                recorder.backward(columns.scores[:, 0].sum(), on_block=on_block)
            else:
                recorder.backward_batched(
                    columns.scores, max_bytes=self.memory_budget, on_block=on_block
                )
        if fused and feed is not None and feed.streams:
            self.taken = "streamed"
        return columns, plan.read(fold)


class LrpWalkPass(Pass):
    """The LRP methods: a recorded forward, the gradients the method weights by (batched
    over columns as above), then the family's walk from each column's class logit."""

    provides = frozenset({Need.LRP_RELEVANCE, Need.INPUT_RELEVANCE})

    @classmethod
    def missing(cls, adapter: Adapter | type[Adapter]) -> str | None:
        if adapter.lrp_walk is None:
            return "the LRP methods need relevance rules for the family's modules, which it lacks"
        # A model, not only its family: does the family's walk cover it?
        return adapter.lrp_missing() if isinstance(adapter, Adapter) else None

    @classmethod
    def check_request(cls, spec: Method, request: Request) -> None:
        # The walks read each block's attention probabilities as the explicit path
        # computes them.
        if request.attention_path == "fused":
            raise OptionError(
                f"method {spec.name!r} propagates relevance through the explicit attention "
                "path, not the fused kernel; use attention_path='auto' or 'explicit'"
            )

    def __init__(self, adapter: Adapter, spec: Method, plan: PlanView, request: Request) -> None:
        super().__init__(adapter, spec, plan, request)
        self._to_input = Need.INPUT_RELEVANCE in spec.needs
        self._walk = adapter.lrp_walk(to_input=self._to_input)

    @property
    def mapped(self) -> bool:
        return self._to_input and self._walk.in_input_space

    def run(self) -> tuple[Columns, Relevances]:
        spec, plan, walk, to_input = self.spec, self.plan, self._walk, self._to_input
        assert spec.lrp_rules is not None
        rules = RULE_SETS[spec.lrp_rules]
        fold = plan.call_fold()
        layers = frozenset(fold.layers)
        track = fold.layers if spec.needs_gradients else range(0)
        stop_layer = 0 if to_input or not fold.layers else fold.layers[0]
        with (
            self._session(differentiable=bool(track)) as session,
            Recorder(session, track=track, module_hooks=walk.hooks) as recorder,
        ):
            columns = plan.columns(plan.forward())
            if columns.custom:
                raise TargetError(
                    f"method {spec.name!r} propagates relevance from a class logit; give the "
                    "target as class indices, not a callable that returns scores"
                )
            count = columns.scores.shape[1]
            gradients: list[dict[int, Tensor]] = [{} for _ in range(count)]
            if track and count == 1:
                recorder.backward(
                    columns.scores[:, 0].sum(),
                    lambda layer, attention, grad: gradients[0].__setitem__(layer, grad),
                )
            elif track:
                recorder.backward_batched(
                    columns.scores,
                    lambda k, layer, attention, grad: gradients[k].__setitem__(layer, grad),
                )
            classes = columns.classes if columns.classes.dim() == 2 else columns.classes[:, None]
            for k in range(count):  # each column's walk: a chunk of one column
                column = slice(k, k + 1)

                def deliver(layer: int, relevance: Tensor, k: int = k) -> None:
                    if layer in layers:
                        gradient = gradients[k].pop(layer, None)
                        grads = None if gradient is None else gradient[None]
                        fold.add(layer, slice(k, k + 1), relevance, grads)

                below = walk.propagate(
                    classes[:, k], rules, deliver, stop_layer=stop_layer, to_input=to_input
                )
                if to_input:
                    fold.add_input(column, below[None])
        return columns, plan.read(fold)


class EmbeddingPass(Pass):
    """What the passes that read the input embeddings share: the family must say where
    they are (the embedding module of `Adapter.attnlrp_sites`), and the call keeps the
    fused attention kernel where the model has one, since no attention map is read."""

    @classmethod
    def missing(cls, adapter: Adapter | type[Adapter]) -> str | None:
        if adapter.attnlrp_sites is None:
            return (
                "its family does not say where its input embeddings are (nor where the rules "
                "of AttnLRP and CP-LRP attach)"
            )
        return None

    def _copies(self, baseline: EmbeddingBaseline, *, differentiable: bool) -> EmbeddingCopies:
        """The copies' state and hook, where the plan reads the embeddings
        (`PlanView.embeddings`: one place; a vision-language model's plan refuses these
        methods at depth "tower", before any forward)."""
        (read, _), *deeper = self.plan.embeddings(self.adapter.attnlrp_sites())
        assert not deeper, "the copies replace the embeddings at one place"
        prepared = self.plan.prepared
        return EmbeddingCopies(
            read, baseline, prepared.batch_size, prepared.layout, differentiable=differentiable
        )

    def _copy_bytes(self, copies: EmbeddingCopies, fused: bool, *, gradients: bool) -> int:
        """What one copy of the inputs holds at most (explain.engine.copies.copy_bytes):
        the explicit path also holds attention maps, every block's for a backward, about
        one block's at a time without."""
        prepared, blocks = self.plan.prepared, self.adapter.num_layers
        maps = 0
        if not fused:
            kept = explicit_map_bytes(
                self.adapter,
                prepared.layout,
                prepared.batch_size,
                gradients,
                self.adapter.attention_maps(prepared),
            )
            maps = kept if gradients else kept // max(blocks, 1)
        return copy_bytes(copies.inputs, blocks, gradients=gradients, maps=maps)


class EmbeddingGradientPass(EmbeddingPass):
    """Gradient x Input at the input embeddings (plain, AttnLRP, CP-LRP): one forward,
    with the method's gradient rules hooked on the model's modules for the call where it
    names any, whose embeddings the plan chooses (`embeddings`: the word- or
    patch-embedding output, the graph's leaf; a vision-language model's language-model
    input and, at depth "tower", its tower's patch embeddings beneath it); then one
    batched backward of every column to them, embedding x gradient summed over the
    hidden size, into the call's fold. The rules hold on either attention path."""

    provides = frozenset({Need.EMBEDDING_GRADIENTS})

    def run(self) -> tuple[Columns, Relevances]:
        spec, plan = self.spec, self.plan
        fold = plan.call_fold()
        sites = self.adapter.attnlrp_sites()
        reads = plan.embeddings(sites)
        call = AttnLrpCall([embedding for embedding, _ in reads])
        if spec.gradient_rules is None:  # plain gradients: the embeddings read, no rule
            hooks = call.hooks()
        else:
            hooks = attnlrp_hooks(self.adapter.model, sites, spec.gradient_rules, call)  # type: ignore[arg-type]
        with self._session(differentiable=True, fused=self.fused(), hooks=hooks):
            columns = plan.columns(plan.forward())
            _require_embedding_gradients(columns.scores)
            for chunk, gradients in column_gradients(
                columns.scores, call.tensors, self.memory_budget
            ):  # every column of the chunk at once: (c, B, N) per embedding read
                relevances = [
                    call.relevance(gradient, layout, read)
                    for read, (gradient, (_, layout)) in enumerate(
                        zip(gradients, reads, strict=True)
                    )
                ]
                fold.add_input(slice(chunk.start, chunk.stop), *relevances)
        return columns, plan.read(fold)


def _require_embedding_gradients(scores: Tensor) -> None:
    if not scores.requires_grad:
        raise TargetError(
            "the explained score does not depend on the model's embeddings: a target "
            "callable's scores must be computed from the model output it receives"
        )


class EmbeddingCopiesPass(EmbeddingPass):
    """The methods that run copies of the inputs changed at the embeddings, as their
    `CopiesMethod` (explain.rules.registry) asks: the copies' forwards (explain.engine.copies),
    as many copies per forward as the memory budget allows, and their backwards."""

    provides = frozenset({Need.EMBEDDING_COPIES})

    def __init__(self, adapter: Adapter, spec: Method, plan: PlanView, request: Request) -> None:
        super().__init__(adapter, spec, plan, request)
        self._recorded: dict[str, Any] = {}

    @property
    def settings(self) -> dict[str, Any]:
        return {**super().settings, **self._recorded}

    def run(self) -> tuple[Columns, Relevances]:
        plan, kind = self.plan, self.spec.copies
        assert kind is not None
        fold = plan.call_fold()  # the method's fold refuses bad options before any forward
        batch = plan.prepared.batch_size
        options = self.spec.resolved_options(self.request.options)
        method = kind(plan.prepared.layout, batch, **options)
        copies = self._copies(method.baseline, differentiable=kind.backward)
        fused = self.fused()
        with self._session(differentiable=kind.backward, fused=fused, hooks=copies.hooks()):
            with torch.no_grad():  # the inputs, then the baseline where asked
                if method.baseline_score:
                    copies.blend(torch.tensor([1.0, 0.0])[:, None, None])
                    ends = plan.copy_forward(2)
                    columns = plan.columns(ends[:batch].clone())
                    method.start(columns.scores, plan.copy_columns(ends[batch:], columns, 1))
                    del ends
                else:
                    copies.blend(torch.ones(1, 1, 1))
                    columns = plan.columns(plan.copy_forward(1))
                    method.start(columns.scores, None)
            per_copy = self._copy_bytes(copies, fused, gradients=kind.backward)
            for chunk in copy_chunks(method.count, per_copy, self.memory_budget):
                copies.blend(method.weights(chunk), method.shift(chunk, copies.inputs))
                scores = plan.copy_columns(plan.copy_forward(len(chunk)), columns, len(chunk))
                if not kind.backward:
                    method.add(chunk, slice(None), scores, None)
                    continue
                _require_embedding_gradients(scores)
                for part, (gradients,) in column_gradients(
                    scores, [copies.leaf], self.memory_budget
                ):
                    method.add(chunk, slice(part.start, part.stop), scores, gradients)
        relevance, recorded = method.finish(copies)
        self._recorded = {
            name: _as_target(value, columns) if isinstance(value, Tensor) else value
            for name, value in recorded.items()
        }
        fold.add_input(slice(None), relevance)
        return columns, plan.read(fold)


def _as_target(values: Tensor, columns: Columns) -> list[Any]:
    """(B, K) per-column values as lists shaped like the call's target: (B,) for one
    column per input, (B, K) otherwise."""
    values = values.detach().double().cpu()
    return (values[:, 0] if columns.classes.dim() == 1 else values).tolist()


PASSES: tuple[type[Pass], ...] = (
    LrpWalkPass,
    EmbeddingGradientPass,
    EmbeddingCopiesPass,
    AttentionGradientPass,
    ForwardPass,
)
"""Every pass, in the order a method's needs choose one (`pass_for`)."""


def pass_for(spec: Method) -> type[Pass]:
    """The pass that runs `spec`: the first in `PASSES` providing one of its needs; the
    forward pass for a method that needs nothing from the model beyond its output."""
    for kind in PASSES:
        if kind.provides & spec.needs:
            return kind
    return ForwardPass
