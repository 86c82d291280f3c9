"""The streaming fold: on the fused path a block arrives by chunks of query rows, A and dA
recomputed chunk by chunk, and the fold equals the one over whole maps (float64, 1e-10).
"""

from __future__ import annotations

import pytest
import reference_hf as ref
import torch

import explain.fused
from explain import Explainer
from explain.architectures.base import FusedAttentionSite
from explain.rules.attention import rollout_step
from explain.rules.fold import AttentionRows, ReadoutFold
from explain.rules.gradient import generic_step, gradient_weighted
from explain.testing import tiny_lm, tiny_vit

TEXTS = [[2, 14, 7, 33, 9, 21, 3, 8, 11, 19], [2, 41, 3], [2, 5, 17, 28, 3, 6]]


def _fold(step, block_matrix=gradient_weighted):
    readout = torch.zeros(2, 9, dtype=torch.float64)
    readout[:, 0] = 1.0
    return ReadoutFold(readout, range(3), block_matrix, step, streamable=True)


def _chunks(attention, gradient, size):
    tokens = attention.shape[-2]
    return [
        AttentionRows(
            slice(i, i + size), attention[:, :, i : i + size], gradient[:, :, i : i + size]
        )
        for i in range(0, tokens, size)
    ]


@pytest.mark.parametrize("size", [1, 2, 4, 9])
@pytest.mark.parametrize("step", [generic_step, rollout_step])
def test_folding_rows_equals_folding_whole_blocks(step, size):
    generator = torch.Generator().manual_seed(0)
    blocks = [
        (
            torch.rand(2, 3, 9, 9, generator=generator, dtype=torch.float64).softmax(-1),
            torch.randn(2, 3, 9, 9, generator=generator, dtype=torch.float64),
        )
        for _ in range(3)
    ]
    whole, streamed = _fold(step), _fold(step)
    for layer in (2, 1, 0):  # the backward's order: every block folded on arrival
        whole.add(layer, *blocks[layer])
        streamed.add_rows(layer, iter(_chunks(*blocks[layer], size)))
    torch.testing.assert_close(streamed.result(), whole.result(), rtol=1e-10, atol=1e-12)
    # Out of order, a block's rows are joined and wait for the later blocks.
    late = _fold(step)
    late.add_rows(0, iter(_chunks(*blocks[0], size)))
    late.add(2, *blocks[2])
    late.add_rows(1, iter(_chunks(*blocks[1], size)))
    torch.testing.assert_close(late.result(), whole.result(), rtol=1e-10, atol=1e-12)


def _bert64():
    return ref.tiny_text_model("bert-classifier").double()


@pytest.mark.parametrize("chunk_rows", [1, 3])
def test_streamed_fused_path_equals_unchunked_in_float64(monkeypatch, chunk_rows):
    """BERT on the fused path, padded batch: chunks of 1 and 3 query rows against the
    explicit path's whole maps, and against one chunk per block."""
    model = _bert64()
    batch = ref.padded_batch(TEXTS, "right")
    explicit = Explainer(model, attention_path="explicit").explain(batch, target=[0, 1, 2])
    whole = Explainer(model, attention_path="fused").explain(batch, target=[0, 1, 2])
    # Chunk budget: chunk_rows query rows of the batch (B, H, rows, N) in float64.
    row_bytes = 3 * model.config.num_attention_heads * batch["input_ids"].shape[1] * 8
    monkeypatch.setattr(explain.fused, "STREAM_BYTES", chunk_rows * row_bytes)
    seen = []
    original = explain.fused.FusedBlock.rows

    def counting(self, output_grad, max_bytes=None):
        for chunk in original(self, output_grad, max_bytes):
            seen.append(chunk.attention.shape[-2])
            yield chunk

    monkeypatch.setattr(explain.fused.FusedBlock, "rows", counting)
    streamed = Explainer(model, attention_path="fused").explain(batch, target=[0, 1, 2])
    assert seen and max(seen) == chunk_rows  # it did stream, in chunks of that size
    for other in (explicit, whole):
        torch.testing.assert_close(streamed.relevance, other.relevance, rtol=1e-10, atol=1e-12)
    assert (streamed.relevance[~batch["attention_mask"].bool()] == 0).all()


def test_streamed_vit_equals_unchunked_in_float64(monkeypatch):
    model = tiny_vit(depth=3, num_heads=2).double()
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)).double()
    whole = Explainer(model, attention_path="explicit").explain(images, method="generic")
    monkeypatch.setattr(explain.fused, "STREAM_BYTES", 1)  # one query row per chunk
    streamed = Explainer(model, attention_path="fused").explain(images, method="generic")
    torch.testing.assert_close(streamed.relevance, whole.relevance, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_streamed_causal_lm_equals_unchunked_in_float64(monkeypatch, family):
    """Decoder-only models on sdpa (q, k, v seen through the attention interface), one
    query row per chunk. Right padding: under a causal mask a left pad attends nowhere,
    and torch's float64 sdpa (the math kernel) makes that row NaN in the model itself
    (float32 left padding on the fused path: test_causal_lm). Against the fused path's
    whole maps: the eager path takes its softmax in float32 even for float64 models."""
    model = tiny_lm.tiny_causal_lm(family).double()
    batch = ref.padded_batch(TEXTS, "right")
    with monkeypatch.context() as whole_maps:
        whole_maps.setattr(ReadoutFold, "takes_rows", False)  # the sink takes whole blocks only
        whole = Explainer(model, attention_path="fused").explain(batch, target=[0, 1, 2])
    monkeypatch.setattr(explain.fused, "STREAM_BYTES", 1)
    widths = []
    original = explain.fused.FusedBlock.rows

    def recording(self, output_grad, max_bytes=None):
        for chunk in original(self, output_grad, max_bytes):
            widths.append((chunk.rows.stop, chunk.attention.shape[-1]))
            yield chunk

    monkeypatch.setattr(explain.fused.FusedBlock, "rows", recording)
    streamed = Explainer(model, attention_path="fused").explain(batch, target=[0, 1, 2])
    torch.testing.assert_close(streamed.relevance, whole.relevance, rtol=1e-10, atol=1e-12)
    assert (streamed.relevance[~batch["attention_mask"].bool()] == 0).all()
    # Causal rows are computed over the keys up to the chunk's last row only.
    assert widths and all(stop == width for stop, width in widths)


@pytest.mark.parametrize("start_layer", [None, 1])
def test_streamed_rollout_equals_unchunked_in_float64(monkeypatch, start_layer):
    """Rollout on the fused path: the forward keeps only q, k (and the mask) of each block,
    and the blocks are folded after it, last first, one query row at a time."""
    model = _bert64()
    batch = ref.padded_batch(TEXTS, "right")
    options = dict(method="rollout", start_layer=start_layer)
    whole = Explainer(model, attention_path="explicit").explain(batch, **options)
    monkeypatch.setattr(explain.fused, "STREAM_BYTES", 1)
    streamed = Explainer(model, attention_path="fused").explain(batch, **options)
    torch.testing.assert_close(streamed.relevance, whole.relevance, rtol=1e-10, atol=1e-12)


def test_generic_and_rollout_fold_by_rows_and_discarding_joins_the_block():
    from explain.architectures.base import TokenLayout
    from explain.rules import RuleContext, get_method

    readout = torch.zeros(1, 4)
    layout = TokenLayout(modality="text", num_tokens=4)
    context = RuleContext(readout, layout, num_layers=2, start_layer=0)
    assert get_method("generic").sink(context, {}).streamable
    assert get_method("rollout").sink(context, {}).streamable
    assert not get_method("rollout").sink(context, {"discard_ratio": 0.5}).streamable


def test_causal_chunks_without_a_model_mask_mask_only_their_diagonal_square():
    """Without a model mask (an unpadded prompt) a causal site masks only each chunk's
    diagonal square (`causal_from`): every chunk of rows, and the whole map, still equal
    the softmax over the keys up to each row's own position, written out here."""
    generator = torch.Generator().manual_seed(0)
    shape = (2, 3, 7, 4)  # batch, heads, tokens, head size
    query, key, value, output_grad = (
        torch.randn(shape, generator=generator, dtype=torch.float64) for _ in range(4)
    )
    site = FusedAttentionSite(
        layer=0,
        query=torch.nn.Identity(),
        key=torch.nn.Identity(),
        value=torch.nn.Identity(),
        values=lambda x: x,
        output=torch.nn.Identity(),
        heads=lambda x: x,
        scale=0.5,
        causal=True,
    )
    block = explain.fused.FusedBlock(site, query, key, value, mask=None)
    scores = query @ key.transpose(-2, -1) * 0.5
    later = torch.arange(7) > torch.arange(7).unsqueeze(-1)
    expected = torch.exp(scores.masked_fill(later, float("-inf")) - scores.amax(-1, keepdim=True))
    expected = expected / expected.sum(-1, keepdim=True)
    expected_grad = output_grad @ value.transpose(-2, -1)
    torch.testing.assert_close(block.probabilities(), expected, rtol=1e-12, atol=1e-14)
    row_bytes = 2 * 3 * 7 * 8
    for rows in (1, 3, 7):
        chunks = list(block.rows(output_grad, rows * row_bytes))
        assert [c.rows.stop - c.rows.start for c in chunks[:-1]] == [rows] * (len(chunks) - 1)
        assert chunks[-1].rows.stop == 7
        for chunk in chunks:
            keys = chunk.rows.stop
            assert chunk.attention.shape[-1] == chunk.gradient.shape[-1] == keys
            torch.testing.assert_close(
                chunk.attention, expected[:, :, chunk.rows, :keys], rtol=1e-12, atol=1e-14
            )
            torch.testing.assert_close(
                chunk.gradient, expected_grad[:, :, chunk.rows, :keys], rtol=1e-12, atol=1e-14
            )
