"""The last-block methods of every column at once (explain.rules.fold.ColumnLastBlocks,
explain.engine.spread.LastBlockFold): one map of the last block for all columns, in any
chunks of columns, equal to each column's own map (float64, 1e-10), on the explicit and
on the fused path; raw attention is a one-block spread fold."""

from __future__ import annotations

import pytest
import reference_hf as ref
import torch
from test_streaming import identity_site

from explain import Explainer
from explain.engine.fused import FusedBlock
from explain.engine.spread import LastBlockFold
from explain.layout import TokenLayout
from explain.rules import RuleContext, get_method
from explain.rules.attention import RAW_ATTENTION_SPREAD
from explain.rules.fold import ColumnLastBlocks, LastBlock
from explain.rules.gradient import gradcam_maps
from explain.rules.lrp_based import partial_lrp_maps

TEXTS = [[2, 14, 7, 33, 9, 21, 3, 8, 11, 19], [2, 41, 3], [2, 5, 17, 28, 3, 6]]


def _gradcam_reference(readout, keys, attention, gradient):
    """Attention GradCAM of one column, head by head and row by row (METHODS.md)."""
    batch, heads = attention.shape[:2]
    out = torch.zeros(batch, attention.shape[-1], dtype=attention.dtype)
    for b in range(batch):
        total = 0
        for h in range(heads):
            attention_row = readout[b] @ attention[b, h]
            weight = (readout[b] @ gradient[b, h])[keys[b]].mean()
            total = total + weight * attention_row
        out[b] = (total / heads).clamp(min=0)
    return out


@pytest.mark.parametrize("chunks", [[slice(None)], [slice(0, 1), slice(1, 3)]])
def test_column_last_blocks_equal_each_column_alone(chunks):
    """Three columns with their own readout rows and kept keys, mapped together (in chunks
    of columns, as a batched backward delivers them), equal each column's own map and
    the head-by-head reference."""
    generator = torch.Generator().manual_seed(0)
    attention = torch.rand(2, 3, 9, 9, generator=generator, dtype=torch.float64).softmax(-1)
    gradients = torch.randn(3, 2, 3, 9, 9, generator=generator, dtype=torch.float64)
    readouts = torch.rand(3, 2, 9, generator=generator, dtype=torch.float64)
    keys = torch.rand(3, 2, 9, generator=generator) > 0.3
    alone = [LastBlock(2, gradcam_maps, readouts[c], keys[c]) for c in range(3)]
    for c, block in enumerate(alone):
        block.add(0, attention, gradients[c])  # not the last block: ignored
        block.add(1, attention, gradients[c])
    together = [LastBlock(2, gradcam_maps, readouts[c], keys[c]) for c in range(3)]
    stack = ColumnLastBlocks(together)
    for columns in reversed(chunks):  # the chunks' order does not matter
        stack.add(1, columns, attention, gradients[columns])
    stack.finish()
    for c in range(3):
        expected = _gradcam_reference(readouts[c], keys[c], attention, gradients[c])
        torch.testing.assert_close(alone[c].result(), expected, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(together[c].result(), expected, rtol=1e-10, atol=1e-12)


def test_partial_lrp_map_reads_each_columns_row_of_the_clamped_head_mean():
    generator = torch.Generator().manual_seed(1)
    relevance = torch.randn(2, 3, 7, 7, generator=generator, dtype=torch.float64)
    readouts = torch.rand(4, 2, 7, generator=generator, dtype=torch.float64)
    maps = partial_lrp_maps((readouts,), relevance, None)
    fused = relevance.clamp(min=0).mean(dim=1)
    expected = torch.stack([torch.stack([r[b] @ fused[b] for b in range(2)]) for r in readouts])
    torch.testing.assert_close(maps, expected, rtol=1e-12, atol=1e-14)


def test_column_last_blocks_refuse_mixed_methods_and_missing_columns():
    readout = torch.ones(1, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="one method"):
        ColumnLastBlocks(
            [
                LastBlock(2, gradcam_maps, readout, readout > 0),
                LastBlock(2, partial_lrp_maps, readout),
            ]
        )
    stack = ColumnLastBlocks([LastBlock(2, partial_lrp_maps, readout)] * 2)
    stack.add(1, slice(0, 1), torch.rand(1, 2, 4, 4, dtype=torch.float64), None)
    with pytest.raises(RuntimeError, match="every column"):
        stack.finish()


def test_raw_attention_is_a_one_block_spread_fold():
    context = RuleContext(
        torch.zeros(1, 4), TokenLayout(modality="text", num_tokens=4), num_layers=3, start_layer=2
    )
    sink = get_method("raw_attention").sink(context, {})
    assert sink.spread is RAW_ATTENTION_SPREAD and sink.layers == range(2, 3)


@pytest.mark.parametrize("budget", [1, None])
def test_attention_gradcam_on_the_fused_path_equals_the_explicit_path_in_float64(budget):
    """BERT, padded batch, three classes in one batched backward: the last block's A is
    recomputed once for all columns and dA for one column at a time (a budget of 1 byte)
    or for all at once, against the explicit path's maps."""
    model = ref.tiny_text_model("bert-classifier").double()
    batch = ref.padded_batch(TEXTS, "right")
    options = dict(method="attention_gradcam", target=[[0, 1, 2]] * 3)
    explicit = Explainer(model, attention_path="explicit").explain(batch, **options)
    fused = Explainer(model, attention_path="fused", memory_budget=budget).explain(batch, **options)
    assert fused.settings["attention_path"] == "fused"  # A is built whole: not streamed
    torch.testing.assert_close(fused.relevance, explicit.relevance, rtol=1e-10, atol=1e-12)
    for k in range(3):  # and each class alone
        alone = Explainer(model).explain(batch, method="attention_gradcam", target=k)
        torch.testing.assert_close(
            explicit.relevance[:, k], alone.relevance, rtol=1e-10, atol=1e-12
        )


class _RecordingStack(ColumnLastBlocks):
    """Notes the columns of every step it is handed."""

    def __init__(self, blocks):
        super().__init__(blocks)
        self.steps = []

    def add(self, layer, columns, attention, gradients):
        self.steps.append(columns)
        super().add(layer, columns, attention, gradients)


def test_fused_last_block_takes_the_gradients_of_as_many_columns_as_fit_the_budget():
    """On the fused path dA = dO v^T is built for as many columns at a time as fit the
    budget: one column's worth here, so three columns take three steps, equal to the
    reference from whole maps."""
    generator = torch.Generator().manual_seed(2)
    query, key, value = (torch.randn(2, 2, 5, 4, generator=generator).double() for _ in range(3))
    block = FusedBlock(identity_site(causal=True), query, key, value)
    output_grads = torch.randn(3, 2, 2, 5, 4, generator=generator).double()
    readouts = torch.rand(3, 2, 5, generator=generator).double()
    keys = torch.rand(3, 2, 5, generator=generator) > 0.2
    blocks = [LastBlock(1, gradcam_maps, readouts[c], keys[c]) for c in range(3)]
    one_column = 2 * 2 * 5 * 5 * 8  # a (B, H, N, N) float64 dA
    stack = _RecordingStack(blocks)
    fold = LastBlockFold([(range(1), stack)], max_bytes=one_column)
    fold.add(0, slice(None), block, output_grads)
    fold.finish()
    assert stack.steps == [slice(0, 1), slice(1, 2), slice(2, 3)]
    attention = block.probabilities()
    for c in range(3):
        gradient = output_grads[c] @ value.transpose(-2, -1)
        expected = _gradcam_reference(readouts[c], keys[c], attention, gradient)
        torch.testing.assert_close(blocks[c].result(), expected, rtol=1e-10, atol=1e-12)
