"""Contrastive targets ("why A rather than B"): the differentiated score is A's minus B's,
from one forward. For the methods linear in the score (AttnLRP, CP-LRP: Gradient x Input
under rules fixed by the forward) the relevance equals A's minus B's; generic's clamp
breaks that, and it is checked that it does. Methods that differentiate no score, or
start an LRP walk from one logit, and models whose targets are not classes of one
output, refuse a contrast before any work."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import PLAIN_BASELINES, float32_atol

from explain import Contrast, Explainer, OptionError, TargetError
from explain.engine import supported_methods
from explain.testing import ModelState, tiny_case
from explain.testing.tiny_lm import tiny_causal_lm

TEXTS = {
    "input_ids": torch.tensor([[5, 9, 14, 22, 31], [7, 12, 40, 3, 0]]),
    "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]),
}
LINEAR = ("attnlrp", "cp_lrp", "gradient_x_input", "integrated_gradients", "occlusion")
SCORES = ("logit", "log_probability", "probability")


def _tolerance(method: str, expected: torch.Tensor) -> dict[str, float]:
    """1e-10 in float64; but the Llama's RMSNorm computes in float32 whatever the model's
    dtype, and a plain gradient goes through its backward (AttnLRP's identity rule does
    not): the baselines' maps carry float32's rounding there (conftest.PLAIN_BASELINES)."""
    if method in PLAIN_BASELINES:
        return {"rtol": 1e-4, "atol": float32_atol(method, expected, 1e-12)}
    return {"rtol": 1e-10, "atol": 1e-12}


@functools.cache
def _llama():
    return tiny_causal_lm("llama").double()


@pytest.mark.parametrize("method", LINEAR)
@pytest.mark.parametrize("score", SCORES)
def test_linear_methods_explain_the_difference_of_the_two_explanations(method, score):
    explainer = Explainer(_llama())
    contrast = explainer.explain(TEXTS, target=Contrast(20, [21, 33]), method=method, score=score)
    target = explainer.explain(TEXTS, target=20, method=method, score=score)
    foil = explainer.explain(TEXTS, target=[21, 33], method=method, score=score)
    difference = target.relevance - foil.relevance
    torch.testing.assert_close(contrast.relevance, difference, **_tolerance(method, difference))
    assert contrast.target.tolist() == [20, 20]
    assert contrast.settings["foil"] == [21, 33]
    assert contrast.score == score


@pytest.mark.parametrize("method", ["generic", "attention_gradcam", *LINEAR])
@pytest.mark.parametrize("score", SCORES)
def test_every_method_that_takes_one_explains_the_difference_of_the_scores(method, score):
    """The contrast differentiates exactly score(A) - score(B): the same as a callable
    target that returns that difference, for every method that takes a contrast."""

    def difference(logits):
        values = {
            "logit": logits,
            "log_probability": logits.log_softmax(-1),
            "probability": logits.softmax(-1),
        }[score]
        return values[:, 20] - values[torch.arange(2), torch.tensor([21, 33])]

    explainer = Explainer(_llama())
    contrast = explainer.explain(TEXTS, target=Contrast(20, [21, 33]), method=method, score=score)
    custom = explainer.explain(TEXTS, target=difference, method=method)
    tolerance = _tolerance(method, custom.relevance)
    torch.testing.assert_close(contrast.relevance, custom.relevance, **tolerance)


@pytest.mark.parametrize("method", ["generic", "attention_gradcam"])
def test_the_clamping_rules_are_not_the_difference_of_the_two_explanations(method):
    explainer = Explainer(_llama())
    contrast = explainer.explain(TEXTS, target=Contrast(20, 21), method=method)
    target = explainer.explain(TEXTS, target=20, method=method)
    foil = explainer.explain(TEXTS, target=21, method=method)
    assert not torch.allclose(contrast.relevance, target.relevance - foil.relevance, atol=1e-6)


def test_the_predicted_class_against_a_foil_and_a_classifier():
    explainer = Explainer(_llama())
    contrast = explainer.explain(TEXTS, target=Contrast(None, 3), method="attnlrp")
    predicted = explainer.explain(TEXTS, method="attnlrp")
    foil = explainer.explain(TEXTS, target=3, method="attnlrp")
    assert torch.equal(contrast.target, predicted.target)
    torch.testing.assert_close(
        contrast.relevance, predicted.relevance - foil.relevance, rtol=1e-10, atol=1e-12
    )
    case = tiny_case("hf_text_encoder")
    model = case.model.double()
    classifier = Explainer(model)
    before = ModelState.capture(model)
    contrast = classifier.explain(case.batch, target=Contrast(0, 2), method="cp_lrp")
    assert before.differences(ModelState.capture(model)) == []
    difference = (
        classifier.explain(case.batch, target=0, method="cp_lrp").relevance
        - classifier.explain(case.batch, target=2, method="cp_lrp").relevance
    )
    torch.testing.assert_close(contrast.relevance, difference, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", ["rollout", "raw_attention", "random"])
def test_methods_that_differentiate_no_score_refuse_a_contrast(method):
    explainer = Explainer(_llama())
    assert method in supported_methods(explainer.adapter)
    with pytest.raises(OptionError, match=r"gives one map whatever the target.*can: "):
        explainer.explain(TEXTS, target=Contrast(20, 21), method=method)


def test_lrp_walks_and_other_kinds_of_model_refuse_a_contrast():
    bert = Explainer(tiny_case("hf_text_encoder").model)
    with pytest.raises(OptionError, match="starts its LRP walk from one class's logit"):
        bert.explain(tiny_case("hf_text_encoder").batch, target=Contrast(0, 1), method="lrp")
    case = tiny_case("hf_clip")
    with pytest.raises(OptionError, match="dual encoder's target picks the text"):
        Explainer(case.model).explain(case.batch, target=Contrast(0, 1))


def test_bad_contrasts_are_refused():
    explainer = Explainer(_llama())
    with pytest.raises(TargetError, match="foil"):
        explainer.explain(TEXTS, target=Contrast(20, None), method="attnlrp")  # type: ignore[arg-type]
    with pytest.raises(TargetError, match="class indices"):
        explainer.explain(TEXTS, target=Contrast(20, lambda out: out[:, 0]), method="attnlrp")
    with pytest.raises(TargetError, match="one class per input"):
        explainer.explain(TEXTS, target=Contrast(20, [[1, 2], [3, 4]]), method="attnlrp")
    with pytest.raises(TargetError, match="out of range"):
        explainer.explain(TEXTS, target=Contrast(20, 10_000), method="attnlrp")
