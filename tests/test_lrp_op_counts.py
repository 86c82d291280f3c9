"""The LRP methods dispatch at most 4x the ops of the floor (one forward and one
input-gradient backward of the same model and inputs), and as many ops for any batch:
all samples walk together (issue 22, item 5). Counted on CPU: on a GPU each op is a
kernel launch (tests/op_counts.py)."""

from __future__ import annotations

import pytest
import torch
from op_counts import count_ops, floor_ops
from reference_hf import padded_batch, tiny_text_model

from explain import Explainer
from explain.testing import tiny_vit

LRP_METHODS = ["transformer_attribution", "partial_lrp", "lrp"]
MAX_RATIO = 4.0


def _images(batch: int) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def _explain_ops(explainer: Explainer, inputs, method: str) -> int:
    explainer.explain(inputs, method=method, target=1)  # first-call set-up is not counted
    return count_ops(lambda: explainer.explain(inputs, method=method, target=1)).total


@pytest.mark.parametrize("depth", [2, 6])
def test_vit_lrp_methods_within_four_times_the_floor(depth):
    model = tiny_vit(depth=depth, num_heads=2)
    images = _images(2)
    floor = floor_ops(model, images, 1).total
    explainer = Explainer(model)
    for method in LRP_METHODS:
        ops = _explain_ops(explainer, images, method)
        assert ops <= MAX_RATIO * floor, f"{method}: {ops} ops, floor {floor}"


def test_bert_lrp_methods_within_four_times_the_floor():
    model = tiny_text_model("bert-classifier")
    batch = padded_batch([[2, 17, 5, 33, 8, 41, 3], [2, 9, 28, 3], [2, 50, 11, 6, 3]])
    embeddings = model.get_input_embeddings()(batch["input_ids"])

    def forward(leaf: torch.Tensor) -> torch.Tensor:
        return model(inputs_embeds=leaf, attention_mask=batch["attention_mask"]).logits

    floor = floor_ops(forward, embeddings, 1).total
    explainer = Explainer(model)
    for method in LRP_METHODS:
        # every layer, not the text default of the last one only
        options = {"start_layer": 0} if method == "transformer_attribution" else {}
        explainer.explain(batch, method=method, target=1, **options)
        ops = count_ops(
            lambda m=method, o=options: explainer.explain(batch, method=m, target=1, **o)
        )
        assert ops.total <= MAX_RATIO * floor, f"{method}: {ops.total} ops, floor {floor}"


@pytest.mark.parametrize("method", LRP_METHODS)
def test_op_count_does_not_grow_with_the_batch(method):
    """No per-sample loop: 2 and 16 images dispatch the same ops."""
    explainer = Explainer(tiny_vit(depth=2, num_heads=2))
    assert _explain_ops(explainer, _images(2), method) == _explain_ops(
        explainer, _images(16), method
    )


SYNCS = ("_local_scalar_dense", "nonzero", "item", "is_nonzero", "equal")


def _syncs(explainer: Explainer, inputs, method: str) -> dict[str, int]:
    explainer.explain(inputs, method=method, target=1)
    ops = count_ops(lambda: explainer.explain(inputs, method=method, target=1)).ops
    return {name: count for name, count in ops.items() if name.split(".")[0] in SYNCS}


@pytest.mark.parametrize("method", LRP_METHODS)
def test_the_walk_adds_no_host_sync(method):
    """The LRP methods wait on the device exactly as often as `generic` (the engine's own
    checks of targets and finiteness): the walk itself never does."""
    explainer = Explainer(tiny_vit(depth=2, num_heads=2))
    images = _images(2)
    assert _syncs(explainer, images, method) == _syncs(explainer, images, "generic")


@pytest.mark.parametrize("method", LRP_METHODS)
def test_op_count_does_not_grow_with_the_sequence(method):
    """The walks run on the explicit maps, whatever the length: 128 and 1,024 tokens of a
    narrow BERT dispatch the same ops (measured once at 1,024 and 8,192: 0.99x to 1.00x,
    too slow for CI on CPU), at most 4x the floor's."""
    model = tiny_text_model(
        "bert-classifier",
        max_position_embeddings=1024,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
    )
    explainer = Explainer(model)
    options = {"start_layer": 0} if method == "transformer_attribution" else {}
    counts = []
    for tokens in (128, 1024):
        ids = torch.randint(5, 59, (1, tokens), generator=torch.Generator().manual_seed(0))
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        ops = count_ops(lambda b=batch: explainer.explain(b, method=method, target=1, **options))
        assert ops.syncs <= 8, ops.ops
        counts.append(ops.total)
        mask = batch["attention_mask"]
        floor = floor_ops(
            lambda leaf, m=mask: model(inputs_embeds=leaf, attention_mask=m).logits,
            model.get_input_embeddings()(ids),
            1,
        ).total
        assert ops.total <= MAX_RATIO * floor, f"{method}: {ops.total} ops, floor {floor}"
    assert counts[1] <= 1.5 * counts[0], counts
