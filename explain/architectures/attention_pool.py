"""Readout rows of attention pooling heads (SigLIP's vision tower, timm's `global_pool="map"`).

Such a head has no class token: learned probe queries attend over the last hidden state
and the head reads what they gather. Its readout row is therefore the probes' attention
over the tokens, averaged over the head's heads (and over the probes, when the head
averages them): a row that sums to 1, as a one-hot class-token row does. It depends on
the input, and on the last hidden state, so it costs one extra forward of the model,
which the engine runs inside a session (explain.engine.session) exactly as it runs the
explanation's own forward: in eval mode, without gradients, with the RNG forked,
everything restored afterwards.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from explain.errors import UnsupportedModelError

__all__ = ["check_timm_latent_pool", "timm_latent_pool_row"]


def check_timm_latent_pool(pool: nn.Module) -> None:
    """Refuse a timm `AttentionPoolLatent` whose output is not one pooled vector."""
    if getattr(pool, "pool", None) not in ("token", "avg") or not hasattr(pool, "latent"):
        raise UnsupportedModelError(
            f"attention pooling {type(pool).__name__} with pool={getattr(pool, 'pool', None)!r}"
            " is not supported: the readout needs one pooled vector (pool 'token' or 'avg')"
        )


def timm_latent_pool_row(model: nn.Module, images: Tensor, include_prefix: bool) -> Tensor:
    """(B, N) readout row of a timm model with `global_pool="map"`: the attention of its
    `AttentionPoolLatent` probes over the tokens it pools (the patch tokens, or every token
    with `include_prefix`), mean over heads, then over the probes for pool "avg" or the
    first probe for "token"; 0 at the tokens the head does not see."""
    pool = model.attn_pool
    tokens = model.forward_features(images)
    seen = tokens if include_prefix else tokens[:, model.num_prefix_tokens :]
    if pool.pos_embed is not None:
        seen = seen + pool.pos_embed.unsqueeze(0).to(seen.dtype)
    batch, count, _ = seen.shape
    latent = pool.latent.expand(batch, -1, -1)
    q = pool.q(latent).reshape(batch, pool.latent_len, pool.num_heads, pool.head_dim)
    k = pool.kv(seen).reshape(batch, count, 2, pool.num_heads, pool.head_dim)[:, :, 0]
    q, k = pool.q_norm(q.transpose(1, 2)), pool.k_norm(k.transpose(1, 2))
    attention = ((q * pool.scale) @ k.transpose(-2, -1)).softmax(dim=-1).mean(dim=1)
    probes = attention[:, 0] if pool.pool == "token" else attention.mean(dim=1)
    row = torch.zeros(batch, tokens.shape[1], device=images.device, dtype=probes.dtype)
    row[:, tokens.shape[1] - count :] = probes
    return row
