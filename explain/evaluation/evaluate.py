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
from explain.evaluation.language import LanguageEvidenceTest
from explain.evaluation.perturbation import PerturbationTest
from explain.evaluation.protocol import EvaluationProtocol
from explain.evaluation.rationale import RationaleTest
from explain.evaluation.road import ROADTest
from explain.evaluation.runner import run_evaluation
from explain.evaluation.saco import SaCoTest
from explain.evaluation.segmentation import SegmentationTest
from explain.evaluation.vision_language import VisionLanguageEvidenceTest
from explain.rules.registry import METHODS

__all__ = ["evaluate_model", "real_dataset", "replacement_token"]

_MODALITY = {
    "perturbation": "image",
    "segmentation": "image",
    "class-specific": "image",
    "road": "image",
    "saco": "image",
    "rationale": "text",
    "language-evidence": "text",
    "vision-language-evidence": "vision_language",
}

_ANSWERS = ("language-evidence", "vision-language-evidence")
"""The protocols that explain a generative model's answers."""


def real_dataset(
    protocol: str, data: str | os.PathLike[str], image_size: tuple[int, int] | None, split: str
) -> EvaluationDataset:
    """The user's data for `protocol`: an ImageNet validation folder (perturbation, ROAD,
    SaCo), the `gtsegs_ijcv.mat` file (segmentation), an ERASER movies folder (rationale)
    or a JSON lines file of answer examples (language-evidence)."""
    from explain.evaluation import datasets
    from explain.evaluation.datasets.answers import AnswerFile

    if protocol in ("class-specific", "vision-language-evidence"):
        from explain.evaluation.zoo import zoo_evaluations

        scenes = [f"zoo:{name}" for name, model in zoo_evaluations().items() if model.two_objects]
        zoo = " or ".join(scenes) if protocol == "class-specific" else "a known-evidence zoo model"
        raise OptionError(
            f"the {protocol} test runs on a zoo model's held-out set (--model {zoo}, no "
            "--data); there is no real data set for it yet"
        )
    size = image_size or (224, 224)
    if protocol in ("perturbation", "road", "saco"):
        return datasets.ImageNetFolder(data, size=size)
    if protocol == "segmentation":
        return datasets.ImageNetSegmentation(data, size=size)
    if protocol == "language-evidence":
        return AnswerFile(data)
    return datasets.EraserMovies(data, split=split)


def replacement_token(tokenizer: Any, word: str | None, dataset: object) -> int:
    """The token that replaces removed tokens in the language-evidence test: `word` where
    given (a token of the tokenizer's vocabulary), else the data set's own
    (`dataset.replacement`), else the tokenizer's unknown token, else its pad token."""
    if word is not None:
        found = tokenizer.convert_tokens_to_ids(word)
        if found is None or (found == tokenizer.unk_token_id and word != tokenizer.unk_token):
            raise OptionError(f"--replacement {word!r} is not a token of the model's vocabulary")
        return int(found)
    for found in (
        getattr(dataset, "replacement", None),
        tokenizer.unk_token_id,
        tokenizer.pad_token_id,
    ):
        if found is not None:
            return int(found)
    raise OptionError(
        "the tokenizer has no unknown or pad token to replace removed tokens with; name one "
        "with --replacement"
    )


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
    exclude: Sequence[str] = (),
    data: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    batch_size: int = 16,
    forward_batch: int | None = None,
    auc_range: str = "0-90",
    split: str = "test",
    length: int | None = None,
    depth: str = "lm",
    replacement: str | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    offline: bool = False,
    allow_missing_weights: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluate `methods` (default: every one the model supports) of `model` with `protocol`.

    Args:
        protocol: "perturbation", "segmentation", "class-specific", "road", "saco",
            "rationale", "language-evidence" or "vision-language-evidence".
        model: a spec for `explain.loading.load_model`.
        output: the results JSON; the .md table, .png plot and .parts/ work folder go
            next to it.
        exclude: methods left out of `methods` (e.g. the default's costliest ones).
        data: the real data set (see `real_dataset`); None uses a zoo model's held-out set.
        limit: evaluate only the first `limit` examples.
        batch_size: examples explained together, and the unit of resuming.
        forward_batch: most perturbed inputs per forward pass (all but segmentation
            and rationale).
        auc_range: what the AUCs integrate over: "0-90" (from the unperturbed x = 0) or
            "10-90" (perturbation, class-specific, road).
        split: the ERASER split (rationale with `data`).
        length: the prompts' length in tokens, for a zoo language model's held-out
            prompts (language-evidence; None: the data set's default).
        depth: "lm" or "tower" (vision-language-evidence).
        replacement: the token that replaces removed tokens (language-evidence; default:
            the data set's, else the tokenizer's unknown or pad token).
        device: where the model runs; default the (rank's) GPU if there is one.
        dtype, offline, allow_missing_weights: as `load_model` takes them.
    """
    from explain.architectures.registry import adapter_for
    from explain.engine import Request, require_methods, supported_methods
    from explain.evaluation.zoo import answer_dataset, heldout_dataset
    from explain.loading import load_model

    if protocol not in _MODALITY:
        raise OptionError(f"unknown protocol {protocol!r}; choose one of {', '.join(_MODALITY)}")
    unknown = sorted(set(exclude) - set(METHODS))
    if unknown:
        raise OptionError(
            f"cannot exclude unknown methods {unknown}; the methods: {', '.join(METHODS)}"
        )
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
    dataset: EvaluationDataset
    if data is not None:
        dataset = real_dataset(protocol, data, loaded.image_size, split)
    elif protocol in _ANSWERS:
        dataset = answer_dataset(str(model), loaded, length)
    else:
        dataset = heldout_dataset(
            str(model), loaded.image_size, two_objects=protocol == "class-specific"
        )
    module = loaded.model
    bound = _bind(protocol, loaded, dataset, forward_batch, auc_range, depth, replacement)
    # An answer is explained as a generation: the methods a generation takes.
    request = Request(prompt_length=1) if protocol in _ANSWERS else None
    if methods:  # named ones the model cannot take are refused before any work
        require_methods(adapter_for(module), list(methods), str(model), request)
    chosen = list(methods) if methods else supported_methods(adapter_for(module), request)
    return run_evaluation(
        bound,
        dataset,
        [method for method in chosen if method not in exclude],
        Path(output),
        model_name=str(model),
        batch_size=batch_size,
        limit=limit,
        progress=progress,
    )


def _bind(
    protocol: str,
    loaded: Any,
    dataset: EvaluationDataset,
    forward_batch: int | None,
    auc_range: str,
    depth: str,
    replacement: str | None,
) -> EvaluationProtocol:
    """`protocol` bound to the loaded model (and, for the language-evidence test, to the
    data set's replacement token)."""
    module = loaded.model
    if protocol == "rationale":
        return RationaleTest(module, loaded.tokenizer)
    if protocol == "language-evidence":
        token = replacement_token(loaded.tokenizer, replacement, dataset)
        return LanguageEvidenceTest(module, loaded.tokenizer, token, forward_batch=forward_batch)
    if protocol == "vision-language-evidence":
        return VisionLanguageEvidenceTest(
            module, loaded.tokenizer, depth=depth, forward_batch=forward_batch
        )
    if loaded.mean is None or loaded.std is None:
        raise OptionError(f"{loaded.name} does not say how its inputs are normalised (mean, std)")
    mean, std = loaded.mean, loaded.std
    if protocol == "perturbation":
        return PerturbationTest(module, mean, std, forward_batch=forward_batch, auc_range=auc_range)
    if protocol == "road":
        return ROADTest(module, mean, std, forward_batch=forward_batch, auc_range=auc_range)
    labels = {"multi_label": loaded.multi_label, "forward_batch": forward_batch}
    if protocol == "class-specific":
        return ClassSpecificTest(module, mean, std, **labels, auc_range=auc_range)
    if protocol == "saco":
        return SaCoTest(module, mean, std, **labels)
    return SegmentationTest(module, mean, std)
