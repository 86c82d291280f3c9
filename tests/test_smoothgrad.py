"""SmoothGrad at the input embeddings: equal to an independent float64 loop over its noisy
copies (reference_baselines.smoothgrad) on a timm ViT, BERT and GPT-2 on padded batches,
in its four variants; batch equals single, chunks do not change the noise; the caller's
RNG, the model's parameters and modes are as found; bad options are refused before the
model runs. tests/test_baselines_captum.py compares it with captum's NoiseTunnel."""

from __future__ import annotations

import pytest
import reference_baselines as ref
import torch
from reference_hf import padded_batch, tiny_text_model

from explain import METHODS, Explainer, OptionError
from explain.rules import Need
from explain.rules.smoothgrad import counter_normals
from explain.testing import ModelState, tiny_vit

TEXTS = [[2, 17, 5, 33, 8, 41, 3], [2, 9, 28, 3], [2, 50, 11, 6, 3]]
SAMPLES = 6
VARIANTS = [
    {},
    {"times_input": True},
    {"squared": True},
    {"squared": True, "times_input": True},
]


def _images(count, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, 3, 32, 32, generator=generator, dtype=torch.float64)


def _expected(scores, e, target, options):
    options = {"samples": SAMPLES, "sigma": 0.15, "seed": 0, **options}
    return ref.smoothgrad(scores, e, target, **options)


@pytest.mark.parametrize("options", VARIANTS)
def test_vit_equals_the_reference_at_the_patch_embeddings(options):
    model = tiny_vit(depth=3, num_heads=2).double()
    images = _images(2)
    before = ModelState.capture(model)
    rng = torch.get_rng_state()
    result = Explainer(model).explain(
        images, method="smoothgrad", target=[1, 3], samples=SAMPLES, **options
    )
    assert torch.equal(torch.get_rng_state(), rng)
    assert before.differences(ModelState.capture(model)) == []
    assert result.relevance.shape == (2, 4, 4) and result.relevance.dtype == torch.float64
    for b, target in enumerate([1, 3]):
        scores, e, _ = ref.timm_vit(model, images[b : b + 1])
        expected = _expected(scores, e, target, options).reshape(4, 4)
        torch.testing.assert_close(result.relevance[b], expected, rtol=1e-10, atol=1e-13)
        stdev = result.settings["noise_stdev"][b]
        assert stdev == pytest.approx(0.15 * float(e.max() - e.min()), rel=1e-12)
    assert (result.settings["samples"], result.settings["sigma"], result.settings["seed"]) == (
        SAMPLES,
        0.15,
        0,
    )


@pytest.mark.parametrize("options", [{}, {"times_input": True, "seed": 7, "sigma": 0.3}])
@pytest.mark.parametrize(("name", "side"), [("bert-classifier", "right"), ("gpt2", "left")])
def test_text_equals_the_reference_on_a_padded_batch(name, side, options):
    """Each text's noise is drawn over its own tokens, wherever the batch pads it."""
    model = tiny_text_model(name).double()
    targets = [0, 2, 1]
    batch = padded_batch(TEXTS, side)
    result = Explainer(model).explain(
        batch, method="smoothgrad", target=targets, samples=SAMPLES, **options
    )
    for b, (text, target) in enumerate(zip(TEXTS, targets, strict=True)):
        mask = batch["attention_mask"][b].bool()
        scores, e = ref.hf_text(model, text, last=name == "gpt2")
        expected = _expected(scores, e, target, options)
        torch.testing.assert_close(result.relevance[b][mask], expected, rtol=1e-10, atol=1e-13)
        assert (result.relevance[b][~mask] == 0).all()  # pads exactly 0


@pytest.mark.parametrize("kind", ["vit", "gpt2-left"])
def test_batch_equals_single_and_chunks_change_nothing(kind):
    """A sample's noise does not depend on its batch, nor on how many copies a forward
    holds (one per forward under a budget of one byte)."""
    if kind == "vit":
        model, inputs, targets = tiny_vit(depth=2, num_heads=2), _images(3).float(), [0, 4, 2]
        alone = [inputs[b : b + 1] for b in range(3)]
    else:
        model, inputs, targets = tiny_text_model("gpt2"), padded_batch(TEXTS, "left"), [2, 0, 1]
        alone = [{"input_ids": torch.tensor([text])} for text in TEXTS]
    options = {"method": "smoothgrad", "samples": 4, "times_input": True}
    batch = Explainer(model).explain(inputs, target=targets, **options)
    tight = Explainer(model, memory_budget=1).explain(inputs, target=targets, **options)
    torch.testing.assert_close(tight.relevance, batch.relevance, rtol=1e-4, atol=1e-6)
    for b, target in enumerate(targets):
        one = Explainer(model).explain(alone[b], target=target, **options)
        got = batch.relevance[b]
        if kind != "vit":
            got = got[inputs["attention_mask"][b].bool()]
        torch.testing.assert_close(got, one.relevance[0], rtol=1e-4, atol=1e-6)
        assert batch.settings["noise_stdev"][b] == pytest.approx(one.settings["noise_stdev"][0])


@pytest.mark.parametrize("seed", [0, 7, 2**40 + 5, -1])
def test_the_noise_is_the_documented_generators(seed):
    """counter_normals against the reference's entry-by-entry unsigned arithmetic, for
    seeds beyond 32 bits and negative ones (taken mod 2^64), and copies past the first."""
    entries = torch.arange(1, 301)
    draws = counter_normals(seed, range(3, 5), entries, torch.float64)
    assert draws.shape == (2, 1, 300)
    for copy, drawn in zip((3, 4), draws[:, 0], strict=True):
        torch.testing.assert_close(drawn, ref.counter_noise(seed, copy, 300), rtol=0, atol=1e-12)


def test_the_noise_is_standard_normal_and_uncorrelated():
    """2^17 draws of two copies: mean 0, variance 1, the normal's tail mass beyond 2, no
    correlation between copies or neighbours (each bound 5 to 7 standard errors)."""
    draws = counter_normals(0, range(2), torch.arange(1, 2**17 + 1), torch.float64)[:, 0]
    first, second = draws
    assert abs(float(draws.mean())) < 0.01 and abs(float(draws.var()) - 1) < 0.02
    assert abs(float((draws.abs() > 2).double().mean()) - 0.0455) < 0.003
    for a, b in [(first, second), (first[1:], first[:-1])]:
        assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 0.015


def test_the_seed_chooses_the_noise():
    model = tiny_vit(depth=2, num_heads=2).double()
    images = _images(1, seed=2)
    explainer = Explainer(model)
    first, again, other = (
        explainer.explain(images, method="smoothgrad", samples=3, seed=seed).relevance
        for seed in (5, 5, 6)
    )
    assert torch.equal(first, again) and not torch.allclose(first, other)
    no_noise = explainer.explain(images, method="smoothgrad", samples=3, sigma=0.0)
    scores, e, _ = ref.timm_vit(model, images)
    target = int(no_noise.target[0])
    plain = ref.smoothgrad(scores, e, target, samples=1, sigma=0.0, seed=0)
    torch.testing.assert_close(no_noise.relevance[0].flatten(), plain, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"samples": 0}, "samples must be >= 1"),
        ({"sigma": -0.1}, "sigma must be a finite number >= 0"),
        ({"sigma": float("nan")}, "sigma must be a finite number >= 0"),
        ({"squared": 1}, "option squared of 'smoothgrad' must be True or False"),
        ({"steps": 3}, "has no option 'steps'"),
    ],
)
def test_bad_options_are_refused_before_the_model_runs(options, match):
    model = tiny_vit(depth=2, num_heads=2)
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        with pytest.raises(OptionError, match=match):
            Explainer(model).explain(_images(1).float(), method="smoothgrad", **options)
    finally:
        handle.remove()
    assert calls == []


def test_registered_as_a_copies_method():
    spec = METHODS["smoothgrad"]
    assert spec.needs == {Need.EMBEDDING_COPIES} and spec.class_specific
    assert spec.needs_gradients and spec.takes_score and not spec.linear_in_score
    assert "Smilkov" in spec.summary
