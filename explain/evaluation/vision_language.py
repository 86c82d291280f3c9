"""The vision-language-evidence test: does the map of a vision-language model's answer
point at the object the answer is about, and does the answer rest on the patches the map
ranks first?

Each example (`ImageAnswerExample`) is a question about an image, the answer the model
should give, the mask of the object the answer is about and the positions of the
question's evidence words. The answer is explained token by token at the chosen depth
("lm": the language model's fold, carried back to the tower's patch grid; "tower": on
through the vision tower, docs/multimodal.md) from one forward and one batched backward,
and its image map and its text map are the sums of its tokens' maps. Then, per example:

- pointing game: the image map's maximum lies on a patch within one patch (diagonals
  included) of a patch holding any of the object's pixels; tied maxima score the share
  of them that hit (explain.evaluation.evidence);
- mIoU: the image map upsampled bilinearly to the image, min-max normalised and
  thresholded at its mean, against the object's mask (background and foreground IoU
  summed over the examples before dividing, as in the segmentation test);
- the answer's log-probability as the floor(p N) most (positive order) or least
  (negative order) relevant of the N patches of the tower's grid are removed, p = 0.1 ...
  0.9: a removed patch is set to black (0 in every channel before the processor's
  normalisation, i.e. -mean / std after it), as the perturbation test removes pixels;
  AUC = 100 x the trapezoid area of the mean log-probability over x = 0 ... 0.9
  (positive: lower is better; negative: higher is better);
- evidence recall of the question's words on the text side: the expected top-k hit
  (k = 1, 2, 5) and the expected rank of the first evidence word's token among the
  prompt's text tokens, the readout position, special tokens and image tokens excluded;
- the region level, on examples whose image comes with regions (the shapes scenes'
  objects) and whose answer's object is one of at least two of them: each region's score
  is the sum of its patches' relevance, each patch weighted by the share of its pixels
  the region holds (explain.cite.regions.patch_shares, as `explain cite --image` scores
  a photo's regions); the region pointing game is the share of examples whose asked
  region scores highest (tied first places shared), and the removal check removes each
  region alone (its pixels set to the image's mean colour, per channel) and asks whether
  removing the top region lowers the answer's log-probability more than removing
  another region drawn uniformly (explain.evaluation.evidence.region_ranks). The same
  for the asked region in place of the top one is the model's number (the summary's
  "asked_region_removal").

Patches of equal relevance go in raster order (a stable sort). Copies that remove the
same patches are scored once, all copies of a chunk in batched forwards.

As in the language-evidence test, the ranking numbers are means over the examples the
model answers right (the wrong ones are in the results JSON under "wrong"). Examples whose
answer is about no object ("no", "nothing": an empty mask) are left out of the pointing
game and the mIoU, examples without text evidence out of the text recall, and examples
without regions, or with one, or about no object, out of the region numbers; the summary
counts them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from explain.cite.regions import patch_shares, region_from
from explain.errors import InputError, OptionError
from explain.evaluation.answers import (
    ANSWER_FIELDS,
    AnswerBatch,
    AnswerProtocol,
    answer_scores,
    log_probability_curve,
    over_answer,
    removal_copies,
    weighted_mean,
    weighted_terms,
)
from explain.evaluation.datasets.base import ImageAnswerExample
from explain.evaluation.evidence import (
    RECALL_K,
    object_patches,
    pointing_hit,
    recall_records,
    region_ranks,
)
from explain.evaluation.perturbation import (
    FRACTIONS,
    perturbation_auc,
    removal_ranks,
    removed_count,
)
from explain.evaluation.protocol import Column, Field, Records, as_terms
from explain.evaluation.segmentation import (
    SEGMENTATION_FIELDS,
    counts_to_records,
    segmentation_counts,
    segmentation_from_sums,
    segmentation_terms,
)
from explain.loading.preprocessing import ImagePreprocessing
from explain.normalize import normalize_per_sample

__all__ = ["DEPTHS", "VisionLanguageEvidenceTest", "patch_pixels"]

DEPTHS: tuple[str, ...] = ("lm", "tower")
"""How far back an answer is explained: the language model's fold, or on through the tower."""


def patch_pixels(patches: Tensor, size: tuple[int, int]) -> Tensor:
    """(M, gh, gw) bool patches -> (M, H, W) bool pixels: each patch's block of the image."""
    rows, columns = patches.shape[-2:]
    height, width = size
    if height % rows or width % columns:
        raise InputError(
            f"a {height} x {width} image does not split into the map's {rows} x {columns} "
            "patch grid; the test removes whole patches of one (3, H, W) image per prompt"
        )
    return patches.repeat_interleave(height // rows, dim=1).repeat_interleave(
        width // columns, dim=2
    )


class VisionLanguageEvidenceTest(AnswerProtocol):
    """The vision-language-evidence test of one vision-language model (module doc).

    Args:
        model, score, forward_batch: see `AnswerProtocol`.
        processor: the model's processor (its tokenizer names the special tokens; its
            image processor's mean and std say what black is after normalisation).
        depth: "lm" or "tower" (see `Explainer.explain` for vision-language models).
        mean, std: the processor's per-channel normalisation, where the processor does
            not say it itself.
        tolerance: the pointing game's tolerance, in patches (stated in the tables).
    """

    name = "vision-language-evidence"

    def __init__(
        self,
        model: nn.Module,
        processor: Any,
        *,
        depth: str = "lm",
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        tolerance: int = 1,
        score: str | None = None,
        forward_batch: int | None = None,
    ) -> None:
        super().__init__(model, processor, score=score, forward_batch=forward_batch)
        if not self.explainer.adapter.reads_images:
            raise OptionError(
                "the vision-language-evidence test is for vision-language models; a language "
                "model takes the language-evidence test"
            )
        if depth not in DEPTHS:
            raise OptionError(f"depth must be one of {', '.join(DEPTHS)}, got {depth!r}")
        images = getattr(processor, "image_processor", None)
        mean = getattr(images, "image_mean", None) if mean is None else mean
        std = getattr(images, "image_std", None) if std is None else std
        if mean is None or std is None:
            raise OptionError(
                "give the image normalisation (mean, std): the processor does not say it"
            )
        if isinstance(tolerance, bool) or not isinstance(tolerance, int) or tolerance < 0:
            raise OptionError(f"tolerance must be a number of patches >= 0, got {tolerance!r}")
        self.depth = depth
        self.black = tuple(-float(m) / float(s) for m, s in zip(mean, std, strict=True))
        self.tolerance = tolerance
        self.image_token_id = int(self.explainer.adapter.image_token_id)  # type: ignore[attr-defined]

    columns: ClassVar[Mapping[str, Column]] = {
        "accuracy": Column("answered right"),
        "pointing": Column("pointing game", "higher"),
        "miou": Column("mIoU", "higher"),
        "region_first": Column("region first", "higher"),
        "region_removal": Column("top region removal", "higher"),
        "positive_auc": Column("positive AUC", "lower"),
        "negative_auc": Column("negative AUC", "higher"),
        **{f"text_hit@{k}": Column(f"text hit@{k}", "higher") for k in RECALL_K},
        "text_rank": Column("text rank", "lower"),
    }

    fields: ClassVar[Mapping[str, Field]] = {
        **ANSWER_FIELDS,
        "object": Field(int, 0, 1),
        "pointing": Field(float, 0.0, 1.0),
        **SEGMENTATION_FIELDS,
        "regions": Field(int, 0, 1),
        "region_first": Field(float, 0.0, 1.0),
        "region_removal": Field(float, 0.0, 1.0),
        "asked_removal": Field(float, 0.0, 1.0),
    }

    def settings(self) -> dict[str, Any]:
        return {
            **super().settings(),
            "depth": self.depth,
            "black": list(self.black),
            "tolerance": self.tolerance,
            "region_fill": "mean",
        }

    def scale(self) -> str:
        return (
            f"Depth {self.depth!r}. Over the examples the model answers right (the others are "
            'in the JSON under "wrong"); pointing game and mIoU over those whose answer is '
            f"about an object. Pointing game: the map's maximum within {self.tolerance} "
            "patch(es) of the object, tied maxima shared. AUC: 100 x the area under the "
            "answer's mean log-probability (nats) as 0 to 90% of the patches are set to black, "
            "most (positive) or least (negative) relevant first. Text hit@k and rank: the "
            "question's evidence words among the prompt's text tokens less the readout "
            "position and special tokens, ties broken at random (expected values). Region "
            "first and top region removal: over the examples whose answer's object is one of "
            "at least two regions (the scene's objects); the asked region scores highest "
            "(tied first places shared), and removing the top region (its pixels set to the "
            "image's mean colour) lowers the answer's log-probability more than removing "
            "another region drawn at random (ties one half)."
        )

    def evaluate(
        self, method: str, examples: Sequence[ImageAnswerExample], *, seed: int = 0
    ) -> Records:
        if not all(isinstance(example, ImageAnswerExample) for example in examples):
            raise InputError("the vision-language-evidence test takes ImageAnswerExample examples")
        types = [e.token_type_ids for e in examples]
        if any(t is None for t in types) and not all(t is None for t in types):
            raise InputError("either every example of a chunk has token types or none has")
        batch = AnswerBatch.of(
            [e.input_ids for e in examples],
            [e.answer for e in examples],
            self.pad_id,
            token_types=None if types[0] is None else types,  # type: ignore[arg-type]
            pixel_values=torch.stack([e.pixel_values for e in examples]),
        )
        explanation = self.explained(method, batch, seed, depth=self.depth)
        image = over_answer(explanation.relevances["image"], batch)
        if image.dim() != 3:
            raise InputError(
                "the test takes one image per prompt; these prompts hold "
                f"{image.shape[1]} images each"
            )
        width = batch.prompt_length
        text = over_answer(explanation.relevances["text"], batch)[:, :width]
        candidates = ~self.special(batch) & (batch.input_ids != self.image_token_id)
        candidates[:, width - 1] = False  # the readout position
        evidence = batch.marks([e.text_evidence for e in examples])
        records = recall_records(text, evidence, candidates)
        records.update(self._object_records(image, examples))
        records.update(self._region_records(batch, image, examples))
        log_probabilities, right = self._removal_scores(batch, image)
        records.update(
            right=right.int().tolist(),
            log_probability=log_probabilities[:, 0].tolist(),
            positive=log_probabilities[:, 1 : 1 + len(FRACTIONS)].tolist(),
            negative=log_probabilities[:, 1 + len(FRACTIONS) :].tolist(),
        )
        return records

    def _object_records(self, maps: Tensor, examples: Sequence[ImageAnswerExample]) -> Records:
        """Whether each answer is about an object, and the pointing game and segmentation
        counts of its (gh, gw) map against that object (against an empty mask where it is
        about none: counted, then left out by the weights)."""
        size = tuple(examples[0].mask.shape)
        upsampled = F.interpolate(maps[:, None], size=size, mode="bilinear", align_corners=False)
        heatmaps = normalize_per_sample(upsampled[:, 0], sample_dims=2)
        objects, pointing, counts = [], [], []
        for patch_map, heatmap, example in zip(maps, heatmaps, examples, strict=True):
            patches = object_patches(example.mask, tuple(patch_map.shape))
            objects.append(int(patches.any()))
            pointing.append(
                pointing_hit(patch_map, patches, self.tolerance) if objects[-1] else 0.0
            )
            counts.append(segmentation_counts(heatmap, example.mask.long().cpu()))
        return {"object": objects, "pointing": pointing, **counts_to_records(counts)}

    def _region_records(
        self, batch: AnswerBatch, maps: Tensor, examples: Sequence[ImageAnswerExample]
    ) -> Records:
        """Whether each example is scored at the region level (its answer's object is one
        of at least two regions) and its `region_ranks` (0.0 where it is not): every
        region of a scored example removed alone, all of them in batched forwards."""
        pixels = batch.extra["pixel_values"]
        scored = [
            (b, example.regions, example.asked_region)
            for b, example in enumerate(examples)
            if example.regions is not None
            and example.asked_region is not None
            and len(example.regions) > 1
        ]
        records: Records = {"regions": [0] * len(examples)}
        for key in ("region_first", "region_removal", "asked_removal"):
            records[key] = [0.0] * len(examples)
        if not scored:
            return records
        rows = torch.cat([torch.full((len(regions),), b) for b, regions, _ in scored])
        copies = [
            # each region alone set to the image's mean colour (normalised, per channel)
            torch.where(regions[:, None], pixels[b].mean(dim=(1, 2), keepdim=True), pixels[b])
            for b, regions, _ in scored
        ]
        ablated, _ = answer_scores(
            self.explainer.adapter,
            batch,
            rows,
            pixel_values=torch.cat(copies),
            forward_batch=self.forward_batch,
        )
        size = tuple(pixels.shape[-2:])
        # the image as the model takes it: the map's patches tile it, nothing is resized
        unchanged = ImagePreprocessing(size=size, mean=(0.0,) * 3, std=(1.0,) * 3)
        for b, regions, asked in scored:
            found = [region_from({"mask": m.cpu().numpy()}, size, r) for r, m in enumerate(regions)]
            shares = patch_shares(found, unchanged, size, tuple(maps.shape[-2:]))
            ranks = region_ranks(shares @ maps[b].flatten(), ablated[rows == b], asked)
            records["regions"][b] = 1
            records["region_first"][b] = ranks.first
            records["region_removal"][b] = ranks.top_removal
            records["asked_removal"][b] = ranks.asked_removal
        return records

    def _removal_scores(self, batch: AnswerBatch, maps: Tensor) -> tuple[Tensor, Tensor]:
        """(B, 1 + 2F) log-probabilities of the answers with patches removed (the image as
        it is, the positive curve, the negative curve) and (B,) whether the model answers
        each right; every distinct copy once, in batched forwards."""
        grid = tuple(maps.shape[-2:])
        patches = maps.flatten(1)
        total = patches.shape[1]
        allowed = torch.ones_like(patches, dtype=torch.bool)
        ranks = torch.stack([removal_ranks(patches, allowed, sign) for sign in (True, False)])
        removed = [removed_count(p, total) for p in FRACTIONS]
        counts = torch.tensor([0, *removed, *removed]).expand(len(batch), -1)
        orders = torch.tensor([0] * (1 + len(FRACTIONS)) + [1] * len(FRACTIONS))
        rows, copy_orders, copy_counts, inverse = removal_copies(
            counts, orders, torch.full((len(batch),), total)
        )
        gone = (ranks[copy_orders, rows] < copy_counts[:, None]).view(-1, *grid)
        pixels = batch.extra["pixel_values"]
        gone = patch_pixels(gone, tuple(pixels.shape[-2:]))[:, None]
        black = torch.tensor(self.black, dtype=pixels.dtype)[None, :, None, None]
        copies = torch.where(gone, black, pixels[rows])
        return self.copy_scores(batch, rows, inverse, pixel_values=copies)

    def weighted(self, records: Records, weight: Tensor) -> dict[str, Tensor]:
        answer = {
            key: as_terms(records[key]) for key in ("log_probability", "positive", "negative")
        }
        pointing = {"pointing": as_terms(records["pointing"]), **segmentation_terms(records)}
        regions = {
            key: as_terms(records[key])
            for key in ("region_first", "region_removal", "asked_removal")
        }
        return {
            **weighted_terms(answer, weight, "counted"),
            **weighted_terms(pointing, weight * as_terms(records["object"]), "on_object"),
            **self.recall_terms(records, weight),
            **weighted_terms(regions, weight * as_terms(records["regions"]), "on_regions"),
        }

    def from_sums(self, sums: Mapping[str, Tensor], count: int) -> dict[str, Tensor]:
        numbers = {
            "pointing": weighted_mean(sums, "pointing", "on_object"),
            # The IoUs are ratios of the (weighted) sums; they do not read the count.
            "miou": segmentation_from_sums(sums, 1)["miou"],
            "region_first": weighted_mean(sums, "region_first", "on_regions"),
            "region_removal": weighted_mean(sums, "region_removal", "on_regions"),
        }
        for order in ("positive", "negative"):
            numbers[f"{order}_auc"] = perturbation_auc(
                log_probability_curve(sums, order, "counted")
            )
        return {**numbers, **self.recall_numbers(sums, prefix="text_")}

    def summarize(self, records: Records) -> dict[str, Any]:
        sums, summary = self.summary(records)
        return {
            **summary,
            "on_object": int(sums["on_object"]),
            "with_text_evidence": int(sums["scored"]),
            "on_regions": int(sums["on_regions"]),
            "asked_region_removal": float(weighted_mean(sums, "asked_removal", "on_regions")),
        }
