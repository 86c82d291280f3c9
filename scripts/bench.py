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

Long prompts (`--cases long`): a narrow BERT (4 blocks, width 64, 4 heads) and a narrow
Llama of the same shape at 1024, 4096 and 16384 tokens, one input, against the same
floor: there the attention maps (N x N per block and head) dominate, and the fused
path's streaming fold (explain.engine.fused) is what keeps generic near the floor. Their tables
replace the "Long prompts" section of `--out` and leave the rest of the file as it is
(and a run of the other cases keeps that section).

GPU (`--device cuda --cases gpu`, GPU_CASES in the order GPU_ORDER): first every method
on tiny models (ViT, BERT, Llama) and `readout_spread` itself on CUDA against the CPU;
then `readout_spread` (Triton where it runs) against torch_fold at one Llama-1B block
(32 heads, 8 key-value heads, head dim 64, bfloat16, causal, 4k tokens; 1 and 64
columns), ViT-B/16 at batch 64 in float32 and bfloat16 (generic, rollout, attnlrp,
transformer_attribution and the papers' loop), a generation of 64 tokens after a
1,024-token prompt against its own floor (one forward and one 64-column batched
backward), and Llama-1B shapes in bfloat16 at 4k, 16k and 32k tokens (generic, rollout,
attnlrp), each against the floor of the same run. Its tables replace the "GPU" section
of `--out`, which is written after every case: a run stopped part way keeps what it
measured and names the cases it did not reach. A case that fails (out of memory, say)
is reported as FAILED and the next one runs; the script then exits with an error.

Time on an H200 (estimated, since no GPU has run it yet; each variant runs once on a
short warm-up input and 3 + 1 times on the case's input): the checks about 30 s with
Triton's first compilations, the kernel cases seconds, ViT about 15 s each, the
generation and Llama at 4k about 15 s each (the explicit maps fit the default budget),
16k about 30 s and 32k about 1.5 min (streamed; the floor alone is about a second per
call there), and 5-10 s per Llama-1B build: about 4 minutes in all, with imports; about
10 minutes if the generation and 4k calls still took the 10 s the issue measured before
the explicit path on CUDA and the fold over all columns. scripts/gpu_check.sh runs it
under a 6-minute limit (BENCH_LIMIT_S): a slower run loses its last cases, not the
others (32k tokens runs last).

Smoke run (`--smoke`): every case at tiny shapes (SMOKE_VIT, SMOKE_LLAMA, SMOKE_KERNEL,
SMOKE_TOKENS) through the same code, and the checks against the CPU itself, in about
half a minute on a CPU, so that the GPU run works the first time
(tests/test_bench_smoke.py). Its section says it is a smoke run; its figures mean
nothing.

    python scripts/bench.py [--rounds 3] [--cases vit,bert128,bert512] [--out docs/benchmarks.md]
    python scripts/bench.py --cases long --rounds 2 --out docs/benchmarks.md
    python scripts/bench.py --device cuda --cases gpu --out docs/benchmarks.md
    python scripts/bench.py --device cpu --cases gpu --smoke --rounds 1 --out /tmp/bench.md
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import gc
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from explain import Explainer
from explain.architectures import adapter_for
from explain.engine.fused import CPU_FUSED_MIN_TOKENS, choose_path, default_memory_budget
from explain.export import atomic_write
from explain.generation import Generation, explain_generation

FLOOR = "floor (forward + input backward)"
REFERENCE = "reference loop (per input, papers' code)"


@dataclasses.dataclass(frozen=True)
class Case:
    """A model, its batch, and how to build both."""

    name: str
    title: str
    batch: int
    tokens: int
    model: str = "bert-base"
    """"vit", "bert-base", "bert-narrow", "llama-narrow", "llama-1b", or "kernel" (one
    block's `readout_spread` at Llama-1B's attention shapes, no model)."""
    dtype: str = "float32"
    generated: int = 0
    """A generation: this many of the tokens are generated after the prompt."""
    gpu: bool = False
    """One of the GPU cases (GPU_CASES), reported in the GPU section."""
    columns: int = 0
    """The kernel cases (model "kernel"): readout columns folded at once."""
    smoke: bool = False
    """Tiny shapes (`smoke`): the case's code path, none of its figures."""

    @property
    def long(self) -> bool:
        return self.model.endswith("-narrow")

    @property
    def section(self) -> str:
        return "gpu" if self.gpu else "long" if self.long else "cpu"


CASES = {
    "vit": Case("vit", "ViT-B/16, 224 x 224", batch=8, tokens=197, model="vit"),
    # Smaller text batches keep `make bench` under 10 minutes on a 2-core machine.
    "bert128": Case("bert128", "BERT-base classifier, 128 tokens", batch=4, tokens=128),
    "bert512": Case("bert512", "BERT-base classifier, 512 tokens", batch=1, tokens=512),
}
LONG_TOKENS = (1024, 4096, 16384)
NARROW = {
    "bert-narrow": "narrow BERT classifier (4 blocks, width 64, 4 heads)",
    "llama-narrow": "narrow Llama (4 blocks, width 64, 4 heads, vocabulary 1024)",
}
for _model, _title in NARROW.items():
    for _tokens in LONG_TOKENS:
        _name = f"{_model}-{_tokens}"
        CASES[_name] = Case(_name, f"{_title}, {_tokens} tokens", 1, _tokens, model=_model)
DEFAULT_CASES = ("vit", "bert128", "bert512")
LONG_CASES = tuple(name for name, case in CASES.items() if case.long)
GPU_CASES = {
    "vit-gpu-fp32": Case("vit-gpu-fp32", "ViT-B/16, 224 x 224, float32", 64, 197, "vit", gpu=True),
    "vit-gpu-bf16": Case(
        "vit-gpu-bf16", "ViT-B/16, 224 x 224, bfloat16", 64, 197, "vit", "bfloat16", gpu=True
    ),
    **{
        f"llama-1b-{k}k": Case(
            f"llama-1b-{k}k",
            f"Llama-1B shapes, bfloat16, {k}k tokens",
            1,
            k * 1024,
            "llama-1b",
            "bfloat16",
            gpu=True,
        )
        for k in (4, 16, 32)
    },
    "generation": Case(
        "generation",
        "Llama-1B shapes, bfloat16, 1,024-token prompt + 64 generated tokens",
        1,
        1024 + 64,
        "llama-1b",
        "bfloat16",
        generated=64,
        gpu=True,
    ),
    **{
        f"kernel-4k-{columns}": Case(
            f"kernel-4k-{columns}",
            "readout_spread against torch_fold, one Llama-1B block (32 heads, 8 key-value "
            f"heads, head dim 64), bfloat16, causal, 4k tokens, {columns} column(s)",
            1,
            4096,
            "kernel",
            "bfloat16",
            gpu=True,
            columns=columns,
        )
        for columns in (1, 64)
    },
}
GPU_ORDER = (
    "kernel-4k-1",
    "kernel-4k-64",
    "vit-gpu-fp32",
    "vit-gpu-bf16",
    "generation",
    "llama-1b-4k",
    "llama-1b-16k",
    "llama-1b-32k",
)
"""The order of a GPU run: the kernel first (seconds, and whether Triton runs at all),
the longest case last, so that a run stopped by a time limit loses the least."""
GPU_CASES = {name: GPU_CASES[name] for name in GPU_ORDER}
CASES.update(GPU_CASES)
KERNEL_SHAPE = dict(heads=32, kv_heads=8, head_dim=64)
"""Llama 3.2 1B's attention (LLAMA_1B): what one block's fold reads."""
LLAMA_1B = dict(
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    tie_word_embeddings=True,
    rope_theta=500000.0,
)
"""Llama 3.2 1B's shapes (random weights)."""

WARM_UP_TOKENS = 512
"""Long prompts warm up on this many tokens: a full-length warm-up call would take minutes
at 16384 tokens on 2 cores and change nothing that the timed calls see."""

EXPLICIT_BYTES = 6 << 30
"""Variants on the explicit path are left out where its attention maps alone would pass
this many bytes (`explicit_bytes`): 16384 tokens would need tens of GiB."""

SMOKE_VIT = dict(img_size=32, embed_dim=32, depth=2, num_heads=2)
SMOKE_LLAMA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1024,
    tie_word_embeddings=True,
)
SMOKE_KERNEL = dict(heads=8, kv_heads=2, head_dim=16)
SMOKE_TOKENS = 64
"""A smoke run divides the Llama cases' tokens by this (4k, 16k, 32k -> 64, 256, 512:
the longest beyond explain.engine.fused.CPU_FUSED_MIN_TOKENS, so the streamed fold runs too),
and the generation's prompt by it and its generated tokens by 16."""


def smoke(case: Case) -> Case:
    """`case` at tiny shapes, for `--smoke`: the same code path in seconds on a CPU."""
    if case.model == "vit":
        tokens, generated = (SMOKE_VIT["img_size"] // 16) ** 2 + 1, 0
    elif case.generated:
        generated = max(2, case.generated // 16)
        tokens = (case.tokens - case.generated) // SMOKE_TOKENS + generated
    else:
        tokens, generated = case.tokens // SMOKE_TOKENS, 0
    return dataclasses.replace(
        case,
        title=f"{case.title} [smoke run: tiny shapes, {tokens} tokens]",
        batch=min(case.batch, 2),
        tokens=tokens,
        generated=generated,
        columns=min(case.columns, 4),
        smoke=True,
    )


def build(case: Case, device: torch.device) -> tuple[torch.nn.Module | None, Any]:
    """The model (random weights, eval mode) and a batch of inputs, on `device`; for a
    kernel case no model, and the kernel's tensors (`kernel_inputs`)."""
    generator = torch.Generator().manual_seed(0)
    if case.model == "kernel":
        return None, kernel_inputs(case, device)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        if case.model == "llama-1b":
            from transformers import LlamaConfig, LlamaForCausalLM

            shape = SMOKE_LLAMA if case.smoke else LLAMA_1B
            config = LlamaConfig(
                **shape, max_position_embeddings=case.tokens, attn_implementation="sdpa"
            )
            with torch.device(device):  # initialised where it runs: no 5 GB copy
                model = LlamaForCausalLM(config)
            vocabulary = int(shape["vocab_size"]) - 256
            ids = torch.randint(5, vocabulary, (case.batch, case.tokens), generator=generator)
            inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        elif case.model == "vit":
            import timm

            shape = SMOKE_VIT if case.smoke else {}
            model = timm.create_model("vit_base_patch16_224", pretrained=False, **shape)
            size = int(shape.get("img_size", 224))
            inputs: Any = torch.randn(case.batch, 3, size, size, generator=generator)
        elif case.long:
            model = narrow_model(case.model)
            ids = torch.randint(5, 1024, (case.batch, case.tokens), generator=generator)
            inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        else:
            from transformers import BertConfig, BertForSequenceClassification

            config = BertConfig(max_position_embeddings=512, num_labels=2)  # BERT-base sizes
            model = BertForSequenceClassification(config)
            ids = torch.randint(
                1000, config.vocab_size, (case.batch, case.tokens), generator=generator
            )
            ids[:, 0] = 101  # [CLS]
            inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    model = model.eval().to(device=device, dtype=getattr(torch, case.dtype))
    if isinstance(inputs, torch.Tensor):
        inputs = inputs.to(getattr(torch, case.dtype))
    inputs = (
        inputs.to(device)
        if isinstance(inputs, torch.Tensor)
        else {k: v.to(device) for k, v in inputs.items()}
    )
    return model, inputs


NARROW_SHAPE = dict(
    hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=256
)


def narrow_model(name: str) -> torch.nn.Module:
    """The long-prompt models (NARROW_SHAPE), with positions for the longest prompt."""
    shape = dict(
        **NARROW_SHAPE, max_position_embeddings=max(LONG_TOKENS), attn_implementation="sdpa"
    )
    if name == "bert-narrow":
        from transformers import BertConfig, BertForSequenceClassification

        return BertForSequenceClassification(BertConfig(num_labels=2, **shape))
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=1024, **shape))


def explicit_bytes(case: Case) -> int:
    """Roughly what the explicit path's attention maps of one long-case call need: kept
    for the gradient, blocks x heads x N x N floats, about three times over."""
    maps = NARROW_SHAPE["num_hidden_layers"] * NARROW_SHAPE["num_attention_heads"]
    return 3 * maps * case.batch * case.tokens**2 * 4


def rows_of(inputs: Any, rows: slice) -> Any:
    """The inputs `rows` of the batch, as a batch."""
    if isinstance(inputs, torch.Tensor):
        return inputs[rows]
    return {key: value[rows] for key, value in inputs.items()}


def _from_first_block(
    model: torch.nn.Module, adapter: Any, step: Callable[[list[torch.Tensor]], None]
) -> Callable[[], None]:
    """A run of `step(leaf)`, whose forward detaches the first block's input into `leaf`
    (so that its backward stops there), with no parameter gradient: the parameters are
    frozen for the run and restored after."""
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
            step(leaf)
        finally:
            handle.remove()
            for parameter, flag in flags:
                parameter.requires_grad_(flag)

    return run


def floor(model: torch.nn.Module, inputs: Any) -> Callable[[], None]:
    """Forward + backward from the summed predicted logits to the first block's input, on
    the model's default attention path, with no parameter gradient."""
    adapter = adapter_for(model)
    prepared = adapter.prepare(inputs)

    def step(leaf: list[torch.Tensor]) -> None:
        logits = adapter.forward(prepared)
        torch.autograd.grad(logits.max(dim=-1).values.sum(), leaf[0])

    return _from_first_block(model, adapter, step)


def method(
    model: torch.nn.Module, inputs: Any, name: str, path: str = "auto", **kw: Any
) -> Callable[[], None]:
    explainer = Explainer(model, attention_path=path)
    return lambda: explainer.explain(inputs, method=name, **kw)


def generation_floor(
    model: torch.nn.Module, inputs: Any, width: int, log_probability: bool = False
) -> Callable[[], None]:
    """A generation's floor: one forward, then one backward of every generated token's
    logit (or `log_probability`) to the first block's input, batched over the tokens
    (`is_grads_batched`)."""
    adapter = adapter_for(model)
    prepared = adapter.prepare(inputs)
    ids = inputs["input_ids"]
    positions = torch.arange(width - 1, ids.shape[1] - 1, device=ids.device)

    def step(leaf: list[torch.Tensor]) -> None:
        logits = adapter.logits_at(prepared, positions.expand(ids.shape[0], -1))
        if log_probability:
            logits = logits.log_softmax(dim=-1)
        scores = logits.gather(-1, ids[:, width:, None])[..., 0]  # (B, G)
        count = scores.shape[1]
        one_hot = torch.eye(count, dtype=scores.dtype, device=scores.device)[:, None, :]
        torch.autograd.grad(
            scores, leaf[0], one_hot.expand(count, *scores.shape), is_grads_batched=True
        )

    return _from_first_block(model, adapter, step)


def generation_method(model: torch.nn.Module, inputs: Any, width: int, name: str):
    """`explain_generation` of the inputs' last tokens after a prompt of `width`."""
    explainer = Explainer(model)
    generation = Generation(inputs["input_ids"], inputs["attention_mask"], width)
    return lambda: explain_generation(explainer, generation, method=name)


def kernel_inputs(case: Case, device: torch.device) -> dict[str, Any]:
    """One block's fold at Llama-1B's attention shapes (KERNEL_SHAPE): q, k, v in the
    case's dtype, dO for `case.columns` columns, their readout rows (float32, as the
    engine's folds hand them), causal, no padding."""
    shape = SMOKE_KERNEL if case.smoke else KERNEL_SHAPE
    heads, kv_heads, dim = shape["heads"], shape["kv_heads"], shape["head_dim"]
    batch, tokens, columns = case.batch, case.tokens, case.columns
    generator = torch.Generator().manual_seed(0)
    dtype = getattr(torch, case.dtype)

    def normal(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator).to(device=device, dtype=dtype)

    return dict(
        vector=torch.rand(columns, batch, tokens, generator=generator).to(device),
        query=normal(batch, heads, tokens, dim),
        key=normal(batch, kv_heads, tokens, dim),
        value=normal(batch, kv_heads, tokens, dim),
        output_grad=normal(columns, batch, heads, tokens, dim),
        scale=dim**-0.5,
        causal=True,
        key_mask=None,
        mode="gradient",
    )


KERNEL_BASE = "torch_fold (PyTorch, query rows chunked to the memory budget)"
KERNEL = "readout_spread (the engine's dispatch: Triton on CUDA where it runs)"


def kernel_variants(case: Case, tensors: dict[str, Any]) -> dict[str, Variant]:
    """The kernel case's rows: the PyTorch fold first (the baseline), then the dispatcher,
    both with the engine's default memory budget on the device."""
    from explain.engine.kernels import readout_spread
    from explain.engine.kernels.torch_fold import readout_spread as torch_readout_spread

    budget = default_memory_budget(tensors["query"].device)
    return {
        KERNEL_BASE: Variant(lambda: torch_readout_spread(**tensors, max_bytes=budget), 1),
        KERNEL: Variant(lambda: readout_spread(**tensors, max_bytes=budget), 1),
    }


def kernel_note(case: Case, device: torch.device) -> list[str]:
    """Which implementation the dispatcher ran, and how far its result is from
    torch_fold's (the largest difference over the largest value)."""
    from explain.engine.kernels import implementation, readout_spread
    from explain.engine.kernels.torch_fold import readout_spread as torch_readout_spread

    tensors = kernel_inputs(case, device)
    budget = default_memory_budget(device)
    found = readout_spread(**tensors, max_bytes=budget)
    expected = torch_readout_spread(**tensors, max_bytes=budget)
    ran = implementation(tensors["vector"], tensors["query"], tensors["key"])
    difference = float((found - expected).abs().max() / expected.abs().max().clamp(min=1e-30))
    names = {"triton": "the Triton kernel", "torch": "torch_fold (no Triton here)"}
    return [
        f"readout_spread ran {names[ran]}; largest difference from torch_fold / largest "
        f"value: {difference:.1e}.",
        "",
    ]


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
        relevance = torch.eye(tokens, device=output.device, dtype=attentions[0].dtype)
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


def variants(case: Case, model: torch.nn.Module | None, inputs: Any) -> dict[str, Variant]:
    """Every timed variant of one case, the floor (the kernel cases: torch_fold) first."""
    if case.model == "kernel":
        return kernel_variants(case, inputs)
    assert model is not None
    if case.long:
        return long_variants(case, model, inputs)
    if case.gpu:
        return gpu_variants(case, model, inputs)
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
        other = "fused" if auto_path(model, inputs) == "explicit" else "explicit"
        found[f"generic, {other} path"] = Variant(
            method(model, inputs, "generic", other), case.batch
        )
    if case.model == "vit":
        top5 = torch.arange(5).expand(few, 5)
        found["generic, top-5 classes (one batched backward)"] = Variant(
            method(model, some, "generic", target=top5), few
        )
    return found


def auto_path(model: torch.nn.Module, inputs: Any) -> str:
    """The path "auto" takes for `generic` on these inputs."""
    adapter = adapter_for(model)
    prepared = adapter.prepare(inputs)
    return choose_path(
        adapter,
        prepared.layout,
        batch=prepared.batch_size,
        needs_gradients=True,
        requested="auto",
        memory_budget=default_memory_budget(adapter.parameter.device),
    )


def gpu_variants(case: Case, model: torch.nn.Module, inputs: Any) -> dict[str, Variant]:
    """The GPU cases' rows (GPU_CASES), the floor first."""
    if case.generated:
        width = case.tokens - case.generated
        return {
            FLOOR: Variant(generation_floor(model, inputs, width), case.batch),
            **{
                name: Variant(generation_method(model, inputs, width, name), case.batch)
                for name in ("generic", "rollout", "attnlrp")
            },
        }
    names = ["generic", "rollout", "attnlrp"]
    if case.model == "vit":
        names.append("transformer_attribution")
    found = {FLOOR: Variant(floor(model, inputs), case.batch)}
    found.update({name: Variant(method(model, inputs, name), case.batch) for name in names})
    if case.model == "vit":
        few = min(SCALED_INPUTS, case.batch)
        found[REFERENCE] = Variant(reference_loop(model, rows_of(inputs, slice(0, few)), few), few)
    return found


def long_variants(case: Case, model: torch.nn.Module, inputs: Any) -> dict[str, Variant]:
    """Floor, generic on the path "auto" takes and on the other one, where they fit."""
    fused = auto_path(model, inputs) == "fused"
    fits = explicit_bytes(case) <= EXPLICIT_BYTES
    found = {FLOOR: Variant(floor(model, inputs), case.batch)}
    if fused or fits:
        found["generic"] = Variant(method(model, inputs, "generic"), case.batch)
    if fused and fits:
        found["generic, explicit path"] = Variant(
            method(model, inputs, "generic", "explicit"), case.batch
        )
    return found


def run_case(
    case: Case, rounds: int, device: torch.device, memory: bool
) -> tuple[dict[str, list[float]], dict[str, int], dict[str, int]]:
    """Per variant: seconds per call scaled to the batch, in `rounds` interleaved rounds;
    the peak memory one more call added (if `memory`); and the inputs it was timed on.

    A warm-up round first fills caches, thread pools and allocators: every variant on one
    input, then the floor on the whole batch (kernels are tuned per tensor shape); long
    prompts warm up on their first WARM_UP_TOKENS tokens. Memory
    is measured after the timed rounds, because returning freed pages to the OS before a
    call (which the measurement needs) would slow the call down.
    """
    model, inputs = build(case, device)
    calls = variants(case, model, inputs)
    if case.model == "kernel":  # Triton compiles on the first call
        warm_up = dict(calls)
    elif case.long or case.model == "llama-1b":  # a short prefix warms up in seconds
        short = dataclasses.replace(case, tokens=min(case.tokens, WARM_UP_TOKENS + case.generated))
        prefix = {k: v[:, -short.tokens :] for k, v in inputs.items()}
        warm_up = variants(short, model, prefix)
    else:
        one = rows_of(inputs, slice(0, 1))
        warm_up = variants(dataclasses.replace(case, batch=1), model, one)
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
    first = next(iter(medians))  # the floor, or for a kernel case torch_fold
    base, base_peak = medians[first], peak.get(first)
    against = "floor" if first == FLOOR else "torch_fold"
    lines = [
        f"### {case.title}, batch {case.batch} ({case.tokens} tokens per input)",
        "",
        f"| variant | inputs timed | median s (batch) | time / {against} | peak MiB "
        f"| memory / {against} |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, value in medians.items():
        mib = f"{peak[name] / 2**20:.0f}" if name in peak else "-"
        # A row timed on fewer inputs holds their memory, not the batch's: no ratio.
        comparable = name in peak and base_peak and inputs[name] == case.batch
        ratio = f"{peak[name] / base_peak:.2f}" if comparable else "-"
        lines.append(
            f"| {name} | {inputs[name]} | {value:.3g} | {value / base:.2f} | {mib} | {ratio} |"
        )
    lines.append("")
    speedup = medians[REFERENCE] / medians["generic"] if REFERENCE in medians else None
    if speedup is not None:
        lines += [f"generic: {speedup:.2f}x faster per input than the reference loop.", ""]
    if case.long and "generic" not in medians:
        lines += [
            f"generic: not run; this model has no fused path, and the explicit path's "
            f"attention maps would need about {explicit_bytes(case) / 2**30:.0f} GiB.",
            "",
        ]
    for label, value, limit, at_most in targets(case, medians, peak, speedup):
        verdict = "met" if (value <= limit if at_most else value >= limit) else "MISSED"
        bound = "at most" if at_most else "at least"
        lines.append(f"- target {label} {bound} {limit}: {value:.2f}, {verdict}")
    return [*lines, ""]


def targets(
    case: Case, medians: dict[str, float], peaks: dict[str, float], speedup: float | None
) -> list[tuple[str, float, float, bool]]:
    """(label, value, limit, at_most) for the issue's targets that apply to `case` (none
    to a kernel case, whose baseline is torch_fold, not the floor)."""
    if case.model == "kernel":
        return []
    floor_time = medians[FLOOR]
    found: list[tuple[str, float, float, bool]] = []
    if case.long and case.tokens == 4096 and "generic" in medians:
        found.append(("generic time / floor", medians["generic"] / floor_time, 2.0, True))
        if peaks.get(FLOOR):
            found.append(("generic memory / floor", peaks["generic"] / peaks[FLOOR], 1.5, True))
    if case.name == "vit" and speedup is not None:
        found += [
            ("generic time / floor", medians["generic"] / floor_time, 1.2, True),
            ("speed-up over the reference loop", speedup, 1.4, False),
        ]
        if peaks.get(FLOOR):
            found.append(("generic memory / floor", peaks["generic"] / peaks[FLOOR], 1.3, True))
    if case.gpu:
        found += gpu_targets(case, medians, peaks, speedup)
    if case.name == "bert512":
        found += [
            ("generic time / floor", medians["generic"] / floor_time, 1.3, True),
            ("rollout time / floor", medians["rollout"] / floor_time, 1.3, True),
        ]
    return found


def gpu_targets(
    case: Case, medians: dict[str, float], peaks: dict[str, float], speedup: float | None
) -> list[tuple[str, float, float, bool]]:
    """The issue's GPU goals (H200) that apply to `case`."""
    time = {name: value / medians[FLOOR] for name, value in medians.items()}
    memory = {name: value / peaks[FLOOR] for name, value in peaks.items() if peaks.get(FLOOR)}
    found: list[tuple[str, float, float, bool]] = []
    if case.name == "vit-gpu-bf16":
        found.append(("generic time / floor", time["generic"], 1.3, True))
        found.append(
            ("transformer_attribution time / floor", time["transformer_attribution"], 2.0, True)
        )
    if case.name == "vit-gpu-fp32" and speedup is not None:
        found.append(("speed-up over the reference loop", speedup, 10.0, False))
    if case.model == "llama-1b" and not case.generated:
        found.append(("generic time / floor", time["generic"], 1.5, True))
        if "generic" in memory:
            found.append(
                ("generic memory above the weights / floor's", memory["generic"], 1.5, True)
            )
    if case.generated:
        found += [
            (f"{name} time / floor", time[name], 1.5, True)
            for name in ("generic", "rollout", "attnlrp")
        ]
    return found


CHECK_TOLERANCE = {"lrp": 1e-2}
"""Largest difference over the largest value a device check allows, where it is not 1e-4:
full LRP repeats the float32 forward's rounding, which another device changes, magnified
by LRP-0 where sums nearly cancel (README, "Batches": a few 1e-3 of the maximum)."""


def device_checks(device: torch.device, failures: list[str]) -> list[str]:
    """Every method each tiny model takes (ViT, BERT, Llama), and `readout_spread` itself,
    on `device` against the CPU in float32: a Markdown table of the largest differences
    relative to each map; each check that fails (an error, or a difference over its
    `CHECK_TOLERANCE`) is also added to `failures`. cuDNN's TF32 convolutions (on by
    default in PyTorch) are turned off for the checks, so that the patch embedding is
    float32 on both sides."""
    from transformers import BertConfig, BertForSequenceClassification

    from explain import engine
    from explain.engine.kernels import implementation, readout_spread
    from explain.rules import METHODS
    from explain.testing import tiny_lm, tiny_vit

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 60, (2, 24), generator=generator)
    text = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    text["attention_mask"][1, 18:] = 0
    with torch.random.fork_rng():
        torch.manual_seed(0)
        bert = BertForSequenceClassification(
            BertConfig(
                hidden_size=32,
                num_hidden_layers=3,
                num_attention_heads=2,
                intermediate_size=37,
                vocab_size=100,
                num_labels=3,
                attn_implementation="sdpa",
            )
        )
    models = {
        "tiny ViT": (tiny_vit(), torch.randn(2, 3, 32, 32, generator=generator)),
        "tiny BERT": (bert.eval(), text),
        "tiny Llama": (tiny_lm.tiny_causal_lm("llama"), text),
    }
    lines = [
        "| model | method | largest difference / largest value | verdict (tolerance) |",
        "|---|---|---:|---|",
    ]

    def row(model: str, name: str, check: Callable[[], float]) -> None:
        """One check's row; a check that raises is a FAILED row with its error, and the
        checks go on (one run on a GPU must report all it can)."""
        try:
            difference = check()
        except Exception as error:  # reported in the table, never skipped
            message = f"{type(error).__name__}: {str(error)[:160]}".replace("|", "/")
            lines.append(f"| {model} | {name} | {message} | FAILED |")
            failures.append(f"{model} {name}")
            return
        tolerance = CHECK_TOLERANCE.get(name, 1e-4)
        verdict = "equal" if difference <= tolerance else "DIFFERENT"
        if verdict != "equal":
            failures.append(f"{model} {name}")
        lines.append(f"| {model} | {name} | {difference:.1e} | {verdict} ({tolerance:.0e}) |")

    def on(value: Any, where: torch.device) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(where)
        return {key: item.to(where) for key, item in value.items()}

    def difference(found: torch.Tensor, expected: torch.Tensor) -> float:
        scale = expected.abs().max().clamp(min=1e-30)
        return float((found.cpu() - expected).abs().max() / scale)

    def explained(model: torch.nn.Module, inputs: Any, name: str) -> float:
        target = 1 if METHODS[name].class_specific else None
        expected = Explainer(model).explain(inputs, method=name, target=target)
        try:
            moved = Explainer(model.to(device))
            found = moved.explain(on(inputs, device), method=name, target=target)
        finally:
            model.to("cpu")
        return difference(found.relevance, expected.relevance)

    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        for title, (model, inputs) in models.items():
            for name in engine.supported_methods(Explainer(model).adapter):
                row(title, name, lambda m=model, i=inputs, n=name: explained(m, i, n))
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    # The kernel: causal, a padded key, grouped-query heads (4 query heads, 2 kv heads).
    query = torch.randn(2, 4, 300, 16, generator=generator)
    key, value = (torch.randn(2, 2, 300, 16, generator=generator) for _ in range(2))
    vector = torch.rand(3, 2, 300, generator=generator)
    grad = torch.randn(3, 2, 4, 300, 16, generator=generator)
    keys = torch.ones(2, 300, dtype=torch.bool)
    keys[1, :7] = False  # left padding
    tensors = (vector, query, key, value, grad)
    for dtype in (torch.float32, torch.bfloat16):  # Llama's GPU cases are bfloat16
        cast = (vector, *(t.to(dtype) for t in tensors[1:]))  # readout rows stay float32
        moved = tuple(t.to(device) for t in cast)
        ran = implementation(*moved[:3])
        title = f"readout_spread ({ran}, {str(dtype)[6:]}; causal, padded, grouped-query)"

        def spread(mode: str, cast: tuple = cast, moved: tuple = moved) -> float:
            options: dict[str, Any] = dict(scale=0.25, causal=True, mode=mode)
            expected = readout_spread(*cast, key_mask=keys, **options)
            found = readout_spread(*moved, key_mask=keys.to(device), **options)
            return difference(found, expected)

        for mode in ("gradient", "attention"):
            row(title, mode, lambda m=mode, f=spread: f(m))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up")
    parser.add_argument(
        "--cases",
        default=",".join(DEFAULT_CASES),
        help="comma-separated, or 'long' for the long prompts, 'gpu' for the GPU cases: "
        + ", ".join(CASES),
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, help="batch size for every case (e.g. 64 on a GPU)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="every case at tiny shapes (SMOKE_*): the whole script, cases and checks, in "
        "seconds on a CPU, to test it before a GPU run; its figures mean nothing",
    )
    parser.add_argument("--out", type=Path, help="write the report here (Markdown)")
    args = parser.parse_args()
    device = torch.device(args.device)
    groups = {"long": LONG_CASES, "gpu": tuple(GPU_CASES)}
    names = groups.get(args.cases) or tuple(args.cases.split(","))
    cases = [CASES[name] for name in names]
    if args.batch:
        cases = [dataclasses.replace(case, batch=args.batch) for case in cases]
    if args.smoke:
        cases = [smoke(case) for case in cases]

    started = time.perf_counter()
    header = machine()
    tables: dict[str, list[str]] = {"cpu": [], "long": [], "gpu": []}  # by Case.section
    growth: list[str] = []
    # The checks come first: they take seconds, and a GPU run that is stopped part way
    # still reports whether the engine is right on the device.
    checks = None
    failures: list[str] = []
    if any(case.gpu for case in cases):
        on_device = device.type == "cuda" or args.smoke
        checks = device_checks(device, failures) if on_device else None
        print("\n".join(checks or [CHECKS_PENDING]), flush=True)

    def write(done: int) -> None:
        """The report so far (after `done` cases): written after every case, so that a
        run stopped part way keeps what it measured."""
        if args.out is None:
            return
        fields = dict(
            date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            machine=header,
            device=device.type.upper(),
            rounds=args.rounds,
            minutes=(time.perf_counter() - started) / 60,
            threshold=CPU_FUSED_MIN_TOKENS,
            scaled=SCALED_INPUTS,
            warm_up=WARM_UP_TOKENS,
        )
        pending = [case.name for case in cases[done:] if case.gpu]
        write_report(args.out, tables, growth, checks, pending, args.smoke, fields)

    write(0)
    # Every peak-memory call starts with a full collection (`_release_free_memory`); the
    # objects alive now (the imported libraries, the checks' leftovers) are never garbage
    # the cases make, so they are frozen out of it: a smoke run's collections took 12 of
    # its 58 s traversing them.
    gc.collect()
    gc.freeze()
    for done, case in enumerate(cases, 1):
        try:
            seconds, peaks, inputs = run_case(case, args.rounds, device, not args.no_memory)
            section = table(case, seconds, peaks, inputs)
            if case.model == "kernel":
                section[-1:-1] = kernel_note(case, device)[:-1]
            if case.long:
                growth.append(growth_row(case, seconds, peaks))
        except Exception as error:  # reported, and the next case runs (one GPU run, all it can)
            if not case.gpu:
                raise
            failures.append(case.name)
            section = [f"### {case.title}", "", f"FAILED: {type(error).__name__}: {error}", ""]
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        tables[case.section] += section
        print("\n".join(section), flush=True)
        write(done)
    print(f"benchmark took {(time.perf_counter() - started) / 60:.1f} min")
    if failures:
        raise SystemExit(f"failed: {', '.join(failures)} (see the report)")


def write_report(
    out: Path,
    tables: dict[str, list[str]],
    growth: list[str],
    checks: list[str] | None,
    pending: list[str],
    smoke_run: bool,
    fields: dict[str, Any],
) -> None:
    """Write `out`: the CPU, long-prompt and GPU sections measured by this run replace the
    file's, the others (and the sections other scripts write, `OTHER_SCRIPTS_SECTIONS`) are kept."""
    old = out.read_text() if out.exists() else ""
    report = REPORT.format(tables="\n".join(tables["cpu"]), **fields) if tables["cpu"] else old
    long = (
        LONG_REPORT.format(tables="\n".join(tables["long"]), growth="\n".join(growth), **fields)
        if tables["long"]
        else long_section(old)
    )
    report = with_long_section(report, long)
    for kept in OTHER_SCRIPTS_SECTIONS.finditer(old):  # other scripts' sections, as they are
        if kept.group(0) not in report:
            report = report.rstrip("\n") + "\n\n" + kept.group(0) + "\n"
    if tables["gpu"] or checks is not None:
        stopped = (
            "Not measured yet (the run had not reached them when this was written): "
            + ", ".join(pending)
            + ".\n\n"
            if pending
            else ""
        )
        gpu = GPU_REPORT.format(
            command=" ".join(["python", "scripts/bench.py", *sys.argv[1:]]),
            tables="\n".join(tables["gpu"]) + stopped,
            checks="\n".join(checks) if checks is not None else CHECKS_PENDING,
            smoke=SMOKE_NOTE if smoke_run else "",
            **fields,
        )
        report = with_gpu_section(report, gpu)
    with atomic_write(out, "w") as handle:
        handle.write(with_gpu_section(report, GPU_PENDING) if not gpu_section(report) else report)


def growth_row(case: Case, seconds: dict[str, list[float]], peaks: dict[str, int]) -> str:
    """One row of the long prompts' summary: generic's time and memory over the floor."""
    title = NARROW[case.model].split(" (")[0]
    if "generic" not in seconds:
        return f"| {title} | {case.tokens} | - | - |"
    time_ratio = statistics.median(seconds["generic"]) / statistics.median(seconds[FLOOR])
    memory = f"{peaks['generic'] / peaks[FLOOR]:.2f}" if peaks.get(FLOOR) else "-"
    return f"| {title} | {case.tokens} | {time_ratio:.2f} | {memory} |"


GPU_BEGIN = "<!-- gpu: scripts/bench.py --device cuda --cases gpu -->"
GPU_END = "<!-- end of gpu -->"


def gpu_section(text: str) -> str:
    """The GPU section of a report (markers included), or "" when it has none."""
    begin, end = text.find(GPU_BEGIN), text.find(GPU_END)
    return text[begin : end + len(GPU_END)] if 0 <= begin < end else ""


def with_gpu_section(text: str, section: str) -> str:
    """`text` with its GPU section replaced by `section` (inserted before the long-prompt
    section, or appended, if it had none)."""
    old = gpu_section(text)
    if old:
        return text.replace(old, section)
    at = text.find(LONG_BEGIN)
    if at < 0:
        return text.rstrip("\n") + "\n\n" + section + "\n"
    return text[:at] + section + "\n\n" + text[at:]


OTHER_SCRIPTS_SECTIONS = re.compile(
    r"<!-- (?P<name>[^:>]+): scripts/(?!bench\.py)[^ >]+ -->.*?<!-- end of (?P=name) -->",
    re.DOTALL,
)
"""A section another script writes between its markers (`<!-- NAME: scripts/SCRIPT ... -->`
and `<!-- end of NAME -->`: scripts/bench_swin.py's windowed attention, ...), which this
script keeps as it is."""

LONG_BEGIN = "<!-- long prompts: scripts/bench.py --cases long -->"
LONG_END = "<!-- end of long prompts -->"


def long_section(text: str) -> str:
    """The long-prompt section of a report (markers included), or "" when it has none."""
    begin, end = text.find(LONG_BEGIN), text.find(LONG_END)
    return text[begin : end + len(LONG_END)] if 0 <= begin < end else ""


_GROWTH_ROW = re.compile(r"^\| narrow [^|]+\| (\d+) \|")
_CASE_HEADING = re.compile(r"^### (narrow [^,(]+).*, (\d+) tokens, batch")


def _long_parts(section: str) -> tuple[str, dict[tuple[str, int], str], dict[tuple[str, int], str]]:
    """(the text before the summary rows, summary rows and case tables by (model, tokens))."""
    lines = section.replace(LONG_END, "").rstrip("\n").split("\n")
    head: list[str] = []
    rows: dict[tuple[str, int], str] = {}
    tables: dict[tuple[str, int], str] = {}
    current: list[str] | None = None
    for line in lines:
        row, heading = _GROWTH_ROW.match(line), _CASE_HEADING.match(line)
        if heading:
            current = []
            tables[(heading.group(1).strip(), int(heading.group(2)))] = current  # type: ignore[assignment]
        if current is not None:
            current.append(line)
        elif row:
            rows[(line.split("|")[1].strip(), int(row.group(1)))] = line
        elif not rows:
            head.append(line)
    joined = {key: "\n".join(value).rstrip("\n") for key, value in tables.items()}
    return "\n".join(head), rows, joined  # type: ignore[arg-type]


def merge_long_sections(old: str, new: str) -> str:
    """`new`, with the summary rows and case tables of `old` that `new` did not measure
    kept: a run of some of the long cases updates theirs and leaves the others'."""
    if not old:
        return new
    head, rows, tables = _long_parts(new)
    _, old_rows, old_tables = _long_parts(old)
    rows = {**old_rows, **rows}
    tables = {**old_tables, **tables}
    body = [head, *(rows[key] for key in sorted(rows)), ""]
    body += [tables[key] + "\n" for key in sorted(tables)]
    return "\n".join(body) + "\n" + LONG_END


def with_long_section(text: str, section: str) -> str:
    """`text` with its long-prompt section merged with `section` (appended if it had none)."""
    old = long_section(text)
    if old:
        return text.replace(old, merge_long_sections(old, section) if section else old)
    return text.rstrip("\n") + "\n\n" + section + "\n" if section else text


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
  path chosen automatically (`explain.engine.fused.choose_path`, README "Attention paths":
  on CPU explicit below {threshold} tokens where the maps fit the memory budget, fused
  and streamed from there on). `rollout` needs no backward at all.
- **attnlrp**, **cp_lrp**: the same for AttnLRP and CP-LRP (one forward under their
  gradient rules and one backward to the embeddings; they read no attention map, so
  "auto" keeps the model's fused kernel at every length, as the floor does).
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

{tables}"""

GPU_COMMAND = "python scripts/bench.py --device cuda --cases gpu --out docs/benchmarks.md"

GPU_INTRO = """\
On an NVIDIA GPU every dispatched operation is a kernel launch, so the engine keeps the
explicit maps wherever they fit the memory budget (half the free device memory by
default), folds every column at once (explain.engine.spread) and streams only beyond the
budget, through `readout_spread` (explain.engine.kernels). Cases: `readout_spread`
(Triton where it runs) against torch_fold at one Llama-1B block (4k tokens, 1 and 64
columns), ViT-B/16 at batch 64 in float32 and bfloat16, Llama-1B shapes (16 blocks,
width 2048, 32 heads, 8 key-value heads) in bfloat16 at 4k, 16k and 32k tokens, and a
generation of 64 tokens after a 1,024-token prompt, whose floor is one forward and one
64-column batched backward. Peak memory is `torch.cuda.max_memory_allocated` above what
was allocated before the call (the weights). Goals: ViT bf16 generic at most 1.3x the
floor, transformer_attribution at most 2x, fp32 generic at least 10x faster than the
papers' loop; Llama generic at most 1.5x the floor's time and memory; the generation at
most 1.5x its floor."""

GPU_REPORT = (
    GPU_BEGIN
    + """
## GPU

{smoke}Generated by `{command}` on {date}, {device}: {machine}.
Medians of {rounds} interleaved rounds after a warm-up round; the run took {minutes:.1f}
minutes. """
    + GPU_INTRO
    + """

{tables}
Correctness on the device: each result against the CPU's, float32, the largest difference over
the largest value (full LRP within 1e-2, as its float32 forward's rounding allows; the
others within 1e-4).

{checks}
"""
    + GPU_END
)

CHECKS_PENDING = "Not run: the run had no CUDA device."

SMOKE_NOTE = """\
**Smoke run** (`--smoke`): every case at tiny shapes, to test this script; the figures
below say nothing about the engine's speed.

"""

GPU_PENDING = (
    GPU_BEGIN
    + """
## GPU

The GPU figures are pending: no GPU was lent to the sessions that wrote this page.
Pending are every time and memory figure below, the correctness checks on CUDA (tiny
ViT, BERT and Llama with every method each takes, and the fold kernel, against the
CPU), and whether the Triton kernel compiles and runs on a real GPU at all (it has run
only under Triton's interpreter; where it cannot, the engine warns once and uses
torch_fold). The CPU op-count tests (tests/test_op_counts.py,
tests/test_lrp_op_counts.py) stand in for kernel launches meanwhile, the Triton kernel
is tested under Triton's interpreter (tests/test_triton_fold.py), and the script below
is tested end to end at tiny shapes on the CPU (tests/test_bench_smoke.py). On a
machine with an NVIDIA GPU one command runs the correctness checks and this benchmark
(about 4 minutes on an H200, estimated) and writes this section:

    bash scripts/gpu_check.sh

(it runs `"""
    + GPU_COMMAND
    + """`
with a time limit, after checking the versions of PyTorch, transformers and timm).

"""
    + GPU_INTRO
    + """
"""
    + GPU_END
)


LONG_REPORT = """\
{LONG_BEGIN}
## Long prompts

Generated by `python scripts/bench.py --cases long --out docs/benchmarks.md` on {date},
{device}: {machine}. Medians of {rounds} interleaved rounds after a warm-up round on
the first {warm_up} tokens; the run took {minutes:.1f} minutes. The machine is shared
with other work, so the times carry its noise; the memory figures do not depend on it.
One input per case, random weights. Rows as above: the floor (forward + input backward
on the default sdpa path), `generic` on the path "auto" takes (the fused path from
{threshold} tokens on, for adapters that have one: each block folded by
`readout_spread`, A and dA recomputed from q, k, v and dO by chunks of query rows,
explain.engine.kernels), and on the explicit path where its N x N maps fit in memory.
The goal at 4096 tokens: generic within 1.5x the floor's memory and 2x its time. The
cases may come from separate runs of this command (a run of some of them replaces their
rows and tables and keeps the others'; this header is the last run's). What to expect:
the memory ratio falls towards 1 as N grows, since on CPU the fold's chunks stay
cache-sized (explain.engine.kernels.torch_fold.CPU_CHUNK_BYTES) while the floor's
activations grow with N; the time over the floor is the streamed fold.

How generic's cost over the floor grows with the prompt:

| model | tokens | time / floor | memory / floor |
|---|---:|---:|---:|
{growth}

{tables}
{LONG_END}""".replace("{LONG_BEGIN}", LONG_BEGIN).replace("{LONG_END}", LONG_END)


if __name__ == "__main__":
    main()
