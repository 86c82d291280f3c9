"""The LRP methods equal the independent layer-by-layer reference (reference_lrp.py), and
the rules keep the promises docs/methods.md makes for them (conservation, per-sample sums)."""

from __future__ import annotations

import copy

import pytest
import reference_lrp as ref
import torch
from conftest import VIT_CONFIGS
from torch import nn

import reference_vit as ref_vit
from explain import METHODS, Explainer, TargetError, UnsupportedModelError
from explain.engine.recorder import Recorder
from explain.engine.session import Session
from explain.lrp import CHEFER, ORIGINAL
from explain.lrp import propagation as rules
from explain.testing import ModelState, hook_counts, tiny_vit

LRP_METHODS = ["transformer_attribution", "partial_lrp", "lrp"]


def _images(batch, size, dtype=torch.float64, seed=1):
    return torch.randn(batch, 3, *size, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def _reference(model, image, method, target, start=0):
    """The reference relevance of one image (C, H, W), in the Explanation's layout."""
    record = ref.forward(model, image[None])
    relevances, pixels = ref.relevance_pass(
        model,
        record,
        target,
        chefer=method == "transformer_attribution",
        to_pixels=method == "lrp",
    )
    if method == "lrp":
        return pixels
    grid = tuple(record["grid"])
    row = ref_vit.readout_row(model, relevances[-1].shape[-1], image.dtype)
    if method == "partial_lrp":
        return ref_vit.to_grid(model, ref.partial_lrp(relevances, row), grid)
    _, grads, _ = ref_vit.attentions_and_gradients(model, image, target)
    tokens = ref.transformer_attribution(relevances, grads, row, start, normalise=False)
    return ref_vit.to_grid(model, tokens, grid)


def _assert_matches(actual, expected, relative):
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=relative, atol=relative * scale)


# Full LRP's plain residual splits meet near-zero sums, where rounding differences between
# closed-form and autograd vector-Jacobian products grow to ~1e-10 of the map's maximum.
FLOAT64 = {"transformer_attribution": 1e-10, "partial_lrp": 1e-10, "lrp": 1e-9}


# Every readout (class token, patch mean, class + distillation tokens), prefix layout
# (registers, no_embed_class), LayerScale and a non-square dynamic input size.
CONFIGS = ["vit", "gap-registers", "distilled", "deit3-layerscale", "dynamic-size"]


@pytest.mark.parametrize("method", LRP_METHODS)
@pytest.mark.parametrize("config", CONFIGS)
def test_float64_batch_matches_reference(config, method):
    kwargs, size = VIT_CONFIGS[config]
    model = tiny_vit(**kwargs).double()
    images = _images(2, size)
    targets = [1, 3]
    result = Explainer(model).explain(images, method=method, target=targets)
    assert result.relevance.dtype == torch.float64
    expected_shape = (2, *size) if method == "lrp" else (2, *result.relevance.shape[1:])
    assert result.relevance.shape == expected_shape
    for b, target in enumerate(targets):
        expected = _reference(model, images[b], method, target)
        _assert_matches(result.relevance[b], expected, FLOAT64[method])


@pytest.mark.parametrize("method", LRP_METHODS)
def test_float64_single_sample_matches_reference(method):
    model = tiny_vit(depth=4, num_heads=2, reg_tokens=1).double()
    image = _images(1, (32, 32), seed=5)
    result = Explainer(model).explain(image, method=method)
    expected = _reference(model, image[0], method, int(result.target[0]))
    _assert_matches(result.relevance[0], expected, FLOAT64[method])


@pytest.mark.parametrize(
    ("method", "relative"),
    # full LRP's plain residual splits amplify the float32 forward's rounding where the
    # sums nearly cancel (docs/methods.md, "Precision")
    [("transformer_attribution", 1e-5), ("partial_lrp", 1e-5), ("lrp", 1e-3)],
)
def test_float32_close_to_float64_reference(method, relative):
    model = tiny_vit(depth=3, num_heads=2)
    images = _images(2, (32, 32), dtype=torch.float32)
    result = Explainer(model).explain(images, method=method, target=2)
    assert result.relevance.dtype == torch.float32
    reference_model = tiny_vit(depth=3, num_heads=2).double()
    for b in range(2):
        expected = _reference(reference_model, images[b].double(), method, 2)
        _assert_matches(result.relevance[b].double(), expected, relative)


@pytest.mark.parametrize("method", LRP_METHODS)
def test_normalised_queries_and_keys_match_reference(method):
    """qk_norm: q and k are read where the norms leave them, not from qkv."""
    model = tiny_vit(depth=2, num_heads=2, qk_norm=True).double()
    images = _images(2, (32, 32), seed=4)
    result = Explainer(model).explain(images, method=method, target=[0, 3])
    for b, target in enumerate([0, 3]):
        expected = _reference(model, images[b], method, target)
        _assert_matches(result.relevance[b], expected, FLOAT64[method])


@pytest.mark.parametrize("start", [1, 2, -1])
def test_transformer_attribution_start_layer(start):
    model = tiny_vit(depth=3, num_heads=2).double()
    images = _images(2, (32, 32))
    result = Explainer(model).explain(
        images, method="transformer_attribution", start_layer=start, target=4
    )
    for b in range(2):
        expected = _reference(model, images[b], "transformer_attribution", 4, start=start % 3)
        _assert_matches(result.relevance[b], expected, 1e-10)


@pytest.mark.parametrize("method", LRP_METHODS)
def test_batch_equals_single_and_targets_equal_separate_calls(method):
    model = tiny_vit(depth=2, num_heads=2, reg_tokens=2).double()
    images = _images(2, (32, 32), seed=2)
    explainer = Explainer(model)
    targets = torch.tensor([[0, 3], [2, 2]])
    many = explainer.explain(images, method=method, target=targets)
    assert many.relevance.shape[:2] == (2, 2)
    for k in range(2):
        column = explainer.explain(images, method=method, target=targets[:, k])
        torch.testing.assert_close(many.relevance[:, k], column.relevance, rtol=1e-12, atol=0)
        for b in range(2):
            alone = explainer.explain(images[b : b + 1], method=method, target=targets[b, k])
            torch.testing.assert_close(
                column.relevance[b], alone.relevance[0], rtol=1e-12, atol=1e-15
            )


def test_methods_are_registered_and_class_specific():
    for name in LRP_METHODS:
        assert METHODS[name].class_specific
        assert METHODS[name].lrp_rules is not None
    model = tiny_vit()
    images = _images(2, (32, 32), dtype=torch.float32)
    explainer = Explainer(model)
    for name in LRP_METHODS:
        a = explainer.explain(images, method=name, target=0).relevance
        b = explainer.explain(images, method=name, target=4).relevance
        assert not torch.allclose(a, b)


# -- rules: conservation and per-sample sums -----------------------------------------------


def _generator():
    return torch.Generator().manual_seed(7)


def test_shared_denominator_linear_conserves_relevance():
    g = _generator()
    x = torch.randn(15, 64, dtype=torch.float64, generator=g)  # wide: no Z1 or Z2 is 0
    weight = torch.randn(8, 64, dtype=torch.float64, generator=g)
    relevance = torch.rand(15, 8, dtype=torch.float64, generator=g)
    into = rules.linear_shared(x, weight, relevance)
    torch.testing.assert_close(into.sum(dim=-1), relevance.sum(dim=-1), rtol=1e-7, atol=0)
    # the separate-denominator rule of the original code does not conserve: it gives both
    # the positive and the negative part all of R
    separate = rules.linear_separate(x, weight, relevance)
    torch.testing.assert_close(separate.sum(), 2 * relevance.sum(), rtol=1e-7, atol=0)


def test_linear_rules_equal_the_written_out_formulas():
    """The paired (positive, negative) batched products equal the rules written out."""
    g = _generator()
    x = torch.randn(15, 6, dtype=torch.float64, generator=g)
    x[3] = x[3].clamp(min=0)  # a row with no negative part: Z- = 0 there
    weight = torch.randn(4, 6, dtype=torch.float64, generator=g)
    relevance = torch.randn(15, 4, dtype=torch.float64, generator=g)
    xp, xn, wp, wn = x.clamp(min=0), x.clamp(max=0), weight.clamp(min=0), weight.clamp(max=0)
    s = ref.sdiv(relevance, xp @ wp.T + xn @ wn.T)
    shared = xp * (s @ wp) + xn * (s @ wn)
    separate = xp * (ref.sdiv(relevance, xp @ wp.T) @ wp) + xn * (
        ref.sdiv(relevance, xn @ wn.T) @ wn
    )
    torch.testing.assert_close(rules.linear_shared(x, weight, relevance), shared)
    torch.testing.assert_close(rules.linear_separate(x, weight, relevance), separate)
    # a float32 input walks exactly in float64
    walked = rules.linear_separate(x.float(), weight.float(), relevance)
    assert walked.dtype == torch.float64
    torch.testing.assert_close(
        walked, rules.linear_separate(x.float().double(), weight.float().double(), relevance)
    )


def test_rescaled_residual_conserves_each_samples_total():
    g = _generator()
    a = torch.randn(3 * 6, 4, dtype=torch.float64, generator=g)  # 3 samples of 6 rows
    b = torch.randn(3 * 6, 4, dtype=torch.float64, generator=g)
    relevance = torch.randn(3 * 6, 4, dtype=torch.float64, generator=g)
    relevance[6:12] *= 10  # samples with very different totals: sums must not mix
    denominator = rules.safe_denominator(a + b)
    ra, rb = rules.residual_rescaled(a, b, relevance, denominator, 3)
    torch.testing.assert_close(
        (ra + rb).view(3, -1).sum(1), relevance.view(3, -1).sum(1), rtol=1e-7, atol=0
    )
    for i in range(3):  # per sample equals the same rule on that sample alone
        rows = slice(6 * i, 6 * i + 6)
        alone = rules.residual_rescaled(a[rows], b[rows], relevance[rows], denominator[rows], 1)
        torch.testing.assert_close(ra[rows], alone[0], rtol=1e-15, atol=0)
        torch.testing.assert_close(rb[rows], alone[1], rtol=1e-15, atol=0)
        expected = ref.residual(a[rows], b[rows], relevance[rows], rescale=True)
        torch.testing.assert_close(ra[rows], expected[0], rtol=1e-12, atol=0)
        torch.testing.assert_close(rb[rows], expected[1], rtol=1e-12, atol=0)


def test_attention_products_conserve_after_halving():
    g = _generator()
    query = torch.randn(6, 5, 4, dtype=torch.float64, generator=g)  # (B * H, N, d)
    key = torch.randn(6, 5, 4, dtype=torch.float64, generator=g)
    attention = (query @ key.transpose(1, 2)).softmax(-1)
    values = torch.randn(6, 5, 4, dtype=torch.float64, generator=g)
    relevance = torch.randn(6, 5, 4, dtype=torch.float64, generator=g)
    of_a, (of_q, of_k, of_v) = rules.attention(
        torch.stack([query, key, values]), attention, relevance, rules.residual_plain, samples=2
    )
    torch.testing.assert_close(of_a.sum() + of_v.sum(), relevance.sum(), rtol=1e-7, atol=0)
    torch.testing.assert_close(of_q.sum() + of_k.sum(), of_a.sum(), rtol=1e-7, atol=0)


def test_sdiv_is_the_reference_shift():
    b = torch.tensor([2.0, -3.0, 0.0, 1e-12], dtype=torch.float64)
    out = rules.sdiv(torch.ones_like(b), b)
    expected = [1 / (2 + 1e-9), 1 / (-3 + 1e-9), 0.0, 1 / (1e-12 + 1e-9)]
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), rtol=1e-15, atol=0)
    torch.testing.assert_close(out, ref.sdiv(torch.ones_like(b), b), rtol=0, atol=0)


def test_chefer_rules_conserve_relevance_through_every_block():
    """Alpha-beta with a shared denominator, rescaled residuals, halved attention products
    and branch sums all conserve: block 0's input carries the target logit's 1.0."""
    model = tiny_vit(depth=3, num_heads=2).double()
    images = _images(3, (32, 32))
    explainer = Explainer(model)
    tape = explainer.adapter.lrp_walk(to_input=False)
    prepared = explainer.adapter.prepare(images)
    with (
        Session(explainer.adapter) as session,
        Recorder(session, module_hooks=tape.hooks),
    ):
        explainer.adapter.forward(prepared)
    classes = torch.tensor([0, 2, 4])
    per_block = []
    tokens = tape.propagate(
        classes, CHEFER, lambda layer, r: per_block.append(r.sum((1, 2, 3))), to_tokens=True
    )
    ones = torch.ones(3, dtype=torch.float64)
    torch.testing.assert_close(tokens.sum((1, 2)), ones, rtol=1e-6, atol=0)
    assert len(per_block) == 3
    original = tape.propagate(classes, ORIGINAL, lambda layer, r: None, to_tokens=True)
    assert not torch.allclose(original.sum((1, 2)), ones)


def recorded_tape(model, inputs, *, to_input=True):
    """A model's LRP tape after one recorded forward."""
    explainer = Explainer(model)
    tape = explainer.adapter.lrp_walk(to_input=to_input)
    prepared = explainer.adapter.prepare(inputs)
    with Session(explainer.adapter) as session, Recorder(session, module_hooks=tape.hooks):
        explainer.adapter.forward(prepared)
    return tape


def cast_tape(tape, model64):
    """`tape`'s recorded activations, cast to float64, on a float64 copy of its model."""
    explainer = Explainer(model64)
    copy = explainer.adapter.lrp_walk(to_input=True)
    for name in ("blocks", "head", "embedding"):
        stores = getattr(tape, name, None)
        if stores is None:
            continue
        targets = getattr(copy, name)
        pairs = (
            zip(stores, targets, strict=True) if isinstance(stores, list) else [(stores, targets)]
        )
        for store, target in pairs:
            target.update({key: value.double() for key, value in store.items()})
    return copy


def walk_in_float64_matches(tape, tape64, classes):
    """Full LRP (original rules) on a float32 tape equals the same walk over the same
    activations cast to float64: the walk adds no rounding of its own."""
    found, found64 = {}, {}
    below = tape.propagate(classes, ORIGINAL, found.__setitem__, to_input=True)
    below64 = tape64.propagate(classes, ORIGINAL, found64.__setitem__, to_input=True)
    assert below.dtype == torch.float32 and below64.dtype == torch.float64
    scale = below64.abs().max().item()
    torch.testing.assert_close(below.double(), below64, rtol=0, atol=1e-6 * scale)
    for layer, relevance in found64.items():
        scale = relevance.abs().max().item()
        torch.testing.assert_close(found[layer].double(), relevance, rtol=0, atol=1e-6 * scale)


def test_full_lrp_walks_float32_activations_in_float64():
    """Issue 24: the original rules' plain residual splits and attention products divide by
    sums that nearly cancel; a float32 walk added its own rounding there (~6e-6 of the
    map's maximum here), the float64 walk none beyond the float32 result's."""
    model = tiny_vit(depth=4, num_heads=2)
    images = _images(3, (32, 32), dtype=torch.float32, seed=3)
    tape = recorded_tape(model, images)
    tape64 = cast_tape(tape, copy.deepcopy(model).double())
    walk_in_float64_matches(tape, tape64, torch.tensor([0, 2, 4]))


# -- promises ------------------------------------------------------------------------------


@pytest.mark.parametrize("method", LRP_METHODS)
def test_no_side_effects_and_no_hooks_left(method):
    model = tiny_vit(distilled=True, drop_rate=0.1, drop_path_rate=0.1)
    model.train()
    before = ModelState.capture(model)
    hooks = hook_counts(model)
    Explainer(model).explain(_images(2, (32, 32), dtype=torch.float32), method=method)
    assert before.differences(ModelState.capture(model)) == []
    assert hook_counts(model) == hooks


def test_score_callables_are_refused_with_the_alternative():
    model = tiny_vit()
    with pytest.raises(TargetError, match="class indices"):
        Explainer(model).explain(
            _images(1, (32, 32), dtype=torch.float32),
            method="transformer_attribution",
            target=lambda out: out[:, 0] - out[:, 1],
        )


def test_other_block_types_are_named():
    from timm.models.vision_transformer import ResPostBlock

    model = tiny_vit(block_fn=ResPostBlock)
    with pytest.raises(UnsupportedModelError, match=r"ResPostBlock at blocks\.0: the relevance"):
        Explainer(model).explain(_images(1, (32, 32), dtype=torch.float32), method="lrp")


def _swap(model, path, module):
    owner = model
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    setattr(owner, name, module)
    return model


@pytest.mark.parametrize(
    ("path", "module", "named"),
    [
        ("blocks.1.mlp.act", nn.SiLU(), r"torch\.nn\.modules\.activation\.SiLU at blocks\.1"),
        ("blocks.0.attn.proj", nn.Conv1d(32, 32, 1), r"Conv1d at blocks\.0\.attn\.proj"),
        ("head", nn.Sequential(nn.Linear(32, 5)), r"Sequential at head"),
    ],
)
def test_uncovered_modules_are_named(path, module, named):
    model = _swap(tiny_vit(), path, module)
    before = ModelState.capture(model)
    for method in LRP_METHODS:
        with pytest.raises(UnsupportedModelError, match=named):
            Explainer(model).explain(_images(1, (32, 32), dtype=torch.float32), method=method)
    assert before.differences(ModelState.capture(model)) == []


def test_full_lrp_names_an_uncovered_patch_embedding():
    model = _swap(tiny_vit(), "patch_embed.norm", nn.Tanh())
    images = _images(1, (32, 32), dtype=torch.float32)
    with pytest.raises(UnsupportedModelError, match=r"Tanh at patch_embed\.norm"):
        Explainer(model).explain(images, method="lrp")
    # the token-level methods never pass the embedding
    Explainer(model).explain(images, method="transformer_attribution")


@pytest.mark.parametrize("method", LRP_METHODS)
def test_average_pooled_vit_batch_equals_single(method):
    """A mean-pooled readout hands the walk non-contiguous token relevance (the zoo's
    shapes-vit); the walk must take it as it comes."""
    model = tiny_vit(depth=2, num_heads=2, global_pool="avg", class_token=False).double()
    images = _images(2, (32, 32), seed=3)
    explainer = Explainer(model)
    both = explainer.explain(images, method=method, target=torch.tensor([1, 4]))
    assert bool(torch.isfinite(both.relevance).all())
    for b, target in enumerate((1, 4)):
        alone = explainer.explain(images[b : b + 1], method=method, target=target)
        torch.testing.assert_close(both.relevance[b], alone.relevance[0], rtol=1e-12, atol=1e-15)
