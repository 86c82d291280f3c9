"""Runs explain.engine.kernels.triton_fold under Triton's CPU interpreter, for
tests/test_triton_fold.py: Triton decorates its own library functions when it is first
imported, so TRITON_INTERPRET must be set before that, in a process of its own.

TRITON_INTERPRET=1 python triton_fold_worker.py CALLS OUT
CALLS is a torch.save'd list of (args, kwargs) for `readout_spread`; OUT receives the list
of its results, or of the error's (type name, message) where a call raises.
"""

from __future__ import annotations

import os
import sys

import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    raise SystemExit("run with TRITON_INTERPRET=1: there is no GPU here to compile for")

from explain.engine.kernels.triton_fold import readout_spread


def _bfloat16_products() -> None:
    """Triton's interpreter keeps bfloat16 tensors as their raw 16 bits (numpy has no
    bfloat16) and its `tl.dot` multiplies those bits as integers. Upcast them first, as a
    GPU's tensor cores read them: a bfloat16 is a float32's upper 16 bits, so the upcast
    is exact and the kernel's own arithmetic is what the tests see."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    dot = interpreter.InterpreterBuilder.create_dot

    def upcast(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        bits = handle.data.astype(np.uint32) << 16
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def create_dot(self, a, b, *args):
        return dot(self, upcast(a), upcast(b), *args)

    interpreter.InterpreterBuilder.create_dot = create_dot


_bfloat16_products()


def main(calls_path: str, out_path: str) -> None:
    results: list[object] = []
    for args, kwargs in torch.load(calls_path, weights_only=False):  # calls name a SpreadMode
        try:
            results.append(readout_spread(*args, **kwargs))
        except Exception as error:  # reported to the test, which asserts on it
            results.append((type(error).__name__, str(error)))
    torch.save(results, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
