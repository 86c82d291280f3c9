"""One LRP explanation call: a recorded forward pass, the gradients a method needs, and the
relevance pass from each sample's target logit.

The recorder captures the activations the family's tape names (it is the only code that
hooks the model); the tape then propagates relevance through them with the method's rule
set. Methods that weight attention relevance by gradients (`transformer_attribution`) get
one ordinary backward of the selected score, as every gradient method does; methods that
do not (`partial_lrp`, `lrp`) run the forward without a graph at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from explain.architectures.base import Adapter, Prepared
from explain.errors import TargetError, UnsupportedModelError
from explain.lrp.rules import RULE_SETS, RuleSet
from explain.recorder import ModuleHook, Recorder
from explain.rules.registry import Method, RuleContext, Sink
from explain.targets import Score, Target, resolve_targets, select_scores

__all__ = ["Tape", "explain_with_lrp", "tape_for"]


class Tape(Protocol):
    """A model family's LRP walk: the activations it needs and the propagation over them."""

    hooks: Sequence[tuple[nn.Module, ModuleHook]]

    def propagate(
        self,
        classes: Tensor,
        rules: RuleSet,
        on_attention: Callable[[int, Tensor], None],
        *,
        stop_layer: int = 0,
        to_input: bool = False,
    ) -> Tensor:
        """Relevance from each sample's class logit down to block `stop_layer`, handing
        every block's attention relevance to `on_attention`; returns the relevance of that
        block's input, or of the model's input with `to_input`."""


def tape_for(adapter: Adapter, *, to_input: bool) -> Tape:
    """The LRP tape for `adapter`'s model, or UnsupportedModelError naming what is missing."""
    from explain.architectures.timm_vit import TimmVisionTransformer

    if isinstance(adapter, TimmVisionTransformer):
        from explain.lrp.timm_vit import TimmVitTape

        return TimmVitTape(adapter, to_input=to_input)
    from explain.architectures.hf_bert import HuggingFaceTextEncoder

    if isinstance(adapter, HuggingFaceTextEncoder):
        from explain.lrp.hf_bert import BertTape

        return BertTape(adapter, to_input=to_input)
    raise UnsupportedModelError(
        f"the LRP methods have no relevance rules for {adapter.family}; they cover timm "
        "VisionTransformer models and Hugging Face BertForSequenceClassification (use "
        "'generic' for this model)"
    )


def explain_with_lrp(
    adapter: Adapter,
    spec: Method,
    context: RuleContext,
    options: dict[str, Any],
    sink: Sink,
    prepared: Prepared,
    target: Target,
    score: Score,
) -> tuple[Tensor, Tensor, Tensor]:
    """Run LRP method `spec`: returns (logits, classes, relevance) as the Explainer does.

    The sink receives each block's attention relevance RA_l in place of the attention
    (with the gradient G_l when the method needs gradients); a sink with `add_input`
    also receives the relevance of the input itself.
    """
    assert spec.lrp_rules is not None
    rules = RULE_SETS[spec.lrp_rules]
    to_input = hasattr(sink, "add_input")
    tape = tape_for(adapter, to_input=to_input)
    track = sink.layers if spec.needs_gradients else range(0)
    stop_layer = 0 if to_input or not sink.layers else sink.layers[0]
    with Recorder(
        adapter, track=track, differentiable=bool(track), module_hooks=tape.hooks
    ) as recorder:
        logits = adapter.forward(prepared)
        classes, _ = resolve_targets(logits, target)
        if classes is None:
            raise TargetError(
                f"method {spec.name!r} propagates relevance from a class logit; give the "
                "target as class indices, not a callable that returns scores"
            )
        columns = classes if classes.dim() == 2 else classes[:, None]
        scores = select_scores(logits, columns, score) if track else None
        results = []
        for k in range(columns.shape[1]):
            column_sink = sink if k == 0 else spec.sink(context, options)
            gradients: dict[int, Tensor] = {}
            if scores is not None:
                recorder.backward(
                    scores[:, k].sum(),
                    lambda layer, attention, gradient, grads=gradients: grads.__setitem__(
                        layer, gradient
                    ),
                    retain_graph=k < columns.shape[1] - 1,
                )

            def deliver(
                layer: int, relevance: Tensor, sink: Sink = column_sink, grads: dict = gradients
            ) -> None:
                if layer in sink.layers:
                    sink.add(layer, relevance, grads.pop(layer, None))

            below = tape.propagate(
                columns[:, k], rules, deliver, stop_layer=stop_layer, to_input=to_input
            )
            if to_input:
                column_sink.add_input(below)  # type: ignore[attr-defined]
            results.append(column_sink.result())
    relevance = results[0] if classes.dim() == 1 else torch.stack(results, dim=1)
    return logits, classes, relevance
