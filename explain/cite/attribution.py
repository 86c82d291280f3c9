"""Which spans of a context an answer came from: span attribution at the cost of one
batched backward, with ContextCite's ablation check built in.

`cite` puts the context and the question into a prompt (explain.cite.prompt), takes the
answer given or generates one, and explains every answer token over the prompt with
the engine's generation explanation (explain.generation.explain_generation: one forward
and one backward batched over the answer's tokens, for any method a language model
takes). A span's relevance for answer token g is the sum of the relevances of its tokens
for g; its score for the whole answer is the sum over the answer's tokens (for the
methods linear in the score, AttnLRP and CP-LRP, exactly the relevance of the answer's
log-probability). Then the k spans of largest |score| (`ablate`; by default 4 for those
methods) are each removed alone and scored by the answer's drop
(explain.cite.leave_one_out: k + 1 batched forwards), which finds a span the answer needs
through the attention weights only, as a two-hop question's bridge fact. The check
(explain.cite.check) then ablates the top-ranked spans.

A contrast (`foil`): why the answer rather than the foil. The target is the answer's
log-probability minus the foil's; the two continuations of the one prompt run as two
rows of one explanation, and the foil's token rows enter negated. Only the methods
linear in the score take it: for them this is exactly the relevance of the difference
(Gradient x Input through the shared prompt); a clamping rule (generic) would explain
something else, so it is refused. `explain_contrast` is the same for any prompt, without
spans.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from explain.api import Explainer
from explain.cite.check import Check, ablated_targets, check_ranking, check_seed
from explain.cite.image import RegionCitation, cite_image
from explain.cite.leave_one_out import (
    DEFAULT_COUNT,
    check_count,
    leave_one_out,
    removed_alone_note,
)
from explain.cite.prompt import TEMPLATE, build_prompt, read_context, span_sums
from explain.cite.regions import GRID
from explain.cite.saved import FORMAT, TENSORS, VERSION, citation_fields
from explain.cite.spans import Span
from explain.cite.statements import UNLOCATED, answer_statements, statement_sums
from explain.engine import require_causal_lm
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
from explain.inputs import unicode_text
from explain.rules import METHODS, get_method

__all__ = [
    "Citation",
    "ContrastExplanation",
    "cite",
    "explain_contrast",
    "sparse_spans",
]


@dataclass(frozen=True)
class ContrastExplanation:
    """Why `answer` rather than `foil` after one prompt.

    Attributes:
        relevance: (P,) each prompt token's relevance for log p(answer) - log p(foil).
        rows: (Ga + Gf, P) per continuation token: the answer's tokens' relevance, then
            the foil's negated; `relevance` is their sum.
        prompt_tokens, answer_tokens, foil_tokens: the token strings.
        explanation: the engine's explanation of the two continuations (row 0 the
            answer, row 1 the foil; see explain.generation.GenerationExplanation).
    """

    relevance: Tensor
    rows: Tensor
    prompt_tokens: list[str]
    answer_tokens: list[str]
    foil_tokens: list[str]
    explanation: GenerationExplanation


def _token_ids(tokenizer: Any, text: str, what: str) -> Tensor:
    """The ids of an answer's text, without special tokens (it follows the prompt)."""
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"the {what} is empty: give its text")
    unicode_text(text, f"the {what}")
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    if not ids:
        raise InputError(f"the tokenizer keeps no token of the {what} {text!r}")
    return torch.tensor(ids, dtype=torch.long)


def _continuations(prompt_ids: Tensor, answers: Sequence[Tensor], pad: int) -> Generation:
    """The prompt followed by each answer, one row each, padded on the right."""
    length = prompt_ids.shape[0]
    width = max(answer.shape[0] for answer in answers)
    ids = torch.full((len(answers), length + width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, answer in enumerate(answers):  # one row per answer: two at most
        ids[row, :length] = prompt_ids
        ids[row, length : length + answer.shape[0]] = answer
        mask[row, : length + answer.shape[0]] = 1
    return Generation(input_ids=ids, attention_mask=mask, prompt_length=length)


def _signed_rows(
    explainer: Explainer,
    prompt_ids: Tensor,
    answers: Sequence[Tensor],
    method: str,
    score: Score | None,
    start_layer: int | None,
    options: Mapping[str, Any],
) -> tuple[Tensor, GenerationExplanation]:
    """(G, P): the relevance over the prompt of each answer token (the second answer's,
    a foil's, negated), from one explanation of every answer at once."""
    spec = get_method(method)
    if len(answers) > 1 and not spec.linear_in_score:
        linear = ", ".join(name for name, each in sorted(METHODS.items()) if each.linear_in_score)
        raise OptionError(
            f"method {method!r} is not linear in the explained score, so the relevance of "
            "log p(answer) - log p(foil) is not the difference of the two answers' "
            f"relevances (and two answers run through two forwards); contrast two answers "
            f"with {linear}, or two next tokens with Explainer.explain(target=Contrast(...))"
        )
    if score is None and spec.takes_score:
        score = "log_probability"
    pad = getattr(explainer.tokenizer, "pad_token_id", None)
    generation = _continuations(prompt_ids, answers, 0 if pad is None else int(pad))
    found = explain_generation(
        explainer, generation, method=method, score=score, start_layer=start_layer, **options
    )
    relevance = found.explanation.relevance
    width = prompt_ids.shape[0]
    rows = [
        sign * relevance[row, : answer.shape[0], :width]
        for row, (answer, sign) in enumerate(zip(answers, (1.0, -1.0), strict=False))
    ]
    return torch.cat(rows), found


def _prompt_ids(explainer: Explainer, prompt: str | Tensor) -> Tensor:
    if isinstance(prompt, Tensor):
        if prompt.dim() != 1 or prompt.numel() == 0 or prompt.is_floating_point():
            raise InputError("a tokenized prompt is a (P,) tensor of token ids")
        return prompt.long().cpu()
    if explainer.tokenizer is None:
        raise InputError("texts need a tokenizer: Explainer(model, tokenizer=tokenizer)")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InputError("the prompt is empty: give the text the answers continue")
    return torch.tensor(explainer.tokenizer(prompt)["input_ids"], dtype=torch.long)


def explain_contrast(
    explainer: Explainer,
    prompt: str | Tensor,
    answer: str,
    foil: str,
    method: str | None = None,
    score: Score | None = None,
    start_layer: int | None = None,
    **options: Any,
) -> ContrastExplanation:
    """Why a decoder-only language model would continue `prompt` with `answer` rather than
    `foil`: each prompt token's relevance for log p(answer) - log p(foil) (module doc).

    Args:
        explainer: an Explainer of a decoder-only language model with its tokenizer.
        prompt: a text (tokenized with the tokenizer's special tokens) or (P,) token ids.
        answer, foil: the two continuations, as texts.
        method: a method linear in the score (attnlrp, cp_lrp); the others are refused.
            None: the model kind's default (`generation_default`).
        score: what of each continuation token is differentiated; default its
            log-probability, so that the sum is log p(answer) - log p(foil).
    """
    require_causal_lm(explainer.adapter)
    method = generation_default(explainer).method if method is None else method
    prompt_ids = _prompt_ids(explainer, prompt)
    tokenizer = explainer.tokenizer
    answers = [_token_ids(tokenizer, answer, "answer"), _token_ids(tokenizer, foil, "foil")]
    rows, found = _signed_rows(explainer, prompt_ids, answers, method, score, start_layer, options)

    def strings(ids: Tensor) -> list[str]:
        return tokenizer.convert_ids_to_tokens(ids.tolist())

    return ContrastExplanation(
        relevance=rows.sum(dim=0),
        rows=rows,
        prompt_tokens=strings(prompt_ids),
        answer_tokens=strings(answers[0]),
        foil_tokens=strings(answers[1]),
        explanation=found,
    )


@dataclass(frozen=True)
class Citation:
    """Span attribution of one answer (see `cite`).

    Attributes:
        context: the context's text, which the spans' offsets index (a chat's: its
            rendering by the chat template).
        spans: the spans, covering the context without gaps or overlaps.
        kind: how the context was split ("sentences", "paragraphs", ...).
        question: the question.
        prompt: the prompt's text; the context starts at `context_offset` in it.
        prompt_tokens: the prompt's P token strings; `token_spans` (P,) each one's span
            index (-1: outside the context).
        answer: the answer's text; `answer_tokens` its tokens (then the foil's, for a
            contrast: the rows of the relevances, the foil's negated).
        foil: the foil's text for a contrast, else None.
        token_relevance: (G, P) each answer token's relevance over the prompt's tokens.
        span_relevance: (G, S) each answer token's relevance per span: the sum of
            `token_relevance` over the span's tokens.
        scores: (S,) each span's relevance for the whole answer (the sum over G); with
            `ablate`, the candidates' scores are their leave-one-out drops instead
            (`span_relevance` keeps the method's).
        ablated: the spans whose `scores` are leave-one-out drops (`ablate`'s
            candidates, largest |score| first; explain.cite.leave_one_out's
            `removed_alone_note` says so in words, as the terminal, page and figure do).
        sentences: the answer's N sentences (the context's splitter; offsets into
            `answer`); `token_sentences` (G,) each answer token's sentence (-1: a foil's).
        statement_relevance: (N, S) each sentence's span scores: the sum of
            `span_relevance` over its tokens (explain.cite.statements).
        method, score: the method, and what it differentiated ("custom": nothing).
        check: the ablation check (explain.cite.check), or None when not run.
        settings: what else made the result (the template, chat, model...), JSON-able.
        explanation: the engine's explanation of the answer (not saved).
    """

    context: str
    spans: tuple[Span, ...]
    kind: str
    question: str
    prompt: str
    context_offset: int
    prompt_tokens: list[str]
    token_spans: Tensor
    answer: str
    answer_tokens: list[str]
    foil: str | None
    token_relevance: Tensor
    span_relevance: Tensor
    scores: Tensor
    method: str
    score: str
    check: Check | None
    prompt_ids: Tensor
    answer_ids: Tensor
    sentences: tuple[Span, ...]
    token_sentences: Tensor
    statement_relevance: Tensor
    foil_ids: Tensor | None = None
    ablated: tuple[int, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)
    explanation: GenerationExplanation | None = None

    def ranked(self) -> list[int]:
        """The span indices, highest score first."""
        return self.scores.double().argsort(descending=True, stable=True).tolist()

    @property
    def ablated_note(self) -> str:
        """Which whole-answer scores are leave-one-out drops, in words ("" for none): what
        the terminal, the page and the figure say beside the scores."""
        return removed_alone_note(self.ablated, self.method, contrast=self.foil is not None)

    def to_dict(self) -> dict[str, Any]:
        """Everything but the engine's explanation as plain JSON-able values: `spans`
        (text, start, end, score each), `sentences` (text, start, end each), `check`,
        the relevances as nested lists."""
        return {
            **self._header(),
            **{name: t.detach().cpu().tolist() for name, t in self._tensors().items()},
        }

    def _header(self) -> dict[str, Any]:
        scores = self.scores.double().tolist()
        return {
            "format": FORMAT,
            "version": VERSION,
            "context": self.context,
            "kind": self.kind,
            "spans": [
                {"text": s.text, "start": s.start, "end": s.end, "score": score}
                for s, score in zip(self.spans, scores, strict=True)
            ],
            "question": self.question,
            "prompt": self.prompt,
            "context_offset": self.context_offset,
            "prompt_tokens": self.prompt_tokens,
            "answer": self.answer,
            "answer_tokens": self.answer_tokens,
            "sentences": [{"text": s.text, "start": s.start, "end": s.end} for s in self.sentences],
            "foil": self.foil,
            "method": self.method,
            "score": self.score,
            "check": None if self.check is None else self.check.to_dict(),
            "ablated": list(self.ablated),
            "settings": dict(self.settings),
        }

    def _tensors(self) -> dict[str, Tensor]:
        tensors = {
            "token_relevance": self.token_relevance,
            "span_relevance": self.span_relevance,
            "scores": self.scores,
            "statement_relevance": self.statement_relevance,
            "token_spans": self.token_spans,
            "token_sentences": self.token_sentences,
            "prompt_ids": self.prompt_ids,
            "answer_ids": self.answer_ids,
        }
        if self.foil_ids is not None:
            tensors["foil_ids"] = self.foil_ids
        return tensors

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the citation to `path` (.json, .npz or .safetensors, by its suffix):
        the header (`spans` with their scores, `check`, the texts and tokens) and the
        relevances; `Citation.load` reads it back. A .json file holds the header's keys
        at its top level and the tensors under "tensors"."""
        write_payload(path, self._tensors(), self._header())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Citation:
        """Read a citation written by `save`. Any other file, or one whose contents are
        not a citation's (spans that do not tile the context, token data that disagrees
        with the spans or the tokens, a field of the wrong type...), raises InputError
        naming what is wrong (explain.cite.saved); nothing in the file is executed."""
        tensors, header = read_payload(path, lambda header: TENSORS)
        return cls(**citation_fields(tensors, header, path))


def sparse_spans(span_relevance: Tensor, share: float) -> Tensor:
    """`span_relevance` (G, S) with the columns of every span whose score (its column's
    sum) is below `share` times the top score set to 0; unchanged where no score is
    positive (no top to be a share of)."""
    scores = span_relevance.sum(dim=0)
    top = scores.max()
    if top <= 0:
        return span_relevance
    return torch.where(scores >= share * top, span_relevance, torch.zeros_like(span_relevance))


def _check_types(**arguments: tuple[Any, type | tuple[type, ...]]) -> None:
    """OptionError naming the first argument that is not of its type (name=(value, type))."""
    for name, (value, kind) in arguments.items():
        if not isinstance(value, kind):
            raise OptionError(f"{name} must be a {_type_names(kind)}, got {value!r}")


def _type_names(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join("None" if k is type(None) else k.__name__ for k in kinds)


def cite(
    explainer: Explainer,
    context: str | Sequence[str] | Sequence[Mapping[str, str]] | None,
    question: str,
    answer: str | None = None,
    *,
    image: Any = None,
    regions: str | os.PathLike[str] | Sequence[Any] = "grid",
    grid: tuple[int, int] = GRID,
    foil: str | None = None,
    spans: str = "sentences",
    method: str | None = None,
    score: Score | None = None,
    start_layer: int | None = None,
    template: str = TEMPLATE,
    chat: bool = False,
    max_new_tokens: int = 32,
    generate_options: Mapping[str, Any] | None = None,
    sparse: float = 0.0,
    ablate: int | None = None,
    check: bool = True,
    lds: int = 0,
    seed: int = 0,
    **options: Any,
) -> Citation | RegionCitation:
    """Which spans of `context` (or regions of the photo `image`) the answer to
    `question` came from.

    Args:
        explainer: an Explainer of a decoder-only language model with its tokenizer (a
            vision-language model with its processor, for an `image`).
        context: a text, a list of documents, or a chat (a list of {"role", "content"}
            messages, rendered by the tokenizer's chat template); None with an `image`.
        image: a photo (a path, a PIL image, an (H, W, 3) array): cite its regions
            instead (explain.cite.image.cite_image, which states the rest): `regions`
            "grid" (`grid` = (rows, cols) cells, default 3 x 3), a JSON file, or a list
            of {"box"} / {"mask"} entries; `method`, `score`, `start_layer`, `answer`,
            `max_new_tokens`, `generate_options`, `check`, `lds`, `seed` and `options`
            as below. A text `context` (or documents) beside the photo is split into
            `spans` that are sources beside the regions, in `template`.
        question: what is asked about the context; it follows the context in the prompt.
        answer: the answer to explain; None generates one (greedy unless
            `generate_options` say otherwise, at most `max_new_tokens` tokens).
        foil: an alternative answer: explain log p(answer) - log p(foil) (attnlrp and
            cp_lrp only; see the module doc).
        spans: "sentences" (default), "paragraphs", "lines", "documents" (a list of
            documents) or "turns" (a chat); explain.cite.spans states the rules.
        method, start_layer, options: as for `Explainer.explain`; any method a language
            model takes (None: the model kind's default, `generation_default`).
        score: what each answer token's explanation differentiates; default its
            log-probability for the methods that take a score.
        template: the prompt, with "{context}" before "{question}" (for a text or
            documents); `chat` puts it through the chat template as a user message.
        sparse: a share of the top span's score, in [0, 1): every span scoring below it
            is set to 0 (its token rows in `span_relevance` too; `token_relevance` is
            kept). 0 (default) keeps every score. A citation names the spans that carry
            the answer; the small scores of the rest are mostly noise that a linear
            account of ablations (the LDS) pays for: on the zoo's recall model CP-LRP
            with sparse=0.05 scores an LDS above ContextCite-256's (docs/benchmarks.md).
        ablate: a number of spans k (0: none; None, default: `DEFAULT_COUNT`, 4, for a
            method linear in the score, such as CP-LRP, and 0 for the others, whose
            relevance is not in nats): the k spans of largest |score|
            (before `sparse`) are each removed alone, and their scores become the drop
            of the target (log p(answer), a contrast's difference) in nats, k + 1
            batched forwards more (explain.cite.leave_one_out); the other spans keep
            their scores. A span the answer needs through the attention weights only (a
            two-hop question's bridge fact) gets little or negative one-pass relevance;
            on the zoo's two-hop model CP-LRP with ablate=4 puts both facts in its
            top 2 on 15 of 16 prompts, 4 without it, at 3-7% more time with the check
            (2.2x without it); on the one-hop recall model it changes nothing
            (docs/benchmarks.md).
        check: run the ablation check (explain.cite.check); `lds` random ablations for
            the LDS (0: none); `seed` for the check's random draws.

    Returns:
        a `Citation`: the spans, each answer token's span relevances, each span's score
        for the whole answer, the token-level relevances, and the check (for an image,
        a `RegionCitation`: the same over the photo's regions).
    """
    if image is not None:
        if foil is not None or sparse or ablate or chat:  # None: a photo's default, none
            raise OptionError("citing a photo takes no foil, sparse, ablate or chat (yet)")
        return cite_image(
            explainer,
            image,
            question,
            answer,
            regions=regions,
            grid=grid,
            context=context,
            spans=spans,
            template=template,
            method=method,
            score=score,
            start_layer=start_layer,
            max_new_tokens=max_new_tokens,
            generate_options=generate_options,
            check=check,
            lds=lds,
            seed=seed,
            **options,
        )
    adapter = require_causal_lm(explainer.adapter)
    tokenizer = explainer.tokenizer
    if tokenizer is None:
        raise InputError("cite needs the model's tokenizer: Explainer(model, tokenizer=...)")
    _check_types(question=(question, str), template=(template, str), spans=(spans, str))
    _check_types(answer=(answer, (str, type(None))), foil=(foil, (str, type(None))))
    method = generation_default(explainer).method if method is None else method
    _check_types(method=(method, str), chat=(chat, bool), check=(check, bool))
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise OptionError(f"max_new_tokens must be an int, got {max_new_tokens!r}")
    spec = get_method(method)  # an unknown method (or seed) fails before any work
    check_seed(seed)
    if isinstance(sparse, bool) or not isinstance(sparse, int | float) or not 0 <= sparse < 1:
        raise OptionError(f"sparse is a share of the top span's score in [0, 1), got {sparse!r}")
    if ablate is None:
        ablate = DEFAULT_COUNT if spec.linear_in_score else 0
    check_count(ablate)
    parsed = read_context(context, spans, tokenizer)
    prompt = build_prompt(tokenizer, parsed, question, template, chat)
    prompt_ids = prompt.input_ids
    if answer is None:
        generated = generate(
            explainer,
            {"input_ids": prompt_ids[None], "attention_mask": torch.ones_like(prompt_ids)[None]},
            max_new_tokens,
            **dict(generate_options or {}),
        )
        answer_ids = generated.input_ids[0, prompt_ids.shape[0] :][generated.generated[0]].cpu()
        answer = tokenizer.decode(answer_ids.tolist(), skip_special_tokens=True)
        if not answer.strip():  # spans ranked for no text would read as an answer's
            raise InputError(
                f"the model's answer has no text (it generated {tokenizer.decode(answer_ids)!r}"
                "): there is nothing to cite; give the answer to explain (answer=, --answer)"
            )
    else:
        if generate_options:
            raise OptionError("generate_options are for a generated answer: leave answer unset")
        answer_ids = _token_ids(tokenizer, answer, "answer")
    answers = [answer_ids]
    if foil is not None:
        answers.append(_token_ids(tokenizer, foil, "foil"))
    rows, found = _signed_rows(explainer, prompt_ids, answers, method, score, start_layer, options)
    span_relevance = span_sums(rows, prompt.token_spans, len(parsed.spans))
    method_scores = span_relevance.sum(dim=0)
    if sparse:
        span_relevance = sparse_spans(span_relevance, sparse)
    scores = span_relevance.sum(dim=0)
    weighted = list(zip(answers, (1.0, -1.0), strict=False))
    ablated: tuple[int, ...] = ()
    if ablate:

        def targets(keep: Tensor) -> Tensor:
            return ablated_targets(adapter, prompt_ids, prompt.token_spans, weighted, keep)

        refined, ablated = leave_one_out(scores, targets, ablate, chosen_by=method_scores)
        scores = refined.to(scores)
    foil_tokens = 0 if foil is None else answers[1].shape[0]
    statements = answer_statements(tokenizer, answer, answer_ids, foil_tokens)
    result_check = None
    if check:
        target = "log p(answer)" if foil is None else "log p(answer) - log p(foil)"
        result_check = check_ranking(
            adapter,
            prompt_ids,
            prompt.token_spans,
            weighted,
            scores,
            target=target,
            lds=lds,
            seed=seed,
        )
    elif lds:
        raise OptionError("lds is part of the check: leave check=True to compute it")
    strings = tokenizer.convert_ids_to_tokens
    return Citation(
        context=parsed.text,
        spans=parsed.spans,
        kind=parsed.kind,
        question=question,
        prompt=prompt.text,
        context_offset=prompt.offset,
        prompt_tokens=strings(prompt_ids.tolist()),
        token_spans=prompt.token_spans,
        answer=answer,
        answer_tokens=[token for ids in answers for token in strings(ids.tolist())],
        foil=foil,
        token_relevance=rows,
        span_relevance=span_relevance,
        scores=scores,
        method=method,
        score=found.explanation.score,
        check=result_check,
        prompt_ids=prompt_ids,
        answer_ids=answer_ids,
        sentences=statements.sentences,
        token_sentences=statements.token_sentences,
        statement_relevance=statement_sums(
            span_relevance, statements.token_sentences, len(statements.sentences)
        ),
        foil_ids=answers[1] if foil is not None else None,
        ablated=ablated,
        settings={
            **found.explanation.settings,
            "template": template,
            "chat": chat,
            **({"sparse": sparse} if sparse else {}),
            **({"ablate": ablate} if ablate else {}),
            **({} if statements.located else {"sentences": UNLOCATED}),
        },
        explanation=found,
    )
