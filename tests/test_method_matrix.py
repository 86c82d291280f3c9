"""The method x model-kind matrix: every method on every kind of model either computes
finite relevance or is refused up front, before the model runs, with an `ExplainError`.

The rows: every family's tiny model (explain.testing.TINY_MODELS, the `TransformerSpec`
models included), the generations of every decoder-only family, the answers of the
vision-language families at both depths, and the routes of the
two-token-set kinds (a dual encoder's pairs, K texts per image and a target callable; an
encoder-decoder's last, chosen and every position; a detector's detections above a
threshold and named queries). A raw exception anywhere fails, and
so does a refusal after a forward, or a refusal of a method the engine lists as
supported for the model (`engine.supported_methods`) and the reverse.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from explain import METHODS, Explainer, ExplainError
from explain.architectures.hf_vision_language import VisionLanguageModel
from explain.architectures.registry import FAMILIES as REGISTERED
from explain.engine import Request, supported_methods
from explain.engine.plans.image_text import reaches_tower
from explain.generation import Generation, explain_generation
from explain.testing import TINY_MODELS, TinyCase, tiny_case

FAMILIES = sorted(TINY_MODELS)
METHOD_NAMES = sorted(METHODS)
LANGUAGE_MODELS = [family for family in FAMILIES if family.startswith("hf_causal_lm")]


@functools.cache
def _built(family: str) -> TinyCase:
    return tiny_case(family)


def _case(family: str) -> TinyCase:
    if family == "open_clip":
        pytest.importorskip("open_clip")
    return _built(family)


def _finite_or_refused_up_front(
    model: torch.nn.Module, supported: bool | None, call: Callable[[], Any]
) -> None:
    """A finite result, or an ExplainError before the model ran; `supported` (None: not
    checked) says which of the two the engine's listing promises."""
    calls: list[int] = []  # one entry per forward of the model
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        try:
            result = call()
        except ExplainError:
            assert supported is not True, "a method listed as supported was refused"
            assert calls == [], "refused after the model ran: not up front"
            return
        assert supported is not False, "a method not listed as supported ran"
        for name, relevance in result.relevances.items():
            assert torch.isfinite(relevance).all(), f"non-finite {name} relevance"
    finally:
        handle.remove()


def _routes(family: str) -> dict[str, dict[str, Any]]:
    """The ways a kind of model is explained beyond its default call, by name."""
    if family in ("hf_clip", "open_clip", "hf_siglip"):
        return {
            "pairs": {},
            "one text each": {"target": 1},
            "two texts each": {"target": torch.tensor([[0, 1], [1, 0]])},
            "callable": {"target": lambda logits: logits.argmin(dim=1)},
        }
    if family == "hf_encoder_decoder":
        return {
            "last position": {},
            "a position": {"position": 1},
            "every position": {"position": "all"},
            "callable": {"target": lambda logits: logits[:, 3]},
        }
    if family.startswith("hf_detr"):  # a detection's target is its own class
        return {
            "above the threshold": {},
            "a lower threshold": {"threshold": 0.5},
            "named queries": {"queries": torch.tensor([[0, 1], [2, 3]])},
        }
    return {"default": {}, "callable": {"target": lambda logits: logits[:, 1]}}


def _matrix() -> list:
    return [
        pytest.param(family, route, method, id=f"{family}-{route}-{method}")
        for family in FAMILIES
        for route in _ROUTE_NAMES.get(family, ("default", "callable"))
        for method in METHOD_NAMES
    ]


_ROUTE_NAMES = {
    **dict.fromkeys(
        ("hf_clip", "open_clip", "hf_siglip"),
        ("pairs", "one text each", "two texts each", "callable"),
    ),
    "hf_encoder_decoder": ("last position", "a position", "every position", "callable"),
    **dict.fromkeys(
        ("hf_detr", "hf_detr:conditional"),
        ("above the threshold", "a lower threshold", "named queries"),
    ),
}


@pytest.mark.parametrize(("family", "route", "method"), _matrix())
def test_every_method_on_every_kind_is_finite_or_refused_up_front(family, route, method):
    case = _case(family)
    explainer = Explainer(case.model, spec=case.spec)
    options = _routes(family)[route]
    inputs = case.batch
    supported = method in supported_methods(explainer.adapter)
    if route == "callable" and supported and METHODS[method].lrp_rules is not None:
        # An LRP walk starts from a class logit: a callable's scores are refused, after
        # the forward that computed them (the callable needs the output).
        with pytest.raises(ExplainError, match="class indices"):
            explainer.explain(inputs, method=method, **options)
        return
    _finite_or_refused_up_front(
        case.model, supported, lambda: explainer.explain(inputs, method=method, **options)
    )


@functools.cache
def _generation(family: str) -> Generation:
    """Two left-padded prompts and a continuation each, the second one ending early."""
    model = _case(family).model
    ids = torch.tensor([[5, 9, 7, 11, 13, 17], [0, 6, 8, 12, 14, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0]])
    vocab = model.get_input_embeddings().num_embeddings
    return Generation(ids % vocab, mask, prompt_length=3)


@pytest.mark.parametrize("method", METHOD_NAMES)
@pytest.mark.parametrize("family", LANGUAGE_MODELS)
def test_every_method_on_generations_is_finite_or_refused_up_front(family, method):
    case = _case(family)
    explainer = Explainer(case.model)
    generation = _generation(family)
    request = Request(prompt_length=generation.prompt_length)
    supported = method in supported_methods(explainer.adapter, request)
    _finite_or_refused_up_front(
        case.model,
        supported,
        lambda: explain_generation(explainer, generation, method=method).explanation,
    )


VISION_LANGUAGE = [
    family
    for family in FAMILIES
    if family in REGISTERED and issubclass(REGISTERED[family].load(), VisionLanguageModel)
]


@functools.cache
def _answer(family: str) -> Generation:
    """The tiny case's prompts (right-padded: the matrix needs no left padding) with two
    answer tokens each, the second answer ending early."""
    batch = _case(family).batch
    ids, mask = batch["input_ids"], batch["attention_mask"]
    extra = {
        name: value for name, value in batch.items() if name not in ("input_ids", "attention_mask")
    }
    answers = torch.tensor([[5, 6], [7, 0]])
    if "token_type_ids" in extra:  # the answer is text (Gemma 3) or the suffix (PaliGemma)
        kind = 0 if family == "hf_gemma3" else 1
        extra["token_type_ids"] = torch.cat(
            [extra["token_type_ids"], torch.full_like(answers, kind)], dim=1
        )
    return Generation(
        torch.cat([ids, answers], dim=1),
        torch.cat([mask, torch.tensor([[1, 1], [1, 0]])], dim=1),
        prompt_length=ids.shape[1],
        extra=extra,
    )


@pytest.mark.parametrize("method", METHOD_NAMES)
@pytest.mark.parametrize("family", VISION_LANGUAGE)
def test_every_method_on_answers_about_images_is_finite_or_refused_up_front(family, method):
    case = _case(family)
    explainer = Explainer(case.model)
    answer = _answer(family)
    request = Request(prompt_length=answer.prompt_length)
    supported = method in supported_methods(explainer.adapter, request)
    for depth in ("lm", "tower"):
        _finite_or_refused_up_front(
            case.model,
            supported and (depth == "lm" or reaches_tower(METHODS[method])),
            lambda depth=depth: (
                explain_generation(explainer, answer, method=method, depth=depth).explanation
            ),
        )
