"""The fold of all columns at once through spreads (explain.engine.spread): on the
explicit path from whole maps, on the fused path from q, k, v and dO by chunks of query
rows ("streamed"); every way equals the per-column fold over whole maps (float64, 1e-10).
"""

from __future__ import annotations

import dataclasses

import pytest
import reference_hf as ref
import torch

import explain.engine.kernels.torch_fold as torch_fold
from explain import Explainer
from explain.engine.fused import FusedBlock
from explain.engine.kernels import spread_maps
from explain.engine.spread import ReadOut, SpreadFold
from explain.layout import FusedAttentionSite, Pieces
from explain.rules.attention import ROLLOUT_SPREAD, rollout_step
from explain.rules.fold import ColumnFolds, ReadoutFold
from explain.rules.gradient import GENERIC_SPREAD, generic_step, gradient_weighted
from explain.testing import tiny_lm, tiny_vit

TEXTS = [[2, 14, 7, 33, 9, 21, 3, 8, 11, 19], [2, 41, 3], [2, 5, 17, 28, 3, 6]]


def _rollout_matrix(attention, gradient):
    return attention.mean(dim=1)


@pytest.mark.parametrize(
    "block_matrix, step, spread",
    [
        (gradient_weighted, generic_step, GENERIC_SPREAD),
        (_rollout_matrix, rollout_step, ROLLOUT_SPREAD),
    ],
)
@pytest.mark.parametrize("chunks", [[slice(0, 3)], [slice(0, 1), slice(1, 3)]])
def test_column_folds_equal_each_column_folded_alone(block_matrix, step, spread, chunks):
    """Three columns with their own readout rows, folded together (in chunks of columns,
    as a batched backward delivers them) through spreads of whole maps, equal each
    column's own fold over block matrices."""
    generator = torch.Generator().manual_seed(0)
    blocks = [
        (
            torch.rand(2, 3, 9, 9, generator=generator, dtype=torch.float64).softmax(-1),
            torch.randn(3, 2, 3, 9, 9, generator=generator, dtype=torch.float64),
        )
        for _ in range(3)
    ]
    readouts = torch.rand(3, 2, 9, generator=generator, dtype=torch.float64)
    alone = [ReadoutFold(readouts[c], range(1, 3), block_matrix, step) for c in range(3)]
    for layer in (2, 1, 0):
        for c, fold in enumerate(alone):
            fold.add(layer, blocks[layer][0], blocks[layer][1][c])
    together = [
        ReadoutFold(readouts[c], range(1, 3), block_matrix, step, spread=spread) for c in range(3)
    ]
    stack = ColumnFolds(together)
    gradients = spread.mode == "gradient"
    for columns in chunks:
        for layer in (2, 1, 0):
            attention, grads = blocks[layer]
            grad = grads[columns] if gradients else None
            rowsum = None if gradients else attention.mean(1).sum(-1)
            stack.fold(layer, columns, lambda u, a=attention, g=grad: spread_maps(u, a, g), rowsum)
    stack.finish()
    for mine, theirs in zip(together, alone, strict=True):
        torch.testing.assert_close(mine.result(), theirs.result(), rtol=1e-10, atol=1e-12)


def test_column_folds_refuse_blocks_out_of_order_and_unfinished_folds():
    readout = torch.ones(1, 4, dtype=torch.float64)
    folds = ColumnFolds(
        [ReadoutFold(readout, range(2), gradient_weighted, generic_step, spread=GENERIC_SPREAD)]
    )
    with pytest.raises(RuntimeError, match="block 0 arrived before block 1"):
        folds.fold(0, slice(None), lambda u: u, None)
    folds.fold(1, slice(None), lambda u: u, None)
    with pytest.raises(RuntimeError, match="never arrived"):
        folds.finish()
    with pytest.raises(ValueError, match="one method over the same blocks"):
        ColumnFolds([ReadoutFold(readout, range(2), gradient_weighted, generic_step)])


def _bert64():
    return ref.tiny_text_model("bert-classifier").double()


def _recording_chunks(monkeypatch):
    """Record the row chunks of every streamed block (their number of rows)."""
    seen = []
    original = torch_fold.row_chunks

    def recording(*args, **kwargs):
        chunks = original(*args, **kwargs)
        seen.extend(stop - start for start, stop in chunks)
        return chunks

    monkeypatch.setattr(torch_fold, "row_chunks", recording)
    return seen


@pytest.mark.parametrize("budget, rows", [(1, 1), (None, 10)])
def test_streamed_bert_equals_explicit_path_in_float64(monkeypatch, budget, rows):
    """BERT on the fused path, padded batch, three classes in one batched backward: chunks
    of one query row (a budget of 1 byte) or one chunk per block, against the explicit
    path's whole maps."""
    model = _bert64()
    batch = ref.padded_batch(TEXTS, "right")
    target = [[0, 1, 2]] * 3
    explicit = Explainer(model, attention_path="explicit").explain(batch, target=target)
    seen = _recording_chunks(monkeypatch)
    streamed = Explainer(model, attention_path="fused", memory_budget=budget).explain(
        batch, target=target
    )
    assert streamed.settings["attention_path"] == "streamed"
    assert seen and max(seen) == rows  # it did stream, in chunks of that size
    torch.testing.assert_close(streamed.relevance, explicit.relevance, rtol=1e-10, atol=1e-12)
    pads = ~batch["attention_mask"].bool()
    assert (streamed.relevance.transpose(0, 1)[:, pads] == 0).all()


def test_streamed_vit_equals_explicit_path_in_float64():
    model = tiny_vit(depth=3, num_heads=2).double()
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)).double()
    whole = Explainer(model, attention_path="explicit").explain(images, method="generic")
    streamed = Explainer(model, attention_path="fused", memory_budget=1).explain(
        images, method="generic"
    )
    torch.testing.assert_close(streamed.relevance, whole.relevance, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
@pytest.mark.parametrize("method", ["generic", "rollout"])
def test_streamed_causal_lm_equals_whole_maps_in_float64(monkeypatch, family, method):
    """Decoder-only models on sdpa (q, k, v seen through the attention interface), one
    query row per chunk. Right padding: under a causal mask a left pad attends nowhere,
    and torch's float64 sdpa (the math kernel) makes that row NaN in the model itself
    (float32 left padding on the fused path: test_causal_lm). Against the fused path's
    whole maps per column: the eager path takes its softmax in float32 even for float64
    models."""
    model = tiny_lm.tiny_causal_lm(family).double()
    batch = ref.padded_batch(TEXTS, "right")
    options = {"target": [0, 1, 2]} if method == "generic" else {}
    with monkeypatch.context() as whole_maps:
        whole_maps.setattr(SpreadFold, "of", classmethod(lambda cls, sinks, max_bytes: None))
        whole = Explainer(model, attention_path="fused").explain(batch, method=method, **options)
    assert whole.settings["attention_path"] == "fused"
    streamed = Explainer(model, attention_path="fused", memory_budget=1)
    result = streamed.explain(batch, method=method, **options)
    assert result.settings["attention_path"] == "streamed"
    torch.testing.assert_close(result.relevance, whole.relevance, rtol=1e-10, atol=1e-12)
    assert (result.relevance[~batch["attention_mask"].bool()] == 0).all()


@pytest.mark.parametrize("start_layer", [None, 1])
def test_streamed_rollout_equals_explicit_path_in_float64(start_layer):
    """Rollout on the fused path: the forward keeps only q, k (and the mask) of each block,
    and the blocks are folded after it, last first, one query row at a time."""
    model = _bert64()
    batch = ref.padded_batch(TEXTS, "right")
    options = dict(method="rollout", start_layer=start_layer)
    whole = Explainer(model, attention_path="explicit").explain(batch, **options)
    streamed = Explainer(model, attention_path="fused", memory_budget=1).explain(batch, **options)
    assert streamed.settings["attention_path"] == "streamed"
    torch.testing.assert_close(streamed.relevance, whole.relevance, rtol=1e-10, atol=1e-12)


def test_only_head_mean_folds_spread_and_the_others_take_whole_maps():
    from explain.layout import TokenLayout
    from explain.rules import RuleContext, get_method

    readout = torch.zeros(1, 4)
    layout = TokenLayout(modality="text", num_tokens=4)
    context = RuleContext(readout, layout, num_layers=2, start_layer=0)
    assert get_method("generic").sink(context, {}).spread is GENERIC_SPREAD
    assert get_method("rollout").sink(context, {}).spread is ROLLOUT_SPREAD
    assert get_method("rollout").sink(context, {"discard_ratio": 0.5}).spread is None
    assert get_method("rollout").sink(context, {"head_fusion": "max"}).spread is None
    model = _bert64()
    batch = ref.padded_batch(TEXTS, "right")
    for options in ({"discard_ratio": 0.5}, {"head_fusion": "max"}):
        fused = Explainer(model, attention_path="fused").explain(batch, method="rollout", **options)
        explicit = Explainer(model, attention_path="explicit").explain(
            batch, method="rollout", **options
        )
        assert fused.settings["attention_path"] == "fused"
        torch.testing.assert_close(fused.relevance, explicit.relevance, rtol=1e-10, atol=1e-12)


def identity_site(causal: bool) -> FusedAttentionSite:
    """A fused attention site whose projections and head split are identities, so that a
    block's query, key and value are the tensors a test hands it."""
    return FusedAttentionSite(
        layer=0,
        query=torch.nn.Identity(),
        key=torch.nn.Identity(),
        value=torch.nn.Identity(),
        values=lambda x: x,
        output=torch.nn.Identity(),
        heads=lambda x: x,
        scale=0.5,
        causal=causal,
    )


def _block(mask, causal):
    query = torch.zeros(2, 3, 5, 4)
    return FusedBlock(identity_site(causal), query, query, query, mask=mask)


def test_a_block_mask_becomes_a_key_mask_where_it_is_one():
    """The kernel takes (B, Nk) keys plus causality; a mask that is more (a sliding
    window, a bias) is said not to be, so its block is folded from its whole map."""
    keys = torch.tensor([[True, True, True, False, False], [False, True, True, True, True]])
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    assert _block(None, causal=True).key_mask() == (None, None)
    found, exact = _block(keys[:, None, None, :], causal=False).key_mask()
    assert torch.equal(found, keys) and exact is None  # no device wait needed
    full = keys[:, None, None, :] & causal  # a causal model's padded mask, as sdpa gets it
    found, exact = _block(full, causal=True).key_mask()
    assert torch.equal(found, keys) and bool(exact)
    window = full & ~torch.ones(5, 5, dtype=torch.bool).tril(-2)  # sliding window of 2
    assert not bool(_block(window, causal=True).key_mask()[1])
    additive = torch.zeros(2, 1, 1, 5).masked_fill(
        ~keys[:, None, None, :], torch.finfo(torch.float32).min
    )
    found, exact = _block(additive, causal=False).key_mask()
    assert torch.equal(found, keys) and bool(exact)
    assert not bool(_block(additive + 0.5, causal=False).key_mask()[1])  # a bias


class _Column:
    """One column's sinks as a plan gives them to `SpreadFold.of`."""

    def __init__(self, *parts):
        self._parts = list(parts)

    def parts(self):
        return self._parts


@pytest.mark.parametrize(
    "block_matrix, step, spread",
    [
        (gradient_weighted, generic_step, GENERIC_SPREAD),
        (_rollout_matrix, rollout_step, ROLLOUT_SPREAD),
    ],
)
@pytest.mark.parametrize("budget", [1, 1 << 20])
def test_a_block_in_pieces_folds_piece_by_piece_as_its_dense_map(
    block_matrix, step, spread, budget
):
    """A block attended within contiguous pieces (a packed tower's windows, the last one
    smaller), said by their lengths: folded as a batch of padded pieces, without its
    dense mask, equal to the fold of its whole map, zero across pieces (float64)."""
    generator = torch.Generator().manual_seed(2)
    pieces = Pieces((4, 1, 3))
    query, key, value = (
        torch.randn(2, 2, 8, 3, generator=generator, dtype=torch.float64) for _ in range(3)
    )
    block = dataclasses.replace(_block(None, causal=False), query=query, key=key, value=value)
    block.mask = pieces
    output_grads = torch.randn(3, 2, 2, 8, 3, generator=generator, dtype=torch.float64)
    readouts = torch.rand(3, 2, 8, generator=generator, dtype=torch.float64)
    attention = block.probabilities()
    assert attention[:, :, :4, 4:].abs().max() == 0  # nothing across pieces
    alone = [ReadoutFold(readouts[c], range(1), block_matrix, step) for c in range(3)]
    for c, fold in enumerate(alone):
        fold.add(0, attention, output_grads[c] @ value.transpose(-2, -1))
    together = [
        ReadoutFold(readouts[c], range(1), block_matrix, step, spread=spread) for c in range(3)
    ]
    fold = SpreadFold.of([_Column((range(1), sink)) for sink in together], budget)
    fold.add(0, slice(None), block, output_grads)
    fold.finish()
    for mine, theirs in zip(together, alone, strict=True):
        torch.testing.assert_close(mine.result(), theirs.result(), rtol=1e-10, atol=1e-12)


def test_a_set_read_out_by_anothers_result_starts_from_its_rows():
    """A `ReadOut` set (a vision-language model's tower) folds, chunk of columns by chunk,
    from the rows its reader's folds end with, mapped by its `readout`: equal to each
    column's two folds in turn; a block of it before its reader's folds end is refused."""
    generator = torch.Generator().manual_seed(3)

    def blocks(tokens):
        return [
            (
                torch.rand(2, 2, tokens, tokens, generator=generator, dtype=torch.float64),
                torch.randn(3, 2, 2, tokens, tokens, generator=generator, dtype=torch.float64),
            )
            for _ in range(2)
        ]

    text, tower = blocks(5), blocks(4)  # model-wide layers: tower 0, 1; text 2, 3
    mix = torch.rand(5, 4, generator=generator, dtype=torch.float64)
    readouts = torch.rand(3, 2, 5, generator=generator, dtype=torch.float64)

    def fold(readout, stack, c, spread=None):
        sink = ReadoutFold(readout, range(2), gradient_weighted, generic_step, spread=spread)
        for layer in (1, 0):
            sink.add(layer, stack[layer][0], stack[layer][1][c])
        return sink.result()

    expected = [fold(fold(readouts[c], text, c) @ mix, tower, c) for c in range(3)]
    towers = {}

    def column(c):
        text_sink = ReadoutFold(
            readouts[c], range(2), gradient_weighted, generic_step, spread=GENERIC_SPREAD
        )

        def start(row, c=c):
            towers[c] = ReadoutFold(
                row, range(2), gradient_weighted, generic_step, spread=GENERIC_SPREAD
            )
            return towers[c]

        return _Column(
            (range(2, 4), text_sink), (range(2), ReadOut(0, range(2), lambda v: v @ mix, start))
        )

    spread = SpreadFold.of([column(c) for c in range(3)], 1 << 20)
    arrivals = [(3, text[1]), (2, text[0]), (1, tower[1]), (0, tower[0])]  # last first
    for columns in (slice(0, 1), slice(1, 3)):  # chunks of a batched backward
        for layer, (attention, grads) in arrivals:
            spread.add(layer, columns, attention, grads[columns])
    spread.finish()
    for c in range(3):
        torch.testing.assert_close(towers[c].result(), expected[c], rtol=1e-10, atol=1e-12)
    early = SpreadFold.of([column(c) for c in range(3)], 1 << 20)
    with pytest.raises(RuntimeError, match="before the fold it is read out by ended"):
        early.add(1, slice(None), *tower[1])
