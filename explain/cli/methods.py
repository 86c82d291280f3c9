"""`explain methods --model M`: the methods a model takes, and the one it runs when no
--method is given (its kind's default, explain.defaults) with the measurement that chose
it."""

from __future__ import annotations

import argparse

from explain.cli.options import add_model_arguments, load

__all__ = ["register"]


def run(args: argparse.Namespace) -> int:
    from explain.api import Explainer
    from explain.engine import Request, supported_methods

    loaded = load(args)
    explainer = Explainer(loaded.model)
    adapter = explainer.adapter
    chosen = explainer.default_method
    print(f"{args.model}: {adapter.family}")
    print(f"  kind: {chosen.kind}")
    print(f"  default method: {chosen.method}")
    print(f"  why: {chosen.why}")
    print(f"  methods it takes: {', '.join(supported_methods(adapter))}")
    generated = supported_methods(adapter, Request(prompt_length=1))
    if generated != supported_methods(adapter):
        print(f"  methods its generations take: {', '.join(generated)}")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "methods",
        help="the methods a model takes, and its default method with the reason",
        description=__doc__,
    )
    add_model_arguments(
        parser,
        takes="any model `explain` explains",
        examples="zoo:recall-llama, zoo:shapes-vit, ./my-llama",
        timm=True,
    )
    parser.set_defaults(run=run)
