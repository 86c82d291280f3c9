"""scripts/train_recall_lm.py's warm start: a deeper Llama takes a trained zoo model's
token embeddings, final norm and, block by block, the trained block it names (or keeps its
fresh initialisation), and a block list that does not match the depth is refused."""

from __future__ import annotations

import pytest
import torch
from script_modules import script_module

from explain.loading.zoo import build_model, load_zoo_model, zoo_root

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def train_recall_lm():
    """scripts/train_recall_lm.py as a module."""
    with script_module("train_recall_lm") as module:
        yield module


def test_parse_blocks_reads_copies_and_fresh_blocks(train_recall_lm):
    assert train_recall_lm.parse_blocks("0,1,0,1", 4) == [0, 1, 0, 1]
    assert train_recall_lm.parse_blocks("0,1,-,-", 4) == [0, 1, None, None]
    with pytest.raises(SystemExit, match="names 3 blocks; --depth is 4"):
        train_recall_lm.parse_blocks("0,1,0", 4)


def test_warm_start_copies_the_named_blocks_and_leaves_fresh_ones(train_recall_lm):
    trained = load_zoo_model("recall-llama").model.state_dict()
    settings = train_recall_lm.config(128, 4, 4, 128**-0.5, 512, 10000.0, 2)
    torch.manual_seed(0)
    model = build_model(settings)
    fresh = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    train_recall_lm.warm_start(model, zoo_root() / "recall-llama", [1, None, 0, 1])
    after = model.state_dict()
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        assert torch.equal(after[name], trained[name]), name
    for block, source in enumerate([1, None, 0, 1]):
        for name, tensor in after.items():
            if not name.startswith(f"model.layers.{block}."):
                continue
            if source is None:
                assert torch.equal(tensor, fresh[name]), name
            else:
                copied = name.replace(f"layers.{block}.", f"layers.{source}.", 1)
                assert torch.equal(tensor, trained[copied]), name
