"""The fast paths give the numbers of the straightforward computation (issue 6).

- Folding the readout row block by block in the backward pass equals the readout row of
  the full N x N matrix product over all blocks.
- The fused path (fused attention kernel, A and dA recomputed from q, k, v and dO) equals
  the explicit path.
- Several targets in one vectorised backward equal separate calls, chunked or not.

Timings are never asserted here; they are in scripts/bench.py and docs/benchmarks.md.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from explain import Explainer
from explain.architectures import adapter_for
from explain.engine.fused import (
    CPU_FUSED_MIN_COLUMNS,
    CPU_FUSED_MIN_TOKENS,
    choose_path,
    default_memory_budget,
    explicit_map_bytes,
)
from explain.errors import OptionError
from explain.testing import ModelState, tiny_vit

PATHS = ("explicit", "fused")
METHODS_WITH_BLOCKS = ("generic", "rollout", "attention_gradcam", "raw_attention")


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal as float32 keeps: rtol 1e-4, and 1e-5 of the map's largest magnitude for the
    small entries."""
    scale = float(expected.abs().max())
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5 * scale)


def _full_matrix_relevance(
    attentions: list[torch.Tensor],
    grads: list[torch.Tensor] | None,
    row: torch.Tensor,
    start: int,
) -> torch.Tensor:
    """One sample, float64, full N x N products in forward block order, as the papers'
    code does: generic R <- R + Abar R with Abar = mean_h (G A)+; rollout (no grads)
    R <- Ahat R with Ahat = (Abar + I) / rowsum. Returns r @ R."""
    n = row.shape[0]
    identity = torch.eye(n, dtype=torch.float64)
    relevance = identity.clone()
    for layer in range(start, len(attentions)):
        a = attentions[layer].double()
        if grads is None:
            step = a.mean(0) + identity
            step = step / step.sum(dim=-1, keepdim=True)
            relevance = step @ relevance
        else:
            abar = (grads[layer].double() * a).clamp(min=0).mean(0)
            relevance = relevance + abar @ relevance
    return row.double() @ relevance


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("method", ["generic", "rollout"])
@pytest.mark.parametrize("start", [0, 1, 2])
def test_folding_equals_full_matrix_product(vit, images, path, method, start):
    explainer = Explainer(vit, attention_path=path)
    result = explainer.explain(images, method=method, start_layer=start)
    # The trace records every block's full A and dA (explicit path, same logit score).
    trace = explainer.trace(images, target=result.target, score="logit")
    adapter = adapter_for(vit)
    prepared = adapter.prepare(images)
    readout = adapter.readout(prepared)
    for b in range(images.shape[0]):
        attentions = [a[b] for a in trace.attentions]
        grads = [g[b] for g in trace.attention_grads] if method == "generic" else None
        tokens = _full_matrix_relevance(attentions, grads, readout[b], start)
        expected = adapter.to_input_space(tokens, prepared.layout)
        _close(result.relevance[b].double(), expected)


@pytest.mark.parametrize("method", METHODS_WITH_BLOCKS)
def test_fused_path_equals_explicit_path(vit_case, method):
    model, images = vit_case
    explicit = Explainer(model, attention_path="explicit").explain(images, method=method)
    fused = Explainer(model, attention_path="fused").explain(images, method=method)
    torch.testing.assert_close(fused.logits, explicit.logits, rtol=1e-4, atol=1e-5)
    assert torch.equal(fused.target, explicit.target)
    _close(fused.relevance, explicit.relevance)


@pytest.mark.parametrize("method", ["generic", "attention_gradcam"])
def test_fused_path_equals_explicit_path_in_float64(images, method):
    model = tiny_vit(depth=3, num_heads=2).double()
    images = images.double()
    explicit = Explainer(model, attention_path="explicit").explain(images, method=method)
    fused = Explainer(model, attention_path="fused").explain(images, method=method)
    torch.testing.assert_close(fused.relevance, explicit.relevance, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("method", ["generic", "attention_gradcam"])
@pytest.mark.parametrize("score", ["logit", "probability"])
def test_batched_targets_equal_separate_calls(vit, images, path, method, score):
    explainer = Explainer(vit, attention_path=path)
    classes = torch.tensor([[0, 3, 1], [4, 4, 2]])
    together = explainer.explain(images, target=classes, method=method, score=score)
    assert together.relevance.shape == (2, 3, 4, 4)
    assert torch.equal(together.target, classes)
    for k in range(classes.shape[1]):
        alone = explainer.explain(images, target=classes[:, k], method=method, score=score)
        _close(together.relevance[:, k], alone.relevance)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("budget, backward_calls", [(1 << 30, [True]), (1, [False] * 4)])
def test_targets_share_one_backward_within_the_memory_budget(
    vit, images, monkeypatch, path, budget, backward_calls
):
    """One vectorised backward for all targets; with a tiny budget, one plain backward
    per target (a chunk of one column needs no vectorising)."""
    classes = torch.tensor([[0, 1, 2, 3], [4, 3, 2, 1]])
    expected = Explainer(vit, attention_path=path).explain(images, target=classes).relevance
    explainer = Explainer(vit, attention_path=path, memory_budget=budget)
    calls = []
    grad = torch.autograd.grad

    def counting_grad(*args, **kwargs):
        calls.append(kwargs.get("is_grads_batched", False))
        return grad(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", counting_grad)
    relevance = explainer.explain(images, target=classes).relevance
    assert calls == backward_calls
    _close(relevance, expected)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("method", ["generic", "rollout"])
def test_fused_path_leaves_no_trace_on_the_model(path, method):
    model = tiny_vit(drop_rate=0.1, attn_drop_rate=0.1)
    model.train()
    model.blocks[0].attn.fused_attn = False  # a user's mixed setting must come back
    model.blocks[2].attn.fused_attn = True
    images = torch.randn(2, 3, 32, 32)
    before = ModelState.capture(model)
    Explainer(model, attention_path=path).explain(images, method=method, target=[[0, 1]] * 2)
    assert before.differences(ModelState.capture(model)) == []


def test_fused_path_failure_restores_everything(images):
    model = tiny_vit()
    before = ModelState.capture(model)

    def explode(module, args):
        raise RuntimeError("forced failure inside the fused hooks' block")

    handle = model.blocks[1].attn.norm.register_forward_pre_hook(explode)
    with pytest.raises(RuntimeError, match="forced failure"):
        Explainer(model, attention_path="fused").explain(images)
    handle.remove()
    assert before.differences(ModelState.capture(model)) == []


def test_auto_chooses_the_path_from_device_length_budget_and_method(monkeypatch):
    short = adapter_for(tiny_vit())  # 17 tokens
    patches = (math.isqrt(CPU_FUSED_MIN_TOKENS) + 1) * 8  # square grid side, patch 8
    long_model = tiny_vit(img_size=patches, dynamic_img_size=True)
    long = adapter_for(long_model)
    short_layout = short.prepare(torch.zeros(1, 3, 32, 32)).layout
    long_layout = long.prepare(torch.zeros(1, 3, patches, patches)).layout
    assert short_layout.num_tokens < CPU_FUSED_MIN_TOKENS <= long_layout.num_tokens

    def choose(
        adapter,
        layout,
        gradients=True,
        requested="auto",
        reads_attention=True,
        budget=1 << 30,
        columns=None,
    ):
        return (
            choose_path(
                adapter,
                layout,
                batch=2,
                needs_gradients=gradients,
                requested=requested,
                memory_budget=budget,
                reads_attention=reads_attention,
                columns=columns,
            )
            == "fused"
        )

    assert not choose(short, short_layout)
    assert choose(long, long_layout)
    assert choose(long, long_layout, gradients=False)  # forward-only: streamed
    assert not choose(short, short_layout, gradients=False)
    # On CPU a gradient method streams from two known columns on, whatever the length; a
    # forward-only one folds one map for every column and stays explicit.
    assert not choose(short, short_layout, columns=1)
    assert choose(short, short_layout, columns=CPU_FUSED_MIN_COLUMNS)
    assert not choose(short, short_layout, gradients=False, columns=32)
    assert not choose(short, short_layout, requested="explicit", columns=32)
    assert choose(short, short_layout, requested="fused")
    assert not choose(long, long_layout, requested="explicit")
    # AttnLRP / CP-LRP read no map: the model's own kernel at any length, unless told.
    assert choose(short, short_layout, reads_attention=False)
    assert not choose(short, short_layout, reads_attention=False, requested="explicit")
    # Maps beyond the budget stream even when short: 3 blocks, 2 samples, 2 heads, 17^2
    # entries of 4 bytes, and for gradients one dA and 8 bytes of temporaries per entry.
    entries = 2 * 2 * 17 * 17
    maps = explicit_map_bytes(short, short_layout, 2, needs_gradients=True)
    assert maps == 3 * entries * 4 + entries * 12
    assert not choose(short, short_layout, budget=maps)
    assert choose(short, short_layout, budget=maps - 1)
    # On CUDA the explicit maps are taken at any length where they fit the budget.
    on_cuda = SimpleNamespace(device=torch.device("cuda"), element_size=lambda: 4)
    monkeypatch.setattr(type(long), "parameter", property(lambda self: on_cuda))
    assert not choose(long, long_layout, budget=1 << 40)
    assert not choose(long, long_layout, budget=1 << 40, columns=32)
    assert choose(long, long_layout, budget=1 << 10)


def test_the_default_cuda_budget_is_half_the_free_memory_with_the_allocators_cache(
    monkeypatch,
):
    """Half of what the device has free plus what PyTorch's allocator holds cached but
    unused: the same budget whatever earlier calls left in the cache."""
    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 30 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 26 * gib)
    assert default_memory_budget(torch.device("cuda", 0)) == 7 * gib


def test_attention_path_errors():
    model = tiny_vit()
    with pytest.raises(OptionError, match="attention_path must be one of"):
        Explainer(model, attention_path="flash")
    adapter = adapter_for(model)
    layout = adapter.prepare(torch.zeros(1, 3, 32, 32)).layout
    adapter.fused_path = lambda: None  # an adapter without the capability
    with pytest.raises(OptionError, match="has no fused path"):
        choose_path(
            adapter, layout, batch=1, needs_gradients=True, requested="fused", memory_budget=1
        )
    for reads_attention in (True, False):
        path = choose_path(
            adapter,
            layout,
            batch=1,
            needs_gradients=True,
            requested="auto",
            memory_budget=1,
            reads_attention=reads_attention,
        )
        assert path == "explicit"
    with pytest.raises(OptionError, match="memory_budget must be a positive number"):
        Explainer(model, memory_budget=0)


def _tiny_text_models():
    from transformers import BertConfig, BertForSequenceClassification, RobertaConfig, RobertaModel

    sizes = dict(hidden_size=32, intermediate_size=37, vocab_size=100)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return {
            "bert-classifier": BertForSequenceClassification(
                BertConfig(num_hidden_layers=3, num_attention_heads=2, num_labels=3, **sizes)
            ),
            "roberta-mean-pooled": RobertaModel(
                RobertaConfig(num_hidden_layers=2, num_attention_heads=4, **sizes)
            ),
        }


@pytest.mark.parametrize("name", ["bert-classifier", "roberta-mean-pooled"])
def test_fused_path_equals_explicit_path_on_padded_text(name):
    """sdpa with the padding mask, recomputed with the same mask, equals the eager path."""
    model = _tiny_text_models()[name]
    ids = torch.randint(5, 100, (3, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    mask[2, 6:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    before = ModelState.capture(model)
    chosen = torch.tensor([1, 0, 2])  # classes, or the encoder's features (it has no class)
    for method in ("generic", "rollout", "attention_gradcam"):
        explicit = Explainer(model, attention_path="explicit").explain(
            inputs, method=method, target=chosen
        )
        fused = Explainer(model, attention_path="fused").explain(
            inputs, method=method, target=chosen
        )
        _close(fused.relevance, explicit.relevance)
        assert (fused.relevance[mask == 0] == 0).all()
    targets = torch.tensor([[0, 1], [2, 0], [1, 1]])
    together = Explainer(model, attention_path="fused").explain(inputs, target=targets)
    for k in range(2):
        alone = Explainer(model, attention_path="explicit").explain(inputs, target=targets[:, k])
        _close(together.relevance[:, k], alone.relevance)
    assert before.differences(ModelState.capture(model)) == []
