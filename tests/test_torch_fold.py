"""`readout_spread` in plain PyTorch (explain.engine.kernels.torch_fold) against the
spread written out from whole maps, in float64: masks, causality, grouped-query heads,
several columns, and chunks of query rows down to one row."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from explain.engine.kernels import readout_spread
from explain.engine.kernels.torch_fold import row_chunks
from explain.rules.registry import SpreadMode


def _reference(vector, query, key, value, output_grad, scale, causal, key_mask, mode):
    """out[c, b] = vector[c, b] @ mean_h W, W = (dA * A)+ or A, one sample, column and
    head at a time from the N x N maps."""
    columns, batch, tokens = vector.shape
    heads, kv_heads = query.shape[1], key.shape[1]
    out = torch.zeros(columns, batch, key.shape[2], dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            k, v = key[b, h // (heads // kv_heads)], value[b, h // (heads // kv_heads)]
            scores = query[b, h] @ k.T * scale
            allowed = torch.ones_like(scores, dtype=torch.bool)
            if causal:
                allowed &= torch.ones_like(allowed).tril()
            if key_mask is not None:
                allowed &= key_mask[b][None, :]
            attention = torch.zeros_like(scores)
            for i in range(tokens):
                if allowed[i].any():
                    attention[i, allowed[i]] = scores[i, allowed[i]].softmax(-1)
            for c in range(columns):
                if mode is SpreadMode.GRADIENT:
                    weights = (output_grad[c, b, h] @ v.T * attention).clamp(min=0)
                else:
                    weights = attention
                out[c, b] += vector[c, b] @ weights / heads
    return out


@pytest.mark.parametrize("mode", [SpreadMode.GRADIENT, SpreadMode.ATTENTION])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("max_bytes", [1, 4000, 1 << 30])
def test_readout_spread_equals_the_spread_of_whole_maps(mode, causal, masked, kv_heads, max_bytes):
    generator = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    columns, batch, heads, tokens, size = 3, 2, 4, 7, 5
    vector = rand(columns, batch, tokens)
    query, key, value = (
        rand(batch, heads, tokens, size),
        rand(batch, kv_heads, tokens, size),
        rand(batch, kv_heads, tokens, size),
    )
    output_grad = rand(columns, batch, heads, tokens, size) if mode is SpreadMode.GRADIENT else None
    # Sample 0: two left pads (under causality their rows attend nowhere), sample 1: one
    # right pad.
    key_mask = (
        torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0]], dtype=torch.bool)
        if masked
        else None
    )
    args = (vector, query, key, value, output_grad)
    options = dict(scale=0.4, causal=causal, key_mask=key_mask, mode=mode)
    spread = readout_spread(*args, **options, max_bytes=max_bytes)
    assert spread.shape == (columns, batch, tokens) and spread.dtype == torch.float64
    expected = _reference(*args, **options)
    torch.testing.assert_close(spread, expected, rtol=1e-10, atol=1e-12)
    assert torch.isfinite(spread).all()


def test_readout_spread_is_float32_for_half_precision_inputs():
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=generator).bfloat16() for _ in range(3))
    vector = torch.rand(1, 1, 6, generator=generator).bfloat16()
    spread = readout_spread(
        vector, q, k, v, None, scale=0.5, causal=True, key_mask=None, mode=SpreadMode.ATTENTION
    )
    assert spread.dtype == torch.float32
    expected = _reference(
        vector.double(),
        q.double(),
        k.double(),
        v.double(),
        None,
        0.5,
        True,
        None,
        SpreadMode.ATTENTION,
    )
    torch.testing.assert_close(spread.double(), expected, rtol=0, atol=1e-6)


class _CopiedElements(TorchDispatchMode):
    """The elements written by the copies dispatched while active (a copy inside a
    composite op, such as matmul broadcasting an operand, included)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in ("copy_", "clone", "_to_copy"):
            self.elements += out.numel()
        return out


def test_readout_spread_copies_no_more_than_its_inputs():
    """The fold's products read k and v as they are: over all chunks it copies about as
    much as its inputs hold (dO's rows laid out per kv head, the readout rows per head),
    never k or v once per column and chunk, which a product broadcast over the columns
    does (rows x keys x columns in all: 266,240 elements here)."""
    generator = torch.Generator().manual_seed(2)
    columns, heads, kv_heads, tokens, size = 8, 4, 2, 64, 8
    query = torch.randn(1, heads, tokens, size, generator=generator)
    key, value = (torch.randn(1, kv_heads, tokens, size, generator=generator) for _ in "kv")
    output_grad = torch.randn(columns, 1, heads, tokens, size, generator=generator)
    vector = torch.rand(columns, 1, tokens, generator=generator)
    inputs = sum(t.numel() for t in (vector, query, key, value, output_grad))
    for causal in (False, True):
        with _CopiedElements() as copies:  # one query row per chunk: the most chunks
            readout_spread(
                vector,
                query,
                key,
                value,
                output_grad,
                scale=0.3,
                causal=causal,
                key_mask=None,
                mode=SpreadMode.GRADIENT,
                max_bytes=1,
            )
        assert copies.elements <= 2 * inputs, (copies.elements, inputs)


def test_row_chunks_cover_the_rows_within_the_budget():
    for causal in (False, True):
        for budget in (1, 100, 1000, 10**9):
            chunks = row_chunks(50, 50, 4, budget, causal=causal)
            assert chunks[0][0] == 0 and chunks[-1][1] == 50
            assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
            for start, stop in chunks:
                width = stop if causal else 50
                assert stop - start == 1 or (stop - start) * width * 4 <= budget
    assert len(row_chunks(50, 50, 4, 10**9, causal=True)) == 1
    # Causal chunks hold rows x (their last row) entries: later chunks have fewer rows.
    sizes = [stop - start for start, stop in row_chunks(1000, 1000, 1, 100_000, causal=True)]
    assert sizes[0] > sizes[-2] and len(sizes) <= 7  # the whole triangle: 5 chunks


def test_readout_spread_refuses_shapes_that_do_not_fit():
    q = torch.zeros(1, 3, 4, 2)
    with pytest.raises(ValueError, match="do not fit"):
        readout_spread(
            torch.zeros(1, 1, 4),
            q,
            torch.zeros(1, 2, 4, 2),
            torch.zeros(1, 2, 4, 2),
            None,
            scale=1.0,
            causal=False,
            key_mask=None,
            mode=SpreadMode.ATTENTION,
        )
    with pytest.raises(ValueError, match="needs output_grad"):
        readout_spread(
            torch.zeros(1, 1, 4),
            q,
            q,
            q,
            None,
            scale=1.0,
            causal=False,
            key_mask=None,
            mode=SpreadMode.GRADIENT,
        )
