"""Generate docs/results.md: every registered method on the zoo models, with the papers'
protocols (perturbation and segmentation on shapes-vit and digits-vit, token F1 on
minilm-sentiment), ROAD and SaCo on the image models, and the known-evidence tests of the
language model (at 512, 1024 and 2048 tokens) and the vision-language model (at depths
"lm" and "tower").

    OMP_NUM_THREADS=1 python scripts/results.py --images 256 --road-saco-images 64 --answers 512
    OMP_NUM_THREADS=1 python scripts/results.py --models shapes-swin   # only its tables
    OMP_NUM_THREADS=1 python scripts/results.py --models recall-llama --recall-answers 32
    OMP_NUM_THREADS=1 python scripts/results.py --models twohop-llama --recall-answers 16

Each table is one `explain evaluate` run (resumable: rerunning reuses finished chunks in
outputs/results/*.json.parts/). The document says which command made it and compares the
method ranking with the CVPR 2021 paper's ImageNet figures.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from explain.errors import ModelLoadError, OptionError
from explain.evaluation import PROTOCOLS, perturbation_auc
from explain.evaluation.evaluate import evaluate_model
from explain.evaluation.protocol import Column
from explain.evaluation.report import markdown_table
from explain.export import atomic_write
from explain.loading.zoo import ZOO

RUNS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("shapes-vit", "perturbation", {}),
    ("shapes-vit", "segmentation", {}),
    ("shapes-vit", "class-specific", {}),
    ("shapes-vit", "road", {}),
    ("shapes-vit", "saco", {}),
    ("shapes-swin", "perturbation", {}),
    ("shapes-swin", "class-specific", {}),
    ("shapes-swin", "road", {}),
    ("shapes-swin", "saco", {}),
    ("digits-vit", "perturbation", {}),
    ("digits-vit", "segmentation", {}),
    ("digits-vit", "road", {}),
    ("digits-vit", "saco", {}),
    ("minilm-sentiment", "rationale", {}),
    ("recall-llama", "language-evidence", {"length": 512}),
    ("recall-llama", "language-evidence", {"length": 1024, "exclude": ("occlusion",)}),
    ("recall-llama", "language-evidence", {"length": 2048, "exclude": ("occlusion",)}),
    ("twohop-llama", "language-evidence", {"length": 512}),
    ("shapes-llava", "vision-language-evidence", {"depth": "lm"}),
    ("shapes-llava", "vision-language-evidence", {"depth": "tower"}),
)
"""Every table: (zoo model, protocol, the options of `evaluate_model` that set it apart).
`exclude` leaves methods out of a run for their cost (`EXCLUDED`)."""

EXCLUDED = (
    "Left out at this length: `occlusion`, for its cost. It replaces each token in turn, so "
    "an example of L tokens costs L forwards of L tokens: 8.7 CPU seconds an example at 512 "
    "tokens (against 0.3 for `attnlrp`), and 16 to 64 times that at 2,048 tokens."
)
"""What a table whose run excluded methods says (the only exclusion is occlusion's)."""

ANSWERS = ("language-evidence", "vision-language-evidence")

RECALL_MODELS = ("recall-llama", "twohop-llama")
"""The models of explain.data.recall's prompts, whose runs take --recall-answers prompts."""

FINDINGS = ("road", "saco", "language-evidence", "vision-language-evidence")
"""The protocols whose tables are followed by their best methods within noise and the
methods worse than `random` (`findings`)."""


def run_label(options: dict[str, Any]) -> str:
    """How a table's heading and file name tell its options apart ("" for none)."""
    if "length" in options:
        return f"{options['length']} tokens"
    if "depth" in options:
        return f"depth {options['depth']}"
    return ""


# CVPR 2021, ImageNet validation, ViT-B/16: negative-perturbation AUC, predicted class.
PAPER_NEGATIVE = {"transformer_attribution": 54.16, "rollout": 53.1, "attention_gradcam": 41.52}
PAPER_POSITIVE_TA = 17.03

RUN_MINUTES = 200
"""The whole run's length from scratch with the settings of the module doc, for the page's
skip marker: an estimate from the parts measured on 2026-12-01 with one thread each on a
loaded 2-core machine, two runs sharing it (shapes-vit and digits-vit with --images 256
--road-saco-images 64: 22 min; shapes-llava with --answers 512, both depths: 15 min;
recall-llama with --recall-answers 32: 11 min at 512 tokens, 11 at 1,024, 31 at 2,048),
plus shapes-swin and minilm-sentiment (8 min for the page without ROAD, SaCo and the
evidence tests on 2026-11-30), plus twohop-llama (47 min for --recall-answers 16 on
2026-12-03, beside another run of ours and others' on the 2-core machine, 12 of them
integrated gradients: about 90 with the default 32)."""

DATA_NOTES = {
    "shapes-vit": (
        "held-out scenes (seeds never used in training). Perturbation and segmentation use "
        "the scenes that hold exactly one object, so that top-1 accuracy against one label "
        "and one foreground mask are defined as on ImageNet; the model is multi-label, its "
        "top-1 class is its highest logit. Objects are bright and carry their kind's hue on "
        "a dark background (see its card), so the evidence of a single-object scene lies on "
        "the object: class-agnostic maps that find salient objects score well there too. "
        "The class-specific test uses the scenes that hold exactly two objects of different "
        "kinds, each scene twice (once per object; n counts both): the map of one object's "
        "class is scored against that object, with the other object as evidence for "
        "another class"
    ),
    "shapes-swin": (
        "the same held-out scenes as `zoo:shapes-vit` (single-object scenes for the "
        "perturbation test, two-object scenes for the class-specific test). The model is a "
        "Swin Transformer (windowed attention, three stages, patch merging between them) "
        "on a 16 x 16 patch grid, so only the methods that fold or read windowed attention "
        "run (`generic`, `rollout`, `raw_attention`; `attention_gradcam`, whose last stage "
        "is one 4 x 4 window) with the `random` baseline"
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
    "recall-llama": (
        "held-out recall prompts (seeds never used in training) of 512, 1024 and 2048 tokens: "
        "facts `key value .` among distractor facts and filler words, and a question about "
        "one key at the end; the answer is its value (two tokens), its evidence the asked "
        "fact's key and value tokens. Each answer is explained token by token and its map is "
        "the sum of its tokens' maps; the numbers count the examples the model answers "
        "right (the share is the first column)"
    ),
    "twohop-llama": (
        "held-out two-hop prompts (seeds never used in training) of 512 tokens, its trained "
        "length: chains of two facts `a b .` and `b c .` among the facts of other chains and "
        "filler words, and a question `?? a` at the end; the answer is the value c reached "
        "through the bridge b (two tokens), its evidence the keys and values of both facts "
        "of the asked chain (eight tokens), so an evidence hit counts a token of either "
        "fact. Each answer is explained token by token and its map is the sum of its "
        "tokens' maps; the numbers count the examples the model answers right (the share is "
        "the first column)"
    ),
    "shapes-llava": (
        "held-out shapes scenes, one templated question each (what colour is the star, is "
        "there a ring, what shape is the red object, what is left of the circle); the "
        "evidence is the mask of the object the answer is about (answers about no object, "
        '"no", "none", "nothing", are left out of the pointing game and the mIoU) and, '
        "on the text side, the question's words that name what it asks about; explained at "
        'depth "lm" (the language model\'s fold) and "tower" (on through the vision tower)'
    ),
}

PROTOCOL_NOTES = {
    "road": (
        "ROAD (Rong et al., ICML 2022): the pixels of the predicted class's map are removed "
        "most relevant first (MoRF, lower is better) or least relevant first (LeRF, higher is "
        "better) as in the perturbation test, but filled by noisy linear imputation from "
        "their neighbours instead of zeroed, so that the removal's shape does not tell the "
        "model the class; AUCs of top-1 accuracy on the perturbation test's scale.\n"
    ),
    "saco": (
        "SaCo (Wu et al., CVPR 2024): the pixels are cut into ten equal groups by the map's "
        "relevance and each group is replaced alone by the image's mean; SaCo is the share of "
        "the pairs of groups, weighted by their difference in total relevance, where the more "
        "relevant group lowers the predicted class's probability more (1: all, -1: none, a "
        "map carrying no order: 0).\n"
    ),
    "language-evidence": (
        "Evidence hit@k: an evidence token is among the k most relevant prompt tokens (the "
        "readout position and special tokens excluded; ties broken at random, expected "
        "values); rank: the expected rank of the first evidence token (lower is better). "
        "Comprehensiveness and sufficiency (ERASER): the drop of the answer's probability when "
        "the most relevant 1, 5, 10, 20 and 50% of the context's tokens are replaced "
        "(higher is better) or are all that is kept (lower is better), averaged. Positive and "
        "negative AUC: the answer's mean log-probability as 10% to 90% of the context's "
        "tokens are replaced, most (lower is better) or least (higher is better) relevant "
        "first. The question is never replaced.\n"
    ),
    "vision-language-evidence": (
        "Pointing game: the image map's maximum lies within one patch of the object the answer "
        "is about; mIoU: the map thresholded at its mean against that object's mask. Region "
        "first: with the scene's objects' masks as the regions (each scored by its patches' "
        "relevance, as `explain cite --image` scores a photo's regions), the answer's object "
        "scores highest, on the scenes with other objects; top region removal: removing the "
        "region ranked first (filled with the image's mean colour) drops the answer's "
        "log-probability more than removing another object (higher is better). Positive "
        "and negative AUC: the answer's mean log-probability as 10% to 90% of the patches "
        "are set to black, most (lower is better) or least (higher is better) relevant "
        "first. Text hit@k and rank: the question's evidence words among the prompt's text "
        "tokens, as for the language model.\n"
    ),
}
"""What each newer protocol does, printed above its tables."""

READINGS: dict[tuple[str, str, str], str] = {
    ("recall-llama", "language-evidence", "512 tokens"): (
        "Reading: `attnlrp` and `cp_lrp` rank an evidence token first on every prompt at "
        "every length, and so does `occlusion` (run at 512 tokens only); replacing what they "
        "rank first takes the answer away (comprehensiveness 1.000). `generic` ranks two "
        "filler words first on nearly every prompt: the two words right after the asked "
        "fact's closing `.` (on 12 of 12 prompts probed), and replacing them never changes "
        "the answer (200 of 200 held-out prompts), so they are not evidence. The model's "
        "first block copies the fact's words into the positions after it and the last block's"
        " attention reads the fact there; `generic` keeps relevance where the last block read"
        " it (the identity term of its rollout, a token's own residual stream) instead of "
        "tracing all of it back to the words it came from, so the top of its map is the route"
        " the answer took, and the evidence follows (hit@5 0.94; 0.81 at 2,048 tokens). "
        "`rollout` shows the same route on about half of the prompts. Of the gradient "
        "baselines, gradient x input finds the evidence among the top 5 on most prompts but "
        "first on few (it saturates: the answer's probability is nearly 1), and integrated "
        "gradients first on a third (512 tokens) to two thirds (2,048 tokens) of them. "
        "`raw_attention` and `attention_gradcam` rank the evidence below `random`: the last "
        "block's attention from the answer position, averaged over its heads, is not where "
        "the answer comes from. Sufficiency (keeping only the top tokens) is best for "
        "`rollout`, then `occlusion`.\n"
    ),
    ("twohop-llama", "language-evidence", "512 tokens"): (
        "Reading: an evidence hit here counts a token of either fact, and `attnlrp`, "
        "`cp_lrp` and `occlusion` find one first on every prompt. Whether a method finds "
        "both facts is a span-level question, answered by the two-hop table of "
        "docs/benchmarks.md: on these 16 prompts `cp_lrp` ranks the answer's fact `b c .` "
        "first on 16 and the bridge `a b .` among its top 2 on 4; on 10 it ranks the bridge "
        "among its last four spans, with a negative score, although removing the bridge "
        "takes the answer away. The bridge acts through the last block's attention weights "
        "only (the question's second lookup asks for b): with its words replaced by filler "
        "the answer's log-probability falls by 4.3 to 14.3 nats (the first 6 prompts), and "
        "taking that block's attention weights from the intact prompt brings it back to "
        "within 0.15 nats. CP-LRP holds the attention weights constant, so only the "
        "bridge's values count, and they speak against the answer; `attnlrp` passes "
        "relevance through the softmax and still scores the bridge negative. By |score| the "
        "bridge is second on 13 of the 16 prompts. `generic` ranks an evidence token first "
        "on 10 of 16 (0.625); `occlusion` (replacing one token at a time) is best on "
        "sufficiency.\n"
    ),
    ("shapes-vit", "road", ""): (
        "Reading: with imputation instead of zeros, of the attention and LRP methods "
        "`cp_lrp` takes the prediction away fastest, `generic` and `transformer_attribution` "
        "next, but "
        "`lrp` does no better than `random` on MoRF. Its map is not about the object: on the "
        "first 32 held-out scenes only 25% of its most relevant 10% of pixels lie on the "
        "object (55% for `generic` and `cp_lrp`), and the imputation changes those pixels by "
        "0.065 on average (0.18 for `generic`): it removes almost nothing. `attnlrp` is "
        "clearly behind `cp_lrp` on MoRF (41 against 25) although the pixels both remove "
        "first lie on the object as often (54% and 55%) and are changed as much; we have "
        "not found why.\n"
    ),
    ("shapes-vit", "saco", ""): (
        "Reading: `attnlrp`, `cp_lrp` and `generic` order the pixels the way the "
        "probability reacts to them (tied near 0.97), the other attention-based maps "
        "follow (0.81 to 0.94); `attention_gradcam` and full `lrp` barely do (0.27 and "
        "0.29), in line with their perturbation and ROAD rows.\n"
    ),
    ("digits-vit", "road", ""): (
        "Reading: here ROAD reorders the perturbation test. With zeros `attnlrp` and "
        "`cp_lrp` are close to the best MoRF (18.9 and 19.5 against 15.4); with imputation "
        "they fall behind `generic` and `rollout` (53 and 52 against 37 and 35) while "
        "leading LeRF. Measured on the first 32 held-out digits: of the 30% of pixels they "
        "rank first, 53% and 51% are ink (66% for `generic`, 70% for `rollout`), and the "
        "imputation changes them by 0.13 on average (0.20 for `generic`, 0.24 for "
        "`rollout`): their MoRF order removes less under ROAD than under zeroing. We think "
        "they rank ink-free patches high (missing ink tells a digit too), and ROAD refills "
        "a blank patch among blank neighbours with blank.\n"
    ),
    ("digits-vit", "saco", ""): (
        "Reading: `attnlrp`, `transformer_attribution`, `generic` and `cp_lrp` are tied; "
        "`attention_gradcam`, `partial_lrp` and `raw_attention` order the pixels little "
        "better than `random` (0.19, 0.11, 0.29 against 0.01).\n"
    ),
    ("shapes-llava", "vision-language-evidence", "depth lm"): (
        "Reading, measured per template on the same examples (pointing game): `attnlrp` and "
        "`cp_lrp` point at the answer's object in every template. `generic` fails on "
        "presence questions (0.61; colour 1.00, shape 0.90, left 0.90): its maximum lies "
        "on another object in 32% of them and on the background in 7%. On presence "
        'questions answered "yes" (40 scenes with other objects) the readout\'s attention '
        "in the language model's last two blocks goes mostly to the object's image tokens "
        "(82% and 52% of it), but the gradient times that attention is negative there in 90% "
        "and 95% of the examples; `generic` keeps only the positive part of each head's "
        "product, and we think this is why what is left of the object loses the maximum. "
        '`raw_attention` and `rollout` fail on "left" questions (0.66, 0.63): 22% and 29% '
        "of their maxima lie on the object the question names (the one whose left is "
        "asked), which the model looks at but the answer is not about. `attention_gradcam` "
        "misses in every template alike (0.63 to 0.66; other objects 19%, background 17%), "
        "and its negative AUC is below `random`'s. On the text side, of the attention and "
        "LRP methods only `attnlrp` ranks the named word first often (0.43; 0.78 on shape "
        "questions, where the colour word is the only clue). "
        '`generic`, `cp_lrp` and `attnlrp` often rank first the template word "there" of '
        'presence questions and "left" of left questions, and `generic`, `rollout`, '
        '`raw_attention`, `attention_gradcam` and `cp_lrp` the chat template\'s "user" '
        "(139, 339, 166, 249 and 107 of 468 examples answered right). Replacing the "
        "question word a method ranks first by an unknown word changes the answer in 56% of "
        "the cases for `attnlrp`, 43% `cp_lrp`, 35% `generic`, 16% `attention_gradcam`, "
        "13% `raw_attention` and 13% `random` (replacing the named word: 61%; the template's "
        "second word: 1%). The baselines split: `occlusion` ranks the named word first "
        "most often of all (0.53) but points at the object least of the non-random "
        "methods (0.49; one 8 x 8 patch at a time, while an object covers several: we "
        "think removing one of them seldom changes the answer), `integrated_gradients` "
        "points as `generic` does (0.87) with a better mIoU (0.57) and a negative AUC "
        "near the best (-16.41; `smoothgrad`, best, -10.87), and `gradient_x_input`'s "
        "negative AUC is below `random`'s. "
        "At the region level (the scenes' objects as the regions: the 236 answers right "
        "about an object in a scene with other objects, all four templates) `cp_lrp` ranks "
        "the answer's object first in every scene and `attnlrp` in all but one (1.000, "
        "0.996), and removing the region they rank first drops the answer more than "
        "removing another object (1.000, 0.998); removing the answer's own object does in "
        "every scene (the model's number, 1.000), so a method's top region removal follows "
        "its region first. The pointing game reads the map's maximum within one patch of the "
        "object, the region level the sum over each object's patches: `gradient_x_input` "
        "and `smoothgrad` point at 0.798 and 0.785 but rank the object's region first on "
        "0.547 and 0.525.\n"
    ),
    ("shapes-llava", "vision-language-evidence", "depth tower"): (
        "Reading: through the tower `attnlrp` and `cp_lrp` still point at the object (0.99), "
        "`generic` scores exactly as at depth lm in every template, and `rollout` loses "
        "ground (0.92 to 0.79): its misses lie on other objects (13% to 24% of colour, "
        "presence and shape questions) and on the named object (32% of left questions); "
        "we think rolling the tower's attention in spreads relevance between patches of "
        "different objects. The text columns are the same as "
        "at depth lm: the depth changes only the image side. At the region level "
        "`cp_lrp` and `attnlrp` still rank the answer's object first (0.996, 0.992), "
        "`generic` exactly as at depth lm (0.831), and `rollout` falls further than its "
        "pointing game (0.886 to 0.606). The methods that read one fixed block have no "
        "tower map (skipped below).\n"
    ),
}
"""What a table shows and why we think so, measured beyond the table, printed under it:
by (model, protocol, run label)."""


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
- Scale of the AUC. Ours integrates from x = 0 (the unperturbed accuracy) to x = 0.9, so
  it is at most 90; the authors' evaluation code prints the accuracy at each step and
  fixes no AUC formula. Integrating over 10% to 90% removed only (`explain evaluate
  --auc-range 10-90`, at most 80) drops the first trapezoid, 5 x (accuracy at 0 +
  accuracy at 0.1) points of the positive AUCs: {first_trapezoid}. The AUC also depends
  on the unperturbed accuracy and on the chance level the curves fall to (1/6 of the
  single-object scenes, 1/10 for digits, 1/1000 on ImageNet), so compare methods inside
  one table, never absolute values across tables or with the paper.
- Ties in the ranking of pixels. Pixels of equal relevance are removed in raster order
  (row by row; a stable sort), so every run removes the same pixels. The authors' code
  uses `torch.topk`, which leaves the order of ties undefined; on the same digits, model
  and maps our loop gave 11 of their 12 AUCs exactly, and the twelfth differed only
  through that order.
- Noise. Every ranking number comes with its bootstrap standard error (the examples drawn
  again with replacement, 1000 times). Two methods are tied within noise when the central
  95% of their paired bootstrap differences (both methods on the same draws) contains 0.
  Pairing separates a gap that holds on most examples even where it is barely twice each
  method's own standard error (methods fail on the same hard examples). Bold marks the
  best value and every value tied with it.
- The shapes model is multi-label (one sigmoid per kind). On single-object scenes its
  highest logit is its top-1 class, the one the predicted-class maps explain; the
  class-specific test tracks the explained class's sigmoid probability.
- Text: the sentences are short (about 10 to 16 words, one to three of them rationale),
  so from k = 20 on every word is chosen and all methods tie, and even a perfect ranking
  scores well below 1 at k = 5 (one rationale word among five chosen: F1 = 1/3); the k = 5
  column is the one that separates the methods.
"""

CLASS_SPECIFIC_NOTE = """\
The class-specific test explains each object's class in a two-object scene. Perturbation:
the pixels of that class's map are zeroed, most relevant first (positive) or least
relevant first (negative), and the class's mean sigmoid probability is tracked (AUC on the
same scale as above); "other kept AUC" is the AUC of the OTHER object's class along the
same positive order (higher is better: a map that is about its own class takes its object
away first and leaves the other's). mIoU: the map thresholded at its mean against the
explained object's mask, the other object counted as background. "Denser on target": the
share of examples whose map is denser (mean over the object's pixels) on the explained
object than on the other one. A class-agnostic map is the same for both classes of a
scene, so exactly one of the scene's two examples finds its own object denser: 0.5 by
construction.
"""


def ranking(results: dict[str, Any], key: str, methods: tuple[str, ...], best_high: bool) -> list:
    present = [m for m in methods if m in results["results"]]
    return sorted(present, key=lambda m: results["results"][m][key], reverse=best_high)


def _value(summary: dict[str, Any], key: str) -> str:
    """A summary number with its standard error, as the tables print it."""
    value, error = summary[key], summary["standard_errors"].get(key)
    places = 2 if abs(value) >= 1.5 else 3
    return f"{value:.{places}f}" + ("" if error is None else f" ± {error:.{places}f}")


def _tied(results: dict[str, Any], key: str) -> str:
    """The best method on `key` and every method within noise of it, with their values."""
    return ", ".join(f"`{m}` {_value(results['results'][m], key)}" for m in results["ties"][key])


def comparison(perturbation: dict[str, Any], segmentation: dict[str, Any]) -> str:
    """Sentences with our numbers next to the paper's, the best methods within noise, and
    the random baseline's margin."""
    results = perturbation["results"]
    lines = []
    ours = ranking(perturbation, "negative_auc_predicted", tuple(PAPER_NEGATIVE), True)
    paper = sorted(PAPER_NEGATIVE, key=PAPER_NEGATIVE.get, reverse=True)
    if ours:
        cells = ", ".join(f"`{m}` {_value(results[m], 'negative_auc_predicted')}" for m in ours)
        same = "the same order as" if ours == paper[: len(ours)] else "a different order from"
        lines.append(
            f"- Negative perturbation AUC, predicted class (higher is better; ours from x = 0, "
            f"at most 90): {cells}: {same} the paper's ImageNet ViT-B/16 figures "
            + ", ".join(f"`{m}` {PAPER_NEGATIVE[m]}" for m in paper)
            + "."
        )
    if "transformer_attribution" in results:
        summary = results["transformer_attribution"]
        late = perturbation_auc(summary["curves"]["positive_predicted"], auc_range="10-90")
        lines.append(
            "- Positive perturbation AUC of `transformer_attribution` (lower is better): "
            f"{_value(summary, 'positive_auc_predicted')} here from x = 0 ({late:.2f} over "
            f"10-90% only), {PAPER_POSITIVE_TA} in the paper."
        )
    accuracy = next(iter(results.values()))["accuracy"]
    if accuracy < 0.9:
        lines.append(
            f"- The model itself is weak on this set (top-1 accuracy {accuracy:.3f} on the "
            "clean images), which pulls every curve and AUC toward the chance level: read the "
            "ranking and the margins over `random`, not the levels."
        )
    lines.append(
        "- Best here, with every method tied with it within noise (predicted class): "
        f"positive AUC {_tied(perturbation, 'positive_auc_predicted')}; negative AUC "
        f"{_tied(perturbation, 'negative_auc_predicted')}; mIoU {_tied(segmentation, 'miou')}. "
        "Among the methods the CVPR 2021 paper compares, `transformer_attribution` is best "
        "on all three on ImageNet."
    )
    saturated = [m for m in results if round(results[m]["negative_auc_predicted"], 2) >= 90.0]
    if len(saturated) > 1:
        lines.append(
            f"- {len(saturated)} methods reach the negative AUC's maximum (90: the model keeps "
            "every prediction while the least relevant 90% of pixels go), so that column "
            "does not separate them; the positive AUC, mIoU and the class-specific test do."
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


def class_specific_findings(results: dict[str, Any]) -> str:
    """Which methods the class-specific test finds no better than class-agnostic, and the
    best ones within noise."""
    per_method = results["results"]
    groups: dict[str, list[str]] = {"chance": [], "above": [], "below": []}
    for method, summary in per_method.items():
        share, error = summary["denser_on_target"], summary["standard_errors"]["denser_on_target"]
        group = "chance" if abs(share - 0.5) <= 2 * error else "above" if share > 0.5 else "below"
        groups[group].append(method)
    titles = {
        "chance": "within two standard errors of 0.5, no better than a class-agnostic map",
        "above": "clearly above 0.5, class-specific",
        "below": "clearly below 0.5, denser on the OTHER object",
    }
    lines = [
        '- "Denser on target": '
        + "; ".join(
            f"{titles[group]}: "
            + ", ".join(f"`{m}` {per_method[m]['denser_on_target']:.3f}" for m in methods)
            for group, methods in groups.items()
            if methods
        )
        + "."
    ]
    keys = ("positive_auc", "negative_auc", "other_kept_auc", "miou")
    columns = PROTOCOLS["class-specific"].columns
    lines += best_lines(results, {key: columns[key] for key in keys})
    return "\n".join(lines)


def best_lines(results: dict[str, Any], columns: dict[str, Column]) -> list[str]:
    """Per ranking column: the best method and every method tied with it within noise."""
    return [
        f"- Best {column.header}, with every method tied with it: {_tied(results, key)}."
        for key, column in columns.items()
        if column.better and key in results["ties"]
    ]


def findings(results: dict[str, Any], protocol: str) -> str:
    """The best methods within noise on each ranking number, and the methods whose number
    is on the wrong side of the `random` baseline's (worse than a map that knows nothing)."""
    columns = PROTOCOLS[protocol].columns
    lines = best_lines(results, dict(columns))
    per_method = results["results"]
    if "random" in per_method:
        for key, column in columns.items():
            if not column.better:
                continue
            sign = 1 if column.better == "higher" else -1
            level = per_method["random"][key]
            worse = [m for m, s in per_method.items() if sign * (s[key] - level) < 0]
            if worse:
                baseline = _value(per_method["random"], key)
                lines.append(
                    f"- {column.header}: worse than `random` ({baseline}): "
                    + ", ".join(f"`{m}` {_value(per_method[m], key)}" for m in worse)
                    + "."
                )
    return "\n".join(lines)


Runs = dict[tuple[str, str, str], dict[str, Any]]
"""Results by (model, protocol, run label)."""


def first_trapezoids(runs: Runs) -> str:
    """How much starting at x = 0 adds to the positive AUCs of each perturbation table."""
    parts = []
    for (model, protocol, _), results in runs.items():
        if protocol == "perturbation":
            added = [
                5 * (curve[0] + curve[1])
                for curve in (
                    s["curves"]["positive_predicted"] for s in results["results"].values()
                )
            ]
            parts.append(f"{min(added):.1f} to {max(added):.1f} in `zoo:{model}`'s table")
    return "; ".join(parts) if parts else "no perturbation table in this run"


def existing_sections(doc: Path) -> tuple[str, dict[str, str], str]:
    """The current page split at its level-2 headings: (everything before the first model,
    {model: its section}, the sections after the models), each ending in one newline."""
    text = doc.read_text() if doc.is_file() else ""
    parts = re.split(r"(?m)^(?=## )", text)
    models, rest = {}, ""
    for part in parts[1:]:
        found = re.match(r"## `zoo:([^`]+)`", part)
        if found:
            models[found.group(1)] = part.rstrip() + "\n"
        else:
            rest += part
    return parts[0].rstrip() + "\n" if parts[0].strip() else "", models, rest.rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256, help="images per image run")
    parser.add_argument("--sentences", type=int, default=300, help="sentences per text run")
    parser.add_argument(
        "--road-saco-images",
        type=int,
        help="images per ROAD and SaCo run (default: --images); ROAD solves a sparse system "
        "per image and removed fraction, about 10x a perturbation run's time",
    )
    parser.add_argument("--answers", type=int, default=256, help="prompts per shapes-llava run")
    parser.add_argument(
        "--recall-answers",
        type=int,
        default=32,
        help="prompts per recall-llama and twohop-llama run: at 2,048 tokens a prompt "
        "takes about 40 CPU seconds over its nine methods, at 512 tokens occlusion alone 9",
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("outputs/results"))
    parser.add_argument("--doc", type=Path, default=Path("docs/results.md"))
    models = tuple(dict.fromkeys(model for model, _, _ in RUNS))
    parser.add_argument(
        "--models",
        nargs="+",
        choices=models,
        default=models,
        help="evaluate these zoo models only; the page keeps its other models' sections "
        "(and the comparison with the papers unless both shapes-vit and digits-vit run)",
    )
    args = parser.parse_args(argv)
    threads = os.environ.get("OMP_NUM_THREADS")
    command = (f"OMP_NUM_THREADS={threads} " if threads else "") + shlex.join(
        ["python", "scripts/results.py", *(sys.argv[1:] if argv is None else argv)]
    )
    runs: Runs = {}
    excluded: set[tuple[str, str, str]] = set()  # runs that left methods out
    missing: dict[str, str] = {}
    for model, protocol, options in RUNS:
        if model not in args.models or model in missing:
            continue
        limit = {
            "rationale": args.sentences,
            **dict.fromkeys(
                ANSWERS, args.recall_answers if model in RECALL_MODELS else args.answers
            ),
            **dict.fromkeys(("road", "saco"), args.road_saco_images or args.images),
        }
        label = run_label(options)
        if options.get("exclude"):
            excluded.add((model, protocol, label))
        name = "-".join(
            [model, protocol, *(str(value) for key, value in options.items() if key != "exclude")]
        )
        try:
            runs[model, protocol, label] = evaluate_model(
                protocol,
                f"zoo:{model}",
                args.out / f"{name}.json",
                limit=limit.get(protocol, args.images),
                batch_size=args.batch_size,
                **options,
            )
        except ModelLoadError:  # a zoo model not trained (or not in) this checkout yet
            missing[model] = (
                "the model had no trained weights in this checkout when this page was "
                f"generated; `python {ZOO[model].command}` trains it, then rerun this script"
                if model in ZOO
                else "the model is not in this checkout's zoo yet"
            )
        except OptionError as error:  # its held-out set is not registered yet
            missing[model] = f"{error}"
    header = [
        "# Results: every method on the zoo models\n",
        "Generated by `scripts/results.py` with\n",
        # docs test: the marker skips this long run.
        f"<!-- skip: long run (about {RUN_MINUTES} minutes with one thread) -->\n"
        f"```bash\n{command.strip()}\n```\n",
        "Each table is one `explain evaluate` run (e.g. `explain evaluate perturbation "
        f"--model zoo:shapes-vit --limit {args.images} --batch-size {args.batch_size} "
        "--output results.json`); the JSON files, tables and curve plots are in "
        f"`{args.out}/`. Protocols (Chefer et al.): perturbation AUC of top-1 accuracy as "
        "the most (positive, lower is better) or least (negative, higher is better) "
        "relevant pixels are zeroed, 100 x the area from x = 0 (the unperturbed accuracy) "
        "to x = 0.9, so at most 90 (`--auc-range 10-90` integrates over 10% to 90% only); "
        "segmentation pixel accuracy, mIoU and mAP of the map thresholded at its mean; "
        "token F1 of the top-k words. Added here: the class-specific test on two-object "
        "scenes (below the shapes-vit tables); ROAD (removal by noisy linear imputation "
        "instead of zeros) and SaCo (do more relevant pixels matter more) on the image "
        "models; and, on models whose evidence is known, the language-evidence test "
        "(evidence recall, ERASER comprehensiveness and sufficiency, the answer's "
        "log-probability as its most or least relevant tokens are replaced) and the "
        "vision-language-evidence test (pointing game, mIoU, the scene's objects as regions "
        "and the removal of the top one, the answer's log-probability as patches are removed, "
        "the question's words on the text side). docs/methods.md "
        "defines every number.\n",
        "Every number that ranks methods is followed by its bootstrap standard error (±; "
        "1000 resamples of the examples); in each column the best value and every value "
        "within noise of it are **bold** (the central 95% of the paired bootstrap "
        "differences from the best contains 0).\n",
    ]
    everything = set(args.models) == set(models)
    kept_header, kept_models, kept_rest = existing_sections(args.doc)
    sections = header if everything or not kept_header else [kept_header]
    for model in models:
        if model not in args.models and model in kept_models:
            sections.append(kept_models[model])
            continue
        sections.append(f"## `zoo:{model}`\n\nData: {DATA_NOTES[model]}.\n")
        if not everything and model in args.models and model not in missing:
            sections.append(f"These tables were generated by `{command.strip()}`.\n")
        if model in missing or model not in args.models:
            sections.append(f"Not evaluated: {missing.get(model, 'not run for this page')}\n")
        for (run_model, protocol, label), results in runs.items():
            if run_model == model:
                heading = f"{protocol}, {label}" if label else protocol
                sections.append(
                    f"### {heading} (n = {results['n']})\n\n"
                    + (CLASS_SPECIFIC_NOTE + "\n" if protocol == "class-specific" else "")
                    + (PROTOCOL_NOTES[protocol] + "\n" if protocol in PROTOCOL_NOTES else "")
                    + (EXCLUDED + "\n\n" if (model, protocol, label) in excluded else "")
                    + markdown_table(results, PROTOCOLS[protocol].columns)
                )
                if protocol == "class-specific":
                    sections.append(class_specific_findings(results) + "\n")
                elif protocol in FINDINGS:
                    sections.append(findings(results, protocol) + "\n")
                reading = READINGS.get((model, protocol, label))
                if reading:
                    sections.append(reading)
    papers = ("shapes-vit", "digits-vit")
    if any((model, "perturbation", "") not in runs for model in papers) and kept_rest.strip():
        sections.append(kept_rest)
    else:
        sections.append("## Against the papers\n")
        for model in papers:
            if model in missing:
                continue
            sections.append(
                f"On `zoo:{model}`:\n\n"
                + comparison(runs[model, "perturbation", ""], runs[model, "segmentation", ""])
                + "\n"
            )
        sections.append(DISCUSSION.format(first_trapezoid=first_trapezoids(runs)))
    with atomic_write(args.doc, "w") as handle:
        handle.write("\n".join(sections))
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
