"""One AttnLRP or CP-LRP explanation call: a forward pass under the method's gradient rules
(explain.lrp.attnlrp, hooked on the model's modules by the recorder for this call only)
and one backward pass per explained class, from the score to the embeddings."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from explain.architectures.base import Adapter, Prepared, TokenLayout
from explain.lrp.attnlrp import EmbeddingLeaf, rule_hooks
from explain.lrp.attnlrp_sites import rule_sites
from explain.recorder import Recorder
from explain.rules.registry import Method, RuleContext, Sink
from explain.targets import Score, Target, resolve_targets, select_scores

__all__ = ["explain_with_gradient_rules", "token_relevance"]


def explain_with_gradient_rules(
    adapter: Adapter,
    spec: Method,
    context: RuleContext,
    options: dict[str, Any],
    sink: Sink,
    prepared: Prepared,
    target: Target,
    score: Score,
) -> tuple[Tensor, Tensor, Tensor]:
    """Run Gradient x Input method `spec`: returns (logits, classes, token relevance (B, N)
    or (B, K, N)) as the Explainer does. Each class of a (B, K) target is one more backward
    pass over the same forward."""
    assert spec.gradient_rules is not None
    leaf = EmbeddingLeaf()
    hooks = rule_hooks(adapter.model, rule_sites(adapter), spec.gradient_rules, leaf)  # type: ignore[arg-type]
    with Recorder(adapter, module_hooks=hooks, leaf_at_blocks=False):
        logits = adapter.forward(prepared)
        classes, custom_scores = resolve_targets(logits, target)
        if classes is None:
            assert custom_scores is not None
            scores = custom_scores[:, None]
        else:
            scores = select_scores(
                logits, classes if classes.dim() == 2 else classes[:, None], score
            )
        embeddings = leaf.tensor
        results = []
        for k in range(scores.shape[1]):
            column_sink = sink if k == 0 else spec.sink(context, options)
            (gradient,) = torch.autograd.grad(
                scores[:, k].sum(), embeddings, retain_graph=k < scores.shape[1] - 1
            )
            column_sink.add_input(token_relevance(embeddings, gradient, prepared.layout))  # type: ignore[attr-defined]
            results.append(column_sink.result())
    if classes is None:
        classes = torch.full((logits.shape[0],), -1, dtype=torch.long, device=logits.device)
    relevance = results[0] if classes.dim() == 1 else torch.stack(results, dim=1)
    return logits, classes, relevance


def token_relevance(embeddings: Tensor, gradient: Tensor, layout: TokenLayout) -> Tensor:
    """(B, N) relevance over the layout's tokens: embedding x gradient summed over the
    hidden size. Image embeddings hold the patches only ((B, P, D) or (B, gh, gw, D)); the
    prefix tokens, which do not come from the image, get 0."""
    dtype = embeddings.dtype if embeddings.dtype == torch.float64 else torch.float32
    relevance = (embeddings.to(dtype) * gradient.to(dtype)).sum(dim=-1)
    relevance = relevance.reshape(relevance.shape[0], -1)
    if layout.num_prefix_tokens:
        prefix = relevance.new_zeros(relevance.shape[0], layout.num_prefix_tokens)
        relevance = torch.cat([prefix, relevance], dim=1)
    return relevance
