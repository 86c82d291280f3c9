r"""`explain evaluate`: score methods with the perturbation, segmentation,
class-specific, ROAD, SaCo or rationale test, or against the known evidence of a
language model's or a vision-language model's answers.

    explain evaluate perturbation --model zoo:shapes-vit --method generic,rollout,random \
        --limit 500 --batch-size 16 --output results/shapes-perturbation.json
    explain evaluate class-specific --model zoo:shapes-vit --limit 256 \
        --output results/shapes-class-specific.json
    explain evaluate language-evidence --model ./my-llm --data answers.jsonl \
        --replacement the --output results/llm-evidence.json

Without --data a zoo model is scored on its own held-out set. The run shows a
progress bar, can be interrupted and rerun to resume (finished chunks are kept
in OUTPUT.parts/), and writes OUTPUT (JSON, atomically) with OUTPUT.md (a table)
and OUTPUT.png (the curves) next to it. Every number that ranks methods comes
with its bootstrap standard error, and the best value and those within noise of
it are bold in the table. Under `torchrun --nproc-per-node N explain evaluate
...` the data is sharded over the N processes and rank 0 writes the results.
"""

from __future__ import annotations

import argparse
import os
import sys

from explain.cli.method_options import ALL, add_method_option, parse_methods
from explain.cli.options import Planned, RawDescriptionHelpFormatter, add_model_arguments

__all__ = ["register"]

_PROTOCOLS = (
    "perturbation",
    "segmentation",
    "class-specific",
    "road",
    "saco",
    "rationale",
    "language-evidence",
    "vision-language-evidence",
)
"""The protocols' command-line names (explain.evaluation.PROTOCOLS, which this module does
not import before a command runs)."""


def planned(args: argparse.Namespace) -> list[Planned]:
    """The table, the curves and the work folder next to OUTPUT."""
    from explain.evaluation.runner import results_path, work_folder

    output = results_path(args.output)
    return [
        Planned(output.with_suffix(".md"), "--output"),
        Planned(output.with_suffix(".png"), "--output"),
        Planned(work_folder(output), "--output", folder=True),
    ]


def run(args: argparse.Namespace) -> int:
    from explain.evaluation.evaluate import evaluate_model

    # all: evaluate_model's default, every method the model takes in this test
    methods = None if args.method.strip() == ALL else parse_methods(args.method)
    results = evaluate_model(
        args.protocol,
        args.model,
        args.output,
        methods=methods,
        data=args.data,
        limit=args.limit,
        batch_size=args.batch_size,
        forward_batch=args.forward_batch,
        auc_range=args.auc_range,
        split=args.split,
        length=args.length,
        depth=args.depth,
        replacement=args.replacement,
        device=None if args.device == "auto" else args.device,
        dtype=args.dtype,
        offline=args.offline,
        allow_missing_weights=args.allow_missing_weights,
        # No bar when stderr is piped or redirected: its carriage-return updates would
        # interleave with the printed table in one log.
        progress=not args.quiet and sys.stderr.isatty(),
    )
    if not args.quiet and os.environ.get("RANK", "0") == "0":  # one table under torchrun
        from explain.evaluation import PROTOCOLS
        from explain.evaluation.report import markdown_table

        print(markdown_table(results, PROTOCOLS[args.protocol].columns), end="")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "evaluate",
        help="score methods with the perturbation, segmentation, class-specific, ROAD, SaCo or "
        "rationale test, or against the known evidence of a (vision-)language model's answers",
        description=__doc__,
        formatter_class=RawDescriptionHelpFormatter,
    )
    parser.add_argument("protocol", choices=list(_PROTOCOLS))
    add_model_arguments(
        parser,
        takes="the model to score",
        timm=True,
        examples="zoo:shapes-vit, zoo:minilm-sentiment, deit_small_patch16_224, ./my-model",
    )
    add_method_option(parser, ALL, "--methods")
    parser.add_argument(
        "--data",
        help="an ImageNet validation folder (perturbation, road, saco), gtsegs_ijcv.mat "
        "(segmentation), an ERASER movies folder (rationale) or a JSON lines file of answer "
        "examples (language-evidence), see the README's 'Evaluation data' for where to get "
        "each; default: a zoo model's held-out set",
    )
    parser.add_argument("--split", default="test", help="ERASER split (default: test)")
    parser.add_argument("--limit", type=int, help="evaluate only the first N examples")
    parser.add_argument(
        "--batch-size", type=int, default=16, help="examples per chunk (default: 16)"
    )
    parser.add_argument(
        "--forward-batch",
        type=int,
        help="most perturbed inputs per forward pass (default: a whole chunk's images; 32 "
        "prompts for the evidence tests)",
    )
    parser.add_argument(
        "--length",
        type=int,
        help="language-evidence on a zoo model: the held-out prompts' length in tokens "
        "(default: the data set's)",
    )
    parser.add_argument(
        "--depth",
        choices=["lm", "tower"],
        default="lm",
        help="vision-language-evidence: explain through the language model only, or on "
        "through the vision tower (default: lm)",
    )
    parser.add_argument(
        "--replacement",
        metavar="TOKEN",
        help="language-evidence: the token that replaces removed tokens (default: the data "
        "set's, else the tokenizer's unknown or pad token)",
    )
    parser.add_argument(
        "--auc-range",
        choices=["0-90", "10-90"],
        default="0-90",
        help="what the perturbation, class-specific and ROAD AUCs integrate over: from the "
        "unperturbed image (x = 0, at most 90) or over 10%%-90%% removed only (at most 80) "
        "(default: 0-90)",
    )
    parser.add_argument("--output", required=True, help="the results JSON file")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    parser.set_defaults(run=run, planned=planned)
