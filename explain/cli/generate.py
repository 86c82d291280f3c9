"""`explain generate`: what every token a language model writes rests on.

The model continues the prompt greedily (with `--chat`, the prompt is a user message put
through the tokenizer's chat template); every generated token is explained over the
prompt and the tokens before it from one forward pass (explain.generation). Two files
are written atomically into --out: a static HTML page where choosing a generated token
highlights its relevance over everything before it, and a PNG of the (generated token) x
(token) relevance matrix. Several methods (`--method a,b` or `all`) explain the same
continuation, each into its own pair of files named with the method (generation_attnlrp.html).

The model is a Hugging Face ...ForCausalLM folder (save_pretrained, with its tokenizer) or
hub id; explain.testing.tiny_lm.save_tiny_lm writes a tiny random one for trying the
command offline. The terminal prints the continuation (every token the model wrote,
special ones included) and what each generated token rests on most, by |relevance|, with
positions and signed values, the token it is read out at left out: the page and the
figure's numbered cells show the same ranking (explain.viz.ranking).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from explain.cli import image_answer
from explain.cli.answer_lines import print_rests_on
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


def _page(args: argparse.Namespace) -> Path:
    """The HTML page: --html, or generation.html in --out (the figure goes beside it)."""
    return args.html or args.out / "generation.html"


def planned(args: argparse.Namespace) -> list[Planned]:
    """Per method: the page when it goes into --out, the figure named after the page
    (without --png) and the --save file."""
    files = []
    for method in named_methods(args.method):
        page = method_file(_page(args), method, args.method)
        png = method_file(args.png, method, args.method) if args.png else page.with_suffix(".png")
        files += [
            Planned(page, "--html" if args.html else "--out"),
            Planned(png, "--png" if args.png else "--html"),
        ]
        if args.save_format:
            raw = args.out / f"generation.{args.save_format}"
            files.append(Planned(method_file(raw, method, args.method), "--save"))
    return files


def run(args: argparse.Namespace) -> int:
    from explain.api import Explainer
    from explain.export import atomic_write
    from explain.generation import explain_generation, generate
    from explain.viz import save_figure
    from explain.viz.generation import generation_html
    from explain.viz.generation_figure import generation_figure
    from explain.viz.text import printable

    # The page and the figure go into --out unless named (both kinds of answer).
    args.html = _page(args)
    parse_methods(args.method)  # unknown names fail before the model is loaded
    if args.image is not None:  # a vision-language model's answer about a photo
        return image_answer.run(args)
    if args.depth is not None:
        raise InputError("--depth is for vision-language models, with --image")
    if not args.prompt.strip():
        raise InputError("the prompt is empty: there is nothing to continue")
    loaded = load(args)
    if loaded.modality != "text" or loaded.tokenizer is None:
        raise InputError(f"{args.model} is not a text model with a tokenizer")
    explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
    methods = methods_the_model_takes(args.method, explainer.adapter, args.model, generation=True)
    prompt = [{"role": "user", "content": args.prompt}] if args.chat else args.prompt
    # generated once: every method explains the same continuation
    generation = generate(explainer, prompt, max_new_tokens=args.max_new_tokens)
    title = f"explain generate: {args.model}"
    for index, method in enumerate(methods):
        found = explain_generation(explainer, generation, method=method)
        answer = found.answer()
        if index == 0:
            print("continuation:", printable(answer.text(loaded.tokenizer)))
        if len(methods) > 1:
            print(f"[{method}]")
        rests = [answer.rests_on(g) for g in range(len(answer.generated))]
        print_rests_on(answer.generated, answer.tokens, answer.relevance, rests)
        html = method_file(args.html, method, args.method)
        page = generation_html(
            answer.tokens,
            answer.prompt_length,
            answer.relevance,
            method=method,
            title=title,
            rests_on=rests,
        )
        with atomic_write(html, "w") as handle:
            handle.write(page)
        png = method_file(args.png, method, args.method) if args.png else html.with_suffix(".png")
        figure = generation_figure(
            answer.relevance, answer.tokens, answer.prompt_length, method=method, title=title
        )
        save_figure(figure, png)
        print(html)
        print(png)
        if args.save_format:
            raw = method_file(args.out / f"generation.{args.save_format}", method, args.method)
            settings = {"model": args.model, "prompt": args.prompt, "chat": args.chat}
            dataclasses.replace(found.explanation, settings=settings).save(raw)
            print(raw)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "generate",
        help="explain every token a language model generates",
        description=__doc__,
        epilog='Example: explain generate "The capital of France is" --model ./my-llama '
        "--out answers (writes answers/generation.html and answers/generation.png). Offline, "
        'explain.testing.tiny_lm.save_tiny_lm("tiny-llama") saves a tiny random Llama folder '
        "to try it on (README, Language models). A photo: explain generate --image "
        'photo.jpg "What is in the picture?" --model PATH (offline, '
        'explain.testing.tiny_vlm.save_tiny_llava("tiny-llava") saves a tiny random LLaVA '
        "with its processor: README, Vision-language models)",
    )
    parser.add_argument(
        "prompt", metavar="PROMPT", help="the text to continue (with --image: the question)"
    )
    parser.add_argument(
        "--image",
        type=Path,
        default=None,
        metavar="PHOTO",
        help="a photo to ask a vision-language model (LLaVA) about: the page shows each "
        "answer word's map over the photo (explain.cli.image_answer)",
    )
    parser.add_argument(
        "--depth",
        choices=("lm", "tower"),
        default=None,
        help="with --image: read the image map off the language model ('lm', default) or "
        "continue it through the vision tower ('tower')",
    )
    add_model_arguments(
        parser,
        takes="a Hugging Face decoder-only language model with its tokenizer "
        "(a ...ForCausalLM: Llama, Qwen, Mistral, Gemma, Phi, GPT-2 ...), or with --image "
        "a vision-language model with its processor (LlavaForConditionalGeneration)",
        examples="./my-llama (a save_pretrained folder), HuggingFaceTB/SmolLM2-135M, gpt2, "
        "llava-hf/llava-1.5-7b-hf",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=20,
        metavar="N",
        help="length limit of the generation; default: %(default)s",
    )
    parser.add_argument(
        "--chat",
        action="store_true",
        help="send the prompt as a user message through the tokenizer's chat template; "
        "default: the plain prompt",
    )
    add_method_option(parser)
    parser.add_argument(
        "--html",
        type=Path,
        default=None,
        help="HTML page to write (several methods: one per method, named PAGE_METHOD.html); "
        "default: OUT/generation.html",
    )
    parser.add_argument(
        "--png",
        type=Path,
        default=None,
        help="relevance matrix figure; default: the page's name with .png",
    )
    add_out_argument(parser)
    add_save_option(parser, "OUT/generation.FORMAT (every generated token's relevance)")
    parser.set_defaults(run=run, planned=planned)
