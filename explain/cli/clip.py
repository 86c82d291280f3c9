"""`explain clip`: why a CLIP model matches images with texts.

Every image is explained against every `--text` (zero-shot prompts): one figure per image
with, per text, the image's heatmap and the text's highlighted tokens, titled with the
text's zero-shot probability. Figures are written atomically, one PNG per image and
method (several methods, `--method a,b` or `all`: each PNG named with its method).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

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
    opacity,
)
from explain.errors import InputError

__all__ = ["register"]


def planned(args: argparse.Namespace) -> list[Planned]:
    """Per image: its figure and its --save file."""
    from explain.cli.image import collect_images, unique_stems

    suffixes = ["png", *([args.save_format] if args.save_format else [])]
    return [
        Planned(
            method_file(args.out / f"{stem}_clip.{suffix}", method, args.method),
            "--save" if suffix == args.save_format else "--out",
        )
        for stem in unique_stems(collect_images(args.inputs))
        for method in named_methods(args.method)
        for suffix in suffixes
    ]


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import torch
    from tqdm import tqdm

    from explain.api import Explainer
    from explain.architectures.dual_encoder import DualEncoder
    from explain.cli.image import collect_images, unique_stems
    from explain.inputs import read_image, skipped_tokens
    from explain.viz import check_style, save_figure
    from explain.viz.multimodal import clip_figure

    check_style(args.cmap, args.alpha)
    parse_methods(args.method)  # unknown names fail before the model is loaded
    if not args.text:
        raise InputError("give at least one --text to compare the images with")
    if not all(text.strip() for text in args.text):
        raise InputError("a --text is empty: give each prompt some words")
    paths = collect_images(args.inputs)
    loaded = load(args)
    explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
    preprocessing = loaded.preprocessing
    if (
        not isinstance(explainer.adapter, DualEncoder)
        or loaded.tokenizer is None
        or preprocessing is None
    ):
        raise InputError(f"{args.model} is not a CLIP model with a tokenizer; `explain models`")
    methods = methods_the_model_takes(args.method, explainer.adapter, args.model)
    texts = loaded.tokenizer(list(args.text), padding=True, return_tensors="pt")
    special = set(loaded.tokenizer.convert_tokens_to_ids(sorted(skipped_tokens(loaded.tokenizer))))
    shown = [
        [
            i
            for i, (t, m) in enumerate(zip(ids.tolist(), mask.tolist(), strict=True))
            if m and t not in special
        ]
        for ids, mask in zip(texts["input_ids"], texts["attention_mask"], strict=True)
    ]
    words = [
        loaded.tokenizer.convert_ids_to_tokens(texts["input_ids"][k, kept].tolist())
        for k, kept in enumerate(shown)
    ]
    start = {"image": args.image_start_layer, "text": args.text_start_layer}
    start = {tower: layer for tower, layer in start.items() if layer is not None}
    every_text = torch.arange(len(args.text))
    stems = unique_stems(paths)
    # The bar opens once the first image is explained (a method this model cannot take
    # fails before it), and only on a terminal (disable=None): piped output stays clean.
    bar = None
    for path, stem in zip(paths, stems, strict=True):
        photo = read_image(path)
        pixels = preprocessing([photo])
        display = np.asarray(photo)  # the maps are drawn over the file at its resolution
        for method in methods:
            result = explainer.explain(
                {**texts, "pixel_values": pixels},
                target=every_text[None],
                method=method,
                start_layer=start or None,
            )
            probabilities = result.logits.softmax(dim=-1)[0]
            heatmaps = preprocessing.heatmap(result.relevance[0], display.shape[:2])
            scores = [result.relevances["text"][0, k, kept] for k, kept in enumerate(shown)]
            labels = [
                f"{text}  p={float(p):.2f}"
                for text, p in zip(args.text, probabilities, strict=True)
            ]
            figure = clip_figure(
                display,
                heatmaps,
                words,
                scores,
                labels=labels,
                cmap=args.cmap,
                alpha=args.alpha,
                title=f"{path.name}: {method}",
            )
            out = method_file(args.out / f"{stem}_clip.png", method, args.method)
            save_figure(figure, out)
            if args.save_format:
                settings = {"model": args.model, "input": str(path), "texts": list(args.text)}
                raw = method_file(args.out / f"{stem}_clip.{args.save_format}", method, args.method)
                dataclasses.replace(result, settings=settings).save(raw)
                tqdm.write(str(raw))
            best = int(probabilities.argmax())
            chosen = f"{args.text[best]!r} (p={float(probabilities[best]):.2f})"
            tqdm.write(f"{path}: {chosen} -> {out}")
        if bar is None:
            bar = tqdm(
                total=len(paths), unit="image", desc="explaining", file=sys.stderr, disable=None
            )
        bar.update(1)
    if bar is not None:
        bar.close()
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "clip",
        help="image and text relevance of a CLIP model for images against prompts",
        description=__doc__,
        epilog='Example: explain clip photo.jpg --text "a dog" --text "a cat" --model clip-folder',
    )
    parser.add_argument("inputs", nargs="+", metavar="IMAGE|DIR", help="image files or folders")
    parser.add_argument(
        "--text", action="append", required=True, metavar="TEXT", help="a prompt (repeatable)"
    )
    add_model_arguments(
        parser,
        takes="an image-text model with its tokenizer (CLIP, SigLIP, open_clip)",
        timm=True,
        examples="zoo:shapes-clip, openai/clip-vit-base-patch32, "
        "google/siglip-base-patch16-224, ./my-clip",
    )
    add_method_option(parser)  # each method explains both towers
    parser.add_argument(
        "--image-start-layer",
        type=int,
        metavar="L",
        help="first vision block (negative: from the end); default: the last block",
    )
    parser.add_argument(
        "--text-start-layer",
        type=int,
        metavar="L",
        help="first text block (negative: from the end); default: the last block",
    )
    parser.add_argument("--cmap", default="inferno", help="heatmap colormap; default: %(default)s")
    parser.add_argument(
        "--alpha",
        type=opacity,
        default=0.8,
        help="heatmap opacity where the relevance is highest; default: %(default)s",
    )
    add_out_argument(parser)
    add_save_option(parser, "OUT/STEM_clip.FORMAT per image")
    parser.set_defaults(run=run, planned=planned)
