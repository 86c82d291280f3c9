"""The two-token-set rules against plain-loop references written from docs/multimodal.md."""

from __future__ import annotations

import pytest
import torch
from reference_coattention import encoder_decoder, gradient_weighted, normalize, two_stream_layer
from torch import Tensor

from explain.rules.coattention import (
    BlockRole,
    TwoSetFold,
    TwoSetRelevance,
    cross_attention_update,
    normalize_residual,
    self_attention_update,
)

BATCH, HEADS, NUM_Q, NUM_I = 3, 2, 4, 5


def _maps(generator: torch.Generator, rows: int, columns: int) -> tuple[Tensor, Tensor]:
    """Random (B, H, rows, columns) attention (rows sum to 1) and signed gradients."""
    attention = torch.rand(BATCH, HEADS, rows, columns, generator=generator, dtype=torch.float64)
    attention = attention / attention.sum(dim=-1, keepdim=True)
    gradient = torch.randn(BATCH, HEADS, rows, columns, generator=generator, dtype=torch.float64)
    return attention, gradient


def _abar(attention: Tensor, gradient: Tensor, sample: int) -> Tensor:
    return gradient_weighted(attention[sample], gradient[sample])


def _one_column(record: tuple[Tensor, Tensor]) -> tuple[slice, Tensor, Tensor]:
    """A block's record as a fold takes it for one column: its gradient (1, B, H, n, m)."""
    attention, gradient = record
    return slice(0, 1), attention, gradient[None]


def _column(state: TwoSetRelevance, column: int) -> TwoSetRelevance:
    """One column's four matrices, (B, n, m) each."""
    return TwoSetRelevance(*(state.get(*key)[column] for key in ("qq", "qi", "iq", "ii")))


def test_normalize_matches_reference_and_keeps_zero_rows():
    generator = torch.Generator().manual_seed(0)
    relevance = torch.eye(5, dtype=torch.float64) + torch.rand(5, 5, generator=generator).double()
    relevance[2] = torch.eye(5, dtype=torch.float64)[2]  # a row with no attention mass
    ours = normalize_residual(relevance[None])[0]
    assert torch.allclose(ours, normalize(relevance), atol=1e-12)
    assert torch.equal(ours[2], torch.eye(5, dtype=torch.float64)[2])
    assert torch.isfinite(ours).all()
    off_identity = ours - torch.eye(5, dtype=torch.float64)
    nonzero_rows = [r for r in range(5) if r != 2]
    assert torch.allclose(off_identity[nonzero_rows].sum(-1), torch.ones(4, dtype=torch.float64))


@pytest.mark.parametrize("encoder_layers,decoder_layers", [(2, 3), (1, 1), (3, 2)])
def test_encoder_decoder_fold_matches_reference(encoder_layers, decoder_layers):
    generator = torch.Generator().manual_seed(encoder_layers * 10 + decoder_layers)
    roles, records = [], []
    for _ in range(encoder_layers):
        roles.append(BlockRole(len(roles), "i", "self"))
        records.append(_maps(generator, NUM_I, NUM_I))
    for _ in range(decoder_layers):
        roles.append(BlockRole(len(roles), "q", "self"))
        records.append(_maps(generator, NUM_Q, NUM_Q))
        roles.append(BlockRole(len(roles), "q", "cross"))
        records.append(_maps(generator, NUM_Q, NUM_I))
    fold = TwoSetFold(roles, NUM_Q, NUM_I)
    for layer in reversed(range(len(records))):  # the backward delivers the last block first
        fold.add(layer, *_one_column(records[layer]))
    result = _column(fold.result(), 0)
    for b in range(BATCH):
        matrices = [_abar(*record, b) for record in records]
        encoder = matrices[:encoder_layers]
        decoder_self = matrices[encoder_layers::2]
        decoder_cross = matrices[encoder_layers + 1 :: 2]
        r_qq, r_qi, r_ii = encoder_decoder(encoder, decoder_self, decoder_cross)
        assert torch.allclose(result.qq[b], r_qq, atol=1e-12)
        assert torch.allclose(result.qi[b], r_qi, atol=1e-12)
        assert torch.allclose(result.ii[b], r_ii, atol=1e-12)
        assert torch.equal(result.iq[b], torch.zeros(NUM_I, NUM_Q, dtype=torch.float64))


def test_two_stream_co_attention_matches_reference():
    generator = torch.Generator().manual_seed(7)
    roles, records = [], []
    for _ in range(2):  # two cross-modality layers: co-attention both ways, then self
        for token_set, kind, shape in (
            ("q", "co", (NUM_Q, NUM_I)),
            ("i", "co", (NUM_I, NUM_Q)),
            ("q", "self", (NUM_Q, NUM_Q)),
            ("i", "self", (NUM_I, NUM_I)),
        ):
            roles.append(BlockRole(len(roles), token_set, kind))
            records.append(_maps(generator, *shape))
    # Start from a state where every matrix is non-trivial, as after single-stream layers.
    start = TwoSetRelevance.initial(BATCH, NUM_Q, NUM_I, dtype=torch.float64, device="cpu")
    fold = TwoSetFold(roles, NUM_Q, NUM_I)
    for layer, record in enumerate(records):
        fold.add(layer, *_one_column(record))
    result = _column(fold.result(), 0)
    for b in range(BATCH):
        state = {key: start.get(*key)[b] for key in ("qq", "qi", "iq", "ii")}
        for layer in range(0, len(records), 4):
            state = two_stream_layer(state, *(_abar(*records[layer + k], b) for k in range(4)))
        for key in state:
            assert torch.allclose(result.get(*key)[b], state[key], atol=1e-12), key
    # Co-attention reaches every matrix: R_iq and the R_qq term through it are exercised.
    assert result.iq.abs().sum() > 0


def test_cross_update_uses_matrices_from_before_the_block():
    generator = torch.Generator().manual_seed(3)
    state = TwoSetRelevance.initial(1, NUM_Q, NUM_I, dtype=torch.float64, device="cpu")
    state = self_attention_update(state, "q", _abar(*_maps(generator, NUM_Q, NUM_Q), 0)[None])
    state = self_attention_update(state, "i", _abar(*_maps(generator, NUM_I, NUM_I), 0)[None])
    cross = _abar(*_maps(generator, NUM_Q, NUM_I), 0)[None]
    updated = cross_attention_update(state, "q", cross)
    expected = normalize(state.qq[0]).T @ cross[0] @ normalize(state.ii[0])
    assert torch.allclose(updated.qi[0] - state.qi[0], expected, atol=1e-12)
    assert torch.equal(updated.ii, state.ii)  # the stored matrices are never normalised
    assert torch.equal(updated.qq, state.qq)  # R_iq = 0: an encoder-decoder adds nothing here


def test_missing_block_and_bad_roles_fail_clearly():
    fold = TwoSetFold([BlockRole(0, "i", "self"), BlockRole(1, "q", "self")], NUM_Q, NUM_I)
    generator = torch.Generator().manual_seed(0)
    fold.add(1, *_one_column(_maps(generator, NUM_Q, NUM_Q)))
    with pytest.raises(RuntimeError, match=r"blocks \[0\] never arrived"):
        fold.result()
    with pytest.raises(RuntimeError, match=r"blocks \[0, 1\] never arrived"):
        TwoSetFold([BlockRole(0, "i", "self"), BlockRole(1, "q", "self")], NUM_Q, NUM_I).result()
    with pytest.raises(ValueError, match="consecutive"):
        TwoSetFold([BlockRole(1, "i", "self"), BlockRole(0, "q", "self")], NUM_Q, NUM_I)
    with pytest.raises(ValueError, match="pairs"):
        TwoSetFold([BlockRole(0, "i", "co"), BlockRole(1, "q", "co")], NUM_Q, NUM_I)


def test_every_column_at_once_equals_each_column_alone():
    """The rules of C columns batched (two chunks of columns, each delivering its blocks
    last first, as a chunked batched backward does) equal each column's rules alone, in
    float64: the chunks joined in column order."""
    generator = torch.Generator().manual_seed(11)
    roles = [BlockRole(0, "i", "self"), BlockRole(1, "q", "self"), BlockRole(2, "q", "cross")]
    shapes = [(NUM_I, NUM_I), (NUM_Q, NUM_Q), (NUM_Q, NUM_I)]
    columns = 5
    attentions = [_maps(generator, *shape)[0] for shape in shapes]
    gradients = [
        torch.randn(columns, *a.shape, generator=generator, dtype=torch.float64) for a in attentions
    ]
    together = TwoSetFold(roles, NUM_Q, NUM_I)
    for chunk in (slice(3, 5), slice(0, 3)):  # the chunks' order does not matter
        for layer in reversed(range(len(roles))):
            together.add(layer, chunk, attentions[layer], gradients[layer][chunk])
    result = together.result()
    for column in range(columns):
        alone = TwoSetFold(roles, NUM_Q, NUM_I)
        for layer in reversed(range(len(roles))):
            alone.add(layer, *_one_column((attentions[layer], gradients[layer][column])))
        expected = _column(alone.result(), 0)
        for key in ("qq", "qi", "iq", "ii"):
            assert torch.allclose(result.get(*key)[column], expected.get(*key), atol=1e-12)
    assert not torch.allclose(result.qi[0], result.qi[1])  # columns differ
