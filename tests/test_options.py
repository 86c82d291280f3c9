"""No option is accepted and ignored: what every family does is in test_conformance (a
score only for the methods that differentiate one, a tokenizer only for models that read
text); here the cases that are not per family."""

from __future__ import annotations

import pytest
import torch

from explain import Contrast, Explainer, OptionError, TargetError, explain
from explain.testing import tiny_case, tiny_vit


@pytest.fixture(scope="module")
def vit():
    return tiny_vit(depth=2, num_heads=2).eval()


@pytest.fixture(scope="module")
def images():
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def _second_logit(output):
    """A target callable that returns the scores to explain itself."""
    return output[:, 1] * 2.0


def test_a_target_callable_that_returns_scores_takes_no_score(vit, images):
    explainer = Explainer(vit)
    with pytest.raises(OptionError, match="callable returned the scores"):
        explainer.explain(images, target=_second_logit, score="probability")
    with pytest.raises(OptionError, match="callable returned the scores"):
        explainer.trace(images, target=_second_logit, score="logit")
    result = explainer.explain(images, target=_second_logit)
    assert result.score == "custom" and result.target.tolist() == [-1, -1]
    # The callable's scores are what is explained: twice the logit of class 1.
    by_class = explainer.explain(images, target=1)
    torch.testing.assert_close(result.relevance, 2.0 * by_class.relevance)
    assert explainer.trace(images, target=_second_logit).score == "custom"


def test_an_encoder_decoder_callable_that_returns_scores_takes_no_score():
    case = tiny_case("hf_encoder_decoder")
    explainer = Explainer(case.model)
    with pytest.raises(OptionError, match="callable returned the scores"):
        explainer.explain(case.batch, target=lambda logits: logits[:, 3], score="logit")
    assert explainer.explain(case.batch, target=lambda logits: logits[:, 3]).score == "custom"


def test_a_score_defaults_to_the_logit_and_trace_to_the_probability(vit, images):
    explainer = Explainer(vit)
    assert explainer.explain(images).score == "logit"
    assert explainer.trace(images).score == "probability"
    assert explainer.explain(images, score="probability").score == "probability"


def test_a_dual_encoder_explains_and_traces_its_similarity_logit_only():
    case = tiny_case("hf_clip")
    explainer = Explainer(case.model)
    assert explainer.trace(case.batch).score == "logit"
    assert explainer.explain(case.batch, score="logit").score == "logit"
    for call in (explainer.explain, explainer.trace):
        with pytest.raises(TargetError, match="similarity logit"):
            call(case.batch, score="probability")


def test_the_one_shot_function_passes_the_attention_path_on(vit, images):
    result = explain(vit, images, attention_path="explicit", method="attention_gradcam")
    expected = Explainer(vit, attention_path="explicit").explain(images, method="attention_gradcam")
    torch.testing.assert_close(result.relevance, expected.relevance, rtol=0, atol=0)
    with pytest.raises(OptionError, match="attention_path must be one of"):
        explain(vit, images, attention_path="sometimes")


def _meta(values):
    return torch.tensor(values, device="meta")


@pytest.mark.parametrize(
    ("method", "given", "error", "named"),
    [
        ("occlusion", {"baseline_token": _meta(3)}, OptionError, "option baseline_token"),
        (
            "integrated_gradients",
            {"baseline_token": _meta(3)},
            OptionError,
            "option baseline_token",
        ),
        ("occlusion", {"spans": _meta([[0, 0, 1, 1, 2, 2]])}, OptionError, "option spans"),
        ("generic", {"start_layer": _meta(0)}, OptionError, "start_layer"),
        ("generic", {"start_layer": {"text": _meta(0)}}, OptionError, r"start_layer\['text'\]"),
        ("generic", {"target": _meta([0, 1])}, TargetError, "the target"),
        ("generic", {"target": Contrast(None, _meta(1))}, TargetError, "the target"),
    ],
)
def test_an_option_on_the_meta_device_is_refused_naming_it(method, given, error, named):
    """Issue 46: options on the meta device reached PyTorch's NotImplementedError (spans)
    or RuntimeError (.item() of baseline_token, start_layer) wherever they were read."""
    case = tiny_case("hf_text_encoder")
    with pytest.raises(error, match=f"^{named} is on the meta device, which holds no values"):
        Explainer(case.model, spec=case.spec).explain(case.batch, method=method, **given)
