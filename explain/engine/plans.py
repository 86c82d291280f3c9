"""Plans: how each kind of model maps a request onto the engine's one run loop.

A plan answers, for one kind of model (`Adapter.token_sets`), the questions the loop asks:
which inputs the recorded forward runs on, which methods the kind supports, which score
columns one forward yields (one per explained target), which sink receives one column's
blocks, and how the columns' results become one relevance per token set. The loop itself
(explain.engine.run) never asks what kind of model it runs.

- `OneStack`: one token sequence. Column k is target k of every sample; sinks are the
  method's, over the set's blocks.
- `DualEncoderPlan` (CLIP): every explained (image, text) pair is run as its own sample,
  so two images explained against the same text never share a gradient; the single
  column is each pair's similarity logit. Each tower gets the method on its own.
- `EncoderDecoderPlan`: column p is the token predicted at decoder position p (option
  `position`); the sink is the two-set fold of explain.rules.coattention.
- `GenerationPlan` (a decoder-only language model's generation, `Request.prompt_length`):
  column g is the token generated at P + g, read out at P + g - 1 over the tokens up to
  there; each column has its own sink, also for the forward-only methods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, Protocol, Union, cast

import torch
from torch import Tensor

from explain.architectures.base import Adapter, LanguageModel, Prepared, TokenSet, TokenSets
from explain.architectures.dual_encoder import DualEncoder
from explain.engine.request import Request, StartLayer
from explain.errors import (
    ExplainError,
    InputError,
    OptionError,
    TargetError,
    UnsupportedModelError,
)
from explain.recorder import Recorder
from explain.rules import LRP_NEEDS, METHODS, Method, Need, RuleContext, Sink
from explain.rules.coattention import BlockRole, TwoSetFold
from explain.rules.registry import integer_option
from explain.targets import (
    Score,
    Target,
    check_score,
    require_explicit_target,
    resolve_targets,
    select_scores,
)

__all__ = [
    "ColumnSink",
    "Columns",
    "DualEncoderPlan",
    "EncoderDecoderPlan",
    "GenerationPlan",
    "OneStack",
    "Plan",
    "Position",
    "SetSinks",
    "check_tokenizer",
    "plan_for",
    "require_causal_lm",
    "resolve_score",
    "resolve_start_layer",
    "supported_methods",
]

Position = Union[None, int, Sequence[int], Tensor, Literal["all"]]
"""Which decoder position an encoder-decoder explanation reads out (it explains the token
predicted there, the next one): None = each sample's last real position, an int or B
ints, or "all": every token of the decoder sequence after the start token, column j
explaining token j + 1 from position j (by default as the target: the sequence's own
tokens, which for a generated sequence are the tokens the model chose)."""


@dataclass(frozen=True)
class Columns:
    """What one forward pass explains: `scores` (B, K), column k differentiated (summed
    over the batch) for target k; `classes` (B,) or (B, K), -1 where a callable chose the
    score; `logits` for `Explanation.logits`; `custom` when a callable chose the scores."""

    scores: Tensor
    classes: Tensor
    logits: Tensor
    custom: bool = False


class ColumnSink(Protocol):
    """What receives one column's blocks: a `SetSinks`, or a two-set fold."""

    layers: Sequence[int]

    def add(self, layer: int, attention: Tensor, gradient: Tensor | None) -> None: ...

    def result(self) -> Any: ...


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
    """The score a call explains. Only the methods that differentiate a score (those that
    need attention gradients) and `trace` take one; None there is `default`. The others
    take none, as a method reading one fixed block takes no start_layer: a class-agnostic
    map is the same for every score, and an LRP walk starts from the target's logit, so
    a score given to them is refused, and they are recorded as explaining the logit."""
    if spec is not None and not spec.needs_gradients:
        if score is not None:
            what = (
                "propagates relevance from the target's logit"
                if spec.class_specific
                else "gives one map whatever the target"
            )
            takers = ", ".join(name for name, m in sorted(METHODS.items()) if m.needs_gradients)
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


def _custom_scores(score: Score | None) -> None:
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
        """(the set's model-wide layers, its sink) per token set, in order: the streamed
        fold (explain.engine.stream) stacks the columns' sinks set by set."""
        return [(token_set.layers, self._sinks[token_set.name]) for token_set in self._sets]

    def add_input(self, relevance: Tensor) -> None:
        """The input relevance of full LRP (one-stack models: one sink)."""
        (sink,) = self._sinks.values()
        sink.add_input(relevance)  # type: ignore[attr-defined]  # an InputSink (Need)

    def result(self) -> dict[str, Tensor]:
        return {name: sink.result() for name, sink in self._sinks.items()}


def _per_set(start_layer: StartLayer, names: Sequence[str]) -> dict[str, Any]:
    if isinstance(start_layer, Mapping):
        unknown = set(start_layer) - set(names)
        if unknown:
            raise OptionError(
                f"start_layer names unknown token sets (towers) {sorted(unknown)}; the "
                "sets are " + ", ".join(names)
            )
        return {name: start_layer.get(name) for name in names}
    return dict.fromkeys(names, start_layer)


def _no_class(batch: int, device: torch.device) -> Tensor:
    """Target placeholder (-1) when a callable chose the scores directly."""
    return torch.full((batch,), -1, dtype=torch.long, device=device)


class Plan:
    """The plan of a single-stack model, and the base of the others (module docstring).

    Args:
        adapter: the model's adapter.
        spec: the method, or None for a trace.
        request: the call's request.
        tokenizer: the Explainer's tokenizer, for raw texts and `Explanation.tokens`.
    """

    refusal: ClassVar[type[ExplainError]] = UnsupportedModelError
    """The error that refuses a method the plan does not support: on one stack the family
    lacks a capability; the two-set kinds refuse by design (an option)."""

    trace_score: ClassVar[Score] = "probability"
    """The score `trace` differentiates when none is given."""

    def __init__(
        self, adapter: Adapter, spec: Method | None, request: Request, tokenizer: Any
    ) -> None:
        self.adapter = adapter
        self.spec = spec
        self.request = request
        self.tokenizer = tokenizer
        if spec is not None and not self.supports(adapter, spec):
            raise self.refusal(
                f"method {spec.name!r} is not available for {adapter.family}: "
                f"{self.why_not(spec)}; supported methods: " + ", ".join(self.methods(adapter))
            )
        default = "logit" if spec is not None else self.trace_score
        self.score: Score = resolve_score(spec, request.score, default)
        self.prepared: Prepared
        self.sets: Sequence[TokenSet]

    # -- what the kind supports ---------------------------------------------------------

    @classmethod
    def supports(cls, adapter: Adapter, spec: Method) -> bool:
        """Whether the method can run on this adapter (LRP needs the family's walk, AttnLRP
        and CP-LRP where their rules attach)."""
        if Need.EMBEDDING_GRADIENTS in spec.needs:
            return adapter.rule_sites is not None
        return not (spec.needs & LRP_NEEDS) or adapter.lrp_walk is not None

    @classmethod
    def why_not(cls, spec: Method) -> str:
        if Need.EMBEDDING_GRADIENTS in spec.needs:
            return "its family does not say where the rules of AttnLRP and CP-LRP attach"
        return "the LRP methods need relevance rules for the family's modules, which it lacks"

    @classmethod
    def methods(cls, adapter: Adapter) -> list[str]:
        """The names of the methods this plan can run on `adapter`."""
        return [name for name, spec in sorted(METHODS.items()) if cls.supports(adapter, spec)]

    # -- inputs -------------------------------------------------------------------------

    def prepare(self, inputs: Any) -> None:
        """Validate the inputs (raw texts tokenized with the Explainer's tokenizer)."""
        self._use(self.adapter.prepare(self.adapter.encode(inputs, self.tokenizer)))
        class_specific = self.spec is None or self.spec.class_specific
        require_explicit_target(self.request.target, self.adapter.feature_output, class_specific)

    def _use(self, prepared: Prepared) -> None:
        self.prepared = prepared
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
        starts = _per_set(self.request.start_layer, [s.name for s in sets])
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

    # -- scores -------------------------------------------------------------------------

    def columns(self, output: Tensor) -> Columns:
        """The score columns of the model output (B, C): one per target."""
        classes, custom = resolve_targets(output, self.request.target)
        if classes is None:
            assert custom is not None
            _custom_scores(self.request.score)
            return Columns(
                custom[:, None], _no_class(output.shape[0], output.device), output, custom=True
            )
        index = classes if classes.dim() == 2 else classes[:, None]
        return Columns(select_scores(output, index, self.score), classes, output)

    def finish(self, per_column: list[dict[str, Tensor]], columns: Columns) -> dict[str, Tensor]:
        """The relevance per set from the columns' (each (B, ...) on the input): (B, ...),
        or (B, K, ...) with K targets per input."""
        if columns.classes.dim() == 1:
            return per_column[0]
        return {name: torch.stack([c[name] for c in per_column], dim=1) for name in per_column[0]}

    def tokens(self) -> list[list[str]] | None:
        """`Explanation.tokens`: the token strings of the explained texts."""
        if self.tokenizer is None:
            return None
        return self.adapter.token_strings(self.prepared, self.tokenizer)


OneStack = Plan
"""A single-stack model's plan is the base plan."""


class DualEncoderPlan(Plan):
    """Image and text relevance for the similarity of each image with its text.

    The target chooses texts: None pairs image i with text i when there are as many texts
    as images, and otherwise explains each image's best-matching text (zero-shot
    classification over prompts); an int, B ints, a (B, K) tensor (K texts per image: the
    relevances get a K axis) or a callable on the (images, texts) similarity logits
    choose others. The score is the similarity logit.
    """

    refusal = OptionError
    trace_score = "logit"

    def __init__(self, adapter: Adapter, spec: Method | None, request: Request, tokenizer: Any):
        super().__init__(adapter, spec, request, tokenizer)
        self.encoder = cast(DualEncoder, adapter)
        if self.score != "logit":
            raise TargetError(
                f"a dual encoder explains the similarity logit (score='logit'); got {self.score!r}"
            )
        self._logits: Tensor | None = None
        self._classes: Tensor | None = None

    @classmethod
    def supports(cls, adapter: Adapter, spec: Method) -> bool:
        return not spec.needs & (LRP_NEEDS | {Need.EMBEDDING_GRADIENTS})

    @classmethod
    def why_not(cls, spec: Method) -> str:
        return (
            "the LRP methods (AttnLRP and CP-LRP too) need relevance rules through the "
            "similarity of two towers, which explain does not have"
        )

    def choose_inputs(self) -> None:
        prepared, encoder = self.prepared, self.encoder
        num_images = prepared.batch_size
        if self.request.target is None and encoder.num_texts(prepared) == num_images:
            classes = torch.arange(num_images, device=encoder.parameter.device)
        else:
            with Recorder(encoder, differentiable=False):
                self._logits = encoder.forward(prepared)
            chosen, _ = resolve_targets(self._logits, self.request.target)
            if chosen is None:
                raise TargetError(
                    "a dual encoder's target chooses texts: a callable must return text indices"
                )
            classes = chosen
        self._classes = classes
        columns = classes if classes.dim() == 2 else classes[:, None]
        images = torch.arange(num_images, device=columns.device).repeat_interleave(columns.shape[1])
        self._use(encoder.pair(prepared, images, columns.reshape(-1)))

    def columns(self, output: Tensor) -> Columns:
        assert self._classes is not None
        # Without a first forward the pairs were the inputs as given: their logits are
        # the model's.
        logits = output if self._logits is None else self._logits
        return Columns(output.diagonal()[:, None], self._classes.to(logits.device), logits)

    def finish(self, per_column: list[dict[str, Tensor]], columns: Columns) -> dict[str, Tensor]:
        (result,) = per_column
        if columns.classes.dim() == 1:
            return result
        batch, count = columns.classes.shape
        return {name: r.reshape(batch, count, *r.shape[1:]) for name, r in result.items()}

    def tokens(self) -> list[list[str]] | None:
        """The tokens of each image's text (none with several texts per image)."""
        if self._classes is None or self._classes.dim() == 2:
            return None
        return super().tokens()


class EncoderDecoderPlan(Plan):
    """Source and target relevance of the token predicted at a decoder position.

    One forward; one backward per explained position (batched over positions), each
    folded with the encoder-decoder rules (explain.rules.coattention) over every block,
    and read out at the position: relevances["source"] = R_qi[p] over the encoder tokens
    (or the image patch grid), relevances["target"] = R_qq[p] over the decoder tokens.
    Options: `position` (see `Position`). The target is a token id: None = the predicted
    token (for position="all": the sequence's own next tokens), an int, B ints, a (B, P)
    tensor with position="all", or a callable on the (B, vocabulary) logits.
    """

    refusal = OptionError

    def __init__(self, adapter: Adapter, spec: Method | None, request: Request, tokenizer: Any):
        super().__init__(adapter, spec, request, tokenizer)
        options = dict(request.options)
        self.position: Position = options.pop("position", None)
        if options:
            raise OptionError(
                f"encoder-decoders take only the option 'position'; got {sorted(options)}"
            )
        if request.start_layer is not None:
            raise OptionError(
                "encoder-decoder relevance aggregates over every block: no start_layer"
            )
        self._every = isinstance(self.position, str)
        self._target: Target = request.target

    @classmethod
    def supports(cls, adapter: Adapter, spec: Method) -> bool:
        return spec.name == "generic"

    @classmethod
    def why_not(cls, spec: Method) -> str:
        return "encoder-decoders are explained with the generic rule in its two-token-set form"

    def prepare(self, inputs: Any) -> None:
        super().prepare(inputs)
        arguments = self.prepared.arguments
        decoder_ids = arguments["decoder_input_ids"]
        lengths = arguments["decoder_attention_mask"].sum(dim=1)
        self.positions, self.valid = _decoder_positions(self.position, lengths)
        target = self.request.target
        if self._every and target is None:
            target = decoder_ids.gather(1, self.positions + 1)
        elif self._every and not callable(target):
            target = torch.as_tensor(target, device=decoder_ids.device)
            if target.dim() == 0:
                target = target.expand_as(self.positions)
            if target.shape != self.positions.shape:
                raise TargetError(
                    f"with position='all' give one target token per sample and position, "
                    f"shape {tuple(self.positions.shape)}; got {tuple(target.shape)}"
                )
        if self._every and isinstance(target, Tensor):  # past a sequence's end: nothing
            target = target.masked_fill(~self.valid, 0)
        self._target = target

    def sink(self, column: int = 0) -> TwoSetFold:
        """The two-set fold over every block; each column reads it at its own position."""
        roles = [
            BlockRole(site.layer, "i" if site.stack == "source" else "q", site.kind)
            for site in self.adapter.attention_sites()
        ]
        source, target = self.sets
        return TwoSetFold(roles, target.layout.num_tokens, source.layout.num_tokens)

    def read(self, column: int, sink: ColumnSink) -> dict[str, Tensor]:
        state = sink.result()
        at = self.positions[:, column]
        rows = torch.arange(at.shape[0], device=at.device)
        return {"source": state.qi[rows, at], "target": state.qq[rows, at]}

    def columns(self, output: Tensor) -> Columns:
        rows = torch.arange(output.shape[0], device=self.positions.device)
        scores, classes, logits = [], [], []
        for column in range(self.positions.shape[1]):
            at = self.positions[:, column]
            column_logits = output[rows, at]
            target = self._target
            chosen = target[:, column] if self._every and isinstance(target, Tensor) else target
            found, custom = resolve_targets(column_logits, chosen)
            if found is not None and found.dim() == 2:
                raise TargetError("one target token per explained position; got a (B, K) target")
            if found is None:
                assert custom is not None
                _custom_scores(self.request.score)
                scores.append(custom)
                classes.append(torch.full_like(at, -1))
            else:
                scores.append(select_scores(column_logits, found, self.score))
                classes.append(found.to(at.device))
            logits.append(column_logits)
        explained = torch.stack(classes, dim=1).masked_fill(~self.valid, -1)
        stacked = torch.stack(logits, dim=1)
        if not self._every:  # one position: no position axis
            explained, stacked = explained[:, 0], stacked[:, 0]
        return Columns(torch.stack(scores, dim=1), explained, stacked, custom=classes[0][0] < 0)

    def finish(self, per_column: list[dict[str, Tensor]], columns: Columns) -> dict[str, Tensor]:
        result = {}
        for name in ("source", "target"):
            stacked = torch.stack([c[name] for c in per_column], dim=1)
            keep = self.valid.reshape(*self.valid.shape, *(1,) * (stacked.dim() - 2))
            result[name] = stacked * keep.to(stacked.dtype)  # past a sequence's end: 0
        if not self._every:
            result = {name: r[:, 0] for name, r in result.items()}
        return result


def require_causal_lm(adapter: Adapter) -> LanguageModel:
    """`adapter` as a decoder-only language model's: only those generate text."""
    if not isinstance(adapter, LanguageModel):
        raise OptionError(
            "generations are explained for decoder-only language models; "
            f"{type(adapter.model).__name__} is a {adapter.family} model"
        )
    return adapter


class GenerationPlan(Plan):
    """Every generated token of a decoder-only language model, over the tokens before it.

    The inputs are left-padded prompts of width P (`Request.prompt_length`) followed by
    their continuations, the attention mask 0 past each continuation's end. One forward
    over the whole sequences; column g explains the token generated at P + g, read out at
    P + g - 1 with the tokens after that position hidden from its sink (`sink(g)`), which
    is exactly a next-token explanation of the prefix before the token (methods that
    average over the keys need the hiding). The gradient methods differentiate every
    column in one batched backward; the forward-only methods fill one sink per column
    from the same forward. The relevance is (B, G, T), 0 on the columns past a
    continuation's end; the target, the generated tokens (-1 past the end), is implied.
    """

    refusal = OptionError

    def __init__(self, adapter: Adapter, spec: Method | None, request: Request, tokenizer: Any):
        self.lm = require_causal_lm(adapter)
        if spec is None:
            raise OptionError(
                "trace() follows one score per input; a generation has one per generated "
                "token: trace a prefix of it with its next token as the target"
            )
        super().__init__(adapter, spec, request, tokenizer)
        if request.target is not None:
            raise OptionError(
                "a generation explains the tokens it generated, so it takes no target; "
                "leave target unset (or explain a prefix with Explainer.explain)"
            )

    @classmethod
    def supports(cls, adapter: Adapter, spec: Method) -> bool:
        return not spec.needs & LRP_NEEDS

    @classmethod
    def why_not(cls, spec: Method) -> str:
        return (
            "a generation is explained at every generated position from one forward, and an "
            "LRP walk propagates one position's logit per pass"
        )

    def prepare(self, inputs: Any) -> None:
        super().prepare(inputs)
        mask = self.prepared.arguments["attention_mask"]
        width = integer_option("prompt_length", self.request.prompt_length)
        if not 0 < width < mask.shape[1]:
            raise InputError(
                f"prompt_length {width} leaves no prompt or no generated token in sequences "
                f"of {mask.shape[1]} tokens; it is the padded prompts' width"
            )
        self.width = width
        self.valid = mask[:, width:].bool()  # (B, G): a real generated token
        self.positions = torch.arange(self.valid.shape[1], device=mask.device) + width - 1

    def forward(self) -> Tensor:
        """(B, G, vocab): the logits each generated token was chosen from."""
        return self.lm.logits_at(self.prepared, self.positions.expand(self.valid.shape[0], -1))

    def sink(self, column: int = 0) -> ColumnSink:
        """Column `column`'s sink: read out at its position, blind to the tokens after it."""
        return self._column_sinks(range(column, column + 1))[0]

    def column_sinks(self, count: int) -> list[ColumnSink]:
        return self._column_sinks(range(count))

    def forward_sinks(self) -> list[ColumnSink]:
        """One sink per generated position: each reads out at its own row."""
        return self.column_sinks(len(self.positions))

    def _column_sinks(self, columns: range) -> list[ColumnSink]:
        """The sinks of `columns`, their readout rows and token masks made at once (a
        generation's cost must not grow with its tokens beyond its batched backward)."""
        (text,) = self.sets
        layout = text.layout
        assert layout.token_mask is not None  # a text layout masks its pads
        at = self.positions[columns.start : columns.stop]
        batch = self.prepared.batch_size
        readouts = self.lm.readout_at(self.prepared, at.expand(batch, -1)).transpose(0, 1)
        tokens = torch.arange(layout.token_mask.shape[1], device=at.device)
        seen = layout.token_mask[None] & (tokens <= at[:, None])[:, None, :]  # (P, B, T)
        return [
            self._set_sinks(
                [replace(text, readout=readout, layout=replace(layout, token_mask=mask))]
            )
            for readout, mask in zip(readouts.unbind(), seen.unbind(), strict=True)
        ]

    def columns(self, output: Tensor) -> Columns:
        batch, count = self.valid.shape
        generated = self.prepared.arguments["input_ids"][:, self.width :]
        scores = select_scores(output.flatten(0, 1), generated.flatten(), self.score)
        # Past a continuation's end there is nothing to explain: no gradient flows there.
        scores = scores.reshape(batch, count) * self.valid
        return Columns(scores, generated.masked_fill(~self.valid, -1), output)

    def finish(self, per_column: list[dict[str, Tensor]], columns: Columns) -> dict[str, Tensor]:
        keep = self.valid[..., None].to(per_column[0]["text"].dtype)
        return {
            name: torch.stack([c[name] for c in per_column], dim=1) * keep for name in per_column[0]
        }


def _decoder_positions(position: Position, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """(B, P) explained positions and (B, P) validity from each sample's decoder length."""
    batch = lengths.shape[0]
    if isinstance(position, str):
        if position != "all":
            raise OptionError(f"position must be an int, B ints, None or 'all'; got {position!r}")
        width = int(lengths.max()) - 1
        if width < 1:
            raise InputError("position='all' needs decoder sequences of at least two tokens")
        columns = torch.arange(width, device=lengths.device).expand(batch, width)
        valid = columns < (lengths - 1)[:, None]
        return torch.minimum(columns, (lengths - 1)[:, None]), valid
    if position is None:
        positions = lengths - 1
    else:
        if isinstance(position, bool):
            raise OptionError("position must be an int, B ints, None or 'all', not a bool")
        try:
            positions = torch.as_tensor(position, device=lengths.device).long().expand(batch)
        except (TypeError, ValueError, RuntimeError):
            raise OptionError(
                f"position must be an int, B = {batch} ints, None or 'all'; got {position!r}"
            ) from None
        positions = torch.where(positions < 0, positions + lengths, positions)
        if bool(((positions < 0) | (positions >= lengths)).any()):
            raise OptionError(
                f"position {position!r} is outside a decoder sequence (real lengths "
                f"{lengths.tolist()}); negative positions count from each sequence's end"
            )
    return positions[:, None], torch.ones(batch, 1, dtype=torch.bool, device=lengths.device)


PLANS: dict[TokenSets | None, type[Plan]] = {
    None: OneStack,
    TokenSets.DUAL_ENCODER: DualEncoderPlan,
    TokenSets.ENCODER_DECODER: EncoderDecoderPlan,
}
"""The plan of each kind of model (`Adapter.token_sets`)."""


def supported_methods(adapter: Adapter) -> list[str]:
    """The names of the methods that `adapter`'s model can be explained with."""
    return PLANS[adapter.token_sets].methods(adapter)


def plan_for(adapter: Adapter, spec: Method | None, request: Request, tokenizer: Any) -> Plan:
    """The plan for `adapter`'s kind of model (for a generation, when the request has a
    `prompt_length`), with the request's method and options checked against it."""
    kind = PLANS[adapter.token_sets] if request.prompt_length is None else GenerationPlan
    return kind(adapter, spec, request, tokenizer)
