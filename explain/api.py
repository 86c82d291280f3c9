"""The public verbs: `Explainer.explain` (relevance maps) and `Explainer.trace` (raw tensors)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from explain.architectures import Adapter, Prepared, adapter_for
from explain.errors import OptionError, TargetError
from explain.explanation import Explanation, Trace
from explain.fused import ATTENTION_PATHS, AttentionPath, use_fused_path
from explain.lrp import explain_with_lrp
from explain.lrp.attnlrp_run import explain_with_gradient_rules
from explain.recorder import Recorder
from explain.rules import Method, RuleContext, Sink, get_method
from explain.targets import Score, Target, check_score, resolve_targets, select_scores

__all__ = ["Explainer", "explain"]


class Explainer:
    """Explains the predictions of one model. Constructing it does not touch the model.

    Args:
        model: a supported transformer (see `explain.architectures.supported_families()`),
            used as it is: no copy, no wrapper. Every call leaves it exactly as it was.
        tokenizer: for text models, the tokenizer whose tokens `Explanation.tokens` names.
        attention_path: "auto" (default) keeps the fused attention kernel where that is
            faster and recomputes each block's attention from q, k, v (explain.fused);
            "explicit" or "fused" force one path. Both give the same numbers.
    """

    def __init__(
        self, model: nn.Module, *, tokenizer: Any = None, attention_path: AttentionPath = "auto"
    ) -> None:
        if attention_path not in ATTENTION_PATHS:
            raise OptionError(
                f"attention_path must be one of {', '.join(ATTENTION_PATHS)}; "
                f"got {attention_path!r}"
            )
        self.model = model
        self.adapter: Adapter = adapter_for(model)
        self.tokenizer = tokenizer
        self.attention_path: AttentionPath = attention_path

    def explain(
        self,
        inputs: Any,
        target: Target = None,
        method: str = "generic",
        score: Score = "logit",
        start_layer: int | None = None,
        **options: Any,
    ) -> Explanation:
        """Relevance of every input element for the target class of each sample.

        Args:
            inputs: images (B, C, H, W), or a tokenizer's output for text models; with
                a tokenizer, also a text or a list of texts (see explain.text.encode).
            target: None (predicted class), an int, B ints, a (B, K) tensor of K classes
                per input (the relevance gets a K axis), or a callable on the output.
            method: a name from `explain.METHODS`.
            score: "logit" (as in the papers), "probability" or "log_probability".
            start_layer: first block to aggregate over (methods that aggregate); negative
                values count from the end. None uses the method's default. Dual encoders
                (CLIP) also take one per tower, {"image": s, "text": s}.
            **options: method options, e.g. rollout's `head_fusion`, `discard_ratio`;
                encoder-decoders take `position` (see docs/multimodal.md).

        Returns:
            An `Explanation`; its tensors are detached and on the model's device.
        """
        if self.adapter.token_sets is not None:  # relevance per token set (CLIP, seq2seq)
            from explain.token_sets import explain_token_sets

            return explain_token_sets(self, inputs, target, method, score, start_layer, options)
        spec = get_method(method)
        check_score(score)
        prepared = self.adapter.prepare(self._encoded(inputs))
        context = self._context(spec, prepared, start_layer)
        sink = spec.sink(context, options)  # bad options fail before any model work
        fused = use_fused_path(
            self.adapter,
            prepared.layout,
            needs_gradients=spec.needs_gradients,
            requested=self.attention_path,
        )
        if spec.lrp_rules is not None:  # relevance propagation (explain.lrp)
            logits, classes, token_relevance = explain_with_lrp(
                self.adapter, spec, context, options, sink, prepared, target, score
            )
        elif spec.gradient_rules is not None:  # AttnLRP, CP-LRP (explain.lrp.attnlrp)
            logits, classes, token_relevance = explain_with_gradient_rules(
                self.adapter, spec, context, options, sink, prepared, target, score
            )
        elif spec.needs_gradients:
            logits, classes, token_relevance = self._explain_with_gradients(
                spec, context, options, sink, prepared, target, score, fused
            )
        else:
            logits, classes, token_relevance = self._explain_forward_only(
                sink, prepared, target, fused
            )
        layout = prepared.layout
        if getattr(sink, "input_space", False):  # full LRP on images: pixels already
            relevance = token_relevance.detach()
        else:
            relevance = self.adapter.to_input_space(token_relevance, layout).detach()
        return Explanation(
            relevance=relevance,
            logits=logits.detach(),
            target=classes,
            method=spec.name,
            score=score,
            input_size=layout.input_size,
            relevances={layout.modality: relevance},
            tokens=self._token_strings(prepared),
        )

    def _encoded(self, inputs: Any) -> Any:
        """Raw texts tokenized with the Explainer's tokenizer; anything else as given."""
        from explain import text

        if self.tokenizer is not None and text.is_raw_text(inputs):
            return text.encode(self.tokenizer, inputs)
        return inputs

    def _token_strings(self, prepared: Prepared) -> list[list[str]] | None:
        """Explanation.tokens: the token at every text position, when there is a tokenizer."""
        ids = prepared.arguments.get("input_ids")
        if self.tokenizer is None or ids is None or prepared.layout.modality != "text":
            return None
        from explain.text import token_strings

        return token_strings(self.tokenizer, ids)

    def _context(self, spec: Method, prepared: Prepared, start_layer: int | None) -> RuleContext:
        num_layers = self.adapter.num_layers
        start = resolve_start_layer(spec, start_layer, num_layers, prepared.layout.modality)
        readout = self.adapter.readout(prepared)
        return RuleContext(readout, prepared.layout, num_layers, start)

    def _explain_forward_only(
        self, sink: Sink, prepared: Prepared, target: Target, fused: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Class-agnostic methods: one forward under no_grad, no backward at all."""
        with Recorder(
            self.adapter,
            on_attention=lambda layer, attention: sink.add(layer, attention, None),
            differentiable=False,
            fused=fused,
        ):
            logits = self.adapter.forward(prepared)
        classes, _ = resolve_targets(logits, target)  # validated, though the map ignores it
        token_relevance = sink.result()
        if classes is None:
            classes = _no_class(logits)
        elif classes.dim() == 2:
            token_relevance = token_relevance[:, None].expand(-1, classes.shape[1], -1)
        return logits, classes, token_relevance

    def _explain_with_gradients(
        self,
        spec: Method,
        context: RuleContext,
        options: dict[str, Any],
        sink: Sink,
        prepared: Prepared,
        target: Target,
        score: Score,
        fused: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One forward, then one backward (vectorised over K target columns), folding
        blocks as their gradients arrive."""
        with Recorder(self.adapter, track=sink.layers, fused=fused) as recorder:
            logits = self.adapter.forward(prepared)
            classes, custom_scores = resolve_targets(logits, target)
            if classes is None:
                recorder.backward(custom_scores.sum(), sink.add)
                return logits, _no_class(logits), sink.result()
            scores = select_scores(logits, classes, score)
            if scores.dim() == 1:
                recorder.backward(scores.sum(), sink.add)
                return logits, classes, sink.result()
            sinks = [sink] + [spec.sink(context, options) for _ in range(scores.shape[1] - 1)]
            recorder.backward_batched(
                scores, lambda k, layer, attention, grad: sinks[k].add(layer, attention, grad)
            )
            return logits, classes, torch.stack([s.result() for s in sinks], dim=1)

    def trace(self, inputs: Any, target: Target = None, score: Score = "probability") -> Trace:
        """Every block's attention and hidden states with their gradients for one score.

        The gradients are those of `sum_b score_b`, where score_b is the chosen score
        (default: the probability) of sample b's target class; samples do not interact,
        so each sample's slice is the gradient of its own score. See docs/gradients.md.
        """
        check_score(score)
        prepared = self.adapter.prepare(self._encoded(inputs))
        num_layers = self.adapter.num_layers
        attentions: dict[int, Tensor] = {}
        with Recorder(self.adapter, track=range(num_layers), hidden_states=True) as recorder:
            logits = self.adapter.forward(prepared)
            classes, custom_scores = resolve_targets(logits, target)
            if classes is not None and classes.dim() == 2:
                raise TargetError("trace() explains one class per input; pass a (B,) target")
            scores = custom_scores if classes is None else select_scores(logits, classes, score)
            recorder.backward(
                scores.sum(),
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
                logits=logits.detach(),
                target=_no_class(logits) if classes is None else classes,
                score=score if classes is not None else "custom",
            )


def resolve_start_layer(
    spec: Method, start_layer: int | None, num_layers: int, modality: str
) -> int:
    """The first block `spec` aggregates over in a stack of `num_layers` blocks: the given
    `start_layer` (negative counts from the end), checked, or the method's default."""
    if spec.default_start_layer is None:
        if start_layer is not None:
            raise OptionError(f"method {spec.name!r} reads a fixed block; it takes no start_layer")
        return num_layers - 1
    if start_layer is None:
        return spec.default_start_layer(num_layers, modality)
    if isinstance(start_layer, bool) or not isinstance(start_layer, int):
        raise OptionError(f"start_layer must be an int, got {start_layer!r}")
    if not -num_layers <= start_layer < num_layers:
        raise OptionError(
            f"start_layer {start_layer} is out of range for a model with {num_layers} "
            f"blocks (use 0..{num_layers - 1}, or negative values from the end)"
        )
    return start_layer % num_layers


def _no_class(logits: Tensor) -> Tensor:
    """Target placeholder (-1) when a callable chose the scores directly."""
    return torch.full((logits.shape[0],), -1, dtype=torch.long, device=logits.device)


def explain(model: nn.Module, inputs: Any, **kwargs: Any) -> Explanation:
    """One-shot form of `Explainer(model).explain(inputs, **kwargs)`."""
    tokenizer = kwargs.pop("tokenizer", None)
    return Explainer(model, tokenizer=tokenizer).explain(inputs, **kwargs)
