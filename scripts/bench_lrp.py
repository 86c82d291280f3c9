"""Benchmark: the LRP methods against `generic` on ViT-B/16 (random weights), CPU.

Cases run in interleaved rounds (generic, transformer_attribution, partial_lrp, lrp,
generic, ...) so that machine noise hits all of them alike; the report gives medians and
ratios to `generic` measured in the same run.

    python scripts/bench_lrp.py --rounds 5 [--batch 8]

Measured 2026-11-30 on the shared 2-core CPU (heavily loaded, so absolute times are
inflated; the interleaved ratios are what to read): generic 47.7 s, transformer_attribution
169.4 s (3.55x), partial_lrp 27.7 s (0.58x), lrp 137.1 s (2.87x), batch 8, 5 rounds.
"""

from __future__ import annotations

import argparse
import platform

import torch
from bench import method, run_case, vit_b16

CASES = ("generic", "transformer_attribution", "partial_lrp", "lrp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()

    model, images = vit_b16(args.batch)
    medians = run_case({name: method(model, images, name) for name in CASES}, args.rounds)
    print(
        f"ViT-B/16, batch {args.batch}, CPU ({platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads), torch {torch.__version__}, "
        f"median of {args.rounds} interleaved rounds\n"
    )
    print("| method | median s | ratio to generic |\n|---|---|---|")
    for name, seconds in medians.items():
        print(f"| {name} | {seconds:.3f} | {seconds / medians['generic']:.2f} |")


if __name__ == "__main__":
    main()
