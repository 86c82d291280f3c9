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


def main(calls_path: str, out_path: str) -> None:
    results: list[object] = []
    for args, kwargs in torch.load(calls_path):
        try:
            results.append(readout_spread(*args, **kwargs))
        except Exception as error:  # reported to the test, which asserts on it
            results.append((type(error).__name__, str(error)))
    torch.save(results, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
