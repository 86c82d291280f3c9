"""Hugging Face `CLIPModel`: a dual encoder, explained per tower (ICCV 2021's CLIP notebook).

Two stacks of self-attention blocks, "image" (the vision tower, read out at its CLS
token) and "text" (the text tower, read out at its EOS token, the token CLIP pools). The
score is the similarity logit of an image with a text, `logits_per_image[i, j]`; what
all CLIP-style adapters share is in `dual_encoder`.

The attention probabilities are the second output of each `CLIPAttention` on the eager
path, the very tensor that multiplies the values; every configuration of the model is
switched to eager attention for the call (see `hf_common`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from explain.architectures.base import validate_image_batch
from explain.architectures.dual_encoder import DualEncoder
from explain.architectures.hf_common import (
    eager_attention_flags,
    is_transformers_class,
    prepare_text,
)
from explain.errors import InputError
from explain.inputs import encode, is_raw_text
from explain.layout import FlagSetting, Prepared, TokenLayout

__all__ = ["HFClip"]


class HFClip(DualEncoder):
    family = "Hugging Face CLIPModel (image-text similarity; image and text relevance)"
    image_argument = "pixel_values"
    text_arguments = ("input_ids", "attention_mask")
    display_name: ClassVar[str] = "CLIP"
    processor: ClassVar[str] = "CLIPProcessor"
    expected: ClassVar[str] = (
        "a mapping with pixel_values (B, 3, H, W), input_ids and attention_mask, e.g. "
        "CLIPProcessor(text=..., images=..., padding=True, return_tensors='pt')"
    )
    """What `prepare` takes, for its error messages (a subclass names its own)."""
    prefix_tokens: ClassVar[int] = 1
    """Tokens before the image patches (CLIP's class token)."""

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(model, "clip", ("CLIPModel",))

    @property
    def vision_blocks(self) -> Sequence[nn.Module]:
        return list(self.model.vision_model.encoder.layers)

    @property
    def text_blocks(self) -> Sequence[nn.Module]:
        return list(self.model.text_model.encoder.layers)

    def probabilities_site(self, block: nn.Module) -> tuple[nn.Module, Callable[[Any], Tensor]]:
        return block.self_attn, _second

    def path_flags(self) -> Sequence[FlagSetting]:
        return eager_attention_flags(self.model)

    # -- inputs ---------------------------------------------------------------------------

    def encode(self, inputs: object, tokenizer: Any) -> object:
        """Raw texts under "text" (or "input_ids") tokenized with the Explainer's tokenizer
        (explain.inputs.encode); without one, an error that says how to give token ids."""
        if not isinstance(inputs, Mapping):
            return inputs
        key = next((k for k in ("text", "input_ids") if is_raw_text(inputs.get(k))), None)
        if key is None:
            return inputs
        if tokenizer is None:
            raise InputError(
                "got raw texts: give the Explainer the model's tokenizer, Explainer(model, "
                "tokenizer=AutoTokenizer.from_pretrained(path)), or pass token ids: "
                "CLIPProcessor(text=..., images=..., padding=True, return_tensors='pt')"
            )
        rest = {k: v for k, v in inputs.items() if k not in (key, "attention_mask")}
        return {**rest, **encode(tokenizer, inputs[key])}

    def prepare(self, inputs: object) -> Prepared:
        if not isinstance(inputs, Mapping) or "pixel_values" not in inputs:
            raise InputError(f"{self.display_name} takes {self.expected}")
        vision = self.model.config.vision_config
        images = validate_image_batch(inputs["pixel_values"], vision.num_channels, self.parameter)
        size = (vision.image_size, vision.image_size)
        if tuple(images.shape[-2:]) != size:
            raise InputError(
                f"this {self.display_name} model takes {size[0]}x{size[1]} images, got "
                f"{images.shape[-2]}x{images.shape[-1]}; resize them ({self.processor} does)"
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
        self.check_pooled_tokens(arguments)
        arguments["pixel_values"] = images
        return Prepared(
            batch_size=images.shape[0], layout=self._image_layout(), arguments=arguments
        )

    def check_pooled_tokens(self, arguments: dict[str, Tensor]) -> None:
        """Refuse texts whose pooled token (`readout_positions`) is padding."""
        eos = self.readout_positions(arguments["input_ids"])
        if not bool(arguments["attention_mask"].gather(1, eos[:, None]).all()):
            raise InputError("every text needs its end-of-text token inside its attention mask")

    def _image_layout(self) -> TokenLayout:
        vision = self.model.config.vision_config
        side = vision.image_size // vision.patch_size
        size = (vision.image_size, vision.image_size)
        return TokenLayout.image((side, side), size, self.prefix_tokens)

    def text_layout(self, prepared: Prepared) -> TokenLayout:
        return TokenLayout.text(prepared.arguments["attention_mask"])

    def readout_positions(self, input_ids: Tensor) -> Tensor:
        """Where CLIP pools each text, exactly as CLIPTextModel does."""
        eos_token_id = self.model.text_model.eos_token_id
        if eos_token_id == 2:  # checkpoints from before transformers PR #24773: highest id
            return input_ids.to(torch.int).argmax(dim=-1)
        return (input_ids == eos_token_id).int().argmax(dim=-1)

    # -- model ----------------------------------------------------------------------------

    def forward(self, prepared: Prepared) -> Tensor:
        """Similarity logits `logits_per_image`, (images, texts)."""
        return self.model(**prepared.arguments).logits_per_image


def _second(output: tuple[Tensor, Tensor]) -> Tensor:
    return output[1]
