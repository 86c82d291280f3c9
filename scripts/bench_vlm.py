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

import torch


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
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=4)
    args = parser.parse_args()

    from explain import Explainer
    from explain.generation import explain_generation, generate

    model = _model()
    ids = torch.tensor([[1, 3] + [63] * 576 + list(range(10, 30))])
    prompt = {"input_ids": ids, "pixel_values": torch.randn(1, 3, 336, 336)}
    made = generate(Explainer(model), prompt, max_new_tokens=args.new_tokens)
    variants = [(m, p) for m in ("generic", "rollout") for p in ("explicit", "fused")]
    times: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
    maps: dict[tuple[str, str], torch.Tensor] = {}
    for _ in range(args.rounds):
        for method, path in variants:
            start = time.perf_counter()
            found = explain_generation(
                Explainer(model, attention_path=path), made, method=method, depth="tower"
            )
            times[method, path].append(time.perf_counter() - start)
            maps[method, path] = found.explanation.relevances["image"]
    tokens = ids.shape[1] + made.generated.shape[1]
    print(f"LLaVA, 576 image tokens, {tokens} tokens, {made.generated.shape[1]} answer tokens")
    print("| method | explicit s | fused s | fused / explicit | max abs difference |")
    print("|---|---|---|---|---|")
    for method in ("generic", "rollout"):
        explicit = statistics.median(times[method, "explicit"])
        fused = statistics.median(times[method, "fused"])
        gap = (maps[method, "fused"] - maps[method, "explicit"]).abs().max().item()
        print(f"| {method} | {explicit:.3f} | {fused:.3f} | {fused / explicit:.2f} | {gap:.1e} |")


if __name__ == "__main__":
    main()
