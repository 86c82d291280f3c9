"""Which regions of a photo a vision-language model's answer came from: region citations
in one forward and one backward, checked by removing the regions.

The photo and the question go through the model's processor and chat template as one
user message; the answer (given, or generated) is explained token by token over the
image with the engine's generation explanation (explain.generation.explain_generation:
one forward and one batched backward over the answer's tokens). Each answer token's map
lies on the patch grid of the model's input; a region's relevance is the sum of its
patches' relevance, each weighted by the share of it the region covers
(explain.cite.regions.patch_shares: through the processor's resize, crop, padding or
tiles). The check (explain.cite.check.check_scores, as for text spans) removes regions
by filling their pixels with the photo's mean colour and runs the processor and the
model on each such photo: the answer's log-probability without the top-k regions
against k random regions, and the LDS over random halves of the regions.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from explain.api import Explainer
from explain.architectures.hf_vision_language import VisionLanguageModel
from explain.cite.check import BATCH_TOKENS, Check, check_scores, check_seed
from explain.cite.regions import (
    GRID,
    Region,
    fill,
    fill_colour,
    grid_regions,
    patch_shares,
    read_regions,
    region_from,
    slic_count,
    slic_regions,
)
from explain.cite.spans import Span
from explain.cite.statements import UNLOCATED, answer_statements, statement_sums
from explain.engine import Session
from explain.engine.targets import Score
from explain.errors import InputError, OptionError
from explain.export import read_payload, write_payload
from explain.generation import (
    Generation,
    GenerationExplanation,
    explain_generation,
    generate,
    generation_default,
)
from explain.inputs import photos
from explain.loading.preprocessing import photo_preprocessing
from explain.rules import get_method

__all__ = ["RegionCitation", "ablated_photo_targets", "cite_image", "fill_ablation"]

_FORMAT = "explain.RegionCitation"


def fill_ablation(colour: np.ndarray) -> str:
    """The check's statement of how a region is removed."""
    rgb = ", ".join(str(int(c)) for c in colour)
    return (
        f"filled: the removed regions' pixels set to the photo's mean colour ({rgb}) before "
        "the processor, the question and the rest of the photo kept"
    )


@dataclass(frozen=True)
class RegionCitation:
    """Region attribution of one answer about a photo (see `cite_image`).

    Attributes:
        regions: the photo's regions (masks over its pixels).
        photo_size: (H, W) of the photo.
        question, answer: the question and the answer's text; `answer_tokens` its tokens.
        patch_relevance: (G, gh, gw) each answer token's relevance over the patch grid of
            the model's input.
        shares: (R, gh * gw) the share of each patch each region holds.
        region_relevance: (G, R) each answer token's relevance per region.
        scores: (R,) each region's relevance for the whole answer (the sum over G).
        sentences: the answer's N sentences (the context's splitter; offsets into
            `answer`); `token_sentences` (G,) each answer token's sentence.
        statement_relevance: (N, R) each sentence's region scores: the sum of
            `region_relevance` over its tokens (explain.cite.statements).
        method, score: the method, and what it differentiated.
        check: the ablation check, or None when not run.
        settings: what else made the result (depth, fill, the regions' kind), JSON-able.
        answer_ids: (G,) the answer's token ids.
        explanation: the engine's explanation (not saved).
    """

    regions: tuple[Region, ...]
    photo_size: tuple[int, int]
    question: str
    answer: str
    answer_tokens: list[str]
    patch_relevance: Tensor
    shares: Tensor
    region_relevance: Tensor
    scores: Tensor
    method: str
    score: str
    check: Check | None
    answer_ids: Tensor
    sentences: tuple[Span, ...]
    token_sentences: Tensor
    statement_relevance: Tensor
    settings: Mapping[str, Any] = field(default_factory=dict)
    explanation: GenerationExplanation | None = None

    def ranked(self) -> list[int]:
        """The region indices, highest score first."""
        return self.scores.double().argsort(descending=True, stable=True).tolist()

    def _header(self) -> dict[str, Any]:
        scores = self.scores.double().tolist()
        return {
            "format": _FORMAT,
            "version": 2,
            "photo_size": list(self.photo_size),
            "regions": [
                {**region.to_dict(), "score": score}
                for region, score in zip(self.regions, scores, strict=True)
            ],
            "question": self.question,
            "answer": self.answer,
            "answer_tokens": self.answer_tokens,
            "sentences": [{"text": s.text, "start": s.start, "end": s.end} for s in self.sentences],
            "method": self.method,
            "score": self.score,
            "check": None if self.check is None else self.check.to_dict(),
            "settings": dict(self.settings),
        }

    def _tensors(self) -> dict[str, Tensor]:
        return {
            "patch_relevance": self.patch_relevance,
            "shares": self.shares,
            "region_relevance": self.region_relevance,
            "scores": self.scores,
            "statement_relevance": self.statement_relevance,
            "answer_ids": self.answer_ids,
            "token_sentences": self.token_sentences,
            "masks": torch.from_numpy(np.stack([r.mask for r in self.regions])).to(torch.uint8),
        }

    def to_dict(self) -> dict[str, Any]:
        """Everything but the engine's explanation as plain JSON-able values: `regions`
        (name, box, pixels, score each), `sentences` (text, start, end each), `check`,
        the relevances as nested lists (the masks left out: `save` keeps them)."""
        tensors = {name: t for name, t in self._tensors().items() if name != "masks"}
        return {**self._header(), **{k: t.detach().cpu().tolist() for k, t in tensors.items()}}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the citation to `path` (.json, .npz or .safetensors, by its suffix), the
        regions' masks included; `RegionCitation.load` reads it back."""
        write_payload(path, self._tensors(), self._header())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RegionCitation:
        """Read a citation written by `save`; InputError for any other file."""
        names = ["patch_relevance", "shares", "region_relevance", "scores", "answer_ids", "masks"]
        names += ["statement_relevance", "token_sentences"]
        tensors, header = read_payload(path, lambda header: names)
        if (
            header.get("format") != _FORMAT
            or header.get("version") != 2
            or not set(names) <= set(tensors)
        ):
            raise InputError(
                f"{path} is not a region citation written by RegionCitation.save (version 2)"
            )
        masks = tensors["masks"].bool().numpy()
        regions = tuple(
            Region(entry["name"], mask, tuple(entry["box"]))
            for entry, mask in zip(header["regions"], masks, strict=True)
        )
        check = header["check"]
        return cls(
            regions=regions,
            photo_size=tuple(header["photo_size"]),
            question=header["question"],
            answer=header["answer"],
            answer_tokens=header["answer_tokens"],
            patch_relevance=tensors["patch_relevance"],
            shares=tensors["shares"],
            region_relevance=tensors["region_relevance"],
            scores=tensors["scores"],
            method=header["method"],
            score=header["score"],
            check=None if check is None else Check.from_dict(check),
            answer_ids=tensors["answer_ids"].long(),
            sentences=tuple(Span(s["text"], s["start"], s["end"]) for s in header["sentences"]),
            token_sentences=tensors["token_sentences"].long(),
            statement_relevance=tensors["statement_relevance"],
            settings=header["settings"],
        )


def _regions(given: object, pixels: np.ndarray, grid: tuple[int, int]) -> tuple[list[Region], str]:
    """The regions `cite_image` takes and their kind: "grid" (rows x cols cells), "slic:N"
    ("superpixels": about N), a JSON file or a list of Regions and {"box"} / {"mask"}
    entries ("given")."""
    size = (pixels.shape[0], pixels.shape[1])
    if given == "grid":
        return grid_regions(size, *grid), "grid"
    count = slic_count(given) if isinstance(given, str) else None
    if count is not None:
        return slic_regions(pixels, count), "superpixels"
    if isinstance(given, str | Path):
        return read_regions(given, size), "given"
    if isinstance(given, Sequence) and given:
        found = [
            entry if isinstance(entry, Region) else region_from(entry, size, index)
            for index, entry in enumerate(given)
        ]
        for region in found:
            if region.mask.shape != size:
                raise InputError(f"region {region.name!r} is {region.mask.shape}, the photo {size}")
        if len({region.name for region in found}) != len(found):
            raise InputError(f"region names must differ, got {[r.name for r in found]}")
        return found, "given"
    raise OptionError(
        "regions are 'grid', 'slic:N', a JSON file or a list of regions ({'box'} or {'mask'}), "
        f"got {given!r}"
    )


def _with_answer(
    adapter: VisionLanguageModel, encoded: Mapping[str, Any], answer: Tensor
) -> Generation:
    """The processor's output `encoded` (prompts of one length) followed by `answer`."""
    prepared = adapter.prepare(encoded)
    arguments = prepared.arguments
    ids, mask = arguments["input_ids"], arguments["attention_mask"]
    rows = ids.shape[0]
    extra = {
        name: value
        for name, value in arguments.items()
        if name not in ("input_ids", "attention_mask", "position_ids")
    }
    tail = answer.to(ids.device)[None].expand(rows, -1)
    return Generation(
        input_ids=torch.cat([ids, tail], dim=1),
        attention_mask=torch.cat([mask, torch.ones_like(tail)], dim=1),
        prompt_length=ids.shape[1],
        extra=adapter.continued(extra, answer.shape[0]),
    )


def ablated_photo_targets(
    adapter: VisionLanguageModel,
    processor: Any,
    pixels: np.ndarray,
    regions: Sequence[Region],
    colour: np.ndarray,
    question: str,
    answer: Tensor,
    keep: Tensor,
    batch_tokens: int,
) -> Tensor:
    """(M,) log p(answer) for each ablation `keep` (M, R): the photo with the regions not
    kept filled with `colour`, through the processor, in chunks of at most `batch_tokens`
    tokens (rows x sequence length)."""
    found: list[Tensor] = []
    chunk = None
    with Session(adapter, fused=adapter.fused_path()):
        first = 0
        while first < keep.shape[0]:
            rows = keep[first : first + (chunk or 1)]
            edited = [fill(pixels, regions, (~row).tolist(), colour) for row in rows]
            encoded = adapter.encode({"image": edited, "text": [question] * len(edited)}, processor)
            generation = _with_answer(adapter, encoded, answer)
            prepared = adapter.prepare(generation.inputs())
            device = generation.input_ids.device
            at = generation.prompt_length - 1 + torch.arange(answer.shape[0], device=device)
            logits = adapter.logits_at(prepared, at.expand(len(edited), -1)).double()
            chosen = logits.log_softmax(dim=-1).gather(
                -1, answer.to(device).expand(len(edited), -1)[..., None]
            )
            found.append(chosen[..., 0].sum(dim=1).cpu())
            first += len(edited)
            if chunk is None:  # the first row says how long a sequence is
                chunk = max(1, batch_tokens // generation.input_ids.shape[1])
    return torch.cat(found)


def cite_image(
    explainer: Explainer,
    image: Any,
    question: str,
    answer: str | None = None,
    *,
    regions: str | os.PathLike[str] | Sequence[Region | Mapping[str, Any]] = "grid",
    grid: tuple[int, int] = GRID,
    method: str | None = None,
    score: Score | None = None,
    start_layer: int | None = None,
    max_new_tokens: int = 32,
    generate_options: Mapping[str, Any] | None = None,
    check: bool = True,
    lds: int = 0,
    seed: int = 0,
    fill_with: str = "mean",
    batch_tokens: int = BATCH_TOKENS,
    **options: Any,
) -> RegionCitation:
    """Which regions of the photo `image` the answer to `question` came from.

    Args:
        explainer: an Explainer of a vision-language model with its processor as the
            tokenizer (Explainer(model, tokenizer=AutoProcessor.from_pretrained(...))).
        image: the photo: a file path, a PIL image or an (H, W, 3) array.
        question: what is asked about the photo.
        answer: the answer to explain; None generates one (greedy unless
            `generate_options` say otherwise, at most `max_new_tokens` tokens).
        regions: "grid" (default: `grid` = (rows, cols) cells, 3 x 3), "slic:N" (about
            N superpixels, scikit-image's SLIC: the `superpixels` extra), a JSON file of
            regions, or a list of Regions or {"box": [left, top, right, bottom]} /
            {"mask": (H, W)} entries (explain.cite.regions).
        method, score, start_layer, options: as for `Explainer.explain` on the model
            (options such as depth="tower"; method None: the model kind's default,
            `generation_default`); score defaults to each answer token's
            log-probability for the methods that take one.
        check: run the ablation check; `lds` random halves for the LDS (0: none); `seed`
            its random draws; `fill_with` how a removed region is filled ("mean": the
            photo's mean colour); `batch_tokens` the most tokens per check forward.

    Returns:
        a `RegionCitation`: the regions, each answer token's region relevances, each
        region's score for the whole answer, the patch maps, and the check.
    """
    adapter = explainer.adapter
    processor = explainer.tokenizer
    if not isinstance(adapter, VisionLanguageModel) or not hasattr(processor, "image_processor"):
        raise InputError(
            "citing a photo needs a vision-language model with its processor: "
            "Explainer(model, tokenizer=AutoProcessor.from_pretrained(...))"
        )
    if not isinstance(question, str) or not question.strip():
        raise InputError("the question is empty: ask the model something about the photo")
    if answer is not None and not isinstance(answer, str):
        raise OptionError(f"answer must be a str or None, got {answer!r}")
    method = generation_default(explainer).method if method is None else method
    get_method(method)
    check_seed(seed)
    if lds and not check:
        raise OptionError("lds is part of the check: leave check=True to compute it")
    photo = photos({"image": image})[0]
    pixels = np.asarray(photo)
    size = (pixels.shape[0], pixels.shape[1])
    found_regions, kind = _regions(regions, pixels, grid)
    colour = fill_colour(pixels, fill_with)
    prompt = {"image": photo, "text": question}
    if answer is None:
        generation = generate(explainer, prompt, max_new_tokens, **dict(generate_options or {}))
        answer_ids = generation.input_ids[0, generation.prompt_length :][generation.generated[0]]
        answer_ids = answer_ids.cpu()
        answer = processor.tokenizer.decode(answer_ids.tolist(), skip_special_tokens=True)
        if not answer.strip():
            raise InputError(
                "the model's answer has no text: there is nothing to cite; give the answer "
                "to explain (answer=, --answer)"
            )
    else:
        if generate_options:
            raise OptionError("generate_options are for a generated answer: leave answer unset")
        ids = processor.tokenizer(answer, add_special_tokens=False)["input_ids"]
        if not answer.strip() or not ids:
            raise InputError(f"the answer {answer!r} has no token: give its text")
        answer_ids = torch.tensor(ids, dtype=torch.long)
        generation = _with_answer(adapter, adapter.encode(prompt, processor), answer_ids)
    if score is None and get_method(method).takes_score:
        score = "log_probability"
    found = explain_generation(
        explainer, generation, method=method, score=score, start_layer=start_layer, **options
    )
    maps = found.explanation.relevances["image"][0, : answer_ids.shape[0]]
    if maps.dim() != 3:
        raise InputError("citing a photo takes one photo: the prompt holds several images")
    maps = maps.detach().double().cpu()
    shares = patch_shares(found_regions, photo_preprocessing(processor), size, maps.shape[-2:])
    region_relevance = maps.flatten(1) @ shares.T
    scores = region_relevance.sum(dim=0)
    statements = answer_statements(processor.tokenizer, answer, answer_ids)
    result_check = None
    if check:

        def targets(keep: Tensor) -> Tensor:
            return ablated_photo_targets(
                adapter,
                processor,
                pixels,
                found_regions,
                colour,
                question,
                answer_ids,
                keep,
                batch_tokens,
            )

        result_check = check_scores(
            scores, targets, lds=lds, seed=seed, ablation=fill_ablation(colour)
        )
    return RegionCitation(
        regions=tuple(found_regions),
        photo_size=size,
        question=question,
        answer=answer,
        answer_tokens=processor.tokenizer.convert_ids_to_tokens(answer_ids.tolist()),
        patch_relevance=maps,
        shares=shares,
        region_relevance=region_relevance,
        scores=scores,
        method=method,
        score=found.explanation.score,
        check=result_check,
        answer_ids=answer_ids,
        sentences=statements.sentences,
        token_sentences=statements.token_sentences,
        statement_relevance=statement_sums(
            region_relevance, statements.token_sentences, len(statements.sentences)
        ),
        settings={
            **found.explanation.settings,
            "regions": kind,
            **({"grid": list(grid)} if kind == "grid" else {}),
            "fill": fill_with,
            **({} if statements.located else {"sentences": UNLOCATED}),
        },
        explanation=found,
    )
