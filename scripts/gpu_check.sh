#!/usr/bin/env bash
# The one command for a machine with an NVIDIA GPU (issue 22): the engine's correctness on
# CUDA against the CPU (tiny ViT, BERT and Llama, every method each takes, and the fold
# kernel) and the GPU benchmark, which writes the GPU section of docs/benchmarks.md.
#
#     bash scripts/gpu_check.sh
#
# Run from anywhere; it works in the repository root with PYTHONPATH=. (no install needed:
# PyTorch with CUDA, transformers, timm and tqdm must be importable; Triton, which ships
# with PyTorch's CUDA wheels, is used where present). Written for sessions that get one
# short loan of a GPU, so it:
#   - checks the versions and the device first, and stops at once if they cannot work;
#   - runs scripts/bench.py under a time limit (BENCH_LIMIT_S, default 360 s; the whole
#     run is estimated at about 4 minutes on an H200, see scripts/bench.py), which writes
#     the page after every case, so a run stopped at the limit keeps what it measured
#     (the longest case, 32k tokens, runs last); 360 s leaves a 15-minute loan room for
#     the machine's start and one rerun (give the device tool a timeout of about 420 s);
#   - copies the page and the log to $OUT when that is set (the device tool's folder of
#     files that come back).
# SMOKE=1 runs the same steps on the CPU at tiny shapes (scripts/bench.py --smoke) and
# writes its page to ${OUT:-/tmp}/benchmarks-smoke.md instead: how the tests check this
# script without a GPU (tests/test_bench_smoke.py).
# Exit status: the benchmark's (0: every case and check passed; 124: stopped at the limit).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
LIMIT="${BENCH_LIMIT_S:-360}"
LOG="${OUT:-/tmp}/gpu_check.log"
SMOKE="${SMOKE:-0}"
if [ "$SMOKE" = 1 ]; then
    PAGE="${OUT:-/tmp}/benchmarks-smoke.md"
    cp docs/benchmarks.md "$PAGE"
    RUN=(--device cpu --cases gpu --smoke --rounds 1 --out "$PAGE")
else
    PAGE=docs/benchmarks.md
    RUN=(--device cuda --cases gpu --out "$PAGE")
fi

SMOKE="$SMOKE" PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" - <<'EOF' || exit 2
import os
import sys

import timm
import torch
import transformers

print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}),"
      f" transformers {transformers.__version__}, timm {timm.__version__}")
try:
    import triton
    print(f"triton {triton.__version__}")
except ImportError:
    print("triton: not installed (readout_spread uses torch_fold)")
if torch.cuda.is_available():
    print(f"device: {torch.cuda.get_device_name(0)}, "
          f"{torch.cuda.mem_get_info()[0] / 2**30:.0f} GiB free")
elif os.environ["SMOKE"] != "1":
    sys.exit("no CUDA device: nothing to check here (SMOKE=1 runs the steps on the CPU)")
# The oldest versions the engine and this benchmark were checked against (issue 22).
for name, module, oldest in (("torch", torch, (2, 11)), ("transformers", transformers, (5, 17))):
    found = tuple(int(part) for part in module.__version__.split("+")[0].split(".")[:2])
    if found < oldest:
        sys.exit(f"{name} {module.__version__} is older than {'.'.join(map(str, oldest))}")
import explain  # noqa: F401  the package itself imports here
EOF

timeout --signal=INT --kill-after=30 "$LIMIT" env PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" scripts/bench.py \
    "${RUN[@]}" 2>"$LOG.stderr" | tee "$LOG"
status=${PIPESTATUS[0]}
tail -n 30 "$LOG.stderr" | tr '\r' '\n' | grep -v -e '%|' -e '^[[:space:]]*$' | tail -n 15
echo "scripts/bench.py exit status: $status (124: stopped at the ${LIMIT} s limit;" \
    "the page keeps every case measured before)"
if [ -n "${OUT:-}" ] && [ "$SMOKE" != 1 ]; then
    cp "$PAGE" "$OUT/benchmarks.md"
fi
exit "$status"
