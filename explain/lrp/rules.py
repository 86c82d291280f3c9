"""Relevance propagation rules: pure functions from forward activations and the relevance
of an operation's output to the relevance of its inputs (docs/methods.md, "LRP-based methods").

Every function works on a batch: axis 0 is the sample, and every sum a rule takes (the
rescaled residual split) runs over one sample only, so explaining B inputs together equals
explaining each alone. The vector-Jacobian products of LRP-0 are written out in closed
form (a linear map's transpose) rather than taken with autograd: the same numbers, without
building a graph during the relevance pass.

Two rule sets exist because the CVPR 2021 code changed two rules of the original LRP code
it compares with: `CHEFER` (transformer attribution) shares one denominator in the linear
alpha-beta rule and rescales residual splits; `ORIGINAL` (`lrp`, `partial_lrp`) uses
separate denominators and plain LRP-0 at residual adds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "CHEFER",
    "ORIGINAL",
    "RULE_SETS",
    "RuleSet",
    "attention",
    "branch",
    "conv_input_zb",
    "linear_separate",
    "linear_shared",
    "matmul",
    "mean_tokens",
    "passes_through",
    "residual_plain",
    "residual_rescaled",
    "sdiv",
    "select_tokens",
]

EPSILON = 1e-9

LinearRule = Callable[[Tensor, Tensor, Tensor], Tensor]
ResidualRule = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def sdiv(numerator: Tensor, denominator: Tensor) -> Tensor:
    """The reference's `safe_divide`: `a / (b + 1e-9)` for every nonzero b, 0 where b == 0.

    Copied operation for operation (a constant shift, not a sign-preserving guard),
    because exact agreement with the published numbers depends on it.
    """
    den = denominator.clamp(min=EPSILON) + denominator.clamp(max=EPSILON)
    den = den + (den == 0).to(den.dtype) * EPSILON
    return numerator / den * (denominator != 0).to(denominator.dtype)


def _sample_sum(tensor: Tensor) -> Tensor:
    """Sum over everything but the batch axis, shaped to broadcast against `tensor`."""
    return tensor.flatten(1).sum(dim=1).reshape(-1, *([1] * (tensor.dim() - 1)))


def linear_shared(x: Tensor, weight: Tensor, relevance: Tensor) -> Tensor:
    """Alpha-beta (alpha 1, beta 0) with one shared denominator, bias ignored (CVPR 2021).

    `Z1 = x+ W+^T`, `Z2 = x- W-^T`, `S = sdiv(R, Z1 + Z2)`, `R_in = x+ (S W+) + x- (S W-)`.
    """
    positive_w, negative_w = weight.clamp(min=0), weight.clamp(max=0)
    positive_x, negative_x = x.clamp(min=0), x.clamp(max=0)
    z = F.linear(positive_x, positive_w) + F.linear(negative_x, negative_w)
    s = sdiv(relevance, z)
    return positive_x * (s @ positive_w) + negative_x * (s @ negative_w)


def linear_separate(x: Tensor, weight: Tensor, relevance: Tensor) -> Tensor:
    """Alpha-beta (alpha 1, beta 0) with separate denominators (the original LRP code).

    `R_in = x+ (sdiv(R, Z1) W+) + x- (sdiv(R, Z2) W-)`.
    """
    positive_w, negative_w = weight.clamp(min=0), weight.clamp(max=0)
    positive_x, negative_x = x.clamp(min=0), x.clamp(max=0)
    s_positive = sdiv(relevance, F.linear(positive_x, positive_w))
    s_negative = sdiv(relevance, F.linear(negative_x, negative_w))
    return positive_x * (s_positive @ positive_w) + negative_x * (s_negative @ negative_w)


def matmul(left: Tensor, right: Tensor, relevance: Tensor) -> tuple[Tensor, Tensor]:
    """LRP-0 of the batched product `Z = left @ right`: each operand times its VJP of S."""
    s = sdiv(relevance, left @ right)
    return left * (s @ right.transpose(-2, -1)), right * (left.transpose(-2, -1) @ s)


def attention(
    query: Tensor,
    key: Tensor,
    probabilities: Tensor,
    values: Tensor,
    relevance: Tensor,
    residual: ResidualRule,
    *,
    scores: Tensor | None = None,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Relevance through `softmax(q k^T * scale [+ mask]) @ v`, heads as (B, H, N, d).

    `relevance` is that of the product's output (B, H, N, d). LRP-0 on `A @ v` and on
    `q k^T` (the scale is a constant and passes), each operand's relevance halved; softmax
    and dropout pass. Where the model adds an attention mask to the `scores`, that add gets
    the rule set's residual rule, as in the BERT reference. Returns (R_A, R_q, R_k, R_v),
    R_A the attention probabilities' relevance after halving.
    """
    of_attention, of_values = matmul(probabilities, values, relevance)
    of_attention, of_values = of_attention / 2, of_values / 2
    of_scores = of_attention
    if scores is not None:
        operand = torch.zeros_like(scores) if mask is None else mask.expand_as(scores)
        of_scores, _ = residual(scores, operand, of_attention)
    of_query, of_keys_t = matmul(query, key.transpose(-2, -1), of_scores)
    return of_attention, of_query / 2, of_keys_t.transpose(-2, -1) / 2, of_values


def residual_plain(a: Tensor, b: Tensor, relevance: Tensor) -> tuple[Tensor, Tensor]:
    """LRP-0 of `a + b`: `R_a = a S`, `R_b = b S` with `S = sdiv(R, a + b)`."""
    s = sdiv(relevance, a + b)
    return a * s, b * s


def residual_rescaled(a: Tensor, b: Tensor, relevance: Tensor) -> tuple[Tensor, Tensor]:
    """LRP-0 of `a + b`, then each part rescaled so that the two parts share the sample's
    total relevance in proportion to their absolute sums (CVPR 2021), per sample."""
    relevance_a, relevance_b = residual_plain(a, b, relevance)
    sum_a, sum_b = _sample_sum(relevance_a), _sample_sum(relevance_b)
    total = _sample_sum(relevance)
    magnitude = sum_a.abs() + sum_b.abs()
    scale_a = sdiv(sdiv(sum_a.abs(), magnitude) * total, sum_a)
    scale_b = sdiv(sdiv(sum_b.abs(), magnitude) * total, sum_b)
    return relevance_a * scale_a, relevance_b * scale_b


def branch(x: Tensor, relevances: Sequence[Tensor]) -> Tensor:
    """A tensor used several times (the branch point before a residual block):
    `R = x * sum_k sdiv(R_k, x)`."""
    total = sdiv(relevances[0], x)
    for relevance in relevances[1:]:
        total = total + sdiv(relevance, x)
    return x * total


def select_tokens(tokens: Tensor, index: Tensor, relevance: Tensor) -> Tensor:
    """LRP-0 of `tokens[:, index]` (B, N, D) -> (B, K, D): the readout token(s)."""
    picked = tokens[:, index]
    spread = torch.zeros_like(tokens)
    spread[:, index] = picked * sdiv(relevance, picked)
    return spread


def mean_tokens(tokens: Tensor, first: int, relevance: Tensor) -> Tensor:
    """LRP-0 of the mean over tokens `first:` (global average pooling): (B, D) -> (B, N, D)."""
    pooled = tokens[:, first:]
    s = sdiv(relevance, pooled.mean(dim=1))
    spread = torch.zeros_like(tokens)
    spread[:, first:] = pooled * (s[:, None, :] / pooled.shape[1])
    return spread


def conv_input_zb(x: Tensor, conv: nn.Conv2d, relevance: Tensor) -> Tensor:
    """The z^B rule on the input convolution, bounded by each sample's min and max value.

    `Z = conv(x, W) - conv(lo, W+) - conv(hi, W-) + 1e-9`, `S = R / Z`,
    `R_in = x convT(S, W) - lo convT(S, W+) - hi convT(S, W-)`; bias ignored.
    """
    weight = conv.weight.detach().to(x.dtype)
    positive_w, negative_w = weight.clamp(min=0), weight.clamp(max=0)
    low = x.amin(dim=(1, 2, 3), keepdim=True).expand_as(x)
    high = x.amax(dim=(1, 2, 3), keepdim=True).expand_as(x)
    geometry = dict(
        stride=conv.stride, padding=conv.padding, dilation=conv.dilation, groups=conv.groups
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


CHEFER = RuleSet("transformer_attribution", linear_shared, residual_rescaled)
ORIGINAL = RuleSet("original", linear_separate, residual_plain)
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
