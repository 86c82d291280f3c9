"""The Triton fold (explain.engine.kernels.triton_fold) equals an explicit computation of
`vector @ mean_h (dA * A)+` and `vector @ mean_h A`, run on CPU by Triton's interpreter.

The reference materialises A with a masked softmax and takes dA with torch.autograd from
the real attention product A @ v, in float64; the kernel runs in float32 and must agree to
1e-4 of the result's largest entry. Triton reads TRITON_INTERPRET when `@triton.jit`
decorates, so the module is loaded afresh under the interpreter for these tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tolerances import FLOAT32

from explain.rules.registry import SpreadMode

pytest.importorskip("triton")

TESTS = Path(__file__).parent
ROOT = TESTS.parent


def _run_interpreted(calls: list[tuple[tuple, dict]], folder: Path) -> list[object]:
    """Every call of `readout_spread` in one interpreter process (tests/triton_fold_worker.py)."""
    torch.save(calls, folder / "calls.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [
            sys.executable,
            str(TESTS / "triton_fold_worker.py"),
            str(folder / "calls.pt"),
            str(folder / "out.pt"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(folder / "out.pt")


def reference(vector, query, key, value, output_grad, *, scale, causal, key_mask, mode):
    """(C, B, N) float64 from the materialised maps: A by softmax, dA by autograd."""
    query, key, value = query.double(), key.double(), value.double()
    batch, heads, tokens, _ = query.shape
    group = heads // key.shape[1]
    key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    allowed = torch.ones(batch, 1, tokens, tokens, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(tokens, tokens, dtype=torch.bool).tril()
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]
    scores = (query @ key.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
    # a row with no allowed key is all -inf: softmax gives NaN there, sdpa gives zeros
    attention = scores.softmax(dim=-1).nan_to_num(0.0).requires_grad_(True)
    output = attention @ value
    rows = []
    for column in range(vector.shape[0]):
        if mode is SpreadMode.GRADIENT:
            (grad,) = torch.autograd.grad(
                output, attention, output_grad[column].double(), retain_graph=True
            )
            block = (grad * attention).clamp(min=0).mean(dim=1)
        else:
            block = attention.detach().mean(dim=1)
        rows.append(torch.bmm(vector[column].double()[:, None], block)[:, 0])
    return torch.stack(rows)


def _inputs(columns, batch, heads, kv_heads, tokens, dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, tokens, dim, generator=g)
    key = torch.randn(batch, kv_heads, tokens, dim, generator=g)
    value = torch.randn(batch, kv_heads, tokens, dim + 4, generator=g)  # Dv != D
    output_grad = torch.randn(columns, batch, heads, tokens, dim + 4, generator=g)
    vector = torch.rand(columns, batch, tokens, generator=g)
    return vector, query, key, value, output_grad


def _padding(batch, tokens):
    """Sample 0 has its last keys padded; sample 1 its first three keys, so that under a
    causal mask its first three query rows have no allowed key."""
    mask = torch.ones(batch, tokens, dtype=torch.bool)
    mask[0, tokens - 5 :] = False
    mask[1, :3] = False
    return mask


CASES = {
    # name: (columns, batch, heads, kv_heads, tokens, dim, causal, padded, mode)
    "no-mask": (1, 2, 2, 2, 20, 8, False, False, SpreadMode.GRADIENT),
    "causal": (1, 2, 2, 2, 20, 8, True, False, SpreadMode.GRADIENT),
    "key-padding": (1, 2, 2, 2, 20, 8, False, True, SpreadMode.GRADIENT),
    "causal-padding-empty-rows": (2, 2, 2, 2, 20, 8, True, True, SpreadMode.GRADIENT),
    "grouped-query": (1, 2, 4, 2, 20, 8, True, False, SpreadMode.GRADIENT),
    "three-columns": (3, 2, 2, 1, 20, 8, False, True, SpreadMode.GRADIENT),
    "two-tiles-ragged": (2, 2, 4, 2, 70, 16, True, True, SpreadMode.GRADIENT),
    "attention": (2, 2, 4, 2, 20, 8, False, True, SpreadMode.ATTENTION),
    "attention-causal-ragged": (1, 2, 2, 2, 70, 8, True, False, SpreadMode.ATTENTION),
}


def _case_call(case: str) -> tuple[tuple, dict]:
    columns, batch, heads, kv_heads, tokens, dim, causal, padded, mode = CASES[case]
    vector, query, key, value, output_grad = _inputs(columns, batch, heads, kv_heads, tokens, dim)
    upstream = output_grad if mode is SpreadMode.GRADIENT else None
    key_mask = _padding(batch, tokens) if padded else None
    options = dict(scale=dim**-0.5, causal=causal, key_mask=key_mask, mode=mode)
    return (vector, query, key, value, upstream), options


HALF = ("float16", "bfloat16")
"""The half-precision inputs of the GPU runs: the "two-tiles-ragged" case's q, k, v and dO
in each (the readout rows stay float32, as the folds hand them)."""


def _half_call(dtype: str) -> tuple[tuple, dict]:
    (vector, *tensors), options = _case_call("two-tiles-ragged")
    return (vector, *(t.to(getattr(torch, dtype)) for t in tensors)), options


def _independence_calls() -> list[tuple[tuple, dict]]:
    """Three columns of two samples in one launch, then each (column, sample) alone."""
    vector, query, key, value, output_grad = _inputs(3, 2, 2, 2, 20, 8, seed=3)
    options = dict(scale=0.3, causal=True, key_mask=None, mode=SpreadMode.GRADIENT)
    calls = [((vector, query, key, value, output_grad), options)]
    for c in range(3):
        for b in range(2):
            one = (vector[c : c + 1, b : b + 1], query[b : b + 1], key[b : b + 1])
            calls.append(((*one, value[b : b + 1], output_grad[c : c + 1, b : b + 1]), options))
    return calls


def _strided_calls() -> list[tuple[tuple, dict]]:
    """q, k, v as a model leaves them ((B, N, H, D) transposed), then contiguous."""
    vector, query, key, value, output_grad = _inputs(1, 2, 2, 2, 20, 8, seed=4)
    options = dict(scale=0.25, causal=False, key_mask=None, mode=SpreadMode.GRADIENT)
    strided = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (query, key, value)]
    assert not strided[0].is_contiguous()
    return [
        ((vector, *strided, output_grad), options),
        ((vector, query, key, value, output_grad), options),
    ]


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, list[object]]:
    """Every kernel call of this module, run in one interpreter process."""
    groups = {name: [_case_call(name)] for name in CASES}
    groups["independence"] = _independence_calls()
    groups["strided"] = _strided_calls()
    groups.update({dtype: [_half_call(dtype)] for dtype in HALF})
    calls = [call for group in groups.values() for call in group]
    results = iter(_run_interpreted(calls, tmp_path_factory.mktemp("triton_fold")))
    return {name: [next(results) for _ in group] for name, group in groups.items()}


@pytest.mark.parametrize("case", CASES)
def test_matches_the_explicit_maps(interpreted, case):
    (out,) = interpreted[case]
    assert isinstance(out, torch.Tensor), out  # else the worker's (error, message)
    args, options = _case_call(case)
    vector, query, key, value, _ = args
    output_grad = _inputs(*[CASES[case][i] for i in range(6)])[4]
    expected = reference(vector, query, key, value, output_grad, **options)
    columns, batch, *_ = CASES[case]
    assert out.dtype == torch.float32 and out.shape == (columns, batch, query.shape[2])
    scale = expected.abs().max().item()
    assert scale > 0
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-4 * scale)
    if options["key_mask"] is not None:  # a padded key receives nothing
        assert torch.all(out[:, ~options["key_mask"]] == 0)


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_inputs_match_the_explicit_maps(interpreted, dtype):
    """float16 and bfloat16 q, k, v and dO (Llama's GPU runs are bfloat16): the tiles are
    accumulated in float32, so the result matches the maps of the same rounded inputs as
    float32 inputs do."""
    (out,) = interpreted[dtype]
    assert isinstance(out, torch.Tensor), out
    args, options = _half_call(dtype)
    expected = reference(*args, **options)
    scale = expected.abs().max().item()
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-4 * scale)


def test_columns_and_samples_are_independent(interpreted):
    """Several columns and samples in one launch equal each (column, sample) alone."""
    together, *alone = interpreted["independence"]
    pairs = [(c, b) for c in range(3) for b in range(2)]
    for (c, b), one in zip(pairs, alone, strict=True):
        torch.testing.assert_close(one[0, 0], together[c, b], **FLOAT32)


def test_strided_inputs_read_by_their_strides(interpreted):
    strided, contiguous = interpreted["strided"]
    torch.testing.assert_close(strided, contiguous, rtol=0, atol=0)


def test_bad_arguments_are_named():
    """Checked before any launch, so the compiled (not interpreted) module answers."""
    from explain.engine.kernels.triton_fold import readout_spread
    from explain.errors import InputError

    vector, query, key, value, output_grad = _inputs(1, 2, 4, 2, 20, 8)
    options = dict(scale=0.3, causal=False, key_mask=None)
    with pytest.raises(InputError, match="needs output_grad"):
        readout_spread(vector, query, key, value, None, mode=SpreadMode.GRADIENT, **options)
    with pytest.raises(InputError, match="do not group"):
        readout_spread(
            vector,
            query[:, :3],
            key,
            value,
            output_grad[:, :, :3],
            mode=SpreadMode.GRADIENT,
            **options,
        )
    with pytest.raises(InputError, match="shapes disagree"):
        readout_spread(
            vector[:, :, :10], query, key, value, None, mode=SpreadMode.ATTENTION, **options
        )
    with pytest.raises(InputError, match="float16, bfloat16 or float32"):
        readout_spread(
            vector, query.double(), key, value, None, mode=SpreadMode.ATTENTION, **options
        )
    with pytest.raises(InputError, match="mode"):
        readout_spread(vector, query, key, value, None, mode="rollout", **options)
    with pytest.raises(InputError, match="key_mask"):
        readout_spread(
            vector,
            query,
            key,
            value,
            None,
            mode=SpreadMode.ATTENTION,
            scale=0.3,
            causal=False,
            key_mask=torch.ones(2, 20),
        )


def test_a_kernel_that_cannot_compile_falls_back_to_the_pytorch_fold(monkeypatch):
    """Triton compiles per GPU architecture on first use; where that fails, the dispatcher
    warns once for the device and gives the PyTorch fold's numbers."""
    from triton.runtime.errors import OutOfResources

    import explain.engine.kernels as kernels
    import explain.engine.kernels.triton_fold as triton_fold
    from explain.engine.kernels.torch_fold import readout_spread as torch_readout_spread

    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        raise OutOfResources(1 << 20, 1 << 16, "shared memory")

    monkeypatch.setattr(kernels, "_triton_takes", lambda *args: True)
    monkeypatch.setattr(triton_fold, "readout_spread", failing)
    monkeypatch.setattr(kernels, "_TRITON_FAILED", set())
    generator = torch.Generator().manual_seed(0)
    vector = torch.rand(2, 1, 6, generator=generator)
    query, key, value = (torch.randn(1, 2, 6, 4, generator=generator) for _ in range(3))
    options = dict(scale=0.5, causal=True, key_mask=None, mode=SpreadMode.ATTENTION)
    with pytest.warns(RuntimeWarning, match="PyTorch fold"):
        got = kernels.readout_spread(vector, query, key, value, None, **options)
    again = kernels.readout_spread(vector, query, key, value, None, **options)
    expected = torch_readout_spread(vector, query, key, value, None, **options, max_bytes=1 << 20)
    assert calls == [1]  # remembered: no second attempt on that device
    torch.testing.assert_close(got, expected, **FLOAT32)  # float32, other chunks
    torch.testing.assert_close(again, expected, **FLOAT32)
