"""The last-block methods of every column at once (explain.rules.fold.LastBlock): one map
of the last block for all columns, in any chunks of columns, equal to each column's own
map (float64, 1e-10), on the explicit and on the fused path
(explain.engine.spread.FoldFeed); raw attention is a one-block spread fold."""

from __future__ import annotations

import pytest
import reference_hf as ref
import torch
from test_streaming import identity_site

from explain import Explainer
from explain.engine.fused import FusedBlock
from explain.engine.plans.base import SetFolds
from explain.engine.spread import FoldFeed
from explain.layout import TokenLayout, TokenSet
from explain.rules import RuleContext, get_method
from explain.rules.fold import LastBlock
from explain.rules.gradient import gradcam_maps
from explain.rules.lrp_based import partial_lrp_maps
from explain.rules.registry import SpreadMode

TEXTS = [[2, 14, 7, 33, 9, 21, 3, 8, 11, 19], [2, 41, 3], [2, 5, 17, 28, 3, 6]]


def _gradcam_reference(readout, keys, attention, gradient):
    """Attention GradCAM of one column, head by head and row by row (docs/methods.md)."""
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


@pytest.mark.parametrize("chunks", [[slice(0, 3)], [slice(0, 1), slice(1, 3)]])
def test_a_last_block_of_every_column_equals_each_column_alone(chunks):
    """Three columns with their own readout rows and kept keys, mapped together (in chunks
    of columns, as a batched backward delivers them), equal the head-by-head reference of
    each column."""
    generator = torch.Generator().manual_seed(0)
    attention = torch.rand(2, 3, 9, 9, generator=generator, dtype=torch.float64).softmax(-1)
    gradients = torch.randn(3, 2, 3, 9, 9, generator=generator, dtype=torch.float64)
    readouts = torch.rand(3, 2, 9, generator=generator, dtype=torch.float64)
    keys = torch.rand(3, 2, 9, generator=generator) > 0.3
    together = LastBlock(2, gradcam_maps, readouts, keys)
    for columns in reversed(chunks):  # the chunks' order does not matter
        together.add(0, columns, attention, gradients[columns])  # not the last block: ignored
        together.add(1, columns, attention, gradients[columns])
    result = together.result()
    for c in range(3):
        expected = _gradcam_reference(readouts[c], keys[c], attention, gradients[c])
        torch.testing.assert_close(result[c], expected, rtol=1e-10, atol=1e-12)


def test_columns_sharing_their_rows_read_them_once():
    """Rows (1, B, N) serve every column of a chunk: a chunk of three columns maps each
    with its own gradients over the one readout row."""
    generator = torch.Generator().manual_seed(3)
    attention = torch.rand(2, 3, 9, 9, generator=generator, dtype=torch.float64).softmax(-1)
    gradients = torch.randn(3, 2, 3, 9, 9, generator=generator, dtype=torch.float64)
    readout = torch.rand(1, 2, 9, generator=generator, dtype=torch.float64)
    keys = torch.ones(1, 2, 9, dtype=torch.bool)
    shared = LastBlock(1, gradcam_maps, readout, keys)
    shared.add(0, slice(0, 3), attention, gradients)
    for c, column in enumerate(shared.result()):
        expected = _gradcam_reference(readout[0], keys[0], attention, gradients[c])
        torch.testing.assert_close(column, expected, rtol=1e-10, atol=1e-12)


def test_partial_lrp_map_reads_each_columns_row_of_the_clamped_head_mean():
    generator = torch.Generator().manual_seed(1)
    relevance = torch.randn(2, 3, 7, 7, generator=generator, dtype=torch.float64)
    readouts = torch.rand(4, 2, 7, generator=generator, dtype=torch.float64)
    maps = partial_lrp_maps((readouts,), relevance, None)
    fused = relevance.clamp(min=0).mean(dim=1)
    expected = torch.stack([torch.stack([r[b] @ fused[b] for b in range(2)]) for r in readouts])
    torch.testing.assert_close(maps, expected, rtol=1e-12, atol=1e-14)


def test_a_last_block_that_never_arrived_is_refused():
    readout = torch.ones(1, 1, 4, dtype=torch.float64)
    block = LastBlock(2, partial_lrp_maps, readout)
    block.add(0, slice(0, 1), torch.rand(1, 2, 4, 4, dtype=torch.float64), None)
    with pytest.raises(RuntimeError, match="no block arrived"):
        block.result()


def test_raw_attention_is_a_one_block_spread_fold():
    context = RuleContext(
        torch.zeros(1, 1, 4),
        TokenLayout(modality="text", num_tokens=4),
        num_layers=3,
        start_layer=2,
    )
    fold = get_method("raw_attention").fold(context, {})
    assert fold.spread is SpreadMode.ATTENTION and fold.layers == range(2, 3)


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


class _RecordingBlock(LastBlock):
    """Notes the columns of every chunk it is handed."""

    def __init__(self, *args):
        super().__init__(*args)
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
    fold = _RecordingBlock(1, gradcam_maps, readouts, keys)
    layout = TokenLayout(modality="text", num_tokens=5)
    call_fold = SetFolds({"text": fold}, [TokenSet("text", range(1), layout, readouts[0])])
    one_column = 2 * 2 * 5 * 5 * 8  # a (B, H, N, N) float64 dA
    FoldFeed(call_fold, max_bytes=one_column).add(0, slice(0, 3), block, output_grads)
    assert fold.steps == [slice(0, 1), slice(1, 2), slice(2, 3)]
    attention = block.probabilities()
    result = fold.result()
    for c in range(3):
        gradient = output_grads[c] @ value.transpose(-2, -1)
        expected = _gradcam_reference(readouts[c], keys[c], attention, gradient)
        torch.testing.assert_close(result[c], expected, rtol=1e-10, atol=1e-12)
