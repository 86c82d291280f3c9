"""`explain generate --image PHOTO "QUESTION" --model SPEC`: which part of the photo, and
which words of the question, each word of a vision-language model's answer rests on.

The question and the photo go through the model's processor and chat template as one
user message; the model answers greedily, and every word of the answer is explained from
one forward pass (explain.generation, explain.engine.plans.image_text) at the chosen depth.
Each map is drawn back on the photo with the processor's resize, crop and padding undone
(explain.inputs). Two files are written atomically: the page (click a word: its
map over the photo, the question's tokens coloured beside it) and a PNG of the answer's
words, each with its map; several methods (`--method a,b` or `all`) explain the same
answer, each into its own pair of files named with the method.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from explain.cli.answer_lines import print_rests_on
from explain.cli.method_options import method_file, methods_the_model_takes
from explain.cli.options import crop_caption, load_vision_language
from explain.errors import InputError

if TYPE_CHECKING:  # imported when the command runs: `explain --help` stays fast
    from PIL import Image

    from explain.api import Explainer
    from explain.generation import Generation
    from explain.loading.loaded_model import LoadedModel

__all__ = ["run"]


def _question_tokens(
    tokens: list[str], is_image: Tensor, text: Tensor, maps: Tensor
) -> tuple[list[str], Tensor]:
    """The question's tokens with each image shown as one "[image]" token carrying its
    map's sum, in place of its first run of image tokens (a photo split into tiles has a
    run per tile, the tiles' markers between them kept as tokens); `text` (G, T) and
    `maps` (G, k, gh, gw) per answer word."""
    starts = [t for t in range(len(tokens)) if is_image[t] and (t == 0 or not is_image[t - 1])]
    runs_per_image = len(starts) // maps.shape[1]
    first_runs = {start: index for index, start in enumerate(starts[::runs_per_image])}
    shown: list[str] = []
    columns: list[Tensor] = []
    for t, token in enumerate(tokens):
        if t in first_runs:
            shown.append("[image]")
            columns.append(maps[:, first_runs[t]].flatten(1).sum(dim=1))
        elif not is_image[t]:
            shown.append(token)
            columns.append(text[:, t])
    return shown, torch.stack(columns, dim=1)


def run(args: argparse.Namespace) -> int:
    from explain.api import Explainer
    from explain.generation import generate
    from explain.inputs import read_image

    if not args.prompt.strip():
        raise InputError("the question is empty: there is nothing to answer")
    photo = read_image(args.image)
    loaded = load_vision_language(args)
    explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
    methods = methods_the_model_takes(args.method, explainer.adapter, args.model, generation=True)
    # through the processor's chat template as a user message, where it has one; generated
    # once: every method explains the same answer
    generation = generate(explainer, {"image": photo, "text": args.prompt}, args.max_new_tokens)
    assert loaded.preprocessing is not None  # load_vision_language checks it
    seen = crop_caption(loaded.preprocessing, (photo.height, photo.width))
    if seen is not None:
        print(seen)  # the terminal says what the figures' captions say
    for index, method in enumerate(methods):
        heading = f"[{method}]" if len(methods) > 1 else None
        _one_method(args, loaded, explainer, photo, generation, method, index == 0, heading, seen)
    return 0


def _one_method(
    args: argparse.Namespace,
    loaded: LoadedModel,
    explainer: Explainer,
    photo: Image.Image,
    generation: Generation,
    method: str,
    first: bool,
    heading: str | None,
    seen: str | None,
) -> None:
    """For one method: the answer (printed by the `first` method only), then under its
    `heading` what each word rests on, the page, the figure (captioned with `seen`, what
    the model saw of a cropped photo: `crop_caption`) and the --save file."""
    from explain.export import atomic_write
    from explain.generation import explain_generation, rests_on
    from explain.viz import save_figure
    from explain.viz.image_answer import answer_figure, answer_html
    from explain.viz.scaling import maps_are_signed
    from explain.viz.text import printable

    found = explain_generation(explainer, generation, method=method, depth=args.depth or "lm")
    result = found.explanation
    answer = found.answer()
    count = len(answer.generated)
    images = result.relevances["image"][0, :count]
    images = images[:, None] if images.dim() == 3 else images  # (G, k, gh, gw)
    # one kind of scale for the method's maps, read on the patch grid (upsampling and the
    # unseen pixels' fill would decide it per word otherwise)
    signed = maps_are_signed(images[:, 0].detach().cpu())
    assert loaded.preprocessing is not None  # checked by run
    on_photo = loaded.preprocessing.to_original(images[:, 0], (photo.height, photo.width))
    first_real = generation.prompt_length - answer.prompt_length  # the prompt's left padding
    ids = generation.input_ids[0, first_real : generation.prompt_length]
    is_image = ids == explainer.adapter.image_token_id  # type: ignore[attr-defined]
    tokens, relevance = _question_tokens(
        answer.tokens[: answer.prompt_length],
        is_image,
        answer.relevance[:, : answer.prompt_length],
        images,
    )
    # The question as shown: word g is read out at the question's last token plus g, so
    # only the first word's readout token is among them.
    readout = len(tokens) - 1
    rests = [rests_on(relevance[g], readout + g) for g in range(count)]
    if first:
        print("answer:", printable(answer.text(loaded.tokenizer)))
    if heading is not None:
        print(heading)
    print_rests_on(answer.generated, tokens, relevance, rests)
    title = (
        f"explain generate: {args.model} ({result.method}, depth {result.settings['depth']}); "
        f"question: {args.prompt}"
    )
    pixels = np.asarray(photo)
    page = answer_html(
        pixels,
        on_photo,
        tokens,
        relevance,
        answer.generated,
        readout=readout,
        rests_on=rests,
        title=title,
        signed=signed,
    )
    html = method_file(args.html, method, args.method)
    with atomic_write(html, "w") as handle:
        handle.write(page)
    png = method_file(args.png, method, args.method) if args.png else html.with_suffix(".png")
    figure = answer_figure(
        pixels, on_photo, answer.generated, title=title, signed=signed, note=seen
    )
    save_figure(figure, png)
    print(html)
    print(png)
    if args.save_format:
        raw = method_file(args.out / f"generation.{args.save_format}", method, args.method)
        settings = {"model": args.model, "prompt": args.prompt, "image": str(args.image)}
        dataclasses.replace(result, settings={**result.settings, **settings}).save(raw)
        print(raw)
