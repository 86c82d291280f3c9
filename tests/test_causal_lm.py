"""Decoder-only language models of every covered family (tiny_lm) equal the reference.

The explained batch is left-padded (as generation pads) and, for a few families, right-
padded; the reference runs each text alone, unpadded, through a copy of the model on its
own eager path with output_attentions=True and one autograd backward (reference_hf), and
multiplies the full N x N matrices as docs/methods.md writes them. Padding positions must be
exactly 0 and must not change any other token's relevance.
"""

from __future__ import annotations

import functools

import pytest
import reference_hf as ref
import torch
from tolerances import FLOAT32, assert_float32_close

from explain import Explainer, OptionError
from explain.architectures.hf_causal_lm import HFCausalLM, is_decoder_only_lm
from explain.testing import ModelState, tiny_lm

METHODS = ["raw_attention", "rollout", "generic", "attention_gradcam"]
TEXTS = [[4, 14, 7, 33, 9, 21, 30], [4, 41, 30], [4, 5, 17, 28, 30]]
TARGETS = [1, 0, 2]
FAMILIES = sorted(tiny_lm.FAMILIES)


@functools.cache
def _model(family: str):
    return tiny_lm.tiny_causal_lm(family)


@functools.cache
def _references(family: str) -> list[ref.Reference]:
    model = _model(family)
    return [
        ref.reference(model, {"input_ids": torch.tensor([text])}, "last", target, "logit")
        for text, target in zip(TEXTS, TARGETS, strict=True)
    ]


def _check(result, batch, references, method):
    assert result.relevance.shape == batch["input_ids"].shape
    for b, found in enumerate(references):
        real = ref.real_positions(batch["attention_mask"][b])
        kept = torch.ones(len(real), dtype=torch.bool)
        expected = ref.method(method, found, kept)
        torch.testing.assert_close(result.relevance[b, real], expected, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(result.logits[b], found.logits, rtol=1e-4, atol=1e-5)
        assert (result.relevance[b, ~batch["attention_mask"][b].bool()] == 0).all()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", FAMILIES)
def test_left_padded_batch_matches_each_text_alone(family, method):
    batch = ref.padded_batch(TEXTS, "left")
    explainer = Explainer(_model(family))
    assert isinstance(explainer.adapter, HFCausalLM)
    result = explainer.explain(batch, target=TARGETS, method=method)
    _check(result, batch, _references(family), method)


FUSED = [family for family in FAMILIES if family != "gemma2"]  # sdpa cannot soft-cap


@pytest.mark.parametrize("method", ["generic", "rollout"])
@pytest.mark.parametrize("family", FUSED)
def test_fused_path_matches_each_text_alone(family, method):
    """On sdpa, q, k and v seen through the attention interface (hf_attention_probe)."""
    model = _model(family)
    batch = ref.padded_batch(TEXTS, "left")
    explainer = Explainer(model, attention_path="fused")
    result = explainer.explain(batch, target=TARGETS, method=method)
    _check(result, batch, _references(family), method)
    assert model.config._attn_implementation == "sdpa"


def test_soft_capping_has_no_fused_path():
    with pytest.raises(OptionError, match="no fused path"):
        Explainer(_model("gemma2"), attention_path="fused").explain(ref.padded_batch(TEXTS, "left"))


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt_neox"])
def test_right_padding_too(family):
    batch = ref.padded_batch(TEXTS, "right")
    result = Explainer(_model(family)).explain(batch, target=TARGETS, method="generic")
    _check(result, batch, _references(family), "generic")


@pytest.mark.parametrize("family", ["qwen2", "gemma3", "phi3", "mixtral"])
def test_trace_matches_hugging_face_autograd(family):
    batch = ref.padded_batch(TEXTS, "left")
    trace = Explainer(_model(family)).trace(batch, target=TARGETS, score="logit")
    for b, found in enumerate(_references(family)):
        keep = ref.real_positions(batch["attention_mask"][b])
        grid = (slice(None), keep[:, None], keep[None, :])
        for layer, attention in enumerate(found.attentions):
            # float32, a padded batch against each text alone
            torch.testing.assert_close(trace.attentions[layer][b][grid], attention, **FLOAT32)
            scale = found.attention_grads[layer].abs().max().item()
            torch.testing.assert_close(
                trace.attention_grads[layer][b][grid],
                found.attention_grads[layer],
                rtol=1e-4,
                atol=1e-4 * scale,
            )


@pytest.mark.parametrize("family", ["mistral", "gemma2", "qwen2"])
def test_the_sliding_window_masks_in_the_explained_maps(family):
    """The tiny configurations do exercise their windows: some block's map is exactly 0
    beyond the window, while a full-attention map reaches further back."""
    batch = ref.padded_batch(TEXTS[:1], "left")
    trace = Explainer(_model(family)).trace(batch, target=TARGETS[:1])
    distance = torch.arange(7)[:, None] - torch.arange(7)[None, :]
    beyond = distance >= tiny_lm.WINDOW
    windowed = [bool((a[0][:, beyond] == 0).all()) for a in trace.attentions]
    assert any(windowed)
    if family != "mistral":  # Gemma 2 and Qwen2 alternate full and windowed blocks
        assert not all(windowed)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_nothing_changes_and_the_attention_path_is_restored(family):
    model = _model(family)
    before = ModelState.capture(model)
    implementation = model.config._attn_implementation
    explainer = Explainer(model)
    batch = ref.padded_batch(TEXTS, "left")
    explainer.explain(batch, target=TARGETS)
    explainer.explain(batch, method="rollout")
    explainer.trace(batch)
    if family == "llama":
        Explainer(model, attention_path="fused").explain(batch, target=[[0, 1]] * 3)
    assert before.differences(ModelState.capture(model)) == []
    assert model.config._attn_implementation == implementation


def test_default_target_is_the_predicted_next_token():
    batch = ref.padded_batch(TEXTS, "left")
    result = Explainer(_model("qwen3")).explain(batch)
    assert result.target.tolist() == [int(f.logits.argmax()) for f in _references("qwen3")]


def test_encoder_stacks_run_as_decoders_are_not_taken():
    """RobertaForCausalLM counts positions from its padding index: not this adapter's."""
    import transformers as tf

    config = tf.RobertaConfig(
        vocab_size=30,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=20,
        is_decoder=True,
    )
    assert not is_decoder_only_lm(tf.RobertaForCausalLM(config))
    assert is_decoder_only_lm(_model("llama"))


def test_the_tested_families_are_listed():
    """`explain models` (the adapter's family line) and the README's "Supported models"
    name every family these tests cover, by display name and by class."""
    from pathlib import Path

    readme = Path(__file__).parents[1].joinpath("README.md").read_text()
    supported = readme.split("## Supported models", 1)[1].split("\n## ", 1)[0]
    names = ["Llama", "Granite", "Mistral", "Mixtral", "Qwen2", "Qwen3", "Gemma 2", "Gemma 3"]
    for name in [*names, "Phi-3", "OLMo 2", "GPT-NeoX", "GPT-2"]:
        assert name in HFCausalLM.family and name in supported
    for class_name in tiny_lm.FAMILIES.values():
        assert f"`{class_name}`" in supported


@pytest.mark.parametrize("family", FAMILIES)
def test_right_padded_logits_equal_each_text_alone(family):
    # The cite check's forwards: right-padded rows run without an attention mask (the
    # model's own causal and sliding-window mask), positions 0..W-1 in every row; each
    # real token's logits are those of its text alone, unpadded (window 3 < the texts).
    # float64 but for Mixtral, whose experts' grouped matmul takes no float64: there the
    # padded batch and each text alone sum in different orders, and a logit near 0 (3e-6
    # apart on CI, of logits up to 5) is held to float32's share of the largest logit
    model = tiny_lm.tiny_causal_lm(family)
    model = model if family == "mixtral" else model.double()
    adapter = HFCausalLM(model)
    assert adapter.causal_without_mask
    width = max(map(len, TEXTS))
    ids = torch.tensor([text + [0] * (width - len(text)) for text in TEXTS])
    lengths = torch.tensor([len(text) for text in TEXTS])
    positions = torch.stack([torch.tensor([0, n // 2, n - 1]) for n in lengths.tolist()])
    with torch.no_grad():
        padded = adapter.right_padded_logits_at(ids, lengths, positions)
        for row, text in enumerate(TEXTS):
            alone = model(input_ids=torch.tensor([text])).logits[0]
            if family == "mixtral":
                assert_float32_close(padded[row], alone[positions[row]])
            else:
                torch.testing.assert_close(
                    padded[row], alone[positions[row]], rtol=1e-10, atol=1e-10
                )
