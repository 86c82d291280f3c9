"""`explain models`: the zoo, the supported model families with the methods each takes
and its default, and the registered methods."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def run(args: argparse.Namespace) -> int:
    from explain.architectures.custom import CustomTransformer
    from explain.architectures.registry import adapter_classes
    from explain.defaults import default_method
    from explain.engine import supported_methods
    from explain.loading.zoo import WEIGHTS, ZOO, zoo_root
    from explain.rules import METHODS

    root = zoo_root()  # the checkout's models/, or the installed package's copy
    print(f"Zoo models (--model zoo:NAME; data, recipe and accuracy in {root}/NAME/card.md):")
    for name, entry in ZOO.items():
        missing = not (root / name / WEIGHTS).is_file()
        note = f"  [not trained here yet: python {entry.command}]" if missing else ""
        print(f"  zoo:{name:20s} {entry.summary}{note}")
    print("Supported model families, each with the methods it takes (--method all runs these):")
    lrp = sorted(name for name, spec in METHODS.items() if spec.lrp_rules)
    for adapter in [*reversed(adapter_classes()), CustomTransformer]:
        print(f"  {adapter.family}")
        methods = supported_methods(adapter)
        print(f"      methods: {', '.join(methods)}")
        if adapter.lrp_covers and set(lrp) <= set(methods):
            print(f"      ({', '.join(lrp)}: {adapter.lrp_covers} only)")
        print(f"      default: {default_method(adapter).method} (`explain methods --model M`)")
    print("  (out of scope: CvT, PVT, MaxViT and deformable attention, whose tokens mix outside")
    print("   attention maps; Swin is served above)")
    print("Methods (--method):")
    for name in sorted(METHODS):
        print(f"  {name:24s} {METHODS[name].summary}")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "models",
        help="list the zoo, the supported model families (with the methods each takes) and "
        "the methods",
        description=__doc__,
    )
    parser.set_defaults(run=run)
