"""Region citations on the zoo's shapes-llava, whose evidence is known: the objects'
masks as the regions, does the answer's region come first, and does removing it drop
the answer more than removing another object?

Per held-out question about one object (templates "colour" and "shape": the asked
object is the answer's), the scene's objects' masks are the regions
(explain.cite.image.cite_image, the answer word explained, each region scored by its
patches' relevance through the processor's geometry). Then:

- region pointing game: the share of questions whose asked object's region scores
  highest (ties: the share of tied regions that are the asked one), over all of them and
  over those whose scene holds other objects (a scene of one object is a free hit);
- removal: each object's region filled with the scene's mean colour on its own (one
  batched forward of all of them), the drop of log p(answer); the share of the other
  objects whose removal drops it less than the asked object's removal ("removing the
  asked object drops the answer more than removing a random other object"), averaged
  over the questions. This number is the model's, not the method's: the same for every
  method.

The model answers from the photo and the question as a user's prompt reads them (the
processor and its chat template); questions it answers wrongly are counted apart.

    python scripts/bench_regions.py --count 1000 --methods generic attnlrp cp_lrp rollout \
        raw_attention random
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from explain import Explainer
from explain.cite.image import ablated_photo_targets, cite_image
from explain.cite.regions import fill_colour, region_from
from explain.data.shapes import KINDS, scene_seed
from explain.data.shapes_questions import example
from explain.loading.specs import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="zoo:shapes-llava")
    parser.add_argument("--count", type=int, default=200, help="held-out questions scanned")
    parser.add_argument("--methods", nargs="+", default=["generic", "attnlrp", "rollout"])
    parser.add_argument("--depth", default="lm", choices=("lm", "tower"))
    args = parser.parse_args()
    loaded = load_model(args.model)
    explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
    adapter, processor = explainer.adapter, loaded.tokenizer
    size = loaded.image_size[0] if loaded.image_size else 64
    first = {method: [] for method in args.methods}
    among = {method: [] for method in args.methods}  # questions with other objects only
    above, right, asked, seconds = [], 0, 0, {method: 0.0 for method in args.methods}
    for index in range(args.count):
        item = example(scene_seed("heldout", index), 0, size)
        if item.question.template not in ("colour", "shape") or item.target is None:
            continue
        asked += 1
        scene = item.scene
        photo = (scene.image * 255).round().astype(np.uint8)
        regions = [
            region_from({"name": KINDS[kind], "mask": mask}, photo.shape[:2], r)
            for r, (kind, mask) in enumerate(zip(scene.kinds, scene.masks, strict=True))
        ]
        # the model's own answer, greedy: the asked object's evidence is known only when right
        ids = processor.tokenizer(item.answer, add_special_tokens=False)["input_ids"]
        answer_ids = torch.tensor(ids)
        cited = {}
        for method in args.methods:
            start = time.perf_counter()
            cited[method] = cite_image(
                explainer, photo, item.text, item.answer, regions=regions, method=method,
                check=False, depth=args.depth,
            )  # fmt: skip
            seconds[method] += time.perf_counter() - start
        logits = cited[args.methods[0]].explanation.explanation.logits[0, 0]
        if int(logits.argmax()) != ids[0]:
            continue
        right += 1
        for method in args.methods:
            scores = cited[method].scores
            top = scores == scores.max()
            first[method].append(float(top[item.target]) / int(top.sum()))
            if len(regions) > 1:
                among[method].append(first[method][-1])
        count = len(regions)
        keep = torch.ones(count + 1, count, dtype=torch.bool)
        keep[1:] = ~torch.eye(count, dtype=torch.bool)
        colour = fill_colour(photo)
        values = ablated_photo_targets(
            adapter, processor, photo, regions, colour, item.text, answer_ids, keep, 1 << 15
        )
        drops = values[0] - values[1:]
        others = [r for r in range(count) if r != item.target]
        if others:
            above.append(float(np.mean([drops[item.target] > drops[r] for r in others])))
    print(f"{args.model}, depth {args.depth}: {asked} questions about one object among the "
          f"first {args.count} held-out ones; answered right: {right}")  # fmt: skip
    print("| method | asked object's region first | with other objects | seconds per question |")
    print("|---|---|---|---|")
    for method in args.methods:
        print(
            f"| {method} | {np.mean(first[method]):.3f} | {np.mean(among[method]):.3f} "
            f"({len(among[method])}) | {seconds[method] / asked:.3f} |"
        )
    print(
        f"removing the asked object drops log p(answer) more than removing another object: "
        f"{np.mean(above):.3f} (over {len(above)} questions with other objects)"
    )


if __name__ == "__main__":
    main()
