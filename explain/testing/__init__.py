"""Helpers the test suite shares (and users can use to test their own setups).

- `tiny_models`: a tiny model of every registered family (`TINY_MODELS`, `tiny_case`), the
  vision backbones' builders and two hand-written transformers with their
  `TransformerSpec`, all random and built from configs;
- `tiny_lm`: tiny decoder-only language models of every family and a word-level
  tokenizer with a chat template;
- `tiny_vlm`: tiny vision-language models (LLaVA, PaliGemma, Gemma 3) and their
  processors, built offline;
- `model_state`: `ModelState`, a snapshot of everything an explanation promises not to
  change, and a comparison that names what changed;
- `hub_cache`: a Hugging Face cache laid out exactly as downloads leave it, filled with
  tiny models under real repo names, so that the hub loading code runs offline.
"""

from explain.testing.hub_cache import HUB_SPECS, cache_hub_repo, fill_hub_cache
from explain.testing.model_state import ModelState, hook_counts
from explain.testing.tiny_models import (
    SWIN_KINDS,
    TINY_MODELS,
    HandWrittenTextEncoder,
    HandWrittenViT,
    TinyCase,
    tiny_beit,
    tiny_case,
    tiny_custom_text,
    tiny_custom_vit,
    tiny_detr,
    tiny_eva,
    tiny_hf_vision,
    tiny_siglip,
    tiny_swin,
    tiny_vit,
)

__all__ = [
    "HUB_SPECS",
    "SWIN_KINDS",
    "TINY_MODELS",
    "HandWrittenTextEncoder",
    "HandWrittenViT",
    "ModelState",
    "TinyCase",
    "cache_hub_repo",
    "fill_hub_cache",
    "hook_counts",
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
