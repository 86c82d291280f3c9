"""Tiny models of every registered family, built from configs (no weights needed).

- `tiny_vit`: small timm Vision Transformers.
- `tiny_case`: for every registered family (explain.architectures.registry), a tiny
  model built from a config with a small batch of inputs, which the conformance suite
  (tests/test_conformance.py) runs every contract on. A new family adds one entry to
  `TINY_MODELS`; a family registered without one fails the suite.
- one tiny builder per vision backbone family (`tiny_eva`, `tiny_beit`, `tiny_hf_vision`,
  `tiny_siglip`) and two hand-written transformers with their `TransformerSpec`
  (`tiny_custom_vit`, `tiny_custom_text`), all random and built from configs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from explain.architectures.custom import TransformerSpec

__all__ = [
    "SWIN_KINDS",
    "TINY_MODELS",
    "HandWrittenTextEncoder",
    "HandWrittenViT",
    "TinyCase",
    "tiny_beit",
    "tiny_case",
    "tiny_custom_text",
    "tiny_custom_vit",
    "tiny_detr",
    "tiny_eva",
    "tiny_hf_vision",
    "tiny_siglip",
    "tiny_swin",
    "tiny_vit",
]


def tiny_vit(
    *,
    img_size: int | tuple[int, int] = 32,
    patch_size: int = 8,
    embed_dim: int = 32,
    depth: int = 3,
    num_heads: int = 2,
    num_classes: int = 5,
    distilled: bool = False,
    seed: int = 0,
    **kwargs: Any,
) -> nn.Module:
    """A small randomly initialised timm ViT (or distilled DeiT) from a config.

    Extra keyword arguments go to timm's constructor: `reg_tokens`, `class_token`,
    `global_pool`, `dynamic_img_size`, `drop_rate`, `attn_drop_rate`, ...
    """
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer

    cls = VisionTransformerDistilled if distilled else VisionTransformer
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = cls(
            img_size=img_size,
            patch_size=patch_size,
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            num_classes=num_classes,
            **kwargs,
        )
        # timm initialises tokens and embeddings with tiny values (train mode kept).
        return _spread(model, 0.5, "cls_token", "dist_token", "reg_token", "pos_embed")


@dataclass(frozen=True)
class TinyCase:
    """A tiny model of one family and a batch of two inputs that differ in what the family
    lets differ (text lengths: the shorter text is right-padded).

    Attributes:
        model: the model, in eval mode.
        batch: the two samples together, as `Explainer.explain` takes them.
        alone: each sample by itself, unpadded.
        lengths: by token set name, the real length of each sample's tokens (text sets,
            right-padded in `batch`); the relevance past it is padding.
        spec: for a transformer of one's own, the `TransformerSpec` the Explainer takes.
    """

    model: nn.Module
    batch: Any
    alone: tuple[Any, ...]
    lengths: Mapping[str, tuple[int, ...]]
    spec: TransformerSpec | None = None


def _seeded(build: Callable[[], nn.Module], seed: int = 0) -> nn.Module:
    """`build()` under its own seed, leaving the global RNG as it was; in eval mode."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build().eval()


def _spread(model: nn.Module, std: float, *names: str) -> nn.Module:
    """Random transformer weights give near-uniform attention; redrawing the parameters
    whose names contain one of `names` (token and position embeddings, prefix tokens,
    some weights) with a wider `std` makes the maps differ from token to token, so that
    the tests can tell methods, and mistakes, apart. Draws from the global RNG: call it
    inside the seeded build (`_seeded`)."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if any(part in name for part in names):
                parameter.normal_(0.0, std)
    return model


def _texts(lengths: tuple[int, ...], vocab: tuple[int, int], first: int, last: int) -> Tensor:
    """Right-padded (with 0) token ids: `first`, random words from `vocab`, `last`."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, length in enumerate(lengths):
        words = torch.randint(*vocab, (length - 2,), generator=generator)
        ids[row, :length] = torch.cat([torch.tensor([first]), words, torch.tensor([last])])
    return ids


def _mask(lengths: tuple[int, ...], width: int) -> Tensor:
    """The attention mask of right-padded texts of `lengths` tokens, `width` wide."""
    return (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()


def _image_texts(lengths: tuple[int, ...], image: Tensor, at: int) -> tuple[Tensor, Tensor]:
    """Right-padded token ids of texts `lengths` long that hold `image`'s tokens after
    their first `at` tokens (the rest random words), and their attention mask."""
    words = _texts(tuple(n - len(image) for n in lengths), (5, 40), first=1, last=2)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, length in enumerate(lengths):
        text = words[row, : length - len(image)]
        ids[row, :length] = torch.cat([text[:at], image, text[at:]])
    return ids, _mask(lengths, ids.shape[1])


def _padded_case(
    model: nn.Module,
    lengths: tuple[int, ...],
    tokens: Mapping[str, Tensor],
    images: Mapping[str, Tensor] | None = None,
) -> TinyCase:
    """The case of right-padded texts of `lengths` tokens: `tokens` (ids, mask, ... one
    row a text) and `images` (one equal chunk a text) batched, and each text alone, cut
    to its length."""
    images = images or {}
    alone = tuple(
        {name: value[i : i + 1, :n] for name, value in tokens.items()}
        | {name: value.chunk(len(lengths))[i] for name, value in images.items()}
        for i, n in enumerate(lengths)
    )
    return TinyCase(model, {**tokens, **images}, alone, {"text": lengths})


def _text_case(model: nn.Module, lengths: tuple[int, ...], first: int, last: int) -> TinyCase:
    ids = _texts(lengths, (3, 40), first, last)
    tokens = {"input_ids": ids, "attention_mask": _mask(lengths, ids.shape[1])}
    return _padded_case(model, lengths, tokens)


def _images(count: int, size: int) -> Tensor:
    return torch.randn(count, 3, size, size, generator=torch.Generator().manual_seed(2))


def _image_case(model: nn.Module, size: int) -> TinyCase:
    images = _images(2, size)
    return TinyCase(model, images, (images[:1], images[1:]), {})


def _timm_vit() -> TinyCase:
    return _image_case(tiny_vit(), 32)


def _hf_text_encoder() -> TinyCase:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=16,
        num_labels=3,
        initializer_range=0.3,
        pad_token_id=0,
        attn_implementation="sdpa",
    )
    model = _seeded(lambda: BertForSequenceClassification(config))
    return _text_case(model, (6, 4), first=1, last=2)


def _hf_gpt2() -> TinyCase:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=40,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=2,
        initializer_range=0.3,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="sdpa",
    )
    return _text_case(_seeded(lambda: GPT2LMHeadModel(config)), (6, 4), first=1, last=2)


def _hf_vit() -> TinyCase:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        image_size=16,
        patch_size=4,
        num_labels=5,
        initializer_range=0.3,
        attn_implementation="sdpa",
    )
    return _image_case(_seeded(lambda: ViTForImageClassification(config)), 16)


def _hf_clip() -> TinyCase:
    from transformers import CLIPConfig, CLIPModel

    text = dict(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=16,
        eos_token_id=49,
        bos_token_id=48,
        pad_token_id=0,
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    )
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    model = _seeded(
        lambda: _spread(CLIPModel(config), 1.0, "position_embedding", "token_embedding")
    )
    lengths = (6, 4)
    ids = _texts(lengths, (1, 40), first=48, last=49)
    mask = (torch.arange(ids.shape[1])[None] < torch.tensor(lengths)[:, None]).long()
    images = _images(2, 32)
    alone = tuple(
        {
            "pixel_values": images[i : i + 1],
            "input_ids": ids[i : i + 1, :n],
            "attention_mask": mask[i : i + 1, :n],
        }
        for i, n in enumerate(lengths)
    )
    batch = {"pixel_values": images, "input_ids": ids, "attention_mask": mask}
    return TinyCase(model, batch, alone, {"text": lengths})


def _open_clip() -> TinyCase:
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    context, sot, eot = 16, 62, 63

    def build() -> nn.Module:
        return CLIP(
            embed_dim=16,
            vision_cfg=CLIPVisionCfg(
                layers=2, width=32, head_width=16, patch_size=8, image_size=32
            ),
            text_cfg=CLIPTextCfg(
                layers=2, width=32, heads=2, vocab_size=64, context_length=context
            ),
        )

    model = _seeded(lambda: _spread(build(), 1.0, "positional_embedding", "token_embedding"))
    lengths = (6, 4)
    ids = torch.zeros(2, context, dtype=torch.long)  # open_clip pads to its context length
    ids[:, : max(lengths)] = _texts(lengths, (1, sot), first=sot, last=eot)
    images = _images(2, 32)
    alone = tuple({"image": images[i : i + 1], "text": ids[i : i + 1]} for i in range(2))
    return TinyCase(model, {"image": images, "text": ids}, alone, {"text": lengths})


def _hf_encoder_decoder() -> TinyCase:
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(
        vocab_size=40,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=None,
    )
    model = _seeded(lambda: _spread(BartForConditionalGeneration(config), 0.3, "weight"))
    source, target = (6, 4), (5, 3)
    ids, decoder = _texts(source, (3, 40), 1, 2), _texts(target, (3, 40), 2, 5)
    mask, decoder_mask = _mask(source, ids.shape[1]), _mask(target, decoder.shape[1])
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "decoder_input_ids": decoder,
        "decoder_attention_mask": decoder_mask,
    }
    alone = tuple(
        {
            "input_ids": ids[i : i + 1, :n],
            "attention_mask": mask[i : i + 1, :n],
            "decoder_input_ids": decoder[i : i + 1, :m],
            "decoder_attention_mask": decoder_mask[i : i + 1, :m],
        }
        for i, (n, m) in enumerate(zip(source, target, strict=True))
    )
    return TinyCase(model, batch, alone, {"source": source, "target": target})


# -- vision backbone families (issue 14): one tiny builder per family, from configs --------


def tiny_eva(*, seed: int = 0, **kwargs: Any) -> nn.Module:
    """A small random timm `Eva` with EVA-02's pieces (rotary embeddings, SwiGLU MLP,
    sub-LN); kwargs override, e.g. DINOv3's `num_reg_tokens=4, use_abs_pos_emb=False,
    rope_type="dinov3", init_values=1e-5`."""
    from timm.models.eva import Eva

    config: dict[str, Any] = dict(
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=3,
        num_heads=2,
        num_classes=5,
        mlp_ratio=4 * 2 / 3,
        swiglu_mlp=True,
        scale_mlp=True,
        use_rot_pos_emb=True,
        ref_feat_shape=(4, 4),
        head_init_scale=1.0,
    )
    spread = ("cls_token", "reg_token", "pos_embed", "qkv.weight")
    return _seeded(lambda: _spread(Eva(**{**config, **kwargs}), 0.5, *spread), seed)


def tiny_beit(*, seed: int = 0, **kwargs: Any) -> nn.Module:
    """A small random timm `Beit` with a relative position bias in every block."""
    from timm.models.beit import Beit

    config: dict[str, Any] = dict(
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=3,
        num_heads=2,
        num_classes=5,
        use_abs_pos_emb=False,
        use_rel_pos_bias=True,
        init_values=1.0,
        head_init_scale=1.0,
    )
    spread = ("cls_token", "pos_embed", "relative_position_bias_table", "qkv.weight")
    return _seeded(lambda: _spread(Beit(**{**config, **kwargs}), 0.5, *spread), seed)


def _hf_vision_config(**overrides: Any) -> dict[str, Any]:
    """A tiny transformers vision config (32x32 images, 8x8 patches, 3 blocks)."""
    config: dict[str, Any] = dict(
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=48,
        image_size=32,
        patch_size=8,
        num_labels=5,
        initializer_range=0.3,
        attn_implementation="sdpa",
    )
    return {**config, **overrides}


_SIGLIP_TEXT = dict(
    vocab_size=50,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=2,
    max_position_embeddings=16,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def tiny_hf_vision(family: str, *, seed: int = 0, **overrides: Any) -> nn.Module:
    """A small random Hugging Face image classifier of `family`: "dinov2",
    "dinov2_with_registers" (2 registers), "beit" (relative position bias) or "siglip";
    overrides go to the config (e.g. `use_mean_pooling=False` for BEiT)."""
    import transformers as tf

    builders = {
        "dinov2": lambda: tf.Dinov2ForImageClassification(
            tf.Dinov2Config(**_hf_vision_config(mlp_ratio=2, **overrides))
        ),
        "dinov2_with_registers": lambda: tf.Dinov2WithRegistersForImageClassification(
            tf.Dinov2WithRegistersConfig(
                **_hf_vision_config(mlp_ratio=2, num_register_tokens=2, **overrides)
            )
        ),
        "beit": lambda: tf.BeitForImageClassification(
            tf.BeitConfig(
                **_hf_vision_config(
                    use_relative_position_bias=True, layer_scale_init_value=1.0, **overrides
                )
            )
        ),
        "siglip": lambda: tf.SiglipForImageClassification(
            tf.SiglipConfig(
                vision_config=_hf_vision_config(**overrides),
                text_config=_SIGLIP_TEXT,
                num_labels=5,
            )
        ),
    }
    spread = (
        "cls_token",
        "register_tokens",
        "position_embeddings",
        "position_embedding.weight",
        "relative_position_bias_table",
    )
    return _seeded(lambda: _spread(builders[family](), 0.5, *spread), seed)


def tiny_siglip(*, seed: int = 0) -> nn.Module:
    """A small random Hugging Face `SiglipModel` (image-text similarity) with its vision
    attention pooling head; texts are ids < 50 of at most 16 tokens."""
    import transformers as tf

    config = tf.SiglipConfig(
        vision_config=_hf_vision_config(num_hidden_layers=2), text_config=_SIGLIP_TEXT
    )
    spread = ("position_embedding.weight", "token_embedding.weight", "probe")
    return _seeded(lambda: _spread(tf.SiglipModel(config), 0.5, *spread), seed)


# -- hand-written transformers for the custom-model spec (issue 14) ------------------------


class _AttentionTimesValues(nn.Module):
    """A @ V as a module, whose first input is the probabilities."""

    def forward(self, probabilities: Tensor, values: Tensor) -> Tensor:
        return probabilities @ values


class _SelfAttention(nn.Module):
    """Multi-head self-attention written out: softmax(q k^T / sqrt(d) + mask) v. The
    probabilities pass through `self.probs` (an identity or dropout) and then enter
    `self.mix` (A @ V), the two places a TransformerSpec's `attention` can point to;
    `fused=True` computes the same with F.scaled_dot_product_attention instead, which
    never shows them."""

    def __init__(self, dim: int, heads: int, *, fused: bool = False, dropout: float = 0.0):
        super().__init__()
        self.heads, self.fused = heads, fused
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))
        self.probs = nn.Dropout(dropout) if dropout else nn.Identity()
        self.mix = _AttentionTimesValues()
        self.out = nn.Linear(dim, dim)

    def forward(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        batch, tokens, dim = x.shape

        def split(t: Tensor) -> Tensor:
            return t.reshape(batch, tokens, self.heads, dim // self.heads).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        if self.fused:
            mixed = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        else:
            scores = q @ k.transpose(-2, -1) / (dim // self.heads) ** 0.5
            if bias is not None:
                scores = scores + bias
            mixed = self.mix(self.probs(scores.softmax(dim=-1)), v)
        return self.out(mixed.transpose(1, 2).reshape(batch, tokens, dim))


class HandWrittenViT(nn.Module):
    """A small pre-norm ViT written from scratch: patches from a strided convolution, a
    class token, learned positions, blocks `self.layers[i]` with attention
    `.mixer.probs`, a linear head on the class token."""

    def __init__(
        self,
        *,
        image_size: int = 32,
        patch: int = 8,
        dim: int = 32,
        depth: int = 3,
        heads: int = 4,
        classes: int = 5,
        fused: bool = False,
    ):
        super().__init__()
        self.patchify = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim))
        self.positions = nn.Parameter(torch.randn(1, 1 + (image_size // patch) ** 2, dim))
        self.layers = nn.ModuleList(_ViTBlock(dim, heads, fused) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, images: Tensor) -> Tensor:
        x = self.patchify(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.positions
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)[:, 0])


class _ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, fused: bool):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mixer = _SelfAttention(dim, heads, fused=fused)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.mixer(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class HandWrittenTextEncoder(nn.Module):
    """A small post-norm text encoder written from scratch: token and position embeddings,
    blocks `self.encoder.blocks[i]` whose attention dropout `.attention.probs` sees the
    probabilities, padding masked out of the keys, a classifier on the mean of the real
    tokens. Called as `model(input_ids=..., attention_mask=...)`."""

    def __init__(
        self,
        *,
        vocab: int = 40,
        max_tokens: int = 16,
        dim: int = 32,
        depth: int = 2,
        heads: int = 2,
        classes: int = 3,
    ):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(max_tokens, dim)
        self.encoder = nn.Module()
        self.encoder.blocks = nn.Sequential(*(_TextBlock(dim, heads) for _ in range(depth)))
        self.classifier = nn.Linear(dim, classes)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tokens(input_ids) + self.positions(positions)
        bias = torch.zeros(mask.shape, dtype=x.dtype, device=x.device)
        bias = bias.masked_fill(mask == 0, float("-inf"))[:, None, None, :]
        for block in self.encoder.blocks:
            x = block(x, bias)
        weights = mask.to(x.dtype)[..., None]
        return self.classifier((x * weights).sum(dim=1) / weights.sum(dim=1))


class _TextBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.attention = _SelfAttention(dim, heads, dropout=0.1)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.feed_forward = nn.Sequential(
            nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim)
        )

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        x = self.norm1(x + self.attention(x, bias))
        return self.norm2(x + self.feed_forward(x))


def tiny_custom_vit(*, seed: int = 0, fused: bool = False) -> tuple[nn.Module, TransformerSpec]:
    """The hand-written ViT and its TransformerSpec (class-token readout, 8x8 patches)."""
    model = _seeded(lambda: HandWrittenViT(fused=fused), seed)
    spec = TransformerSpec(
        blocks="layers.*", attention="mixer.probs", readout=0, patch_size=8, prefix_tokens=1
    )
    return model, spec


def tiny_custom_text(*, seed: int = 0) -> tuple[nn.Module, TransformerSpec]:
    """The hand-written text encoder and its TransformerSpec (mean over real tokens)."""
    model = _seeded(lambda: _spread(HandWrittenTextEncoder(), 1.0, "positions"), seed)
    spec = TransformerSpec(blocks="encoder.blocks", attention="attention.probs", readout="mean")
    return model, spec


# -- the tiny model of every family, for the conformance suite -------------------------------


CONFORMANCE_LMS = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3", "gpt_neox", "olmo2")
"""Decoder-only families (explain.testing.tiny_lm) that the conformance suite runs besides GPT-2,
the registry's own tiny model of the causal-LM adapter."""


def _causal_lm(family: str) -> TinyCase:
    from explain.testing.tiny_lm import tiny_causal_lm

    return _text_case(tiny_causal_lm(family), (6, 4), first=1, last=2)


def _hf_siglip() -> TinyCase:
    # SigLIP's text tower reads the last position and takes no attention mask: texts of one
    # length, as its processor pads them (padding="max_length").
    ids = _texts((7, 7), (3, 50), first=3, last=4)
    images = _images(2, 32)
    alone = tuple(
        {"pixel_values": images[i : i + 1], "input_ids": ids[i : i + 1]} for i in range(2)
    )
    return TinyCase(tiny_siglip(), {"pixel_values": images, "input_ids": ids}, alone, {})


def _hf_llava() -> TinyCase:
    from explain.testing.tiny_vlm import IMAGE_TOKEN_ID, tiny_llava

    # "<s> user <image> x 16 words", right-padded: each text holds its image's 16 tokens
    lengths = (23, 20)
    ids, mask = _image_texts(lengths, torch.full((16,), IMAGE_TOKEN_ID), at=2)
    tokens = {"input_ids": ids, "attention_mask": mask}
    return _padded_case(tiny_llava(), lengths, tokens, {"pixel_values": _images(2, 32)})


def _hf_paligemma() -> TinyCase:
    from explain.testing.tiny_vlm import IMAGE_TOKEN_ID, tiny_paligemma

    # 16 image tokens, then "<s> words", right-padded; all of it the bidirectional prefix
    lengths = (22, 19)
    ids, mask = _image_texts(lengths, torch.full((16,), IMAGE_TOKEN_ID), at=0)
    tokens = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    return _padded_case(tiny_paligemma(), lengths, tokens, {"pixel_values": _images(2, 32)})


def _hf_gemma3() -> TinyCase:
    from explain.testing.tiny_vlm import BOI_TOKEN_ID, EOI_TOKEN_ID, IMAGE_TOKEN_ID, tiny_gemma3

    # "<s> BOI <image> x 4 EOI words", right-padded; token type 1 at the image tokens
    lengths = (11, 9)
    image = torch.tensor([BOI_TOKEN_ID, *[IMAGE_TOKEN_ID] * 4, EOI_TOKEN_ID])
    ids, mask = _image_texts(lengths, image, at=1)
    types = (ids == IMAGE_TOKEN_ID).long()
    tokens = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    return _padded_case(tiny_gemma3(), lengths, tokens, {"pixel_values": _images(2, 32)})


def _hf_qwen2_vl(version: str = "2") -> TinyCase:
    from explain.testing.tiny_vlm import IMAGE_TOKEN_ID, tiny_qwen2_vl

    # "<s> user <image> x 4 words", right-padded: 32 x 32 images, 4 x 4 patches merged
    # 2 x 2; flattened as the processor does: block by block, each patch 3 channels x 2
    # frames x 8 x 8
    lengths = (11, 9)
    ids, mask = _image_texts(lengths, torch.full((4,), IMAGE_TOKEN_ID), at=2)
    # (image, channel, block row, row in block, pixel row, block col, col in block, pixel col)
    patches = _images(2, 32).reshape(2, 3, 2, 2, 8, 2, 2, 8).permute(0, 2, 5, 3, 6, 1, 4, 7)
    patches = patches.reshape(32, 3, 1, 8, 8).expand(-1, -1, 2, -1, -1).reshape(32, -1)
    images = {"pixel_values": patches, "image_grid_thw": torch.tensor([[1, 4, 4], [1, 4, 4]])}
    tokens = {"input_ids": ids, "attention_mask": mask}
    return _padded_case(tiny_qwen2_vl(version=version), lengths, tokens, images)


def _hf_idefics3(kind: str = "idefics3") -> TinyCase:
    from explain.testing.tiny_lm import VOCAB
    from explain.testing.tiny_vlm import IDEFICS3_TOKENS, IMAGE_TOKEN_ID, tiny_idefics3

    # "<s> user", a photo in 1 x 2 tiles and its global image as Idefics3's processor
    # writes them ("<fake><row_1_col_j>" and 4 image tokens per tile, then
    # "<fake><global-img>", 4 image tokens, "<fake>"), words; right-padded. The tile
    # layout comes with the inputs (rows, cols), as no tokenizer reads it here.
    def word(name: str) -> int:
        return VOCAB + IDEFICS3_TOKENS.index(name)

    fake, tile = word("<fake_token_around_image>"), [IMAGE_TOKEN_ID] * 4
    first, second, whole = (word(w) for w in ("<row_1_col_1>", "<row_1_col_2>", "<global-img>"))
    image = torch.tensor([fake, first, *tile, fake, second, *tile, fake, whole, *tile, fake])
    lengths = (26, 23)
    ids, mask = _image_texts(lengths, image, at=2)
    images = {"pixel_values": _images(6, 32).reshape(2, 3, 3, 32, 32)}
    images |= {"rows": torch.tensor([[1], [1]]), "cols": torch.tensor([[2], [2]])}
    tokens = {"input_ids": ids, "attention_mask": mask}
    return _padded_case(tiny_idefics3(kind=kind), lengths, tokens, images)


def _custom_text() -> TinyCase:
    model, spec = tiny_custom_text()
    case = _text_case(model, (6, 4), first=1, last=2)
    return TinyCase(model, case.batch, case.alone, case.lengths, spec)


def _custom_vit() -> TinyCase:
    model, spec = tiny_custom_vit()
    case = _image_case(model, 32)
    return TinyCase(model, case.batch, case.alone, case.lengths, spec)


SWIN_KINDS = ("timm", "timm_v2", "hf", "hf_v2")
"""The Swin implementations `tiny_swin` builds: timm's v1 and v2, transformers' v1 and v2."""


def tiny_swin(kind: str = "timm", *, num_classes: int = 5, seed: int = 0) -> nn.Module:
    """A small random Swin (`SWIN_KINDS`) on 32 x 32 images: 2 x 2 patches, windows of
    4 x 4 tokens, three stages of two blocks on grids of 16, 8 and 4 tokens a side, so the
    first two stages shift their windows and the last has one window, unshifted."""
    if kind in ("timm", "timm_v2"):
        from timm.models.swin_transformer import SwinTransformer
        from timm.models.swin_transformer_v2 import SwinTransformerV2

        cls = SwinTransformer if kind == "timm" else SwinTransformerV2
        model = _seeded(
            lambda: cls(
                img_size=32,
                patch_size=2,
                window_size=4,
                embed_dim=8,
                depths=(2, 2, 2),
                num_heads=(1, 2, 2),
                num_classes=num_classes,
            ),
            seed,
        )
        if kind == "timm_v2":
            # timm zero-initialises v2's post-norms (res-post-norm), so that a new model's
            # blocks add nothing and every attention gradient is 0; a trained model's are
            # not zero. Set to 1, as transformers initialises them.
            with torch.no_grad():
                for block in (b for stage in model.layers for b in stage.blocks):
                    block.norm1.weight.fill_(1.0)
                    block.norm2.weight.fill_(1.0)
        return model
    if kind in ("hf", "hf_v2"):
        import transformers

        prefix = "Swin" if kind == "hf" else "Swinv2"
        config = getattr(transformers, f"{prefix}Config")(
            image_size=32,
            patch_size=2,
            window_size=4,
            embed_dim=8,
            depths=[2, 2, 2],
            num_heads=[1, 2, 2],
            num_labels=num_classes,
            initializer_range=0.3,
        )
        model_class = getattr(transformers, f"{prefix}ForImageClassification")
        return _seeded(lambda: model_class(config), seed)
    raise ValueError(f"unknown Swin kind {kind!r}; choose from {', '.join(SWIN_KINDS)}")


def tiny_detr(
    *, conditional: bool = False, num_queries: int = 6, num_labels: int = 3, seed: int = 0
) -> nn.Module:
    """A small random DETR (or Conditional DETR) from a config: a timm ResNet-18 backbone
    with random weights (`use_pretrained_backbone=False`), two encoder and two decoder
    blocks of width 16. Its class head's bias favours class 0 (probability about 0.9), so
    that every query is a detection at the default threshold and the conformance suite
    has detections to explain."""
    import transformers

    prefix = "ConditionalDetr" if conditional else "Detr"
    config = getattr(transformers, f"{prefix}Config")(
        backbone="resnet18",
        use_timm_backbone=True,
        use_pretrained_backbone=False,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        num_queries=num_queries,
        num_labels=num_labels,
    )
    model_class = getattr(transformers, f"{prefix}ForObjectDetection")
    model = _seeded(lambda: model_class(config), seed)
    with torch.no_grad():
        model.class_labels_classifier.bias.zero_()
        model.class_labels_classifier.bias[0] = 3.0
    return model


TINY_MODELS: dict[str, Callable[[], TinyCase]] = {
    "timm_vit": _timm_vit,
    "hf_text_encoder": _hf_text_encoder,
    "hf_clip": _hf_clip,
    "hf_causal_lm": _hf_gpt2,
    "hf_encoder_decoder": _hf_encoder_decoder,
    "hf_vit": _hf_vit,
    "open_clip": _open_clip,
    "timm_eva": lambda: _image_case(tiny_eva(), 32),
    "timm_beit": lambda: _image_case(tiny_beit(), 32),
    "hf_dinov2": lambda: _image_case(tiny_hf_vision("dinov2"), 32),
    "hf_beit": lambda: _image_case(tiny_hf_vision("beit"), 32),
    "hf_siglip_classifier": lambda: _image_case(tiny_hf_vision("siglip"), 32),
    "hf_siglip": _hf_siglip,
    "timm_swin": lambda: _image_case(tiny_swin("timm"), 32),
    "timm_swin:v2": lambda: _image_case(tiny_swin("timm_v2"), 32),
    "hf_swin": lambda: _image_case(tiny_swin("hf"), 32),
    "hf_swin:v2": lambda: _image_case(tiny_swin("hf_v2"), 32),
    "hf_detr": lambda: _image_case(tiny_detr(), 64),
    "hf_detr:conditional": lambda: _image_case(tiny_detr(conditional=True), 64),
    "hf_llava": _hf_llava,
    "hf_paligemma": _hf_paligemma,
    "hf_gemma3": _hf_gemma3,
    "hf_qwen2_vl": _hf_qwen2_vl,
    "hf_qwen2_5_vl": lambda: _hf_qwen2_vl("2.5"),
    "hf_idefics3": _hf_idefics3,
    "hf_smolvlm": lambda: _hf_idefics3("smolvlm"),
    "custom_vit": _custom_vit,
    "custom_text": _custom_text,
    **{f"hf_causal_lm:{family}": partial(_causal_lm, family) for family in CONFORMANCE_LMS},
}
"""The tiny model of every registered family, by the family's registry name, and of the
two hand-written transformers explained through a `TransformerSpec` (custom_vit,
custom_text) and more decoder-only families of the causal-LM adapter (hf_causal_lm:NAME)."""


def tiny_case(family: str) -> TinyCase:
    """The tiny model and inputs of the registered family `family` (a fresh model)."""
    try:
        build = TINY_MODELS[family]
    except KeyError:
        raise KeyError(
            f"family {family!r} has no tiny model: add one to explain.testing.TINY_MODELS"
        ) from None
    return build()
