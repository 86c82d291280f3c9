"""A generation's explanation as captum's `LLMAttributionResult`, which captum's
`LLMAttribution` and `LLMGradientAttribution` return and its plots read.

captum's result holds one continuation: `token_attr[g, n]` the attribution of input token
n for output token g, `seq_attr` that of the whole output (for its gradient methods the
sum over the output tokens, as here), `output_probs` each output token's probability.
captum's input tokens are the prompt's; ours are the prompt's and the generated ones, each
read by the tokens generated after it, so that nothing of the explanation is dropped.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from explain.bridges import require

__all__ = ["llm_attribution_result"]


def llm_attribution_result(
    input_tokens: list[str], output_tokens: list[str], token_attr: Tensor, output_probs: Tensor
) -> Any:
    """captum's `LLMAttributionResult` of `token_attr` (len(output_tokens),
    len(input_tokens)), its values kept as they are (detached, on the CPU)."""
    llm_attr = require("captum.attr", "captum")
    token_attr = token_attr.detach().cpu()
    return llm_attr.LLMAttributionResult(
        input_tokens=list(input_tokens),
        output_tokens=list(output_tokens),
        seq_attr=token_attr.sum(0),
        token_attr=token_attr,
        output_probs=output_probs.detach().cpu(),
    )
