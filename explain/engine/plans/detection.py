"""The plan of a detector (DETR): one column per detection, each read out at its query.

A detection is a decoder query whose most probable real class (as the model scores it:
softmax with "no object" for DETR, sigmoid for Conditional DETR) is above a threshold,
or a query the caller names (option `queries`).
Column k of an image is its k-th detection by score; its score is the logit of the
detection's class at its query, so all detections of a batch are differentiated in one
batched backward of the recorded forward. Every column is folded with the encoder-decoder
rules of ICCV 2021 (explain.rules.coattention: image tokens in the encoder, queries in
the decoder) and read out at its query: relevances["image"] = R_qi[query] over the
encoder's feature grid, relevances["queries"] = R_qq[query] over the queries. Images with
fewer detections than the batch's most get columns whose label is -1 and relevance 0.
The detections themselves (queries, labels, scores, boxes) are `Explanation.detections`.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch import Tensor

from explain.architectures.base import Detector
from explain.detections import Detections
from explain.engine.passes import AttentionGradientPass, Columns, Relevances
from explain.engine.plans.base import Plan, masked_columns
from explain.engine.targets import Request, select_scores
from explain.errors import OptionError, TargetError
from explain.rules.coattention import TWO_SET_METHODS, BlockRole, TwoSetFold, row_at
from explain.rules.registry import Fold, Method

__all__ = ["DEFAULT_THRESHOLD", "DetectionPlan"]

DEFAULT_THRESHOLD = 0.7
"""The class probability above which a query counts as a detection (the DETR demo's)."""


class DetectionPlan(Plan):
    """Each detection's image and query relevance (module docstring). Options:
    `threshold` (default 0.7) or `queries` (an int, B ints or a (B, K) tensor of query
    indices to explain, whatever their scores). The target is implied: each detection's
    own class."""

    serves = Detector
    passes = frozenset({AttentionGradientPass})
    methods = TWO_SET_METHODS
    refused_because = "detections are explained with the generic rule in its encoder-decoder form"
    adapter: Detector

    def __init__(
        self, adapter: Detector, spec: Method | None, request: Request, tokenizer: Any
    ) -> None:
        if spec is None:
            raise OptionError(
                "trace() follows one score per input; a detector has one per detection: "
                "explain the detections with Explainer.explain"
            )
        super().__init__(adapter, spec, request, tokenizer)
        options = dict(request.options)
        threshold = options.pop("threshold", DEFAULT_THRESHOLD)
        self._queries = options.pop("queries", None)
        if options:
            raise OptionError(
                f"detectors take only the options 'threshold' and 'queries'; got {sorted(options)}"
            )
        # A string or None is not read as a number (the threshold "0.5" was accepted).
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
            raise OptionError(f"threshold must be a number in [0, 1), got {threshold!r}")
        self.threshold = float(threshold)
        if not 0.0 <= self.threshold < 1.0:
            raise OptionError(f"threshold must be in [0, 1), got {self.threshold}")
        if request.start_layer is not None:
            raise OptionError("detection relevance aggregates over every block: no start_layer")
        if self.score != "logit":  # DETR's softmax includes "no object"; Conditional DETR's is none
            raise OptionError(
                f"a detection is explained by its class logit (score='logit'); got {self.score!r}"
            )
        if request.target is not None:
            raise OptionError(
                "a detection is explained for its own class, so it takes no target; choose "
                "detections with threshold= or queries="
            )
        self._boxes: Tensor | None = None
        self.chosen: Tensor
        self.valid: Tensor
        self._scores: Tensor
        self._labels: Tensor

    def forward(self) -> Tensor:
        logits, boxes = self.adapter.detect(self.prepared)
        self._boxes = boxes.detach()
        return logits

    def call_fold(self) -> Fold:
        """The encoder-decoder fold over every block, for every detection."""
        roles = [
            BlockRole(site.layer, "i" if site.stack == "image" else "q", site.kind)
            for site in self.adapter.attention_sites()
        ]
        image, queries = self.sets
        return TwoSetFold(roles, queries.layout.num_tokens, image.layout.num_tokens)

    def columns(self, output: Tensor) -> Columns:
        best, labels = self.adapter.class_probabilities(output.detach()).max(dim=-1)  # (B, Q)
        if self._queries is not None:
            chosen = _query_table(self._queries, *best.shape, best.device)
            valid = torch.ones_like(chosen, dtype=torch.bool)
        else:
            ranked, order = best.sort(dim=1, descending=True)
            kept = ranked > self.threshold
            count = int(kept.sum(dim=1).max())
            if count == 0:
                raise TargetError(
                    f"no detection scores above threshold {self.threshold} (the best scores: "
                    f"{[round(v, 3) for v in best.amax(dim=1).tolist()]}); lower the threshold "
                    "or name the queries to explain (queries=...)"
                )
            chosen, valid = order[:, :count], kept[:, :count]
        rows = torch.arange(output.shape[0], device=output.device)[:, None]
        label = labels.gather(1, chosen)
        picked = output[rows, chosen]  # (B, K, classes + 1)
        scores = select_scores(picked.flatten(0, 1), label.flatten(), self.score)
        # Past an image's last detection there is nothing to explain: no gradient flows.
        scores = scores.reshape(chosen.shape) * valid
        self.chosen, self.valid = chosen, valid
        self._scores = best.gather(1, chosen)
        self._labels = label.masked_fill(~valid, -1)
        return Columns(scores, self._labels, picked.detach())

    def read(self, fold: Fold) -> Relevances:
        """Every detection's rows of R_qi and R_qq at its query, read for all at once."""
        state = fold.result()
        rows = self.chosen.transpose(0, 1)  # (K, B)
        image, queries = row_at(state.qi, rows), row_at(state.qq, rows)
        return {"image": image.transpose(0, 1), "queries": queries.transpose(0, 1)}

    def finish(self, relevances: Relevances, columns: Columns) -> dict[str, Tensor]:
        return masked_columns(relevances, self.valid)

    def detections(self) -> Detections:
        assert self._boxes is not None, "the forward has not run"
        rows = torch.arange(self.chosen.shape[0], device=self.chosen.device)[:, None]
        mask = self.prepared.arguments["pixel_mask"]
        # The image before padding: the processor pads at the bottom and the right.
        sizes = torch.stack((mask.amax(dim=2).sum(dim=1), mask.amax(dim=1).sum(dim=1)), dim=1)
        return Detections(
            queries=self.chosen,
            labels=self._labels,
            scores=self._scores * self.valid,
            boxes=self._boxes[rows, self.chosen],
            valid=self.valid,
            image_sizes=sizes,
        )


def _query_table(queries: Any, batch: int, count: int, device: torch.device) -> Tensor:
    """The `queries` option as a (B, K) long tensor of query indices in [0, count)."""
    if isinstance(queries, bool):
        raise OptionError("queries must be query indices, not a bool")
    try:
        table = torch.as_tensor(queries, device=device)
    except (TypeError, ValueError, RuntimeError):
        table = None
    # Indices only: a float such as 1.5 would be cut to query 1 by .long().
    if (
        table is None
        or table.is_floating_point()
        or table.is_complex()
        or table.dtype == torch.bool
    ):
        raise OptionError(
            f"queries must be an int, B ints or a (B, K) tensor of query indices; got {queries!r}"
        )
    table = table.long()
    if table.dim() == 0:
        table = table.expand(batch, 1)
    elif table.dim() == 1:
        table = table[:, None] if table.shape[0] == batch else None  # type: ignore[assignment]
    if table is None or table.dim() != 2 or table.shape[0] != batch or table.shape[1] == 0:
        raise OptionError(
            f"queries must be an int, {batch} ints (one per image) or a ({batch}, K) tensor"
        )
    if bool(((table < 0) | (table >= count)).any()):
        raise OptionError(f"queries must be in 0..{count - 1} (the model's queries)")
    return table
