"""Results: `Explanation` (relevance maps) and `Trace` (raw per-layer tensors)."""

from __future__ import annotations

import operator
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from explain.detections import Detections
from explain.errors import ExplainError, InputError, OptionError
from explain.export import numpy_array, read_payload, write_payload
from explain.finite import all_finite, check_finite
from explain.normalize import normalize_per_sample
from explain.rules.display import display_values, scale_note
from explain.rules.registry import METHODS

__all__ = ["Explanation", "Trace", "normalize_per_sample"]


def _heatmap_size(size: object) -> tuple[int, int]:
    """A heatmap size as (H, W) of positive ints: one int for a square, or a pair."""
    pair = (size, size) if not isinstance(size, tuple | list) else tuple(size)
    if len(pair) == 2 and not any(isinstance(v, bool) for v in pair):
        try:
            height, width = (operator.index(v) for v in pair)  # type: ignore[arg-type]
        except TypeError:
            pass
        else:
            if height > 0 and width > 0:
                return height, width
    raise OptionError(
        f"heatmap size must be a positive int or a (height, width) pair of positive ints, "
        f"got {size!r}"
    )


@dataclass(frozen=True)
class Explanation:
    """The relevance of each input element for the explained class of each sample.

    Attributes:
        relevance: detached relevance. Images: (B, gh, gw) over the patch grid with prefix
            tokens dropped ("lrp": (B, H, W) pixels); text: (B, T) with pads exactly 0.
            With K targets per input a K axis follows the batch axis.
        logits: (B, C) model output of the explained forward pass.
        target: (B,) or (B, K) explained classes (-1 where a callable chose the score).
        method: name of the method that produced the relevance.
        score: what was differentiated ("logit", "probability", "log_probability").
        input_size: (H, W) of the input images, None for text.
        relevances: every input's relevance by modality; a single-input model has one
            entry, the same tensor as `relevance`.
        tokens: per sample, the token strings, when the Explainer has a tokenizer.
        settings: what else produced the relevance and should travel with it (e.g. the
            model, start_layer, method options); JSON-able values, saved by `save`.
        detections: for a detector (DETR), the detection each column K explains (query,
            label, score, box); None for every other model. Not saved by `save`.
    """

    relevance: Tensor
    logits: Tensor
    target: Tensor
    method: str
    score: str
    input_size: tuple[int, int] | None = None
    relevances: Mapping[str, Tensor] = field(default_factory=dict)
    tokens: list[list[str]] | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    detections: Detections | None = None

    def __post_init__(self) -> None:
        # Refused here, where every runner's result passes, so that no NaN is ever drawn
        # (min-max normalisation would hide it as zeros, a colour scale show it as red).
        # Each tensor once: a single input's relevance is also its one entry of relevances;
        # one wait for the device for all of them, and the message only where one fails.
        unique = {id(r): r for r in (self.relevance, *self.relevances.values())}
        if all_finite(unique.values()):
            return
        for relevance in unique.values():
            check_finite(
                relevance,
                f"the {self.method} relevance",
                "the method's arithmetic overflowed for these inputs; explain them with a "
                "float32 (or float64) model, or with another method",
                error=ExplainError,
            )

    @property
    def class_agnostic(self) -> bool:
        """Whether the method's map does not depend on the explained class (rollout, raw
        attention, random: `Method.class_specific` false), so that every class gets the
        same map: the figures and the viewer mark it (explain.viz.image.method_label)."""
        method = METHODS.get(self.method)
        return method is not None and not method.class_specific

    def heatmap(
        self, size: tuple[int, int] | int | None = None, *, normalize: bool = True
    ) -> Tensor:
        """Relevance upsampled bilinearly to `size` (default: the input size) and min-max
        normalised per map to [0, 1]; shape (B, H, W), or (B, K, H, W).

        `normalize=False` keeps the relevance's own values (and sign): what a figure needs
        to put several maps on one scale (explain.viz.scaling)."""
        if self.input_size is None:
            raise ExplainError("heatmap() is for image explanations; text relevance is per token")
        size = self.input_size if size is None else _heatmap_size(size)
        maps = self.relevance.float() if self.relevance.dtype != torch.float64 else self.relevance
        lead = maps.shape[:-2]
        grid = maps.reshape(-1, 1, *maps.shape[-2:])
        if tuple(grid.shape[-2:]) != tuple(size):
            grid = F.interpolate(grid, size=size, mode="bilinear", align_corners=False)
        grid = grid.reshape(*lead, *size)
        return normalize_per_sample(grid, sample_dims=2) if normalize else grid

    def to_numpy(self) -> np.ndarray:
        """The relevance as a numpy array on the CPU (bfloat16 and float8 widened to
        float32), for your own plots and pipelines; `to_dict()` has everything else."""
        return numpy_array(self.relevance)

    def _header(self) -> dict[str, Any]:
        return {
            "format": "explain.Explanation",
            "version": 1,
            "method": self.method,
            "score": self.score,
            "input_size": list(self.input_size) if self.input_size is not None else None,
            "tokens": self.tokens,
            "relevances": list(self.relevances),
            "saved_as_relevance": self._saved_as_relevance(),
            "settings": dict(self.settings),
        }

    def _saved_as_relevance(self) -> str | None:
        """The modality whose entry is the `relevance` tensor itself (a single-input
        model's one entry, a multimodal model's first set), which `save` writes once, as
        `relevance`; None when no entry is."""
        return next((n for n, t in self.relevances.items() if t is self.relevance), None)

    def _tensors(self) -> dict[str, Tensor]:
        tensors = {"relevance": self.relevance, "logits": self.logits, "target": self.target}
        left_out = self._saved_as_relevance()
        for name, tensor in self.relevances.items():
            if name != left_out:
                tensors[f"relevances.{name}"] = tensor
        return tensors

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain Python (lists, numbers, strings): JSON-serialisable.

        Keys: relevance, logits, target (nested lists), relevances (modality -> nested
        lists), tokens, method, score, input_size, settings.
        """
        header = self._header()
        del header["format"], header["version"], header["saved_as_relevance"]
        header["relevances"] = {
            name: tensor.detach().cpu().double().tolist()
            for name, tensor in self.relevances.items()
        }
        for name in ("relevance", "logits"):
            header[name] = getattr(self, name).detach().cpu().double().tolist()
        header["target"] = self.target.detach().cpu().tolist()
        return header

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the explanation to `path`: `.safetensors`, `.npz` or `.json` (text).

        The file holds the relevance (and every modality's), the logits, the targets, the
        token strings, the method, the score, the input size and `settings`;
        `Explanation.load(path)` reads it back. See explain.export for the layouts.
        """
        write_payload(path, self._tensors(), self._header())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Explanation:
        """Read an explanation written by `save` (or `explain ... --save`); CPU tensors.

        Only the explanation's own tensors are read. A damaged file, or one whose contents
        are not an explanation's (a method that is not a name, targets that do not match
        the batch, a modality whose map is missing, complex or unsigned relevance, ...),
        raises InputError naming what is wrong; nothing in the file is ever executed."""

        def wanted(header: dict[str, Any]) -> list[str]:
            names = [f"relevances.{name}" for name in _checked_header(header, path)["relevances"]]
            return ["relevance", "logits", "target", *names]

        tensors, header = read_payload(path, wanted)
        relevance, logits, target = _checked_tensors(tensors, header, path)
        missing = [name for name in header["relevances"] if f"relevances.{name}" not in tensors]
        # Files written before the header named it left out at most one map, `relevance`'s.
        left_out = header.get("saved_as_relevance", missing[0] if len(missing) == 1 else None)
        for name in missing:
            if name != left_out:
                raise _damaged(path, f"its header names the modality {name!r}, whose map it lacks")
        relevances = {
            name: tensors.get(f"relevances.{name}", relevance) for name in header["relevances"]
        }
        for name, tensor in relevances.items():
            _check_relevance(tensor, f"relevances[{name!r}]", len(logits), path)
        size = header["input_size"]
        return cls(
            relevance=relevance,
            logits=logits,
            target=target.long(),
            method=header["method"],
            score=header["score"],
            input_size=tuple(size) if size is not None else None,
            relevances=relevances,
            tokens=header["tokens"],
            settings=header["settings"],
        )

    def to_html(self, skip: Collection[str] = ()) -> str:
        """A text explanation as an HTML page: every text's tokens highlighted on a
        diverging scale, each token escaped. `skip`: tokens not shown (e.g.
        explain.inputs.skipped_tokens: the tokenizer's special tokens but [UNK]). See
        explain.viz.text. A method whose raw values mislead (full `lrp`) shows them
        normalised per text, with a note saying why."""
        if self.tokens is None or self.relevance.dim() != 2:
            raise ExplainError(
                "to_html() is for text explanations with one map per text: create the "
                "Explainer with a tokenizer, and pick one target per text"
            )
        from explain.viz.text import document_html, to_html

        shown = display_values(self.method, self.relevance.cpu())
        return document_html(
            [
                to_html(tokens, scores, skip=skip, title=f"text {index}: target {int(target)}")
                for index, (tokens, scores, target) in enumerate(
                    zip(self.tokens, shown, self.target.cpu(), strict=True)
                )
            ],
            title=f"explain: {self.method}",
            note=scale_note(self.method),
        )


@dataclass(frozen=True)
class Trace:
    """Every block's attention and hidden states, with their gradients, for one score.

    `attentions[l]` and `attention_grads[l]` are (B, H, N, N) for block l;
    `hidden_states[0]` is the input of block 0 and `hidden_states[l + 1]` the output of
    block l, each (B, N, D), as in Hugging Face's `output_hidden_states`. The gradients
    are of `sum_b score_b` and so, sample by sample, of each sample's own score.
    All tensors are detached.
    """

    attentions: tuple[Tensor, ...]
    attention_grads: tuple[Tensor, ...]
    hidden_states: tuple[Tensor, ...]
    hidden_state_grads: tuple[Tensor, ...]
    logits: Tensor
    target: Tensor
    score: str


def _damaged(path: str | os.PathLike[str], what: str) -> InputError:
    return InputError(
        f"{path} holds no valid explanation: {what}; write one with Explanation.save or --save"
    )


def _checked_header(header: dict[str, Any], path: str | os.PathLike[str]) -> dict[str, Any]:
    """The header of a saved explanation, every field of the type `save` writes."""
    if header.get("format") != "explain.Explanation":
        raise InputError(f"{path} holds no explanation written by Explanation.save")
    if header.get("version") != 1:
        raise _damaged(path, f"format version {header.get('version')!r}; this reads version 1")
    for key in ("method", "score"):
        if not isinstance(header.get(key), str):
            raise _damaged(path, f"{key} is {header.get(key)!r}, not a name")
    size = header.get("input_size")
    sizes = isinstance(size, list) and len(size) == 2
    # `type(v) is int`: a bool is not a size.
    if size is not None and not (sizes and all(type(v) is int and v > 0 for v in size)):
        raise _damaged(path, f"input_size is {size!r}, not a (height, width) pair")
    names = header.get("relevances")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise _damaged(path, "relevances is not a list of modality names")
    left_out = header.get("saved_as_relevance")
    if left_out is not None and left_out not in names:
        raise _damaged(path, f"saved_as_relevance is {left_out!r}, not one of its modalities")
    tokens = header.get("tokens")
    if tokens is not None and not (
        isinstance(tokens, list)
        and all(isinstance(row, list) and all(isinstance(t, str) for t in row) for row in tokens)
    ):
        raise _damaged(path, "tokens is not a list of token strings per sample")
    if not isinstance(header.get("settings"), dict):
        raise _damaged(path, "settings is not a JSON object")
    return header


def _check_relevance(tensor: Tensor, name: str, batch: int, path: str | os.PathLike[str]) -> None:
    if not (tensor.is_floating_point() and not tensor.is_complex()):
        raise _damaged(path, f"{name} is {tensor.dtype}, not real floating point")
    if tensor.dim() < 2 or tensor.shape[0] != batch:
        raise _damaged(
            path, f"{name} has shape {tuple(tensor.shape)}; the logits hold {batch} samples"
        )


def _checked_tensors(
    tensors: Mapping[str, Tensor], header: Mapping[str, Any], path: str | os.PathLike[str]
) -> tuple[Tensor, Tensor, Tensor]:
    """(relevance, logits, target), their types and shapes checked against each other."""
    missing = [name for name in ("relevance", "logits", "target") if name not in tensors]
    if missing:
        raise _damaged(path, f"it has no {' or '.join(missing)}")
    relevance, logits, target = tensors["relevance"], tensors["logits"], tensors["target"]
    if not logits.is_floating_point() or logits.dim() < 2:
        shape = tuple(logits.shape)
        raise _damaged(path, f"logits are {logits.dtype} of shape {shape}, not (B, ..., C) floats")
    batch, classes = logits.shape[0], logits.shape[-1]
    _check_relevance(relevance, "relevance", batch, path)
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise _damaged(path, f"target is {target.dtype}, not integers")
    if target.dim() not in (1, 2) or target.shape[0] != batch:
        raise _damaged(
            path, f"target has shape {tuple(target.shape)}; the logits hold {batch} samples"
        )
    if target.dtype == torch.uint64 or not bool(((target >= -1) & (target < classes)).all()):
        raise _damaged(path, f"target holds classes outside -1..{classes - 1}")
    if target.dim() == 2 and (relevance.dim() < 3 or relevance.shape[1] != target.shape[1]):
        raise _damaged(
            path,
            f"relevance {tuple(relevance.shape)} has no axis for the {target.shape[1]} targets",
        )
    tokens = header["tokens"]
    if tokens is not None and len(tokens) != batch:
        raise _damaged(path, f"tokens hold {len(tokens)} samples; the logits {batch}")
    return relevance, logits, target
