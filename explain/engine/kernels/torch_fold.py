"""`readout_spread` in plain PyTorch: the fold's kernel on CPU and on every device without
the Triton one (explain.engine.kernels).

Every block's step of a readout fold needs `v @ Abar` for the C readout rows v of the
call's columns, where Abar is the head mean of the attention (rollout) or of
`(dA * A)+` (generic). The N x N maps are recomputed from q, k, v and dO by chunks of
query rows, as FlashAttention's backward recomputes them, so that no map of a block is
ever held whole. The chunks are sized by a memory budget: each holds the scores, the
probabilities and one dA per column for its rows. Everything else is batched: the
columns, the samples and the heads go through each product at once, so the number of
dispatched operations depends on the number of chunks only (one when the maps fit the
budget), never on the batch, the columns or the number of heads, and nothing waits for
the device (no `.item()`, no data-dependent shapes).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from explain.rules.fold import attention_spread
from explain.rules.registry import SpreadMode

__all__ = [
    "CPU_CHUNK_BYTES",
    "live_rows",
    "readout_spread",
    "row_chunks",
]

CPU_CHUNK_BYTES = 4 << 20
"""On CPU a chunk's temporaries stay under this size whatever the budget: chunks that fit
the caches are faster than large ones, which spend their time on fresh pages (a narrow
Llama block at 8192 tokens: 0.7 s with 4 MiB chunks, 10 s with 1 GiB ones; of a `generic`
block at 8,192 tokens x 4 columns and at 2,000 x 32, 1 MiB chunks take 1.5-2x as long
as 4 MiB ones, 4 to 12 MiB are alike within the shared machine's noise, 64 MiB 3-4x).
On a GPU the budget alone sizes the chunks, since there each chunk costs kernel
launches."""


def readout_spread(
    vector: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    output_grad: Tensor | None,
    *,
    scale: float,
    causal: bool,
    key_mask: Tensor | None,
    mode: SpreadMode,
    max_bytes: int,
) -> Tensor:
    """out[c, b] = vector[c, b] @ Abar[c, b] (see explain.engine.kernels.readout_spread),
    in float32, or float64 when `vector` is (exactness tests), with at most about
    `max_bytes` of temporaries at a time (on CPU at most `CPU_CHUNK_BYTES`)."""
    columns, batch, tokens = vector.shape
    heads, kv_heads, keys = query.shape[1], key.shape[1], key.shape[-2]
    if heads % kv_heads or (causal and keys != tokens) or query.shape[-2] != tokens:
        raise ValueError(
            f"readout_spread: query {tuple(query.shape)} and key {tuple(key.shape)} do not "
            f"fit readout rows over {tokens} tokens (causal={causal})"
        )
    gradient = mode is SpreadMode.GRADIENT
    if gradient and output_grad is None:
        raise ValueError("readout_spread: mode='gradient' needs output_grad")
    dtype = torch.float64 if vector.dtype == torch.float64 else torch.float32
    size = torch.finfo(dtype).bits // 8
    groups = heads // kv_heads
    keys_t = key.to(dtype).transpose(-2, -1)  # (B, Hk, D, Nk)
    values_t = value.to(dtype).transpose(-2, -1) if gradient else None
    vector = vector.to(dtype)
    # A row whose every key is masked is a row of zeros (as sdpa gives it), not NaN.
    blocked = None if key_mask is None else ~key_mask[:, None, None, :]
    live = live_rows(key_mask, causal)
    dead = None if live is None else ~live[:, None, :, None]  # (B, 1, N or 1, 1)
    # The columns' spreads, summed over query rows chunk by chunk: (C, B, Nk) for mode
    # "attention"; for mode "gradient" per kv head, (B, Hk, C, Nk), summed over them last.
    out = vector.new_zeros(*((batch, kv_heads, columns) if gradient else (columns, batch)), keys)
    # Per query row and key: the scores, the probabilities and one dA per column.
    per_entry = batch * heads * size * ((2 + columns) if gradient else 2)
    if query.device.type == "cpu":
        max_bytes = min(max_bytes, CPU_CHUNK_BYTES)
    for start, stop in row_chunks(tokens, keys, per_entry, max_bytes, causal=causal):
        width = stop if causal else keys  # causal rows see no key after the chunk's last row
        rows = stop - start
        q = query[:, :, start:stop].to(dtype) * scale
        q = q.reshape(batch, kv_heads, groups * rows, -1)  # head h reads kv head h // groups
        scores = (q @ keys_t[..., :width]).view(batch, heads, rows, width)
        if causal:  # only the chunk's own keys lie after some of its rows
            later = torch.ones(rows, rows, dtype=torch.bool, device=q.device).triu_(1)
            scores[..., start:].masked_fill_(later, float("-inf"))
        if blocked is not None:
            scores.masked_fill_(blocked[..., :width], float("-inf"))
        attention = scores.softmax(dim=-1)
        del scores
        if dead is not None:
            attention.masked_fill_(dead[:, :, start:stop] if causal else dead, 0.0)
        if gradient:
            assert output_grad is not None and values_t is not None
            spread = _gradient_spread(
                vector[..., start:stop], output_grad[..., start:stop, :], values_t, attention
            )
        else:
            spread = attention_spread(vector[..., start:stop], attention)
        out[..., :width].add_(spread)  # `+=` on a slice would copy it back onto itself
    if gradient:
        out = out.sum(dim=1).transpose(0, 1)  # (C, B, Nk)
    return out.div_(heads)


def _gradient_spread(
    rows: Tensor, output_grad: Tensor, values_t: Tensor, attention: Tensor
) -> Tensor:
    """sum over query rows i and the heads g of each kv head of rows[c, b, i] * (dA * A)+
    for one chunk of r query rows: (B, Hk, C, K) from rows (C, B, r), dO (C, B, H, r, Dv),
    v^T (B, Hk, Dv, >= K) and A (B, H, r, K), dA = dO v^T.

    The columns go into the rows of one product per kv head, dO laid out (B, Hk, C, G, r,
    Dv), so that v is read as it is: a product broadcast over the columns would copy v^T
    once per column and chunk (the larger part of a call at 2,000 tokens and 32 columns).
    dA for every column is then (B, Hk, C, G * r, K), each column's G * r rows in one
    piece, weighed by A in place and spread by one vector-matrix product per column and kv
    head."""
    columns, batch, count = rows.shape
    kv_heads, width = values_t.shape[1], attention.shape[-1]
    heads = attention.shape[1]
    groups = heads // kv_heads
    grad = output_grad.unflatten(2, (kv_heads, groups)).permute(1, 2, 0, 3, 4, 5)
    grad = grad.reshape(batch, kv_heads, columns * groups * count, -1).to(values_t.dtype)
    weights = (grad @ values_t[..., :width]).view(batch, kv_heads, columns, groups * count, width)
    weights.mul_(attention.view(batch, kv_heads, 1, groups * count, width)).clamp_(min=0)
    flat = rows.transpose(0, 1)[:, None, :, None, :].expand(batch, kv_heads, columns, groups, count)
    flat = flat.reshape(batch * kv_heads * columns, 1, groups * count)
    spread = torch.bmm(flat, weights.view(batch * kv_heads * columns, groups * count, width))
    return spread.view(batch, kv_heads, columns, width)


def live_rows(key_mask: Tensor | None, causal: bool) -> Tensor | None:
    """(B, N) bool, or (B, 1) without causality: the query rows that may attend some key
    under `key_mask` (B, Nk) (None: every row). The others are rows of zeros."""
    if key_mask is None:
        return None
    return key_mask.cumsum(dim=-1) > 0 if causal else key_mask.any(dim=-1, keepdim=True)


def row_chunks(
    tokens: int, keys: int, per_entry: int, max_bytes: int, *, causal: bool
) -> list[tuple[int, int]]:
    """Query-row ranges [start, stop) whose (rows x keys) temporaries, `per_entry` bytes
    per entry, fit `max_bytes` (at least one row each). Causal rows reach only the keys up
    to the chunk's last row, so their chunks hold rows * stop entries: later chunks are
    shorter and every chunk uses the budget alike. Plain arithmetic: no tensor is read."""
    budget = max(1, max_bytes // per_entry)  # entries per chunk
    if not causal:
        step = max(1, budget // keys)
        return [(start, min(tokens, start + step)) for start in range(0, tokens, step)]
    chunks = []
    start = 0
    while start < tokens:
        # The largest r with r * (start + r) <= budget.
        rows = int((math.sqrt(start * start + 4 * budget) - start) / 2)
        stop = min(tokens, start + max(1, rows))
        chunks.append((start, stop))
        start = stop
    return chunks
