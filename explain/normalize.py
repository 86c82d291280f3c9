"""Min-max normalisation of relevance maps, shared by `Explanation.heatmap` and the
overlay on a user's photo (explain.loading.preprocessing)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["normalize_per_sample"]


def normalize_per_sample(maps: Tensor, sample_dims: int) -> Tensor:
    """Min-max normalise each map over its last `sample_dims` axes to [0, 1].

    A constant map becomes all zeros instead of dividing by zero.
    """
    flat = maps.flatten(start_dim=maps.dim() - sample_dims)
    low = flat.amin(dim=-1, keepdim=True)
    span = flat.amax(dim=-1, keepdim=True) - low
    scaled = torch.where(span > 0, (flat - low) / span.clamp(min=torch.finfo(flat.dtype).tiny), 0.0)
    return scaled.reshape(maps.shape)
