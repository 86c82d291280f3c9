"""One process of the sharded-evaluation test: `torchrun ... evaluation_worker.py OUT.json`."""

from __future__ import annotations

import sys

from evaluation_fixtures import MEAN, STD, SquaresDataset, squares_model

from explain.evaluation import PerturbationTest, run_evaluation

if __name__ == "__main__":
    protocol = PerturbationTest(squares_model(), MEAN, STD)
    run_evaluation(
        protocol,
        SquaresDataset(7),
        ["generic", "rollout"],
        sys.argv[1],
        model_name="tiny",
        batch_size=2,
        progress=False,
    )
