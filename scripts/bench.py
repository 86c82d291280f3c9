"""Benchmark: what an explanation costs against the floor, and against the papers' loop.

For each model (ViT-B/16 at 224, a BERT-base-sized encoder at 128 and at 512 tokens, all
with random weights: speed does not depend on the values) it times, in interleaved
rounds (floor, generic, rollout, ..., floor, generic, ...) so that machine noise hits all
of them alike, and reports medians and ratios to the floor measured in the same run:

- floor: one forward and one backward of the same model and batch on the model's default
  attention path (fused where the model has it), parameters frozen, the backward running
  from the summed predicted logits down to the input of the first block: the least any
  gradient-based explanation can cost.
- generic, rollout: `Explainer.explain` as a user calls it (attention path chosen
  automatically; forced variants are listed separately).
- reference loop: the papers' code, one input at a time: explicit attention, every
  parameter gradient computed, `retain_graph=True`, every block's full attention map and
  gradient stored, and the full N x N matrices multiplied over all blocks.

Peak memory is measured for every variant by one more call after the timed rounds: freed
heap pages are returned to the OS (malloc_trim), the kernel's peak-resident-set counter
is reset (/proc/self/clear_refs), and the figure is VmHWM after the call minus VmRSS
before it, i.e. the resident memory the call itself added at its peak (on CUDA:
torch.cuda.max_memory_allocated minus the memory allocated before the call).

The reference loop and the top-5 row are timed on SCALED_INPUTS inputs and scaled to the
batch (their cost is a sum over inputs), which keeps the default run under 10 minutes on
an idle 2-core machine.

    python scripts/bench.py [--rounds 3] [--cases vit,bert128,bert512] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import gc
import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from explain import Explainer
from explain.architectures import adapter_for
from explain.fused import CPU_FUSED_MIN_TOKENS, use_fused_path
from explain.io import atomic_write

FLOOR = "floor (forward + input backward)"
REFERENCE = "reference loop (per input, papers' code)"


@dataclasses.dataclass(frozen=True)
class Case:
    """A model, its batch, and how to build both."""

    name: str
    title: str
    batch: int
    tokens: int


CASES = {
    "vit": Case("vit", "ViT-B/16, 224 x 224", batch=8, tokens=197),
    # Smaller text batches keep `make bench` under 10 minutes on a 2-core machine.
    "bert128": Case("bert128", "BERT-base classifier, 128 tokens", batch=4, tokens=128),
    "bert512": Case("bert512", "BERT-base classifier, 512 tokens", batch=1, tokens=512),
}


def build(case: Case, device: torch.device) -> tuple[torch.nn.Module, Any]:
    """The model (random weights, eval mode) and a batch of inputs, on `device`."""
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        if case.name == "vit":
            import timm

            model = timm.create_model("vit_base_patch16_224", pretrained=False)
            inputs: Any = torch.randn(case.batch, 3, 224, 224, generator=generator)
        else:
            from transformers import BertConfig, BertForSequenceClassification

            config = BertConfig(max_position_embeddings=512, num_labels=2)  # BERT-base sizes
            model = BertForSequenceClassification(config)
            ids = torch.randint(
                1000, config.vocab_size, (case.batch, case.tokens), generator=generator
            )
            ids[:, 0] = 101  # [CLS]
            inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    model = model.eval().to(device)
    inputs = (
        inputs.to(device)
        if isinstance(inputs, torch.Tensor)
        else {k: v.to(device) for k, v in inputs.items()}
    )
    return model, inputs


def rows_of(inputs: Any, rows: slice) -> Any:
    """The inputs `rows` of the batch, as a batch."""
    if isinstance(inputs, torch.Tensor):
        return inputs[rows]
    return {key: value[rows] for key, value in inputs.items()}


def floor(model: torch.nn.Module, inputs: Any) -> Callable[[], None]:
    """Forward + backward from the summed predicted logits to the first block's input, on
    the model's default attention path, with no parameter gradient."""
    adapter = adapter_for(model)
    prepared = adapter.prepare(inputs)
    leaf: list[torch.Tensor] = []

    def make_leaf(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            hidden = args[0].detach().requires_grad_(True)
            args = (hidden, *args[1:])
        else:
            key = next(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
            hidden = kwargs[key].detach().requires_grad_(True)
            kwargs = {**kwargs, key: hidden}
        leaf.append(hidden)
        return args, kwargs

    def run() -> None:
        flags = [(p, p.requires_grad) for p in model.parameters()]
        handle = adapter.blocks[0].register_forward_pre_hook(make_leaf, with_kwargs=True)
        try:
            for parameter, _ in flags:
                parameter.requires_grad_(False)
            leaf.clear()
            logits = adapter.forward(prepared)
            torch.autograd.grad(logits.max(dim=-1).values.sum(), leaf[0])
        finally:
            handle.remove()
            for parameter, flag in flags:
                parameter.requires_grad_(flag)

    return run


def method(
    model: torch.nn.Module, inputs: Any, name: str, path: str = "auto", **kw: Any
) -> Callable[[], None]:
    explainer = Explainer(model, attention_path=path)
    return lambda: explainer.explain(inputs, method=name, **kw)


def reference_loop(model: torch.nn.Module, inputs: Any, batch: int) -> Callable[[], None]:
    """The papers' generic-rule code, one input at a time (see the module docstring)."""
    adapter = adapter_for(model)

    def explain_one(one: Any) -> torch.Tensor:
        prepared = adapter.prepare(one)
        attentions: dict[int, torch.Tensor] = {}
        grads: dict[int, torch.Tensor] = {}

        def save(layer: int, attention: torch.Tensor) -> None:
            attentions[layer] = attention
            attention.register_hook(lambda grad: grads.__setitem__(layer, grad))

        handles = [
            site.module.register_forward_hook(
                lambda m, args, out, s=site: save(s.layer, s.probabilities(out))
            )
            for site in adapter.attention_sites()
        ]
        try:
            output = adapter.forward(prepared)
            one_hot = torch.zeros_like(output)
            one_hot[0, output.argmax(dim=-1)] = 1.0
            model.zero_grad()
            (one_hot * output).sum().backward(retain_graph=True)
        finally:
            for handle in handles:
                handle.remove()
        tokens = attentions[0].shape[-1]
        relevance = torch.eye(tokens, device=output.device)
        for layer in range(adapter.num_layers):
            cam = (grads[layer] * attentions[layer]).clamp(min=0).mean(dim=1)[0]
            relevance = relevance + cam @ relevance
        return adapter.readout(prepared)[0] @ relevance

    def run() -> None:
        flags = adapter.path_flags()
        old = [getattr(s.owner, s.name) for s in flags]
        try:
            for setting in flags:
                setattr(setting.owner, setting.name, setting.value)
            for index in range(batch):
                explain_one(rows_of(inputs, slice(index, index + 1)))
        finally:
            for setting, value in zip(flags, old, strict=True):
                setattr(setting.owner, setting.name, value)
            model.zero_grad(set_to_none=True)

    return run


@dataclasses.dataclass(frozen=True)
class Variant:
    """One timed row: `run` explains `inputs` of the case's batch (all of it unless the row
    is timed on a few inputs and scaled, see SCALED_INPUTS)."""

    run: Callable[[], None]
    inputs: int


SCALED_INPUTS = 2
"""Rows whose cost is a sum over inputs (the reference loop runs one input at a time; the
top-5 row's batched backward grows with inputs x targets) are timed on this many inputs
and scaled to the batch: it keeps `make bench` under 10 minutes on 2 cores. Their memory
is that of the inputs timed."""


def variants(case: Case, model: torch.nn.Module, inputs: Any) -> dict[str, Variant]:
    """Every timed variant of one case, the floor first."""
    few = min(SCALED_INPUTS, case.batch)
    some = rows_of(inputs, slice(0, few))
    found = {
        FLOOR: Variant(floor(model, inputs), case.batch),
        "generic": Variant(method(model, inputs, "generic"), case.batch),
        "rollout": Variant(method(model, inputs, "rollout"), case.batch),
        "attnlrp": Variant(method(model, inputs, "attnlrp"), case.batch),
        "cp_lrp": Variant(method(model, inputs, "cp_lrp"), case.batch),
        REFERENCE: Variant(reference_loop(model, some, few), few),
    }
    adapter = adapter_for(model)
    if adapter.fused_path() is not None:
        # Only the path that "auto" does not take: the "generic" row already times the other.
        layout = adapter.prepare(rows_of(inputs, slice(0, 1))).layout
        auto = use_fused_path(adapter, layout, needs_gradients=True, requested="auto")
        other = "explicit" if auto else "fused"
        found[f"generic, {other} path"] = Variant(
            method(model, inputs, "generic", other), case.batch
        )
    if case.name == "vit":
        top5 = torch.arange(5).expand(few, 5)
        found["generic, top-5 classes (one batched backward)"] = Variant(
            method(model, some, "generic", target=top5), few
        )
    return found


def run_case(
    case: Case, rounds: int, device: torch.device, memory: bool
) -> tuple[dict[str, list[float]], dict[str, int], dict[str, int]]:
    """Per variant: seconds per call scaled to the batch, in `rounds` interleaved rounds;
    the peak memory one more call added (if `memory`); and the inputs it was timed on.

    A warm-up round first fills caches, thread pools and allocators: every variant on one
    input, then the floor on the whole batch (kernels are tuned per tensor shape). Memory
    is measured after the timed rounds, because returning freed pages to the OS before a
    call (which the measurement needs) would slow the call down.
    """
    model, inputs = build(case, device)
    calls = variants(case, model, inputs)
    warm_up = variants(dataclasses.replace(case, batch=1), model, rows_of(inputs, slice(0, 1)))
    warm_up["floor, whole batch"] = calls[FLOOR]
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    total = len(warm_up) + (rounds + memory) * len(calls)
    progress = tqdm(total=total, desc=case.name, unit="call")
    for variant in warm_up.values():
        variant.run()
        progress.update()
    for _ in range(rounds):
        for name, variant in calls.items():
            seconds[name].append(timed(variant.run, device) * case.batch / variant.inputs)
            progress.update()
    peaks = {}
    if memory:
        for name, variant in calls.items():
            peaks[name] = peak_memory(variant.run, device)
            progress.update()
    progress.close()
    return seconds, peaks, {name: variant.inputs for name, variant in calls.items()}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _release_free_memory() -> None:
    """Return freed heap pages to the OS, so that the next call's peak starts from the
    memory that is really in use (glibc otherwise keeps them resident)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def timed(fn: Callable[[], None], device: torch.device) -> float:
    """Wall-clock seconds of one call of `fn`."""
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def peak_memory(fn: Callable[[], None], device: torch.device) -> int:
    """Peak bytes that one call of `fn` adds to what is in use before it."""
    _release_free_memory()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status_kib("VmRSS")
    fn()
    return (_status_kib("VmHWM") - before) * 1024


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            line.split(":", 1)[1].strip()
            for line in cpuinfo.read_text().splitlines()
            if line.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{cpu}, {os.cpu_count()} logical cores, {torch.get_num_threads()} torch threads, "
        f"Python {platform.python_version()}, torch {torch.__version__}, {platform.system()}; "
        f"1-minute load average {load:.1f} when the run started (the machine is shared)"
    )


def table(
    case: Case, seconds: dict[str, list[float]], peak: dict[str, int], inputs: dict[str, int]
) -> list[str]:
    """The case's Markdown table: medians, ratios to the floor, and the targets' verdicts."""
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    base, base_peak = medians[FLOOR], peak.get(FLOOR)
    lines = [
        f"### {case.title}, batch {case.batch} ({case.tokens} tokens per input)",
        "",
        "| variant | inputs timed | median s (batch) | time / floor | peak MiB | memory / floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, value in medians.items():
        mib = f"{peak[name] / 2**20:.0f}" if name in peak else "-"
        # A row timed on fewer inputs holds their memory, not the batch's: no ratio.
        comparable = name in peak and base_peak and inputs[name] == case.batch
        ratio = f"{peak[name] / base_peak:.2f}" if comparable else "-"
        lines.append(
            f"| {name} | {inputs[name]} | {value:.2f} | {value / base:.2f} | {mib} | {ratio} |"
        )
    speedup = medians[REFERENCE] / medians["generic"]
    lines += [
        "",
        f"generic: {speedup:.2f}x faster per input than the reference loop.",
        "",
    ]
    for label, value, limit, at_most in targets(case, medians, peak, speedup):
        verdict = "met" if (value <= limit if at_most else value >= limit) else "MISSED"
        bound = "at most" if at_most else "at least"
        lines.append(f"- target {label} {bound} {limit}: {value:.2f}, {verdict}")
    return [*lines, ""]


def targets(
    case: Case, medians: dict[str, float], peaks: dict[str, float], speedup: float
) -> list[tuple[str, float, float, bool]]:
    """(label, value, limit, at_most) for the issue's targets that apply to `case`."""
    floor_time = medians[FLOOR]
    found = []
    if case.name == "vit":
        found += [
            ("generic time / floor", medians["generic"] / floor_time, 1.2, True),
            ("speed-up over the reference loop", speedup, 1.4, False),
        ]
        if peaks.get(FLOOR):
            found.append(("generic memory / floor", peaks["generic"] / peaks[FLOOR], 1.3, True))
    if case.name == "bert512":
        found += [
            ("generic time / floor", medians["generic"] / floor_time, 1.3, True),
            ("rollout time / floor", medians["rollout"] / floor_time, 1.3, True),
        ]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up")
    parser.add_argument(
        "--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES)
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, help="batch size for every case (e.g. 64 on a GPU)")
    parser.add_argument("--out", type=Path, help="write the report here (Markdown)")
    args = parser.parse_args()
    device = torch.device(args.device)

    started = time.perf_counter()
    header = machine()
    sections = []
    for name in args.cases.split(","):
        case = CASES[name]
        if args.batch:
            case = dataclasses.replace(case, batch=args.batch)
        seconds, peaks, inputs = run_case(case, args.rounds, device, memory=not args.no_memory)
        section = table(case, seconds, peaks, inputs)
        sections += section
        print("\n".join(section), flush=True)
    elapsed = time.perf_counter() - started
    report = REPORT.format(
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        machine=header,
        device=device.type.upper(),
        rounds=args.rounds,
        minutes=elapsed / 60,
        tables="\n".join(sections),
        threshold=CPU_FUSED_MIN_TOKENS,
        scaled=SCALED_INPUTS,
    )
    if args.out:
        with atomic_write(args.out, "w") as handle:
            handle.write(report)
    print(f"benchmark took {elapsed / 60:.1f} min")


REPORT = """\
# Benchmarks

Generated by `make bench` (`python scripts/bench.py --out docs/benchmarks.md`) on
{date}, {device}: {machine}. Medians of {rounds} interleaved rounds after a warm-up round
(every variant on one input, the floor on the batch); the whole run took {minutes:.1f}
minutes. Random weights (speed does not depend on them).

What the rows measure:

- **floor**: one forward and one backward of the same model and batch on the model's
  default attention path (timm's fused kernel, Hugging Face sdpa), parameters frozen,
  backward from the summed predicted logits to the first block's input. No explanation
  can cost less: every gradient method needs this forward and this backward.
- **generic**, **rollout**: `Explainer(model).explain(inputs, method=...)`, the attention
  path chosen automatically (`explain.fused.use_fused_path`: explicit below
  {threshold} tokens on CPU, fused from there on and on CUDA, explicit for forward-only
  methods). `rollout` needs no backward at all.
- **attnlrp**, **cp_lrp**: the same for AttnLRP and CP-LRP (one forward under their
  gradient rules and one backward to the embeddings, on the attention path "auto" picks
  for gradient methods).
- **generic, explicit / fused path**: the same with the path that "auto" did not take
  forced, to show the rule's basis (only for adapters that have a fused path).
- **generic, top-5 classes**: five targets per input from one forward and one batched
  (`is_grads_batched`) backward.
- **reference loop**: the papers' code: one input at a time, explicit attention, every
  parameter gradient, `retain_graph=True`, every block's attention and gradient kept,
  full N x N products over all blocks.
- **inputs timed**: the reference loop and the top-5 row are timed on {scaled} inputs and
  their seconds scaled to the batch (their cost is a sum over inputs); their peak memory
  is that of the inputs timed, so it gets no ratio.
- **peak MiB**: the resident memory one more call after the timed rounds added at its
  peak (VmHWM after the call minus VmRSS before it; freed heap pages are returned with
  malloc_trim and the peak counter is reset through /proc/self/clear_refs just before the
  call, which is why it is not measured on the timed calls). It includes the reference
  loop's parameter gradients (the size of the model) and torch's own allocator overhead.

{tables}
GPU figures are pending: no GPU was available in the session that wrote this benchmark.
On CUDA the script measures `torch.cuda.max_memory_allocated` instead of resident memory
(`python scripts/bench.py --device cuda`).
"""


if __name__ == "__main__":
    main()
