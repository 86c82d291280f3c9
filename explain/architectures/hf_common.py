"""What every Hugging Face transformers adapter shares: finding blocks and attention,
forcing the eager attention path, and validating tokenized text.

Blocks and attention modules are found the way transformers itself finds them for
`output_hidden_states` / `output_attentions`: each model class names them in
`_can_record_outputs` (the block class whose output is a hidden state, and the attention
class whose output tuple carries the post-softmax probabilities at an index). We hook the
same modules ourselves instead of passing `output_attentions=True`, because transformers
installs its capturing hooks once and leaves them on the model for good.

Attention path: transformers 5 dispatches attention on `config._attn_implementation`
at call time, and only the eager function returns the probabilities. The recorder sets
the internal attribute on every config object the model holds (sub-configs included) to
"eager" and restores each afterwards; the public setter would recurse into sub-configs
and lose their individual settings on the way back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from explain.architectures.base import Adapter
from explain.errors import ExplainError, InputError, UnsupportedModelError
from explain.inputs import is_raw_text
from explain.layout import AttentionSite, FlagSetting, TokenLayout
from explain.lrp.attnlrp import AttnLrpSites, Gate, Projection
from explain.lrp.weights import base_layer

__all__ = [
    "HFAdapter",
    "attention_in",
    "attention_spec",
    "attnlrp_sites_of",
    "config_objects",
    "eager_attention_flags",
    "find_blocks",
    "is_transformers_class",
    "last_real_token",
    "mask_padding",
    "num_prefix_tokens",
    "positions_from_mask",
    "prepare_text",
    "probabilities_at",
    "recorded_output",
    "sdpa_attention_flags",
    "sliced_logits",
    "split_heads",
    "text_layout",
]


def is_transformers_class(model: nn.Module, package: str, names: Sequence[str]) -> bool:
    """Whether `model` is (a subclass of) one of the `names` classes of
    `transformers.models.<package>`, without importing transformers."""
    prefix = f"transformers.models.{package}."
    return any(
        cls.__name__ in names and cls.__module__.startswith(prefix) for cls in type(model).__mro__
    )


def config_objects(model: nn.Module) -> list[Any]:
    """Every distinct config object the model and its submodules hold, sub-configs included."""
    found: dict[int, Any] = {}
    pending = [getattr(module, "config", None) for module in model.modules()]
    while pending:
        config = pending.pop()
        if config is None or id(config) in found or not hasattr(config, "sub_configs"):
            continue
        found[id(config)] = config
        pending.extend(getattr(config, key, None) for key in config.sub_configs)
    return list(found.values())


def eager_attention_flags(model: nn.Module) -> list[FlagSetting]:
    """Flags that put every attention module of `model` on the eager path (which returns
    the probabilities) and turn gradient checkpointing off (which would rerun the blocks in
    the backward pass and fire the hooks twice)."""
    flags = []
    for config in config_objects(model):
        name = (
            "_attn_implementation_internal"
            if hasattr(config, "_attn_implementation_internal")
            else "_attn_implementation"
        )
        flags.append(FlagSetting(config, name, "eager"))
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) is True:
            flags.append(FlagSetting(module, "gradient_checkpointing", False))
    return flags


def recorded_output(stack: nn.Module, key: str) -> tuple[type, int, str | None] | None:
    """What the class of `stack` (a model, an encoder, a decoder) records for
    `output_<key>` in its `_can_record_outputs`: (module class, index of the tensor in the
    module's output tuple, required module name or None), or None when it names nothing."""
    record = (getattr(type(stack), "_can_record_outputs", None) or {}).get(key)
    if record is None:
        return None
    if isinstance(record, type):
        return record, 1, None
    name = record.layer_name.strip(".") if record.layer_name else None
    return record.target_class, record.index, name


def find_blocks(stack: nn.Module) -> list[nn.Module]:
    """The blocks of `stack` in module order: its modules of the class it records hidden
    states from."""
    record = recorded_output(stack, "hidden_states")
    if record is None:
        raise UnsupportedModelError(
            f"{type(stack).__name__} does not name its blocks (_can_record_outputs); it is "
            "not a supported transformers model"
        )
    return [module for module in stack.modules() if isinstance(module, record[0])]


def attention_in(block: nn.Module, record: tuple[type, int, str | None]) -> nn.Module | None:
    """The attention module of `block` that `record` (see `recorded_output`) names."""
    cls, _, name = record
    for path, module in block.named_modules():
        if isinstance(module, cls) and (name is None or path.split(".")[-1] == name):
            return module
    return None


def sdpa_attention_flags(model: nn.Module) -> list[FlagSetting]:
    """Flags for the fused path (explain.engine.fused): every config on "sdpa", the kernel whose
    q, k, v and output the fused sites read, and gradient checkpointing off."""
    return [
        FlagSetting(flag.owner, flag.name, "sdpa") if flag.value == "eager" else flag
        for flag in eager_attention_flags(model)
    ]


def split_heads(head_size: int, projected: Tensor) -> Tensor:
    """(B, N, H * d) -> (B, H, N, d), as transformers' attention modules split their
    projections (and merge the kernel's output back)."""
    batch, tokens, _ = projected.shape
    return projected.view(batch, tokens, -1, head_size).transpose(1, 2)


def attention_spec(model: nn.Module) -> tuple[type, type, int, str | None]:
    """(block class, attention class, index of the probabilities in the attention module's
    output tuple, required name of the attention module or None) from the model's
    `_can_record_outputs`."""
    block = (getattr(type(model), "_can_record_outputs", None) or {}).get("hidden_states")
    attention = recorded_output(model, "attentions")
    if not isinstance(block, type) or attention is None:
        raise UnsupportedModelError(
            f"{type(model).__name__} does not name its blocks and attention modules "
            "(_can_record_outputs); it is not a supported transformers model"
        )
    return (block, *attention)


def probabilities_at(index: int) -> Callable[[Any], Tensor]:
    """`AttentionSite.probabilities` of an eager attention module that returns its
    probabilities at `index` of its output tuple."""

    def probabilities(output: Any) -> Tensor:
        weights = output[index] if isinstance(output, tuple) else None
        if weights is None:
            raise ExplainError(
                "the attention module returned no attention probabilities: the eager path "
                "did not run (is the model's attention implementation overridden in code?)"
            )
        return weights

    return probabilities


def num_prefix_tokens(model: nn.Module) -> int:
    """Tokens before the patches of a Hugging Face ViT (class token) or DeiT (class and
    distillation tokens), for the model itself or any of its DeiT modules."""
    return 2 if is_transformers_class(model, "deit", ("DeiTPreTrainedModel",)) else 1


class HFAdapter(Adapter):
    """Base of the transformers families: blocks, attention sites and the eager path.

    Subclasses say which models they take (`matches`) and how inputs are prepared and read
    out. The blocks are the model's `_can_record_outputs` block modules in forward order; a
    family whose blocks run in another order, or more than once (ALBERT's shared layer),
    overrides `find_blocks`.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        block, attention, index, name = attention_spec(model)
        self._block_class = block
        self._attention = (attention, index, name)
        self._probabilities = probabilities_at(index)
        self._blocks = self.find_blocks()
        if not self._blocks:
            raise UnsupportedModelError(f"{type(model).__name__} has no attention blocks")
        self._attention_modules = [self._attention_in(i, b) for i, b in enumerate(self._blocks)]

    def find_blocks(self) -> list[nn.Module]:
        """The blocks in the order they run: modules of the block class, in module order."""
        return [m for m in self.model.modules() if isinstance(m, self._block_class)]

    def _attention_in(self, layer: int, block: nn.Module) -> nn.Module:
        module = attention_in(block, self._attention)
        if module is None:
            raise UnsupportedModelError(
                f"block {layer} ({type(block).__name__}) has no {self._attention[0].__name__}"
            )
        return module

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self._blocks

    def attention_sites(self) -> Sequence[AttentionSite]:
        return [
            AttentionSite(layer=layer, module=module, probabilities=self._probabilities)
            for layer, module in enumerate(self._attention_modules)
        ]

    def path_flags(self) -> Sequence[FlagSetting]:
        return eager_attention_flags(self.model)

    # -- text --------------------------------------------------------------------------------

    def attnlrp_sites(self) -> AttnLrpSites:
        """Where AttnLRP and CP-LRP attach in a transformers model with one token sequence
        (BERT family, GPT-2, decoder-only language models): every block's rules found
        as `attnlrp_sites_of` finds them; relevance at `get_input_embeddings()`'s output
        (scaled embeddings included, as in Gemma)."""
        embedding = self.model.get_input_embeddings()
        return attnlrp_sites_of(
            self.model,
            [site.module for site in self.attention_sites()],
            embedding=embedding,
            embedding_axis=1 if isinstance(embedding, nn.Conv2d) else -1,
            tanh_inputs=_functional_tanh_heads(self.model),
        )


def attnlrp_sites_of(model: nn.Module, attention: Sequence[nn.Module], **read: Any) -> AttnLrpSites:
    """Where AttnLRP and CP-LRP attach in a transformers `model` whose blocks' attention
    modules are `attention` (in block order; one shared by several blocks counts once, as
    ALBERT's): each has its projections as children, found by name (query/key/value in
    BERT, RoBERTa, ALBERT, ELECTRA; q_lin/k_lin/v_lin in DistilBERT; q_proj/k_proj/v_proj
    in Llama, Qwen, Gemma, CLIP, SigLIP, ...; or a fused c_attn in GPT-2, qkv_proj in
    Phi-3, query_key_value per head in GPT-NeoX, qkv in Qwen2-VL's tower); gated MLPs
    anywhere in `model` have gate_proj, up_proj, act_fn, or Phi-3's gate_up_proj. `read`
    says where the relevance is read (`AttnLrpSites`' embedding fields)."""
    queries_keys, values = [], []
    seen: set[int] = set()
    for layer, module in enumerate(attention):
        if id(module) in seen:  # ALBERT: one shared layer serves every block
            continue
        seen.add(id(module))
        found_queries_keys, found_values = _projections(layer, module)
        queries_keys += found_queries_keys
        values += found_values
    gates = []
    for module in model.modules():
        if all(hasattr(module, name) for name in ("gate_proj", "up_proj", "act_fn")):
            gates.append(Gate(module.act_fn, Projection(module.up_proj)))
        elif all(hasattr(module, name) for name in ("gate_up_proj", "activation_fn")):
            half = module.gate_up_proj.out_features // 2  # Phi-3: gate, then up
            gates.append(
                Gate(module.activation_fn, Projection(module.gate_up_proj, slice(half, None)))
            )
    # Gemma's RMSNorms (Gemma, Gemma 2, 3; PaliGemma's language model) scale by 1 + weight
    offset = [m for m in model.modules() if type(m).__name__.startswith("Gemma")]
    return AttnLrpSites(
        queries_keys=queries_keys,
        values=values,
        gates=gates,
        unit_offset_norms=[m for m in offset if type(m).__name__.endswith("RMSNorm")],
        **read,
    )


def _as_integer_tensor(name: str, value: object, *, flags: bool = False) -> Tensor:
    """`value` as a (B, T) integer tensor; `flags` also accepts 0/1 floats and booleans."""
    if isinstance(value, Tensor):
        tensor = value
    else:
        try:
            tensor = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            raise InputError(
                f"{name} must be a (B, T) tensor of integers; texts of different lengths must "
                "be padded: tokenizer(texts, padding=True, return_tensors='pt')"
            ) from None
    if flags and (tensor.is_floating_point() or tensor.dtype == torch.bool):
        if not ((tensor == 0) | (tensor == 1)).all():
            raise InputError(f"{name} must hold 0 (padding) and 1 (real token) only")
        tensor = tensor.long()
    if tensor.is_floating_point() or tensor.is_complex():
        raise InputError(f"{name} must hold integers, got {tensor.dtype}")
    if tensor.dim() == 1:
        raise InputError(
            f"{name} must be a batch (B, T), got one sequence of shape {tuple(tensor.shape)}; "
            "add a batch axis with .unsqueeze(0), or tokenize a list of texts"
        )
    if tensor.dim() != 2:
        raise InputError(f"{name} must have shape (B, T), got {tuple(tensor.shape)}")
    # int64 before any comparison: in uint8, a vocabulary size of 30522 would read as 58.
    return tensor.long()


def prepare_text(
    inputs: object,
    *,
    max_tokens: int,
    vocab_size: int,
    device: torch.device,
    token_types: bool,
    type_vocab_size: int = 1,
) -> dict[str, Tensor]:
    """Validate tokenized text and move it to `device`.

    `inputs` is a mapping (a tokenizer's BatchEncoding) with `input_ids` (B, T) and
    optionally `attention_mask` (B, T, ones at real tokens, default all ones) and
    `token_type_ids` (passed on only when the model takes them, `token_types`, and then
    each below `type_vocab_size`, the size of the model's segment table). Returns
    those tensors as the model's keyword arguments (attention_mask always present, long).
    """
    if is_raw_text(inputs):
        raise InputError(
            "got raw text: tokenize it first, tokenizer(texts, padding=True, "
            "return_tensors='pt'), or give the Explainer the tokenizer: "
            "Explainer(model, tokenizer=tokenizer)"
        )
    if isinstance(inputs, list | tuple) and not inputs:
        raise InputError("the batch is empty: pass at least one text")
    if not isinstance(inputs, Mapping) or "input_ids" not in inputs:
        raise InputError(
            "text models take a mapping with input_ids and attention_mask (a tokenizer's "
            f"output: tokenizer(texts, padding=True, return_tensors='pt')), got "
            f"{type(inputs).__name__}"
        )
    ids = _as_integer_tensor("input_ids", inputs["input_ids"])
    batch, length = ids.shape
    if batch == 0:
        raise InputError("the batch is empty: pass at least one text")
    if length == 0:
        raise InputError("the text is empty: there is no token to explain")
    mask = inputs.get("attention_mask")
    mask = (
        torch.ones_like(ids)
        if mask is None
        else _as_integer_tensor("attention_mask", mask, flags=True)
    )
    if mask.shape != ids.shape:
        raise InputError(
            f"attention_mask has shape {tuple(mask.shape)} but input_ids {tuple(ids.shape)}"
        )
    # Every check in one reduction: each read of a device tensor waits for the device.
    # Pads are looked up in the embedding too (then masked), so every position counts.
    outside = (ids < 0) | (ids >= vocab_size)
    wrong_mask, empty, unknown = torch.stack(
        [~((mask == 0) | (mask == 1)).all(), (mask.sum(dim=1) == 0).any(), outside.any()]
    ).tolist()
    if wrong_mask:
        raise InputError("attention_mask must hold 0 (padding) and 1 (real token) only")
    if empty:
        first = int((mask.sum(dim=1) == 0).nonzero()[0, 0])
        raise InputError(f"text {first} of the batch is empty (no real token in its mask)")
    if length > max_tokens:
        longest = int(mask.sum(dim=1).max())
        raise InputError(
            f"the text is too long: {longest} tokens (padded to {length}), but this model "
            f"takes at most {max_tokens}; shorten it or tokenize with truncation=True, "
            f"max_length={max_tokens}"
        )
    if unknown:
        text, position = (int(i) for i in outside.nonzero()[0])
        where = "padding position" if mask[text, position] == 0 else "position"
        raise InputError(
            f"token id {int(ids[text, position])} at {where} {position} of text {text} is "
            f"outside the model's vocabulary (0..{vocab_size - 1}); was the text tokenized "
            "with this model's tokenizer (pads: its pad_token_id)?"
        )
    arguments = {"input_ids": ids.long().to(device), "attention_mask": mask.long().to(device)}
    types = inputs.get("token_type_ids")
    if types is not None:
        types = _as_integer_tensor("token_type_ids", types)
        if types.shape != ids.shape:
            raise InputError(
                f"token_type_ids has shape {tuple(types.shape)} but input_ids {tuple(ids.shape)}"
            )
        if not token_types:
            if types.any():
                raise InputError("this model takes no token_type_ids (segments); drop them")
        else:
            outside = (types < 0) | (types >= type_vocab_size)  # pads are looked up too
            if outside.any():
                bad = int(types[outside][0])
                raise InputError(
                    f"token type id {bad} is outside the model's segments "
                    f"(0..{type_vocab_size - 1}); was the text tokenized with this model's "
                    "tokenizer?"
                )
            arguments["token_type_ids"] = types.long().to(device)
    return arguments


def text_layout(mask: Tensor) -> TokenLayout:
    """The TokenLayout of a text batch (`TokenLayout.text`): pads marked False."""
    return TokenLayout.text(mask)


def positions_from_mask(mask: Tensor) -> Tensor:
    """Position ids that count real tokens only, so that a left-padded text gets the same
    positions as alone (what generation does); pads get position 0 or their neighbour's."""
    return (mask.long().cumsum(dim=1) - 1).clamp(min=0)


def last_real_token(mask: Tensor) -> Tensor:
    """(B,) index of each row's last real token, for left and right padding alike."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, -1).amax(dim=1)


def mask_padding(token_relevance: Tensor, mask: Tensor) -> Tensor:
    """(B, ..., T) relevance with every padding position set to exactly 0
    (`TokenLayout.unpadded`)."""
    return TokenLayout.text(mask).unpadded(token_relevance)


def sliced_logits(
    model: nn.Module, arguments: Mapping[str, Any], positions: slice, *, keeps_logits: bool
) -> Tensor:
    """The (B, P, vocab) logits at a slice of positions of every sample: the head runs from
    the slice's start on where the model takes `logits_to_keep` (the last that many
    positions: a slice of its own, not an index)."""
    length = arguments["attention_mask"].shape[1]
    start, stop, step = positions.indices(length)
    if not keeps_logits:
        return model(**arguments, use_cache=False).logits[:, start:stop:step]
    logits = model(**arguments, use_cache=False, logits_to_keep=length - start).logits
    return logits[:, : stop - start : step]


# -- where AttnLRP and CP-LRP attach ------------------------------------------------------

_SEPARATE_PROJECTIONS = (
    ("query", "key", "value"),
    ("q_lin", "k_lin", "v_lin"),
    ("q_proj", "k_proj", "v_proj"),
)


def _projections(layer: int, attention: nn.Module) -> tuple[list[Projection], list[Projection]]:
    """(the projections of q and k, those of v) in one attention module."""
    for names in _SEPARATE_PROJECTIONS:
        modules = [getattr(attention, name, None) for name in names]
        if all(isinstance(module, nn.Module) for module in modules):
            return [Projection(modules[0]), Projection(modules[1])], [Projection(modules[2])]
    fused = getattr(attention, "c_attn", None)  # GPT-2: q, k, v side by side
    if isinstance(fused, nn.Module) and hasattr(attention, "split_size"):
        width = attention.split_size
        return [Projection(fused, slice(0, 2 * width))], [Projection(fused, slice(2 * width, None))]
    fused = getattr(attention, "qkv_proj", None)  # Phi-3: q, then k and v of the kv heads
    if isinstance(fused, nn.Module) and hasattr(attention, "num_key_value_heads"):
        queries = attention.config.num_attention_heads * attention.head_dim
        keys = attention.num_key_value_heads * attention.head_dim
        return [Projection(fused, slice(0, queries + keys))], [
            Projection(fused, slice(queries + keys, None))
        ]
    fused = getattr(attention, "qkv", None)  # Qwen2-VL's tower: q, k, v side by side
    outputs = getattr(base_layer(fused), "out_features", None) if fused is not None else None
    if isinstance(outputs, int) and outputs % 3 == 0:  # (also under a LoRA layer)
        width = outputs // 3
        return [Projection(fused, slice(0, 2 * width))], [Projection(fused, slice(2 * width, None))]
    fused = getattr(attention, "query_key_value", None)  # GPT-NeoX: q, k, v per head
    if isinstance(fused, nn.Module) and hasattr(attention, "head_size"):
        size = attention.head_size
        starts = range(0, fused.out_features, 3 * size)
        return [Projection(fused, slice(s, s + 2 * size)) for s in starts], [
            Projection(fused, slice(s + 2 * size, s + 3 * size)) for s in starts
        ]
    raise UnsupportedModelError(
        f"block {layer}: attnlrp/cp_lrp found no query, key and value projections in "
        f"{type(attention).__name__}"
    )


def _functional_tanh_heads(model: nn.Module) -> list[nn.Module]:
    """Classification heads that call torch.tanh on their dense layer's output (RoBERTa and
    XLM-R's `...ClassificationHead`): that dense layer."""
    return [
        module.dense
        for module in model.modules()
        if type(module).__name__ in ("RobertaClassificationHead", "XLMRobertaClassificationHead")
    ]
