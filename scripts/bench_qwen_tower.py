"""Benchmark: Qwen2.5-VL's answer explained through its packed, windowed tower.

A random Qwen2.5-VL (a 504 x 504 photo in 14-pixel patches: 1296 tower tokens and 324
image tokens; windows of 4 x 4 merged blocks, smaller at the grid's edges, in three tower
blocks, full attention in the fourth; narrow blocks, speed does not depend on the
values) answers one question. Its answer is explained with `generic` and `rollout` at
depth "lm" and at depth "tower" (the tower's blocks recorded from their pieces,
explain.architectures.hf_packed_attention), on both attention paths, in interleaved
rounds so that machine noise hits all alike. Reported: the median seconds of each, the
ratio of depth "tower" to depth "lm" on the same path in the same run, the peak memory
one more call of each adds (scripts/bench.py's `peak_memory`), and the largest
difference between the two paths' tower maps (they compute the same numbers).

    python scripts/bench_qwen_tower.py [--rounds 3] [--new-tokens 4]
"""

from __future__ import annotations

import statistics

import torch
from bench import peak_memory
from bench_vlm import arguments, image_maps, time_interleaved

IMAGE_TOKEN = 60
GRID = 36  # patches per side


def _model() -> torch.nn.Module:
    import transformers as tf

    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]}
    text = tf.Qwen2_5_VLTextConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_parameters=rope,
        bos_token_id=1,
        eos_token_id=2,
    )
    vision = tf.Qwen2_5_VLVisionConfig(
        depth=4,
        hidden_size=64,
        intermediate_size=128,
        num_heads=4,
        out_hidden_size=64,
        patch_size=14,
        temporal_patch_size=2,
        spatial_merge_size=2,
        window_size=112,
        fullatt_block_indexes=[3],
    )
    config = tf.Qwen2_5_VLConfig(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        image_token_id=IMAGE_TOKEN,
        video_token_id=61,
        vision_start_token_id=62,
        vision_end_token_id=63,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = tf.Qwen2_5_VLForConditionalGeneration(config).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None  # answers of --new-tokens tokens
    return model


def main() -> None:
    args = arguments(__doc__)

    from explain import Explainer
    from explain.generation import generate

    model = _model()
    image_tokens = (GRID // 2) ** 2
    ids = torch.tensor([[1, 62] + [IMAGE_TOKEN] * image_tokens + [63, *range(10, 30)]])
    prompt = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "pixel_values": torch.randn(GRID * GRID, 3 * 2 * 14 * 14),
        "image_grid_thw": torch.tensor([[1, GRID, GRID]]),
    }
    made = generate(Explainer(model), prompt, max_new_tokens=args.new_tokens)
    variants = [
        (method, depth, path)
        for method in ("generic", "rollout")
        for depth in ("lm", "tower")
        for path in ("explicit", "fused")
    ]
    times, maps = time_interleaved(model, made, variants, args.rounds)
    cpu = torch.device("cpu")
    peaks = {v: peak_memory(lambda v=v: image_maps(model, made, *v), cpu) / 2**20 for v in variants}
    tokens = made.input_ids.shape[1]
    print(
        f"Qwen2.5-VL, {GRID * GRID} tower tokens, {image_tokens} image tokens, {tokens} "
        f"tokens, {made.generated.shape[1]} answer tokens, {torch.get_num_threads()} threads"
    )
    print(
        "| method | path | lm s | tower s | tower / lm | lm peak MiB | tower peak MiB "
        "| tower: max abs fused - explicit |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for method in ("generic", "rollout"):
        tower = maps[method, "tower", "fused"] - maps[method, "tower", "explicit"]
        gap = tower.abs().max().item()
        for path in ("explicit", "fused"):
            lm = statistics.median(times[method, "lm", path])
            deep = statistics.median(times[method, "tower", path])
            memory = f"{peaks[method, 'lm', path]:.0f} | {peaks[method, 'tower', path]:.0f}"
            print(
                f"| {method} | {path} | {lm:.3f} | {deep:.3f} | {deep / lm:.2f} | {memory} "
                f"| {gap:.1e} |"
            )


if __name__ == "__main__":
    main()
