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

A text context given beside the photo (`context=`) goes into the user message after the
photo as `cite` writes a language model's prompt; its spans are sources beside the
regions, scored from the same backward (a span: the sum of the relevance on its tokens),
and the check then also cuts the removed spans' tokens out of the prompt.
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
from explain.cite.check import BATCH_TOKENS, Check, check_scores, check_seed, kept_tokens
from explain.cite.prompt import (
    TEMPLATE,
    Context,
    fill_template,
    read_context,
    span_sums,
    tokenize_prompt,
)
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
from explain.inputs import image_prompt_texts, photos
from explain.loading.preprocessing import photo_preprocessing
from explain.rules import get_method

__all__ = [
    "ContextSpans",
    "RegionCitation",
    "ablated_photo_targets",
    "cite_image",
    "fill_ablation",
]

_FORMAT = "explain.RegionCitation"
_VERSION = 3
"""3: a text context beside the photo (`context`); 2, read too, has none."""
_CONTEXT = ("token_spans", "span_relevance", "scores", "statement_relevance")
"""The context's tensors, saved as context_NAME."""


def _context_header(context: ContextSpans) -> dict[str, Any]:
    scores = context.scores.double().tolist()
    return {
        "text": context.text,
        "kind": context.kind,
        "spans": [
            {"text": s.text, "start": s.start, "end": s.end, "score": score}
            for s, score in zip(context.spans, scores, strict=True)
        ],
    }


def fill_ablation(colour: np.ndarray, context: bool = False) -> str:
    """The check's statement of how a region (and, with a `context`, a span) is removed."""
    rgb = ", ".join(str(int(c)) for c in colour)
    filled = (
        f"filled: the removed regions' pixels set to the photo's mean colour ({rgb}) before "
        "the processor"
    )
    if not context:
        return f"{filled}, the question and the rest of the photo kept"
    return (
        f"{filled}; the removed spans' tokens cut out of the prompt (nothing re-tokenized); "
        "the question, the rest of the photo and of the context kept"
    )


@dataclass(frozen=True)
class ContextSpans:
    """The text context given beside the photo, as sources (see `cite_image`).

    Attributes:
        text, kind, spans: the context's text, how it was split, its spans.
        token_spans: (P,) each prompt token's span index (-1: none; the image's tokens,
            the chat template's and the question's).
        span_relevance: (G, S) each answer token's relevance per span: the sum of the
            text relevance over the span's tokens, from the backward that scores the
            regions.
        scores: (S,) each span's score for the whole answer (the sum over G).
        statement_relevance: (N, S) each answer sentence's span scores.
    """

    text: str
    kind: str
    spans: tuple[Span, ...]
    token_spans: Tensor
    span_relevance: Tensor
    scores: Tensor
    statement_relevance: Tensor


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
        check: the ablation check, or None when not run (with a context, over the
            regions and the spans together).
        settings: what else made the result (depth, fill, the regions' kind), JSON-able.
        context: the text context's spans and their scores (`ContextSpans`), or None.
            Span and region scores are shares of the one relevance of the answer (the
            text's tokens and the photo's patches of one backward), so they share one
            scale: `source_scores` and `ranked_sources` rank the two together.
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
    context: ContextSpans | None = None

    def ranked(self) -> list[int]:
        """The region indices, highest score first."""
        return self.scores.double().argsort(descending=True, stable=True).tolist()

    @property
    def source_scores(self) -> Tensor:
        """(R + S,) the regions' scores, then the context's spans' (none without one)."""
        if self.context is None:
            return self.scores
        return torch.cat([self.scores, self.context.scores.to(self.scores.dtype)])

    @property
    def statement_sources(self) -> Tensor:
        """(N, R + S) each answer sentence's region scores, then its span scores."""
        if self.context is None:
            return self.statement_relevance
        spans = self.context.statement_relevance.to(self.statement_relevance.dtype)
        return torch.cat([self.statement_relevance, spans], dim=1)

    def ranked_sources(self) -> list[tuple[str, int]]:
        """Every source, highest score first: ("region", r) or ("span", s)."""
        count = len(self.regions)
        order = self.source_scores.double().argsort(descending=True, stable=True).tolist()
        return [("region", i) if i < count else ("span", i - count) for i in order]

    def _header(self) -> dict[str, Any]:
        scores = self.scores.double().tolist()
        return {
            "format": _FORMAT,
            "version": _VERSION,
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
            "context": None if self.context is None else _context_header(self.context),
        }

    def _tensors(self) -> dict[str, Tensor]:
        context = {}
        if self.context is not None:
            context = {f"context_{name}": getattr(self.context, name) for name in _CONTEXT}
        return {
            **context,
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
        """Read a citation written by `save` (version 3, or 2: no context); InputError
        for any other file, or a context whose spans or tensors disagree."""
        names = ["patch_relevance", "shares", "region_relevance", "scores", "answer_ids", "masks"]
        names += ["statement_relevance", "token_sentences"]

        def expected(header: Mapping[str, Any]) -> list[str]:
            given = isinstance(header, Mapping) and header.get("context") is not None
            return names + ([f"context_{name}" for name in _CONTEXT] if given else [])

        tensors, header = read_payload(path, expected)
        if (
            header.get("format") != _FORMAT
            or header.get("version") not in (2, _VERSION)
            or not set(expected(header)) <= set(tensors)
        ):
            raise InputError(
                f"{path} is not a region citation written by RegionCitation.save "
                f"(version 2 or {_VERSION})"
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
            context=_read_context(header.get("context"), tensors, path),
        )


def _read_context(
    header: Any, tensors: Mapping[str, Tensor], path: str | os.PathLike[str]
) -> ContextSpans | None:
    """The saved context (None when there is none); InputError where its spans do not
    tile its text or its tensors do not have one column (or index) per span."""
    if header is None:
        return None
    try:
        text, kind = header["text"], header["kind"]
        spans = tuple(Span(s["text"], s["start"], s["end"]) for s in header["spans"])
    except (KeyError, TypeError) as error:
        raise InputError(f"{path}: the context has no {error}") from None
    ends = [0] + [span.end for span in spans]
    tiles = all(
        span.start == end and text[span.start : span.end] == span.text
        for span, end in zip(spans, ends, strict=False)
    )
    if not isinstance(text, str) or not spans or not tiles or ends[-1] != len(text):
        raise InputError(f"{path}: the context's spans do not tile its text")
    found = {name: tensors[f"context_{name}"] for name in _CONTEXT}
    count = len(spans)
    token_spans = found["token_spans"].long()
    if (
        found["scores"].shape != (count,)
        or found["span_relevance"].shape[-1:] != (count,)
        or found["statement_relevance"].shape[-1:] != (count,)
        or token_spans.dim() != 1
        or bool((token_spans >= count).any() or (token_spans < -1).any())
    ):
        raise InputError(f"{path}: the context's tensors do not have one entry per span")
    return ContextSpans(
        text=text,
        kind=kind,
        spans=spans,
        token_spans=token_spans,
        span_relevance=found["span_relevance"],
        scores=found["scores"],
        statement_relevance=found["statement_relevance"],
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
    adapter: VisionLanguageModel,
    encoded: Mapping[str, Any],
    answer: Tensor,
    kept: Tensor | None = None,
) -> Generation:
    """The processor's output `encoded` (prompts of one length) followed by `answer`;
    `kept` (rows, P): only each row's kept prompt tokens, packed to the right (left
    padding), their token types with them."""
    prepared = adapter.prepare(encoded)
    arguments = dict(prepared.arguments)
    if kept is not None:
        kept = kept.to(arguments["input_ids"].device) & arguments["attention_mask"].bool()
        width = int(kept.sum(dim=1).max())
        order = kept.long().argsort(dim=1, stable=True)[:, -width:]  # the cut ones first
        arguments["attention_mask"] = kept.long().gather(1, order)
        for name in ("input_ids", "token_type_ids"):
            if name in arguments:
                arguments[name] = arguments[name].gather(1, order)
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
    token_spans: Tensor | None = None,
) -> Tensor:
    """(M,) log p(answer) for each ablation `keep` (M, R + S): the photo with the regions
    not kept filled with `colour`, through the processor, and the prompt's tokens of the
    spans not kept cut out (`token_spans` (P,): each token's span, -1 none; None: no
    context, S = 0), in chunks of at most `batch_tokens` tokens (rows x sequence length)."""
    found: list[Tensor] = []
    chunk = None
    count = len(regions)
    with Session(adapter, fused=adapter.fused_path()):
        first = 0
        while first < keep.shape[0]:
            rows = keep[first : first + (chunk or 1)]
            edited = [fill(pixels, regions, (~row[:count]).tolist(), colour) for row in rows]
            encoded = adapter.encode({"image": edited, "text": [question] * len(edited)}, processor)
            cut = None if token_spans is None else kept_tokens(token_spans, rows[:, count:])
            generation = _with_answer(adapter, encoded, answer, cut)
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
    context: str | Sequence[str] | None = None,
    spans: str = "sentences",
    template: str = TEMPLATE,
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
        context: a text (or a list of documents) given beside the photo: its `spans`
            (as for `cite`: "sentences", "paragraphs", "lines", "documents") are sources
            beside the regions. `template` (with "{context}" before "{question}") is the
            user message's text after the photo, as `cite` writes a language model's
            prompt. A span's score is the sum of the relevance on its tokens, from the
            backward that scores the regions: one scale for both (`ranked_sources`).
        method, score, start_layer, options: as for `Explainer.explain` on the model
            (options such as depth="tower"; method None: the model kind's default,
            `generation_default`); score defaults to each answer token's
            log-probability for the methods that take one.
        check: run the ablation check; `lds` random halves for the LDS (0: none); `seed`
            its random draws; `fill_with` how a removed region is filled ("mean": the
            photo's mean colour); `batch_tokens` the most tokens per check forward. With
            a context the check ranks the regions and the spans together: an ablation
            fills its regions and cuts its spans' tokens in the same forward.

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
    parsed = None
    text = question
    if context is not None:
        if not isinstance(spans, str) or not isinstance(template, str):
            raise OptionError(f"spans and template are texts, got {spans!r} and {template!r}")
        if not isinstance(context, str) and any(isinstance(m, Mapping) for m in context):
            raise OptionError(
                "the context beside a photo is a text or a list of documents, not a chat: "
                "the photo and the text are one user message"
            )
        parsed = read_context(context, spans)
        text, offset = fill_template(template, parsed.text, question)
    prompt = {"image": photo, "text": text}
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
    found_context = None
    if parsed is not None:
        prompt_ids = generation.input_ids[0, : generation.prompt_length].cpu()
        token_spans = _prompt_spans(adapter, processor, prompt, parsed, offset, prompt_ids)
        rows = found.explanation.relevances["text"][0, : answer_ids.shape[0]]
        span_relevance = span_sums(
            rows[:, : prompt_ids.shape[0]].detach().double().cpu(), token_spans, len(parsed.spans)
        )
        found_context = ContextSpans(
            text=parsed.text,
            kind=parsed.kind,
            spans=parsed.spans,
            token_spans=token_spans,
            span_relevance=span_relevance,
            scores=span_relevance.sum(dim=0),
            statement_relevance=statement_sums(
                span_relevance, statements.token_sentences, len(statements.sentences)
            ),
        )
    result_check = None
    if check:

        def targets(keep: Tensor) -> Tensor:
            return ablated_photo_targets(
                adapter,
                processor,
                pixels,
                found_regions,
                colour,
                text,
                answer_ids,
                keep,
                batch_tokens,
                None if found_context is None else found_context.token_spans,
            )

        sources = scores if found_context is None else torch.cat([scores, found_context.scores])
        result_check = check_scores(
            sources, targets, lds=lds, seed=seed, ablation=fill_ablation(colour, parsed is not None)
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
            **({} if parsed is None else {"template": template, "spans": parsed.kind}),
            **({} if statements.located else {"sentences": UNLOCATED}),
        },
        explanation=found,
        context=found_context,
    )


def _prompt_spans(
    adapter: VisionLanguageModel,
    processor: Any,
    prompt: Mapping[str, Any],
    context: Context,
    offset: int,
    prompt_ids: Tensor,
) -> Tensor:
    """(P,) each token of the processor's prompt `prompt_ids` (of the image prompt
    `prompt`) its span of `context`, which starts at `offset` in the user message's
    text, -1 for none.

    The processor expands the photo's placeholder into its image tokens; the text after
    the photo's last image token is tokenized alike in the chat template's rendering
    (the placeholder unexpanded, tokenized with offsets as `cite` tokenizes a prompt)
    and in the processor's prompt, so the rendering's tokens after it are the prompt's
    last tokens; where they are not, the context cannot be placed and InputError says so."""
    text = prompt["text"]
    rendered = image_prompt_texts(prompt, processor)[0][0]
    at = rendered.rfind(text)
    if at < 0:
        raise InputError(
            "the chat template changes the question's text (it strips or escapes it), so "
            "the context cannot be found in the prompt"
        )
    ids, owners = tokenize_prompt(processor.tokenizer, rendered, context, at + offset, True)
    image = (ids == adapter.image_token_id).nonzero()
    first = int(image[-1]) + 1 if len(image) else 0
    tail, tail_owners = ids[first:], owners[first:]
    if (
        bool((owners[:first] >= 0).any())
        or tail.shape[0] > prompt_ids.shape[0]
        or not torch.equal(prompt_ids[prompt_ids.shape[0] - tail.shape[0] :], tail)
    ):
        raise InputError(
            "the processor's prompt does not end with the context and the question as its "
            "tokenizer reads them, so the context's tokens cannot be placed"
        )
    placed = torch.full((prompt_ids.shape[0],), -1, dtype=torch.long)
    placed[prompt_ids.shape[0] - tail.shape[0] :] = tail_owners
    return placed
