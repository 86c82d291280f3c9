"""ROAD, RemOve And Debias (Rong, Leemann, Nguyen, Fiedler, Rizk, Kasneci; ICML 2022).

The perturbation test zeroes the pixels it removes, and a black region has the shape of
the map that chose it: a model can read the removal itself ("class leakage"). ROAD fills
the removed pixels instead by noisy linear imputation from their neighbours, which keeps
little of that shape. Each removed pixel takes the weighted mean of its eight neighbours
(weight 1/6 for the four that share an edge, 1/12 for the four diagonal ones; neighbours
outside the image are left out and the weights of the others renormalised), where removed
neighbours are themselves unknowns: one sparse linear system per image, shared by its
channels, solved directly in float64 (scipy's SuperLU, as the reference code does), plus
Gaussian noise of standard deviation 0.01 on each imputed value in the model's
normalised input (the reference code's default; it imputes the normalised image), i.e.
0.01 x std per channel on the [0, 1] pixels. The imputation is linear, so imputing the
[0, 1] pixels and normalising after gives the reference's values.

For each fraction p in 0.1 .. 0.9 the floor(p * H * W) pixels of the predicted class's
map ranked most relevant (MoRF) or least relevant (LeRF) are imputed, ties in raster
order as in the perturbation test, and top-1 accuracy against the label is measured; the
AUCs are those of the perturbation test (`perturbation_auc`). MoRF: lower is better;
LeRF: higher is better. The noise is drawn from the chunk's seed, the same for every
method, so methods are compared on the same noise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from explain.errors import InputError
from explain.evaluation.datasets.base import ImageExample
from explain.evaluation.perturbation import (
    AUC_RANGES,
    FRACTIONS,
    accuracy_curve,
    checked_auc_range,
    curve_hits,
    hit_terms,
    perturbation_auc,
    removed_masks,
)
from explain.evaluation.protocol import Column, Field, ImageProtocol, Records, method_options

__all__ = ["NOISE", "ROADTest", "linear_imputation"]

NOISE = 0.01
"""The noise's standard deviation in the model's normalised input (the reference's)."""

_NEIGHBOURS = (
    (-1, -1, 1 / 12),
    (-1, 0, 1 / 6),
    (-1, 1, 1 / 12),
    (0, -1, 1 / 6),
    (0, 1, 1 / 6),
    (1, -1, 1 / 12),
    (1, 0, 1 / 6),
    (1, 1, 1 / 12),
)
"""(row offset, column offset, weight) of a pixel's eight neighbours."""


def _imputed(values: np.ndarray, removed: np.ndarray) -> np.ndarray:
    """(C, H, W) float64 values with the (H, W) bool `removed` pixels solved for: one
    sparse system shared by the channels, solved directly (SuperLU, as the reference)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.linalg import spsolve

    channels, height, width = values.shape
    flat = removed.reshape(-1)
    unknown = np.flatnonzero(flat)
    count = len(unknown)
    pixels = values.reshape(channels, -1)
    if count == 0:
        return values
    if count == flat.size:
        raise InputError("linear imputation needs at least one pixel that is not removed")
    variable = np.full(flat.size, -1)
    variable[unknown] = np.arange(count)
    rows, columns = unknown // width, unknown % width
    diagonal = np.zeros(count)
    right = np.zeros((count, channels))
    equations, variables, weights = [np.arange(count)], [np.arange(count)], [diagonal]
    for row_offset, column_offset, weight in _NEIGHBOURS:
        row, column = rows + row_offset, columns + column_offset
        inside = (row >= 0) & (row < height) & (column >= 0) & (column < width)
        equation = np.flatnonzero(inside)
        neighbour = row[inside] * width + column[inside]
        diagonal[equation] += weight  # the weights of the neighbours inside the image
        missing = flat[neighbour]
        equations.append(equation[missing])
        variables.append(variable[neighbour[missing]])
        weights.append(np.full(int(missing.sum()), -weight))
        right[equation[~missing]] += weight * pixels[:, neighbour[~missing]].T
    matrix = coo_matrix(
        (np.concatenate(weights), (np.concatenate(equations), np.concatenate(variables))),
        shape=(count, count),
    ).tocsc()
    solution = np.asarray(spsolve(matrix, right)).reshape(count, channels)
    filled = pixels.copy()
    filled[:, unknown] = solution.T
    return filled.reshape(channels, height, width)


def linear_imputation(pixels: Tensor, removed: Tensor) -> Tensor:
    """(N, C, H, W) images with the (N, H, W) bool `removed` pixels of each replaced by
    the solution of x_i = sum_j w_ij x_j / sum_j w_ij over each removed pixel i's
    neighbours j inside the image, removed ones included (ROAD's linear imputation,
    without its noise); float64. Each image keeps at least one pixel."""
    values = pixels.detach().double().cpu().numpy()
    masks = removed.bool().cpu().numpy()
    filled = [_imputed(image, mask) for image, mask in zip(values, masks, strict=True)]
    return torch.from_numpy(np.stack(filled)).to(pixels.device)


class ROADTest(ImageProtocol):
    """ROAD (module doc) for one image model.

    Args:
        model, mean, std, forward_batch: see `ImageProtocol`.
        noise: the imputation noise's standard deviation in the normalised input.
        auc_range: "0-90" or "10-90", as in `PerturbationTest` (summary only).

    Records per image: the unperturbed prediction and, per order, whether the image is
    still classified correctly at each fraction.
    """

    name = "road"

    def __init__(
        self,
        model: nn.Module,
        mean: Sequence[float],
        std: Sequence[float],
        forward_batch: int | None = None,
        noise: float = NOISE,
        auc_range: str = "0-90",
    ) -> None:
        super().__init__(model, mean, std, forward_batch=forward_batch)
        self.noise = float(noise)
        self.auc_range = checked_auc_range(auc_range)

    columns: ClassVar[Mapping[str, Column]] = {
        "accuracy": Column("accuracy"),
        "morf_auc": Column("MoRF AUC", "lower"),
        "lerf_auc": Column("LeRF AUC", "higher"),
    }

    fields: ClassVar[Mapping[str, Field]] = {
        "label": Field(int, low=0),
        "predicted": Field(int, low=0),
        "correct": Field(int, 0, 1),
        "morf": Field(int, 0, 1, width=len(FRACTIONS)),
        "lerf": Field(int, 0, 1, width=len(FRACTIONS)),
    }

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "noise": self.noise}

    def scale(self) -> str:
        return (
            "Removed pixels of the predicted class's map are filled by noisy linear "
            f"imputation from their neighbours (noise {self.noise} in the normalised input). "
            f"AUC of top-1 accuracy: {AUC_RANGES[self.auc_range]} (auc_range {self.auc_range})."
        )

    def imputed(self, seed: int) -> Callable[[Tensor, Tensor, Sequence[float]], Tensor]:
        """How `curve_hits` removes pixels here: (pixels, order, fractions) -> (F, B, 3, H, W)
        copies of the [0, 1] images with the first floor(p * H * W) pixels of `order`
        imputed, noise included (drawn from `seed` and the order's first pixels)."""

        def remove(pixels: Tensor, order: Tensor, fractions: Sequence[float]) -> Tensor:
            batch, _, height, width = pixels.shape
            removed = removed_masks(order, fractions).view(-1, height, width)
            copies = pixels[None].expand(len(fractions), -1, -1, -1, -1).flatten(0, 1)
            filled = linear_imputation(copies, removed)
            generator = torch.Generator().manual_seed(seed)
            noise = torch.randn(filled.shape, generator=generator, dtype=torch.float64)
            scale = self.noise * torch.tensor(self.std, dtype=torch.float64)[None, :, None, None]
            filled = filled + removed[:, None] * noise * scale
            return filled.to(pixels.dtype).view(len(fractions), batch, *pixels.shape[1:])

        return remove

    def evaluate(self, method: str, examples: Sequence[ImageExample], *, seed: int = 0) -> Records:
        pixels, labels = self.stack(examples)
        explanation = self.explainer.explain(
            self.normalize(pixels), target=None, method=method, **method_options(method, seed)
        )
        heatmaps = explanation.heatmap(tuple(pixels.shape[-2:])).cpu()
        predicted = explanation.logits.argmax(dim=-1).cpu()
        records: Records = {
            "label": labels.tolist(),
            "predicted": predicted.tolist(),
            "correct": (predicted == labels).int().tolist(),
        }
        for key, positive in (("morf", True), ("lerf", False)):
            remove = self.imputed(seed * 2 + int(positive))
            hits = curve_hits(self.classify, pixels, labels, heatmaps, positive, remove=remove)
            records[key] = hits.int().tolist()
        return records

    def terms(self, records: Records) -> dict[str, Tensor]:
        return hit_terms(records, ("morf", "lerf"))

    def from_sums(self, sums: Mapping[str, Tensor], count: int) -> dict[str, Tensor]:
        return {
            f"{key}_auc": perturbation_auc(
                accuracy_curve(sums, key, count), auc_range=self.auc_range
            )
            for key in ("morf", "lerf")
        }

    def summarize(self, records: Records) -> dict[str, Any]:
        sums, count = self.summed(records)
        curves: dict[str, list[float]] = {"fractions": [0.0, *FRACTIONS]}
        for key in ("morf", "lerf"):
            curves[key] = [float(value) for value in accuracy_curve(sums, key, count)]
        return {"accuracy": curves["morf"][0], **self.totals(sums, count), "curves": curves}
