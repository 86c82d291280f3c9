"""Models with two token sets: generating an encoder-decoder's target sequence, and the
former entry points of their explanations.

Dual encoders (CLIP) and encoder-decoders are explained by the engine like every model
(explain.engine; their plans are in explain.engine.plans): call `Explainer.explain`.
`explain_token_sets`, `explain_dual_encoder` and `explain_encoder_decoder` still work and
say so with a DeprecationWarning.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from explain import engine
from explain.architectures.base import Adapter, TokenSets
from explain.engine import Position, Request, StartLayer
from explain.engine.session import Session
from explain.errors import OptionError
from explain.explanation import Explanation
from explain.targets import Score, Target

__all__ = [
    "Position",
    "explain_dual_encoder",
    "explain_encoder_decoder",
    "explain_token_sets",
    "generate_target",
]


class _HasAdapter(Protocol):
    """An Explainer, as far as these functions use it."""

    adapter: Adapter
    tokenizer: Any
    attention_path: Any


def _deprecated(name: str) -> None:
    warnings.warn(
        f"explain.token_sets.{name} is deprecated: call Explainer(model).explain(...), which "
        "explains every kind of model through the engine",
        DeprecationWarning,
        stacklevel=3,
    )


def explain_token_sets(
    explainer: _HasAdapter,
    inputs: Any,
    target: Target,
    method: str,
    score: Score,
    start_layer: StartLayer,
    options: dict[str, Any],
) -> Explanation:
    """Deprecated: `explainer.explain(inputs, target, method, score, start_layer, **options)`."""
    _deprecated("explain_token_sets")
    request = Request(method, target, score, start_layer, options, explainer.attention_path)
    return engine.explain(explainer.adapter, inputs, request, explainer.tokenizer)


def explain_dual_encoder(
    adapter: Adapter,
    inputs: Any,
    target: Target,
    method: str,
    score: Score,
    start_layer: int | Mapping[str, int] | None,
    options: dict[str, Any],
    tokenizer: Any = None,
) -> Explanation:
    """Deprecated: `Explainer(model).explain(...)` on a dual encoder."""
    _deprecated("explain_dual_encoder")
    request = Request(method, target, score, start_layer, options, "explicit")
    return engine.explain(adapter, inputs, request, tokenizer)


def explain_encoder_decoder(
    adapter: Adapter,
    inputs: Any,
    target: Target,
    method: str,
    score: Score,
    start_layer: int | Mapping[str, int] | None,
    options: dict[str, Any],
    tokenizer: Any = None,
) -> Explanation:
    """Deprecated: `Explainer(model).explain(...)` on an encoder-decoder."""
    _deprecated("explain_encoder_decoder")
    request = Request(method, target, score, start_layer, options, "explicit")
    return engine.explain(adapter, inputs, request, tokenizer)


def generate_target(
    explainer: _HasAdapter, inputs: Any, max_new_tokens: int = 20
) -> dict[str, Any]:
    """`inputs` with the decoder sequence the model generates for them (greedy): adds
    decoder_input_ids and decoder_attention_mask (real up to the first end token).

    Generation runs inside a recorder that computes nothing: the model is in eval mode,
    the RNG is forked and everything is restored afterwards, as for an explanation.
    """
    adapter = explainer.adapter
    if adapter.token_sets != TokenSets.ENCODER_DECODER:
        raise OptionError(f"{adapter.family}: generate_target is for encoder-decoder models")
    source = {k: v for k, v in dict(inputs).items() if not k.startswith("decoder_")}
    model = adapter.model
    with Session(adapter):
        sequences = model.generate(**source, max_new_tokens=max_new_tokens, do_sample=False)
    eos = model.generation_config.eos_token_id
    eos_ids = torch.as_tensor([] if eos is None else eos, device=sequences.device).flatten()
    is_end = torch.isin(sequences, eos_ids)
    is_end[:, 0] = False  # the start token may share the end token's id (Marian, GPT-2)
    after_end = (is_end.long().cumsum(dim=1) - is_end.long()) > 0
    return {
        **inputs,
        "decoder_input_ids": sequences,
        "decoder_attention_mask": (~after_end).long(),
    }
