"""The one run loop: a request and the adapter's plan -> an `Explanation` or a `Trace`.

Every model kind (explain.engine.plans) and every method goes through `explain`; `trace`
shares its plan, so it resolves inputs and targets exactly as `explain` does. What a
method needs (`Need`) chooses the pass through the model:

- attention only (or nothing): one forward under no_grad, no backward; a class-agnostic
  map serves every target of an input (a generation's columns read out at different
  positions: each has its own sink, all filled from the same forward);
- attention gradients: one forward, then the backward of every score column, all
  columns in one vectorised backward, chunked to the memory budget
  (`Recorder.backward_batched`), each column into its own sink;

where every column's sink folds by spreads (generic, rollout), the columns are folded
together block by block (explain.engine.spread), on the fused path from q, k, v and dO
without N x N maps ("streamed"). The path (`choose_path`: the device, the memory budget,
the length) is recorded in `Explanation.settings`;
- LRP relevance: one forward that records the family's walk (`Adapter.lrp_walk`), the
  gradients as above when the method weights by them (kept per column until that
  column's walk has used them), then the walk once per column (a walk propagates one
  class per sample);
- embedding gradients (AttnLRP, CP-LRP): one forward under the method's gradient rules
  (explain.lrp.attnlrp, hooked where the family's `Adapter.rule_sites` say), then one
  backward per column to the embeddings: Gradient x Input per token.

Several targets per input are therefore always score columns of one forward; a dual
encoder turns each explained (image, text) pair into a sample instead (its plan), so it
has one column; a generation's columns are its generated positions.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from explain.architectures.base import Adapter
from explain.engine.plans import Columns, Plan, plan_for
from explain.engine.request import Request
from explain.engine.spread import SpreadFold
from explain.errors import OptionError, TargetError
from explain.explanation import Explanation, Trace
from explain.fused import PathChoice, choose_path, default_memory_budget
from explain.lrp import RULE_SETS, tape_for
from explain.lrp.attnlrp import RuleCall, rule_hooks
from explain.lrp.attnlrp_sites import rule_sites
from explain.recorder import Recorder
from explain.rules import LRP_NEEDS, Method, Need, get_method

__all__ = ["explain", "trace"]


def explain(adapter: Adapter, inputs: Any, request: Request, tokenizer: Any = None) -> Explanation:
    """Relevance of every input element for the request's targets (see `Explainer.explain`)."""
    assert request.method is not None
    spec = get_method(request.method)
    plan = plan_for(adapter, spec, request, tokenizer)
    plan.prepare(inputs)
    plan.sink()  # bad options and start layers fail before any model work
    plan.choose_inputs()
    budget = _memory_budget(adapter, request)
    path = _path(adapter, spec, plan, request, budget)
    fused = path == "fused"
    streamed = False
    if spec.needs & LRP_NEEDS:
        columns, per_column, mapped = _lrp_pass(adapter, spec, plan)
    elif Need.EMBEDDING_GRADIENTS in spec.needs:
        columns, per_column, mapped = (*_embedding_gradient_pass(adapter, spec, plan, fused), False)
    elif Need.ATTENTION_GRADIENTS in spec.needs:
        columns, per_column, streamed = _gradient_pass(adapter, plan, fused, budget)
        mapped = False
    else:
        columns, per_column, streamed = _forward_pass(adapter, plan, fused, budget)
        mapped = False
    layouts = {token_set.name: token_set.layout for token_set in plan.sets}
    if not mapped:  # onto the input (patch grids, text with pads 0), all columns at once
        mapped_sets = {
            name: adapter.to_input_space(
                torch.stack([column[name] for column in per_column], dim=1), layout
            ).unbind(dim=1)
            for name, layout in layouts.items()
        }
        per_column = [
            {name: mapped_sets[name][k] for name in per_column[k]} for k in range(len(per_column))
        ]
    relevances = {name: r.detach() for name, r in plan.finish(per_column, columns).items()}
    first = plan.sets[0]
    return Explanation(
        relevance=relevances[first.name],
        logits=columns.logits.detach(),
        target=columns.classes,
        method=spec.name,
        score="custom" if columns.custom else plan.score,
        input_size=first.layout.input_size,
        relevances=relevances,
        tokens=plan.tokens(),
        settings={"attention_path": "streamed" if streamed else path, "memory_budget": budget},
    )


def trace(adapter: Adapter, inputs: Any, request: Request, tokenizer: Any = None) -> Trace:
    """Every block's attention and hidden states with their gradients for the score of
    the request's target (see `Explainer.trace`)."""
    plan = plan_for(adapter, None, request, tokenizer)
    plan.prepare(inputs)
    plan.choose_inputs()
    fused = (
        choose_path(
            adapter,
            plan.prepared.layout,
            batch=plan.prepared.batch_size,
            needs_gradients=True,
            requested=request.attention_path,
            memory_budget=_memory_budget(adapter, request),
        )
        == "fused"
    )
    num_layers = adapter.num_layers
    attentions: dict[int, Tensor] = {}
    with Recorder(adapter, track=range(num_layers), hidden_states=True, fused=fused) as recorder:
        columns = plan.columns(plan.forward())
        if columns.scores.shape[1] != 1 or columns.classes.dim() != 1:
            raise TargetError("trace() explains one class per input; pass a (B,) target")
        recorder.backward(
            columns.scores[:, 0].sum(),
            lambda layer, attention, grad: attentions.__setitem__(layer, attention),
            keep_gradients=True,
        )
        hidden = recorder.hidden_states
        return Trace(
            attentions=tuple(attentions[i].detach() for i in range(num_layers)),
            attention_grads=tuple(recorder.attention_grads[i] for i in range(num_layers)),
            hidden_states=tuple(h.detach() for h in hidden),
            hidden_state_grads=tuple(
                recorder.hidden_state_grads.get(i, torch.zeros_like(h))
                for i, h in enumerate(hidden)
            ),
            logits=columns.logits.detach(),
            target=columns.classes,
            score="custom" if columns.custom else plan.score,
        )


def _memory_budget(adapter: Adapter, request: Request) -> int:
    """The call's memory budget in bytes: the request's, or the device's default."""
    if request.memory_budget is not None:
        return request.memory_budget
    return default_memory_budget(adapter.parameter.device)


def _path(adapter: Adapter, spec: Method, plan: Plan, request: Request, budget: int) -> PathChoice:
    """The attention path of the call. The LRP walks read each block's attention
    probabilities as the explicit path computes them: they refuse "fused"."""
    if spec.needs & LRP_NEEDS:
        if request.attention_path == "fused":
            raise OptionError(
                f"method {spec.name!r} propagates relevance through the explicit attention "
                "path, not the fused kernel; use attention_path='auto' or 'explicit'"
            )
        return "explicit"
    return choose_path(
        adapter,
        plan.prepared.layout,
        batch=plan.prepared.batch_size,
        needs_gradients=spec.needs_gradients,
        requested=request.attention_path,
        memory_budget=budget,
        reads_attention=bool(spec.needs & {Need.ATTENTION, Need.ATTENTION_GRADIENTS}),
    )


PerColumn = list[dict[str, Tensor]]


def _forward_pass(
    adapter: Adapter, plan: Plan, fused: bool, budget: int
) -> tuple[Columns, PerColumn, bool]:
    """Class-agnostic methods: one forward under no_grad, no backward at all; one map
    serves every target, unless the plan gives each column its own sink. Returns also
    whether the blocks were streamed (folded from q and k after the forward)."""
    sinks = plan.forward_sinks()
    spread = SpreadFold.of(sinks, budget)
    stream = fused and spread is not None

    def add(layer: int, attention: Tensor) -> None:
        if spread is not None:
            spread.keep(layer, attention)
            return
        for sink in sinks:
            sink.add(layer, attention, None)

    with Recorder(
        adapter, on_attention=add, differentiable=False, fused=fused, stream_forward=stream
    ) as recorder:
        columns = plan.columns(plan.forward())
        if spread is not None and stream:
            recorder.stream_attention(spread.add)
    if spread is not None:
        spread.fold_kept()
        spread.finish()
    results = [plan.read(k, sink) for k, sink in enumerate(sinks)]
    return columns, results if len(sinks) > 1 else results * columns.scores.shape[1], stream


def _gradient_pass(
    adapter: Adapter, plan: Plan, fused: bool, budget: int
) -> tuple[Columns, PerColumn, bool]:
    """One forward, then one backward of every score column (vectorised over columns,
    chunked to the memory budget), folding blocks as their gradients arrive: all columns
    at once where their sinks fold by spreads (explain.engine.spread), each column into
    its own sink otherwise. Returns also whether the fused path streamed the blocks."""
    first = plan.sink()
    with Recorder(adapter, track=first.layers, fused=fused) as recorder:
        columns = plan.columns(plan.forward())
        count = columns.scores.shape[1]
        sinks = [first, *plan.column_sinks(count)[1:]] if count > 1 else [first]
        spread = SpreadFold.of(sinks, budget)
        on_block = None if spread is None else spread.add
        if count == 1:
            recorder.backward(columns.scores[:, 0].sum(), first.add, on_block=on_block)
        else:
            recorder.backward_batched(
                columns.scores,
                lambda k, layer, attention, grad: sinks[k].add(layer, attention, grad),
                max_bytes=budget,
                on_block=on_block,
            )
    if spread is not None:
        spread.finish()
    return columns, [plan.read(k, sink) for k, sink in enumerate(sinks)], fused and bool(spread)


def _lrp_pass(adapter: Adapter, spec: Method, plan: Plan) -> tuple[Columns, PerColumn, bool]:
    """The LRP methods: a recorded forward, the gradients the method weights by (batched
    over columns as above), then the family's walk from each column's class logit.
    Returns also whether the walk's result is already in input space (pixels)."""
    assert spec.lrp_rules is not None
    rules = RULE_SETS[spec.lrp_rules]
    to_input = Need.INPUT_RELEVANCE in spec.needs
    walk = tape_for(adapter, to_input=to_input)
    first = plan.sink()
    track = first.layers if spec.needs_gradients else range(0)
    stop_layer = 0 if to_input or not first.layers else first.layers[0]
    with Recorder(
        adapter, track=track, differentiable=bool(track), module_hooks=walk.hooks
    ) as recorder:
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
        per_column = []
        for k in range(count):
            sink = first if k == 0 else plan.sink(k)

            def deliver(layer: int, relevance: Tensor, sink: Any = sink, k: int = k) -> None:
                if layer in sink.layers:
                    sink.add(layer, relevance, gradients[k].pop(layer, None))

            below = walk.propagate(
                classes[:, k], rules, deliver, stop_layer=stop_layer, to_input=to_input
            )
            if to_input:
                sink.add_input(below)
            per_column.append(plan.read(k, sink))
    return columns, per_column, to_input and walk.in_input_space


def _embedding_gradient_pass(
    adapter: Adapter, spec: Method, plan: Plan, fused: bool
) -> tuple[Columns, PerColumn]:
    """AttnLRP and CP-LRP: one forward with the method's gradient rules hooked on the
    model's modules for the call, whose word- or patch-embedding output is the graph's
    leaf; then one backward of every column to it, vectorised over the columns (a
    generation's tokens, several classes), embedding x gradient summed over the hidden
    size. The rules hold on either attention path."""
    assert spec.gradient_rules is not None
    call = RuleCall()
    hooks = rule_hooks(adapter.model, rule_sites(adapter), spec.gradient_rules, call)  # type: ignore[arg-type]
    with Recorder(adapter, module_hooks=hooks, leaf_at_blocks=False, fused=fused):
        columns = plan.columns(plan.forward())
        scores = columns.scores
        count = scores.shape[1]
        if count == 1:
            gradients = torch.autograd.grad(scores[:, 0].sum(), call.tensor)[0][None]
        else:
            one_hot = torch.eye(count, dtype=scores.dtype, device=scores.device)[:, None, :]
            (gradients,) = torch.autograd.grad(
                scores,
                call.tensor,
                grad_outputs=one_hot.expand(count, *scores.shape),
                is_grads_batched=True,
            )
        relevances = call.relevance(gradients, plan.prepared.layout).unbind()
        per_column = []
        for k, sink in enumerate(plan.column_sinks(count)):
            sink.add_input(relevances[k])
            per_column.append(plan.read(k, sink))
    return columns, per_column
