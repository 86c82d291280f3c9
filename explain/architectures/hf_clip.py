"""Hugging Face `CLIPModel`: a dual encoder, explained per tower (ICCV 2021's CLIP notebook).

Two stacks of self-attention blocks, "image" (the vision tower, read out at its CLS
token) and "text" (the text tower, read out at its EOS token, the token CLIP pools). The
score is the similarity logit of an image with a text, `logits_per_image[i, j]`. Sites
are numbered over the whole model in forward order: the vision blocks first (CLIPModel
computes the image features first), then the text blocks.

The attention probabilities are the second output of each `CLIPAttention` on the eager
path, the very tensor that multiplies the values; every configuration of the model is
switched to eager attention for the call (see `hf_common`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from explain.architectures import register_adapter
from explain.architectures.base import Adapter, AttentionSite, FlagSetting, Prepared, TokenLayout
from explain.architectures.hf_common import (
    eager_attention_flags,
    is_transformers_class,
    prepare_text,
    text_layout,
)
from explain.architectures.timm_vit import validate_image_batch
from explain.errors import InputError

__all__ = ["HFClip"]


@register_adapter
class HFClip(Adapter):
    family = "Hugging Face CLIPModel (image-text similarity; image and text relevance)"
    token_sets = "dual_encoder"
    stacks = ("image", "text")

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(model, "clip", ("CLIPModel",))

    @property
    def _vision_layers(self) -> list[nn.Module]:
        return list(self.model.vision_model.encoder.layers)

    @property
    def _text_layers(self) -> list[nn.Module]:
        return list(self.model.text_model.encoder.layers)

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self._vision_layers + self._text_layers

    @property
    def entry_blocks(self) -> Sequence[nn.Module]:
        return [self._vision_layers[0], self._text_layers[0]]

    def stack_layers(self, stack: str) -> range:
        """The model-wide layer numbers of one tower's blocks."""
        vision = len(self._vision_layers)
        if stack == "image":
            return range(0, vision)
        return range(vision, vision + len(self._text_layers))

    def attention_sites(self) -> Sequence[AttentionSite]:
        layers = [("image", block) for block in self._vision_layers]
        layers += [("text", block) for block in self._text_layers]
        return [
            AttentionSite(layer, block.self_attn, _second, stack=stack)
            for layer, (stack, block) in enumerate(layers)
        ]

    def path_flags(self) -> Sequence[FlagSetting]:
        return eager_attention_flags(self.model)

    # -- inputs ---------------------------------------------------------------------------

    def prepare(self, inputs: object) -> Prepared:
        if not isinstance(inputs, Mapping) or "pixel_values" not in inputs:
            raise InputError(
                "CLIP takes a mapping with pixel_values (B, 3, H, W), input_ids and "
                "attention_mask, e.g. CLIPProcessor(text=..., images=..., padding=True, "
                "return_tensors='pt')"
            )
        vision = self.model.config.vision_config
        images = validate_image_batch(inputs["pixel_values"], vision.num_channels)
        size = (vision.image_size, vision.image_size)
        if tuple(images.shape[-2:]) != size:
            raise InputError(
                f"this CLIP model takes {size[0]}x{size[1]} images, got "
                f"{images.shape[-2]}x{images.shape[-1]}; resize them (CLIPProcessor does)"
            )
        text = self.model.config.text_config
        parameter = self.parameter
        arguments = prepare_text(
            inputs,
            max_tokens=text.max_position_embeddings,
            vocab_size=text.vocab_size,
            device=parameter.device,
            token_types=False,
        )
        eos = self._eos_positions(arguments["input_ids"])
        if not bool(arguments["attention_mask"].gather(1, eos[:, None]).all()):
            raise InputError("every text needs its end-of-text token inside its attention mask")
        if images.is_inference():
            images = images.clone()
        arguments["pixel_values"] = images.to(device=parameter.device, dtype=parameter.dtype)
        return Prepared(
            batch_size=images.shape[0], layout=self._image_layout(), arguments=arguments
        )

    def _image_layout(self) -> TokenLayout:
        vision = self.model.config.vision_config
        side = vision.image_size // vision.patch_size
        return TokenLayout(
            modality="image",
            num_tokens=1 + side * side,
            num_prefix_tokens=1,
            grid=(side, side),
            input_size=(vision.image_size, vision.image_size),
        )

    def layout(self, prepared: Prepared, stack: str) -> TokenLayout:
        """The token layout of one tower's inputs."""
        if stack == "image":
            return prepared.layout
        return text_layout(prepared.arguments["attention_mask"])

    def _eos_positions(self, input_ids: Tensor) -> Tensor:
        """Where CLIP pools each text, exactly as CLIPTextModel does."""
        eos_token_id = self.model.text_model.eos_token_id
        if eos_token_id == 2:  # checkpoints from before transformers PR #24773: highest id
            return input_ids.to(torch.int).argmax(dim=-1)
        return (input_ids == eos_token_id).int().argmax(dim=-1)

    def pair(self, prepared: Prepared, images: Tensor, texts: Tensor) -> Prepared:
        """Inputs whose sample k is image `images[k]` with text `texts[k]`: explaining
        pair k's own similarity then never mixes the gradients of two samples, even when
        several images are explained against the same text."""
        arguments = prepared.arguments
        images = images.to(arguments["pixel_values"].device)
        texts = texts.to(arguments["input_ids"].device)
        return Prepared(
            batch_size=images.shape[0],
            layout=prepared.layout,
            arguments={
                "pixel_values": arguments["pixel_values"][images],
                "input_ids": arguments["input_ids"][texts],
                "attention_mask": arguments["attention_mask"][texts],
            },
        )

    def num_texts(self, prepared: Prepared) -> int:
        return prepared.arguments["input_ids"].shape[0]

    # -- model ----------------------------------------------------------------------------

    def forward(self, prepared: Prepared) -> Tensor:
        """Similarity logits `logits_per_image`, (images, texts)."""
        return self.model(**prepared.arguments).logits_per_image

    def readout(self, prepared: Prepared) -> Tensor:
        return self.stack_readout(prepared, "image")

    def stack_readout(self, prepared: Prepared, stack: str) -> Tensor:
        """One tower's readout row: the CLS token of the image, the EOS token of the text."""
        parameter = self.parameter
        if stack == "image":
            row = torch.zeros(prepared.batch_size, prepared.layout.num_tokens)
            row[:, 0] = 1.0
        else:
            input_ids = prepared.arguments["input_ids"]
            row = torch.zeros(input_ids.shape, dtype=parameter.dtype)
            row[torch.arange(row.shape[0]), self._eos_positions(input_ids).cpu()] = 1.0
        return row.to(device=parameter.device, dtype=parameter.dtype)

    def to_input_space(self, token_relevance: Tensor, layout: TokenLayout) -> Tensor:
        if layout.modality == "image":
            assert layout.grid is not None
            patches = token_relevance[..., layout.num_prefix_tokens :]
            return patches.reshape(*patches.shape[:-1], *layout.grid)
        assert layout.token_mask is not None
        return token_relevance * layout.token_mask.to(token_relevance.dtype)


def _second(output: tuple[Tensor, Tensor]) -> Tensor:
    return output[1]
