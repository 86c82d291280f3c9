"""open_clip CLIP image and text relevance against an independent reference (docs/multimodal.md,
"open_clip CLIP"), in padded batches; zero-shot prompts; raw texts through open_clip's
tokenizer; promises and errors.

The reference runs one (image, text) pair at a time with the text unpadded, recomputes
every block's attention explicitly from the weights of its nn.MultiheadAttention (open_clip
itself only runs the fused kernel), differentiates the pair's similarity logit and
multiplies full matrices.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from reference_coattention import generic_readout, gradient_weighted
from tolerances import FLOAT64
from torch import Tensor, nn

from explain import Explainer, InputError, OptionError, UnsupportedModelError
from explain.testing import ModelState

open_clip = pytest.importorskip("open_clip")
from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg  # noqa: E402

SOT, EOT, VOCAB, CONTEXT = 62, 63, 64, 16
IMAGE_LAYERS, TEXT_LAYERS, GRID = 2, 2, 4


def tiny_open_clip(seed: int = 0, vision: dict | None = None, text: dict | None = None) -> CLIP:
    """A small open_clip CLIP from a config (no download); EOT has the highest id, as in
    open_clip's tokenizer, so that the default argmax pooling finds it."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        vision_cfg = {"layers": IMAGE_LAYERS, "width": 32, "head_width": 16, "patch_size": 8}
        text_cfg = {"layers": TEXT_LAYERS, "width": 32, "heads": 2, "vocab_size": VOCAB}
        model = CLIP(
            embed_dim=16,
            vision_cfg=CLIPVisionCfg(**{**vision_cfg, "image_size": 32, **(vision or {})}),
            text_cfg=CLIPTextCfg(**{**text_cfg, "context_length": CONTEXT, **(text or {})}),
        )
        # Random CLIP weights give near-uniform attention; spread the embeddings so that the
        # maps differ from token to token and the comparisons below can fail.
        for embedding in (
            model.visual.positional_embedding,
            model.token_embedding.weight,
            model.positional_embedding,
        ):
            nn.init.normal_(embedding, std=1.0)
    return model.eval()


def _texts(lengths: list[int], seed: int = 1) -> Tensor:
    """Texts padded to the context length as open_clip's tokenizer pads them: SOT, random
    words, EOT, then zeros."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), CONTEXT, dtype=torch.long)
    for row, length in enumerate(lengths):
        words = torch.randint(1, SOT, (length,), generator=generator)
        ids[row, : length + 2] = torch.cat([torch.tensor([SOT]), words, torch.tensor([EOT])])
    return ids


def _inputs(num_images: int, lengths: list[int], dtype=torch.float32) -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(2)
    images = torch.randn(num_images, 3, 32, 32, generator=generator, dtype=dtype)
    return {"image": images, "text": _texts(lengths)}


def _length(ids: Tensor) -> int:
    return int((ids == EOT).nonzero()[0]) + 1


def _run_blocks(blocks: nn.ModuleList, x: Tensor, causal: bool) -> tuple[Tensor, list[Tensor]]:
    """open_clip's residual blocks with each attention written out: (output, [A (H, n, n)])."""
    maps = []
    n = x.shape[0]
    for block in blocks:
        mha = block.attn
        heads, width = mha.num_heads, x.shape[-1]
        head_dim = width // heads
        qkv = block.ln_1(x) @ mha.in_proj_weight.T + mha.in_proj_bias
        q, k, v = (t.reshape(n, heads, head_dim).transpose(0, 1) for t in qkv.split(width, -1))
        scores = q @ k.transpose(-1, -2) / head_dim**0.5
        if causal:
            future = torch.ones(n, n, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        attention = scores.softmax(dim=-1)
        maps.append(attention)
        merged = (attention @ v).transpose(0, 1).reshape(n, width)
        x = x + merged @ mha.out_proj.weight.T + mha.out_proj.bias
        x = x + block.mlp(block.ln_2(x))
    return x, maps


def reference_pair(model: CLIP, image: Tensor, ids: Tensor, image_start: int, text_start: int):
    """(image grid relevance, text relevance over the unpadded text, similarity logit)."""
    visual = model.visual
    patches = visual.conv1(image[None]).flatten(2)[0].T
    x = torch.cat([visual.class_embedding[None], patches]) + visual.positional_embedding
    x, image_maps = _run_blocks(visual.transformer.resblocks, visual.ln_pre(x), causal=False)
    image_features = visual.ln_post(x[0]) @ visual.proj
    n = ids.shape[0]
    t = model.token_embedding(ids) + model.positional_embedding[:n]
    t, text_maps = _run_blocks(model.transformer.resblocks, t, causal=True)
    text_features = model.ln_final(t[n - 1]) @ model.text_projection
    cosine = torch.cosine_similarity(image_features, text_features, dim=0)
    logit = model.logit_scale.exp() * cosine
    maps = image_maps + text_maps
    grads = torch.autograd.grad(logit, maps)
    matrices = [gradient_weighted(a.detach(), g) for a, g in zip(maps, grads, strict=True)]
    image = generic_readout(matrices[image_start:IMAGE_LAYERS], row=0)[1:].reshape(GRID, GRID)
    text = generic_readout(matrices[IMAGE_LAYERS + text_start :], row=n - 1)
    return image, text, logit.detach()


@pytest.fixture(scope="module")
def model() -> CLIP:
    return tiny_open_clip()


@pytest.fixture(scope="module")
def model64() -> CLIP:
    """The maths against the reference in float64, compared at 1e-10."""
    return tiny_open_clip().double()


def _model_logits(model: CLIP, inputs: dict[str, Tensor]) -> Tensor:
    with torch.no_grad():
        image_features, text_features, scale = model(inputs["image"], inputs["text"])
    return scale * image_features @ text_features.T


@pytest.mark.parametrize(
    "start_layer,image_start,text_start",
    [(None, IMAGE_LAYERS - 1, TEXT_LAYERS - 1), (0, 0, 0), ({"image": 1, "text": 0}, 1, 0)],
)
def test_paired_batch_matches_reference(model64, start_layer, image_start, text_start):
    model, inputs = model64, _inputs(3, [3, 1, 6], torch.float64)
    result = Explainer(model).explain(inputs, start_layer=start_layer)
    assert result.relevances["image"].shape == (3, GRID, GRID)
    assert result.relevances["text"].shape == (3, CONTEXT)
    assert torch.equal(result.target, torch.arange(3))
    # The logits are open_clip's own, model(image, text)
    torch.testing.assert_close(result.logits, _model_logits(model, inputs), **FLOAT64)
    for i in range(3):
        length = _length(inputs["text"][i])
        image, text, logit = reference_pair(
            model, inputs["image"][i], inputs["text"][i, :length], image_start, text_start
        )
        torch.testing.assert_close(result.logits[i, i], logit, **FLOAT64)
        torch.testing.assert_close(result.relevances["image"][i], image, **FLOAT64)
        torch.testing.assert_close(result.relevances["text"][i, :length], text, **FLOAT64)
        assert torch.all(result.relevances["text"][i, length:] == 0)  # pads exactly 0


def test_zero_shot_explains_the_winning_prompt_and_each_prompt(model64):
    model, inputs = model64, _inputs(2, [2, 5, 1], torch.float64)
    explainer = Explainer(model)
    best = explainer.explain(inputs)  # 2 images, 3 prompts: each image's best prompt
    assert best.logits.shape == (2, 3)
    assert torch.equal(best.target, best.logits.argmax(dim=-1))
    each = explainer.explain(inputs, target=torch.arange(3).expand(2, 3))
    assert each.relevances["image"].shape == (2, 3, GRID, GRID)
    assert each.relevances["text"].shape == (2, 3, CONTEXT)
    for i in range(2):
        for k in range(3):
            length = _length(inputs["text"][k])
            image, text, _ = reference_pair(
                model,
                inputs["image"][i],
                inputs["text"][k, :length],
                IMAGE_LAYERS - 1,
                TEXT_LAYERS - 1,
            )
            torch.testing.assert_close(each.relevances["image"][i, k], image, **FLOAT64)
            torch.testing.assert_close(each.relevances["text"][i, k, :length], text, **FLOAT64)
        winner = int(best.target[i])
        torch.testing.assert_close(
            best.relevances["image"][i], each.relevances["image"][i, winner], **FLOAT64
        )


def test_forward_only_methods_run_per_tower(model):
    inputs = _inputs(2, [2, 3])
    result = Explainer(model).explain(inputs, method="raw_attention")
    assert result.relevances["text"].shape == (2, CONTEXT)
    assert torch.all(result.relevances["text"][0, 4:] == 0)


def test_raw_texts_with_open_clip_tokenizer():
    """With open_clip's own tokenizer (49408 BPE tokens; the bpe vocabulary ships in the
    package) the Explainer takes strings and names the tokens."""
    tokenizer = open_clip.get_tokenizer("ViT-B-32")
    model = tiny_open_clip(text={"vocab_size": tokenizer.vocab_size})
    images = _inputs(2, [1])["image"]
    prompts = ["a photo of a dog", "a cat"]
    explainer = Explainer(model, tokenizer=tokenizer)
    from_strings = explainer.explain({"image": images, "text": prompts})
    ids = tokenizer(prompts, context_length=CONTEXT)
    from_ids = Explainer(model).explain({"image": images, "text": ids})
    assert torch.equal(from_strings.relevances["text"], from_ids.relevances["text"])
    assert torch.equal(from_strings.relevances["image"], from_ids.relevances["image"])
    assert from_strings.tokens[1][:4] == ["<start_of_text>", "a</w>", "cat</w>", "<end_of_text>"]
    assert from_strings.tokens[1][4:] == [""] * (CONTEXT - 4)
    with pytest.raises(InputError, match="empty"):
        explainer.explain({"image": images, "text": ["a dog", " "]})


def _explode(module, args, output):
    raise RuntimeError("forced failure mid-forward")


def test_no_side_effects_and_attention_modules_restored():
    model = tiny_open_clip()
    model.set_grad_checkpointing(True)
    model.train()
    model.visual.eval()  # a deliberately mixed state must survive
    model.text_projection.requires_grad_(False)
    inputs = _inputs(2, [2, 3])
    image_features, text_features, _ = model(inputs["image"], inputs["text"])
    (image_features.sum() + text_features.sum()).backward()  # stale grads must survive
    attentions = [block.attn for block in model.modules() if hasattr(block, "ln_1")]
    before = ModelState.capture(model)
    Explainer(model).explain(inputs, start_layer=0)
    Explainer(model).explain(inputs, method="rollout")
    # A failure inside the second tower's forward leaves nothing behind either.
    handle = model.transformer.resblocks[-1].mlp.register_forward_hook(_explode)
    with pytest.raises(RuntimeError, match="forced failure"):
        Explainer(model).explain(inputs)
    handle.remove()
    assert before.differences(ModelState.capture(model)) == []
    assert [block.attn for block in model.modules() if hasattr(block, "ln_1")] == attentions
    assert all(type(attention) is nn.MultiheadAttention for attention in attentions)


@pytest.mark.parametrize(
    "vision,text,message",
    [
        ({"pool_type": "avg"}, {}, "class token"),
        ({"attentional_pool": True}, {}, "attentional pooling"),
        ({"qk_norm": True}, {}, "custom blocks"),
        ({}, {"pool_type": "none"}, "one token"),
    ],
)
def test_unsupported_variants_are_refused(vision, text, message):
    with pytest.raises(UnsupportedModelError, match=message):
        Explainer(tiny_open_clip(vision=vision, text=text))


def test_only_open_clip_clip_matches():
    class CLIP(nn.Module):  # same class name, another package
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(2, 2)

    with pytest.raises(UnsupportedModelError, match="not a supported model"):
        Explainer(CLIP())


def test_errors_are_clear(model):
    inputs = _inputs(2, [2, 3])
    explainer = Explainer(model)
    with pytest.raises(InputError, match="'image'"):
        explainer.explain({"text": inputs["text"]})
    with pytest.raises(InputError, match="32x32"):
        explainer.explain({**inputs, "image": torch.randn(2, 3, 40, 40)})
    with pytest.raises(InputError, match="raw text"):
        explainer.explain({**inputs, "text": ["a dog"]})
    with pytest.raises(InputError, match="context length 16"):
        explainer.explain({**inputs, "text": inputs["text"][:, :8]})
    with pytest.raises(InputError, match="vocabulary"):
        explainer.explain({**inputs, "text": inputs["text"] + VOCAB})
    with pytest.raises(OptionError, match="LRP"):
        explainer.explain(inputs, method="transformer_attribution")


def test_import_explain_does_not_import_open_clip():
    code = "import sys, explain; print('open_clip' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
