"""The one run loop: a request and the adapter's plan -> an `Explanation` or a `Trace`.

Every model kind (explain.engine.plans) and every method goes through `explain`; `trace`
shares its plan, so it resolves inputs and targets exactly as `explain` does. Before any
forward, `check` follows the chain method -> pass -> plan -> adapter once: the method's
needs choose its pass (explain.engine.passes), the model's plan must accept that pass
(and, where the plan's fold is its own, the method), and the adapter must provide what
the pass needs. A missing link is refused with an error that names it. The pass then runs
the model through the plan, and the plan turns the columns' results into the relevances.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from explain.architectures.base import Adapter
from explain.engine.fused import choose_path, default_memory_budget
from explain.engine.passes import Pass, pass_for
from explain.engine.plans import Plan, plan_kind
from explain.engine.recorder import Recorder
from explain.engine.session import Session
from explain.engine.targets import Request
from explain.errors import TargetError, UnsupportedModelError
from explain.explanation import Explanation, Trace
from explain.rules.registry import METHODS, Method, get_method

__all__ = ["check", "explain", "refusals", "require_methods", "supported_methods", "trace"]


def _missing_link(
    spec: Method, kind: type[Plan], adapter: Adapter | type[Adapter]
) -> Exception | None:
    """The error for the first missing link of method -> pass -> plan -> adapter, or None."""
    chosen = pass_for(spec)
    if chosen not in kind.passes or (kind.methods is not None and spec.name not in kind.methods):
        return kind.refusal(kind.refused_because)
    if adapter.methods is not None and spec.name not in adapter.methods:
        return UnsupportedModelError("its attention is windowed, which not every rule folds")
    missing = chosen.missing(adapter)
    if missing is not None:
        return UnsupportedModelError(missing)
    return None


def check(spec: Method, kind: type[Plan], adapter: Adapter, request: Request) -> type[Pass]:
    """The pass that runs `spec` on `adapter` under plan `kind`, once every link of
    method -> pass -> plan -> adapter holds; otherwise the error that names the missing
    link and the methods that would run."""
    error = _missing_link(spec, kind, adapter)
    if error is not None:
        supported = ", ".join(_supported(kind, adapter))
        raise type(error)(
            f"method {spec.name!r} is not available for {adapter.family}: {error}; "
            f"supported methods: {supported}"
        )
    chosen = pass_for(spec)
    chosen.check_request(spec, request)
    return chosen


def _supported(kind: type[Plan], adapter: Adapter | type[Adapter]) -> list[str]:
    return [
        name for name, spec in sorted(METHODS.items()) if _missing_link(spec, kind, adapter) is None
    ]


def supported_methods(
    adapter: Adapter | type[Adapter], request: Request | None = None
) -> list[str]:
    """The names of the methods that `adapter`'s model can be explained with, in calls of
    `request`'s kind (a generation, when it has a `prompt_length`; default: any other).
    Capabilities are declared on the adapter's class, so a family's adapter class answers
    for every model of the family (`explain models` lists them so)."""
    return _supported(plan_kind(adapter, request or Request()), adapter)


def refusals(adapter: Adapter | type[Adapter], request: Request | None = None) -> dict[str, str]:
    """The methods `adapter`'s model cannot be explained with (in calls of `request`'s
    kind, as for `supported_methods`), each with the reason, the missing link of method ->
    pass -> plan -> adapter that `check` would name."""
    kind = plan_kind(adapter, request or Request())
    found = {name: _missing_link(spec, kind, adapter) for name, spec in sorted(METHODS.items())}
    return {name: str(error) for name, error in found.items() if error is not None}


def require_methods(
    adapter: Adapter | type[Adapter], names: list[str], model: str, request: Request | None = None
) -> None:
    """Refuse, in one error before any work, those of the method `names` that `adapter`'s
    model (called `model` in the message) cannot be explained with in calls of `request`'s
    kind, each with its reason, and name the methods it takes."""
    refused = refusals(adapter, request)
    reasons: dict[str, list[str]] = {}
    for name in names:
        if name in refused:
            reasons.setdefault(refused[name], []).append(name)
    if reasons:
        taken = ", ".join(supported_methods(adapter, request))
        why = "; ".join(f"{', '.join(group)} ({reason})" for reason, group in reasons.items())
        raise UnsupportedModelError(f"{model} does not take {why}; it takes {taken}")


def explain(adapter: Adapter, inputs: Any, request: Request, tokenizer: Any = None) -> Explanation:
    """Relevance of every input element for the request's targets (see `Explainer.explain`)."""
    assert request.method is not None
    spec = get_method(request.method)
    kind = plan_kind(adapter, request)
    chosen = check(spec, kind, adapter, request)
    plan = kind(adapter, spec, request, tokenizer)
    plan.prepare(inputs)
    plan.choose_inputs()
    run = chosen(adapter, spec, plan, request)
    columns, relevances = run.run()
    if not run.mapped:  # onto the input (patch grids, text with pads 0), all columns at once
        relevances = {
            token_set.name: adapter.to_input_space(relevances[token_set.name], token_set.layout)
            for token_set in plan.sets
        }
    relevances = {name: r.detach() for name, r in plan.finish(relevances, columns).items()}
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
        detections=plan.detections(),
        settings={
            **plan.settings(),
            **run.settings,
            **({} if plan.foil is None else {"foil": plan.foil.tolist()}),
        },
    )


def trace(adapter: Adapter, inputs: Any, request: Request, tokenizer: Any = None) -> Trace:
    """Every block's attention and hidden states with their gradients for the score of
    the request's target (see `Explainer.trace`)."""
    plan = plan_kind(adapter, request)(adapter, None, request, tokenizer)
    plan.prepare(inputs)
    plan.choose_inputs()
    budget = request.memory_budget
    fused = (
        choose_path(
            adapter,
            plan.prepared.layout,
            batch=plan.prepared.batch_size,
            needs_gradients=True,
            requested=request.attention_path,
            memory_budget=default_memory_budget(adapter.parameter.device)
            if budget is None
            else budget,
            maps=adapter.attention_maps(plan.prepared),
        )
        == "fused"
    )
    num_layers = adapter.num_layers
    attentions: dict[int, Tensor] = {}
    path = adapter.fused_path() if fused else None
    with (
        Session(adapter, differentiable=True, fused=path) as session,
        Recorder(session, track=range(num_layers), hidden_states=True) as recorder,
    ):
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
