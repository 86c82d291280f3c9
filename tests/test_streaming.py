"""The readout fold of every column at once (explain.rules.fold.ReadoutFold): through
spreads of whole maps on the explicit path, from q, k, v and dO by chunks of query rows on
the fused path ("streamed", explain.engine.spread.FoldFeed); every way equals each
column's fold over its block matrices (float64, 1e-10).
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import reference_hf as ref
import torch

import explain.engine.kernels.torch_fold as torch_fold
from explain import Explainer
from explain.engine.fused import FusedBlock
from explain.engine.plans.base import SetFolds
from explain.engine.plans.image_text import ImageTextFold
from explain.engine.spread import FoldFeed
from explain.layout import FusedAttentionSite, Pieces, TokenLayout, TokenSet
from explain.rules.attention import rollout_split
from explain.rules.fold import ReadoutFold
from explain.rules.gradient import generic_split, gradient_weighted
from explain.rules.registry import SpreadMode
from explain.testing import tiny_lm, tiny_vit

TEXTS = [[2, 14, 7, 33, 9, 21, 3, 8, 11, 19], [2, 41, 3], [2, 5, 17, 28, 3, 6]]


def _rollout_matrix(attention, gradient):
    return attention.mean(dim=1)


def _reference(readout, blocks, matrix, identity_kept, normalised):
    """One column's readout row folded block by block, last first, with plain products:
    v <- v @ M + v (generic), or s = v / rowsum(M + I), v <- s @ M + s (rollout)."""
    vector = readout
    for attention, gradient in reversed(blocks):
        block = matrix(attention, gradient)
        if normalised:
            vector = vector / (block.sum(dim=-1) + 1.0)
        vector = torch.einsum("bn,bnm->bm", vector, block) + (vector if identity_kept else 0)
    return vector


_METHODS = [  # (matrix, split, spread mode, normalised)
    (gradient_weighted, generic_split, SpreadMode.GRADIENT, False),
    (_rollout_matrix, rollout_split, SpreadMode.ATTENTION, True),
]


@pytest.mark.parametrize("matrix, split, mode, normalised", _METHODS)
@pytest.mark.parametrize("chunks", [[slice(0, 3)], [slice(0, 1), slice(1, 3)]])
def test_a_fold_of_every_column_equals_each_column_folded_alone(
    matrix, split, mode, normalised, chunks
):
    """Three columns with their own readout rows, folded together (in chunks of columns,
    as a batched backward delivers them) from whole maps, through their spreads and
    through their block matrices, equal each column's plain fold."""
    generator = torch.Generator().manual_seed(0)
    blocks = [
        (
            torch.rand(2, 3, 9, 9, generator=generator, dtype=torch.float64).softmax(-1),
            torch.randn(3, 2, 3, 9, 9, generator=generator, dtype=torch.float64),
        )
        for _ in range(3)
    ]
    readouts = torch.rand(3, 2, 9, generator=generator, dtype=torch.float64)
    spread = ReadoutFold(readouts, range(1, 3), matrix, split, spread=mode)
    whole = ReadoutFold(readouts, range(1, 3), matrix, split)
    for columns in chunks:
        for layer in (2, 1, 0):
            attention, grads = blocks[layer]
            gradients = grads[columns] if mode is SpreadMode.GRADIENT else None
            spread.add(layer, columns, attention, gradients)
            whole.add(layer, columns, attention, gradients)
    for c in range(3):
        column = [(a, g[c] if mode is SpreadMode.GRADIENT else None) for a, g in blocks[1:]]
        expected = _reference(readouts[c], column, matrix, True, normalised)
        torch.testing.assert_close(spread.result()[c], expected, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(whole.result()[c], expected, rtol=1e-10, atol=1e-12)


def test_blocks_wait_for_the_later_ones_and_a_missing_block_is_refused():
    """A forward hands the blocks first to last: each waits until every later block is
    folded, and the result equals the last-first order; a fold missing a block refuses
    its result."""
    generator = torch.Generator().manual_seed(4)
    maps = [torch.rand(2, 3, 6, 6, generator=generator, dtype=torch.float64) for _ in range(3)]
    readout = torch.rand(1, 2, 6, generator=generator, dtype=torch.float64)
    forward = ReadoutFold(
        readout, range(3), _rollout_matrix, rollout_split, spread=SpreadMode.ATTENTION
    )
    backward = ReadoutFold(
        readout, range(3), _rollout_matrix, rollout_split, spread=SpreadMode.ATTENTION
    )
    for layer in range(3):
        forward.add(layer, slice(None), maps[layer], None)
    for layer in reversed(range(3)):
        backward.add(layer, slice(None), maps[layer], None)
    torch.testing.assert_close(forward.result(), backward.result(), rtol=1e-12, atol=1e-14)
    expected = _reference(readout[0], [(m, None) for m in maps], _rollout_matrix, True, True)
    torch.testing.assert_close(forward.result()[0], expected, rtol=1e-10, atol=1e-12)
    unfinished = ReadoutFold(readout, range(3), _rollout_matrix, rollout_split)
    unfinished.add(2, slice(None), maps[2], None)
    unfinished.add(0, slice(None), maps[0], None)
    with pytest.raises(RuntimeError, match="block 1 never arrived"):
        unfinished.result()


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
    with monkeypatch.context() as whole_maps:  # no block taken as a spread: whole maps
        whole_maps.setattr(SetFolds, "spread", None)
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
    from explain.rules import RuleContext, get_method

    readout = torch.zeros(1, 1, 4)
    layout = TokenLayout(modality="text", num_tokens=4)
    context = RuleContext(readout, layout, num_layers=2, start_layer=0)
    assert get_method("generic").fold(context, {}).spread is SpreadMode.GRADIENT
    assert get_method("rollout").fold(context, {}).spread is SpreadMode.ATTENTION
    assert get_method("rollout").fold(context, {"discard_ratio": 0.5}).spread is None
    assert get_method("rollout").fold(context, {"head_fusion": "max"}).spread is None
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


def _call_fold(fold, tokens):
    """A call's fold of one token set of `tokens` tokens, over `fold`'s blocks."""
    layout = TokenLayout(modality="text", num_tokens=tokens)
    token_set = TokenSet("text", range(len(fold.layers)), layout, torch.zeros(1, tokens))
    return SetFolds({"text": fold}, [token_set])


@pytest.mark.parametrize("matrix, split, mode, normalised", _METHODS)
@pytest.mark.parametrize("budget", [1, 1 << 20])
def test_a_block_in_pieces_folds_piece_by_piece_as_its_dense_map(
    matrix, split, mode, normalised, budget
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
    whole = ReadoutFold(readouts, range(1), matrix, split)
    gradients = output_grads @ value.transpose(-2, -1)[None]
    whole.add(0, slice(0, 3), attention, gradients if mode is SpreadMode.GRADIENT else None)
    streamed = ReadoutFold(readouts, range(1), matrix, split, spread=mode)
    FoldFeed(_call_fold(streamed, 8), budget).add(0, slice(0, 3), block, output_grads)
    torch.testing.assert_close(streamed.result(), whole.result(), rtol=1e-10, atol=1e-12)


def test_a_tower_fold_starts_from_the_language_models_rows():
    """A vision-language model's tower folds, chunk of columns by chunk, from the rows the
    language model's fold ends with, mapped onto its tokens (`ImageAt.tower_rows`): equal
    to each column's two folds in turn. In a forward its blocks come first and wait; a
    block streamed before the language model's fold of its columns ended is refused."""
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
    image = types.SimpleNamespace(tower_rows=lambda rows: rows @ mix)

    def fold(rows):
        return ReadoutFold(
            rows, range(2), gradient_weighted, generic_split, spread=SpreadMode.GRADIENT
        )

    def call_fold():
        return ImageTextFold(fold(readouts), 2, image, fold, range(2))

    expected = []
    for c in range(3):
        column = [(a, g[c]) for a, g in text]
        row = _reference(readouts[c], column, gradient_weighted, True, False) @ mix
        tower_column = [(a, g[c]) for a, g in tower]
        expected.append(_reference(row, tower_column, gradient_weighted, True, False))
    together = call_fold()
    arrivals = [(3, text[1]), (2, text[0]), (1, tower[1]), (0, tower[0])]  # last first
    for columns in (slice(0, 1), slice(1, 3)):  # chunks of a batched backward
        for layer, (attention, grads) in arrivals:
            together.add(layer, columns, attention, grads[columns])
    _, towers = together.result()
    torch.testing.assert_close(towers, torch.stack(expected), rtol=1e-10, atol=1e-12)
    forward = call_fold()  # a forward's order: the tower's blocks wait for the text's fold
    for layer, (attention, grads) in reversed(arrivals):
        forward.add(layer, slice(0, 3), attention, grads)
    torch.testing.assert_close(forward.result()[1], towers, rtol=1e-10, atol=1e-12)
    early = call_fold()
    with pytest.raises(RuntimeError, match="before the language model's fold ended"):
        early.fold(1, slice(None), lambda rows: rows, lambda: None)
