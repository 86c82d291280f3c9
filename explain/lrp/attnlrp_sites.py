"""Where AttnLRP and CP-LRP attach in each model family (explain.lrp.attnlrp's RuleSites).

Normalisations and activation modules are found by type; what this file names is what
types cannot tell: the module whose output is the explained input (word or patch
embeddings), the projections that produce q, k and v, and the gated units.

- timm ViT and Eva: q and k leave `q_norm` and `k_norm`, A v enters `norm` (modules of
  every timm Attention); relevance at the patch-embedding output; Mlp (act), SwiGLU (act
  gates fc1_x) and GluMlp (act of fc1's second half gates its first half). Beit uses its
  qkv weight in F.linear and has no q_norm: refused.
- Hugging Face (BERT family, GPT-2, decoder-only LMs): the attention module of every
  block has its projections as children, found by name: query/key/value (BERT, RoBERTa,
  ALBERT, ELECTRA), q_lin/k_lin/v_lin (DistilBERT), q_proj/k_proj/v_proj (Llama, Qwen,
  Gemma, ...), or a fused c_attn (GPT-2), qkv_proj (Phi-3) or query_key_value (GPT-NeoX,
  per head); gated MLPs have gate_proj, up_proj, act_fn, or Phi-3's gate_up_proj;
  relevance at `get_input_embeddings()`'s output (scaled embeddings included, as in Gemma).
"""

from __future__ import annotations

from torch import nn

from explain.architectures.base import Adapter
from explain.errors import UnsupportedModelError
from explain.lrp.attnlrp import Gate, Projection, RuleSites

__all__ = ["hf_sites", "rule_sites", "timm_sites"]

_TIMM_ATTENTION = ("q_norm", "k_norm", "norm")
_SEPARATE_PROJECTIONS = (
    ("query", "key", "value"),
    ("q_lin", "k_lin", "v_lin"),
    ("q_proj", "k_proj", "v_proj"),
)


def rule_sites(adapter: Adapter) -> RuleSites:
    """The RuleSites of `adapter`'s model, from the function its family declares
    (`Adapter.rule_sites`), or UnsupportedModelError."""
    if adapter.rule_sites is None:
        raise UnsupportedModelError(
            f"attnlrp and cp_lrp have no rules for {adapter.family} (use 'generic')"
        )
    return adapter.rule_sites.load()(adapter)


def timm_sites(adapter: Adapter) -> RuleSites:
    """timm's VisionTransformer and Eva (TimmVisionTransformer, TimmEva): q and k are the
    outputs of `q_norm` and `k_norm`, A v enters `norm` (all modules of every timm
    Attention, identities unless configured), so the rules hold however q, k and v are
    projected (a fused qkv, Eva's separate projections or its F.linear with q and v
    biases)."""
    queries_keys, outputs, gates = [], [], []
    for index, block in enumerate(adapter.blocks):
        attn = block.attn
        if not all(isinstance(getattr(attn, n, None), nn.Module) for n in _TIMM_ATTENTION):
            raise UnsupportedModelError(
                f"block {index}: attnlrp/cp_lrp need timm attention with q_norm, k_norm and "
                f"norm modules, found {type(attn).__name__}"
            )
        queries_keys += [Projection(attn.q_norm), Projection(attn.k_norm)]
        outputs.append(Projection(attn.norm))
        gates += _timm_gates(index, block.mlp)
    return RuleSites(
        embedding=adapter.model.patch_embed,
        queries_keys=queries_keys,
        attention_outputs=outputs,
        gates=gates,
    )


def _timm_gates(index: int, mlp: nn.Module) -> list[Gate]:
    kind = type(mlp).__name__
    if kind == "Mlp":
        return []  # act is an ordinary element-wise activation
    if kind == "SwiGLU":
        return [Gate(mlp.act, Projection(mlp.fc1_x))]
    if kind == "GluMlp":
        half = mlp.fc1.out_features // 2
        return [Gate(mlp.act, Projection(mlp.fc1, slice(0, half)))]
    raise UnsupportedModelError(
        f"block {index}: attnlrp/cp_lrp know timm's Mlp, SwiGLU and GluMlp, not {kind}"
    )


def hf_sites(adapter: Adapter) -> RuleSites:
    """Hugging Face transformers (HuggingFaceAdapter) with one token sequence."""
    queries_keys, values = [], []
    seen: set[int] = set()
    for site in adapter.attention_sites():
        attention = site.module
        if id(attention) in seen:  # ALBERT: one shared layer serves every block
            continue
        seen.add(id(attention))
        found_queries_keys, found_values = _projections(site.layer, attention)
        queries_keys += found_queries_keys
        values += found_values
    gates = []
    for module in adapter.model.modules():
        if all(hasattr(module, name) for name in ("gate_proj", "up_proj", "act_fn")):
            gates.append(Gate(module.act_fn, Projection(module.up_proj)))
        elif all(hasattr(module, name) for name in ("gate_up_proj", "activation_fn")):
            half = module.gate_up_proj.out_features // 2  # Phi-3: gate, then up
            gates.append(
                Gate(module.activation_fn, Projection(module.gate_up_proj, slice(half, None)))
            )
    embedding = adapter.model.get_input_embeddings()
    return RuleSites(
        embedding=embedding,
        embedding_axis=1 if isinstance(embedding, nn.Conv2d) else -1,
        queries_keys=queries_keys,
        values=values,
        gates=gates,
        tanh_inputs=_functional_tanh_heads(adapter.model),
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
