"""One process of the sharded-evaluation test (and the recipe of its 1-process reference).

torchrun --nproc-per-node N evaluation_worker.py WEIGHTS OUT_FOLDER
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from evaluation_fixtures import MEAN, STD, SquaresDataset, squares_model

from explain.evaluation import PerturbationTest, SegmentationTest, run_evaluation


def evaluate_squares(model: torch.nn.Module, folder: Path) -> None:
    """Both image protocols on 7 squares in chunks of 2, into folder/PROTOCOL.json."""
    for protocol in (PerturbationTest, SegmentationTest):
        run_evaluation(
            protocol(model, MEAN, STD),
            SquaresDataset(7),
            ["generic", "rollout", "random"],
            folder / f"{protocol.name}.json",
            model_name="tiny",
            batch_size=2,
            progress=False,
        )


if __name__ == "__main__":
    torch.set_num_threads(1)
    model = squares_model()
    model.load_state_dict(torch.load(sys.argv[1]))
    evaluate_squares(model.eval(), Path(sys.argv[2]))
