"""Generate docs/results.md: every registered method on the zoo models, with the papers'
protocols (perturbation and segmentation on shapes-vit and digits-vit, token F1 on
minilm-sentiment).

    OMP_NUM_THREADS=1 python scripts/results.py --images 400 --sentences 300

Each table is one `explain evaluate` run (resumable: rerunning reuses finished chunks in
outputs/results/*.json.parts/). The document says which command made it and compares the
method ranking with the CVPR 2021 paper's ImageNet figures.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from explain.errors import ModelLoadError
from explain.evaluation import PROTOCOLS
from explain.evaluation.evaluate import evaluate_model
from explain.evaluation.report import markdown_table
from explain.io import atomic_write
from explain.zoo import ZOO

RUNS = (
    ("shapes-vit", "perturbation"),
    ("shapes-vit", "segmentation"),
    ("digits-vit", "perturbation"),
    ("digits-vit", "segmentation"),
    ("minilm-sentiment", "rationale"),
)

# CVPR 2021, ImageNet validation, ViT-B/16: negative-perturbation AUC, predicted class.
PAPER_NEGATIVE = {"transformer_attribution": 54.16, "rollout": 53.1, "attention_gradcam": 41.52}
PAPER_POSITIVE_TA = 17.03

DATA_NOTES = {
    "shapes-vit": (
        "held-out scenes (seeds never used in training) that hold exactly one object, so that "
        "top-1 accuracy against one label and one foreground mask are defined as on ImageNet; "
        "the model is multi-label, its top-1 class is its highest logit. Objects are bright "
        "and carry their kind's hue on a dark background (see its card), so the evidence of "
        "a single-object scene lies on the object: class-agnostic maps that find salient "
        "objects score well here too, and the class-specific test is the demo's two-object "
        "check"
    ),
    "digits-vit": (
        "the 400 held-out scikit-learn digits; they have no masks, so the segmentation masks "
        "are DERIVED from the strokes (upsampled ink >= 0.5): a digit classifier may rightly "
        "look at where ink is missing, so read that table as a sanity check, not a target"
    ),
    "minilm-sentiment": (
        "held-out sentences whose rationale is known by construction (the sentiment words and "
        "a negation); token F1 of the top-k words, explained for the predicted class"
    ),
}


DISCUSSION = """
### Why our numbers differ from the paper's

- Scale. The paper's ViT-B/16 has 12 blocks over 197 tokens and was pretrained on
  ImageNet-21k; the zoo's ViTs have 4 blocks over 65 tokens and were trained here in
  minutes. What separates the methods on ViT-B (rollout multiplies row-normalised
  (A + I) over every block, attention GradCAM sees one block, the LRP and gradient rules
  weigh heads by their effect on the class) matters less with 4 blocks, so rankings that
  are a few points apart in the paper can reorder here.
- Data. A shapes scene has one object on clutter and nothing else carries its class;
  ImageNet objects come with context. Zeroing pixels makes black regions that the
  synthetic training data never contains, so the models' reaction to removal differs from
  an ImageNet model's. Digits are 8 x 8 scans upsampled to 32 x 32: a few strokes decide
  the class, and the background (no ink) is informative too.
- Scale of the AUC. It depends on the unperturbed accuracy (the x = 0 point) and on the
  chance level the curves fall to (1/6 of the single-object scenes, 1/10 for digits,
  1/1000 on ImageNet), so compare methods inside one table, never absolute values across
  tables or with the paper.
- Noise. Each curve point is a proportion of n images (standard error at most
  0.5 / sqrt(n): 3.1 points of accuracy at n = 256) and the AUC averages nine of them;
  differences of a point or two are within noise, as are the paper's own re-runs.
- The shapes model is multi-label (one sigmoid per kind). On single-object scenes its
  highest logit is its top-1 class, the one the predicted-class maps explain.
- Text: the sentences are short (about 10 to 16 words, one to three of them rationale),
  so from k = 20 on every word is chosen and all methods tie, and even a perfect ranking
  scores well below 1 at k = 5 (one rationale word among five chosen: F1 = 1/3); the k = 5
  column is the one that separates the methods.
"""


def ranking(results: dict[str, Any], key: str, methods: tuple[str, ...], best_high: bool) -> list:
    present = [m for m in methods if m in results["results"]]
    return sorted(present, key=lambda m: results["results"][m][key], reverse=best_high)


def _best(results: dict[str, Any], key: str, high: bool) -> list[str]:
    """The methods with the best value of `key`, every one that ties at two decimals."""
    values = {method: round(record[key], 2) for method, record in results.items()}
    target = max(values.values()) if high else min(values.values())
    return [method for method, value in values.items() if value == target]


def comparison(perturbation: dict[str, Any], segmentation: dict[str, Any]) -> str:
    """Sentences with our numbers next to the paper's, and the random baseline's margin."""
    results = perturbation["results"]
    lines = []
    ours = ranking(perturbation, "negative_auc_predicted", tuple(PAPER_NEGATIVE), True)
    paper = sorted(PAPER_NEGATIVE, key=PAPER_NEGATIVE.get, reverse=True)
    if ours:
        cells = ", ".join(f"`{m}` {results[m]['negative_auc_predicted']:.2f}" for m in ours)
        same = "the same order as" if ours == paper[: len(ours)] else "a different order from"
        lines.append(
            f"- Negative perturbation AUC, predicted class (higher is better): {cells}: "
            f"{same} the paper's ImageNet ViT-B/16 figures "
            + ", ".join(f"`{m}` {PAPER_NEGATIVE[m]}" for m in paper)
            + "."
        )
    if "transformer_attribution" in results:
        lines.append(
            "- Positive perturbation AUC of `transformer_attribution` (lower is better): "
            f"{results['transformer_attribution']['positive_auc_predicted']:.2f} here, "
            f"{PAPER_POSITIVE_TA} in the paper."
        )
    accuracy = next(iter(results.values()))["accuracy"]
    if accuracy < 0.9:
        lines.append(
            f"- The model itself is weak on this set (top-1 accuracy {accuracy:.3f} on the "
            "clean images), which pulls every curve and AUC toward the chance level: read the "
            "ranking and the margins over `random`, not the levels."
        )
    segmentation_results = segmentation["results"]
    best = {
        "positive AUC": _best(results, "positive_auc_predicted", high=False),
        "negative AUC": _best(results, "negative_auc_predicted", high=True),
        "mIoU": _best(segmentation_results, "miou", high=True),
    }
    lines.append(
        "- Best here (predicted class; ties to two decimals listed together): "
        + ", ".join(
            f"{metric} {' = '.join(f'`{m}`' for m in found)}" for metric, found in best.items()
        )
        + "; among the methods the CVPR 2021 paper compares, `transformer_attribution` is "
        "best on all three on ImageNet."
    )
    saturated = [m for m in results if round(results[m]["negative_auc_predicted"], 2) >= 90.0]
    if len(saturated) > 1:
        lines.append(
            f"- {len(saturated)} methods reach the negative AUC's maximum (90: the model keeps "
            "every prediction while the least relevant 90% of pixels go), so that column "
            "does not separate them; the positive AUC and mIoU do."
        )
    if "generic" in results and "random" in results:
        g, r = results["generic"], results["random"]
        seg = segmentation["results"]
        lines.append(
            f"- `generic` against `random`: positive AUC {g['positive_auc_predicted']:.2f} vs "
            f"{r['positive_auc_predicted']:.2f} (lower is better), negative AUC "
            f"{g['negative_auc_predicted']:.2f} vs {r['negative_auc_predicted']:.2f} (higher "
            f"is better), mIoU {seg['generic']['miou']:.3f} vs {seg['random']['miou']:.3f}."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=400, help="images per image run")
    parser.add_argument("--sentences", type=int, default=300, help="sentences per text run")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("outputs/results"))
    parser.add_argument("--doc", type=Path, default=Path("docs/results.md"))
    args = parser.parse_args(argv)
    threads = os.environ.get("OMP_NUM_THREADS")
    command = (f"OMP_NUM_THREADS={threads} " if threads else "") + shlex.join(
        ["python", "scripts/results.py", *(sys.argv[1:] if argv is None else argv)]
    )
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    missing: dict[str, str] = {}
    for model, protocol in RUNS:
        limit = args.sentences if protocol == "rationale" else args.images
        try:
            runs[model, protocol] = evaluate_model(
                protocol,
                f"zoo:{model}",
                args.out / f"{model}-{protocol}.json",
                limit=limit,
                batch_size=args.batch_size,
            )
        except ModelLoadError:  # a zoo model not trained in this checkout yet
            missing[model] = (
                "the model had no trained weights in this checkout when this page was "
                f"generated; `python {ZOO[model].script}` trains it, then rerun this script"
            )
    sections = [
        "# Results: every method on the zoo models\n",
        "Generated by `scripts/results.py` with\n",
        # docs test: the marker skips this long run.
        f"<!-- skip: long run (about an hour on 2 cores) -->\n```bash\n{command.strip()}\n```\n",
        "Each table is one `explain evaluate` run (e.g. `explain evaluate perturbation "
        f"--model zoo:shapes-vit --limit {args.images} --batch-size {args.batch_size} "
        "--output results.json`); the JSON files, tables and curve plots are in "
        f"`{args.out}/`. Protocols (Chefer et al.): perturbation AUC (x 100, at most 90) "
        "of top-1 accuracy as the most (positive, lower is better) or least (negative, "
        "higher is better) relevant pixels are zeroed; segmentation pixel accuracy, mIoU "
        "and mAP of the map thresholded at its mean; token F1 of the top-k words.\n",
    ]
    for model in dict.fromkeys(model for model, _ in RUNS):
        sections.append(f"## `zoo:{model}`\n\nData: {DATA_NOTES[model]}.\n")
        if model in missing:
            sections.append(f"Not evaluated: {missing[model]}\n")
        for (run_model, protocol), results in runs.items():
            if run_model == model:
                sections.append(
                    f"### {protocol} (n = {results['n']})\n\n"
                    + markdown_table(results, PROTOCOLS[protocol].columns)
                )
    sections.append("## Against the papers\n")
    for model in ("shapes-vit", "digits-vit"):
        if model in missing:
            continue
        sections.append(
            f"On `zoo:{model}`:\n\n"
            + comparison(runs[model, "perturbation"], runs[model, "segmentation"])
            + "\n"
        )
    sections.append(DISCUSSION)
    with atomic_write(args.doc, "w") as handle:
        handle.write("\n".join(sections))
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
