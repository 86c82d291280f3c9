"""`explain seq2seq`: which source tokens each token of a translation or summary came from.

The decoder's text is given with `--target` or generated greedily. Every token of it is
explained from one forward pass (the encoder-decoder rules of ICCV 2021), and two figures
are written atomically: the (generated token) x (source token) relevance matrix and the
source text highlighted once per generated token (several methods, `--method a,b` or
`all`: each figure named with its method).
"""

from __future__ import annotations

import argparse
import dataclasses

from explain.cli.method_options import (
    add_method_option,
    method_file,
    methods_the_model_takes,
    named_methods,
    parse_methods,
)
from explain.cli.options import (
    Planned,
    add_model_arguments,
    add_out_argument,
    add_save_option,
    load,
    positive_int,
)
from explain.errors import InputError

__all__ = ["register"]


def planned(args: argparse.Namespace) -> list[Planned]:
    """The two figures and the --save file of every method."""
    files = []
    for method in named_methods(args.method):
        names = ["seq2seq_matrix.png", "seq2seq_source.png"]
        files += [Planned(method_file(args.out / n, method, args.method), "--out") for n in names]
        if args.save_format:
            raw = method_file(args.out / f"seq2seq.{args.save_format}", method, args.method)
            files.append(Planned(raw, "--save"))
    return files


def run(args: argparse.Namespace) -> int:
    import torch

    from explain.api import Explainer
    from explain.architectures.base import EncoderDecoder
    from explain.generation import generate_target
    from explain.viz import save_figure
    from explain.viz.multimodal import relevance_matrix_figure, source_text_figure
    from explain.viz.text import printable

    if not args.source.strip():
        raise InputError("the source text is empty")
    parse_methods(args.method)  # unknown names fail before the model is loaded
    loaded = load(args)
    explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
    tokenizer = loaded.tokenizer
    if not isinstance(explainer.adapter, EncoderDecoder) or tokenizer is None:
        raise InputError(
            f"{args.model} is not a text encoder-decoder with a tokenizer (BART, Marian, T5)"
        )
    source = dict(tokenizer([args.source], return_tensors="pt"))
    source.pop("token_type_ids", None)
    if args.target is None:
        inputs = generate_target(explainer, source, max_new_tokens=args.max_new_tokens)
    else:
        target_ids = tokenizer(text_target=[args.target], return_tensors="pt")["input_ids"]
        start = loaded.model.config.decoder_start_token_id
        decoder = torch.cat([torch.tensor([[start]]), target_ids], dim=1)
        inputs = {**source, "decoder_input_ids": decoder}
    mask = inputs.get("decoder_attention_mask")
    length = inputs["decoder_input_ids"].shape[1] if mask is None else int(mask[0].sum())
    if length < 2:
        raise InputError("the decoder text is empty: there is no token to explain")
    methods = methods_the_model_takes(args.method, explainer.adapter, args.model)
    decoder_ids = inputs["decoder_input_ids"][0, 1:length].tolist()
    explained = tokenizer.convert_ids_to_tokens(decoder_ids)
    source_tokens = tokenizer.convert_ids_to_tokens(source["input_ids"][0].tolist())
    print("target:", printable(tokenizer.decode(decoder_ids, skip_special_tokens=True)))
    for method in methods:
        result = explainer.explain(inputs, position="all", method=method)
        matrix = result.relevances["source"][0, : length - 1]
        if len(methods) > 1:
            print(f"[{method}]")
        for token, row in zip(explained, matrix, strict=True):
            top = row.topk(min(3, row.numel())).indices.tolist()
            print(f"  {token!r:>16} <- " + ", ".join(repr(source_tokens[i]) for i in top))
        matrix_figure = relevance_matrix_figure(
            matrix, source_tokens, explained, title=f"explain seq2seq: {args.model}, {method}"
        )
        outputs = {
            "seq2seq_matrix.png": matrix_figure,
            "seq2seq_source.png": source_text_figure(matrix, source_tokens, explained),
        }
        for name, figure in outputs.items():
            path = method_file(args.out / name, method, args.method)
            save_figure(figure, path)
            print(path)
        if args.save_format:
            settings = {"model": args.model, "source": args.source, "explained_tokens": explained}
            raw = method_file(args.out / f"seq2seq.{args.save_format}", method, args.method)
            dataclasses.replace(result, settings=settings).save(raw)
            print(raw)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "seq2seq",
        help="source relevance of every token a seq2seq model writes",
        description=__doc__,
        epilog='Example: explain seq2seq "the cat sat on the mat" --model marian-en-de',
    )
    parser.add_argument("source", metavar="TEXT", help="the source text")
    add_model_arguments(
        parser,
        takes="a Hugging Face seq2seq model with its tokenizer (BART, Marian, T5)",
        examples="Helsinki-NLP/opus-mt-en-de, facebook/bart-large-cnn, google-t5/t5-small, "
        "./my-marian",
    )
    parser.add_argument(
        "--target",
        metavar="TEXT",
        help="the decoder text to explain; default: the model's greedy generation",
    )
    add_method_option(parser)
    parser.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=20,
        metavar="N",
        help="length limit of the generation; default: %(default)s",
    )
    add_out_argument(parser)
    add_save_option(parser, "OUT/seq2seq.FORMAT")
    parser.set_defaults(run=run, planned=planned)
