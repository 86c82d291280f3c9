"""`explain text`: which words of a text made a text model decide as it did.

Prints each text with its tokens (or words) highlighted in the terminal; with --html it
also writes the same as an HTML page, and with --save the raw relevance, both
atomically and nothing unasked. Classifiers and causal language models explain their
predicted class (or `--target`); a sentence encoder explains the similarity of the text
with the `--pair` text, each side in turn. A language model's prediction is read out at
the text's last token: as `explain generate` draws it, that token is marked, off the
scale, and a line names what the prediction rests on most, with positions and signed
values (explain.viz.ranking).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from torch import Tensor

from explain.cli.method_options import (
    add_method_arguments,
    methods_the_model_takes,
    parse_methods,
    score_for,
    start_layer_for,
)
from explain.cli.options import (
    Planned,
    add_model_arguments,
    add_save_option,
    check_planned,
    load,
    parse_index,
)
from explain.errors import InputError, TargetError

if TYPE_CHECKING:  # imported when the command runs: `explain --help` stays fast
    from explain.api import Explainer
    from explain.explanation import Explanation
    from explain.loading.specs import LoadedModel

__all__ = ["register"]


def _target(text: str | None, classes: Sequence[str] | None) -> int | None:
    """--target as a class index: a number or a class name (case-insensitive)."""
    if text is None:
        return None
    index = parse_index(text)
    if index is not None:
        return index
    names = [name.lower() for name in classes or ()]
    if text.lower() in names:
        return names.index(text.lower())
    known = f"; the classes are {', '.join(classes)}" if classes else ""
    raise TargetError(f"--target {text!r} is neither a class index nor a class name{known}")


def _label(index: int, classes: Sequence[str] | None, tokenizer) -> str:
    """A class name, or for a language model (no class names) the predicted token."""
    if classes and 0 <= index < len(classes):
        return classes[index]
    return repr(tokenizer.convert_ids_to_tokens([index])[0])


def _rows(
    tokens: list[list[str]], relevance: Tensor, tokenizer, words: bool, read_out_last: bool
) -> list[tuple[list[str], list[float], int | None]]:
    """(strings, scores, readout) per text: tokens, or words when `words` (special tokens
    dropped in both cases). `read_out_last` (a language model): the text's last token is
    where the prediction is read out, `readout` its index, kept a token of its own among
    words (its identity term is no word's evidence); otherwise `readout` is None."""
    from explain.inputs import skipped_tokens
    from explain.text import word_relevance

    special = skipped_tokens(tokenizer)
    rows = []
    for strings, scores in zip(tokens, relevance.cpu(), strict=True):
        kept = [i for i, token in enumerate(strings) if token not in special]
        last = kept[-1] if read_out_last and kept else None
        if words:
            before = strings if last is None else strings[:last]
            found = word_relevance(
                before, scores[: len(before)], special, "sum", tokenizer.convert_tokens_to_string
            )
            shown = [w.text for w in found]
            values = [w.relevance for w in found]
            if last is not None:
                shown.append(tokenizer.convert_tokens_to_string([strings[last]]))
                values.append(float(scores[last]))
        else:
            shown = [strings[i] for i in kept]
            values = [float(scores[i]) for i in kept]
        rows.append((shown, values, None if last is None else len(shown) - 1))
    return rows


READOUT_NOTE = (
    "a language model's prediction is read out at the text's last token (grey and underlined "
    "in the terminal, hatched on the page): its own identity term would swamp the rest, so "
    "it is off the scale and out of what the prediction rests on most, as `explain generate` "
    "draws it"
)
"""What `explain text` says once per method about a language model's readout token."""


def planned(args: argparse.Namespace, methods: list[str] | None = None) -> list[Planned]:
    """The --save file of each method (`methods`, default: those --method names)."""
    if not args.save_format:
        return []
    methods = parse_methods(args.method) if methods is None else methods
    return [Planned(args.out / f"text_{method}.{args.save_format}", "--save") for method in methods]


def run(args: argparse.Namespace) -> int:
    from explain.api import Explainer
    from explain.architectures.base import LanguageModel
    from explain.export import atomic_write
    from explain.rules.display import display_values, scale_note
    from explain.viz.ranking import rests_on, sources_text
    from explain.viz.text import document_html, note_html, printable, to_html, to_terminal

    parse_methods(args.method)  # unknown names fail before the model is loaded
    loaded = load(args)
    if loaded.modality == "image_text":
        raise InputError(f"{args.model} is an image-text model; use `explain clip`")
    if loaded.modality != "text" or loaded.tokenizer is None:
        raise InputError(f"{args.model} is not a text model with a tokenizer; see `explain image`")
    explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
    language_model = isinstance(explainer.adapter, LanguageModel)
    methods = methods_the_model_takes(args.method, explainer.adapter, args.model)
    if args.method is None:  # the default's --save files are named now
        check_planned(planned(args, methods))
    encoder = getattr(explainer.adapter, "pooled_by_mean", False)
    if encoder != (args.pair is not None):
        raise InputError(
            "--pair TEXT is for sentence encoders (it explains the similarity of each text "
            "with TEXT)"
            if not encoder
            else f"{args.model} is a sentence encoder: give --pair TEXT to explain the "
            "similarity of each text with TEXT"
        )
    if args.pair is not None and (args.target is not None or args.score is not None):
        raise InputError(
            "--pair explains the cosine similarity of each text with TEXT: it takes no "
            "--target or --score"
        )
    starts = {method: start_layer_for(method, args.start_layer) for method in methods}
    given_scores = {method: score_for(method, args.score) for method in methods}
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    fragments = []
    for method, start in starts.items():
        titles, tokens, relevance, result = _explain(
            explainer, loaded, args, method, start, given_scores[method]
        )
        note = scale_note(method, raw=args.raw_values)
        shown = display_values(method, relevance, raw=args.raw_values)
        rows = _rows(tokens, shown, loaded.tokenizer, args.words, language_model)
        if len(methods) > 1:  # one heading per method; the titles below stay short
            print(f"[{method}]")
            fragments.append(f"<h2>{method}</h2>")
        for said in (note, READOUT_NOTE if language_model else None):
            if said is not None:
                print(f"note: {said}")
                fragments.append(note_html(said))
        for title, (strings, scores, readout) in zip(titles, rows, strict=True):
            print(f"{printable(title)}:")
            if colour:
                print(f"  {to_terminal(strings, scores, readout=readout)}")
            else:
                # a sign only on signed maps: "+" on a method that is never negative
                # would suggest a "for" it cannot tell from "against"
                form = "+.3g" if any(v < 0 for v in scores) else ".3g"
                pairs = [
                    f"{printable(s)}({v:{form}})" for s, v in zip(strings, scores, strict=True)
                ]
                if readout is not None:
                    pairs[readout] = f"{printable(strings[readout])}(read out here, off the scale)"
                print("  " + " ".join(pairs))
            sources = None
            if readout is not None:  # the ranking `explain generate`'s views give
                sources = sources_text(strings, scores, rests_on(scores, readout))
                print(f"  rests most on: {sources}")
            fragments.append(
                to_html(strings, scores, title=title, readout=readout, sources=sources)
            )
        if args.save_format:
            path = args.out / f"text_{method}.{args.save_format}"
            settings = {"model": args.model, "texts": list(args.texts), **result.settings}
            dataclasses.replace(result, settings=settings).save(path)
            print(path)
    if args.html is not None:
        with atomic_write(args.html, "w") as handle:
            page_title = f"explain text: {args.model}, {', '.join(methods)}"
            handle.write(document_html(fragments, title=page_title))
        print(args.html)
    return 0


def _explain(
    explainer: Explainer,
    loaded: LoadedModel,
    args: argparse.Namespace,
    method: str,
    start_layer: int | None,
    score: str | None,
) -> tuple[list[str], list[list[str]], Tensor, Explanation]:
    """(a title per shown text, its tokens, its relevance, the Explanation for --save) for
    one method: each text's predicted class (or --target), or for a sentence encoder its
    similarity with --pair."""
    import torch

    from explain.explanation import Explanation
    from explain.text import similarity

    texts = list(args.texts)
    if args.pair is not None:
        found = similarity(explainer, texts, [args.pair] * len(texts), method, start_layer)
        titles = [f"similarity with the pair: {s:.3f}" for s in found.similarity.tolist()]
        titles.append("the pair, for the first text")
        tokens = [*found.tokens_a, found.tokens_b[0]]
        result = Explanation(
            relevance=found.relevance_a,
            logits=found.similarity[:, None],
            target=torch.zeros(len(texts), dtype=torch.long),
            method=found.method,
            score="cosine_similarity",
            relevances={"text": found.relevance_a, "pair": found.relevance_b},
            tokens=found.tokens_a,
            settings={"pair": args.pair, "pair_tokens": found.tokens_b},
        )
        return titles, tokens, torch.cat([found.relevance_a, found.relevance_b[:1]]), result
    result = explainer.explain(
        texts,
        target=_target(args.target, loaded.classes),
        method=method,
        score=score,
        start_layer=start_layer,
    )
    probabilities = result.logits.softmax(-1)
    titles = [
        f"{_label(cls, loaded.classes, loaded.tokenizer)} (p = {float(probabilities[b, cls]):.3f})"
        for b, cls in enumerate(result.target.tolist())
    ]
    return titles, result.tokens, result.relevance, result


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "text",
        help="highlight the words a text model's decision rests on",
        description=__doc__,
        epilog=(
            'Example: explain text "A warm, funny film." --model zoo:minilm-sentiment --words; '
            'an encoder: explain text "a man plays guitar" --model PATH --pair "music on stage"'
        ),
    )
    parser.add_argument("texts", nargs="+", metavar="TEXT", help="one or more texts")
    add_model_arguments(
        parser,
        takes="a Hugging Face text model with its tokenizer: a classifier or a sentence encoder",
        examples="zoo:minilm-sentiment, "
        "distilbert/distilbert-base-uncased-finetuned-sst-2-english, "
        "sentence-transformers/all-MiniLM-L6-v2, ./my-bert",
    )
    add_method_arguments(
        parser, default=None, help="class index or name; default: the predicted class"
    )
    parser.add_argument(
        "--pair",
        default=None,
        metavar="TEXT",
        help="for sentence encoders: explain each text's similarity with TEXT; default: none",
    )
    parser.add_argument(
        "--words", action="store_true", help="sum sub-tokens into words; default: tokens"
    )
    parser.add_argument(
        "--raw-values",
        action="store_true",
        help="show full lrp's values as computed; default: divided by each text's largest "
        "magnitude, since its rules do not conserve relevance",
    )
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="terminal colours (auto: when printing to a terminal); default: %(default)s",
    )
    parser.add_argument(
        "--html",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the highlighted texts as an HTML page; default: not written",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("explanations"),
        metavar="DIR",
        help="folder of the --save file; default: %(default)s",
    )
    add_save_option(parser, "OUT/text_METHOD.FORMAT")
    parser.set_defaults(run=run, planned=planned)
