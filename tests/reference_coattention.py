"""Independent reference computations for two token sets, written from docs/multimodal.md.

One sample at a time, full matrices, plain loops: nothing here uses `explain`. The block
matrices are the generic rule's Abar = mean_h (G * A)+, computed from attention maps and
gradients that the tests obtain through Hugging Face's own `output_attentions` path.
"""

from __future__ import annotations

import torch
from torch import Tensor


def gradient_weighted(attention: Tensor, gradient: Tensor) -> Tensor:
    """(H, n, m) attention and gradient -> (n, m) Abar: clamp per head, then head mean."""
    heads = attention.shape[0]
    total = torch.zeros_like(attention[0])
    for h in range(heads):
        total += (gradient[h] * attention[h]).clamp(min=0)
    return total / heads


def normalize(relevance: Tensor) -> Tensor:
    """norm(R) = I + (R - I) / rowsum(R - I); a row of R - I summing to 0 stays 0."""
    n = relevance.shape[0]
    identity = torch.eye(n, dtype=relevance.dtype)
    out = identity.clone()
    for row in range(n):
        residual = relevance[row] - identity[row]
        total = residual.sum()
        if total != 0:
            out[row] += residual / total
    return out


def generic_readout(matrices: list[Tensor], row: int) -> Tensor:
    """Row `row` of R = (I + Abar_{L-1}) ... (I + Abar_s) for the given (n, n) blocks."""
    n = matrices[0].shape[0]
    relevance = torch.eye(n, dtype=matrices[0].dtype)
    for matrix in matrices:
        relevance = relevance + matrix @ relevance
    return relevance[row]


def encoder_decoder(
    encoder: list[Tensor], decoder_self: list[Tensor], decoder_cross: list[Tensor]
) -> tuple[Tensor, Tensor, Tensor]:
    """(R_qq, R_qi, R_ii) after the encoder blocks, then each decoder block's self- and
    cross-attention, exactly as the docs/multimodal.md bullet points read."""
    num_i = encoder[0].shape[0] if encoder else decoder_cross[0].shape[1]
    num_q = decoder_self[0].shape[0]
    dtype = decoder_self[0].dtype
    r_ii = torch.eye(num_i, dtype=dtype)
    r_qq = torch.eye(num_q, dtype=dtype)
    r_qi = torch.zeros(num_q, num_i, dtype=dtype)
    for matrix in encoder:
        r_ii = r_ii + matrix @ r_ii
    for self_matrix, cross_matrix in zip(decoder_self, decoder_cross, strict=True):
        r_qq, r_qi = r_qq + self_matrix @ r_qq, r_qi + self_matrix @ r_qi
        r_qi = r_qi + normalize(r_qq).T @ cross_matrix @ normalize(r_ii)
    return r_qq, r_qi, r_ii


def two_stream_layer(
    r: dict[str, Tensor],
    cross_qi: Tensor,
    cross_iq: Tensor,
    self_q: Tensor,
    self_i: Tensor,
) -> dict[str, Tensor]:
    """One LXMERT-style layer: co-attention both ways (from the matrices before the layer),
    then self-attention in each stream."""
    qq, qi, iq, ii = r["qq"], r["qi"], r["iq"], r["ii"]
    new_qi = qi + normalize(qq).T @ cross_qi @ normalize(ii)
    new_qq = qq + cross_qi @ iq
    new_iq = iq + normalize(ii).T @ cross_iq @ normalize(qq)
    new_ii = ii + cross_iq @ qi
    qq, qi, iq, ii = new_qq, new_qi, new_iq, new_ii
    qq, qi = qq + self_q @ qq, qi + self_q @ qi
    ii, iq = ii + self_i @ ii, iq + self_i @ iq
    return {"qq": qq, "qi": qi, "iq": iq, "ii": ii}
