"""scripts/probe_twohop.py's attention patching: unpatched it gives the model's own
log-probabilities; patching a prompt's own weights back changes nothing; patching another
prompt's weights into every block gives what a hand computation with those weights gives
(the values and MLPs of the prompt, the weights of the other); the model's attention
implementation is restored afterwards; a replaced fact is the filler word at its positions."""

from __future__ import annotations

import pytest
import torch
from script_modules import script_module

from explain.data import recall
from explain.testing.tiny_lm import tiny_causal_lm

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def probe_twohop():
    """scripts/probe_twohop.py as a module."""
    with script_module("probe_twohop") as module:
        yield module


IDS, OTHER, ANSWER = [1, 9, 10, 11, 12, 13, 14], [1, 20, 21, 22, 23, 24, 14], [40, 41]


def test_unpatched_and_self_patched_runs_are_the_models_own(probe_twohop):
    model = tiny_causal_lm("llama").double()
    own = probe_twohop.log_probability(model, IDS, ANSWER)
    before = model.config._attn_implementation
    with probe_twohop.patchable(model) as patch:
        assert probe_twohop.log_probability(model, IDS, ANSWER) == pytest.approx(own, abs=1e-9)
        found = probe_twohop.probe(model, patch, IDS, ANSWER, IDS)
    assert model.config._attn_implementation == before
    assert found.clean == pytest.approx(own, abs=1e-9)
    assert found.removed == pytest.approx(own, abs=1e-9)
    assert all(value == pytest.approx(own, abs=1e-9) for value in found.patched)
    assert found.swapped == pytest.approx(own, abs=1e-9)
    assert len(found.patched) == model.config.num_hidden_layers + 1


def test_another_prompts_weights_in_every_block_match_a_hand_computation(probe_twohop):
    model = tiny_causal_lm("llama", num_hidden_layers=1).double()
    with probe_twohop.patchable(model) as patch:
        found = probe_twohop.probe(model, patch, OTHER, ANSWER, IDS)
        weights = patch.stored[0]  # the last run recorded IDS's weights ...
        patch.mode = "record"
        probe_twohop.log_probability(model, OTHER, ANSWER)
        other_weights = patch.stored[0]  # ... and this one OTHER's
        patch.mode = "plain"
    # By hand: IDS's values (one block) with OTHER's weights, then o_proj, MLP, head.
    sequence = torch.tensor([IDS + ANSWER])
    block = model.model.layers[0]
    attention = block.self_attn
    with torch.no_grad():
        hidden = model.model.embed_tokens(sequence)
        normed = block.input_layernorm(hidden)
        head = attention.head_dim
        value = attention.v_proj(normed).view(1, -1, attention.config.num_key_value_heads, head)
        value = value.transpose(1, 2).repeat_interleave(attention.num_key_value_groups, dim=1)
        mixed = (other_weights @ value).transpose(1, 2).reshape(1, sequence.shape[1], -1)
        hidden = hidden + attention.o_proj(mixed)
        hidden = hidden + block.mlp(block.post_attention_layernorm(hidden))
        logits = model.lm_head(model.model.norm(hidden))[0].log_softmax(dim=-1)
    at = torch.arange(len(IDS) - 1, len(IDS) + len(ANSWER) - 1)
    expected = float(logits[at, torch.tensor(ANSWER)].sum())
    assert found.patched[-1] == pytest.approx(expected, abs=1e-9)
    assert not torch.equal(weights, other_weights)


def test_a_replaced_fact_is_the_filler_word_at_its_positions(probe_twohop):
    (example,) = recall.examples("heldout", 1, 128, hops=2)
    bridge = example.facts[example.asked[0]]
    ids = probe_twohop.replaced(example, bridge)
    filler = recall.VOCABULARY.index(recall.REPLACEMENT)
    for position, (old, new) in enumerate(zip(example.input_ids, ids, strict=True)):
        assert new == (filler if position in bridge.positions else old)
