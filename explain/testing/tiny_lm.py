"""Tiny random decoder-only language models, one per family, built from configs (no
downloads), and a tiny word-level tokenizer with a chat template.

Every configuration exercises what its family adds: grouped-query attention (2 key/value
heads for 4 query heads), sliding windows shorter than the test texts, attention and
final-logit soft-capping (Gemma 2), query/key norms (Qwen3, OLMo 2, Gemma 3), partial
rotary embeddings and parallel residuals (GPT-NeoX), mixture-of-experts MLPs (Mixtral),
a fused qkv projection (Phi-3) and scaling multipliers (Granite). A large initializer
range makes the attention maps far from uniform, so that the tests can tell mistakes
apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

VOCAB = 60
MAX_POSITIONS = 64
WINDOW = 3  # shorter than the longer test texts, so that the window really masks

_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=37,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=MAX_POSITIONS,
    initializer_range=0.3,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    tie_word_embeddings=False,
    attn_implementation="sdpa",
)


def _configs() -> dict[str, Any]:
    import transformers as tf

    return {
        "llama": lambda: tf.LlamaConfig(**_COMMON),
        "granite": lambda: tf.GraniteConfig(
            **_COMMON, embedding_multiplier=2.0, attention_multiplier=0.2, logits_scaling=2.0
        ),
        "mistral": lambda: tf.MistralConfig(**_COMMON, sliding_window=WINDOW),
        # grouped expert matmuls need 16-byte aligned strides: an intermediate size of 40
        "mixtral": lambda: tf.MixtralConfig(
            **{**_COMMON, "intermediate_size": 40},
            num_local_experts=3,
            num_experts_per_tok=2,
            sliding_window=WINDOW,
        ),
        "qwen2": lambda: tf.Qwen2Config(
            **_COMMON,
            use_sliding_window=True,
            sliding_window=WINDOW,
            max_window_layers=1,
            layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        ),
        "qwen3": lambda: tf.Qwen3Config(**_COMMON, head_dim=8),
        # soft-capping exists on the eager path only: Gemma 2 refuses sdpa
        "gemma2": lambda: tf.Gemma2Config(
            **{**_COMMON, "attn_implementation": "eager"},
            head_dim=8,
            sliding_window=WINDOW,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=5.0,
            query_pre_attn_scalar=8,
        ),
        "gemma3": lambda: tf.Gemma3TextConfig(
            **_COMMON,
            head_dim=8,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            query_pre_attn_scalar=8,
        ),
        "phi3": lambda: tf.Phi3Config(**_COMMON, sliding_window=WINDOW),
        "olmo2": lambda: tf.Olmo2Config(**_COMMON),
        "gpt_neox": lambda: tf.GPTNeoXConfig(
            **{k: v for k, v in _COMMON.items() if k != "num_key_value_heads"},
            rotary_pct=0.5,
            use_parallel_residual=True,
        ),
        "gpt2": lambda: tf.GPT2Config(
            vocab_size=VOCAB,
            n_positions=MAX_POSITIONS,
            n_embd=32,
            n_layer=3,
            n_head=2,
            initializer_range=0.3,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
            attn_implementation="sdpa",
        ),
    }


FAMILIES: dict[str, str] = {
    # name -> transformers class
    "llama": "LlamaForCausalLM",
    "granite": "GraniteForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}
"""The families the tests cover, with what each configuration exercises (module doc)."""


def tiny_causal_lm(family: str, seed: int = 0, **overrides: Any) -> nn.Module:
    """A small random `FAMILIES[family]` model, loaded with sdpa attention, in eval mode."""
    import transformers as tf

    config = _configs()[family]()
    for key, value in overrides.items():
        setattr(config, key, value)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = getattr(tf, FAMILIES[family])(config)
    return model.eval()


WORDS = [f"w{i}" for i in range(VOCAB)]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<s> assistant {% endif %}"
)


# The first words of the tiny vocabulary; two of them HTML would take for markup: pages
# must show them escaped.
_FIRST_WORDS = ["<pad>", "<s>", "</s>", "user", "assistant", "system", "<script>", "a&b"]


def _word_tokenizer(words: list[str], chat_template: str, **options: Any) -> Any:
    """A left-padding word-level tokenizer over `words` (ids in their order; unknown words
    become w8) with `chat_template`, built offline; `options` go to transformers'
    `PreTrainedTokenizerFast`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w8"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="w8",
        padding_side="left",
        **options,
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def tiny_tokenizer() -> Any:
    """A word-level tokenizer over "<pad> <s> </s> user assistant system <script> a&b w8
    ... w59" (ids 0..59, the tiny models' vocabulary), with a chat template, built
    offline; unknown words become w8."""
    return _word_tokenizer(_FIRST_WORDS + WORDS[len(_FIRST_WORDS) :], CHAT_TEMPLATE)


def save_tiny_lm(folder: Path, family: str = "llama") -> Path:
    """Save a tiny model of `family` and the tiny tokenizer to `folder` (for the CLI).

    Raises ValueError for a family whose folders transformers' AutoTokenizer reads with
    that model type's own tokenizer class whatever the folder says (Qwen2 in
    transformers 5), which cannot read the word-level tokenizer: a folder that tokenizes
    to nonsense would fail far from here.
    """
    from transformers import AutoTokenizer

    model = tiny_causal_lm(family)
    model.save_pretrained(folder)
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(folder)
    probe = "user a&b w9 w10"
    reloaded = AutoTokenizer.from_pretrained(folder)
    if reloaded(probe)["input_ids"] != tokenizer(probe)["input_ids"]:
        raise ValueError(
            f"transformers reloads a saved tiny {family} model with its own "
            f"{type(reloaded).__name__}, which cannot read the tiny word-level tokenizer; "
            "save another family (e.g. llama)"
        )
    return folder
