"""Region citations on the zoo's shapes-llava, whose evidence is known: the objects'
masks as the regions, does the answer's region come first, and does removing the region
a method ranks first drop the answer more than removing another object?

The numbers are the vision-language-evidence test's region level
(explain.evaluation.vision_language; `explain evaluate vision-language-evidence` runs it
on every question), here on the held-out questions about one object (templates "colour"
and "shape": the asked object is the answer's) among the first `--count`, over those the
model answers right whose scene holds other objects (a scene of one object has nothing to
rank). Each region's score is the sum of its patches' relevance weighted by the share of
each patch the region holds (explain.cite.regions.patch_shares, as `explain cite --image`
scores a photo's regions); each object removed alone is filled with the image's mean
colour. The seconds are the whole test's per question (its patch removal curves
included). "removing the asked object" is the model's number, the same for every method:
removing the asked object drops log p(answer) more than removing another object.

    python scripts/bench_regions.py --count 1000 --methods generic attnlrp cp_lrp rollout \
        raw_attention random
"""

from __future__ import annotations

import argparse
import time

from explain.evaluation import VisionLanguageEvidenceTest
from explain.evaluation.protocol import concatenate_records
from explain.evaluation.zoo import answer_dataset
from explain.loading.specs import load_model

CHUNK = 16
"""Questions per call of the test (one batched backward, batched removal forwards)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="zoo:shapes-llava")
    parser.add_argument("--count", type=int, default=200, help="held-out questions scanned")
    parser.add_argument("--methods", nargs="+", default=["generic", "attnlrp", "rollout"])
    parser.add_argument("--depth", default="lm", choices=("lm", "tower"))
    args = parser.parse_args()
    loaded = load_model(args.model)
    dataset = answer_dataset(args.model, loaded)
    chosen = [
        index
        for index in range(args.count)
        if dataset.item(index).question.template in ("colour", "shape")
        and dataset.item(index).target is not None
    ]
    examples = [dataset[index] for index in chosen]
    test = VisionLanguageEvidenceTest(loaded.model, loaded.tokenizer, depth=args.depth)
    summaries, seconds = {}, {}
    for method in args.methods:
        start = time.perf_counter()
        parts = [
            test.evaluate(method, examples[first : first + CHUNK], seed=first)
            for first in range(0, len(examples), CHUNK)
        ]
        seconds[method] = (time.perf_counter() - start) / len(examples)
        summaries[method] = test.summarize(concatenate_records(parts))
    first = summaries[args.methods[0]]
    print(
        f"{args.model}, depth {args.depth}: {len(examples)} questions about one object among "
        f"the first {args.count} held-out ones; answered right: {first['right']}, of them "
        f"with other objects in the scene: {first['on_regions']}"
    )
    print("| method | asked object's region first | top region's removal | seconds per question |")
    print("|---|---|---|---|")
    for method, summary in summaries.items():
        print(
            f"| {method} | {summary['region_first']:.3f} | {summary['region_removal']:.3f} "
            f"| {seconds[method]:.3f} |"
        )
    print(
        "removing the asked object drops log p(answer) more than removing another object: "
        f"{first['asked_region_removal']:.3f}"
    )


if __name__ == "__main__":
    main()
