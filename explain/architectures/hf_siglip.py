"""Hugging Face `SiglipModel`: a dual encoder, explained per tower like CLIP; its towers,
blocks and attention are CLIPModel's (`hf_clip`), its inputs and readout rows its own.

Two stacks of self-attention blocks, "image" (the vision tower) and "text" (the text
tower). The score is the similarity logit of an image with a text,
`logits_per_image[i, j] = exp(t) cos(image_i, text_j) + b`.

Readout rows. The text tower pools its last position (SigLIP is trained on texts padded
to a fixed length, without an attention mask), so the text row is one-hot there. The
vision tower has no class token: a multi-head attention pooling head reads the last
hidden state with one learned probe query, so the image row is that head's attention
from the probe to every patch token, averaged over its heads (a row that sums to 1, as
the class-token row does). Computing it needs the last hidden state, so the row costs
one extra forward of the vision tower without gradients (see `attention_pool`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from explain.architectures.hf_clip import HFClip
from explain.architectures.hf_common import is_transformers_class
from explain.errors import InputError, UnsupportedModelError
from explain.layout import Prepared

__all__ = ["HFSiglip", "attention_pool_readout"]


def attention_pool_readout(vision: nn.Module, pixel_values: Tensor) -> Tensor:
    """(B, N) the SigLIP pooling head's attention from its probe to every token of the
    last hidden state, averaged over the head's heads: one extra forward of the vision
    tower `vision` (a SiglipVisionModel), which the engine runs inside a session, as it
    runs the explanation's own forward (explain.architectures.attention_pool)."""
    head = vision.head
    hidden = vision(pixel_values=pixel_values).last_hidden_state
    probe = head.probe.expand(hidden.shape[0], -1, -1)
    _, weights = head.attention(probe, hidden, hidden, need_weights=True, average_attn_weights=True)
    return weights[:, 0]


class HFSiglip(HFClip):
    """SiglipModel: CLIPModel's towers, blocks and eager path, with SigLIP's inputs and
    readout rows."""

    family = (
        "Hugging Face SiglipModel (image-text similarity; image relevance read out by the "
        "attention pooling head, text at its last position)"
    )
    display_name = "SigLIP"
    processor = "SiglipProcessor"
    expected = (
        "a mapping with pixel_values (B, 3, H, W) and input_ids, e.g. "
        "SiglipProcessor(text=..., images=..., padding='max_length', return_tensors='pt')"
    )
    prefix_tokens = 0  # no class token: the pooling head reads every patch

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        if not self.model.config.vision_config.vision_use_head:
            raise UnsupportedModelError(
                "this SiglipModel has no vision pooling head (vision_use_head=False), so it "
                "has no image embedding to explain"
            )

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(model, "siglip", ("SiglipModel",))

    # -- inputs ---------------------------------------------------------------------------

    def check_pooled_tokens(self, arguments: dict[str, Tensor]) -> None:
        if not bool(arguments["attention_mask"][:, -1].all()):
            raise InputError(
                "SigLIP pools each text at its last position, which is padding in this "
                "batch; pad to a fixed length without an attention mask, as SiglipProcessor "
                "does (padding='max_length'), or pad on the left"
            )

    def readout_positions(self, input_ids: Tensor) -> Tensor:
        """SigLIP pools the last position of every text."""
        return torch.full(
            input_ids.shape[:1], input_ids.shape[1] - 1, dtype=torch.long, device=input_ids.device
        )

    def stack_readout(self, prepared: Prepared, stack: str) -> Tensor:
        if stack != "image":
            return super().stack_readout(prepared, stack)
        pixels = prepared.arguments[self.image_argument]
        return attention_pool_readout(self.model.vision_model, pixels).to(self.parameter.dtype)
