"""Benchmark: explanation cost against the floor (one forward + one input-gradient backward).

Every case is timed in interleaved rounds (floor, method, floor, method, ...) so that
machine noise hits all of them alike; the report gives medians and ratios to the floor
measured in the same run.

    python scripts/bench.py --rounds 7 [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from explain import Explainer


def vit_b16(batch: int) -> tuple[torch.nn.Module, torch.Tensor]:
    import timm

    model = timm.create_model("vit_base_patch16_224", pretrained=False).eval()
    images = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    return model, images


def floor(model: torch.nn.Module, images: torch.Tensor) -> Callable[[], None]:
    """Forward + backward to the input, default (fused) attention path, no parameter grads."""

    def run() -> None:
        flags = [p.requires_grad_(False) for p in model.parameters()]
        try:
            x = images.clone().requires_grad_(True)
            logits = model(x)
            torch.autograd.grad(logits.max(dim=-1).values.sum(), x)
        finally:
            for p in flags:
                p.requires_grad_(True)

    return run


def method(model: torch.nn.Module, images: torch.Tensor, name: str) -> Callable[[], None]:
    explainer = Explainer(model)
    return lambda: explainer.explain(images, method=name)


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_case(cases: dict[str, Callable[[], None]], rounds: int) -> dict[str, float]:
    for fn in cases.values():  # warm-up
        fn()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            samples[name].append(timed(fn))
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    model, images = vit_b16(args.batch)
    medians = run_case(
        {
            "floor (forward + input backward)": floor(model, images),
            "generic": method(model, images, "generic"),
            "rollout": method(model, images, "rollout"),
        },
        args.rounds,
    )
    base = medians["floor (forward + input backward)"]
    lines = [
        f"ViT-B/16, batch {args.batch}, CPU ({platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads), torch {torch.__version__}, "
        f"median of {args.rounds} interleaved rounds",
        "",
        "| case | median s | ratio to floor |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {value:.3f} | {value / base:.2f} |" for name, value in medians.items()]
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(f"# Benchmarks\n\n{report}\n")


if __name__ == "__main__":
    main()
