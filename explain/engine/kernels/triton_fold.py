"""The fused long-sequence fold as Triton kernels (CUDA): one block's readout spread
`vector @ Abar` (Abar = mean_h (dA * A)+ or mean_h A) without ever storing an N x N map,
as FlashAttention-2's backward recomputes each tile of P and dP from q, k, v, dO and a
saved log-sum-exp per row. Its PyTorch twin is explain.engine.kernels.torch_fold;
docs/methods.md ("The fused fold") describes the kernels, their memory, determinism and
tests (on CPU under TRITON_INTERPRET=1); tiles are sized for Hopper-class GPUs.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from explain.errors import InputError
from explain.rules.registry import SpreadMode

__all__ = ["BLOCK_KEYS", "BLOCK_QUERIES", "readout_spread"]

BLOCK_QUERIES = 64
"""Query rows per tile. 64 x 64 tiles of fp32 scores with head dims up to 128 fit the
registers of 4 warps (8 above head dim 64) on sm80/sm90, as in FlashAttention-2's
backward."""
BLOCK_KEYS = 64
"""Keys per program: each program owns one tile of keys of one sample."""
_STAGES = 2
_LOG2_E = 1.4426950408889634
_INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _load_tile(base, rows, dims, stride_row, stride_dim, row_count, dim_count):
    """The (rows, dims) tile of one head's matrix at `base` (a q, k, v or dO), zeros past
    `row_count` rows and `dim_count` dims: how both kernels read their operands."""
    return tl.load(
        base + rows[:, None] * stride_row + dims[None, :] * stride_dim,
        mask=(rows[:, None] < row_count) & (dims[None, :] < dim_count),
        other=0.0,
    )


@triton.jit
def _keys_allowed(KEY_MASK, sample, cols, stride_mb, stride_mn, N, HAS_KEY_MASK: tl.constexpr):
    """Which of the keys `cols` of `sample` exist (< N) and, with a key mask, may be
    attended."""
    allowed = cols < N
    if HAS_KEY_MASK:
        keep = tl.load(KEY_MASK + sample * stride_mb + cols * stride_mn, mask=allowed, other=0)
        allowed = allowed & (keep != 0)
    return allowed


@triton.jit
def _row_logsumexp(
    Q,
    K,
    KEY_MASK,
    LSE,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_mb,
    stride_mn,
    stride_lb,
    stride_lh,
    N,
    D,
    HEADS,
    GROUP,
    qk_scale,
    CAUSAL: tl.constexpr,
    HAS_KEY_MASK: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Per query row, log2-sum-exp2 of its allowed scores (in units of log2: the scores are
    pre-multiplied by log2(e)); +inf for a row with no allowed key, so that every P of that
    row recomputes to 0, as sdpa gives."""
    tile = tl.program_id(0)
    sample_head = tl.program_id(1)
    sample = sample_head // HEADS
    head = sample_head % HEADS
    kv_head = head // GROUP
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    query = _load_tile(
        Q + sample * stride_qb + head * stride_qh, rows, dims, stride_qn, stride_qd, N, D
    )
    running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    # causal rows of this tile see no key past the tile's last row
    end = tl.minimum(N, (tile + 1) * BLOCK_M) if CAUSAL else N
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        key = _load_tile(
            K + sample * stride_kb + kv_head * stride_kh, cols, dims, stride_kn, stride_kd, N, D
        )
        scores = tl.dot(query, tl.trans(key), input_precision=PRECISION) * qk_scale
        allowed = _keys_allowed(KEY_MASK, sample, cols, stride_mb, stride_mn, N, HAS_KEY_MASK)[
            None, :
        ]
        if CAUSAL:
            allowed = allowed & (cols[None, :] <= rows[:, None])
        scores = tl.where(allowed, scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, 1))
        # a row with nothing allowed yet keeps max -inf: shift by 0 instead (exp2(-inf) = 0)
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        running_sum = running_sum * tl.exp2(running_max - shift) + tl.sum(
            tl.exp2(scores - shift[:, None]), 1
        )
        running_max = new_max
    has_key = running_sum > 0
    lse = tl.where(
        has_key, running_max + tl.log2(tl.where(has_key, running_sum, 1.0)), float("inf")
    )
    tl.store(LSE + sample * stride_lb + head * stride_lh + rows, lse, mask=rows < N)


@triton.jit
def _spread(
    VECTOR,
    Q,
    K,
    V,
    DO,
    KEY_MASK,
    LSE,
    OUT,
    stride_vc,
    stride_vb,
    stride_vn,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_valb,
    stride_valh,
    stride_valn,
    stride_vald,
    stride_dc,
    stride_db,
    stride_dh,
    stride_dn,
    stride_dd,
    stride_mb,
    stride_mn,
    stride_lb,
    stride_lh,
    stride_oc,
    stride_ob,
    stride_on,
    COLUMNS,
    N,
    D,
    DV,
    HEADS,
    GROUP,
    qk_scale,
    inv_heads,
    CAUSAL: tl.constexpr,
    HAS_KEY_MASK: tl.constexpr,
    GRADIENT: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """One program: one tile of keys of one sample, every head, query tile and column.
    OUT must hold zeros; the program adds `sum_i vector[c, i] Abar[c, i, keys]` into it."""
    tile = tl.program_id(0)
    sample = tl.program_id(1)
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    value_dims = tl.arange(0, BLOCK_DV)
    key_ok = _keys_allowed(KEY_MASK, sample, cols, stride_mb, stride_mn, N, HAS_KEY_MASK)
    # causal: no query row before this key tile's first key attends to it
    first_row = (tile * BLOCK_N // BLOCK_M) * BLOCK_M if CAUSAL else 0
    out_rows = OUT + sample * stride_ob + cols * stride_on
    for head in range(0, HEADS):
        kv_head = head // GROUP
        key = _load_tile(
            K + sample * stride_kb + kv_head * stride_kh, cols, dims, stride_kn, stride_kd, N, D
        )
        if GRADIENT:
            value = _load_tile(
                V + sample * stride_valb + kv_head * stride_valh,
                cols,
                value_dims,
                stride_valn,
                stride_vald,
                N,
                DV,
            )
        for start in range(first_row, N, BLOCK_M):
            rows = start + tl.arange(0, BLOCK_M)
            row_ok = rows < N
            query = _load_tile(
                Q + sample * stride_qb + head * stride_qh, rows, dims, stride_qn, stride_qd, N, D
            )
            lse = tl.load(
                LSE + sample * stride_lb + head * stride_lh + rows, mask=row_ok, other=float("inf")
            )
            scores = tl.dot(query, tl.trans(key), input_precision=PRECISION) * qk_scale
            allowed = row_ok[:, None] & key_ok[None, :]
            if CAUSAL:
                allowed = allowed & (cols[None, :] <= rows[:, None])
            probabilities = tl.where(allowed, tl.exp2(scores - lse[:, None]), 0.0)
            for column in range(0, COLUMNS):
                weights = tl.load(
                    VECTOR + column * stride_vc + sample * stride_vb + rows * stride_vn,
                    mask=row_ok,
                    other=0.0,
                )
                if GRADIENT:
                    upstream = _load_tile(
                        DO + column * stride_dc + sample * stride_db + head * stride_dh,
                        rows,
                        value_dims,
                        stride_dn,
                        stride_dd,
                        N,
                        DV,
                    )
                    grad = tl.dot(upstream, tl.trans(value), input_precision=PRECISION)
                    block = tl.maximum(grad * probabilities, 0.0)
                else:
                    block = probabilities
                spread = tl.sum(weights[:, None] * block, 0) * inv_heads
                target = out_rows + column * stride_oc
                tl.store(target, tl.load(target, mask=cols < N, other=0.0) + spread, mask=cols < N)


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
) -> Tensor:
    """Readout rows times one block's head-averaged matrix, by Triton tiles (see the
    module docstring for the maths and explain.engine.kernels for the interface).

    Args:
        vector: (C, B, N) readout rows, C columns (classes or generated tokens).
        query: (B, Hq, N, D) the block's queries as the attention saw them.
        key: (B, Hk, N, D), Hq a multiple of Hk (grouped-query heads).
        value: (B, Hk, N, Dv).
        output_grad: (C, B, Hq, N, Dv) each column's gradient of the attention output per
            head; needed for mode "gradient", unused for "attention".
        scale: the scores' factor (usually D ** -0.5).
        causal: query i attends keys j <= i.
        key_mask: (B, N) bool, True where a key may be attended; None = all.
        mode: "gradient" for mean_h (dA * A)+, "attention" for mean_h A.
    Returns:
        (C, B, N) float32.
    Raises:
        InputError for shapes, dtypes or devices the kernel does not take.
    """
    _check(vector, query, key, value, output_grad, key_mask, scale, mode)
    columns, batch, tokens = vector.shape
    heads, head_dim = query.shape[1], query.shape[3]
    kv_heads, value_dim = key.shape[1], value.shape[3]
    qk_scale = float(scale) * _LOG2_E
    precision = "ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32"
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_dv = max(16, triton.next_power_of_2(value_dim))
    # q, k, v and dO tiles of 64 x 128 (and two 64 x 64 fp32 tiles) spill 4 warps'
    # registers; FlashAttention-2's backward runs head dims above 64 on 8 warps too
    warps = 4 if max(block_d, block_dv) <= 64 else 8
    mask = key_mask.to(torch.int8) if key_mask is not None else query.new_empty(1, 1)

    lse = torch.empty(batch, heads, tokens, dtype=torch.float32, device=query.device)
    _row_logsumexp[(triton.cdiv(tokens, BLOCK_QUERIES), batch * heads)](
        query,
        key,
        mask,
        lse,
        *query.stride(),
        *key.stride(),
        *mask.stride(),
        lse.stride(0),
        lse.stride(1),
        tokens,
        head_dim,
        heads,
        heads // kv_heads,
        qk_scale,
        CAUSAL=causal,
        HAS_KEY_MASK=key_mask is not None,
        PRECISION=precision,
        BLOCK_M=BLOCK_QUERIES,
        BLOCK_N=BLOCK_KEYS,
        BLOCK_D=block_d,
        num_warps=warps,
        num_stages=_STAGES,
    )

    gradient = mode is SpreadMode.GRADIENT
    upstream = output_grad if gradient else query.new_empty(1, 1, 1, 1, 1)
    assert upstream is not None  # checked: "gradient" has output_grad
    out = torch.zeros(columns, batch, tokens, dtype=torch.float32, device=vector.device)
    _spread[(triton.cdiv(tokens, BLOCK_KEYS), batch)](
        vector,
        query,
        key,
        value,
        upstream,
        mask,
        lse,
        out,
        *vector.stride(),
        *query.stride(),
        *key.stride(),
        *value.stride(),
        *upstream.stride(),
        *mask.stride(),
        lse.stride(0),
        lse.stride(1),
        *out.stride(),
        columns,
        tokens,
        head_dim,
        value_dim,
        heads,
        heads // kv_heads,
        qk_scale,
        1.0 / heads,
        CAUSAL=causal,
        HAS_KEY_MASK=key_mask is not None,
        GRADIENT=gradient,
        PRECISION=precision,
        BLOCK_M=BLOCK_QUERIES,
        BLOCK_N=BLOCK_KEYS,
        BLOCK_D=block_d,
        BLOCK_DV=block_dv,
        num_warps=warps,
        num_stages=_STAGES,
    )
    return out


def _check(
    vector: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    output_grad: Tensor | None,
    key_mask: Tensor | None,
    scale: float,
    mode: SpreadMode,
) -> None:
    """Shapes, dtypes and devices as the interface states them, checked without a sync."""
    if not isinstance(mode, SpreadMode):
        raise InputError(f"mode must be a SpreadMode, not {mode!r}")
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or vector.dim() != 3:
        raise InputError(
            "readout_spread takes vector (C, B, N), query (B, Hq, N, D), key (B, Hk, N, D) "
            "and value (B, Hk, N, Dv)"
        )
    batch, heads, tokens, head_dim = query.shape
    kv_heads = key.shape[1]
    if (
        key.shape != (batch, kv_heads, tokens, head_dim)
        or value.shape[:3] != (batch, kv_heads, tokens)
        or vector.shape[1:] != (batch, tokens)
    ):
        raise InputError(
            f"readout_spread shapes disagree: vector {tuple(vector.shape)}, query "
            f"{tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)} "
            "(keys as many as queries: N == Nk)"
        )
    if kv_heads == 0 or heads % kv_heads:
        raise InputError(f"{heads} query heads do not group over {kv_heads} key/value heads")
    if vector.dtype != torch.float32:
        raise InputError(f"the readout rows must be float32, not {vector.dtype}")
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if tensor.dtype not in _INPUT_DTYPES:
            raise InputError(
                f"the Triton fold takes float16, bfloat16 or float32 {name}, not "
                f"{tensor.dtype}; use the PyTorch fold (explain.engine.kernels.torch_fold)"
            )
    expected = (vector.shape[0], batch, heads, tokens, value.shape[3])
    if mode is SpreadMode.GRADIENT and (
        output_grad is None or tuple(output_grad.shape) != expected
    ):
        found = None if output_grad is None else tuple(output_grad.shape)
        raise InputError(f"mode 'gradient' needs output_grad of shape {expected}, got {found}")
    if key_mask is not None and (key_mask.shape != (batch, tokens) or key_mask.dtype != torch.bool):
        raise InputError(f"key_mask must be a bool ({batch}, {tokens}) tensor")
    devices = {
        t.device for t in (vector, query, key, value, output_grad, key_mask) if t is not None
    }
    if len(devices) != 1:
        raise InputError(
            f"readout_spread's tensors are on several devices: {sorted(map(str, devices))}"
        )
    if not math.isfinite(scale):
        raise InputError(f"scale must be finite, not {scale}")
