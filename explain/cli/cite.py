"""`explain cite`: which part of the context a language model's answer came from.

The context (a text file, or a JSON file holding a list of documents or a chat) is split
into spans, put into a prompt with the question, and the answer (given with --answer, or
generated) is explained token by token over the prompt in one batched backward; each
span's relevance is the sum of its tokens' (explain.cite). The ablation check then
removes the top-1, top-3 and top-5 spans from the prompt and compares the answer's
log-probability drop with that of as many random spans (every set of them when there are
at most 16); --lds N adds the linear datamodeling score from N random ablations of half
the spans. The check ends in a verdict, the same words in the terminal, on the page and
in cite.json: supported, weak, not supported by ablation (the rule: docs/cite.md).
Three files are written atomically into --out: cite.html (the context with its spans
highlighted; choose the whole answer, one of its sentences or one of its tokens),
cite.png (the top spans' scores and their relevance per answer token) and cite.json
(`spans`: text, start and end character offsets into the context, score; `sentences`
and `statement_relevance`: the answer's sentences and each one's span scores; `check`:
the ablation results and the verdict; everything else Citation.load reads).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explain.cli.method_options import (
    ALL,
    add_method_option,
    method_file,
    methods_the_model_takes,
    named_methods,
    parse_methods,
)
from explain.cli.options import (
    Planned,
    RawDescriptionHelpFormatter,
    add_model_arguments,
    add_out_argument,
    crop_caption,
    load,
    load_vision_language,
    positive_int,
)
from explain.errors import InputError

if TYPE_CHECKING:
    from explain.api import Explainer
    from explain.cite.check import Check

__all__ = ["register"]

FILES = ("cite.html", "cite.png", "cite.json")


def planned(args: argparse.Namespace) -> list[Planned]:
    """The three files of every method."""
    return [
        Planned(method_file(args.out / name, method, args.method), "--out")
        for method in named_methods(args.method)
        for name in FILES
    ]


def read_context_file(path: Path) -> Any:
    """A .json file's list of documents or chat messages, or any other file's text."""
    if not path.is_file():
        raise InputError(f"no such context file: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read the context file {path} as UTF-8 text: {error}") from None
    if path.suffix.lower() != ".json":
        return text
    try:
        return json.loads(text)
    except RecursionError:  # json's parser recurses once per nesting level
        raise InputError(
            f"{path} is nested too deeply; a .json context is a list of documents (texts) or "
            'a chat (a list of {"role", "content"} messages)'
        ) from None
    except json.JSONDecodeError as error:
        raise InputError(
            f"{path} is not JSON ({error}); a .json context is a list of documents (texts) or "
            'a chat (a list of {"role", "content"} messages)'
        ) from None


def _lds(text: str) -> int:
    """An argparse type: 0 (no LDS) or at least 2 random ablations."""
    value = int(text)
    if value < 0 or value == 1:
        raise argparse.ArgumentTypeError(f"must be 0 or at least 2, got {value}")
    return value


def _count(text: str) -> int:
    """An argparse type: a number of spans, 0 or more."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def print_citation(
    answer: str,
    scores: Any,
    labels: Sequence[str],
    check: Check | None,
    sources: str,
    note: str = "",
) -> Check:
    """The `answer`, its five top-ranked `sources` by `scores` (each its signed score and
    `labels` entry), the `note` on what the scores are (`Citation.ablated_note`) and the
    check with its verdict, on the terminal; the check, for the files."""
    from explain.cite.verdict import number
    from explain.viz.text import printable

    print("answer:", printable(answer))
    ranked = scores.double().argsort(descending=True, stable=True).tolist()
    for rank, index in enumerate(ranked[:5], start=1):
        print(f"  {rank}. {number(float(scores[index]), signed=True)}  {labels[index]}")
    if note:
        print(f"  {note}")
    assert check is not None
    print_check(check, sources)
    return check


def print_check(check: Check, sources: str) -> None:
    """The check's lines in the terminal, of the `sources` it removed ("spans",
    "regions"), ending with its verdict (explain.cite.verdict, as the page and cite.json
    say it)."""
    from explain.cite.verdict import lds_band, number, random_sets

    for drop in check.drops:
        tie = ", tied at the cut" if drop.tied else ""
        print(
            f"  top-{drop.k} removed: {check.target} drops {number(drop.top)} (random "
            f"{sources}: {number(drop.random)} ± {number(drop.random_std)}, "
            f"{random_sets(drop)}{tie})"
        )
    if check.lds_ablations:
        lds = "undefined" if check.lds is None else number(check.lds)
        print(f"  LDS over {check.lds_ablations} ablations: {lds} ({lds_band(check)})")
    print(f"verdict: {check.verdict}")


def _statements(result: Any) -> list[str]:
    """The answer's sentences the page offers as choices: none for one sentence (its
    statement is the whole answer)."""
    texts = [sentence.text for sentence in result.sentences]
    return texts if len(texts) > 1 else []


def _run_image(args: argparse.Namespace) -> int:
    """`explain cite --image`: the photo's regions as the sources, with each method."""
    from explain.api import Explainer
    from explain.cite.regions import grid_size, slic_count
    from explain.inputs import read_image

    if args.foil is not None or args.chat or args.ablate:  # None: a photo's default, none
        raise InputError("--image takes no --foil, --chat or --ablate (yet)")
    context = None if args.context is None else read_context_file(args.context)
    grid = grid_size(args.grid)
    if args.regions is not None:
        slic_count(args.regions)  # a malformed slic:N fails before the model is loaded
    photo = read_image(args.image)
    parse_methods(args.method)  # unknown names fail before the model is loaded
    loaded = load_vision_language(args)
    explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
    methods = methods_the_model_takes(args.method, explainer.adapter, args.model, generation=True)
    assert loaded.preprocessing is not None  # load_vision_language checks it
    seen = crop_caption(loaded.preprocessing, (photo.height, photo.width))
    if seen is not None:
        print(seen)  # the terminal says what the figure's caption says
    for method in methods:
        if len(methods) > 1:
            print(f"[{method}]")
        _cite_image_one(args, explainer, photo, context, grid, method, seen)
    return 0


def _cite_image_one(
    args: argparse.Namespace,
    explainer: Explainer,
    photo: Any,
    context: Any,
    grid: tuple[int, int],
    method: str,
    seen: str | None,
) -> None:
    """Cite the photo's regions (and the spans of a `context` beside it) with one method:
    the terminal's lines and its three files (named for the method when --method names
    several); `seen`: what the figure's caption says of a crop (`crop_caption`)."""
    import numpy as np

    from explain.cite.figure import span_label
    from explain.cite.image import cite_image
    from explain.cite.regions_page import regions_figure, regions_html
    from explain.export import atomic_write
    from explain.viz import save_figure
    from explain.viz.text import printable

    result = cite_image(
        explainer,
        photo,
        args.question,
        args.answer,
        regions="grid" if args.regions is None else args.regions,
        grid=grid,
        context=context,
        spans=args.spans,
        **({} if args.template is None else {"template": args.template}),
        method=method,
        max_new_tokens=args.max_new_tokens,
        lds=args.lds,
        seed=args.seed,
    )
    labels = [f"{printable(region.name)} {region.box}" for region in result.regions]
    sources = "regions"
    if result.context is not None:
        spans = enumerate(result.context.spans)
        labels += [printable(span_label(s, span.text)) for s, span in spans]
        sources = "regions and spans"
    check = print_citation(result.answer, result.source_scores, labels, result.check, sources)
    args.out.mkdir(parents=True, exist_ok=True)
    html, png, data = (method_file(args.out / name, method, args.method) for name in FILES)
    title = f"explain cite: {args.model} ({result.method})"
    pixels = np.asarray(photo)
    statements = _statements(result)
    spans = [] if result.context is None else [span.text for span in result.context.spans]
    page = regions_html(
        pixels,
        result.regions,
        result.source_scores,
        args.question,
        result.answer,
        sentences=statements,
        sentence_scores=result.statement_sources[: len(statements)],
        check=check.to_dict(),
        title=title,
        spans=spans,
    )
    with atomic_write(html, "w") as handle:
        handle.write(page)
    caption = " ".join(
        filter(None, [f"Verdict: {check.verdict}. Ablation: {check.ablation}.", seen])
    )
    figure = regions_figure(
        pixels, result.regions, result.source_scores, caption=caption, title=title, spans=spans
    )
    save_figure(figure, png)
    result.save(data)
    for path in (html, png, data):
        print(path)


def run(args: argparse.Namespace) -> int:
    if args.image is not None:
        return _run_image(args)
    if args.context is None:
        raise InputError("give the context (--context FILE), or a photo (--image FILE)")

    from explain.api import Explainer

    context = read_context_file(args.context)
    parse_methods(args.method)  # unknown names fail before the model is loaded
    loaded = load(args)
    if loaded.modality != "text" or loaded.tokenizer is None:
        raise InputError(f"{args.model} is not a text model with a tokenizer")
    explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
    methods = methods_the_model_takes(args.method, explainer.adapter, args.model, generation=True)
    if args.foil is not None and args.method is not None and args.method.strip() == ALL:
        methods = _contrasting(methods)
    for method in methods:
        if len(methods) > 1:
            print(f"[{method}]")
        # each method generates the answer anew (when not given): greedy, so the same ids,
        # where the answer's decoded text could tokenize otherwise
        _cite_one(args, explainer, context, method)
    return 0


def _contrasting(methods: list[str]) -> list[str]:
    """Those of `methods` that can contrast an answer with a --foil (linear in the score:
    the relevance of log p(answer) - log p(foil) is the difference of the two answers'),
    with a note on stderr naming the others."""
    from explain.rules import get_method

    left_out = [name for name in methods if not get_method(name).linear_in_score]
    if left_out:
        print(
            f"explain: note: --method all with --foil: {', '.join(left_out)} cannot contrast "
            "two answers (not linear in the score)",
            file=sys.stderr,
        )
    return [name for name in methods if name not in left_out]


def _cite_one(args: argparse.Namespace, explainer: Explainer, context: Any, method: str) -> None:
    """Cite --answer (default: the model's own) with one method: the terminal's lines and
    the three files."""
    import torch

    from explain.cite import cite
    from explain.cite.figure import cite_figure, span_label
    from explain.cite.page import cite_html
    from explain.export import atomic_write
    from explain.viz import save_figure
    from explain.viz.text import printable

    result = cite(
        explainer,
        context,
        args.question,
        args.answer,
        foil=args.foil,
        spans=args.spans,
        method=method,
        **({} if args.template is None else {"template": args.template}),
        chat=args.chat,
        max_new_tokens=args.max_new_tokens,
        ablate=args.ablate,
        lds=args.lds,
        seed=args.seed,
    )
    labels = [printable(span_label(s, span.text)) for s, span in enumerate(result.spans)]
    note = result.ablated_note
    check = print_citation(result.answer, result.scores, labels, result.check, "spans", note)
    args.out.mkdir(parents=True, exist_ok=True)
    title = f"explain cite: {args.model}"
    rows = torch.cat([result.scores[None], result.span_relevance])
    statements = _statements(result)
    texts = [span.text for span in result.spans]
    foil_tokens = 0 if result.foil_ids is None else result.foil_ids.shape[0]
    payload = check.to_dict()
    html, png, data = (method_file(args.out / name, method, args.method) for name in FILES)
    page = cite_html(
        texts,
        args.question,
        result.answer_tokens,
        torch.cat([rows, result.statement_relevance[: len(statements)]]),
        method=result.method,
        foil_tokens=foil_tokens,
        sentences=statements,
        check=payload,
        title=title,
        note=note,
    )
    with atomic_write(html, "w") as handle:
        handle.write(page)
    figure = cite_figure(
        texts,
        result.answer_tokens,
        rows,
        method=result.method,
        check=payload,
        title=title,
        note=note,
    )
    save_figure(figure, png)
    result.save(data)
    for path in (html, png, data):
        print(path)


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "cite",
        help="which part of the context a language model's answer came from",
        description=__doc__,
        formatter_class=RawDescriptionHelpFormatter,
        epilog="Example: explain cite --model ./my-llama --context report.txt --question "
        '"Who signed the treaty?" --lds 64 --out cited (writes cited/cite.html, '
        "cited/cite.png and cited/cite.json). How far to trust the check: docs/cite.md.",
    )
    add_model_arguments(
        parser,
        takes="a Hugging Face decoder-only language model with its tokenizer (a "
        "...ForCausalLM: Llama, Qwen, Mistral, Gemma, Phi, GPT-2 ...)",
        examples="./my-llama (a save_pretrained folder), HuggingFaceTB/SmolLM2-135M-Instruct",
    )
    parser.add_argument(
        "--context",
        type=Path,
        default=None,
        metavar="FILE",
        help="the context: a text file (UTF-8), or a .json file holding a list of documents "
        '(texts) or a chat (a list of {"role", "content"} messages)',
    )
    parser.add_argument(
        "--image",
        type=Path,
        default=None,
        metavar="FILE",
        help="cite the regions of this photo (a vision-language model with its processor); "
        "with --context, the context's spans beside them, ranked together",
    )
    parser.add_argument(
        "--grid",
        default="3x3",
        metavar="RxC",
        help="with --image: the regions are a grid of R x C cells; default: %(default)s",
    )
    parser.add_argument(
        "--regions",
        default=None,
        metavar="FILE|slic:N",
        help="with --image: the regions instead of a grid: slic:N, about N superpixels "
        "(scikit-image's SLIC: pip install 'explain-transformers[superpixels]'), or a JSON "
        'list of {"name", "box": [left, top, right, bottom]} (pixels, right and bottom '
        'excluded) or {"name", "mask": "mask.png"} (its non-zero pixels; the path relative '
        "to FILE)",
    )
    parser.add_argument("--question", required=True, help="what is asked about the context")
    parser.add_argument(
        "--answer",
        default=None,
        help="the answer to explain; default: the model's own (greedy, --max-new-tokens)",
    )
    parser.add_argument(
        "--foil",
        default=None,
        help="an alternative answer: explain why the answer rather than this one "
        "(log p(answer) - log p(foil); --method attnlrp or cp_lrp)",
    )
    parser.add_argument(
        "--spans",
        choices=("sentences", "paragraphs", "lines", "documents", "turns"),
        default="sentences",
        help="what the context is split into: sentences (at . ! ? followed by a space, "
        "not after abbreviations or initials, and at line breaks), paragraphs (at blank "
        "lines), lines, documents (a JSON list of texts) or turns (a JSON chat); "
        "default: %(default)s",
    )
    add_method_option(parser)
    parser.add_argument(
        "--lds",
        type=_lds,
        default=0,
        metavar="N",
        help="also compute the linear datamodeling score from N random ablations of half "
        "the spans (batched forwards); default: 0 (not computed)",
    )
    parser.add_argument(
        "--ablate",
        type=_count,
        default=None,
        metavar="K",
        help="remove each of the K spans of largest |score| alone and score it by the "
        "answer's drop (K + 1 batched forwards more; finds a span the answer needs through "
        "attention only, as a chain of facts' first); 0: one pass only; default: 4 for a "
        "method linear in the score (cp_lrp, attnlrp), 0 for the others",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the check's random spans; default: 0"
    )
    parser.add_argument(
        "--template",
        default=None,
        help="the prompt, with {context} before {question}; default: the context, a blank "
        "line, the question",
    )
    parser.add_argument(
        "--chat",
        action="store_true",
        help="send the filled template as a user message through the tokenizer's chat "
        "template (a chat context always goes through it)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=32,
        metavar="N",
        help="length limit of a generated answer; default: %(default)s",
    )
    add_out_argument(parser)
    parser.set_defaults(run=run, planned=planned)
