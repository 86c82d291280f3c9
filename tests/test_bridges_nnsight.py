"""An nnsight model (`LanguageModel` around a Hugging Face model object) is looked
through like PEFT: Explainer(lm) explains the module it wraps with its tokenizer, equal
bit for bit to the plain model, and leaves nnsight's envoys, its forwards on every module
and its traces as found."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

from explain import Explainer, UnsupportedModelError, engine
from explain.generation import explain_generation
from explain.testing import ModelState, tiny_lm

nnsight = pytest.importorskip("nnsight", reason="the nnsight bridge needs the nnsight extra")

TEXTS = ["user w10 w11 w12", "user w3"]


def _language_model():
    """A tiny Llama as nnsight wraps it (LanguageModel is deprecated in nnsight 0.8 for
    TransformersModel, which it subclasses; people still write it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return nnsight.LanguageModel(
            tiny_lm.tiny_causal_lm("llama"), tokenizer=tiny_lm.tiny_tokenizer()
        )


@functools.cache
def _plain() -> Explainer:
    return Explainer(tiny_lm.tiny_causal_lm("llama"), tokenizer=tiny_lm.tiny_tokenizer())


def _methods() -> list[str]:
    return engine.supported_methods(_plain().adapter)


def _traced(lm) -> torch.Tensor:
    with lm.trace("user w10 w11"):
        logits = lm.lm_head.output.save()
    return logits


def test_the_wrapped_module_and_its_tokenizer_are_explained():
    lm = _language_model()
    explainer = Explainer(lm)
    assert explainer.model is lm._module
    assert explainer.tokenizer is lm.tokenizer


@pytest.mark.parametrize("method", _methods())
def test_explaining_it_equals_the_plain_model(method):
    lm = _language_model()
    _traced(lm)  # a model nnsight has traced once explains the same
    wrapped = Explainer(lm).explain(TEXTS, method=method)
    plain = _plain().explain(TEXTS, method=method)
    assert torch.equal(wrapped.relevance, plain.relevance)
    assert torch.equal(wrapped.logits, plain.logits)
    assert wrapped.tokens == plain.tokens


def test_a_generation_equals_the_plain_models():
    wrapped = explain_generation(Explainer(_language_model()), TEXTS, max_new_tokens=3)
    plain = explain_generation(_plain(), TEXTS, max_new_tokens=3)
    assert torch.equal(wrapped.generation.input_ids, plain.generation.input_ids)
    assert torch.equal(wrapped.explanation.relevance, plain.explanation.relevance)


def test_envoys_forwards_and_traces_are_left_as_found():
    lm = _language_model()
    module = lm._module
    before = ModelState.capture(module)
    forwards = {name: m.__dict__.get("forward") for name, m in module.named_modules()}
    envoys = [(envoy.path, type(envoy)) for envoy in lm.modules()]
    traced = _traced(lm)
    explainer = Explainer(lm)
    for method in ("generic", "attnlrp"):
        explainer.explain(TEXTS, method=method)
    explain_generation(explainer, TEXTS, max_new_tokens=2)
    assert before.differences(ModelState.capture(module)) == []
    assert {name: m.__dict__.get("forward") for name, m in module.named_modules()} == forwards
    assert all(forward is not None for forward in forwards.values())  # nnsight's, kept
    assert [(envoy.path, type(envoy)) for envoy in lm.modules()] == envoys
    assert torch.equal(_traced(lm), traced)


def test_a_model_whose_weights_nnsight_has_not_loaded_is_refused(tmp_path):
    from transformers import AutoTokenizer

    folder = tiny_lm.save_tiny_lm(tmp_path / "llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        lm = nnsight.LanguageModel(str(folder), tokenizer=AutoTokenizer.from_pretrained(folder))
    with pytest.raises(UnsupportedModelError, match=r"call model\.dispatch\(\) first"):
        Explainer(lm)
    lm.dispatch()
    assert torch.equal(Explainer(lm).explain(TEXTS).relevance, _plain().explain(TEXTS).relevance)
