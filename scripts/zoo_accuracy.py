"""Re-measure the held-out accuracy of every zoo model, and optionally write it into the cards.

    .venv/bin/python scripts/zoo_accuracy.py                 # print a table
    .venv/bin/python scripts/zoo_accuracy.py --update-cards  # and rewrite the cards' section

Each card's accuracy section sits between the markers below and is only ever written by
this script, so the number a card quotes is the number this script measures. Models whose
evidence is known (their `ZooEvaluation.evidence_check`) get a second section: the
known-evidence check's table.
"""

from __future__ import annotations

import argparse
import re
import time

import torch

from explain.evaluation import heldout_accuracy
from explain.evaluation.zoo import zoo_evaluation
from explain.export import atomic_write
from explain.loading.zoo import CARD, ZOO, load_zoo_model, zoo_root

BEGIN = "<!-- heldout-accuracy: written by scripts/zoo_accuracy.py -->"
END = "<!-- /heldout-accuracy -->"
EVIDENCE_BEGIN = "<!-- evidence-check: written by scripts/zoo_accuracy.py -->"
EVIDENCE_END = "<!-- /evidence-check -->"


def section(name: str, accuracy, seconds: float) -> str:
    lines = [
        BEGIN,
        f"Held-out accuracy: **{100 * accuracy.accuracy:.2f}%** "
        f"({zoo_evaluation(name).headline}; "
        f"{accuracy.count} held-out examples; measured by `scripts/zoo_accuracy.py` in "
        f"{seconds:.0f} s).",
    ]
    if accuracy.details:
        lines.append("")
        lines.extend(f"- {key}: {100 * value:.2f}%" for key, value in accuracy.details.items())
    lines.append(END)
    return "\n".join(lines)


def replace_section(name: str, begin: str, end: str, text: str) -> None:
    """Rewrite the card's section between `begin` and `end` (markers included) as `text`."""
    card = zoo_root() / name / CARD
    content = card.read_text()
    found = re.search(re.escape(begin) + ".*?" + re.escape(end), content, re.DOTALL)
    if found is None:
        raise SystemExit(f"{card} has no section {begin} ... {end}")
    with atomic_write(card, "w") as handle:
        handle.write(content[: found.start()] + text + content[found.end() :])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("names", nargs="*", default=sorted(ZOO), help="zoo models (default: all)")
    parser.add_argument(
        "--count", type=int, default=None, help="held-out examples (default: card's)"
    )
    parser.add_argument("--update-cards", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    print("| model | held-out accuracy | examples |")
    print("|---|---|---|")
    for name in args.names:
        started = time.time()
        accuracy = heldout_accuracy(name, args.count)
        seconds = time.time() - started
        print(f"| {name} | {100 * accuracy.accuracy:.2f}% | {accuracy.count} |", flush=True)
        for key, value in accuracy.details.items():
            print(f"|   {key} | {100 * value:.2f}% | |")
        if args.update_cards:
            replace_section(name, BEGIN, END, section(name, accuracy, seconds))
        check = zoo_evaluation(name).evidence_check
        if check is not None:
            started = time.time()
            count = args.count or zoo_evaluation(name).count
            table = check(load_zoo_model(name), count).table()
            print(table, flush=True)
            if args.update_cards:
                text = (
                    f"{EVIDENCE_BEGIN}\nKnown-evidence check on the first {count} held-out "
                    f"examples, over those answered right (measured by "
                    f"`scripts/zoo_accuracy.py` in {time.time() - started:.0f} s; each cell: "
                    f"share of edits, and how many):\n\n{table}\n{EVIDENCE_END}"
                )
                replace_section(name, EVIDENCE_BEGIN, EVIDENCE_END, text)


if __name__ == "__main__":
    main()
