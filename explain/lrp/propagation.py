"""Relevance propagation rules: pure functions from forward activations and the relevance
of an operation's output to the relevance of its inputs (docs/methods.md, "LRP-based methods").

Every function works on a batch: token tensors come as rows (B * N, features), sample after
sample, and every sum a rule takes (the rescaled residual split) runs over one sample's
rows only, so explaining B inputs together equals explaining each alone. The
vector-Jacobian products of LRP-0 are written out in closed form (a linear map's
transpose) rather than taken with autograd: the same numbers, without building a graph.

The rules are written for few dispatched operations (on a GPU each is a kernel launch):
an operand's positive and negative parts come from one broadcast clamp as a (2, ...) pair,
whose products run as one batched matmul; a denominator the walk uses twice (a residual's
sum, which is also the next branch point) is made safe once (`safe_denominator`) and
divided by, and LRP-0's halving of the attention products is folded into the quotient
(scaling by 1/2 is exact in floating point).

Two rule sets exist because the CVPR 2021 code changed two rules of the original LRP code
it compares with: `CHEFER` (transformer attribution) shares one denominator in the linear
alpha-beta rule and rescales residual splits; `ORIGINAL` (`lrp`, `partial_lrp`) uses
separate denominators and plain LRP-0 at residual adds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from explain.lrp.weights import base_layer, used_weight

__all__ = [
    "CHEFER",
    "ORIGINAL",
    "RULE_SETS",
    "RuleSet",
    "attention",
    "attention_probabilities",
    "branch",
    "conv_input_zb",
    "linear_separate",
    "linear_shared",
    "mean_tokens",
    "passes_through",
    "residual_plain",
    "residual_rescaled",
    "safe_denominator",
    "sdiv",
    "select_tokens",
    "signed_parts",
]

EPSILON = 1e-9

LinearRule = Callable[[Tensor, Tensor, Tensor], Tensor]
ResidualRule = Callable[[Tensor, Tensor, Tensor, Tensor, int], tuple[Tensor, Tensor]]


def safe_denominator(denominator: Tensor, epsilon: float = EPSILON) -> Tensor:
    """What the reference's `safe_divide(a, b)` divides by: `b + 1e-9`, and +inf where
    `b == 0`, so that those quotients are exactly 0 (`a / inf`). For `2 b` with
    `epsilon=2e-9` it is exactly twice that of b, halving the quotient for free.

    The reference's shift is a constant, not a sign-preserving guard; exact agreement with
    the published numbers depends on it. (Its second guard, for a b of exactly -1e-9
    whose shifted value is 0, is not kept: such a b gives a non-finite relevance, which
    the engine refuses; no activation in a real forward pass is exactly -1e-9.)
    """
    return (denominator + epsilon).masked_fill_(denominator == 0, math.inf)


def sdiv(numerator: Tensor, denominator: Tensor) -> Tensor:
    """The reference's `safe_divide`: `a / (b + 1e-9)` for every nonzero b, 0 where b == 0."""
    return numerator / safe_denominator(denominator)


@functools.cache
def _sign_bounds(dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """Lower and upper clamp bounds (2, 1, 1) that split a tensor into [positive, negative]."""
    low = torch.tensor([0.0, -math.inf], dtype=dtype, device=device).view(2, 1, 1)
    high = torch.tensor([math.inf, 0.0], dtype=dtype, device=device).view(2, 1, 1)
    return low, high


def signed_parts(matrix: Tensor, dtype: torch.dtype) -> Tensor:
    """(2, rows, columns): the matrix's positive part, then its negative part, in `dtype`
    (one broadcast clamp; a float32 matrix clamps exactly into float64)."""
    low, high = _sign_bounds(dtype, matrix.device)
    return torch.clamp(matrix, low, high)


# The alpha-beta rules divide by `z + 1e-9` without sdiv's zero guard and still equal
# sdiv: each part's product sums nonnegative terms (x+ W+ and x- W-), so z >= 0, and z = 0
# only where every term x_i W_oi is 0. A quotient there reaches the result only through
# those zero terms, so its value (0 in sdiv, R / 1e-9 here) never shows.


def linear_shared(x: Tensor, weight: Tensor, relevance: Tensor) -> Tensor:
    """Alpha-beta (alpha 1, beta 0) with one shared denominator, bias ignored (CVPR 2021).

    `Z = x+ W+^T + x- W-^T`, `S = sdiv(R, Z)`, `R_in = x+ (S W+) + x- (S W-)`; rows
    (M, in) -> (M, in), in the relevance's dtype.
    """
    inputs = signed_parts(x, relevance.dtype)
    weights = signed_parts(weight, relevance.dtype)
    z = torch.addbmm(relevance, inputs, weights.transpose(1, 2), beta=0)  # the parts' sum
    s = relevance / (z + EPSILON)  # sdiv without its guard: see below
    return (torch.bmm(s.expand(2, *s.shape), weights) * inputs).sum(dim=0)


def linear_separate(x: Tensor, weight: Tensor, relevance: Tensor) -> Tensor:
    """Alpha-beta (alpha 1, beta 0) with separate denominators (the original LRP code).

    `R_in = x+ (sdiv(R, x+ W+^T) W+) + x- (sdiv(R, x- W-^T) W-)`; rows (M, in) -> (M, in).
    """
    inputs = signed_parts(x, relevance.dtype)
    weights = signed_parts(weight, relevance.dtype)
    s = relevance / (torch.bmm(inputs, weights.transpose(1, 2)) + EPSILON)  # as above
    return (torch.bmm(s, weights) * inputs).sum(dim=0)


def residual_plain(
    a: Tensor, b: Tensor, relevance: Tensor, denominator: Tensor, samples: int
) -> tuple[Tensor, Tensor]:
    """LRP-0 of `a + b`: `R_a = a S`, `R_b = b S` with `S = R / denominator`, the
    denominator being `safe_denominator(a + b)`."""
    s = relevance / denominator
    return a * s, b * s


def residual_rescaled(
    a: Tensor, b: Tensor, relevance: Tensor, denominator: Tensor, samples: int
) -> tuple[Tensor, Tensor]:
    """LRP-0 of `a + b`, then each part rescaled so that the two parts share the sample's
    total relevance in proportion to their absolute sums (CVPR 2021). The tensors hold
    `samples` samples one after another along axis 0; every sum runs over one sample."""
    parts = torch.stack([a, b]) * (relevance / denominator)
    by_sample = parts.view(2, samples, -1)
    sums = by_sample.sum(dim=2, keepdim=True)  # (2, samples, 1)
    total = relevance.reshape(samples, -1).sum(dim=1, keepdim=True)
    magnitudes = sums.abs()
    # sdiv(|s|, |s_a| + |s_b|) * total, then sdiv(that, s): wherever a denominator is 0 so
    # is its numerator, and 0 / 1e-9 is already sdiv's 0, so the plain shift suffices.
    shares = magnitudes / (magnitudes.sum(dim=0) + EPSILON) * total
    scaled = by_sample * (shares / (sums + EPSILON))
    return scaled.view(2, *a.shape).unbind(0)


def branch(x: Tensor, relevances: Sequence[Tensor], denominator: Tensor) -> Tensor:
    """A tensor used several times (the branch point before a residual block):
    `R = x * sum_k R_k / safe(x)`, `denominator` being `safe_denominator(x)`. (The
    reference divides each R_k before summing: the same value up to rounding.)"""
    total = relevances[0]
    for relevance in relevances[1:]:
        total = total + relevance
    return x * (total / denominator)


def attention_probabilities(
    probabilities: Tensor, values: Tensor, relevance: Tensor
) -> tuple[Tensor, Tensor]:
    """LRP-0 of `A @ v` (heads as (B * H, N, d)), the probabilities' share halved: R_A,
    and the quotient S whose product with A^T gives v's share (`attention`)."""
    # The quotient is halved exactly by doubling its denominator (2 z + 2e-9).
    doubled = torch.baddbmm(relevance, probabilities, values, beta=0, alpha=2)
    s = relevance / safe_denominator(doubled, 2 * EPSILON)
    return probabilities * torch.bmm(s, values.transpose(1, 2)), s


def attention(
    heads: Tensor,
    probabilities: Tensor,
    relevance: Tensor,
    residual: ResidualRule,
    *,
    samples: int,
    scale: float | None = None,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Relevance through `softmax(q k^T * scale [+ mask]) @ v`, with `heads` the stacked
    (q, k, v), (3, B * H, N, d), and the probabilities (B * H, N, N).

    `relevance` is that of the product's output (B * H, N, d). LRP-0 on `A @ v` and on
    `q k^T` (the scale is a constant and passes), each operand's relevance halved; softmax
    and dropout pass. With `scale`, the model adds an attention mask to the scores (BERT):
    that add gets the rule set's residual rule, as in the BERT reference, with `mask`
    (broadcastable to (B, H, N, N)) or zeros. Returns R_A, the attention probabilities'
    relevance after halving, and the stacked (R_q, R_k, R_v).
    """
    query, key, values = heads.unbind(0)
    of_attention, s = attention_probabilities(probabilities, values, relevance)
    into_values = torch.bmm(probabilities.transpose(1, 2), s)
    products = torch.baddbmm(probabilities, query, key.transpose(1, 2), beta=0, alpha=2)
    of_scores = of_attention
    if scale is not None:
        scores = products * (scale / 2)  # bit for bit (q k^T) * scale
        tokens = scores.shape[-1]
        grouped = scores.view(samples, -1, tokens, tokens)
        operand = (
            torch.zeros_like(scores)
            if mask is None
            else mask.to(scores.dtype).expand_as(grouped).reshape(scores.shape)
        )
        of_scores, _ = residual(
            scores, operand, of_attention, safe_denominator(scores + operand), samples
        )
    s = of_scores / safe_denominator(products, 2 * EPSILON)
    into_query = torch.bmm(s, key)
    into_keys = torch.bmm(s.transpose(1, 2), query)
    return of_attention, heads * torch.stack([into_query, into_keys, into_values])


def select_tokens(tokens: Tensor, index: int, relevance: Tensor) -> Tensor:
    """LRP-0 of `tokens[:, index]` (B, N, D) -> (B, D): the readout token."""
    picked = tokens[:, index]
    spread = torch.zeros_like(tokens, dtype=relevance.dtype)
    spread[:, index] = picked * sdiv(relevance, picked)
    return spread


def mean_tokens(tokens: Tensor, first: int, relevance: Tensor) -> Tensor:
    """LRP-0 of the mean over tokens `first:` (global average pooling): (B, D) -> (B, N, D)."""
    pooled = tokens[:, first:]
    s = sdiv(relevance, pooled.mean(dim=1))
    spread = torch.zeros_like(tokens, dtype=relevance.dtype)
    spread[:, first:] = pooled * (s[:, None, :] / pooled.shape[1])
    return spread


def conv_input_zb(x: Tensor, conv: nn.Module, relevance: Tensor) -> Tensor:
    """The z^B rule on the input convolution (an nn.Conv2d, or a wrapper that computes as
    one: explain.lrp.weights), bounded by each sample's min and max value.

    `Z = conv(x, W) - conv(lo, W+) - conv(hi, W-) + 1e-9`, `S = R / Z`,
    `R_in = x convT(S, W) - lo convT(S, W+) - hi convT(S, W-)`; bias ignored.
    """
    weight = used_weight(conv).detach().to(x.dtype)
    positive_w, negative_w = weight.clamp(min=0), weight.clamp(max=0)
    low = x.amin(dim=(1, 2, 3), keepdim=True).expand_as(x)
    high = x.amax(dim=(1, 2, 3), keepdim=True).expand_as(x)
    layer = base_layer(conv)  # a LoRA convolution keeps its geometry on its base layer
    geometry = dict(
        stride=layer.stride, padding=layer.padding, dilation=layer.dilation, groups=layer.groups
    )
    z = (
        F.conv2d(x, weight, **geometry)
        - F.conv2d(low, positive_w, **geometry)
        - F.conv2d(high, negative_w, **geometry)
        + EPSILON
    )
    s = relevance / z

    def transpose(w: Tensor) -> Tensor:
        return torch.nn.grad.conv2d_input(x.shape, w, s, **geometry)

    return x * transpose(weight) - low * transpose(positive_w) - high * transpose(negative_w)


@dataclass(frozen=True)
class RuleSet:
    """The rules that differ between the LRP variants; everything else is shared."""

    name: str
    linear: LinearRule
    residual: ResidualRule
    in_float64: bool
    """Whether the walk runs in float64 whatever the model's dtype: the original rules'
    separate denominators and plain residual splits divide by sums that can nearly
    cancel, where float32 arithmetic in the walk would add its own error (docs/methods.md,
    "Precision")."""

    def dtype(self, activations: Tensor) -> torch.dtype:
        """The walk's dtype for a model whose activations look like `activations`: the
        model's, at least float32; float64 for `in_float64` where the device has it."""
        if self.in_float64 and activations.device.type != "mps":
            return torch.float64
        return activations.dtype if activations.dtype == torch.float64 else torch.float32


CHEFER = RuleSet("transformer_attribution", linear_shared, residual_rescaled, in_float64=False)
ORIGINAL = RuleSet("original", linear_separate, residual_plain, in_float64=True)
RULE_SETS = {rules.name: rules for rules in (CHEFER, ORIGINAL)}

# Modules whose relevance passes unchanged: normalisation, elementwise activations,
# dropout in eval mode, and LayerScale, a per-channel constant factor like LayerNorm's
# affine weight (LRP-0 of a product with a constant returns the relevance itself).
_PASS_THROUGH = (nn.Identity, nn.LayerNorm, nn.GELU, nn.Dropout)
_PASS_THROUGH_BY_PACKAGE = {
    "timm.": ("LayerScale", "DropPath", "PatchDropout", "GELU", "GELUTanh", "LayerNorm"),
    "transformers.": ("GELUActivation", "NewGELUActivation", "GELUTanh", "FastGELUActivation"),
}


def passes_through(module: nn.Module) -> bool:
    """Whether relevance passes `module` unchanged (LayerNorm, GELU, dropout, ...)."""
    if isinstance(module, _PASS_THROUGH):
        return True
    cls = type(module)
    return any(
        cls.__module__.startswith(package) and cls.__name__ in names
        for package, names in _PASS_THROUGH_BY_PACKAGE.items()
    )
