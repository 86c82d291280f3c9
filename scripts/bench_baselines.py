"""Benchmark the baselines against captum: integrated gradients (and Gradient x Input) on
the same model, inputs, target and points, ours through `Explainer` and captum's as
people call it.

    OMP_NUM_THREADS=1 python scripts/bench_baselines.py [--rounds 3] [--out docs/benchmarks.md]
    python scripts/bench_baselines.py --smoke --rounds 1     # tiny shapes, figures meaningless

Cases (random weights: speed does not depend on the values), each with `--steps` points
(Gauss-Legendre, both sides), the predicted class:

- a timm ViT (`vit_tiny_patch16_224`, batch 2): captum's `IntegratedGradients` on the
  pixels with a zero baseline (its attribution summed over each patch's pixels and
  channels), ours at the patch embeddings from zero pixels' embeddings;
- a BERT classifier (4 blocks, width 256, 128 tokens, batch 2) and a Llama (4 blocks,
  width 256, 256 tokens, batch 1, the next token): captum's `IntegratedGradients` on the
  word embeddings (`inputs_embeds`, the attention mask an additional argument) from zero
  embeddings, ours from zero embeddings.

Each variant runs once to warm up, then `--rounds` times interleaved (ours, captum, ours,
captum, ...) so that machine noise hits both alike; the table gives medians and the ratio
ours / captum of the same run, and the largest difference of the two maps relative to
the largest value (they must agree: tests/test_baselines_captum.py). captum puts every
point in one batch (`internal_batch_size` unset); ours puts as many as the memory budget
allows (the default: a quarter of the free RAM, at most 1 GiB, on CPU), and the table
says how many forwards that took. The section goes between its markers in `--out`; other
sections are left as they are.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from bench_cite import with_section
from torch import Tensor, nn

from explain import Explainer

BEGIN = "<!-- baselines against captum: scripts/bench_baselines.py -->"
END = "<!-- end of baselines against captum -->"


@dataclass
class Case:
    """One model and its inputs, with captum's forward and how its attribution maps onto
    ours."""

    title: str
    model: nn.Module
    inputs: Any
    captum_inputs: Tensor
    captum_forward: Callable[..., Tensor]
    captum_extra: tuple[Any, ...]
    to_ours: Callable[[Tensor], Tensor]
    """captum's attribution -> our relevance's shape."""
    compared: Callable[[Tensor], Tensor]
    """Our relevance -> the entries compared (the real tokens of a padded text)."""


def vit_case(smoke: bool) -> Case:
    import timm

    size, patch, depth = (32, 8, 2) if smoke else (224, 16, 12)
    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=size, patch_size=patch, depth=depth
    ).eval()
    images = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    grid = size // patch

    def per_patch(pixels: Tensor) -> Tensor:
        summed = pixels.sum(dim=1).reshape(2, grid, patch, grid, patch)
        return summed.sum(dim=(2, 4))

    return Case(
        f"timm ViT ({'tiny shapes' if smoke else 'vit_tiny_patch16_224'}), {size} x {size}, "
        "batch 2",
        model,
        images,
        images,
        model,
        (),
        per_patch,
        lambda relevance: relevance,
    )


def text_case(kind: str, smoke: bool) -> Case:
    import transformers as tf

    width, blocks, tokens = (32, 2, 16) if smoke else (256, 4, 128 if kind == "bert" else 256)
    batch = 2 if kind == "bert" else 1
    common = dict(
        vocab_size=1000,
        hidden_size=width,
        num_hidden_layers=blocks,
        num_attention_heads=4,
        intermediate_size=4 * width,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        if kind == "bert":
            config = tf.BertConfig(**common, max_position_embeddings=tokens, num_labels=3)
            model = tf.BertForSequenceClassification(config).eval()
        else:
            config = tf.LlamaConfig(**common, num_key_value_heads=4, max_position_embeddings=tokens)
            model = tf.LlamaForCausalLM(config).eval()
    ids = torch.randint(3, 1000, (batch, tokens), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    if kind == "bert":
        mask[-1, tokens // 2 :] = 0  # a padded text
    embeddings = model.get_input_embeddings()(ids).detach()

    def forward(inputs_embeds: Tensor, attention_mask: Tensor) -> Tensor:
        output = model(inputs_embeds=inputs_embeds, attention_mask=attention_mask).logits
        return output if kind == "bert" else output[:, -1]

    title = (
        f"BERT classifier ({blocks} blocks, width {width}), {tokens} tokens, batch {batch}"
        if kind == "bert"
        else f"Llama ({blocks} blocks, width {width}), next token after {tokens}, batch 1"
    )
    real = mask.bool()
    return Case(
        title,
        model,
        {"input_ids": ids, "attention_mask": mask},
        embeddings,
        forward,
        (mask,),
        lambda attribution: attribution.sum(dim=-1) * mask,
        lambda relevance: relevance[real],
    )


def run_case(case: Case, steps: int, rounds: int) -> list[str]:
    from captum.attr import InputXGradient, IntegratedGradients

    for parameter in case.model.parameters():
        parameter.requires_grad_(False)
    explainer = Explainer(case.model)
    with torch.no_grad():
        output = case.captum_forward(case.captum_inputs, *case.captum_extra)
    target = output.argmax(dim=-1).tolist()
    captum_ig = IntegratedGradients(case.captum_forward)
    captum_gxi = InputXGradient(case.captum_forward)

    def captum_inputs() -> Tensor:
        return case.captum_inputs.clone().requires_grad_(True)

    variants: dict[str, Callable[[], Tensor]] = {
        "integrated_gradients, ours": lambda: (
            explainer.explain(
                case.inputs, method="integrated_gradients", target=target, steps=steps
            ).relevance
        ),
        "integrated_gradients, captum": lambda: case.to_ours(
            captum_ig.attribute(
                captum_inputs(),
                target=target,
                n_steps=steps,
                additional_forward_args=case.captum_extra or None,
            ).detach()
        ),
        "gradient_x_input, ours": lambda: (
            explainer.explain(case.inputs, method="gradient_x_input", target=target).relevance
        ),
    }
    if case.captum_extra:  # on the pixels, captum's Input x Gradient is another map
        variants["gradient_x_input, captum"] = lambda: case.to_ours(
            captum_gxi.attribute(
                captum_inputs(), target=target, additional_forward_args=case.captum_extra
            ).detach()
        )
    forwards = _forwards(case.model, variants["integrated_gradients, ours"])
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    maps: dict[str, Tensor] = {}
    for round_ in range(rounds + 1):
        for name, run in variants.items():
            started = time.perf_counter()
            maps[name] = run()
            if round_:  # the first round warms up
                seconds[name].append(time.perf_counter() - started)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    rows = [
        f"### {case.title}",
        "",
        f"{steps} points; ours ran {forwards} forwards (the inputs and the baseline, then "
        "the points in as many chunks as the memory budget asked for).",
        "",
        "| variant | seconds | ours / captum | largest difference / largest value |",
        "|---|---|---|---|",
    ]
    for name, value in median.items():
        method, who = name.split(", ")
        other = f"{method}, captum"
        if who == "ours" and other in median:
            ratio = f"{value / median[other]:.2f}"
            theirs = case.compared(maps[other])
            difference = (case.compared(maps[name]) - theirs).abs().max() / theirs.abs().max()
            agree = f"{float(difference):.1e}"
        else:
            ratio = agree = "-"
        rows.append(f"| {name} | {value:.3f} | {ratio} | {agree} |")
    return [*rows, ""]


def _forwards(model: nn.Module, call: Callable[[], Any]) -> int:
    count: list[int] = []
    handle = model.register_forward_pre_hook(lambda module, args: count.append(1))
    try:
        call()
    finally:
        handle.remove()
    return len(count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes: checks the script")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cases = [vit_case(args.smoke), text_case("bert", args.smoke), text_case("llama", args.smoke)]
    rows = [
        BEGIN,
        "## Baselines against captum",
        "",
        f"Generated by `python scripts/bench_baselines.py{' --smoke' if args.smoke else ''}` "
        f"on {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}, "
        f"{torch.get_num_threads()} torch thread(s), CPU; medians of {args.rounds} "
        "interleaved rounds after a warm-up.",
        "",
    ]
    if args.smoke:
        rows += ["**Smoke run**: tiny shapes; the figures mean nothing.", ""]
    for case in cases:
        rows += run_case(case, args.steps, args.rounds)
    rows.append(END)
    section = "\n".join(rows)
    print(section)
    if args.out:
        with_section(args.out, (BEGIN, END), section)


if __name__ == "__main__":
    main()
