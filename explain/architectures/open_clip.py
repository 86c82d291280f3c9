"""open_clip's `CLIP` (open_clip_torch 3.x): a dual encoder, explained per tower like
Hugging Face's CLIPModel (the shared logic is in `dual_encoder`). Inputs are {"image",
"text"} as open_clip's `model(image, text)` takes them (texts may be strings with its
tokenizer); for the call, path flags put an `ExplicitSelfAttention` (the same weights and
arithmetic, the probabilities passing through an identity) in each block's fused
`nn.MultiheadAttention` slot. docs/multimodal.md ("open_clip CLIP") gives the readouts
and what is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from explain.architectures.base import validate_image_batch, whole_output
from explain.architectures.dual_encoder import DualEncoder
from explain.architectures.hf_common import prepare_text
from explain.errors import ExplainError, InputError, UnsupportedModelError
from explain.inputs import checked_texts, is_raw_text
from explain.layout import FlagSetting, Prepared, TokenLayout
from explain.lrp.weights import base_layer, used_weight

__all__ = ["ExplicitSelfAttention", "OpenClip"]

_TEXT_POOLS = ("argmax", "eos", "first", "last")


def _is_open_clip_class(module: nn.Module, module_name: str, name: str) -> bool:
    """Whether `module` is (a subclass of) open_clip's `module_name.name`, without
    importing open_clip."""
    return any(
        cls.__name__ == name and cls.__module__ == f"open_clip.{module_name}"
        for cls in type(module).__mro__
    )


class ExplicitSelfAttention(nn.Module):
    """Stands in for one block's `nn.MultiheadAttention` during an explanation call.

    It computes exactly what the module computes for open_clip's self-attention call
    `attn(x, x, x, need_weights=False, attn_mask=mask)`, from the module's own weights, on
    the explicit path: A = softmax(q k^T / sqrt(d) + mask) leaves `probabilities` (an
    identity, whose forward hook sees A and whose output is the very tensor multiplied
    with v), then out_proj(A v). Any other use of the module is refused. No attention
    dropout: the recorder runs every module in eval mode, where the module has none.
    """

    def __init__(self, attention: nn.MultiheadAttention) -> None:
        super().__init__()
        self.attention = attention
        self.probabilities = nn.Identity()

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, None]:
        if key is not query or value is not query:
            raise ExplainError("open_clip cross-attention is not supported, only self-attention")
        # ResidualAttentionBlock passes no key_padding_mask and an additive float (N, N)
        # mask or none, which broadcasts over batch and heads; anything else would need
        # nn.MultiheadAttention's other mask conventions.
        if key_padding_mask is not None or need_weights or is_causal:
            raise ExplainError(
                "open_clip's attention was called with key_padding_mask, need_weights or "
                "is_causal, which open_clip's ResidualAttentionBlock never passes"
            )
        if attn_mask is not None and (attn_mask.dtype == torch.bool or attn_mask.dim() != 2):
            raise ExplainError("expected open_clip's additive (N, N) attention mask")
        mha = self.attention
        batch, tokens, width = query.shape
        heads = mha.num_heads
        head_dim = width // heads
        qkv = F.linear(query, mha.in_proj_weight, mha.in_proj_bias)
        q, k, v = qkv.reshape(batch, tokens, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
        scores = (q * head_dim**-0.5) @ k.transpose(-2, -1)
        if attn_mask is not None:
            scores = scores + attn_mask
        probabilities = self.probabilities(scores.softmax(dim=-1))
        output = (probabilities @ v).transpose(1, 2).reshape(batch, tokens, width)
        # F.linear, not out_proj(...): the module's own fused forward never calls out_proj.
        # The weights out_proj computes with (a LoRA layer's, offloaded, quantised).
        out_proj = mha.out_proj
        return F.linear(output, used_weight(out_proj), used_weight(out_proj, "bias")), None


class OpenClip(DualEncoder):
    family = (
        "open_clip CLIP with a ViT image tower (image-text similarity; image and text relevance)"
    )
    image_argument = "image"
    text_arguments = ("text",)

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        visual = model.visual
        if not _is_open_clip_class(visual, "transformer", "VisionTransformer"):
            raise UnsupportedModelError(
                f"open_clip CLIP with a {type(visual).__name__} image tower is not supported: "
                "only open_clip's own VisionTransformer (not timm or ResNet towers)"
            )
        if visual.attn_pool is not None or visual.pool_type != "tok":
            raise UnsupportedModelError(
                f"open_clip image towers that pool with pool_type={visual.pool_type!r}"
                f"{' and attentional pooling' if visual.attn_pool is not None else ''} are "
                "not supported: the readout must be the class token (pool_type='tok')"
            )
        if model.text_pool_type not in _TEXT_POOLS:
            raise UnsupportedModelError(
                f"open_clip text pooling {model.text_pool_type!r} is not supported: the text "
                f"must be read out at one token ({', '.join(_TEXT_POOLS)})"
            )
        self._channels = base_layer(visual.conv1).in_channels  # also under a LoRA Conv2d
        self._explicit: dict[nn.Module, ExplicitSelfAttention] = {}
        for tower, blocks in (("image", self.vision_blocks), ("text", self.text_blocks)):
            for index, block in enumerate(blocks):
                self._explicit[block] = ExplicitSelfAttention(_self_attention(block, tower, index))

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return _is_open_clip_class(model, "model", "CLIP")

    @property
    def vision_blocks(self) -> Sequence[nn.Module]:
        return list(self.model.visual.transformer.resblocks)

    @property
    def text_blocks(self) -> Sequence[nn.Module]:
        return list(self.model.transformer.resblocks)

    def probabilities_site(self, block: nn.Module) -> tuple[nn.Module, Callable[[Any], Tensor]]:
        return self._explicit[block].probabilities, whole_output

    def path_flags(self) -> Sequence[FlagSetting]:
        flags = [FlagSetting(block, "attn", self._explicit[block]) for block in self.blocks]
        # Checkpointing would rerun every block in the backward and fire the hooks twice.
        for transformer in (self.model.visual.transformer, self.model.transformer):
            flags.append(FlagSetting(transformer, "grad_checkpointing", False))
        return flags

    # -- inputs ---------------------------------------------------------------------------

    def encode(self, inputs: object, tokenizer: Any) -> object:
        """Raw texts under "text" tokenized with open_clip's tokenizer (`get_tokenizer`),
        padded to the model's context length (open_clip truncates longer texts itself)."""
        if tokenizer is None or not isinstance(inputs, Mapping):
            return inputs
        texts = inputs.get("text")
        if not is_raw_text(texts):
            return inputs
        batch = checked_texts(texts)
        return {**inputs, "text": tokenizer(batch, context_length=self.model.context_length)}

    def prepare(self, inputs: object) -> Prepared:
        if not isinstance(inputs, Mapping) or "image" not in inputs or "text" not in inputs:
            raise InputError(
                "open_clip CLIP takes a mapping {'image': (B, 3, H, W) images, 'text': "
                "(T, context_length) token ids from open_clip.get_tokenizer(name)(texts)}"
            )
        visual = self.model.visual
        images = validate_image_batch(inputs["image"], self._channels, self.parameter)
        size = tuple(visual.image_size)
        if tuple(images.shape[-2:]) != size:
            raise InputError(
                f"this CLIP model takes {size[0]}x{size[1]} images, got "
                f"{images.shape[-2]}x{images.shape[-1]}; resize them (open_clip's "
                "preprocess transform does)"
            )
        if is_raw_text(inputs["text"]):
            raise InputError(
                "got raw text: tokenize it with open_clip.get_tokenizer(name)(texts), or give "
                "the Explainer open_clip's tokenizer: Explainer(model, tokenizer=tokenizer)"
            )
        context = self.model.context_length
        parameter = self.parameter
        ids = prepare_text(
            {"input_ids": inputs["text"]},
            max_tokens=context,
            vocab_size=self.model.vocab_size,
            device=parameter.device,
            token_types=False,
        )["input_ids"]
        if ids.shape[1] != context:
            raise InputError(
                f"open_clip CLIP takes texts padded to its context length {context}, got "
                f"{ids.shape[1]} tokens; tokenize with open_clip.get_tokenizer(name)(texts)"
            )
        if self.model.text_pool_type == "eos" and not bool(
            (ids == self.model.text_eos_id).any(dim=1).all()
        ):
            raise InputError(
                f"every text needs its end-of-text token (id {self.model.text_eos_id})"
            )
        layout = TokenLayout.image(tuple(visual.grid_size), size)
        return Prepared(
            batch_size=images.shape[0], layout=layout, arguments={"image": images, "text": ids}
        )

    def text_layout(self, prepared: Prepared) -> TokenLayout:
        """Under the causal mask, the tokens up to the pooled one; without one (a model built
        with no_causal_mask) the pooled token sees the whole context, pads included."""
        ids = prepared.arguments["text"]
        if self.model.attn_mask is None:
            mask = torch.ones_like(ids, dtype=torch.bool)
        else:
            positions = torch.arange(ids.shape[1], device=ids.device)
            mask = positions[None] <= self.readout_positions(ids)[:, None]
        return TokenLayout(modality="text", num_tokens=ids.shape[1], token_mask=mask)

    def readout_positions(self, input_ids: Tensor) -> Tensor:
        """Where open_clip pools each text, exactly as `text_global_pool` does."""
        pool = self.model.text_pool_type
        if pool == "argmax":  # the end-of-text token has the highest id
            return input_ids.argmax(dim=-1)
        if pool == "eos":
            return (input_ids == self.model.text_eos_id).int().argmax(dim=-1)
        last = input_ids.shape[1] - 1 if pool == "last" else 0
        return torch.full(input_ids.shape[:1], last, dtype=torch.long, device=input_ids.device)

    def token_strings(self, prepared: Prepared, tokenizer: Any) -> list[list[str]] | None:
        """open_clip's SimpleTokenizer names tokens by its BPE `decoder` ("dog</w>"; the pads
        after the pooled token, id 0, are named ""); its HFTokenizer wraps a transformers
        tokenizer, which names them itself."""
        inner = getattr(tokenizer, "tokenizer", tokenizer)
        if hasattr(inner, "convert_ids_to_tokens"):
            return super().token_strings(prepared, inner)
        input_ids = prepared.arguments["text"]
        decoder = tokenizer.decoder
        ends = self.readout_positions(input_ids).tolist()
        return [
            [decoder.get(i, "") if position <= end else "" for position, i in enumerate(row)]
            for row, end in zip(input_ids.tolist(), ends, strict=True)
        ]

    # -- model ----------------------------------------------------------------------------

    def forward(self, prepared: Prepared) -> Tensor:
        """Similarity logits, (images, texts), as open_clip's `get_logits` computes them."""
        image_logits, _ = self.model.get_logits(
            prepared.arguments["image"], prepared.arguments["text"]
        )
        return image_logits


def _self_attention(block: nn.Module, tower: str, index: int) -> nn.MultiheadAttention:
    """`block`'s nn.MultiheadAttention, checked to be the self-attention that
    `ExplicitSelfAttention` reproduces."""
    attention = getattr(block, "attn", None)
    if not isinstance(attention, nn.MultiheadAttention) or hasattr(block, "ln_1_kv"):
        raise UnsupportedModelError(
            f"{tower} block {index} ({type(block).__name__}) is not open_clip's "
            "ResidualAttentionBlock with self-attention: custom blocks (qk_norm, scaled "
            "cosine attention, scale_heads, ...) are not supported"
        )
    if (
        not attention.batch_first
        or not attention._qkv_same_embed_dim
        or attention.bias_k is not None
        or attention.add_zero_attn
    ):
        raise UnsupportedModelError(
            f"{tower} block {index}: nn.MultiheadAttention without batch_first, with "
            "separate q/k/v projections, bias_k/bias_v or add_zero_attn is not supported"
        )
    return attention
