"""One call from a model spec to a results file: what `explain evaluate` and
scripts/results.py share.

It loads the model (`zoo:NAME`, a timm name or a path, via `explain.loading`), picks the
data (the zoo model's held-out set, or a real data set at `data`), binds the protocol to
the model and runs it with `run_evaluation`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from explain.errors import OptionError
from explain.evaluation.class_specific import ClassSpecificTest
from explain.evaluation.datasets.base import EvaluationDataset
from explain.evaluation.perturbation import PerturbationTest
from explain.evaluation.protocol import EvaluationProtocol
from explain.evaluation.rationale import RationaleTest
from explain.evaluation.runner import run_evaluation
from explain.evaluation.segmentation import SegmentationTest

__all__ = ["evaluate_model", "real_dataset"]

_MODALITY = {
    "perturbation": "image",
    "segmentation": "image",
    "class-specific": "image",
    "rationale": "text",
}


def real_dataset(
    protocol: str, data: str | os.PathLike[str], image_size: tuple[int, int] | None, split: str
) -> EvaluationDataset:
    """The user's data for `protocol`: an ImageNet validation folder (perturbation), the
    `gtsegs_ijcv.mat` file (segmentation) or an ERASER movies folder (rationale)."""
    from explain.evaluation import datasets

    if protocol == "class-specific":
        raise OptionError(
            "the class-specific test runs on a zoo model's two-object scenes "
            "(--model zoo:shapes-vit, no --data); there is no real data set for it yet"
        )
    size = image_size or (224, 224)
    if protocol == "perturbation":
        return datasets.ImageNetFolder(data, size=size)
    if protocol == "segmentation":
        return datasets.ImageNetSegmentation(data, size=size)
    return datasets.EraserMovies(data, split=split)


def _device(device: str | torch.device | None) -> torch.device:
    """The device to evaluate on, checked before the model is loaded (explain.loading's
    rule); by default the rank's GPU if there is one (under torchrun each process takes
    its own)."""
    from explain.loading.specs import resolve_device

    if device is None and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return resolve_device("cpu" if device is None else device)


def evaluate_model(
    protocol: str,
    model: str,
    output: str | os.PathLike[str],
    *,
    methods: Sequence[str] | None = None,
    data: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    batch_size: int = 16,
    forward_batch: int | None = None,
    auc_range: str = "0-90",
    split: str = "test",
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    offline: bool = False,
    allow_missing_weights: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluate `methods` (default: every one the model supports) of `model` with `protocol`.

    Args:
        protocol: "perturbation", "segmentation", "class-specific" or "rationale".
        model: a spec for `explain.loading.load_model`.
        output: the results JSON; the .md table, .png plot and .parts/ work folder go
            next to it.
        data: the real data set (see `real_dataset`); None uses a zoo model's held-out set.
        limit: evaluate only the first `limit` examples.
        batch_size: examples explained together, and the unit of resuming.
        forward_batch: most perturbed images per forward pass (perturbation,
            class-specific).
        auc_range: what the AUCs integrate over: "0-90" (from the unperturbed x = 0) or
            "10-90" (perturbation, class-specific).
        split: the ERASER split (rationale with `data`).
        device: where the model runs; default the (rank's) GPU if there is one.
        dtype, offline, allow_missing_weights: as `load_model` takes them.
    """
    from explain.architectures.registry import adapter_for
    from explain.engine import supported_methods
    from explain.evaluation.datasets.zoo import heldout_dataset
    from explain.loading.specs import load_model

    if protocol not in _MODALITY:
        raise OptionError(f"unknown protocol {protocol!r}; choose one of {', '.join(_MODALITY)}")
    loaded = load_model(
        model,
        device=_device(device),
        dtype=dtype,
        offline=offline,
        allow_missing_weights=allow_missing_weights,
    )
    if loaded.modality != _MODALITY[protocol]:
        raise OptionError(
            f"the {protocol} test is for {_MODALITY[protocol]} models; {model} is a "
            f"{loaded.modality} model"
        )
    module = loaded.model
    bound: EvaluationProtocol
    if protocol == "rationale":
        bound = RationaleTest(module, loaded.tokenizer)
    else:
        if loaded.mean is None or loaded.std is None:
            raise OptionError(f"{model} does not say how its inputs are normalised (mean, std)")
        if protocol == "perturbation":
            bound = PerturbationTest(
                module, loaded.mean, loaded.std, forward_batch=forward_batch, auc_range=auc_range
            )
        elif protocol == "class-specific":
            bound = ClassSpecificTest(
                module,
                loaded.mean,
                loaded.std,
                multi_label=loaded.multi_label,
                forward_batch=forward_batch,
                auc_range=auc_range,
            )
        else:
            bound = SegmentationTest(module, loaded.mean, loaded.std)
    if data is None:
        dataset = heldout_dataset(
            str(model), loaded.image_size, two_objects=protocol == "class-specific"
        )
    else:
        dataset = real_dataset(protocol, data, loaded.image_size, split)
    return run_evaluation(
        bound,
        dataset,
        list(methods) if methods else supported_methods(adapter_for(module)),
        Path(output),
        model_name=str(model),
        batch_size=batch_size,
        limit=limit,
        progress=progress,
    )
