"""Tiny random vision-language models built from configs (no downloads), with processors
built offline from local pieces: the tiny word-level tokenizer of explain.testing.tiny_lm (its last
word replaced by the image placeholder "<image>") and an image processor constructed from
parameters.

`tiny_llava` is a LLaVA: a CLIP (or SigLIP) vision tower read at its second-to-last
layer, a two-layer projector, and a tiny Llama language model with grouped-query heads.
Its processor resizes a photo's shorter side to 32 pixels and crops the centre square,
so that a map on the model's 4 x 4 patch grid has to be carried back through the resize
and the crop to lie on the photo. `tiny_idefics3` (an Idefics3 or a SmolVLM) and its
processor split a 40 x 60 photo into 2 x 3 tiles and a global image, whose maps are put
together on the photo.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from explain.data.shapes_questions import CHAT_TEMPLATE
from explain.testing.tiny_lm import _COMMON, _FIRST_WORDS, VOCAB, WORDS, _word_tokenizer

__all__ = [
    "IDEFICS3_TILE",
    "IDEFICS3_TOKENS",
    "IMAGE_SIZE",
    "IMAGE_TOKEN",
    "PATCH_SIZE",
    "QWEN2_VL_IMAGE_SIZE",
    "VLM_CHAT_TEMPLATE",
    "save_tiny_llava",
    "tiny_gemma3",
    "tiny_idefics3",
    "tiny_idefics3_processor",
    "tiny_llava",
    "tiny_llava_processor",
    "tiny_paligemma",
    "tiny_paligemma_processor",
    "tiny_qwen2_vl",
    "tiny_qwen2_vl_processor",
    "tiny_vlm_tokenizer",
]

IMAGE_SIZE = 32
PATCH_SIZE = 8
IMAGE_TOKEN = "<image>"
IMAGE_TOKEN_ID = VOCAB - 1

VLM_CHAT_TEMPLATE = CHAT_TEMPLATE
"""A chat template whose messages hold text, or lists of {"type": "image"} and
{"type": "text", "text": ...} entries, as the processors of LLaVA and its kin take them:
the one of the zoo's vision-language model (explain.data.shapes_questions), whose words are
"<s>", the roles and "<image>" as here."""


def tiny_vlm_tokenizer(specials: Sequence[str] = ()) -> Any:
    """The tiny word-level tokenizer (explain.testing.tiny_lm) with "<image>" as its last word
    (id 59), a special token so that the processor's runs of placeholders split, and the
    image chat template; `specials` are more special words after it (ids 60, 61, ...)."""
    words = [*_FIRST_WORDS, *WORDS[len(_FIRST_WORDS) : VOCAB - 1], IMAGE_TOKEN, *specials]
    image_token = {"image_token": IMAGE_TOKEN}
    tokenizer = _word_tokenizer(words, VLM_CHAT_TEMPLATE, extra_special_tokens=image_token)
    if specials:
        tokenizer.add_special_tokens({"additional_special_tokens": list(specials)})
    return tokenizer


def _vision_config(tower: str) -> Any:
    import transformers as tf

    common = dict(
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=3,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        attn_implementation="sdpa",
    )
    if tower == "clip":
        return tf.CLIPVisionConfig(**common, projection_dim=16)
    if tower == "siglip":
        return tf.SiglipVisionConfig(**common)
    raise ValueError(f"tower must be 'clip' or 'siglip', got {tower!r}")


def tiny_llava(tower: str = "clip", seed: int = 0, **overrides: Any) -> nn.Module:
    """A small random `LlavaForConditionalGeneration`, in eval mode, sdpa attention.

    `tower` is "clip" (a class token: the projector reads the patches, strategy "default")
    or "siglip" (no class token, strategy "full"). The tower is read at its second-to-last
    layer (`vision_feature_layer=-2`, as LLaVA 1.5), so its last block never reaches the
    language model. `overrides` set config attributes (e.g. vision_feature_layer).
    """
    import transformers as tf

    text = tf.LlamaConfig(**_COMMON)
    config = tf.LlavaConfig(
        vision_config=_vision_config(tower),
        text_config=text,
        image_token_id=IMAGE_TOKEN_ID,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default" if tower == "clip" else "full",
        projector_hidden_act="gelu",
        attn_implementation="sdpa",
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = tf.LlavaForConditionalGeneration(config)
        with torch.no_grad():  # spread the embeddings: maps far from uniform
            for name, parameter in model.named_parameters():
                if "position_embedding" in name or "class_embedding" in name:
                    parameter.normal_(0.0, 0.5)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    model.eval()
    # LLaVA reads its tower's hidden states, for which transformers puts capturing hooks on
    # the tower's modules at the first forward and keeps them: one forward here makes the
    # tiny model look like any model that has run once.
    ids = torch.tensor([[1] + [IMAGE_TOKEN_ID] * _image_tokens(model)])
    with torch.no_grad():
        model(input_ids=ids, pixel_values=torch.zeros(1, 3, IMAGE_SIZE, IMAGE_SIZE))
    return model


def _image_tokens(model: nn.Module) -> int:
    """Image tokens per image of a tiny LLaVA: the tower's tokens (the patches, and a
    CLIP tower's class token), less the first with strategy "default"."""
    prefix = 1 if model.config.vision_config.model_type == "clip_vision_model" else 0
    dropped = 1 if model.config.vision_feature_select_strategy == "default" else 0
    return prefix + (IMAGE_SIZE // PATCH_SIZE) ** 2 - dropped


def tiny_llava_processor(tower: str = "clip") -> Any:
    """The processor of `tiny_llava(tower)`: the tiny tokenizer with "<image>", and a CLIP
    image processor that resizes the shorter side to 32 and crops the centre 32 x 32."""
    import transformers as tf

    images = tf.CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE},
        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        do_center_crop=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    return tf.LlavaProcessor(
        image_processor=images,
        tokenizer=tiny_vlm_tokenizer(),
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default" if tower == "clip" else "full",
        num_additional_image_tokens=1 if tower == "clip" else 0,
        chat_template=VLM_CHAT_TEMPLATE,
    )


def tiny_paligemma(seed: int = 0) -> nn.Module:
    """A small random `PaliGemmaForConditionalGeneration`, in eval mode, sdpa attention: a
    SigLIP tower (4 x 4 patches), a linear projector and a tiny Gemma language model."""
    import transformers as tf

    text = tf.GemmaConfig(**_COMMON, head_dim=8)
    config = tf.PaliGemmaConfig(
        vision_config=_vision_config("siglip"),
        text_config=text,
        image_token_id=IMAGE_TOKEN_ID,
        projection_dim=text.hidden_size,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = tf.PaliGemmaForConditionalGeneration(config)
        with torch.no_grad():  # spread the embeddings: maps far from uniform
            for name, parameter in model.named_parameters():
                if "position_embedding" in name:
                    parameter.normal_(0.0, 0.5)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    return model.eval()


def tiny_paligemma_processor() -> Any:
    """The processor of `tiny_paligemma`: the tiny tokenizer with "<image>" and a SigLIP
    image processor that resizes to 32 x 32 (squashing the photo, as PaliGemma's does).
    PaliGemma takes no chat template: the image and the question are given as they are."""
    import transformers as tf

    images = tf.SiglipImageProcessor(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    images.image_seq_length = (IMAGE_SIZE // PATCH_SIZE) ** 2
    tokenizer = tiny_vlm_tokenizer()
    tokenizer.chat_template = None
    return tf.PaliGemmaProcessor(image_processor=images, tokenizer=tokenizer)


BOI_TOKEN_ID, EOI_TOKEN_ID = VOCAB - 3, VOCAB - 2
"""The tiny Gemma 3's begin- and end-of-image tokens (words w57 and w58)."""


def tiny_gemma3(seed: int = 0) -> nn.Module:
    """A small random `Gemma3ForConditionalGeneration`, in eval mode, sdpa attention: a
    SigLIP tower (4 x 4 patches) pooled to 2 x 2 image tokens, and a tiny Gemma 3 language
    model with sliding-window and full layers. Its inputs are "<s> BOI <image> x 4 EOI
    words", token type 1 at the image tokens."""
    import transformers as tf

    text = tf.Gemma3TextConfig(
        **_COMMON,
        head_dim=8,
        sliding_window=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        query_pre_attn_scalar=8,
    )
    config = tf.Gemma3Config(
        vision_config=_vision_config("siglip"),
        text_config=text,
        mm_tokens_per_image=4,
        image_token_id=IMAGE_TOKEN_ID,
        boi_token_id=BOI_TOKEN_ID,
        eoi_token_id=EOI_TOKEN_ID,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = tf.Gemma3ForConditionalGeneration(config)
        with torch.no_grad():  # spread: maps far from uniform, a projector that projects
            for name, parameter in model.named_parameters():
                if "position_embedding" in name or "mm_input_projection" in name:
                    parameter.normal_(0.0, 0.5)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    return model.eval()


def save_tiny_llava(folder: Path, tower: str = "clip") -> Path:
    """Save `tiny_llava(tower)` with its processor to `folder`: a model folder that
    `load_model` and `explain generate --model` read like a downloaded checkpoint."""
    tiny_llava(tower).save_pretrained(folder)
    tiny_llava_processor(tower).save_pretrained(folder)
    return folder


QWEN2_VL_IMAGE_SIZE = (16 * 16 * 4, 32 * 64)
"""The tiny Qwen2-VL processor's least and most pixels per photo: 4 to 8 merged 16-pixel
blocks, so a 40 x 60 photo becomes 32 x 64 (a 4 x 8 patch grid, 2 x 4 image tokens)."""


def tiny_qwen2_vl(seed: int = 0, version: str = "2") -> nn.Module:
    """A small random `Qwen2VLForConditionalGeneration` (`version` "2") or
    `Qwen2_5_VLForConditionalGeneration` ("2.5"), in eval mode, sdpa attention: a
    two-block tower over 8-pixel patches merged 2 x 2 (2.5: windows of 3 x 3 merged
    blocks in its first block, so that a grid of 2 x 4 merged blocks has a 2 x 3 window
    and a smaller 2 x 1 one at its edge; full attention in its second), and a tiny Qwen2
    language model with multimodal rotary positions (sections 2, 1, 1 of its 4 rotary
    frequencies)."""
    import transformers as tf

    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}
    tower = dict(depth=2, num_heads=2, patch_size=PATCH_SIZE, temporal_patch_size=2)
    tower["spatial_merge_size"] = 2
    if version == "2":
        text = tf.Qwen2VLTextConfig(**_COMMON, rope_parameters=rope)
        vision = tf.Qwen2VLVisionConfig(**tower, embed_dim=32, hidden_size=32, mlp_ratio=2)
        kind, build = tf.Qwen2VLConfig, tf.Qwen2VLForConditionalGeneration
    elif version == "2.5":
        text = tf.Qwen2_5_VLTextConfig(**_COMMON, rope_parameters=rope)
        vision = tf.Qwen2_5_VLVisionConfig(
            **tower,
            hidden_size=32,
            intermediate_size=37,
            out_hidden_size=32,
            window_size=6 * PATCH_SIZE,
            fullatt_block_indexes=[1],
        )
        kind, build = tf.Qwen2_5_VLConfig, tf.Qwen2_5_VLForConditionalGeneration
    else:
        raise ValueError(f"version must be '2' or '2.5', got {version!r}")
    config = kind(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        image_token_id=IMAGE_TOKEN_ID,
        video_token_id=VOCAB - 2,
        vision_start_token_id=VOCAB - 3,
        vision_end_token_id=VOCAB - 4,
    )
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = build(config)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    return model.eval()


def tiny_qwen2_vl_processor(version: str = "2") -> Any:
    """The processor of `tiny_qwen2_vl(version=...)`: the tiny tokenizer with "<image>"
    (each image expands to its run of merged tokens) and Qwen2-VL's image processor (both
    versions use it), which resizes a photo to whole 16-pixel blocks within
    `QWEN2_VL_IMAGE_SIZE` pixels (no crop)."""
    import transformers as tf

    least, most = QWEN2_VL_IMAGE_SIZE
    geometry = dict(
        size={"shortest_edge": least, "longest_edge": most},
        patch_size=PATCH_SIZE,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    kind = tf.Qwen2_5_VLProcessor if version == "2.5" else tf.Qwen2VLProcessor
    return kind(
        image_processor=tf.Qwen2VLImageProcessor(**geometry),
        video_processor=tf.Qwen2VLVideoProcessor(**geometry),
        tokenizer=tiny_vlm_tokenizer(),
        chat_template=VLM_CHAT_TEMPLATE,
    )


IDEFICS3_TOKENS = (
    "<fake_token_around_image>",
    "<global-img>",
    "<end_of_utterance>",
    *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)),
)
"""The special words of Idefics3's and SmolVLM's processors: around each tile's image
tokens, before the global image's, and each tile's row and column (up to 6 x 6)."""

IDEFICS3_TILE = IMAGE_SIZE
"""The tiny Idefics3's and SmolVLM's tile side in pixels: their processors resize a photo's
longer side to 3 tiles (96 pixels), then to whole tiles, so a 40 x 60 photo becomes
64 x 96 pixels: 2 x 3 tiles and the global image, 7 images of the tower."""


def tiny_idefics3(seed: int = 0, kind: str = "idefics3") -> nn.Module:
    """A small random `Idefics3ForConditionalGeneration` (`kind` "idefics3") or
    `SmolVLMForConditionalGeneration` ("smolvlm"), in eval mode, sdpa attention: a
    SigLIP-like tower over 32-pixel tiles (Idefics3: 8-pixel patches, 4 x 4 per tile,
    pixel-shuffled 2 x 2 into 4 image tokens; SmolVLM: 4-pixel patches, 8 x 8 per tile,
    shuffled 4 x 4 into 4 image tokens) and a tiny Llama language model whose vocabulary
    holds `IDEFICS3_TOKENS` after the tiny tokenizer's words."""
    import transformers as tf

    if kind not in ("idefics3", "smolvlm"):
        raise ValueError(f"kind must be 'idefics3' or 'smolvlm', got {kind!r}")
    smol = kind == "smolvlm"
    patch, scale = (4, 4) if smol else (PATCH_SIZE, 2)
    vision = dict(
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IDEFICS3_TILE,
        patch_size=patch,
    )
    common = {**_COMMON, "vocab_size": VOCAB + len(IDEFICS3_TOKENS), "max_position_embeddings": 256}
    vision_config = (tf.SmolVLMVisionConfig if smol else tf.Idefics3VisionConfig)(**vision)
    config = (tf.SmolVLMConfig if smol else tf.Idefics3Config)(
        vision_config=vision_config.to_dict(),
        text_config=tf.LlamaConfig(**common).to_dict(),
        scale_factor=scale,
        image_token_id=IMAGE_TOKEN_ID,
    )
    config._attn_implementation = "sdpa"
    build = tf.SmolVLMForConditionalGeneration if smol else tf.Idefics3ForConditionalGeneration
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = build(config)
        with torch.no_grad():  # spread the embeddings: maps far from uniform
            for name, parameter in model.named_parameters():
                if "position_embedding" in name:
                    parameter.normal_(0.0, 0.5)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    return model.eval()


def tiny_idefics3_processor(kind: str = "idefics3") -> Any:
    """The processor of `tiny_idefics3(kind=...)`: the tiny tokenizer with "<image>" and
    `IDEFICS3_TOKENS`, and Idefics3's (or SmolVLM's) image processor, which resizes a
    photo's longer side to 96 pixels, then each side up to whole 32-pixel tiles (the
    aspect squashed a little, nothing cropped), and splits it into those tiles and the
    whole photo downscaled to one tile."""
    import transformers as tf

    geometry = dict(
        size={"longest_edge": 3 * IDEFICS3_TILE},
        max_image_size={"longest_edge": IDEFICS3_TILE},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    tokenizer = tiny_vlm_tokenizer(IDEFICS3_TOKENS)
    if kind == "idefics3":
        return tf.Idefics3Processor(
            image_processor=tf.Idefics3ImageProcessor(**geometry),
            tokenizer=tokenizer,
            image_seq_len=4,
            chat_template=VLM_CHAT_TEMPLATE,
        )
    if kind == "smolvlm":  # transformers' SmolVLM processor needs num2words (for videos)
        return tf.SmolVLMProcessor(
            image_processor=tf.SmolVLMImageProcessor(**geometry),
            tokenizer=tokenizer,
            video_processor=tf.SmolVLMVideoProcessor(),
            image_seq_len=4,
            chat_template=VLM_CHAT_TEMPLATE,
        )
    raise ValueError(f"kind must be 'idefics3' or 'smolvlm', got {kind!r}")
