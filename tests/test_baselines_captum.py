"""The baselines against the libraries people would otherwise use, on the same models:
captum's IntegratedGradients, InputXGradient, LayerGradientXActivation, FeatureAblation
and NoiseTunnel (SmoothGrad, on our noise), and inseq's gradient x input on a
generation. Skipped where the library is not installed (captum is in the `dev` extra;
inseq is installed by `make test`'s setup, without its dependencies: docs/bridges.md).

Float32 models, compared at rtol 1e-4: captum rounds its Riemann nodes and every
quadrature weight to float32 (torch.linspace, `torch.tensor(step_sizes).float()`), so even
a float64 model would agree with it to about 1e-8 only; the exact float64 comparisons
are against reference_baselines (tests/test_baselines.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import reference_baselines as ref
import torch
from reference_hf import padded_batch, tiny_text_model

from explain import Explainer
from explain.generation import Generation, explain_generation
from explain.testing import tiny_vit
from explain.testing.tiny_lm import tiny_causal_lm, tiny_tokenizer

captum_attr = pytest.importorskip("captum.attr")

ROOT = Path(__file__).resolve().parent.parent
TEXTS = [[2, 17, 5, 33, 8, 41, 3], [2, 9, 28, 3], [2, 50, 11, 6, 3]]
TARGETS = [0, 2, 1]
PATCH = 8  # tiny_vit's 32 x 32 images in 8 x 8 patches


def _close(ours, theirs):
    torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=1e-4, atol=1e-6)


def _vit_and_images():
    model = tiny_vit(depth=3, num_heads=2)
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return model, images


def _per_patch(pixels):
    """(B, 3, H, W) pixel attributions -> (B, gh, gw), summed over each patch's pixels
    and channels."""
    b, _, h, w = pixels.shape
    return pixels.sum(dim=1).reshape(b, h // PATCH, PATCH, w // PATCH, PATCH).sum(dim=(2, 4))


@pytest.mark.parametrize("quadrature", ["gausslegendre", "riemann_right", "riemann_middle"])
def test_integrated_gradients_on_a_vit_equals_captums_on_the_pixels(quadrature):
    """At the patch embeddings with zero pixels' embeddings as the baseline, the path is
    the image of captum's straight path in pixels (the patch embedding is affine), so the
    relevance is captum's pixel attribution summed over each patch."""
    model, images = _vit_and_images()
    ours = Explainer(model).explain(
        images, method="integrated_gradients", target=[1, 3], steps=16, quadrature=quadrature
    )
    theirs = captum_attr.IntegratedGradients(model).attribute(
        images, target=[1, 3], n_steps=16, method=quadrature
    )
    _close(ours.relevance, _per_patch(theirs))


def test_captums_trapezoid_weights_sum_to_less_than_one():
    """captum's riemann_trapezoid takes the trapezoid's nodes 0, 1/(n-1), ..., 1 with
    weights 1/n (halved at both ends), which sum to (n-1)/n; ours are 1/(n-1), so the
    two differ by that factor exactly."""
    model, images = _vit_and_images()
    steps = 9
    ours = Explainer(model).explain(
        images, method="integrated_gradients", target=0, steps=steps, quadrature="riemann_trapezoid"
    )
    theirs = captum_attr.IntegratedGradients(model).attribute(
        images, target=0, n_steps=steps, method="riemann_trapezoid"
    )
    _close(ours.relevance * (steps - 1) / steps, _per_patch(theirs))


def test_gradient_x_input_on_a_vit_equals_captums_at_the_patch_embedding():
    model, images = _vit_and_images()
    ours = Explainer(model).explain(images, method="gradient_x_input", target=[1, 3])
    theirs = captum_attr.LayerGradientXActivation(model, model.patch_embed).attribute(
        images, target=[1, 3]
    )
    _close(ours.relevance, theirs.detach().sum(dim=-1).reshape(2, 4, 4))


def test_occlusion_of_a_vit_equals_captums_feature_ablation_of_patches():
    model, images = _vit_and_images()
    ours = Explainer(model).explain(images, method="occlusion", target=[1, 3])
    patches = torch.arange(16).reshape(4, 4)
    mask = patches.repeat_interleave(PATCH, 0).repeat_interleave(PATCH, 1)
    theirs = captum_attr.FeatureAblation(model).attribute(
        images, target=[1, 3], feature_mask=mask[None, None].expand(1, 3, 32, 32)
    )
    _close(ours.relevance, theirs[:, 0, ::PATCH, ::PATCH])


def _text_case(name):
    """A padded batch and the model's scores from its word embeddings, as captum takes
    them (`inputs_embeds`, the attention mask an additional argument it repeats)."""
    model = tiny_text_model(name)
    side = "left" if name == "gpt2" else "right"
    batch = padded_batch(TEXTS, side)
    mask = batch["attention_mask"]

    def scores(embeddings, mask):
        if name != "gpt2":
            return model(inputs_embeds=embeddings, attention_mask=mask).logits
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # counted from the mask
        logits = model(inputs_embeds=embeddings, attention_mask=mask, position_ids=positions)
        return logits.logits[:, -1]

    embeddings = model.get_input_embeddings()(batch["input_ids"]).detach()
    return model, batch, scores, embeddings, (mask,), mask.bool()


@pytest.mark.parametrize("name", ["bert-classifier", "gpt2"])
def test_text_baselines_equal_captums_on_the_word_embeddings(name):
    model, batch, scores, embeddings, extra, real = _text_case(name)
    explainer = Explainer(model)
    theirs = {
        "gradient_x_input": captum_attr.InputXGradient(scores).attribute(
            embeddings.clone().requires_grad_(True), target=TARGETS, additional_forward_args=extra
        ),
        "integrated_gradients": captum_attr.IntegratedGradients(scores).attribute(
            embeddings, target=TARGETS, n_steps=16, additional_forward_args=extra
        ),
    }
    for method, attribution in theirs.items():
        options = {"steps": 16} if method == "integrated_gradients" else {}
        ours = explainer.explain(batch, method=method, target=TARGETS, **options)
        _close(ours.relevance[real], attribution.detach().sum(dim=-1)[real])
    tokens = torch.arange(embeddings.shape[1])[None, :, None].expand_as(embeddings)
    ablated = captum_attr.FeatureAblation(scores).attribute(
        embeddings, target=TARGETS, feature_mask=tokens, additional_forward_args=extra
    )  # each token's drop, on every one of its hidden units
    ours = explainer.explain(batch, method="occlusion", target=TARGETS)
    _close(ours.relevance[real], ablated[..., 0][real])


@pytest.mark.parametrize(
    ("attribution", "nt_type"), [("Saliency", "smoothgrad"), ("InputXGradient", "smoothgrad_sq")]
)
@pytest.mark.parametrize("kind", ["vit", "bert-classifier", "gpt2"])
def test_smoothgrad_equals_captums_noise_tunnel_on_the_same_noise(
    kind, attribution, nt_type, monkeypatch
):
    """captum's NoiseTunnel over Saliency (|gradient|) or InputXGradient at the patch or
    word embeddings, one input at a time, its Gaussian noise replaced by ours (copy s:
    reference_baselines.counter_noise of the seed and s over the embeddings' entries,
    times the stdev the call records), summed over the hidden size; float64 models."""
    samples, target = 4, 1
    if kind == "vit":
        model = tiny_vit(depth=3, num_heads=2).double()
        inputs = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1)).double()
        scores, e, _ = ref.timm_vit(model, inputs)
    else:
        model = tiny_text_model(kind).double()
        inputs = {"input_ids": torch.tensor([TEXTS[0]])}
        scores, e = ref.hf_text(model, TEXTS[0], last=kind == "gpt2")
    ours = Explainer(model).explain(
        inputs,
        method="smoothgrad",
        target=target,
        samples=samples,
        seed=3,
        times_input=attribution == "InputXGradient",
        squared=nt_type == "smoothgrad_sq",
    )
    stdev = ours.settings["noise_stdev"][0]
    noise = torch.cat(
        [ref.counter_noise(3, s, e.numel()).reshape(e.shape) for s in range(samples)]
    ).to(e.dtype)

    def our_noise(input, stdev_given, count):
        assert (count, stdev_given) == (samples, stdev)
        return input.repeat_interleave(count, dim=0) + noise * stdev

    monkeypatch.setattr(captum_attr.NoiseTunnel, "_add_noise_to_input", staticmethod(our_noise))
    tunnel = captum_attr.NoiseTunnel(getattr(captum_attr, attribution)(scores))
    theirs = tunnel.attribute(e, nt_type=nt_type, nt_samples=samples, stdevs=stdev, target=target)
    expected = theirs.detach().sum(dim=-1)[0]
    torch.testing.assert_close(ours.relevance.flatten(), expected.flatten(), rtol=1e-5, atol=1e-9)


def test_gradient_x_input_on_a_generation_equals_inseqs():
    """inseq's input_x_gradient (captum's InputXGradient at the input embeddings, step by
    step of a generation, for the generated token's logit), summed over the hidden size."""
    inseq = pytest.importorskip("inseq")
    model, tokenizer = tiny_causal_lm("llama"), tiny_tokenizer()
    attribution = inseq.load_model(model, "input_x_gradient", tokenizer=tokenizer)
    generated = attribution.attribute(
        "w10 w11 w12 w13",
        generation_args={"max_new_tokens": 3, "do_sample": False},
        attributed_fn="logit",
        show_progress=False,
    ).sequence_attributions[0]
    ids = torch.tensor([tokenizer.convert_tokens_to_ids([t.token for t in generated.target])])
    assert ids.shape == (1, 7)  # the prompt's 4 tokens and 3 generated
    generation = Generation(ids, torch.ones_like(ids), prompt_length=4)
    ours = explain_generation(Explainer(model), generation, method="gradient_x_input")
    theirs = generated.target_attributions.sum(dim=-1).T  # (generated, tokens), NaN after
    seen = ~theirs.isnan()
    _close(ours.explanation.relevance[0][seen], theirs[seen])
    assert (ours.explanation.relevance[0][~seen] == 0).all()


def test_the_benchmark_against_captum_runs_at_tiny_shapes(tmp_path):
    """scripts/bench_baselines.py --smoke: every case through the same code, the section
    written between its markers, ours and captum's maps the same."""
    out = tmp_path / "benchmarks.md"
    out.write_text("# Benchmarks\n\nkept\n")
    script = ROOT / "scripts" / "bench_baselines.py"
    options = ["--smoke", "--rounds", "1", "--steps", "4", "--out", str(out)]
    run = subprocess.run(
        [sys.executable, str(script), *options],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nkept\n") and "**Smoke run**" in text
    rows = [line for line in text.splitlines() if line.startswith("| integrated_gradients, ours")]
    assert len(rows) == 3
    for row in rows:  # ours / captum, then the largest difference of the maps
        assert float(row.split("|")[-2]) < 1e-5, row
