"""The contracts every registered family keeps, for every method it supports, written once.

Parametrised over the registry (explain.architectures.registry) through each family's
tiny model (explain.testing.TINY_MODELS), in the style of timm's tests/test_models.py: a
family is tested the day it is registered, and a family registered without a tiny model
fails here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import pytest
import torch
from conftest import PLAIN_BASELINES
from tolerances import assert_float32_close

from explain import METHODS, Explainer, ExplainError, InputError, OptionError, TargetError
from explain.architectures import FAMILIES
from explain.architectures.base import Adapter, Detector, EncoderDecoder
from explain.architectures.dual_encoder import DualEncoder
from explain.engine import supported_methods
from explain.rules import LRP_NEEDS
from explain.testing import TINY_MODELS, ModelState, TinyCase, tiny_case

OPTIONAL = {"open_clip": "open_clip"}  # family -> the package its models come from


@functools.cache
def _case(family: str) -> TinyCase:
    """One tiny model per family for the whole module (every call leaves it as it was,
    which test_no_side_effects checks), in float64 so that equal maths compares equal
    to ~1e-12 even where LRP's original rules amplify rounding."""
    case = tiny_case(family)
    case.model.double()
    return case


CASES = sorted(set(FAMILIES) | set(TINY_MODELS))
"""Every registered family (one without a tiny model fails), and the hand-written
transformers explained through a TransformerSpec."""


def _adapter(case: TinyCase) -> Adapter:
    return Explainer(case.model, spec=case.spec).adapter


def _available(family: str) -> bool:
    package = OPTIONAL.get(family)
    if package is None:
        return True
    try:
        __import__(package)
    except ImportError:
        return False
    return True


def _family_params() -> list:
    return [
        pytest.param(
            family,
            marks=pytest.mark.skipif(
                not _available(family), reason=f"{OPTIONAL.get(family)} is not installed"
            ),
        )
        for family in CASES
    ]


def _method_params() -> list:
    """(family, method) for every method each family supports."""
    params = []
    for family in CASES:
        if not _available(family):
            continue
        adapter = _adapter(_case(family))
        params += [pytest.param(family, method) for method in supported_methods(adapter)]
    return params


def _explain(family: str, inputs=None, *, attention_path="auto", **kwargs):
    case = _case(family)
    explainer = Explainer(case.model, spec=case.spec, attention_path=attention_path)
    return explainer.explain(case.batch if inputs is None else inputs, **kwargs)


def _close(actual, expected, *, float32_softmax: bool = False, method: str = ""):
    """Equal to float64's rounding; or, between two computations whose float32 softmax
    rounded differently (below), as float32 keeps: the plain baselines' small entries
    carry more of its rounding (conftest.PLAIN_BASELINES)."""
    if float32_softmax:
        assert_float32_close(actual, expected, of_scale=1e-5 if method in PLAIN_BASELINES else 1e-6)
    else:
        torch.testing.assert_close(actual, expected, rtol=1e-9, atol=1e-12)


# Families whose eager attention (transformers') computes its softmax in float32 even in
# these float64 models: two computations that round their scores to float32 differently
# (other shapes, other summation orders, eager against sdpa) agree as float32 does
FLOAT32_SOFTMAX = (
    "hf_siglip_classifier",
    "hf_causal_lm:",
    "hf_llava",
    "hf_paligemma",
    "hf_gemma3",
    "hf_qwen2_vl",
    "hf_qwen2_5_vl",
    "hf_idefics3",
    "hf_smolvlm",
)
"""Cases (by name prefix) whose eager attention takes its softmax in float32 whatever the
model's dtype (transformers' SigLIP, Llama and its kin, also inside LLaVA, PaliGemma,
Gemma 3, Qwen2-VL, Qwen2.5-VL, Idefics3 and SmolVLM): their explicit path is float32-exact
only, the fused one float64."""


def test_a_family_without_a_tiny_model_is_named():
    with pytest.raises(KeyError, match=r"no_such_family.*TINY_MODELS"):
        tiny_case("no_such_family")


def test_every_registered_family_has_a_tiny_model_that_it_serves():
    for family, entry in FAMILIES.items():
        if _available(family):
            assert type(_adapter(_case(family))) is entry.load(), family


@pytest.mark.parametrize(("family", "method"), _method_params())
def test_no_side_effects_after_good_and_failing_calls(family, method):
    model = _case(family).model
    before = ModelState.capture(model)
    _explain(family, method=method)
    assert before.differences(ModelState.capture(model)) == []
    with pytest.raises(ExplainError):
        _explain(family, method=method, target=10**6)  # no such class, text or token
    assert before.differences(ModelState.capture(model)) == []


@pytest.mark.parametrize(("family", "method"), _method_params())
def test_a_batch_equals_each_input_alone(family, method):
    if method == "random":
        pytest.skip("a chance baseline: its noise is drawn per batch, reproducibly per seed")
    case = _case(family)
    together = _explain(family, method=method)
    pairs = isinstance(_adapter(case), DualEncoder)
    # A padded row's float64 scores round to float32 for the softmax a little differently
    # from the same row alone (other shapes, other summation orders).
    float32_softmax = family.startswith(FLOAT32_SOFTMAX)
    for index, alone in enumerate(case.alone):
        single = _explain(family, alone, method=method)
        if not pairs:  # a dual encoder's target indexes the texts of its own batch
            assert torch.equal(together.target[index], single.target[0])
        for name, relevance in together.relevances.items():
            real = case.lengths.get(name, (None, None))[index]
            expected = single.relevances[name][0][..., :real]
            _close(
                relevance[index][..., :real],
                expected,
                float32_softmax=float32_softmax,
                method=method,
            )


@pytest.mark.parametrize(("family", "method"), _method_params())
def test_text_padding_gets_exactly_zero(family, method):
    case = _case(family)
    if not case.lengths:
        pytest.skip("no text in this family's inputs")
    explanation = _explain(family, method=method)
    for name, lengths in case.lengths.items():
        for index, real in enumerate(lengths):
            assert (explanation.relevances[name][index, real:] == 0).all(), (name, index)


@pytest.mark.parametrize(("family", "method"), _method_params())
def test_k_targets_equal_k_separate_calls(family, method):
    case = _case(family)
    pairs = isinstance(_adapter(case), DualEncoder)
    if method == "random" and pairs:
        pytest.skip("each (image, text) pair is a sample, and the noise is drawn per batch")
    if isinstance(_adapter(case), EncoderDecoder):
        # Several tokens per input are several decoder positions (position="all").
        with pytest.raises(TargetError):
            _explain(family, method=method, target=torch.tensor([[0, 1], [1, 0]]))
        every = _explain(family, method=method, position="all")
        ids = case.batch["decoder_input_ids"]
        for position in range(2):  # inside both decoder sequences
            one = _explain(family, method=method, position=position, target=ids[:, position + 1])
            assert every.target[:, position].tolist() == one.target.tolist()
            for name, relevance in every.relevances.items():
                _close(relevance[:, position], one.relevances[name])
        return
    if isinstance(_adapter(case), Detector):
        # A detection is explained for its own class; several are several queries.
        with pytest.raises(OptionError, match="no target"):
            _explain(family, method=method, target=torch.tensor([[0, 1], [1, 0]]))
        queries = torch.tensor([[0, 1], [1, 0]])
        both = _explain(family, method=method, queries=queries)
        for k in range(queries.shape[1]):
            one = _explain(family, method=method, queries=queries[:, k])
            assert both.target[:, k].tolist() == one.target[:, 0].tolist()
            for name, relevance in both.relevances.items():
                _close(relevance[:, k], one.relevances[name][:, 0])
        return
    classes = torch.tensor([[0, 1], [1, 0]])
    both = _explain(family, method=method, target=classes)
    for k in range(classes.shape[1]):
        one = _explain(family, method=method, target=classes[:, k])
        assert both.target[:, k].tolist() == one.target.tolist()
        for name, relevance in both.relevances.items():
            _close(relevance[:, k], one.relevances[name])


@pytest.mark.parametrize(("family", "method"), _method_params())
def test_explicit_equals_fused_or_fused_is_refused(family, method):
    adapter = _adapter(_case(family))
    if adapter.fused_path() is None or METHODS[method].needs & LRP_NEEDS:
        with pytest.raises(ExplainError, match="fused"):
            _explain(family, method=method, attention_path="fused")
        return
    fused = _explain(family, method=method, attention_path="fused")
    explicit = _explain(family, method=method, attention_path="explicit")
    assert fused.target.tolist() == explicit.target.tolist()
    float32_softmax = family.startswith(FLOAT32_SOFTMAX)
    for name, relevance in explicit.relevances.items():
        _close(fused.relevances[name], relevance, float32_softmax=float32_softmax, method=method)


@pytest.mark.parametrize("family", _family_params())
def test_trace_explains_the_default_target_of_explain(family):
    case = _case(family)
    if isinstance(_adapter(case), Detector):  # one score per detection
        with pytest.raises(OptionError, match="one score per input"):
            Explainer(case.model).trace(case.batch)
        return
    # generic: its explicit path is the trace's, so the logits agree to float64's rounding
    explained = _explain(family, method="generic")
    traced = Explainer(case.model, spec=case.spec).trace(case.batch, score="logit")
    assert traced.target.tolist() == explained.target.tolist()
    _close(traced.logits, explained.logits)
    assert len(traced.attentions) == len(traced.attention_grads) == _adapter(case).num_layers


@pytest.mark.parametrize("family", _family_params())
def test_an_unsupported_method_is_refused_naming_what_is_supported(family):
    adapter = _adapter(_case(family))
    supported = supported_methods(adapter)
    unsupported = sorted(set(METHODS) - set(supported))
    for method in [*unsupported, "no_such_method"]:
        with pytest.raises(ExplainError) as refused:
            _explain(family, method=method)
        message = str(refused.value)
        assert all(name in message for name in supported), (method, message)


@pytest.mark.parametrize(("family", "method"), _method_params())
def test_a_score_goes_only_to_the_methods_that_differentiate_one(family, method):
    # As a start layer goes only to the methods that aggregate over blocks: a
    # class-agnostic map or an LRP walk from the logit would ignore the score.
    if not METHODS[method].takes_score:
        with pytest.raises(OptionError, match="takes no score"):
            _explain(family, method=method, score="logit")
        assert _explain(family, method=method).score == "logit"
        return
    given = _explain(family, method=method, score="logit")
    default = _explain(family, method=method)
    assert given.score == default.score == "logit"
    for name, relevance in default.relevances.items():
        _close(given.relevances[name], relevance)


def _on_meta(inputs):
    """`inputs` with every tensor on the meta device (shapes, no values)."""
    if isinstance(inputs, torch.Tensor):
        return inputs.to("meta")
    if isinstance(inputs, Mapping):
        return {key: _on_meta(value) for key, value in inputs.items()}
    if isinstance(inputs, list | tuple):
        return type(inputs)(_on_meta(value) for value in inputs)
    return inputs


@pytest.mark.parametrize("family", _family_params())
def test_inputs_on_the_meta_device_are_refused_before_the_forward(family):
    """Issue 37: PyTorch's NotImplementedError from the first check that read a value."""
    meta = _on_meta(_case(family).batch)
    with pytest.raises(InputError, match="is on the meta device, which holds no values"):
        _explain(family, meta)
    if not isinstance(_adapter(_case(family)), Detector):  # a detector has no trace()
        with pytest.raises(InputError, match="meta device"):
            Explainer(_case(family).model, spec=_case(family).spec).trace(meta)


class _Names:
    """A tokenizer, as far as `Explanation.tokens` uses one."""

    def convert_ids_to_tokens(self, ids):
        return [f"t{i}" for i in ids]


@pytest.mark.parametrize("family", _family_params())
def test_a_tokenizer_goes_only_to_the_families_that_read_text(family):
    case = _case(family)
    batch = case.batch
    text = bool(case.lengths) or (isinstance(batch, Mapping) and "input_ids" in batch)
    assert _adapter(case).reads_text == text
    if not text:
        with pytest.raises(OptionError, match="takes no tokenizer"):
            Explainer(case.model, spec=case.spec, tokenizer=_Names())
        return
    result = Explainer(case.model, spec=case.spec, tokenizer=_Names()).explain(batch)
    assert result.tokens is not None and len(result.tokens) == len(case.alone)
