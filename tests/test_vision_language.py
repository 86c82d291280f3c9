"""Vision-language models (LLaVA, PaliGemma, Gemma 3, Qwen2-VL, Idefics3, SmolVLM): the
next token and generated answers explained over the image and the prompt, at depths "lm"
and "tower", against an independent computation.

The reference runs a copy of the tiny model on transformers' eager path with
`output_attentions=True` (the language model's maps, and the tower's in `image_outputs`),
takes every map's gradient with autograd, and writes the rule out with whole matrices, in
float64: `R = prod (I + mean_h (G * A)+)` over the language model, the readout row at the
explained position, the image tokens' relevance placed on the tower's tokens, and for
depth "tower" the same product over the tower's blocks read out by that row. Qwen2-VL's
reference is the model's own forward (its rotary positions, its merger), each merged
token spread by hand over its 2 x 2 patches; its packed tower's maps are the pieces its
attention function is called with (each image; in Qwen2.5-VL's windowed blocks each
window), attended in float64 by the test's own function, put together by hand per image
in the tower's token order (written out: windows, blocks in a window, patches in a
block), zero across windows. Idefics3's and SmolVLM's write out the pixel
shuffle (each image token over its s x s patches) and the tiles put together on the photo,
the global image shared out over the cells each of its patches covers.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from unittest import mock

import numpy as np
import pytest
import torch
from conftest import float32_atol
from tolerances import assert_float32_close
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from explain import Explainer, ExplainError, InputError, OptionError
from explain.generation import Generation, explain_generation, generate
from explain.inputs import encode_image_prompt
from explain.testing import ModelState
from explain.testing.tiny_vlm import (
    BOI_TOKEN_ID,
    EOI_TOKEN_ID,
    IMAGE_TOKEN_ID,
    tiny_gemma3,
    tiny_llava,
    tiny_llava_processor,
    tiny_paligemma,
    tiny_paligemma_processor,
)

KINDS = {
    "llava-clip": (lambda: tiny_llava("clip"), lambda: tiny_llava_processor("clip")),
    "llava-siglip": (lambda: tiny_llava("siglip"), lambda: tiny_llava_processor("siglip")),
    "paligemma": (tiny_paligemma, tiny_paligemma_processor),
}


@pytest.fixture(scope="module", params=sorted(KINDS))
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def model(kind):
    return KINDS[kind][0]().double()


@pytest.fixture(scope="module")
def processor(kind):
    return KINDS[kind][1]()


def _photo(seed: int, size=(40, 60)) -> np.ndarray:
    return (np.random.default_rng(seed).random((*size, 3)) * 255).astype(np.uint8)


def _chat(processor, photo, words: str):
    """The prompt as people give it: a chat where the processor has a template (LLaVA),
    else the image and the question (PaliGemma)."""
    if processor.chat_template is None:
        return {"image": photo, "text": words}
    return [
        {
            "role": "user",
            "content": [{"type": "image", "image": photo}, {"type": "text", "text": words}],
        }
    ]


def _chats(processor, pairs):
    """Several prompts: conversations, or one mapping of images and questions."""
    if processor.chat_template is None:
        return {"image": [p for p, _ in pairs], "text": [w for _, w in pairs]}
    return [_chat(processor, photo, words) for photo, words in pairs]


def _inputs(processor, prompt):
    encoded = encode_image_prompt(prompt, processor)
    encoded["pixel_values"] = encoded["pixel_values"].double()
    return encoded


def _generic(attentions, gradients, readout):
    """r @ prod_l (I + mean_h (G * A)+), whole matrices, first block first."""
    tokens = readout.shape[-1]
    fold = torch.eye(tokens, dtype=readout.dtype)
    for attention, gradient in zip(attentions, gradients, strict=True):
        block = (gradient * attention).clamp(min=0).mean(dim=0)
        fold = fold + block @ fold
    return readout @ fold


def _rollout(attentions, readout):
    tokens = readout.shape[-1]
    fold = torch.eye(tokens, dtype=readout.dtype)
    for attention in attentions:
        block = attention.mean(dim=0) + torch.eye(tokens, dtype=readout.dtype)
        fold = (block / block.sum(dim=-1, keepdim=True)) @ fold
    return readout @ fold


def reference(model, one, position, target, depth, method="generic"):
    """One text (batch 1): (image grid (k, gh, gw), text (T,)) for the token `target` read
    out at `position`, written out from eager maps and autograd."""
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    ids, mask = one["input_ids"], one["attention_mask"]
    pixels = one["pixel_values"].clone().requires_grad_(True)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    if model.config.model_type == "paligemma":  # it counts from 1
        positions = positions + 1
    # The tower on its own, its maps returned; its projected features put in place of the
    # image tokens by hand; then the language model on those embeddings.
    image = eager.model.get_image_features(pixel_values=pixels, output_attentions=True)
    features = image.pooler_output
    features = torch.cat(list(features)) if isinstance(features, list | tuple) else features
    embeddings = eager.get_input_embeddings()(ids)
    is_image = ids[0] == IMAGE_TOKEN_ID
    embeddings = embeddings.clone()
    embeddings[0, is_image] = features.reshape(-1, embeddings.shape[-1])
    out = eager(
        inputs_embeds=embeddings,
        attention_mask=mask,
        position_ids=positions,
        output_attentions=True,
        use_cache=False,
        **({"token_type_ids": one["token_type_ids"]} if "token_type_ids" in one else {}),
    )
    config = model.config
    num_tower = len(image.attentions)
    llava = config.model_type == "llava"
    # LLaVA reads hidden state h: blocks 0..h-1 feed the text; PaliGemma reads the last
    used = config.vision_feature_layer % (num_tower + 1) if llava else num_tower
    text_maps = list(out.attentions)
    tower_maps = list(image.attentions[:used])
    score = out.logits[0, position, target]
    grads = torch.autograd.grad(score, text_maps + tower_maps)
    text_grads, tower_grads = grads[: len(text_maps)], grads[len(text_maps) :]
    length = ids.shape[1]
    readout = torch.zeros(length, dtype=torch.float64)
    readout[position] = 1.0
    seen = (torch.arange(length) <= position) & mask[0].bool()
    if method == "generic":
        text = _generic([a[0] for a in text_maps], [g[0] for g in text_grads], readout)
    else:
        text = _rollout([a[0] for a in text_maps], readout)
    text = text * seen
    clip = config.vision_config.model_type == "clip_vision_model"
    prefix = 1 if clip else 0
    dropped = 1 if llava and config.vision_feature_select_strategy == "default" else 0
    images = pixels.shape[0]
    per_image = text[is_image].reshape(images, -1)
    if config.model_type == "gemma3":  # each pooled token shared out over its k x k patches
        side = config.vision_config.image_size // config.vision_config.patch_size
        pooled = round(per_image.shape[1] ** 0.5)
        kernel = side // pooled
        blocks = per_image.reshape(images, pooled, pooled) / kernel**2
        tower_tokens = blocks.repeat_interleave(kernel, 1).repeat_interleave(kernel, 2).flatten(1)
    else:
        tower_tokens = torch.zeros(images, per_image.shape[1] + dropped, dtype=torch.float64)
        tower_tokens[:, dropped:] = per_image
    if depth == "tower":
        rows = []
        for image in range(images):
            maps = [a[image] for a in tower_maps]
            if method == "generic":
                rows.append(_generic(maps, [g[image] for g in tower_grads], tower_tokens[image]))
            else:
                rows.append(_rollout(maps, tower_tokens[image]))
        tower_tokens = torch.stack(rows)
    grid = round((tower_tokens.shape[1] - prefix) ** 0.5)
    return tower_tokens[:, prefix:].reshape(images, grid, grid), text.masked_fill(is_image, 0.0)


@pytest.mark.parametrize("depth", ["lm", "tower"])
@pytest.mark.parametrize("method", ["generic", "rollout"])
def test_the_next_token_equals_the_written_out_rule(model, processor, depth, method):
    inputs = _inputs(processor, _chat(processor, _photo(0), "w12 w13 w14"))
    result = Explainer(model).explain(inputs, method=method, depth=depth)
    assert result.settings["depth"] == depth  # with the attention path and memory budget
    image, text = reference(
        model, inputs, inputs["input_ids"].shape[1] - 1, int(result.target[0]), depth, method
    )
    assert result.relevances["image"].shape == (1, 4, 4)
    torch.testing.assert_close(result.relevances["image"][0], image[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(result.relevances["text"][0], text, rtol=1e-9, atol=1e-12)
    assert result.relevance is result.relevances["image"]


@pytest.mark.parametrize("depth", ["lm", "tower"])
def test_each_generated_token_equals_the_rule_on_its_prefix(model, processor, depth):
    # The explicit path: the rule below reads the eager maps, whose softmax transformers
    # runs in float32; "auto" streams a generation's columns from maps recomputed in float64.
    explainer = Explainer(model, tokenizer=processor, attention_path="explicit")
    # Prompts of one length: transformers' eager softmax runs in float32, where float64's
    # mask value becomes -inf, so a left-padded float64 row is NaN (padding: next test).
    chats = _chats(processor, [(_photo(0), "w12 w13 w14 w15"), (_photo(1), "w20 w21 w22 w23")])
    answer = explain_generation(explainer, chats, max_new_tokens=3, method="generic", depth=depth)
    generation, result = answer.generation, answer.explanation
    batch, steps = generation.generated.shape
    assert result.relevances["image"].shape == (batch, steps, 4, 4)
    assert result.relevances["text"].shape == (batch, steps, generation.input_ids.shape[1])
    width = generation.prompt_length
    for row in range(batch):
        real = generation.attention_mask[row].bool()
        one = {
            "input_ids": generation.input_ids[row : row + 1, real],
            "attention_mask": generation.attention_mask[row : row + 1, real],
            "pixel_values": generation.extra["pixel_values"][row : row + 1],
        }
        if "token_type_ids" in generation.extra:
            one["token_type_ids"] = generation.extra["token_type_ids"][row : row + 1, real]
        start = int((~real[:width]).sum())  # the prompt's left padding
        for step in range(steps):
            if not generation.generated[row, step]:
                continue
            position = width + step - 1 - start
            token = int(generation.input_ids[row, width + step])
            assert int(result.target[row, step]) == token
            image, text = reference(model, one, position, token, depth)
            torch.testing.assert_close(
                result.relevances["image"][row, step], image[0], rtol=1e-9, atol=1e-12
            )
            got = result.relevances["text"][row, step][real]
            torch.testing.assert_close(got, text, rtol=1e-9, atol=1e-12)
            assert (result.relevances["text"][row, step][~real] == 0).all()


def _assert_a_left_padded_batch_equals_each_prompt_alone(
    model, processor, depth, answer, method="generic"
):
    """Two prompts of different lengths, left-padded to one width (with their answers, as
    long, after them when `answer`), get the maps each gets alone; the padding exactly 0.
    Without a processor (Gemma 3), the prompts are written by hand (`_gemma3_prompts`)."""
    if processor is None:
        together = _gemma3_prompts((5, 1))
        real = together["attention_mask"].bool()
        alone = [
            {
                name: value[row : row + 1, real[row]] if value.dim() == 2 else value[row : row + 1]
                for name, value in together.items()
            }
            for row in range(2)
        ]
    else:
        pairs = [(_photo(0), "w12 w13 w14 w15 w16"), (_photo(1), "w20")]
        together = _chats(processor, pairs)
        alone = [_chat(processor, photo, words) for photo, words in pairs]
    explainer = Explainer(model, tokenizer=processor)

    def run(prompt):
        if not answer:
            return explainer.explain(prompt, method=method, depth=depth)
        generation = explain_generation(
            explainer, prompt, max_new_tokens=2, method=method, depth=depth
        )
        return generation.explanation

    batch = run(together)
    for row, prompt in enumerate(alone):
        single = run(prompt)
        assert batch.target[row].tolist() == single.target[0].tolist()
        image, alone_image = batch.relevances["image"][row], single.relevances["image"][0]
        text, one = batch.relevances["text"][row], single.relevances["text"][0]
        # float32, summed in other orders in a batch; a plain baseline's maps carry more of
        # its rounding (conftest.PLAIN_BASELINES)
        close = dict(rtol=1e-4, atol=float32_atol(method, alone_image, 1e-6))
        torch.testing.assert_close(image, alone_image, **close)
        pad = text.shape[-1] - one.shape[-1]
        close = dict(rtol=1e-4, atol=float32_atol(method, one, 1e-6))
        torch.testing.assert_close(text[..., pad:], one, **close)
        assert (text[..., :pad] == 0).all()


@pytest.mark.parametrize("answer", [False, True])
def test_a_left_padded_batch_equals_each_prompt_alone(kind, processor, answer):
    model = KINDS[kind][0]()  # float32: a left-padded float64 row is NaN (see above)
    _assert_a_left_padded_batch_equals_each_prompt_alone(model, processor, "tower", answer)


def test_two_images_in_one_prompt_get_one_map_each(model, processor):
    chat = {"image": [_photo(0), _photo(1)], "text": "w12 w13"}  # two images, one question
    if processor.chat_template is not None:  # and as a chat, the images among the words
        chat = [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": _photo(0)},
                    {"type": "text", "text": "w12"},
                    {"type": "image", "image": _photo(1)},
                    {"type": "text", "text": "w13"},
                ],
            }
        ]
    explainer = Explainer(model, tokenizer=processor)
    inputs = explainer.adapter.encode(chat, processor)
    inputs["pixel_values"] = inputs["pixel_values"].double()
    for depth in ("lm", "tower"):
        result = explainer.explain(inputs, method="generic", depth=depth)
        assert result.relevances["image"].shape == (1, 2, 4, 4)
        image, _ = reference(
            model, inputs, inputs["input_ids"].shape[1] - 1, int(result.target[0]), depth
        )
        torch.testing.assert_close(result.relevances["image"][0], image, rtol=1e-9, atol=1e-12)
    questions = {"image": [_photo(0), _photo(1), _photo(2), _photo(3)], "text": ["w12", "w13"]}
    assert explainer.explain(questions, method="generic").relevances["image"].shape == (2, 2, 4, 4)
    with pytest.raises(InputError, match="3 images for 2 questions"):
        explainer.explain(
            {"image": questions["image"][:3], "text": ["w12", "w13"]}, method="generic"
        )


def test_an_image_prompt_as_people_give_it(model, processor, tmp_path):
    from PIL import Image

    path = tmp_path / "photo.png"
    Image.fromarray(_photo(3)).save(path)
    explainer = Explainer(model, tokenizer=processor)
    by_path = explainer.explain({"image": str(path), "text": "w12 w13"})
    by_array = explainer.explain(_chat(processor, _photo(3), "w12 w13"))
    torch.testing.assert_close(by_path.relevances["image"], by_array.relevances["image"])
    assert by_path.tokens is not None and "<image>" in by_path.tokens[0]


def test_a_photo_array_is_read_as_its_values_say(model, processor):
    """Integers are 0..255, floats [0, 1]; anything else is refused before the forward,
    never clipped (issue 37: a photo in 0..255 as floats was read as almost white)."""
    photo = _photo(3)
    explainer = Explainer(model, tokenizer=processor)
    expected = explainer.explain(_chat(processor, photo, "w12")).relevances["image"]
    for same in (photo.astype(np.int64), photo / 255.0, torch.from_numpy(photo / 255.0).float()):
        found = explainer.explain(_chat(processor, same, "w12")).relevances["image"]
        torch.testing.assert_close(found, expected, rtol=0, atol=0)
    refused = {
        r"floats must hold values in \[0, 1\], got 0\.\.25\d; .*divide it by 255": photo * 1.0,
        r"got -0\.5\.\.0\.99\d*; clip it to \[0, 1\]": np.clip(photo / 255.0, 0.0, 1.0)
        - 0.5 * (photo == 0),
        "NaN or infinite": np.where(photo == 0, np.nan, photo / 255.0),
        r"integers must hold 0\.\.255, got 0\.\.5\d\d": photo.astype(np.int64) * 2,
        "got bool": photo > 127,
    }
    for message, array in refused.items():
        with pytest.raises(InputError, match=message):
            explainer.explain(_chat(processor, array, "w12"))


def test_no_side_effects_after_answers_and_failures(model, processor):
    explainer = Explainer(model, tokenizer=processor)
    before = ModelState.capture(model)
    explain_generation(
        explainer, _chat(processor, _photo(0), "w12"), max_new_tokens=2, depth="tower"
    )
    explainer.explain(_chat(processor, _photo(0), "w12"), method="rollout", depth="tower")
    with pytest.raises(ExplainError):
        explainer.explain(_chat(processor, _photo(0), "w12"), target=10**6)
    assert before.differences(ModelState.capture(model)) == []


def test_what_is_refused_says_why(model, processor):
    explainer = Explainer(model, tokenizer=processor)
    chat = _chat(processor, _photo(0), "w12")
    with pytest.raises(OptionError, match="depth must be one of lm, tower"):
        explainer.explain(chat, depth="pixels")
    with pytest.raises(OptionError, match="reads one fixed block"):
        explainer.explain(chat, method="raw_attention", depth="tower")
    for method in ("transformer_attribution", "partial_lrp", "lrp"):
        with pytest.raises(OptionError, match="no rules for their projectors and towers"):
            explainer.explain(chat, method=method)
    with pytest.raises(InputError, match="needs the model's processor"):
        Explainer(model).explain(chat)
    inputs = _inputs(processor, chat)
    with pytest.raises(InputError, match="explained with its image"):
        explainer.explain({k: v for k, v in inputs.items() if k != "pixel_values"})
    cut = dict(
        inputs, input_ids=inputs["input_ids"].masked_fill(inputs["input_ids"] == IMAGE_TOKEN_ID, 9)
    )
    with pytest.raises(InputError, match="no image token"):
        explainer.explain(cut)
    with pytest.raises(InputError, match="pixel_values"):
        explainer.explain(dict(inputs, pixel_values=inputs["pixel_values"].repeat(2, 1, 1, 1)))
    # The checks are read from the device at once; each refusal still says its own.
    pixels = inputs["pixel_values"].clone()
    pixels[0, 0, 0, 0] = float("nan")
    with pytest.raises(InputError, match=r"pixel values .* of samples 0 is not finite"):
        explainer.explain(dict(inputs, pixel_values=pixels))
    ids = inputs["input_ids"]
    first = int((ids[0] == IMAGE_TOKEN_ID).nonzero()[0])
    with pytest.raises(InputError, match="same number of images"):
        explainer.explain(
            dict(inputs, input_ids=ids.clone().index_fill_(1, torch.tensor([first]), 9))
        )


def test_a_given_generation_is_explained_as_it_is(model, processor):
    explainer = Explainer(model, tokenizer=processor)
    made = generate(explainer, _chat(processor, _photo(0), "w12"), max_new_tokens=2)
    assert isinstance(made, Generation) and "pixel_values" in made.extra
    if "token_type_ids" in made.extra:  # PaliGemma: the answer's tokens are of type 1
        types = made.extra["token_type_ids"]
        assert types.shape == made.input_ids.shape
        assert (types[:, made.prompt_length :] == 1).all()
    again = explain_generation(explainer, made)
    assert again.generation is made
    assert again.explanation.target.shape == made.generated.shape


@pytest.mark.parametrize("pad", [False, True])
def test_maps_go_back_onto_the_photo_with_resize_crop_and_padding_undone(pad):
    # The processor's own pixels, drawn back with the geometry, are the photo again where
    # the model saw it: a smooth ramp survives the resampling to within a few grey levels.
    import transformers as tf

    from explain.loading.preprocessing import photo_preprocessing

    kind = tf.LlavaImageProcessor if pad else tf.CLIPImageProcessor
    images = kind(
        size={"shortest_edge": 32},
        crop_size={"height": 32, "width": 32},
        image_mean=[0.0] * 3,
        image_std=[1.0] * 3,
        **({"do_pad": True, "background_color": (0, 0, 0)} if pad else {}),
    )
    rows, cols = np.meshgrid(np.linspace(0, 1, 48), np.linspace(0, 1, 80), indexing="ij")
    ramp = (np.stack([rows, cols, rows * 0 + 0.5], axis=-1) * 255).round().astype(np.uint8)
    pixels = images(images=ramp, return_tensors="pt")["pixel_values"][0].double()
    geometry = photo_preprocessing(images)
    back = geometry.to_original(pixels, (48, 80))
    _, (top, left) = geometry.placement((48, 80))
    if pad:  # the whole photo is seen, letterboxed (the longer side fits)
        assert top < 0 and left == 0
        inner = (slice(6, -6), slice(6, -6))  # the edges blend with the padding
    else:  # the centre square is seen, the sides cropped away
        assert top == 0 and left > 0
        inner = (slice(2, -2), slice(20, 60))
        lowest = back[:2].amin(dim=(-2, -1), keepdim=True)  # bicubic wobbles the flat channel
        assert (back[:2, :, :12] == lowest).all()
    expected = torch.from_numpy(ramp / 255.0).permute(2, 0, 1)
    torch.testing.assert_close(
        back[:, inner[0], inner[1]], expected[:, inner[0], inner[1]].float(), atol=0.04, rtol=0
    )  # 0.04: resampling, and the letterbox's offset rounded to whole resized pixels


def test_the_generate_page_and_figure(tmp_path, capsys):
    from PIL import Image

    from explain.cli import main
    from explain.testing.tiny_vlm import save_tiny_llava

    folder = save_tiny_llava(tmp_path / "llava")
    Image.fromarray(_photo(5, (48, 72))).save(tmp_path / "photo.png")
    page = tmp_path / "page.html"
    argv = ["generate", "--image", str(tmp_path / "photo.png"), "a&b <script> w13"]
    argv += ["--model", str(folder), "--max-new-tokens", "3", "--html", str(page)]
    assert main([*argv, "--depth", "tower"]) == 0
    out = capsys.readouterr().out
    crop, answer = out.splitlines()[:2]  # the 72x48 photo is centre-cropped to 48x48
    assert crop.startswith("The model saw only part of the photo: centre-cropped 72x48")
    assert answer.startswith("answer:") and str(page) in out
    text = page.read_text()
    assert "a&amp;b" in text and "&lt;script&gt;" in text and "[image]" in text
    assert text.count('class="word"') == 3 and "depth tower" in text
    assert page.with_suffix(".png").stat().st_size > 0
    assert main(["generate", "--depth", "tower", "w12", "--model", str(folder)]) == 2
    assert "--depth is for vision-language models" in capsys.readouterr().err


def _assert_the_fused_path_streams_as_the_explicit_path(model, processor, method, depth):
    """Two answers explained by `method` at `depth` on the fused path (streamed) equal
    those on the explicit path."""
    chats = _chats(processor, [(_photo(0), "w12 w13"), (_photo(1), "w20 w21")])
    made = generate(Explainer(model, tokenizer=processor), chats, max_new_tokens=3)
    results = {
        path: explain_generation(
            Explainer(model, attention_path=path), made, method=method, depth=depth
        ).explanation
        for path in ("explicit", "fused")
    }
    assert results["fused"].settings["attention_path"] == "streamed"
    for name in ("image", "text"):
        # float32's tolerance: the explicit path is transformers' eager attention, whose
        # softmax is float32 even in a float64 model (issue 37: llava-siglip's generic map
        # differed by 1.07e-5 relative on one CPU, past the rtol of 1e-5 it had)
        assert_float32_close(
            results["fused"].relevances[name], results["explicit"].relevances[name]
        )


@pytest.mark.parametrize("depth", ["lm", "tower"])
@pytest.mark.parametrize("method", ["generic", "rollout"])
def test_the_fused_path_streams_answers_as_the_explicit_path_folds_them(
    model, processor, method, depth
):
    # The fused path recomputes the blocks from q, k, v (explain.engine.fused): every answer
    # token's fold at once, without maps (explain.engine.spread: "streamed"), through the
    # language model's blocks and with depth "tower" on through the tower's, read out by
    # the first fold's rows at the image tokens. Llama's eager softmax is float32.
    _assert_the_fused_path_streams_as_the_explicit_path(model, processor, method, depth)


class _Shapes(TorchDispatchMode):
    """The shapes of every tensor an op produces while active."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: set[tuple[int, ...]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.shapes.update(tuple(t.shape) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


@pytest.mark.parametrize("family", ["llava-clip", "qwen2.5"])
@pytest.mark.parametrize("method", ["generic", "rollout"])
def test_the_fused_path_builds_no_map_of_a_tower_block(family, method):
    # Depth "tower" on the fused path: every answer token's fold through the tower, from
    # q, k, v and dO by chunks of rows (a small budget makes the chunks a few rows), so no
    # tensor has two dimensions of the tower's n tokens per image: no block's map, no
    # dense mask of Qwen2.5-VL's windows (folded piece by piece), no chunk of all rows.
    # The same call folding each column from whole maps does build them (the test can
    # fail), to the same numbers.
    from explain.engine.plans.image_text import ImageTextFold
    from explain.testing.tiny_vlm import PATCH_SIZE, tiny_qwen2_vl, tiny_qwen2_vl_processor

    if family == "qwen2.5":
        model, processor = tiny_qwen2_vl(version="2.5"), tiny_qwen2_vl_processor("2.5")
    else:
        model, processor = tiny_llava("clip"), tiny_llava_processor("clip")
    # Qwen2.5-VL: 2 x 10 patches (no size of the model's), windows of 12 and 8 tokens
    photo = _photo(0, (40, 160) if family == "qwen2.5" else (40, 60))
    made = generate(
        Explainer(model, tokenizer=processor), _chat(processor, photo, "w12"), max_new_tokens=3
    )
    if family == "qwen2.5":
        tokens = int(made.extra["image_grid_thw"][0].prod())
    else:  # the class token and the patches
        tokens = (model.config.vision_config.image_size // PATCH_SIZE) ** 2 + 1
    explainer = Explainer(model, attention_path="fused", memory_budget=1 << 12)
    maps, results = {}, {}
    for route in ("streamed", "whole maps"):
        with contextlib.ExitStack() as stack:
            if route == "whole maps":
                stack.enter_context(mock.patch.object(ImageTextFold, "spread", None))
            seen = stack.enter_context(_Shapes())
            found = explain_generation(explainer, made, method=method, depth="tower")
        maps[route] = {shape for shape in seen.shapes if shape.count(tokens) >= 2}
        results[route] = found.explanation
    assert results["streamed"].settings["attention_path"] == "streamed"
    assert maps["streamed"] == set()
    assert maps["whole maps"]
    for name in ("image", "text"):
        assert results["streamed"].relevances[name].abs().sum() > 0
        torch.testing.assert_close(  # float32, folded in other orders
            results["streamed"].relevances[name],
            results["whole maps"].relevances[name],
            rtol=1e-4,
            atol=1e-6,
        )


def _gemma3_prompts(lengths):
    """Gemma 3's processor output for texts of `lengths` words, written by hand (the tiny
    tokenizer has no Gemma 3 processor): "<s> BOI <image> x 4 EOI words", left-padded,
    token type 1 at the image tokens."""
    generator = torch.Generator().manual_seed(3)
    width = 7 + max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, count in enumerate(lengths):
        words = torch.randint(5, 40, (count,), generator=generator)
        head = torch.tensor([1, BOI_TOKEN_ID, *[IMAGE_TOKEN_ID] * 4, EOI_TOKEN_ID])
        ids[row, width - 7 - count :] = torch.cat([head, words])
    mask = (torch.arange(width)[None] >= width - 7 - torch.tensor(lengths)[:, None]).long()
    pixels = torch.randn(len(lengths), 3, 32, 32, generator=generator, dtype=torch.float64)
    types = (ids == IMAGE_TOKEN_ID).long()
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "pixel_values": pixels,
        "token_type_ids": types,
    }


@pytest.mark.parametrize("depth", ["lm", "tower"])
def test_gemma3_pooled_image_tokens_go_back_over_their_patches(depth):
    model = tiny_gemma3().double()
    # the explicit path: the reference reads the eager maps, whose softmax transformers
    # computes in float32 (the streamed path, auto's for an answer, is 1e-7 from them)
    explainer = Explainer(model, attention_path="explicit")
    # next token (one prompt: float64 rows must not be left-padded, see above)
    one = _gemma3_prompts((3,))
    result = explainer.explain(one, method="generic", depth=depth)
    assert result.relevances["image"].shape == (1, 4, 4)  # the tower's grid, not the 2 x 2
    image, text = reference(model, one, one["input_ids"].shape[1] - 1, int(result.target[0]), depth)
    torch.testing.assert_close(result.relevances["image"][0], image[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(result.relevances["text"][0], text, rtol=1e-9, atol=1e-12)
    # an answer: every generated token against the rule on its prefix
    answer = explain_generation(explainer, one, max_new_tokens=3, method="generic", depth=depth)
    generation = answer.generation
    assert (generation.extra["token_type_ids"][:, generation.prompt_length :] == 0).all()
    for step in range(int(generation.generated[0].sum())):
        end = generation.prompt_length + step
        prefix = {name: value[:, :end] for name, value in generation.inputs().items()}
        prefix["pixel_values"] = one["pixel_values"]
        token = int(generation.input_ids[0, end])
        image, text = reference(model, prefix, end - 1, token, depth)
        got = answer.explanation.relevances
        torch.testing.assert_close(got["image"][0, step], image[0], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(got["text"][0, step, :end], text, rtol=1e-9, atol=1e-12)


def test_a_hub_id_loads_the_model_with_its_processor(tmp_path, monkeypatch):
    # The hub's own loading path, offline: a cache laid out as downloads leave it.
    import huggingface_hub

    from explain.loading.specs import load_model
    from explain.testing import cache_hub_repo
    from explain.testing.tiny_vlm import save_tiny_llava

    cache = tmp_path / "cache"
    cache_hub_repo(cache, "llava-hf/llava-1.5-7b-hf", save_tiny_llava(tmp_path / "llava"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = load_model("llava-hf/llava-1.5-7b-hf")
    assert loaded.modality == "vision_language" and loaded.preprocessing is not None
    explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
    result = explainer.explain({"image": _photo(0), "text": "w12 w13"}, depth="tower")
    assert result.relevances["image"].shape == (1, 4, 4)


@pytest.mark.parametrize("path", ["explicit", "fused"])
def test_start_layers_per_set_choose_the_blocks_of_each_fold(model, processor, path):
    # start_layer {"text": s, "image": s}: each fold from its own block; the fused path
    # streams every block, those before a start included, and must skip them alike.
    chat = _chat(processor, _photo(0), "w12 w13")
    explainer = Explainer(model, tokenizer=processor, attention_path=path)
    for method in ("generic", "rollout"):
        late = explainer.explain(
            chat, method=method, depth="tower", start_layer={"text": 2, "image": 1}
        )
        full = explainer.explain(chat, method=method, depth="tower")
        assert not torch.allclose(late.relevances["image"], full.relevances["image"])
        both = explainer.explain(chat, method=method, depth="tower", start_layer=1)
        named = {"text": 1, "image": 1}
        again = explainer.explain(chat, method=method, depth="tower", start_layer=named)
        torch.testing.assert_close(both.relevances["image"], again.relevances["image"])


# -- Qwen2-VL: merged 2 x 2 image tokens, multimodal rotary positions, depth "lm" -------------


@pytest.fixture(scope="module", params=["2", "2.5"])
def qwen_version(request):
    return request.param


@pytest.fixture(scope="module")
def qwen2_vl(qwen_version):
    """Qwen2-VL ("2") or Qwen2.5-VL ("2.5", its windowed tower does not change depth "lm")."""
    from explain.testing.tiny_vlm import tiny_qwen2_vl, tiny_qwen2_vl_processor

    return tiny_qwen2_vl(version=qwen_version).double(), tiny_qwen2_vl_processor(qwen_version)


def _qwen_tower_order(grid, window):
    """For one image of `grid` patches: the patch (row-major) at each of the tower's token
    positions, and its windows' sizes, written out: windows of `window` x `window` merged
    2 x 2 blocks row-major over the merged grid (smaller at its right and bottom edges),
    the blocks row-major inside a window, the 4 patches row-major inside a block."""
    rows, cols = grid[0] // 2, grid[1] // 2
    order, sizes = [], []
    for top in range(0, rows, window):
        for left in range(0, cols, window):
            size = len(order)
            for row in range(top, min(top + window, rows)):
                for col in range(left, min(left + window, cols)):
                    order += [
                        (2 * row + dr) * grid[1] + 2 * col + dc for dr in (0, 1) for dc in (0, 1)
                    ]
            sizes.append(len(order) - size)
    return torch.tensor(order), sizes


def _qwen_tower_layout(model, grid):
    """`_qwen_tower_order` of one image of `grid` patches in `model`'s tower: Qwen2.5-VL's
    windows of `window_size` pixels, Qwen2-VL's one window, the image."""
    vision = model.config.vision_config
    whole = max(grid) // 2
    window = (
        vision.window_size // vision.patch_size // 2 if hasattr(vision, "window_size") else whole
    )
    return _qwen_tower_order(grid, window)


def _qwen_tower_pieces(model, one):
    """The eager model's forward on `one` with the tower's attention function replaced by
    the test's own float64 one, which keeps every piece's probabilities: (output, the
    pieces of each tower block in call order)."""
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    modeling = sys.modules[type(model).__module__]
    original = modeling.eager_attention_forward
    blocks = list(eager.model.visual.blocks)
    pieces = [[] for _ in blocks]

    def attend(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        if module not in [block.attn for block in blocks]:  # the language model: eager
            return original(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
        assert attention_mask is None
        weights = (query @ key.transpose(2, 3) * scaling).softmax(dim=-1)
        pieces[[block.attn for block in blocks].index(module)].append(weights)
        return (weights @ value).transpose(1, 2), weights

    with mock.patch.object(modeling, "eager_attention_forward", attend):
        out = eager(**one, output_attentions=True, use_cache=False)
    return out, pieces


def _qwen2_vl_reference(model, one, position, target, method="generic", depth="lm"):
    """One text: (image maps (k, gh, gw), text (T,)) for `target` read out at `position`,
    from the eager model's own forward (its rotary positions, its merger) with
    `output_attentions`, autograd, and the rule written out; each merged token's relevance
    spread by hand over its 2 x 2 patches, and with depth "tower" folded through the
    tower's blocks from their pieces (`_qwen_tower_pieces`), in the tower's order."""
    out, pieces = _qwen_tower_pieces(model, one)
    maps = list(out.attentions)
    flat = [piece for block in pieces for piece in block]
    grads = torch.autograd.grad(out.logits[0, position, target], maps + flat)
    ids, mask = one["input_ids"], one["attention_mask"]
    length = ids.shape[1]
    readout = torch.zeros(length, dtype=torch.float64)
    readout[position] = 1.0
    text_grads = grads[: len(maps)]
    if method == "generic":
        text = _generic([a[0] for a in maps], [g[0] for g in text_grads], readout)
    else:
        text = _rollout([a[0] for a in maps], readout)
    text = text * ((torch.arange(length) <= position) & mask[0].bool())
    is_image = ids[0] == IMAGE_TOKEN_ID
    images, gh, gw = len(one["image_grid_thw"]), *one["image_grid_thw"][0, 1:].tolist()
    merged = text[is_image].reshape(images, gh // 2, gw // 2) / 4
    if depth == "lm":
        grid = merged.repeat_interleave(2, 1).repeat_interleave(2, 2)
        return grid, text.masked_fill(is_image, 0.0)
    order, windows = _qwen_tower_layout(model, (gh, gw))
    n = gh * gw
    piece_grads = iter(grads[len(maps) :])
    per_block = []  # per block: (A, G) of every image (H, n, n), zero across pieces
    for block in pieces:
        gradients = [next(piece_grads) for _ in block]
        per_image = len(block) // images
        sizes = [piece.shape[-1] for piece in block[:per_image]]
        assert sizes in ([n], windows), sizes  # the whole image, or the windows written out
        whole_maps = []
        for image in range(images):
            chosen = range(image * per_image, (image + 1) * per_image)
            a = torch.zeros(block[0].shape[1], n, n, dtype=torch.float64)
            g = torch.zeros_like(a)
            start = 0
            for index in chosen:
                size = block[index].shape[-1]
                a[:, start : start + size, start : start + size] = block[index][0]
                g[:, start : start + size, start : start + size] = gradients[index][0]
                start += size
            whole_maps.append((a, g))
        per_block.append(whole_maps)
    # the readout over the tower's tokens: each patch's merged block's relevance (1/4 each)
    rows, cols = order // gw, order % gw
    blocks = (rows // 2) * (gw // 2) + cols // 2
    result = torch.zeros(images, n, dtype=torch.float64)
    for image in range(images):
        row = merged[image].flatten()[blocks]
        maps_i = [block[image][0] for block in per_block]
        if method == "generic":
            folded = _generic(maps_i, [block[image][1] for block in per_block], row)
        else:
            folded = _rollout(maps_i, row)
        result[image, order] = folded
    return result.reshape(images, gh, gw), text.masked_fill(is_image, 0.0)


def _qwen2_vl_inputs(processor, pairs):
    encoded = encode_image_prompt(_chats(processor, pairs), processor)
    encoded["pixel_values"] = encoded["pixel_values"].double()
    return dict(encoded)


@pytest.mark.parametrize("depth", ["lm", "tower"])
@pytest.mark.parametrize("method", ["generic", "rollout"])
def test_qwen2_vl_next_token_equals_the_written_out_rule(qwen2_vl, method, depth):
    model, processor = qwen2_vl
    inputs = _qwen2_vl_inputs(processor, [(_photo(0), "w12 w13 w14")])
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 8]]  # 40 x 60 -> 32 x 64 pixels
    result = Explainer(model).explain(inputs, method=method, depth=depth)
    assert result.settings["depth"] == depth  # with the attention path and memory budget
    assert result.relevances["image"].shape == (1, 4, 8)
    image, text = _qwen2_vl_reference(
        model, inputs, inputs["input_ids"].shape[1] - 1, int(result.target[0]), method, depth
    )
    torch.testing.assert_close(result.relevances["image"][0], image[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(result.relevances["text"][0], text, rtol=1e-9, atol=1e-12)


def _assert_each_answer_token_equals_the_rule(answer, prefix, reference, loose=False):
    """Each generated token's maps equal `reference(one, position, token)`, the rule written
    out on its prefix `one = prefix(row, end)` (prompts of one length: no padding), to
    1e-9; `loose` (a part computed in float32 whatever the model's dtype): as float32
    keeps, with 1e-5 of each map's largest value."""
    generation, result = answer.generation, answer.explanation
    batch, steps = generation.generated.shape
    width = generation.prompt_length
    for row in range(batch):
        for step in range(steps):
            if not generation.generated[row, step]:
                continue
            end = width + step
            token = int(generation.input_ids[row, end])
            assert int(result.target[row, step]) == token
            image, text = reference(prefix(row, end), end - 1, token)
            got = result.relevances
            pairs = ((got["image"][row, step], image[0]), (got["text"][row, step, :end], text))
            for found, expected in pairs:
                if loose:
                    assert_float32_close(found, expected, of_scale=1e-5)
                else:
                    torch.testing.assert_close(found, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("depth", ["lm", "tower"])
def test_qwen2_vl_each_generated_token_equals_the_rule_on_its_prefix(qwen2_vl, depth):
    model, processor = qwen2_vl
    # The explicit path: the rule below reads the eager maps, whose softmax transformers
    # runs in float32; "auto" streams a generation's columns from maps recomputed in float64.
    explainer = Explainer(model, tokenizer=processor, attention_path="explicit")
    chats = _chats(processor, [(_photo(0), "w12 w13 w14 w15"), (_photo(1), "w20 w21 w22 w23")])
    answer = explain_generation(explainer, chats, max_new_tokens=3, method="generic", depth=depth)
    generation, result = answer.generation, answer.explanation
    batch, steps = generation.generated.shape
    assert result.relevances["image"].shape == (batch, steps, 4, 8)
    types = generation.extra["mm_token_type_ids"]
    assert types.shape == generation.input_ids.shape
    assert (types[:, generation.prompt_length :] == 0).all()  # the answer is text

    def prefix(row, end):
        return {
            "input_ids": generation.input_ids[row : row + 1, :end],
            "attention_mask": generation.attention_mask[row : row + 1, :end],
            "mm_token_type_ids": types[row : row + 1, :end],
            "pixel_values": generation.extra["pixel_values"].reshape(batch, -1, 384)[row],
            "image_grid_thw": generation.extra["image_grid_thw"][row : row + 1],
        }

    def rule(one, position, token):
        return _qwen2_vl_reference(model, one, position, token, depth=depth)

    _assert_each_answer_token_equals_the_rule(answer, prefix, rule)


@pytest.mark.parametrize("depth", ["lm", "tower"])
@pytest.mark.parametrize("answer", [False, True])
def test_qwen2_vl_a_left_padded_batch_equals_each_prompt_alone(qwen_version, answer, depth):
    from explain.testing.tiny_vlm import tiny_qwen2_vl, tiny_qwen2_vl_processor

    model = tiny_qwen2_vl(version=qwen_version)  # float32, see above
    processor = tiny_qwen2_vl_processor(qwen_version)
    _assert_a_left_padded_batch_equals_each_prompt_alone(model, processor, depth, answer)


def test_qwen2_vl_rotary_positions_are_the_models_own(qwen2_vl):
    """The multimodal rotary positions, computed for all texts at once without reading
    the device, equal transformers' `get_rope_index`: left padding (0 there), text before,
    between and after two images, and a text with one image beside it."""
    model, processor = qwen2_vl
    two = [
        {"type": "text", "text": "w12 w13 w14"},
        {"type": "image", "image": _photo(1)},
        {"type": "text", "text": "w15"},
        {"type": "image", "image": _photo(2)},
    ]
    one = [
        {"type": "image", "image": _photo(0)},
        {"type": "text", "text": "w12"},
        {"type": "image", "image": _photo(3)},
    ]
    chats = [[{"role": "user", "content": two}], [{"role": "user", "content": one}]]
    prepared = Explainer(model).adapter.prepare(dict(encode_image_prompt(chats, processor)))
    arguments = prepared.arguments
    assert not arguments["attention_mask"].bool().all()  # one of them is left-padded
    expected, _ = model.model.get_rope_index(
        arguments["input_ids"],
        mm_token_type_ids=arguments["mm_token_type_ids"],
        image_grid_thw=arguments["image_grid_thw"],
        attention_mask=arguments["attention_mask"],
    )
    assert torch.equal(arguments["position_ids"], expected)


def test_qwen2_vl_two_images_in_one_prompt_get_one_map_each(qwen2_vl):
    model, processor = qwen2_vl
    chat = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": _photo(0)},
                {"type": "text", "text": "w12"},
                {"type": "image", "image": _photo(1)},
                {"type": "text", "text": "w13"},
            ],
        }
    ]
    explainer = Explainer(model, tokenizer=processor)
    inputs = dict(explainer.adapter.encode(chat, processor))
    inputs["pixel_values"] = inputs["pixel_values"].double()
    for depth in ("lm", "tower"):
        result = explainer.explain(inputs, method="generic", depth=depth)
        assert result.relevances["image"].shape == (1, 2, 4, 8)
        position, target = inputs["input_ids"].shape[1] - 1, int(result.target[0])
        image, _ = _qwen2_vl_reference(model, inputs, position, target, depth=depth)
        torch.testing.assert_close(result.relevances["image"][0], image, rtol=1e-9, atol=1e-12)


def test_qwen2_vl_no_side_effects_and_what_is_refused_says_why(qwen2_vl):
    from transformers import AttentionInterface

    from explain.architectures.hf_attention_probe import IMPLEMENTATION

    model, processor = qwen2_vl
    chat = _chat(processor, _photo(0), "w12")
    before, deltas = ModelState.capture(model), model.model.rope_deltas
    for path in ("explicit", "fused"):
        explainer = Explainer(model, tokenizer=processor, attention_path=path)
        for depth in ("lm", "tower"):
            explain_generation(explainer, chat, max_new_tokens=2, depth=depth)
            explainer.explain(chat, method="rollout", depth=depth)
            with pytest.raises(ExplainError):
                explainer.explain(chat, target=10**6, depth=depth)
    # hooks, modes, flags (the tower's attention implementation), RNG, grads as found
    assert before.differences(ModelState.capture(model)) == []
    assert model.model.rope_deltas is deltas  # not left cached by generate, nor explain
    assert IMPLEMENTATION not in AttentionInterface._global_mapping  # registered per call
    with pytest.raises(OptionError, match=r"depth='tower'.*reads one fixed block"):
        explainer.explain(chat, method="raw_attention", depth="tower")
    inputs = _qwen2_vl_inputs(processor, [(_photo(0), "w12")])
    with pytest.raises(InputError, match="image_grid_thw"):
        explainer.explain({k: v for k, v in inputs.items() if k != "image_grid_thw"})
    with pytest.raises(InputError, match="flattened patches"):
        explainer.explain(dict(inputs, pixel_values=inputs["pixel_values"][:, :10]))
    with pytest.raises(InputError, match="patches but image_grid_thw"):
        explainer.explain(dict(inputs, pixel_values=inputs["pixel_values"][:-4]))


def _ramp(height: int, width: int) -> np.ndarray:
    """A smooth photo: red down, green across."""
    rows, cols = np.meshgrid(np.linspace(0, 1, height), np.linspace(0, 1, width), indexing="ij")
    return (np.stack([rows, cols, rows * 0 + 0.5], axis=-1) * 255).round().astype(np.uint8)


def test_qwen2_vl_a_grid_with_height_and_width_swapped_is_refused(qwen2_vl):
    """As many patches either way, but the patches of a photo join up only one way (issue
    37: the map came back 8 x 4 over patches laid out 4 x 8; issue 46: still so for a grid
    one merged block high or wide, 2 x 12 or 8 x 2)."""
    model, processor = qwen2_vl
    explainer = Explainer(model)
    grids = [((48, 80), (4, 6)), ((80, 48), (6, 4)), ((20, 90), (2, 12)), ((100, 40), (8, 2))]
    for (height, width), (gh, gw) in grids:
        photo = _ramp(height, width)
        inputs = _qwen2_vl_inputs(processor, [(photo, "w12"), (photo[::-1], "w13")])
        assert inputs["image_grid_thw"].tolist() == [[1, gh, gw]] * 2
        assert explainer.explain(inputs).relevances["image"].shape == (2, gh, gw)
        swapped = inputs["image_grid_thw"][:, [0, 2, 1]]
        with pytest.raises(InputError, match=rf"is {gw} x {gh} patches .* join up as {gh} x {gw}"):
            explainer.explain(dict(inputs, image_grid_thw=swapped))


def test_qwen2_vl_maps_go_back_onto_the_whole_photo():
    # Qwen2-VL resizes a 48 x 80 photo to 32 x 48 (whole 16-pixel blocks within its most
    # pixels, the aspect squashed a little, nothing cropped):
    # its own patches, put back in place and drawn back with the geometry, are the photo.
    from explain.loading.preprocessing import photo_preprocessing
    from explain.testing.tiny_vlm import tiny_qwen2_vl_processor

    images = tiny_qwen2_vl_processor().image_processor
    images.image_mean, images.image_std = [0.0] * 3, [1.0] * 3
    rows, cols = np.meshgrid(np.linspace(0, 1, 48), np.linspace(0, 1, 80), indexing="ij")
    ramp = (np.stack([rows, cols, rows * 0 + 0.5], axis=-1) * 255).round().astype(np.uint8)
    out = images(images=ramp, return_tensors="pt")
    _, gh, gw = out["image_grid_thw"][0].tolist()
    assert (gh, gw) == (4, 6)
    # (block row, block col, row in block, col in block, channel, frame, pixel row, col)
    patches = out["pixel_values"].reshape(gh // 2, gw // 2, 2, 2, 3, 2, 8, 8)[:, :, :, :, :, 0]
    pixels = patches.permute(4, 0, 2, 5, 1, 3, 6).reshape(3, gh * 8, gw * 8).double()
    back = photo_preprocessing(images).to_original(pixels, (48, 80))
    expected = torch.from_numpy(ramp / 255.0).permute(2, 0, 1).float()
    torch.testing.assert_close(back[:, 2:-2, 2:-2], expected[:, 2:-2, 2:-2], atol=0.04, rtol=0)


def _load_saved(tmp_path, model, processor):
    """The folder `model` and `processor` are saved in, after checking it loads as a
    vision-language model that maps onto the whole photo."""
    from explain.loading.specs import load_model

    folder = tmp_path / "saved"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    loaded = load_model(str(folder))
    assert loaded.modality == "vision_language" and loaded.preprocessing is not None
    assert loaded.preprocessing.fit == "exact"
    return folder


def _draw_generate_page(tmp_path, folder, *options) -> str:
    """The page `explain generate` draws for a photo and "w12 w13" with `folder`'s model."""
    from PIL import Image

    from explain.cli import main

    Image.fromarray(_photo(5, (48, 72))).save(tmp_path / "photo.png")
    page = tmp_path / "page.html"
    argv = ["generate", "--image", str(tmp_path / "photo.png"), "w12 w13", "--model"]
    argv += [str(folder), "--max-new-tokens", "2", *options, "--html", str(page)]
    assert main(argv) == 0
    return page.read_text()


def test_qwen2_vl_loads_from_a_folder_and_draws_the_generate_page(tmp_path, capsys):
    from explain.testing.tiny_vlm import tiny_qwen2_vl, tiny_qwen2_vl_processor

    # the whole photo, resized per photo
    folder = _load_saved(tmp_path, tiny_qwen2_vl(), tiny_qwen2_vl_processor())
    text = _draw_generate_page(tmp_path, folder)
    assert str(tmp_path / "page.html") in capsys.readouterr().out
    assert text.count('class="word"') == 2 and "depth lm" in text
    assert "depth tower" in _draw_generate_page(tmp_path, folder, "--depth", "tower")


def test_qwen2_vl_tiny_towers_run_what_matters():
    # Qwen2-VL's tower attends over each image; Qwen2.5-VL's first block within windows,
    # the edge one smaller than the full one, and its second over each image.
    from explain.testing.tiny_vlm import tiny_qwen2_vl, tiny_qwen2_vl_processor

    for version, expected in (("2", [[32, 32], [32, 32]]), ("2.5", [[24, 8, 24, 8], [32, 32]])):
        model = tiny_qwen2_vl(version=version).double()
        inputs = _qwen2_vl_inputs(
            tiny_qwen2_vl_processor(version), [(_photo(0), "w12"), (_photo(1), "w13")]
        )
        _, pieces = _qwen_tower_pieces(model, inputs)
        assert [[piece.shape[-1] for piece in block] for block in pieces] == expected


@pytest.mark.parametrize("method", ["generic", "rollout"])
def test_qwen2_vl_the_fused_path_folds_the_tower_as_the_explicit_path(qwen2_vl, method):
    # The explicit path folds the packed tower's dense maps made from its pieces and the
    # language model's eager maps; the fused path streams both, Qwen2.5-VL's windows
    # piece by piece.
    model, processor = qwen2_vl
    _assert_the_fused_path_streams_as_the_explicit_path(model, processor, method, "tower")


def test_qwen2_vl_the_automatic_path_counts_the_towers_own_maps(qwen2_vl):
    # The tower's maps are n x n per image and head over its patches (32), more than the
    # text's over its tokens: a budget that the text's maps alone would fit is too small
    # for the explicit path, which the automatic path then leaves for the streamed one.
    from explain.engine.fused import explicit_map_bytes

    model, processor = qwen2_vl
    inputs = _qwen2_vl_inputs(processor, [(_photo(0), "w12")])
    adapter = Explainer(model).adapter
    prepared = adapter.prepare(inputs)
    tokens = prepared.layout.num_tokens
    assert tokens < 32
    maps = adapter.attention_maps(prepared)
    # (blocks, images or texts x heads, tokens): the tower's 2 blocks of 2 heads over one
    # image, the language model's 3 blocks of 4 heads over one text
    assert maps == [(2, 1 * 2, 32), (3, 1 * 4, tokens)]
    kept = (2 * 2 * 32**2 + 3 * 4 * tokens**2) * 8  # float64, and the largest block's dA:
    needed = kept + 2 * 32**2 * (8 + 8)
    assert explicit_map_bytes(adapter, prepared.layout, 1, True, maps) == needed
    text_only = explicit_map_bytes(adapter, prepared.layout, 1, True)
    assert text_only < needed
    paths = {}
    for budget in (text_only, needed):
        result = Explainer(model, memory_budget=budget).explain(
            inputs, method="generic", depth="tower"
        )
        paths[budget] = result.settings["attention_path"]
    assert list(paths.values()) == ["streamed", "explicit"]


def test_qwen2_vl_tower_maps_are_recomputed_only_when_folded(qwen2_vl):
    # The tower's maps are no tensor of the model: at depth "lm" no rule reads them, and
    # none is recomputed from q, k (a real photo's are thousands of tokens square).
    from explain.engine.fused import FusedBlock

    model, processor = qwen2_vl
    inputs = _qwen2_vl_inputs(processor, [(_photo(0), "w12")])
    explainer = Explainer(model, attention_path="explicit")
    for depth, expected in (("lm", 0), ("tower", 2)):
        with mock.patch.object(
            FusedBlock, "probabilities", autospec=True, side_effect=FusedBlock.probabilities
        ) as recomputed:
            explainer.explain(inputs, method="rollout", depth=depth)
        assert recomputed.call_count == expected


def test_qwen2_vl_a_tower_not_seen_through_the_attention_interface_is_refused(qwen2_vl):
    # Code that picks the attention function itself bypasses the probing wrapper: said,
    # and the model is left as found.
    model, processor = qwen2_vl
    inputs = _qwen2_vl_inputs(processor, [(_photo(0), "w12")])
    modeling = sys.modules[type(model).__module__]
    before = ModelState.capture(model)
    with (
        mock.patch.object(
            modeling.ALL_ATTENTION_FUNCTIONS, "get_interface", lambda name, default: default
        ),
        pytest.raises(ExplainError, match=r"not seen.*attention interface"),
    ):
        Explainer(model, attention_path="explicit").explain(inputs)
    assert before.differences(ModelState.capture(model)) == []


# -- Idefics3 and SmolVLM: photos split into tiles and a global image, pixel shuffle ----------


@pytest.fixture(scope="module", params=["idefics3", "smolvlm"])
def idefics_kind(request):
    return request.param


@pytest.fixture(scope="module")
def idefics3(idefics_kind):
    """Idefics3 (8-pixel patches, shuffled 2 x 2) or SmolVLM (4-pixel patches, shuffled
    4 x 4) in float64, with its processor (32-pixel tiles; a 40 x 60 photo: 2 x 3 tiles)."""
    from explain.testing.tiny_vlm import tiny_idefics3, tiny_idefics3_processor

    return tiny_idefics3(kind=idefics_kind).double(), tiny_idefics3_processor(idefics_kind)


def _tile_patches(model) -> tuple[int, int]:
    """(g, s): a tile's patches per side, and the pixel shuffle's scale."""
    vision = model.config.vision_config
    return vision.image_size // vision.patch_size, model.config.scale_factor


def _idefics3_reference(model, one, position, target, depth, method="generic"):
    """One text: (maps (k, rows * g, cols * g), text (T,)) for `target` read out at
    `position`: the eager tower's maps and the language model's on its features put in
    place by hand, autograd, the rule written out; each image token's relevance spread
    over the s x s patches the pixel shuffle made it of, the tiles laid side by side on the
    photo, and each global patch shared out over the rows x cols cells it covers."""
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    ids, mask = one["input_ids"], one["attention_mask"]
    pixels = one["pixel_values"].clone().requires_grad_(True)  # (1, images, 3, t, t)
    image = eager.model.get_image_features(pixel_values=pixels, output_attentions=True)
    features = torch.cat(list(image.pooler_output))
    embeddings = eager.get_input_embeddings()(ids).clone()
    is_image = ids[0] == IMAGE_TOKEN_ID
    embeddings[0, is_image] = features.reshape(-1, embeddings.shape[-1])
    out = eager(
        inputs_embeds=embeddings,
        attention_mask=mask,
        position_ids=(mask.cumsum(dim=1) - 1).clamp(min=0),
        output_attentions=True,
        use_cache=False,
    )
    text_maps, tower_maps = list(out.attentions), list(image.attentions)
    grads = torch.autograd.grad(out.logits[0, position, target], text_maps + tower_maps)
    text_grads, tower_grads = grads[: len(text_maps)], grads[len(text_maps) :]
    length = ids.shape[1]
    readout = torch.zeros(length, dtype=torch.float64)
    readout[position] = 1.0
    if method == "generic":
        text = _generic([a[0] for a in text_maps], [g[0] for g in text_grads], readout)
    else:
        text = _rollout([a[0] for a in text_maps], readout)
    text = text * ((torch.arange(length) <= position) & mask[0].bool())
    g, s = _tile_patches(model)
    images = pixels.shape[1]
    tokens = text[is_image].reshape(images, g // s, g // s)
    patches = torch.zeros(images, g, g, dtype=torch.float64)
    for row in range(g // s):  # image token (row, col) is made of these s x s patches
        for col in range(g // s):
            block = tokens[:, row, col, None, None] / s**2
            patches[:, row * s : (row + 1) * s, col * s : (col + 1) * s] = block
    if depth == "tower":
        rows = []
        for index in range(images):
            maps = [a[index] for a in tower_maps]
            flat = patches[index].flatten()
            if method == "generic":
                rows.append(_generic(maps, [g_[index] for g_ in tower_grads], flat))
            else:
                rows.append(_rollout(maps, flat))
        patches = torch.stack(rows).reshape(images, g, g)
    return _idefics3_photos(patches, one), text.masked_fill(is_image, 0.0)


def _idefics3_photos(patches, one):
    """The maps (images, g, g) of the tower's images (each photo's tiles, then its global
    image) put together on the photos of `one` (its `rows` and `cols`): (photos, rows * g,
    cols * g), the tiles side by side and each global patch shared out over the rows x
    cols cells it covers; a photo not split is its global image alone."""
    rows, cols = int(one["rows"][0][0]), int(one["cols"][0][0])
    if not rows:
        return patches
    images, g = patches.shape[0], patches.shape[-1]
    photos = []
    for first in range(0, images, rows * cols + 1):
        photo = torch.zeros(rows * g, cols * g, dtype=torch.float64)
        for row in range(rows):
            for col in range(cols):
                tile = patches[first + row * cols + col]
                photo[row * g : (row + 1) * g, col * g : (col + 1) * g] = tile
        whole = patches[first + rows * cols]
        cell_rows, cell_cols = torch.arange(rows * g) // rows, torch.arange(cols * g) // cols
        photos.append(photo + whole[cell_rows][:, cell_cols] / (rows * cols))
    return torch.stack(photos)


def _idefics3_inputs(processor, prompt, photos):
    """The processor's output for `prompt` with the tile layout of `photos` (per text, its
    photos) from the image processor itself (return_row_col_info=True), as a user without
    a tokenizer gives it."""
    encoded = dict(encode_image_prompt(prompt, processor))
    layout = processor.image_processor(images=photos, return_row_col_info=True)
    encoded["rows"], encoded["cols"] = layout["rows"], layout["cols"]
    encoded["pixel_values"] = encoded["pixel_values"].double()
    return encoded


def test_idefics3_pixel_shuffle_makes_each_token_of_a_block_of_patches(idefics3):
    # The model's own pixel shuffle on one-hot patch features: each image token's features
    # say which patches it was made of, the s x s block at (row * s, col * s), raster order.
    model, _ = idefics3
    g, s = _tile_patches(model)
    one_hot = torch.eye(g * g, dtype=torch.float64)[None]  # patch p's features: e_p
    shuffled = model.model.connector.pixel_shuffle(one_hot, s)[0]
    made_of = shuffled.reshape((g // s) ** 2, s * s, g * g).sum(dim=1).reshape(-1, g, g)
    for token, patches in enumerate(made_of):
        row, col = divmod(token, g // s)
        expected = torch.zeros(g, g, dtype=torch.float64)
        expected[row * s : (row + 1) * s, col * s : (col + 1) * s] = 1.0
        assert torch.equal(patches, expected)
    adapter = Explainer(model).adapter
    side = model.config.vision_config.image_size
    arguments = {"pixel_values": torch.zeros(1, 1, 3, side, side), "rows": torch.zeros(1, 1)}
    tokens = adapter.image_tokens({**arguments, "cols": torch.zeros(1, 1)})
    made_from = [patches.flatten().nonzero().flatten() for patches in made_of]
    assert torch.equal(tokens.sources, torch.stack(made_from))


@pytest.mark.parametrize("depth", ["lm", "tower"])
@pytest.mark.parametrize("method", ["generic", "rollout"])
def test_idefics3_next_token_equals_the_written_out_rule(idefics3, depth, method):
    model, processor = idefics3
    inputs = _idefics3_inputs(processor, _chat(processor, _photo(0), "w12 w13 w14"), [[_photo(0)]])
    assert (inputs["rows"], inputs["cols"]) == ([[2]], [[3]])  # 40 x 60 -> 64 x 96 pixels
    assert inputs["pixel_values"].shape[:2] == (1, 7)  # 6 tiles and the global image
    result = Explainer(model).explain(inputs, method=method, depth=depth)
    assert result.settings["depth"] == depth
    g, _ = _tile_patches(model)
    assert result.relevances["image"].shape == (1, 2 * g, 3 * g)
    image, text = _idefics3_reference(
        model, inputs, inputs["input_ids"].shape[1] - 1, int(result.target[0]), depth, method
    )
    torch.testing.assert_close(result.relevances["image"][0], image[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(result.relevances["text"][0], text, rtol=1e-9, atol=1e-12)
    if (depth, method) == ("lm", "generic"):  # the merges, tiles and global image conserve it
        at_images = result.relevances["image"].sum()
        torch.testing.assert_close(at_images, _lm_relevance_at_images(model, inputs, result))


def _lm_relevance_at_images(model, inputs, result):
    """The language model's relevance summed over the image tokens (depth "lm", reference)."""
    position = inputs["input_ids"].shape[1] - 1
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    is_image = inputs["input_ids"][0] == IMAGE_TOKEN_ID
    out = eager(
        **{k: v for k, v in inputs.items() if k not in ("rows", "cols")},
        output_attentions=True,
        use_cache=False,
    )
    maps = list(out.attentions)
    grads = torch.autograd.grad(out.logits[0, position, int(result.target[0])], maps)
    readout = torch.zeros(is_image.shape[0], dtype=torch.float64)
    readout[position] = 1.0
    return _generic([a[0] for a in maps], [g[0] for g in grads], readout)[is_image].sum()


@pytest.mark.parametrize("depth", ["lm", "tower"])
def test_idefics3_each_generated_token_equals_the_rule_on_its_prefix(idefics3, depth):
    model, processor = idefics3
    # The explicit path: the rule below reads the eager maps, whose softmax transformers
    # runs in float32; "auto" streams a generation's columns from maps recomputed in float64.
    explainer = Explainer(model, tokenizer=processor, attention_path="explicit")
    chats = _chats(processor, [(_photo(0), "w12 w13 w14 w15"), (_photo(1), "w20 w21 w22 w23")])
    answer = explain_generation(explainer, chats, max_new_tokens=3, method="generic", depth=depth)
    generation, result = answer.generation, answer.explanation
    batch, steps = generation.generated.shape
    g, _ = _tile_patches(model)
    assert result.relevances["image"].shape == (batch, steps, 2 * g, 3 * g)
    assert generation.extra["rows"].tolist() == [[2], [2]]  # travels with the generation

    def prefix(row, end):
        return {
            "input_ids": generation.input_ids[row : row + 1, :end],
            "attention_mask": generation.attention_mask[row : row + 1, :end],
            "pixel_values": generation.extra["pixel_values"][row : row + 1].double(),
            "rows": [[2]],
            "cols": [[3]],
        }

    def rule(one, position, token):
        return _idefics3_reference(model, one, position, token, depth)

    _assert_each_answer_token_equals_the_rule(answer, prefix, rule)


@pytest.mark.parametrize("answer", [False, True])
def test_idefics3_a_left_padded_batch_equals_each_prompt_alone(idefics_kind, answer):
    from explain.testing.tiny_vlm import tiny_idefics3, tiny_idefics3_processor

    model = tiny_idefics3(kind=idefics_kind)  # float32, see above
    processor = tiny_idefics3_processor(idefics_kind)
    _assert_a_left_padded_batch_equals_each_prompt_alone(model, processor, "tower", answer)


def test_idefics3_two_photos_and_a_photo_not_split(idefics3):
    model, processor = idefics3
    g, _ = _tile_patches(model)
    chat = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": _photo(0)},
                {"type": "text", "text": "w12"},
                {"type": "image", "image": _photo(1)},
                {"type": "text", "text": "w13"},
            ],
        }
    ]
    inputs = _idefics3_inputs(processor, chat, [[_photo(0), _photo(1)]])
    for depth in ("lm", "tower"):
        result = Explainer(model).explain(inputs, method="generic", depth=depth)
        assert result.relevances["image"].shape == (1, 2, 2 * g, 3 * g)  # one map per photo
        position = inputs["input_ids"].shape[1] - 1
        image, _ = _idefics3_reference(model, inputs, position, int(result.target[0]), depth)
        torch.testing.assert_close(result.relevances["image"][0], image, rtol=1e-9, atol=1e-12)
    # without splitting, a photo is its global image alone: the map is one tile's grid
    processor.image_processor.do_image_splitting = False
    try:
        prompt = _chat(processor, _photo(0), "w12 w13")
        inputs = _idefics3_inputs(processor, prompt, [[_photo(0)]])
    finally:
        processor.image_processor.do_image_splitting = True
    assert (inputs["rows"], inputs["pixel_values"].shape[1]) == ([[0]], 1)
    for depth in ("lm", "tower"):
        result = Explainer(model).explain(inputs, method="generic", depth=depth)
        assert result.relevances["image"].shape == (1, g, g)
        position = inputs["input_ids"].shape[1] - 1
        image, text = _idefics3_reference(model, inputs, position, int(result.target[0]), depth)
        torch.testing.assert_close(result.relevances["image"][0], image[0], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(result.relevances["text"][0], text, rtol=1e-9, atol=1e-12)


def test_idefics3_the_tile_layout_from_the_tokens_or_given_and_what_is_refused(idefics3):
    model, processor = idefics3
    chat = _chat(processor, _photo(0), "w12")
    inputs = _idefics3_inputs(processor, chat, [[_photo(0)]])
    given = Explainer(model).explain(inputs)
    read = Explainer(model, tokenizer=processor).explain(chat)  # from <row_i_col_j> tokens
    torch.testing.assert_close(read.relevances["image"], given.relevances["image"])
    plain = {k: v for k, v in inputs.items() if k not in ("rows", "cols")}
    with pytest.raises(InputError, match=r"processor as the Explainer's tokenizer.*rows and cols"):
        Explainer(model).explain(plain)
    explainer = Explainer(model, tokenizer=processor)
    torch.testing.assert_close(
        explainer.explain(plain).relevances["image"], given.relevances["image"]
    )
    # a 40 x 60 photo is 2 x 3 tiles, a 60 x 40 one 3 x 2: as many tiles, other maps
    mixed = {"image": [_photo(0), _photo(1, (60, 40))], "text": ["w12", "w13"]}
    with pytest.raises(InputError, match="must be split alike"):
        explainer.explain(mixed)
    with pytest.raises(InputError, match=r"says 3 images per text, pixel_values holds \[7\]"):
        Explainer(model).explain(dict(inputs, rows=[[1]], cols=[[2]]))
    with pytest.raises(InputError, match="both 0 for a photo not split"):
        Explainer(model).explain(dict(inputs, rows=[[0]], cols=[[3]]))
    cut = torch.as_tensor(inputs["pixel_attention_mask"]).clone()
    cut[0, 0, 0, 0] = 0  # a pixel of a real tile left out
    for mask in (cut, cut[:, :1]):
        with pytest.raises(InputError, match="explain reads whole tiles"):
            Explainer(model).explain(dict(inputs, pixel_attention_mask=mask))
    with pytest.raises(InputError, match=r"\(B, images, 3, H, W\)"):
        Explainer(model).explain(dict(inputs, pixel_values=inputs["pixel_values"][0]))
    # The tile layout is read from tokens the tokenizer knows: a negative id (an
    # OverflowError in the tokenizer, issue 37) or one past it meets the model's check.
    for bad in (-3, 2**40):
        ids = torch.as_tensor(inputs["input_ids"]).clone()
        ids[0, -1] = bad
        for given in (plain, inputs):
            with pytest.raises(InputError, match=f"token id {bad} .* outside the model's vocab"):
                explainer.explain(dict(given, input_ids=ids))
    for method in ("transformer_attribution", "partial_lrp", "lrp"):
        with pytest.raises(OptionError, match="no rules for their projectors and towers"):
            explainer.explain(chat, method=method)
    before = ModelState.capture(model)
    explain_generation(explainer, chat, max_new_tokens=2, depth="tower")
    explainer.explain(chat, method="rollout", depth="tower")
    with pytest.raises(ExplainError):
        explainer.explain(chat, target=10**6)
    assert before.differences(ModelState.capture(model)) == []


@pytest.mark.parametrize("depth", ["lm", "tower"])
def test_idefics3_the_fused_path_folds_answers_as_the_explicit_path(idefics3, depth):
    # A generation carries its tile layout: explained again without the processor.
    model, processor = idefics3
    chats = _chats(processor, [(_photo(0), "w12 w13"), (_photo(1), "w20 w21")])
    made = generate(Explainer(model, tokenizer=processor), chats, max_new_tokens=3)
    results = {
        path: explain_generation(
            Explainer(model, attention_path=path), made, method="generic", depth=depth
        )
        for path in ("explicit", "fused")
    }
    fused, explicit = results["fused"].explanation, results["explicit"].explanation
    assert fused.settings["attention_path"] == "streamed"
    for name in ("image", "text"):  # the explicit path's softmax is float32 (Llama, SigLIP)
        scale = float(explicit.relevances[name].abs().max())
        torch.testing.assert_close(
            fused.relevances[name], explicit.relevances[name], rtol=1e-4, atol=1e-5 * scale
        )


def test_idefics3_maps_go_back_onto_the_whole_photo():
    # Idefics3's processor resizes a 48 x 80 photo's longer side to 96, then to whole
    # 32-pixel tiles, 64 x 96 (the aspect squashed a little, nothing cropped): its own
    # tiles, put side by side and drawn back with the geometry, are the photo, and so is
    # its global image.
    from explain.loading.preprocessing import photo_preprocessing
    from explain.testing.tiny_vlm import tiny_idefics3_processor

    images = tiny_idefics3_processor().image_processor
    images.image_mean, images.image_std = [0.0] * 3, [1.0] * 3
    rows, cols = np.meshgrid(np.linspace(0, 1, 48), np.linspace(0, 1, 80), indexing="ij")
    ramp = (np.stack([rows, cols, rows * 0 + 0.5], axis=-1) * 255).round().astype(np.uint8)
    out = images(images=[[ramp]], return_row_col_info=True, return_tensors="pt")
    assert (out["rows"], out["cols"]) == ([[2]], [[3]])
    tiles = out["pixel_values"][0, :6].reshape(2, 3, 3, 32, 32).double()
    pixels = tiles.permute(2, 0, 3, 1, 4).reshape(3, 64, 96)
    geometry = photo_preprocessing(images)
    expected = torch.from_numpy(ramp / 255.0).permute(2, 0, 1).float()
    back = geometry.to_original(pixels, (48, 80))
    torch.testing.assert_close(back[:, 2:-2, 2:-2], expected[:, 2:-2, 2:-2], atol=0.04, rtol=0)
    whole = geometry.to_original(out["pixel_values"][0, 6].double(), (48, 80))
    torch.testing.assert_close(whole[:, 2:-2, 2:-2], expected[:, 2:-2, 2:-2], atol=0.04, rtol=0)


def test_idefics3_a_shapes_photo_by_path_or_array_lands_on_the_photo(idefics3, tmp_path):
    from PIL import Image

    from explain.data.shapes import ShapesDataset

    model, processor = idefics3
    scene = ShapesDataset("heldout", 1).scene(0)
    photo = Image.fromarray((scene.image * 255).round().astype(np.uint8))
    path = tmp_path / "scene.png"
    photo.save(path)
    explainer = Explainer(model, tokenizer=processor)
    by_path = explainer.explain({"image": str(path), "text": "w12 w13"})
    by_image = explainer.explain(_chat(processor, photo, "w12 w13"))
    by_array = explainer.explain(_chat(processor, np.asarray(photo), "w12 w13"))
    g, _ = _tile_patches(model)
    assert by_path.relevances["image"].shape == (1, 3 * g, 3 * g)  # 64 x 64 -> 96 x 96: 3 x 3
    torch.testing.assert_close(by_path.relevances["image"], by_image.relevances["image"])
    torch.testing.assert_close(by_path.relevances["image"], by_array.relevances["image"])
    from explain.loading.preprocessing import photo_preprocessing

    drawn = photo_preprocessing(processor).heatmap(
        by_path.relevances["image"], scene.image.shape[:2]
    )
    assert drawn.shape == (1, 64, 64) and bool(torch.isfinite(drawn).all())
    assert float(drawn.amax()) == 1.0 and float(drawn.amin()) == 0.0  # the whole photo seen


def test_idefics3_loads_from_a_folder_and_draws_the_generate_page(tmp_path, capsys):
    from explain.testing.tiny_vlm import tiny_idefics3, tiny_idefics3_processor

    # the whole photo, split into tiles
    folder = _load_saved(tmp_path, tiny_idefics3(), tiny_idefics3_processor())
    text = _draw_generate_page(tmp_path, folder, "--depth", "tower")
    assert str(tmp_path / "page.html") in capsys.readouterr().out
    assert text.count('class="word"') == 2 and "depth tower" in text
    assert text.count("[image]") >= 1 and (tmp_path / "page.png").stat().st_size > 0


def test_the_page_shows_each_photo_once_whatever_its_tiles():
    # Two photos of 2 tiles and a global image each: three runs of image tokens per photo,
    # one "[image]" per photo (at its first run) carrying its map's sum; markers stay.
    from explain.cli.image_answer import _question_tokens

    photo = ["<r1>", "i", "i", "<r2>", "i", "<g>", "i"]  # tile, tile, global image
    tokens = ["q", *photo, "w", *photo, "?"]
    is_image = torch.tensor([token == "i" for token in tokens])
    text = torch.arange(len(tokens), dtype=torch.float64)[None]  # one answer word
    maps = torch.stack([torch.full((2, 3), 1.0), torch.full((2, 3), 2.0)])[None].double()
    shown, relevance = _question_tokens(tokens, is_image, text, maps)
    each = ["<r1>", "[image]", "<r2>", "<g>"]
    assert shown == ["q", *each, "w", *each, "?"]
    expected = [0.0, 1.0, 6.0, 4.0, 6.0, 8.0, 9.0, 12.0, 12.0, 14.0, 16.0]
    assert relevance[0].tolist() == expected


def test_readout_rows_at_several_positions_per_text(model, processor):
    """`readout_at` as every language model's: (B,) positions give (B, T) one-hot rows,
    (B, P) positions (a generation's columns) give (B, P, T), in the model's dtype."""
    adapter = Explainer(model, tokenizer=processor).adapter
    chats = _chats(processor, [(_photo(0), "w12 w13"), (_photo(1), "w20 w21 w22")])
    prepared = adapter.prepare(_inputs(processor, chats))
    width = prepared.layout.num_tokens
    positions = torch.tensor([[width - 1, 0, 3], [2, width - 2, width - 1]])
    rows = adapter.readout_at(prepared, positions)
    assert rows.shape == (2, 3, width) and rows.dtype == torch.float64
    expected = torch.nn.functional.one_hot(positions, width).double()
    assert torch.equal(rows, expected)
    assert torch.equal(adapter.readout_at(prepared, positions[:, 0]), expected[:, 0])


# -- AttnLRP and CP-LRP -------------------------------------------------------------------

LRP_VARIANTS = ["attnlrp", "cp_lrp"]
BASELINE_STEPS = 4  # integrated gradients' points in these tests


def _lrp_models():
    from explain.testing.tiny_vlm import (
        tiny_idefics3,
        tiny_idefics3_processor,
        tiny_qwen2_vl,
        tiny_qwen2_vl_processor,
    )

    return {
        **KINDS,
        "gemma3": (tiny_gemma3, lambda: None),  # its inputs written by hand: _gemma3_prompts
        "qwen2": (tiny_qwen2_vl, tiny_qwen2_vl_processor),
        "qwen2.5": (lambda: tiny_qwen2_vl(version="2.5"), lambda: tiny_qwen2_vl_processor("2.5")),
        "idefics3": (tiny_idefics3, tiny_idefics3_processor),
        "smolvlm": (
            lambda: tiny_idefics3(kind="smolvlm"),
            lambda: tiny_idefics3_processor("smolvlm"),
        ),
    }


LRP_FAMILIES = sorted(_lrp_models())


@pytest.fixture(scope="module", params=LRP_FAMILIES)
def lrp_family(request):
    """Every vision-language family's tiny model in float64, with its processor."""
    build, processor = _lrp_models()[request.param]
    return build().double(), processor()


def _lrp_prompts(model, processor, pairs):
    """The inputs for `pairs` of (photo, words), as the model's processor makes them
    (Gemma 3: written by hand, random pixels, as many words), pixels in float64."""
    if processor is None:
        return _gemma3_prompts([len(words.split()) for _, words in pairs])
    inputs = Explainer(model).adapter.encode(_chats(processor, pairs), processor)
    inputs = dict(inputs)
    inputs["pixel_values"] = inputs["pixel_values"].double()
    return inputs


def _lrp_reference(model, one, position, target, variant, depth):
    """(image maps (k, gh, gw), text (T,)) of one text from the independent re-derivation
    (reference_vlm_attnlrp; for plain Gradient x Input the model's own gradient, for
    integrated gradients and occlusion its own forwards: reference_baselines), put on the
    photo by hand family by family: at depth "lm" each
    image token's relevance shared out over the patches it was made of, at depth "tower"
    the relevance at the patch embeddings itself (Qwen2-VL's, from the tower's order onto
    the grid); Idefics3's and SmolVLM's tiles put together on the photo."""
    import reference_baselines
    import reference_vlm_attnlrp as ref

    if variant in ("integrated_gradients", "occlusion"):
        found = reference_baselines.vision_language_at_inputs(
            model, one, position, target, variant, BASELINE_STEPS
        )
    else:
        found = ref.relevances(model, one, position, target, variant)
    text, tower = found
    is_image = one["input_ids"][0] == IMAGE_TOKEN_ID
    at_images = text[is_image]
    kind = model.config.model_type

    def shared(tokens, block):  # (k, r, c) tokens, each over its block x block patches
        return tokens.repeat_interleave(block, 1).repeat_interleave(block, 2) / block**2

    if kind in ("qwen2_vl", "qwen2_5_vl"):
        images, gh, gw = len(one["image_grid_thw"]), *one["image_grid_thw"][0, 1:].tolist()
        if depth == "lm":
            maps = shared(at_images.reshape(images, gh // 2, gw // 2), 2)
        else:
            order, _ = _qwen_tower_layout(model, (gh, gw))
            maps = torch.zeros(images, gh * gw, dtype=torch.float64)
            maps[:, order] = tower.reshape(images, -1)
            maps = maps.reshape(images, gh, gw)
    elif kind in ("idefics3", "smolvlm"):
        g, s = _tile_patches(model)
        images = one["pixel_values"].shape[1]
        tiles = shared(at_images.reshape(images, g // s, g // s), s) if depth == "lm" else tower
        maps = _idefics3_photos(tiles, one)
    else:  # LLaVA, PaliGemma, Gemma 3: one tower image per photo
        images, side = tower.shape[0], tower.shape[-1]
        if depth == "tower":
            maps = tower
        elif kind == "gemma3":  # each pooled token over its k x k patches
            pooled = round((at_images.numel() // images) ** 0.5)
            maps = shared(at_images.reshape(images, pooled, pooled), side // pooled)
        else:  # one image token per patch (after LLaVA's dropped class token)
            maps = at_images.reshape(images, side, side)
    return maps, text.masked_fill(is_image, 0.0)


@pytest.mark.parametrize("depth", ["lm", "tower"])
@pytest.mark.parametrize("variant", [*LRP_VARIANTS, "gradient_x_input"])
def test_attnlrp_next_token_equals_the_rederivation(lrp_family, variant, depth):
    model, processor = lrp_family
    one = _lrp_prompts(model, processor, [(_photo(0), "w12 w13 w14")])
    before = ModelState.capture(model)
    result = Explainer(model).explain(one, method=variant, depth=depth)
    assert before.differences(ModelState.capture(model)) == []
    assert result.settings["depth"] == depth and result.method == variant
    position = one["input_ids"].shape[1] - 1
    image, text = _lrp_reference(model, one, position, int(result.target[0]), variant, depth)
    maps = result.relevances["image"]
    assert maps.shape == (1, *image.shape[-2:]) and maps.dtype == torch.float64
    torch.testing.assert_close(maps[0], image[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(result.relevances["text"][0], text, rtol=1e-9, atol=1e-12)
    assert maps.abs().sum() > 0 and text.abs().sum() > 0


def _prefix(generation, row, end):
    """Text `row` of `generation` up to `end` (its prompt and the answer's tokens before
    it), with its photos: one text, as the re-derivation takes it."""
    batch, width = generation.input_ids.shape
    one = {}
    for name, value in generation.inputs().items():
        value = torch.as_tensor(value)
        if value.shape == (batch, width):  # along the tokens
            one[name] = value[row : row + 1, :end]
        elif name == "pixel_values" and value.dim() == 2:  # Qwen2-VL: every image's patches
            one[name] = value.reshape(batch, -1, value.shape[-1])[row]
        else:
            one[name] = value[row : row + 1]
    return one


@pytest.mark.parametrize("depth", ["lm", "tower"])
@pytest.mark.parametrize("variant", [*LRP_VARIANTS, "gradient_x_input"])
def test_attnlrp_each_generated_token_equals_the_rederivation_on_its_prefix(
    lrp_family, variant, depth
):
    model, processor = lrp_family
    explainer = Explainer(model, tokenizer=processor)
    # prompts of one length: a left-padded float64 row is NaN in the eager reference
    pairs = [(_photo(0), "w12 w13 w14 w15"), (_photo(1), "w20 w21 w22 w23")]
    prompts = _gemma3_prompts((4, 4)) if processor is None else _chats(processor, pairs)
    answer = explain_generation(explainer, prompts, max_new_tokens=3, method=variant, depth=depth)
    generation = answer.generation
    steps = generation.generated.shape[1]
    assert answer.explanation.relevances["image"].shape[:2] == (2, steps)

    def rule(one, position, token):
        one = {
            name: value.double() if value.is_floating_point() else value
            for name, value in one.items()
        }
        return _lrp_reference(model, one, position, token, variant, depth)

    # Gemma's RMSNorm computes in float32 whatever the model's dtype: a plain gradient
    # goes through its backward (AttnLRP's identity rule does not), and the answer's
    # prompts, of another shape than each prefix, round it differently (1.4e-7 measured)
    _assert_each_answer_token_equals_the_rule(
        answer, lambda row, end: _prefix(generation, row, end), rule, variant == "gradient_x_input"
    )


@pytest.mark.parametrize("depth", ["lm", "tower"])
@pytest.mark.parametrize("method", ["integrated_gradients", "occlusion"])
def test_the_baselines_at_the_language_model_input_equal_the_reference(lrp_family, method, depth):
    """Integrated gradients and occlusion replace the language model's input embeddings
    (the image tokens among them) from zero embeddings, equal to the model's own forward
    with that input replaced point by point, token by token (reference_baselines); the
    image tokens' relevance goes onto the photo as every method's at depth "lm". At depth
    "tower" they are refused before the model runs: the copies' image tokens already
    stand for the tower's output."""
    model, processor = lrp_family
    one = _lrp_prompts(model, processor, [(_photo(0), "w12 w13 w14")])
    explainer = Explainer(model)
    options = {"steps": BASELINE_STEPS} if method == "integrated_gradients" else {}
    if depth == "tower":
        with pytest.raises(OptionError, match="replaces the language model's input") as refused:
            explainer.explain(one, method=method, depth=depth, **options)
        # the methods named instead are those a vision-language model takes at the tower
        assert "(use attnlrp, cp_lrp, generic, gradient_x_input, rollout, or" in str(refused.value)
        return
    with pytest.raises(OptionError, match="baseline is zero embeddings"):
        explainer.explain(one, method=method, baseline_token=3, **options)
    before = ModelState.capture(model)
    result = explainer.explain(one, method=method, depth=depth, **options)
    assert before.differences(ModelState.capture(model)) == []
    position = one["input_ids"].shape[1] - 1
    image, text = _lrp_reference(model, one, position, int(result.target[0]), method, depth)
    torch.testing.assert_close(result.relevances["image"][0], image[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(result.relevances["text"][0], text, rtol=1e-9, atol=1e-12)
    assert result.relevances["image"].abs().sum() > 0


@pytest.mark.parametrize(
    ("variant", "depth"),
    [
        *((variant, "tower") for variant in [*LRP_VARIANTS, "gradient_x_input"]),
        ("integrated_gradients", "lm"),  # the copies' methods: depth "lm" only
        ("occlusion", "lm"),
    ],
)
@pytest.mark.parametrize("answer", [False, True])
@pytest.mark.parametrize("family", LRP_FAMILIES)
def test_attnlrp_a_left_padded_batch_equals_each_prompt_alone(family, answer, variant, depth):
    build, processor = _lrp_models()[family]
    model = build()  # float32: a left-padded float64 row is NaN in the eager reference
    _assert_a_left_padded_batch_equals_each_prompt_alone(
        model, processor(), depth, answer, method=variant
    )


@pytest.mark.parametrize("depth", ["lm", "tower"])
def test_cp_lrp_conserves_the_logit_of_a_bias_free_model(lrp_family, depth):
    """With every bias and every additive embedding that is not the explained input zeroed
    (the towers' position and class embeddings), nothing but the prompt's embeddings and
    the photo carry relevance into the model: CP-LRP's relevance over the text and the
    photo sums to the explained logit, through the language model alone (depth "lm") or
    on through the projector and the tower (depth "tower"), up to the identity rule's
    1e-10 in f(x) / x. The photo's map keeps every image token's share (Gemma 3's pooling,
    Qwen2-VL's merger, Idefics3's shuffle, tiles and global image)."""
    model, processor = lrp_family
    model = copy.deepcopy(model)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("bias", "class_embedding", "position_embedding.weight")):
                parameter.zero_()
    one = _lrp_prompts(model, processor, [(_photo(0), "w12 w13 w14")])
    result = Explainer(model).explain(one, method="cp_lrp", depth=depth)
    logit = result.logits.gather(1, result.target[:, None])[:, 0]
    total = result.relevances["image"].sum() + result.relevances["text"].sum()
    torch.testing.assert_close(total[None], logit, rtol=1e-7, atol=0)
    assert result.relevances["image"].abs().sum() > 1e-3 * logit.abs().sum()
