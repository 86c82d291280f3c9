"""Bad input gets a clear error that says what to do."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from explain import (
    Explainer,
    ExplainError,
    InputError,
    OptionError,
    TargetError,
    UnknownMethodError,
    UnsupportedModelError,
    explain,
)
from explain.testing import tiny_case, tiny_vit


def test_unsupported_model_names_the_families():
    with pytest.raises(UnsupportedModelError) as caught:
        Explainer(nn.Sequential(nn.Linear(3, 3)))
    message = str(caught.value)
    # the way out first, the families last, on one line
    assert message.index("TransformerSpec") < message.index("Supported families")
    assert "): timm VisionTransformer" in message and "\n" not in message
    with pytest.raises(UnsupportedModelError, match=r"torch\.nn\.Module"):
        Explainer("vit_base_patch16_224")


def test_unsupported_pooling():
    with pytest.raises(UnsupportedModelError, match="global_pool='max'"):
        Explainer(tiny_vit(class_token=False, global_pool="max"))


def test_wrong_image_size_says_the_expected_size(vit):
    with pytest.raises(InputError, match="takes 32x32 images, got 48x48"):
        Explainer(vit).explain(torch.randn(1, 3, 48, 48))


def test_dynamic_size_must_be_a_patch_multiple():
    model = tiny_vit(dynamic_img_size=True)
    with pytest.raises(InputError, match="not a multiple of the patch size 8x8"):
        Explainer(model).explain(torch.randn(1, 3, 30, 32))


@pytest.mark.parametrize(
    ("images", "message"),
    [
        (torch.randn(3, 32, 32), "add a batch axis"),
        (torch.randn(1, 1, 32, 32), r"shape \(B, 3, H, W\)"),
        (torch.randn(0, 3, 32, 32), "empty"),
        (torch.full((1, 3, 32, 32), float("nan")), "NaN"),
        (torch.full((1, 3, 32, 32), float("inf")), "infinite"),
        (torch.zeros(1, 3, 32, 32, dtype=torch.long), "floating point"),
        ([[1.0]], "tensor"),
    ],
)
def test_bad_images(vit, images, message):
    with pytest.raises(InputError, match=message):
        Explainer(vit).explain(images)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (5, "out of range: the model has 5 classes"),
        (-1, "out of range"),
        ([1, 2, 3], r"shape \(2,\)"),
        (torch.tensor([0.5, 1.0]), "integers"),
        (True, "bool"),
        (torch.zeros(2, 0, dtype=torch.long), "at least one class"),
        (lambda out: out, r"must return shape \(2,\)"),
    ],
)
def test_bad_targets(vit, images, target, message):
    with pytest.raises(TargetError, match=message):
        Explainer(vit).explain(images, target=target)


def test_unknown_method_lists_known(vit, images):
    with pytest.raises(
        UnknownMethodError, match="known methods: attention_gradcam, attnlrp, cp_lrp, generic"
    ):
        Explainer(vit).explain(images, method="gradcam++")


def test_unknown_score(vit, images):
    with pytest.raises(TargetError, match="logit, probability, log_probability"):
        Explainer(vit).explain(images, score="softmax")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(method="generic", start_layer=3), OptionError, "out of range for a model with 3"),
        (dict(method="generic", start_layer=1.5), OptionError, "must be an int"),
        (dict(method="raw_attention", start_layer=0), OptionError, "takes no start_layer"),
        (dict(method="rollout", head_fusion="median"), OptionError, "head_fusion"),
        (dict(method="rollout", discard_ratio=1.0), OptionError, "discard_ratio"),
        (dict(method="generic", alpha=2), OptionError, "'generic' has no option 'alpha'; it"),
        (dict(method="rollout", foo=1), OptionError, r"head_fusion='mean', discard_ratio=0\.0"),
    ],
)
def test_bad_options(vit, images, kwargs, error, message):
    with pytest.raises(error, match=message):
        Explainer(vit).explain(images, **kwargs)


BAD_CALLS = {
    # what is wrong -> (the call, the error it must raise)
    "a model of no supported family": (
        lambda vit, images: Explainer(nn.Sequential(nn.Linear(3, 3))),
        UnsupportedModelError,
    ),
    "a wrong image size": (
        lambda vit, images: Explainer(vit).explain(torch.randn(1, 3, 48, 48)),
        InputError,
    ),
    "NaN pixels": (
        lambda vit, images: Explainer(vit).explain(torch.full((1, 3, 32, 32), float("nan"))),
        InputError,
    ),
    "a target out of range": (lambda vit, images: Explainer(vit).explain(images, 99), TargetError),
    "an unknown score": (
        lambda vit, images: Explainer(vit).explain(images, score="odds"),
        TargetError,
    ),
    "an unknown method": (
        lambda vit, images: Explainer(vit).explain(images, method="gradcam++"),
        UnknownMethodError,
    ),
    "a bad option value": (
        lambda vit, images: Explainer(vit).explain(images, method="rollout", head_fusion="x"),
        OptionError,
    ),
    "an unknown attention path": (
        lambda vit, images: Explainer(vit, attention_path="fast"),  # type: ignore[arg-type]
        OptionError,
    ),
    "LRP on the fused path": (
        lambda vit, images: Explainer(vit, attention_path="fused").explain(images, method="lrp"),
        OptionError,
    ),
    "several targets per input in trace": (
        lambda vit, images: Explainer(vit).trace(images, target=torch.tensor([[0, 1], [1, 0]])),
        TargetError,
    ),
}


@pytest.mark.parametrize("wrong", sorted(BAD_CALLS))
def test_every_bad_call_raises_an_explain_error_that_says_what_is_wrong(vit, images, wrong):
    call, expected = BAD_CALLS[wrong]
    with pytest.raises(Exception) as raised:  # any class: checked below
        call(vit, images)
    assert isinstance(raised.value, ExplainError), f"{type(raised.value).__name__}: {wrong}"
    assert isinstance(raised.value, expected)
    assert len(str(raised.value).split()) >= 5, f"a terse message for {wrong}: {raised.value}"


def test_one_shot_function_equals_the_explainer(vit, images):
    options = dict(method="rollout", target=[1, 0], start_layer=1, head_fusion="max")
    result = explain(vit, images, **options)
    expected = Explainer(vit).explain(images, **options)
    torch.testing.assert_close(result.relevance, expected.relevance, rtol=0, atol=0)
    assert result.method == "rollout" and result.target.tolist() == [1, 0]


def test_one_shot_function_passes_the_tokenizer_on():
    case = tiny_case("hf_text_encoder")

    class Names:
        def convert_ids_to_tokens(self, ids):
            return [f"t{i}" for i in ids]

    result = explain(case.model, case.batch, tokenizer=Names())
    assert result.tokens == [[f"t{i}" for i in row] for row in case.batch["input_ids"].tolist()]
