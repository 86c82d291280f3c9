"""AttnLRP and CP-LRP: equal to hand-written re-derivations of the rules (reference_attnlrp),
conservative where the theory says so, and keeping every promise (batch equals single,
pads exactly 0, no side effects, nothing left on the model or the process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import reference_attnlrp as ref
import torch
from conftest import VIT_CONFIGS
from reference_hf import IMAGE_SIZE, padded_batch, tiny_image_model, tiny_text_model

from explain import METHODS, Explainer, ExplainError
from explain.rules import Need
from explain.testing import ModelState, tiny_vit

VARIANTS = ["attnlrp", "cp_lrp"]
TEXTS = [[2, 17, 5, 33, 8, 41, 3], [2, 9, 28, 3], [2, 50, 11, 6, 3]]


def _float64(model):
    return model.to(torch.float64)


@pytest.mark.parametrize("variant", VARIANTS)
def test_vit_equals_the_rederivation(variant):
    model = _float64(tiny_vit(depth=3, num_heads=2))
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)).double()
    before = ModelState.capture(model)
    result = Explainer(model).explain(images, method=variant, target=[1, 3])
    assert before.differences(ModelState.capture(model)) == []
    assert result.relevance.shape == (2, 4, 4) and result.relevance.dtype == torch.float64
    for b, target in enumerate([1, 3]):
        expected = ref.vit(model, images[b : b + 1], target, variant)
        torch.testing.assert_close(result.relevance[b], expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    ("name", "reference", "side"),
    [
        ("bert-classifier", ref.bert, "right"),
        ("gpt2", ref.gpt2, "left"),
        ("gpt2", ref.gpt2, "right"),
    ],
)
def test_text_equals_the_rederivation_on_a_padded_batch(variant, name, reference, side):
    model = _float64(tiny_text_model(name))
    before = ModelState.capture(model)
    targets = [0, 2, 1]
    result = Explainer(model).explain(padded_batch(TEXTS, side), method=variant, target=targets)
    assert before.differences(ModelState.capture(model)) == []
    for b, (text, target) in enumerate(zip(TEXTS, targets, strict=True)):
        mask = padded_batch(TEXTS, side)["attention_mask"][b].bool()
        expected = reference(model, text, target, variant)
        torch.testing.assert_close(result.relevance[b][mask], expected, rtol=1e-9, atol=1e-12)
        assert (result.relevance[b][~mask] == 0).all()  # pads exactly 0


def _bias_free(model):
    """Zero every bias and every additive embedding that is not the explained input (class
    token, position and token-type embeddings): then nothing but the input carries
    relevance into the model."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("bias", "cls_token", "pos_embed")) or "position" in name:
                parameter.zero_()
            if "token_type" in name or name.endswith("wpe.weight"):
                parameter.zero_()
    return model


def test_cp_lrp_conserves_the_logit_of_a_bias_free_vit():
    model = _bias_free(_float64(tiny_vit(depth=3, num_heads=2)))
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2)).double()
    result = Explainer(model).explain(images, method="cp_lrp")
    logits = result.logits.gather(1, result.target[:, None])[:, 0]
    # Exact up to the identity rule's 1e-10 in y / (x + 1e-10), LXT's stabiliser.
    torch.testing.assert_close(result.relevance.sum(dim=(1, 2)), logits, rtol=1e-7, atol=0)


@pytest.mark.parametrize("name", ["bert-classifier", "gpt2", "distilbert-classifier"])
def test_cp_lrp_conserves_the_logit_of_a_bias_free_text_model(name):
    model = _bias_free(_float64(tiny_text_model(name)))
    result = Explainer(model).explain(padded_batch(TEXTS), method="cp_lrp", target=1)
    torch.testing.assert_close(result.relevance.sum(dim=1), result.logits[:, 1], rtol=1e-7, atol=0)


def test_attnlrp_loses_the_half_of_attention_relevance_that_the_softmax_absorbs():
    """AttnLRP is conservative except at the softmax, which keeps the relevance that the
    uniform rule gives the attention weights. With q = k = 0 (uniform attention) none of
    it comes back through q and k, so a bias-free one-block ViT without final norm and
    MLP loses exactly half of its attention branch's share of the logit, while CP-LRP
    loses nothing."""
    model = _bias_free(_float64(tiny_vit(depth=1, num_heads=2)))
    model.norm = torch.nn.Identity()  # the logit is then linear in the residual stream
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.qkv.weight[: 2 * attn.num_heads * attn.head_dim].zero_()
        attn.proj.weight.mul_(30.0)  # a uniform average is small: make the branch count
        model.blocks[0].mlp.fc2.weight.zero_()
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3)).double()
    explainer = Explainer(model)
    logits = model(images)[:, 0].detach()
    saved = attn.proj.weight.detach().clone()
    with torch.no_grad():
        attn.proj.weight.zero_()
        without_attention = model(images)[:, 0]
        attn.proj.weight.copy_(saved)
    share = logits - without_attention
    cp = explainer.explain(images, method="cp_lrp", target=0).relevance.sum(dim=(1, 2))
    full = explainer.explain(images, method="attnlrp", target=0).relevance.sum(dim=(1, 2))
    torch.testing.assert_close(cp, logits, rtol=1e-7, atol=0)
    torch.testing.assert_close(full, logits - share / 2, rtol=1e-7, atol=0)
    assert (share.abs() > 0.1 * logits.abs()).all()  # the attention branch does matter


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("config", sorted(VIT_CONFIGS))
def test_every_vit_form_batch_equals_single(config, variant):
    kwargs, (height, width) = VIT_CONFIGS[config]
    model = tiny_vit(**kwargs)
    images = torch.randn(3, 3, height, width, generator=torch.Generator().manual_seed(1))
    before = ModelState.capture(model)
    explainer = Explainer(model)
    batch = explainer.explain(images, method=variant)
    grid = model.patch_embed.dynamic_feat_size((height, width))
    assert batch.relevance.shape == (3, *grid)
    for b in range(3):
        alone = explainer.explain(images[b : b + 1], method=variant, target=int(batch.target[b]))
        torch.testing.assert_close(batch.relevance[b], alone.relevance[0], rtol=1e-4, atol=1e-6)
    assert before.differences(ModelState.capture(model)) == []


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", ["vit", "deit-teacher"])
def test_hugging_face_image_classifiers_batch_equals_single(name, variant):
    model = tiny_image_model(name)
    images = torch.randn(3, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(5))
    before = ModelState.capture(model)
    explainer = Explainer(model)
    batch = explainer.explain(images, method=variant, target=[0, 4, 2])
    assert batch.relevance.shape == (3, 4, 4)
    for b, target in enumerate([0, 4, 2]):
        alone = explainer.explain(images[b : b + 1], method=variant, target=target)
        torch.testing.assert_close(batch.relevance[b], alone.relevance[0], rtol=1e-4, atol=1e-6)
    assert before.differences(ModelState.capture(model)) == []


FAMILIES = [
    "bert-classifier",
    "bert-encoder",
    "distilbert-classifier",
    "roberta-classifier",
    "xlm_roberta-encoder",
    "albert-classifier",
    "electra-classifier",
]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", FAMILIES)
def test_every_bert_family_batch_equals_single(name, variant):
    model = tiny_text_model(name)
    before = ModelState.capture(model)
    explainer = Explainer(model)
    targets = [2, 0, 1]  # classes, or features of a mean-pooled encoder's embedding
    batch = explainer.explain(padded_batch(TEXTS), method=variant, target=targets)
    for b, (text, target) in enumerate(zip(TEXTS, targets, strict=True)):
        alone = explainer.explain(
            {"input_ids": torch.tensor([text])}, method=variant, target=target
        )
        torch.testing.assert_close(
            batch.relevance[b, : len(text)], alone.relevance[0], rtol=1e-4, atol=1e-6
        )
        assert (batch.relevance[b, len(text) :] == 0).all()
    assert before.differences(ModelState.capture(model)) == []


def test_several_classes_per_input_are_several_backward_passes():
    model = tiny_vit()
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    explainer = Explainer(model)
    both = explainer.explain(images, method="attnlrp", target=torch.tensor([[0, 3], [2, 1]]))
    assert both.relevance.shape == (2, 2, 4, 4)
    for column, targets in enumerate([[0, 2], [3, 1]]):
        one = explainer.explain(images, method="attnlrp", target=targets)
        torch.testing.assert_close(both.relevance[:, column], one.relevance)


def test_registered_with_their_papers():
    for name in VARIANTS:
        spec = METHODS[name]
        assert spec.class_specific and spec.needs_gradients and spec.gradient_rules == name
        assert spec.needs == {Need.EMBEDDING_GRADIENTS}
    assert "Achtibat" in METHODS["attnlrp"].summary and "Ali" in METHODS["cp_lrp"].summary


def test_two_token_set_models_are_refused_with_advice():
    import transformers as tf

    config = tf.CLIPConfig(
        text_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=16, vocab_size=30, max_position_embeddings=8),
        vision_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=16, image_size=8, patch_size=4),
        projection_dim=8,
    )  # fmt: skip
    model = tf.CLIPModel(config).eval()
    inputs = {"pixel_values": torch.randn(1, 3, 8, 8), "input_ids": torch.tensor([[1, 2, 3]])}
    with pytest.raises(ExplainError, match=r"not available for .*supported methods: .*generic"):
        Explainer(model).explain(inputs, method="attnlrp")


# -- one process, several methods ---------------------------------------------------------

_SCRIPT = """
import json, os, sys, torch
sys.path.insert(0, {tests!r})
import timm.models.vision_transformer, transformers.models.bert.modeling_bert  # run's imports
from reference_hf import padded_batch, tiny_text_model
from explain import Explainer
from explain.testing import tiny_vit
TEXTS = {texts!r}
def run(methods):
    text_model, vit = tiny_text_model("bert-classifier"), tiny_vit()
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    found = {{}}
    for method in methods:
        text = Explainer(text_model).explain(padded_batch(TEXTS), method=method, target=1)
        image = Explainer(vit).explain(images, method=method, target=2)
        found[method] = [text.relevance.tolist(), image.relevance.tolist()]
    return found
def in_a_process_of_its_own(methods):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        with os.fdopen(write, "w") as out:
            json.dump(run(methods), out)
        os._exit(0)
    os.close(write)
    return pid, read
children = [in_a_process_of_its_own(methods.split(",")) for methods in sys.argv[1:]]
printed = [os.fdopen(read).read() for _, read in children]
if any(os.waitpid(pid, 0)[1] for pid, _ in children):
    sys.exit("a method's process failed")
print(json.dumps([json.loads(text) for text in printed]))
"""

SEQUENCE = ["attnlrp", "cp_lrp", "generic"]


def test_methods_in_sequence_equal_each_in_a_fresh_process():
    """Nothing a method does to the model or the process outlives its call: attnlrp, then
    cp_lrp, then generic in one process give what each gives in a process of its own.
    The sequence's first method runs in a fresh process already, so only the later ones
    get a process of their own. Each is forked from one interpreter that has imported the
    libraries but built no model and ran no method: one import of torch, transformers and
    timm instead of three (8 CPU seconds each)."""
    later = SEQUENCE[1:]
    script = _SCRIPT.format(tests=str(Path(__file__).parent), texts=TEXTS)
    runs = [",".join(SEQUENCE), *later]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread: no OpenMP pool across fork
    done = subprocess.run(
        [sys.executable, "-c", script, *runs], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = json.loads(done.stdout)
    together, alone = outputs[0], {m: o[m] for m, o in zip(later, outputs[1:], strict=True)}
    for method in later:
        assert together[method] == alone[method], method
    assert together["attnlrp"] != together["cp_lrp"] != together["generic"]
