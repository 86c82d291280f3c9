"""The baselines the field compares against, as registered methods: Gradient x Input,
integrated gradients and occlusion at the input embeddings. Equal to independent float64
computations (reference_baselines) on images, padded texts and generations; batch equals
single; the path's points and the occluded copies run batched, in chunks the memory
budget sizes; integrated gradients is complete up to its quadrature's error; bad options
are refused before the model runs."""

from __future__ import annotations

import pytest
import reference_baselines as ref
import torch
from reference_hf import IMAGE_SIZE, padded_batch, tiny_image_model, tiny_text_model

from explain import METHODS, Explainer, OptionError
from explain.generation import Generation, explain_generation
from explain.rules import Need
from explain.rules.integrated_gradients import QUADRATURES, integration_points
from explain.testing import ModelState, tiny_vit
from explain.testing.tiny_lm import tiny_causal_lm

BASELINES = ["gradient_x_input", "integrated_gradients", "occlusion"]
TEXTS = [[2, 17, 5, 33, 8, 41, 3], [2, 9, 28, 3], [2, 50, 11, 6, 3]]
STEPS = 8


def _reference(method, scores, e, e0, target, steps=STEPS):
    if method == "gradient_x_input":
        return ref.gradient_x_input(scores, e, target)
    if method == "integrated_gradients":
        return ref.integrated_gradients(scores, e, e0, target, steps)
    return ref.occlusion(scores, e, e0, target)


def _options(method, **given):
    return {"steps": STEPS, **given} if method == "integrated_gradients" else given


def _images(count, size=32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, 3, size, size, generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("method", BASELINES)
def test_vit_equals_the_reference_at_the_patch_embeddings(method):
    model = tiny_vit(depth=3, num_heads=2).double()
    images = _images(2)
    before = ModelState.capture(model)
    result = Explainer(model).explain(images, method=method, target=[1, 3], **_options(method))
    assert before.differences(ModelState.capture(model)) == []
    assert result.relevance.shape == (2, 4, 4) and result.relevance.dtype == torch.float64
    for b, target in enumerate([1, 3]):
        scores, e, e0 = ref.timm_vit(model, images[b : b + 1])  # e0: zero pixels
        expected = _reference(method, scores, e, e0, target).reshape(4, 4)
        torch.testing.assert_close(result.relevance[b], expected, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("method", BASELINES)
@pytest.mark.parametrize(("name", "side"), [("bert-classifier", "right"), ("gpt2", "left")])
def test_text_equals_the_reference_on_a_padded_batch(method, name, side):
    model = tiny_text_model(name).double()
    targets = [0, 2, 1]
    batch = padded_batch(TEXTS, side)
    before = ModelState.capture(model)
    result = Explainer(model).explain(batch, method=method, target=targets, **_options(method))
    assert before.differences(ModelState.capture(model)) == []
    for b, (text, target) in enumerate(zip(TEXTS, targets, strict=True)):
        mask = batch["attention_mask"][b].bool()
        scores, e = ref.hf_text(model, text, last=name == "gpt2")
        expected = _reference(method, scores, e, torch.zeros_like(e), target)
        torch.testing.assert_close(result.relevance[b][mask], expected, rtol=1e-10, atol=1e-13)
        assert (result.relevance[b][~mask] == 0).all()  # pads exactly 0


@pytest.mark.parametrize("method", ["integrated_gradients", "occlusion"])
def test_a_baseline_token_stands_in_at_every_position(method):
    model = tiny_text_model("bert-classifier").double()
    batch = padded_batch(TEXTS)
    token = 7
    result = Explainer(model).explain(
        batch, method=method, target=1, baseline_token=token, **_options(method)
    )
    assert result.settings["baseline"] == "token 7"
    for b, text in enumerate(TEXTS):
        scores, e = ref.hf_text(model, text, last=False)
        e0 = model.get_input_embeddings()(torch.full((1, len(text)), token)).detach()
        expected = _reference(method, scores, e, e0, 1)
        torch.testing.assert_close(
            result.relevance[b, : len(text)], expected, rtol=1e-10, atol=1e-13
        )


@pytest.mark.parametrize("method", BASELINES)
def test_each_generated_token_equals_the_reference_of_its_prefix(method):
    model = tiny_causal_lm("llama").double()
    prompts = [[5, 9, 7], [6, 8]]
    continuations = [[11, 13, 17], [12]]
    width, count = 3, 3
    ids = torch.zeros(2, width + count, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, (prompt, continuation) in enumerate(zip(prompts, continuations, strict=True)):
        start = width - len(prompt)  # prompts left-padded, continuations right-padded
        ids[b, start : width + len(continuation)] = torch.tensor(prompt + continuation)
        mask[b, start : width + len(continuation)] = 1
    generation = Generation(ids, mask, prompt_length=width)
    relevance = explain_generation(
        Explainer(model), generation, method=method, **_options(method)
    ).explanation.relevance
    assert relevance.shape == (2, count, width + count)
    for b, (prompt, continuation) in enumerate(zip(prompts, continuations, strict=True)):
        start = width - len(prompt)
        for g in range(count):
            if g >= len(continuation):
                assert (relevance[b, g] == 0).all()  # past the continuation's end
                continue
            prefix = (prompt + continuation)[: len(prompt) + g]
            scores, e = ref.hf_text(model, prefix, last=True)
            expected = _reference(method, scores, e, torch.zeros_like(e), continuation[g])
            row = relevance[b, g]
            torch.testing.assert_close(
                row[start : start + len(prefix)], expected, rtol=1e-10, atol=1e-13
            )
            assert (row[:start] == 0).all() and (row[start + len(prefix) :] == 0).all()


# -- integrated gradients: the quadrature and completeness ------------------------------


@pytest.mark.parametrize("quadrature", QUADRATURES)
def test_every_quadrature_integrates_polynomials_as_it_should(quadrature):
    steps = 6
    alphas, weights = integration_points(steps, quadrature)
    assert alphas.dtype == weights.dtype == torch.float64 and len(alphas) == steps
    assert ((alphas >= 0) & (alphas <= 1)).all()
    torch.testing.assert_close(weights.sum(), torch.tensor(1.0, dtype=torch.float64))
    exact_to = {"gausslegendre": 2 * steps - 1, "riemann_middle": 1, "riemann_trapezoid": 1}
    for degree in range(exact_to.get(quadrature, 0) + 1):  # integral of a^k over [0, 1]
        integral = (weights * alphas**degree).sum()
        torch.testing.assert_close(integral, torch.tensor(1 / (degree + 1), dtype=torch.float64))
    if quadrature in ("riemann_right", "riemann_left"):  # exact for constants only
        assert abs(float((weights * alphas).sum()) - 0.5) == pytest.approx(1 / (2 * steps))


def test_the_papers_riemann_sum_equals_the_reference():
    model = tiny_vit(depth=2, num_heads=2).double()
    images = _images(1, seed=3)
    result = Explainer(model).explain(
        images, method="integrated_gradients", target=2, steps=5, quadrature="riemann_right"
    )
    scores, e, e0 = ref.timm_vit(model, images)
    expected = ref.integrated_gradients(scores, e, e0, 2, 5, "riemann_right").reshape(4, 4)
    torch.testing.assert_close(result.relevance[0], expected, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("kind", ["vit", "bert"])
def test_integrated_gradients_is_complete_up_to_the_quadrature_error(kind):
    """Summed over the tokens, the relevance is y(x) - y(baseline): the call records the
    baseline's score and the gap (captum's convergence delta), which shrinks with steps."""
    if kind == "vit":
        model = tiny_vit(depth=2, num_heads=2).double()
        inputs, targets = _images(2, seed=4), [1, 0]
    else:
        model = tiny_text_model("bert-classifier").double()
        inputs, targets = padded_batch(TEXTS[:2]), [0, 2]
    explainer = Explainer(model)
    gaps = []
    for steps in (8, 64):
        result = explainer.explain(
            inputs, method="integrated_gradients", target=targets, steps=steps
        )
        score = result.logits[torch.arange(2), result.target]
        baseline = torch.tensor(result.settings["baseline_score"], dtype=torch.float64)
        total = result.relevance.flatten(1).sum(dim=1)
        delta = torch.tensor(result.settings["convergence_delta"], dtype=torch.float64)
        torch.testing.assert_close(delta, total - (score - baseline), rtol=0, atol=1e-12)
        gaps.append(delta.abs().max())
    assert gaps[1] < 1e-6 * (score - baseline).abs().max() and gaps[1] < gaps[0]
    if kind == "vit":  # the baseline's score is the model's on zero pixels' embeddings
        scores, _, e0 = ref.timm_vit(model, inputs[:1])
        torch.testing.assert_close(baseline[0], scores(e0)[0, 1].detach(), rtol=1e-12, atol=0)


def test_integrated_gradients_records_its_path():
    result = Explainer(tiny_vit()).explain(_images(1).float(), method="integrated_gradients")
    settings = result.settings
    assert (settings["steps"], settings["quadrature"], settings["baseline"]) == (
        50,
        "gausslegendre",
        "zero pixels",
    )


# -- batched, chunked, batch equals single ------------------------------------------------


def _forwards(model, call):
    """How many times `model` ran a forward during `call`, and its result."""
    count = []
    handle = model.register_forward_pre_hook(lambda module, args: count.append(1))
    try:
        result = call()
    finally:
        handle.remove()
    return len(count), result


@pytest.mark.parametrize("method", ["integrated_gradients", "occlusion"])
def test_copies_run_batched_in_chunks_the_memory_budget_sizes(method):
    """The path's points (occlusion's copies) go through the model in as few forwards as
    the budget allows, not one per point: one chunk with room for all, one copy per chunk
    with almost none; the relevance is the same."""
    model = tiny_vit(depth=2, num_heads=2)
    images = _images(2).float()
    options = {"steps": 12} if method == "integrated_gradients" else {}
    copies = 12 if method == "integrated_gradients" else 16  # points, or patches
    extra = 1  # the inputs themselves (and the baseline, in the same forward)
    roomy, tight = Explainer(model, memory_budget=1 << 40), Explainer(model, memory_budget=1)
    wide, batched = _forwards(model, lambda: roomy.explain(images, method=method, **options))
    narrow, one_by_one = _forwards(model, lambda: tight.explain(images, method=method, **options))
    assert wide == extra + 1 and narrow == extra + copies
    torch.testing.assert_close(batched.relevance, one_by_one.relevance, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("method", BASELINES)
@pytest.mark.parametrize("kind", ["timm-vit", "hf-vit", "bert", "gpt2-left"])
def test_batch_equals_single(method, kind):
    if kind == "timm-vit":
        model, inputs, targets = tiny_vit(depth=2, num_heads=2), _images(3).float(), [0, 4, 2]
    elif kind == "hf-vit":
        model = tiny_image_model("vit")
        inputs, targets = _images(3, IMAGE_SIZE).float(), [0, 4, 2]
    else:
        model = tiny_text_model("bert-classifier" if kind == "bert" else "gpt2")
        inputs, targets = padded_batch(TEXTS, "right" if kind == "bert" else "left"), [2, 0, 1]
    explainer = Explainer(model)
    options = _options(method)
    batch = explainer.explain(inputs, method=method, target=targets, **options)
    for b, target in enumerate(targets):
        if kind in ("bert", "gpt2-left"):
            alone = explainer.explain(
                {"input_ids": torch.tensor([TEXTS[b]])}, method=method, target=target, **options
            )
            mask = inputs["attention_mask"][b].bool()
            got = batch.relevance[b][mask]
        else:
            alone = explainer.explain(inputs[b : b + 1], method=method, target=target, **options)
            got = batch.relevance[b]
        torch.testing.assert_close(got, alone.relevance[0], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("method", BASELINES)
def test_several_classes_per_input_equal_one_class_each(method):
    model = tiny_vit(depth=2, num_heads=2)
    images = _images(2).float()
    explainer = Explainer(model)
    both = explainer.explain(
        images, method=method, target=torch.tensor([[0, 3], [2, 1]]), **_options(method)
    )
    assert both.relevance.shape == (2, 2, 4, 4)
    for column, targets in enumerate([[0, 2], [3, 1]]):
        one = explainer.explain(images, method=method, target=targets, **_options(method))
        torch.testing.assert_close(both.relevance[:, column], one.relevance, rtol=1e-4, atol=1e-6)


def test_a_target_callable_scores_every_copy_as_it_scored_the_inputs():
    model = tiny_vit(depth=2, num_heads=2).double()
    images = _images(2)
    explainer = Explainer(model)
    for method in ("integrated_gradients", "occlusion"):
        contrast = lambda logits: logits[:, 1] - logits[:, 0]  # noqa: E731
        chosen = explainer.explain(images, method=method, target=contrast, **_options(method))
        one = explainer.explain(images, method=method, target=1, **_options(method))
        other = explainer.explain(images, method=method, target=0, **_options(method))
        torch.testing.assert_close(chosen.relevance, one.relevance - other.relevance)


# -- occlusion: scores and spans ----------------------------------------------------------


def test_occlusion_measures_the_chosen_score():
    model = tiny_text_model("bert-classifier").double()
    text = TEXTS[0]
    result = Explainer(model).explain(
        {"input_ids": torch.tensor([text])}, method="occlusion", target=1, score="probability"
    )
    scores, e = ref.hf_text(model, text, last=False)
    expected = ref.occlusion(lambda x: scores(x).softmax(dim=-1), e, torch.zeros_like(e), 1)
    torch.testing.assert_close(result.relevance[0], expected, rtol=1e-10, atol=1e-13)


def test_spans_are_occluded_whole_and_share_their_drop():
    model = tiny_text_model("bert-classifier").double()
    batch = padded_batch(TEXTS[:2])
    spans = torch.tensor([[-1, 0, 0, 1, 1, 1, -1], [-1, 0, 1, -1, -1, -1, -1]])
    result = Explainer(model).explain(batch, method="occlusion", target=2, spans=spans)
    for b, text in enumerate(TEXTS[:2]):
        scores, e = ref.hf_text(model, text, last=False)
        full = scores(e)[0, 2]
        for span in (0, 1):
            tokens = (spans[b, : len(text)] == span).nonzero().flatten()
            occluded = e.clone()
            occluded[:, tokens] = 0
            drop = (full - scores(occluded)[0, 2]).detach()
            share = result.relevance[b, tokens]
            torch.testing.assert_close(share, drop.expand(len(tokens)) / len(tokens))
        outside = spans[b] == -1
        assert (result.relevance[b][outside] == 0).all()


def test_image_spans_are_groups_of_patches():
    model = tiny_vit(depth=2, num_heads=2).double()
    images = _images(1, seed=5)
    quarters = torch.arange(4).reshape(2, 2).repeat_interleave(2, 0).repeat_interleave(2, 1)
    result = Explainer(model).explain(images, method="occlusion", target=0, spans=quarters)
    scores, e, e0 = ref.timm_vit(model, images)
    full = scores(e)[0, 0]
    for quarter in range(4):
        patches = (quarters.flatten() == quarter).nonzero().flatten()
        occluded = e.clone()
        occluded[:, patches] = e0[:, patches]
        drop = (full - scores(occluded)[0, 0]).detach()
        torch.testing.assert_close(result.relevance[0][quarters == quarter].sum(), drop)


# -- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "options", "match"),
    [
        ("integrated_gradients", {"steps": 0}, "steps >= 1"),
        ("integrated_gradients", {"steps": 1, "quadrature": "riemann_trapezoid"}, "steps >= 2"),
        ("integrated_gradients", {"quadrature": "simpson"}, "quadrature of .* must be one of"),
        # issue 46: a huge step count computed its Gauss-Legendre nodes before any limit
        ("integrated_gradients", {"steps": 10**9}, "gausslegendre takes at most 1024 steps"),
        ("integrated_gradients", {"baseline_token": 3}, "baseline_token replaces text"),
        ("occlusion", {"baseline_token": 3}, "baseline_token replaces text"),
        ("occlusion", {"spans": torch.zeros(3, 3, dtype=torch.long)}, "spans must have shape"),
        ("occlusion", {"spans": torch.zeros(4, 4)}, "integer span ids"),
        ("occlusion", {"spans": torch.full((4, 4), -1)}, "name no span"),
        ("occlusion", {"spans": torch.full((4, 4), -2)}, "must be >= 0"),
        ("gradient_x_input", {"steps": 3}, "has no option 'steps'"),
    ],
)
def test_bad_options_are_refused_before_the_model_runs(method, options, match):
    model = tiny_vit(depth=2, num_heads=2)
    _refused_up_front(model, _images(1).float(), method, options, match)


@pytest.mark.parametrize("token", [-1, True, 1.5, 60])
def test_a_baseline_token_must_be_in_the_vocabulary(token):
    model = tiny_text_model("bert-classifier")  # 60 tokens
    inputs = {"input_ids": torch.tensor([TEXTS[0]])}
    options = {"baseline_token": token}
    for method in ("integrated_gradients", "occlusion"):
        _refused_up_front(model, inputs, method, options, "baseline_token")


def _refused_up_front(model, inputs, method, options, match):
    def call():
        with pytest.raises(OptionError, match=match):
            Explainer(model).explain(inputs, method=method, **options)

    count, _ = _forwards(model, call)
    assert count == 0


def test_registered_with_what_they_need():
    needs = {
        "gradient_x_input": Need.EMBEDDING_GRADIENTS,
        "integrated_gradients": Need.EMBEDDING_COPIES,
        "occlusion": Need.EMBEDDING_COPIES,
    }
    for name, need in needs.items():
        spec = METHODS[name]
        assert spec.needs == {need} and spec.class_specific and spec.takes_score
        assert spec.gradient_rules is None and spec.lrp_rules is None
    assert METHODS["integrated_gradients"].needs_gradients
    assert not METHODS["occlusion"].needs_gradients
