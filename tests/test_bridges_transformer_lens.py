"""A TransformerLens TransformerBridge, booted offline from a saved tiny Llama folder with
`hf_model=`, is explained as the Hugging Face model it wraps: every method, generations
and cite equal the plain model's, and the bridge's components, hook points, hooks and
compatibility settings are left as found."""

from __future__ import annotations

import logging
import os
import warnings

import pytest
import torch

from explain import Explainer, UnsupportedModelError, engine
from explain.cite import cite
from explain.generation import explain_generation
from explain.testing import ModelState, tiny_lm


@pytest.fixture(scope="module", autouse=True)
def _transformer_lens():
    """TransformerLens, imported first here and not at collection: importing it
    sets the transformers logger to ERROR, adds warning filters and an environment
    variable for the whole process, which are put back after this module's tests so that
    no other test runs under them."""
    logger = logging.getLogger("transformers")
    level, filters, environ = logger.level, list(warnings.filters), dict(os.environ)
    try:
        yield pytest.importorskip(
            "transformer_lens.model_bridge", reason="the TransformerLens bridge needs its extra"
        )
    finally:
        logger.setLevel(level)
        warnings.filters[:] = filters
        os.environ.clear()
        os.environ.update(environ)


TEXTS = ["user w10 w11 w12", "user w3"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_lm.save_tiny_lm(tmp_path_factory.mktemp("tiny") / "llama")


def _boot(folder):
    """The bridge TransformerLens users boot around a model they loaded themselves."""
    from transformer_lens import model_bridge
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model_bridge.TransformerBridge.boot_transformers(
            str(folder),
            hf_model=AutoModelForCausalLM.from_pretrained(folder),
            tokenizer=AutoTokenizer.from_pretrained(folder),
        )


@pytest.fixture(scope="module")
def bridge(folder):
    """One bridge for the tests that only explain it: an explanation leaves the bridge as
    found (test_the_bridge_its_hooks_and_settings_are_left_as_found boots its own)."""
    return _boot(folder)


@pytest.fixture(scope="module")
def plain(folder, bridge) -> Explainer:
    """The plain Hugging Face model of the same folder, with the bridge's tokenizer (which
    TransformerLens sets to put a start token first)."""
    from transformers import AutoModelForCausalLM

    return Explainer(AutoModelForCausalLM.from_pretrained(folder), tokenizer=bridge.tokenizer)


def _methods() -> list[str]:
    return engine.supported_methods(Explainer(tiny_lm.tiny_causal_lm("llama")).adapter)


def _assert_same(result, expected) -> None:
    """Bit for bit: the explained modules and weights are the plain model's, so the same
    computation runs (the issue asks 1e-5 of the map's scale)."""
    assert torch.equal(result.relevance, expected.relevance)
    assert torch.equal(result.logits, expected.logits)


@pytest.mark.parametrize("method", _methods())
def test_every_method_equals_the_plain_hugging_face_model(bridge, plain, method):
    explainer = Explainer(bridge)
    assert explainer.tokenizer is bridge.tokenizer
    result = explainer.explain(TEXTS, method=method)
    expected = plain.explain(TEXTS, method=method)
    assert result.tokens == expected.tokens
    _assert_same(result, expected)


def test_generations_and_cite_equal_the_plain_models(bridge, plain):
    generated = explain_generation(Explainer(bridge), TEXTS, max_new_tokens=3)
    expected = explain_generation(plain, TEXTS, max_new_tokens=3)
    assert torch.equal(generated.generation.input_ids, expected.generation.input_ids)
    _assert_same(generated.explanation, expected.explanation)
    context, question, answer = "w9 w10 w11. w12 w13! w14 w15.", "w30 w31", "w40 w41"
    cited = cite(Explainer(bridge), context, question, answer, check=False)
    reference = cite(plain, context, question, answer, check=False)
    assert [span.text for span in cited.spans] == [span.text for span in reference.spans]
    assert torch.equal(cited.scores, reference.scores)


@pytest.mark.parametrize("compatibility", [False, True])
def test_the_bridge_its_hooks_and_settings_are_left_as_found(folder, compatibility):
    bridge = _boot(folder)
    if compatibility:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bridge.enable_compatibility_mode()
    patterns = []
    bridge.add_hook("blocks.0.attn.hook_pattern", lambda pattern, hook: patterns.append(pattern))
    tokens = bridge.to_tokens("user w10 w11")
    _, cache = bridge.run_with_cache(tokens)
    before = ModelState.capture(bridge)
    implementation = bridge.original_model.config._attn_implementation
    explainer = Explainer(bridge)
    for method in ("generic", "attnlrp"):
        explainer.explain(TEXTS, method=method)
    explain_generation(explainer, TEXTS, max_new_tokens=2)
    assert before.differences(ModelState.capture(bridge)) == []
    assert bridge.compatibility_mode is compatibility
    assert bridge.original_model.config._attn_implementation == implementation
    assert len(patterns) == 1  # an explanation runs none of the bridge's hook points
    _, again = bridge.run_with_cache(tokens)
    assert len(patterns) == 2  # the user's hook still runs at the bridge's own forward
    assert cache.keys() == again.keys()
    assert all(torch.equal(cache[name], again[name]) for name in cache)


def test_in_compatibility_mode_the_view_computes_what_the_bridge_computes(folder):
    """enable_compatibility_mode centres the unembedding in place: the explained model is
    the one the bridge runs, its logits the bridge's."""
    bridge = _boot(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge.enable_compatibility_mode()
    tokens = bridge.to_tokens("user w10 w11")
    with torch.no_grad():
        logits = bridge(tokens)
    result = Explainer(bridge).explain({"input_ids": tokens, "attention_mask": tokens * 0 + 1})
    torch.testing.assert_close(result.logits, logits[:, -1], rtol=1e-4, atol=1e-4)


def test_a_native_model_is_refused_saying_what_to_use_instead():
    """TransformerLens 4's native models (boot_native from its own config; HookedTransformer
    is gone since 4.0) hold no Hugging Face model: refused, pointing to boot_transformers
    around a Hugging Face model built from a config."""
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    config = TransformerBridgeConfig(
        d_model=16, n_layers=1, n_heads=2, d_head=8, n_ctx=16, d_vocab=64, act_fn="gelu", seed=0
    )
    bridge = TransformerBridge.boot_native(config)
    with pytest.raises(
        UnsupportedModelError,
        match=r"wraps a transformer_lens\..*NativeModel, not a Hugging Face model.*"
        r"boot_transformers\(folder, hf_model=model\)",
    ):
        Explainer(bridge)
