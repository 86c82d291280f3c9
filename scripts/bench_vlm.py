"""Benchmark: a vision-language model's answer explained on the explicit and the fused path.

A random LLaVA (CLIP tower at 336 pixels with 14-pixel patches: 576 image tokens, as
LLaVA 1.5; narrow blocks, speed does not depend on the values) answers one question;
its answer is explained at depth "tower" with `generic` and `rollout` on both attention
paths, in interleaved rounds so that machine noise hits all alike. Reported: the median
seconds of each, the ratio of the fused path to the explicit one in the same run, and the
largest difference between the two paths' maps (they compute the same numbers).

    python scripts/bench_vlm.py [--rounds 3] [--new-tokens 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from torch import Tensor

Variant = tuple[str, str, str]  # method, depth, attention path


def arguments(description: str) -> argparse.Namespace:
    """The options of the vision-language benchmarks: rounds, and answer tokens."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=4)
    return parser.parse_args()


def image_maps(model: torch.nn.Module, made: Any, method: str, depth: str, path: str) -> Tensor:
    """The image maps of the answers in `made` (a `Generation`) by `method` at `depth`
    on attention path `path`."""
    from explain import Explainer
    from explain.generation import explain_generation

    explainer = Explainer(model, attention_path=path)
    found = explain_generation(explainer, made, method=method, depth=depth)
    return found.explanation.relevances["image"]


def time_interleaved(
    model: torch.nn.Module, made: Any, variants: list[Variant], rounds: int
) -> tuple[dict[Variant, list[float]], dict[Variant, Tensor]]:
    """The seconds of each variant in each of `rounds` rounds, the variants interleaved so
    that machine noise hits all alike, and each variant's image maps."""
    times: dict[Variant, list[float]] = {v: [] for v in variants}
    maps: dict[Variant, Tensor] = {}
    for _ in range(rounds):
        for variant in variants:
            start = time.perf_counter()
            maps[variant] = image_maps(model, made, *variant)
            times[variant].append(time.perf_counter() - start)
    return times, maps


def _model() -> torch.nn.Module:
    import transformers as tf

    vision = tf.CLIPVisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        image_size=336,
        patch_size=14,
        projection_dim=32,
    )
    text = tf.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    config = tf.LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=63,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return tf.LlavaForConditionalGeneration(config).eval()


def main() -> None:
    args = arguments(__doc__)

    from explain import Explainer
    from explain.generation import generate

    model = _model()
    ids = torch.tensor([[1, 3] + [63] * 576 + list(range(10, 30))])
    prompt = {"input_ids": ids, "pixel_values": torch.randn(1, 3, 336, 336)}
    made = generate(Explainer(model), prompt, max_new_tokens=args.new_tokens)
    variants = [(m, "tower", p) for m in ("generic", "rollout") for p in ("explicit", "fused")]
    times, maps = time_interleaved(model, made, variants, args.rounds)
    tokens = ids.shape[1] + made.generated.shape[1]
    print(f"LLaVA, 576 image tokens, {tokens} tokens, {made.generated.shape[1]} answer tokens")
    print("| method | explicit s | fused s | fused / explicit | max abs difference |")
    print("|---|---|---|---|---|")
    for method in ("generic", "rollout"):
        explicit = statistics.median(times[method, "tower", "explicit"])
        fused = statistics.median(times[method, "tower", "fused"])
        gap = (maps[method, "tower", "fused"] - maps[method, "tower", "explicit"]).abs().max()
        print(
            f"| {method} | {explicit:.3f} | {fused:.3f} | {fused / explicit:.2f} "
            f"| {gap.item():.1e} |"
        )


if __name__ == "__main__":
    main()
