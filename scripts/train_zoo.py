"""Retrain every zoo model from its seed: each model's training script with its arguments
(its config's `training.script` and `training.arguments`), one after the other in name
order (recall-llama before the twohop-llama it warm-starts), as `make zoo` does before
re-measuring the cards.

    .venv/bin/python scripts/train_zoo.py          # retrain them all (CPU hours)
    .venv/bin/python scripts/train_zoo.py --list   # print the commands only
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from explain.loading.zoo import ZOO

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--list", action="store_true", help="print the commands, run none")
    args = parser.parse_args()
    for name, entry in ZOO.items():
        command = [sys.executable, entry.script, *entry.arguments]
        print(f"{name}: {' '.join(command)}", flush=True)
        if not args.list:
            subprocess.run(command, cwd=ROOT, check=True)


if __name__ == "__main__":
    main()
