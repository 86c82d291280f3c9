"""What `explain` says about models it has no adapter for, and what `explain models` lists."""

from __future__ import annotations

import pytest
import torch

from explain import Explainer, UnsupportedModelError, supported_families
from explain.cli import main


def _refused_models():
    """Tiny CvT, PVT v2, MaxViT and Deformable DETR, built from configs."""
    import timm
    import transformers as tf

    cvt = tf.CvtForImageClassification(
        # depths 1, 2, 3: transformers indexes each stage's drop-path rates by stage
        tf.CvtConfig(embed_dim=[8, 16, 24], num_heads=[1, 1, 1], depth=[1, 2, 3], num_labels=3)
    )
    pvt = timm.create_model(
        "pvt_v2_b0",
        pretrained=False,
        embed_dims=(8, 16, 24, 32),
        num_heads=(1, 1, 1, 1),
        depths=(1, 1, 1, 1),
        num_classes=3,
    )
    maxvit = timm.create_model(
        "maxvit_pico_rw_256",
        pretrained=False,
        img_size=64,
        embed_dim=(32, 32, 32, 32),
        depths=(1, 1, 1, 1),
        num_classes=3,
    )
    deformable = tf.DeformableDetrForObjectDetection(
        tf.DeformableDetrConfig(
            backbone="resnet18",
            use_timm_backbone=True,
            use_pretrained_backbone=False,
            d_model=32,
            encoder_layers=1,
            decoder_layers=2,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=16,
            decoder_ffn_dim=16,
            num_queries=5,
            num_labels=3,
        )
    )
    return {
        "depthwise convolutions": cvt,
        "spatial-reduction attention": pvt,
        "interleave convolutions": maxvit,
        "deformable attention samples": deformable,
    }


def test_cvt_pvt_maxvit_and_deformable_attention_are_refused_each_saying_why():
    for why, model in _refused_models().items():
        with pytest.raises(UnsupportedModelError) as error:
            Explainer(model)
        message = str(error.value)
        assert "out of scope" in message and why in message, message
        assert "timm Eva" in message and "TransformerSpec" in message


def test_any_other_model_gets_the_families_and_the_custom_spec():
    with pytest.raises(UnsupportedModelError) as error:
        Explainer(torch.nn.Sequential(torch.nn.Linear(3, 3)))
    message = str(error.value)
    assert "is not a supported model" in message and "out of scope" not in message
    assert "TransformerSpec" in message and "README, Supported models" in message
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
        "timm SwinTransformer",
        "SwinForImageClassification",
        "out of scope: CvT, PVT, MaxViT and deformable attention",
    ):
        assert needle in out
