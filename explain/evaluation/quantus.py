"""explain's methods behind Quantus's `explain_func` convention, so that Quantus's
faithfulness, robustness, localisation, complexity and randomisation metrics score them
(docs/bridges.md).

Quantus calls `explain_func(model=model, inputs=x_batch, targets=y_batch, **kwargs)` with
numpy images (B, C, H, W) and labels (B,), and reads numpy attributions it can broadcast
to the images. The maps here are one value per pixel: (B, 1, H, W), the relevance
upsampled to the input size as `Explanation.heatmap(normalize=False)` gives it (Quantus
normalises itself when a metric asks), so a metric that perturbs a pixel perturbs all its
channels. The protocols of the papers stay in explain.evaluation; this is for people who
evaluate with Quantus.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from explain.api import Explainer
from explain.architectures.base import Detector
from explain.errors import InputError, UnsupportedModelError

__all__ = ["explain_func"]


def explain_func(
    model: nn.Module,
    inputs: np.ndarray,
    targets: np.ndarray | int,
    *,
    method: str | None = None,
    device: str | torch.device | None = None,
    **options: Any,
) -> np.ndarray:
    """(B, 1, H, W) float32 attributions of `inputs` (B, C, H, W) for `targets` (B,) by
    `method` (any image classifier's method, `explain methods`; None: the model kind's
    default, `Explainer.default_method`), Quantus's signature.

    `device` (Quantus passes its own) is where the images go, by default the model's;
    `options` go to `Explainer.explain` (start_layer, score, a method's options). The model
    is left as found, as by every explanation, also when Quantus hands in a copy it has
    randomised (its randomisation metrics)."""
    explainer = Explainer(model)
    adapter = explainer.adapter
    if adapter.reads_text or isinstance(adapter, Detector):
        raise UnsupportedModelError(
            f"{adapter.family}: explain.evaluation.quantus.explain_func is for image "
            "classifiers (Quantus's image metrics)"
        )
    parameter = next(model.parameters())
    images = torch.as_tensor(np.asarray(inputs), dtype=parameter.dtype)
    if images.dim() != 4:
        raise InputError(
            f"Quantus's inputs are images (B, C, H, W); got shape {tuple(images.shape)}"
        )
    images = images.to(device if device is not None else parameter.device)
    target = torch.as_tensor(np.asarray(targets)).long().reshape(-1)
    if target.numel() == 1 and len(images) > 1:
        target = target.expand(len(images))
    result = explainer.explain(images, target=target.to(images.device), method=method, **options)
    maps = result.heatmap(normalize=False)
    return maps[:, None].float().cpu().numpy()
