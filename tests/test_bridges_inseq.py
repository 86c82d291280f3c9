"""GenerationExplanation.to_inseq: inseq's FeatureAttributionOutput of every continuation,
every value and token of the explanation kept, read by inseq's show, aggregate and JSON
save / load. inseq is not in the dev extra (it pins typeguard 2.13, transformer-lens needs
typeguard 4): `make test`'s setup installs it without its dependencies, as pyproject.toml
says, so these tests run there."""

from __future__ import annotations

import functools

import pytest
import torch

from explain import Explainer
from explain.generation import explain_generation
from explain.testing import tiny_lm

inseq = pytest.importorskip(
    "inseq", reason="the inseq bridge needs inseq (make test installs it: see the module doc)"
)

PROMPTS = ["user w10 w11 w12 w13", "user w20"]  # the second is left-padded


@functools.cache
def _explained():
    tokenizer = tiny_lm.tiny_tokenizer()
    explainer = Explainer(tiny_lm.tiny_causal_lm("llama"), tokenizer=tokenizer)
    return explain_generation(explainer, PROMPTS, max_new_tokens=3, method="attnlrp")


@pytest.mark.parametrize("sample", [0, 1])
def test_every_value_and_token_of_the_explanation_is_kept(sample):
    explained = _explained()
    output = explained.to_inseq()
    assert isinstance(output, inseq.FeatureAttributionOutput)
    assert len(output) == len(PROMPTS)
    sequence = output[sample]
    answer = explained.answer(sample)
    assert [t.token for t in sequence.target] == answer.tokens
    assert [t.token for t in sequence.source] == answer.tokens[: answer.prompt_length]
    assert [t.id for t in sequence.target][answer.prompt_length :] == answer.ids
    assert sequence.attr_pos_start == answer.prompt_length
    relevance = explained.explanation.relevance[sample]
    width = explained.generation.prompt_length
    first = width - answer.prompt_length
    ids = explained.generation.input_ids[sample, first : first + len(answer.tokens)]
    assert [t.id for t in sequence.target] == ids.tolist()
    scores = sequence.target_attributions.T  # (G, len(tokens))
    read = (
        torch.arange(scores.shape[1])[None, :]
        < answer.prompt_length + torch.arange(scores.shape[0])[:, None]
    )
    assert torch.isnan(scores[~read]).all() and not torch.isnan(scores[read]).any()
    rebuilt = torch.zeros_like(relevance)
    rebuilt[: len(answer.ids), first : first + len(answer.tokens)] = scores.nan_to_num(0.0)
    assert torch.equal(rebuilt, relevance)
    probabilities = explained.explanation.logits[sample].double().softmax(-1)
    expected = torch.tensor([probabilities[g, i] for g, i in enumerate(answer.ids)])
    torch.testing.assert_close(
        sequence.step_scores["probability"].double(), expected, rtol=1e-6, atol=0
    )
    assert output.info["attribution_method"] == "attnlrp"


def test_inseq_shows_aggregates_and_round_trips_it_through_json(tmp_path):
    output = _explained().to_inseq()
    html = output.show(display=False, return_html=True)
    assert "w20" in html and "w13" in html
    aggregated = output.aggregate()
    assert aggregated[0].target_attributions.shape == output[0].target_attributions.shape
    path = tmp_path / "generation.json"
    output.save(path)
    loaded = inseq.FeatureAttributionOutput.load(path)
    for saved, read in zip(output, loaded, strict=True):
        assert [t.token for t in read.target] == [t.token for t in saved.target]
        assert [t.id for t in read.target] == [t.id for t in saved.target]
        assert torch.equal(
            read.target_attributions.nan_to_num(7.0), saved.target_attributions.nan_to_num(7.0)
        )
    assert loaded.info == output.info
