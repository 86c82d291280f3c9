"""Hugging Face DETR: `DetrForObjectDetection` and `ConditionalDetrForObjectDetection`,
explained one detection at a time.

Two token sets, as in ICCV 2021's Section 4: "image", the encoder's tokens (one per cell
of the backbone's feature grid, row-major), and "queries", the decoder's object queries.
Every encoder block has one self-attention site; every decoder block a self-attention
site over the queries and then a cross-attention site (queries attend to the image
tokens), numbered over the whole model in forward order, encoder first. The detection
plan (explain.engine.plans.detection) applies the encoder-decoder rules of
explain.rules.coattention to them and reads each detection's query row out.

DETR's attention is plain softmax attention, which transformers' eager function returns
second from each attention module; so is Conditional DETR's (its cross-attention
concatenates a content and a spatial part of each query and key before the one softmax
over the image tokens). DETR scores a query's classes with a softmax that includes "no
object" (the last logit); Conditional DETR with one sigmoid per class and no "no object"
(`class_probabilities`). Deformable DETR samples offsets instead of attending and is
refused (explain.architectures.scope).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from explain.architectures.base import Detector, one_hot_rows, validate_image_batch
from explain.architectures.hf_common import (
    eager_attention_flags,
    is_transformers_class,
    probabilities_at,
)
from explain.errors import InputError
from explain.layout import AttentionSite, FlagSetting, Prepared, TokenLayout, TokenSet

__all__ = ["HFDetr"]


class HFDetr(Detector):
    family = (
        "Hugging Face DetrForObjectDetection and ConditionalDetrForObjectDetection "
        "(per-detection maps, boxes and labels)"
    )

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self._conditional = is_transformers_class(
            model, "conditional_detr", ("ConditionalDetrForObjectDetection",)
        )
        detr = model.model
        self._encoder_blocks = list(detr.encoder.layers)
        self._decoder_blocks = list(detr.decoder.layers)
        weights = probabilities_at(1)
        sites = [
            AttentionSite(i, b.self_attn, weights, stack="image")
            for i, b in enumerate(self._encoder_blocks)
        ]
        for block in self._decoder_blocks:
            sites.append(AttentionSite(len(sites), block.self_attn, weights, stack="queries"))
            sites.append(
                AttentionSite(
                    len(sites), block.encoder_attn, weights, stack="queries", kind="cross"
                )
            )
        self._sites = sites
        # The backbone's output stride, which timm backbones state; otherwise DETR's ResNet
        # halves the grid five times (four with the dilated last stage, the "DC5" models).
        # Each halving rounds up, so the grid is the image size over the stride, rounded up.
        info = getattr(detr.backbone.model, "feature_info", None)
        dilated = getattr(model.config, "dilation", False)
        self._stride = int(info.reduction()[-1]) if info is not None else 16 if dilated else 32

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(
            model, "detr", ("DetrForObjectDetection",)
        ) or is_transformers_class(
            model, "conditional_detr", ("ConditionalDetrForObjectDetection",)
        )

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self._encoder_blocks + self._decoder_blocks

    @property
    def entry_blocks(self) -> Sequence[nn.Module]:
        return [self._encoder_blocks[0], self._decoder_blocks[0]]

    @property
    def num_queries(self) -> int:
        return int(self.model.config.num_queries)

    def attention_sites(self) -> Sequence[AttentionSite]:
        return list(self._sites)

    def path_flags(self) -> Sequence[FlagSetting]:
        return eager_attention_flags(self.model)

    def prepare(self, inputs: object) -> Prepared:
        """Images (B, 3, H, W), or the image processor's output: a mapping with
        `pixel_values` and optionally `pixel_mask` (B, H, W), 1 on the image and 0 on the
        padding the processor added to batch images of different sizes."""
        mask: Any = None
        if isinstance(inputs, Mapping):
            if "pixel_values" not in inputs:
                raise InputError("DETR takes images (B, 3, H, W) or a mapping with pixel_values")
            inputs, mask = inputs["pixel_values"], inputs.get("pixel_mask")
        images = validate_image_batch(inputs, self.model.config.num_channels, self.parameter)
        batch, _, height, width = images.shape
        if mask is None:
            mask = torch.ones(batch, height, width, dtype=torch.long, device=images.device)
        if not isinstance(mask, Tensor) or tuple(mask.shape) != (batch, height, width):
            raise InputError(
                f"pixel_mask must be a (B, H, W) = {(batch, height, width)} tensor of 0 and 1, "
                f"as the image processor returns it"
            )
        grid = (math.ceil(height / self._stride), math.ceil(width / self._stride))
        layout = TokenLayout.image(grid, (height, width), num_prefix_tokens=0)
        arguments = {"pixel_values": images, "pixel_mask": mask.to(images.device).long()}
        return Prepared(batch_size=batch, layout=layout, arguments=arguments)

    def sets(self, prepared: Prepared) -> list[TokenSet]:
        """ "image": the encoder's feature-grid tokens and sites; "queries": the decoder's
        object queries and sites. Each detection reads both out at its own query."""
        encoder = len(self._encoder_blocks)
        readout = self.readout(prepared)
        batch = prepared.batch_size
        queries = TokenLayout.text(torch.ones(batch, self.num_queries, dtype=torch.bool))
        return [
            TokenSet("image", range(encoder), prepared.layout, readout),
            TokenSet("queries", range(encoder, len(self._sites)), queries, readout),
        ]

    def forward(self, prepared: Prepared) -> Tensor:
        """Class logits of every query: (B, queries, classes + 1), the last "no object"
        (DETR), or (B, queries, classes) (Conditional DETR)."""
        return self.detect(prepared)[0]

    def class_probabilities(self, logits: Tensor) -> Tensor:
        """(B, Q, classes) the probability of each real class at each query, as the
        model's post-processing scores it: a softmax over the classes and "no object"
        (DETR), or one sigmoid per class (Conditional DETR)."""
        if self._conditional:
            return logits.sigmoid()
        return logits.softmax(dim=-1)[..., :-1]

    def detect(self, prepared: Prepared) -> tuple[Tensor, Tensor]:
        """(logits (B, Q, C [+ 1]), boxes (B, Q, 4)): the boxes as DETR predicts them,
        (centre x, centre y, width, height) as fractions of the unpadded image."""
        output = self.model(**prepared.arguments)
        tokens = output.encoder_last_hidden_state.shape[1]
        grid = prepared.layout.grid
        assert grid is not None
        if tokens != grid[0] * grid[1]:
            raise InputError(
                f"the backbone made {tokens} feature tokens, not the {grid[0]}x{grid[1]} "
                f"grid of an output stride of {self._stride}; explain supports backbones "
                "whose every downsampling rounds up, as ResNets' do"
            )
        return output.logits, output.pred_boxes

    def readout(self, prepared: Prepared) -> Tensor:
        """One-hot at query 0: a detection plan reads each detection at its own query."""
        return one_hot_rows(prepared.batch_size, self.num_queries, 0, self.parameter)
