"""GenerationExplanation.to_captum: captum's LLMAttributionResult of a continuation, every
value and token of the explanation kept, readable by captum's own plots."""

from __future__ import annotations

import functools

import matplotlib
import pytest
import torch

from explain import Explainer
from explain.generation import explain_generation
from explain.testing import tiny_lm

captum_attr = pytest.importorskip("captum.attr", reason="the captum bridge needs the captum extra")

matplotlib.use("Agg")

PROMPTS = ["user w10 w11 w12 w13", "user w20"]  # the second is left-padded


@functools.cache
def _explained():
    tokenizer = tiny_lm.tiny_tokenizer()
    explainer = Explainer(tiny_lm.tiny_causal_lm("llama"), tokenizer=tokenizer)
    return explain_generation(explainer, PROMPTS, max_new_tokens=3)


@pytest.mark.parametrize("sample", [0, 1])
def test_the_result_holds_every_value_and_token_of_the_explanation(sample):
    explained = _explained()
    result = explained.to_captum(sample)
    assert isinstance(result, captum_attr.LLMAttributionResult)
    answer = explained.answer(sample)
    assert result.input_tokens == answer.tokens
    assert result.output_tokens == answer.generated
    # Lossless: the captum matrix, put back where its tokens stand in the padded batch,
    # is the explanation's whole (G, T) map (pads and rows past the end are exact zeros).
    relevance = explained.explanation.relevance[sample]
    width = explained.generation.prompt_length
    first = width - answer.prompt_length
    rebuilt = torch.zeros_like(relevance)
    rebuilt[: len(answer.ids), first : first + len(answer.tokens)] = result.token_attr
    assert torch.equal(rebuilt, relevance)
    tokens = explained.explanation.tokens[sample]
    assert result.input_tokens == tokens[first : first + len(result.input_tokens)]
    assert torch.equal(result.seq_attr, result.token_attr.sum(0))


def test_output_probs_are_the_generated_tokens_probabilities():
    explained = _explained()
    result = explained.to_captum(0)
    logits = explained.explanation.logits[0]
    ids = explained.answer(0).ids
    expected = torch.tensor([logits[g].double().softmax(-1)[i] for g, i in enumerate(ids)])
    torch.testing.assert_close(result.output_probs.double(), expected, rtol=1e-6, atol=0)


def test_captum_plots_read_it():
    import matplotlib.pyplot as plt

    result = _explained().to_captum(1)
    figure, axes = result.plot_token_attr(show=False)
    assert [label.get_text() for label in axes.get_yticklabels()] == result.output_tokens
    assert len(axes.get_xticklabels()) == len(result.input_tokens)
    plt.close(figure)
    figure, axes = result.plot_seq_attr(show=False)
    assert len(axes.get_xticklabels()) == len(result.input_tokens)
    plt.close(figure)
