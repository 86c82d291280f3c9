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

`--cost` measures instead what the check costs on one photo + question (the first
held-out question about one object, the default 3 x 3 grid): the medians over `--rounds`
of one forward (the photo through the processor and the model, log p(answer): the
check's own target function, explain.cite.image.ablated_photo_targets, on one
ablation), of 16 ablations in its batched forwards, and of the whole default check
(every ablation it draws), each against as many single forwards.

    python scripts/bench_regions.py --cost --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from explain.api import Explainer
from explain.cite.check import BATCH_TOKENS, check_scores
from explain.cite.image import ablated_photo_targets, cite_image
from explain.cite.regions import fill_colour
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
    parser.add_argument("--cost", action="store_true", help="time the check (module doc)")
    parser.add_argument("--rounds", type=int, default=5, help="with --cost: rounds timed")
    args = parser.parse_args()
    if args.cost:
        cost(args.model, args.rounds)
        return
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


def _median_seconds(run: Callable[[], object], rounds: int) -> float:
    run()  # warm-up: the first call pays for allocations and lazy set-up
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cost(name: str, rounds: int) -> None:
    """The check's time against single forwards on one photo + question (module doc)."""
    torch.manual_seed(0)
    loaded = load_model(name)
    dataset = answer_dataset(name, loaded)
    example = next(
        dataset.item(index)
        for index in range(len(dataset))
        if dataset.item(index).question.template in ("colour", "shape")
    )
    photo = (np.asarray(example.scene.image) * 255).round().astype(np.uint8)
    explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
    cited = cite_image(explainer, photo, example.text, example.answer, check=False)
    regions, colour = list(cited.regions), fill_colour(photo)
    ablations = []

    def targets(keep: torch.Tensor) -> torch.Tensor:
        ablations.append(keep.shape[0])
        return ablated_photo_targets(
            explainer.adapter,
            loaded.tokenizer,
            photo,
            regions,
            colour,
            example.text,
            cited.answer_ids,
            keep,
            BATCH_TOKENS,
        )

    generator = torch.Generator().manual_seed(0)
    one = torch.ones(1, len(regions), dtype=torch.bool)
    sixteen = torch.rand(16, len(regions), generator=generator) < 0.5
    forward = _median_seconds(lambda: targets(one), rounds)
    batched = _median_seconds(lambda: targets(sixteen), rounds)
    check = _median_seconds(lambda: check_scores(cited.scores, targets), rounds)
    drawn = ablations[-1]
    device = next(loaded.model.parameters()).device
    print(
        f"{name} on {device}, torch threads {torch.get_num_threads()}: "
        f"{photo.shape[1]} x {photo.shape[0]} photo, {example.text!r} -> {example.answer!r}, "
        f"{len(regions)} regions; medians of {rounds} rounds"
    )
    print("| what | seconds | single forwards' time | ratio |")
    print("|---|---|---|---|")
    for what, seconds, count in (
        ("one forward", forward, 1),
        ("16 ablations", batched, 16),
        (f"the default check ({drawn} ablations)", check, drawn),
    ):
        singles = count * forward
        print(f"| {what} | {seconds:.4f} | {singles:.4f} | {seconds / singles:.2f} |")


if __name__ == "__main__":
    main()
