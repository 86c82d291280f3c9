"""`explain text`: which words of a text made a text model decide as it did.

Prints each text with its tokens (or words) highlighted in the terminal and writes the
same as an HTML page, atomically. Classifiers and causal language models explain their
predicted class (or `--target`); a sentence encoder explains the similarity of the text
with the `--pair` text, each side in turn.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from torch import Tensor

from explain.cli.options import add_model_arguments, load
from explain.errors import InputError, TargetError

__all__ = ["register"]


def _target(text: str | None, classes: Sequence[str] | None) -> int | None:
    """--target as a class index: a number or a class name (case-insensitive)."""
    if text is None:
        return None
    if text.lstrip("-").isdigit():
        return int(text)
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
    tokens: list[list[str]], relevance: Tensor, tokenizer, words: bool
) -> list[tuple[list[str], list[float]]]:
    """(strings, scores) per text: tokens, or words when `words` (special tokens dropped
    in both cases)."""
    from explain.text import word_relevance

    special = set(tokenizer.all_special_tokens)
    rows = []
    for strings, scores in zip(tokens, relevance.cpu(), strict=True):
        if words:
            found = word_relevance(
                strings, scores, special, "sum", tokenizer.convert_tokens_to_string
            )
            rows.append(([w.text for w in found], [w.relevance for w in found]))
        else:
            kept = [i for i, token in enumerate(strings) if token not in special]
            rows.append(([strings[i] for i in kept], [float(scores[i]) for i in kept]))
    return rows


def run(args: argparse.Namespace) -> int:
    import torch

    from explain.api import Explainer
    from explain.io import atomic_write
    from explain.text import similarity
    from explain.viz.text import document_html, to_html, to_terminal

    loaded = load(args)
    if loaded.modality == "image_text":
        raise InputError(f"{args.model} is an image-text model; use `explain clip`")
    if loaded.modality != "text" or loaded.tokenizer is None:
        raise InputError(f"{args.model} is not a text model with a tokenizer; see `explain image`")
    explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
    encoder = getattr(explainer.adapter, "pooled_by_mean", False)
    if encoder != (args.pair is not None):
        raise InputError(
            "--pair TEXT is for sentence encoders (it explains the similarity of each text "
            "with TEXT)"
            if not encoder
            else f"{args.model} is a sentence encoder: give --pair TEXT to explain the "
            "similarity of each text with TEXT"
        )
    texts = list(args.texts)
    titles: list[str] = []
    if encoder:
        found = similarity(
            explainer, texts, [args.pair] * len(texts), args.method, args.start_layer
        )
        tokens = [*found.tokens_a, found.tokens_b[0]]
        relevance = torch.cat([found.relevance_a, found.relevance_b[:1]])
        titles = [f"similarity with the pair: {s:.3f}" for s in found.similarity.tolist()]
        titles.append("the pair, for the first text")
        rows = _rows(tokens, relevance, loaded.tokenizer, args.words)
    else:
        result = explainer.explain(
            texts,
            target=_target(args.target, loaded.classes),
            method=args.method,
            score=args.score,
            start_layer=args.start_layer,
        )
        probabilities = result.logits.softmax(-1)
        for b, cls in enumerate(result.target.tolist()):
            label = _label(cls, loaded.classes, loaded.tokenizer)
            titles.append(f"{label} (p = {float(probabilities[b, cls]):.3f})")
        rows = _rows(result.tokens, result.relevance, loaded.tokenizer, args.words)
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    fragments = []
    for title, (strings, scores) in zip(titles, rows, strict=True):
        print(f"{title}:")
        if colour:
            print(f"  {to_terminal(strings, scores)}")
        else:
            print("  " + " ".join(f"{s}({v:+.3g})" for s, v in zip(strings, scores, strict=True)))
        fragments.append(to_html(strings, scores, title=title))
    with atomic_write(args.html, "w") as handle:
        handle.write(document_html(fragments, title=f"explain text: {args.model}"))
    print(args.html)
    return 0


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
        takes="a Hugging Face text model with its tokenizer: a classifier "
        "(distilbert/distilbert-base-uncased-finetuned-sst-2-english, zoo:minilm-sentiment) "
        "or a sentence encoder",
    )
    parser.add_argument("--method", default="generic", help="a method name (explain models)")
    parser.add_argument("--target", default=None, help="class index or name (default: predicted)")
    parser.add_argument(
        "--score",
        default="logit",
        choices=("logit", "probability", "log_probability"),
        help="what is differentiated for the explained class (default: logit)",
    )
    parser.add_argument("--start-layer", type=int, default=None, help="first block aggregated")
    parser.add_argument("--pair", default=None, metavar="TEXT", help="for sentence encoders")
    parser.add_argument("--words", action="store_true", help="sum sub-tokens into words")
    parser.add_argument(
        "--color", choices=("auto", "always", "never"), default="auto", help="terminal colours"
    )
    parser.add_argument(
        "--html", type=Path, default=Path("explain_text.html"), help="HTML page to write"
    )
    parser.set_defaults(run=run)
