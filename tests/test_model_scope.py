"""What `explain` says about models it has no adapter for, and what `explain models` lists."""

from __future__ import annotations

import pytest
import torch

from explain import Explainer, UnsupportedModelError, supported_families
from explain.cli import main


def test_swin_is_refused_as_out_of_scope_with_the_way_forward():
    import timm
    import transformers as tf

    timm_swin = timm.create_model(
        "swin_tiny_patch4_window7_224",
        pretrained=False,
        img_size=32,
        embed_dim=16,
        depths=(1, 1),
        num_heads=(1, 2),
        window_size=4,
        num_classes=3,
    )
    hf_swin = tf.SwinForImageClassification(
        tf.SwinConfig(
            image_size=32,
            patch_size=4,
            embed_dim=16,
            depths=[1, 1],
            num_heads=[1, 2],
            window_size=4,
            num_labels=3,
        )
    )
    for model in (timm_swin, hf_swin):
        with pytest.raises(UnsupportedModelError) as error:
            Explainer(model)
        message = str(error.value)
        assert "hierarchical vision transformer" in message and "out of scope" in message
        assert "timm Eva" in message and "TransformerSpec" in message


def test_any_other_model_gets_the_families_and_the_custom_spec():
    with pytest.raises(UnsupportedModelError) as error:
        Explainer(torch.nn.Sequential(torch.nn.Linear(3, 3)))
    message = str(error.value)
    assert "is not a supported model" in message and "hierarchical" not in message
    assert "docs/custom-models.md" in message
    for family in supported_families():
        assert family in message


def test_explain_models_lists_every_family_and_the_custom_spec(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for needle in (
        "timm Eva",
        "timm Beit",
        "DINOv2 checkpoints",
        "Dinov2WithRegistersForImageClassification",
        "BeitForImageClassification",
        "SiglipForImageClassification",
        "SiglipModel",
        "TransformerSpec",
        "out of scope: hierarchical",
    ):
        assert needle in out
