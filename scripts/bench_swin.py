"""Benchmark Swin: explaining a Swin-T against its own forward and backward, and the
windowed fold against the dense fold it replaces.

    OMP_NUM_THREADS=1 python scripts/bench_swin.py [--rounds 3] [--out docs/benchmarks.md]

Rows (medians of interleaved rounds after a warm-up, ratios against the floor of the same
run): the floor (one forward and one backward of timm's `swin_tiny_patch4_window7_224`,
random weights, parameters frozen, from the summed predicted logits to the input);
`generic` and `rollout` through `Explainer`; and the fold alone, given every block's
recorded windows: windowed (explain.rules.fold) against dense (each block's (N, N)
matrix materialised from its windows, zeros across windows, the readout row folded
through it). The section goes between its markers in the output file; other sections are
left as they are.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from explain import Explainer
from explain.architectures.registry import adapter_for
from explain.export import atomic_write
from explain.layout import TokenLayout
from explain.rules.fold import WindowedFold, to_windows, unmerge
from explain.rules.gradient import generic_split, gradient_weighted

BEGIN = "<!-- windowed attention: scripts/bench_swin.py -->"
END = "<!-- end of windowed attention -->"


def dense_fold(layout: TokenLayout, records, readout: torch.Tensor) -> torch.Tensor:
    """The fold with every block's (N, N) matrix built: the cost windows avoid."""
    vector = readout
    grid = layout.windows[-1].grid
    for layer in reversed(range(len(layout.windows))):
        block = layout.windows[layer]
        while grid != block.grid:
            grid = (2 * grid[0], 2 * grid[1])
            vector = unmerge(vector, grid)
        attention, gradient = records[layer]
        windows = gradient_weighted(attention, gradient)  # (B * windows, w, w)
        batch, n = vector.shape[0], block.num_tokens
        # position of every window token on the grid: to_windows of the token numbers
        index = to_windows(torch.arange(n, dtype=torch.float64)[None].expand(batch, n), block)
        index = index.long().reshape(batch, block.num_windows, -1)
        matrix = torch.zeros(batch, n, n)
        per_window = windows.reshape(batch, block.num_windows, *windows.shape[1:])
        for k in range(block.num_windows):
            rows = index[:, k]
            matrix[:, rows[0][:, None], rows[0][None, :]] = per_window[:, k]
        vector = vector + torch.bmm(vector[:, None], matrix)[:, 0]
    while grid != layout.windows[0].grid:
        grid = (2 * grid[0], 2 * grid[1])
        vector = unmerge(vector, grid)
    return vector


def windowed_fold(layout: TokenLayout, records, readout: torch.Tensor) -> torch.Tensor:
    fold = WindowedFold(
        readout[None], layout.windows, range(len(layout.windows)), gradient_weighted, generic_split
    )
    for layer in reversed(range(len(layout.windows))):
        attention, gradient = records[layer]
        fold.add(layer, slice(0, 1), attention, gradient[None])  # one column
    return fold.result()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import timm

    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).eval()
    images = torch.randn(1, 3, 224, 224)
    explainer = Explainer(model)
    layout = adapter_for(model).prepare(images).layout
    assert layout.windows
    trace = explainer.trace(images, score="logit")
    records = list(zip(trace.attentions, trace.attention_grads, strict=True))
    readout = torch.full((1, layout.windows[-1].num_tokens), 1.0 / layout.windows[-1].num_tokens)
    torch.testing.assert_close(
        windowed_fold(layout, records, readout), dense_fold(layout, records, readout)
    )
    for parameter in model.parameters():
        parameter.requires_grad_(False)

    def floor() -> None:
        leaf = images.clone().requires_grad_(True)
        logits = model(leaf)
        logits.gather(1, logits.argmax(1, keepdim=True)).sum().backward()

    variants = {
        "floor (forward + backward)": floor,
        "generic": lambda: explainer.explain(images, method="generic"),
        "rollout": lambda: explainer.explain(images, method="rollout"),
        "fold only, windowed": lambda: windowed_fold(layout, records, readout),
        "fold only, dense (N x N per block)": lambda: dense_fold(layout, records, readout),
    }
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.rounds + 1):
        for name, run in variants.items():
            started = time.perf_counter()
            run()
            if round_:  # the first round warms up
                seconds[name].append(time.perf_counter() - started)
    median = {name: statistics.median(times) for name, times in seconds.items()}
    floor_s = median["floor (forward + backward)"]
    dense_s = median["fold only, dense (N x N per block)"]
    largest = max(b.num_tokens for b in layout.windows)
    window = max(b.window_tokens for b in layout.windows)
    rows = [
        BEGIN,
        "## Windowed attention (Swin)",
        "",
        f"Generated by `python scripts/bench_swin.py` on "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}, {torch.get_num_threads()} torch "
        f"thread(s), CPU; timm `swin_tiny_patch4_window7_224` (random weights), one "
        f"224 x 224 image; medians of {args.rounds} interleaved rounds after a warm-up.",
        "",
        "A Swin block's attention is recorded per window: with windows of w tokens over a "
        "grid of N tokens the windowed fold costs O(N w) per block and never holds more "
        "than the block's own (B * N / w, H, w, w) records, where a dense fold would build "
        f"an N x N matrix: here N = {largest} tokens on the first stage and w = {window}, "
        f"so the dense matrix of one block is {largest * largest * 4 / 2**20:.0f} MiB in "
        f"float32 against {largest * window * 4 / 2**20:.2f} MiB for its windows.",
        "",
        "| variant | seconds | x floor | x dense fold |",
        "|---|---|---|---|",
    ]
    for name, value in median.items():
        fold = f"{value / dense_s:.3f}" if name.startswith("fold") else "-"
        rows.append(f"| {name} | {value:.3f} | {value / floor_s:.2f} | {fold} |")
    rows.append(END)
    section = "\n".join(rows)
    print(section)
    if args.out:
        text = args.out.read_text() if args.out.exists() else ""
        if BEGIN in text and END in text:
            start, stop = text.index(BEGIN), text.index(END) + len(END)
            text = text[:start] + section + text[stop:]
        else:
            text = text.rstrip("\n") + "\n\n" + section + "\n"
        with atomic_write(args.out, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
