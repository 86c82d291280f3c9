"""Dispatched operations stand in for GPU kernel launches (issue 22): counted on CPU with a
`TorchDispatchMode`, so that CI guards what a GPU would pay per call without one.

Each explanation's count, for every method a model takes, must not grow with the batch
(2 vs 16: within 20%), with the sequence (1,024 to 8,192 tokens: at most 1.5x) or with
the generated tokens (8 to 32: at most 1.5x what the floor adds), must stay within 3x
the floor's count (one forward plus one input-gradient backward of the same model on the
same inputs; 4x for the LRP methods, tests/test_lrp_op_counts.py), and may wait for the
device (a sync) at most 8 times per call (14 for integrated gradients and occlusion,
which run one forward more, `_syncs`; their copies are counted in one forward,
`_copies`). The streamed fold's chunks are sized as on a GPU here: by the memory budget
alone, without the CPU's cache-sized cap
(explain.engine.kernels.torch_fold.CPU_CHUNK_BYTES), since it is the GPU's launches the
counts stand for.
"""

from __future__ import annotations

import functools

import pytest
import torch
from op_counts import OpCounter, count_ops

import explain.engine.kernels.torch_fold as torch_fold
from explain import Explainer, engine
from explain.engine.passes import pass_for
from explain.engine.plans.generation import GenerationPlan
from explain.generation import Generation, explain_generation
from explain.rules import METHODS
from explain.testing import tiny_lm, tiny_vit


@pytest.fixture(autouse=True)
def gpu_chunks(monkeypatch):
    monkeypatch.setattr(torch_fold, "CPU_CHUNK_BYTES", 1 << 62)


def test_the_counter_sees_operations_and_syncs():
    counter = count_ops(lambda: (torch.ones(3) + 1).sum().item())
    assert counter.ops["add"] == 1 and counter.syncs == 1


@functools.cache
def _vit():
    return tiny_vit(img_size=112, depth=4, num_heads=2)  # 197 tokens, as ViT-B/16


def _vit_floor(images):
    """One forward and one input-gradient backward of the target logit."""
    inputs = images.clone().requires_grad_()
    torch.autograd.grad(_vit()(inputs)[:, 0].sum(), inputs)


def _paths(method: str) -> list[str]:
    """The attention paths `method` runs on: the LRP walks read the explicit maps only."""
    return ["explicit"] if METHODS[method].lrp_rules else ["explicit", "fused"]


def _floor_ratio(method: str) -> float:
    """The most ops a call may dispatch per op of the floor: 4x for the LRP methods (issue
    22, item 5), 3x for every other method."""
    return 4.0 if METHODS[method].lrp_rules else 3.0


def _target(method: str) -> int | None:
    return 0 if METHODS[method].class_specific else None


def _copies(method: str, shape: tuple[int, ...]) -> dict:
    """The options and budget of a call of `method` on inputs of `shape` (a text's
    tokens (T,), an image's patch grid (gh, gw)). Integrated gradients, SmoothGrad and
    occlusion run copies of the inputs, as many per forward as the memory budget allows:
    here few (2 points of the path, 2 noisy copies, 4 spans) and a budget that holds them
    in one forward, so that one chunk's launches are counted. How the budget splits them
    into forwards is
    tested in tests/test_baselines.py, and that a chunk's launches do not grow with its
    copies in `test_copies_cost_launches_like_one_copy`."""
    if method == "integrated_gradients":
        return {"steps": 2}
    if method == "smoothgrad":  # 2 noisy copies
        return {"samples": 2}
    if method == "occlusion":
        count = torch.Size(shape).numel()
        return {"spans": (torch.arange(count) * 4 // count).reshape(shape)}
    return {}


ROOMY = 1 << 34
"""A memory budget that holds every copy of the calls here in one forward."""


def _syncs(method: str) -> int:
    """The waits for the device a call may make: 8, and 6 more for integrated gradients
    and occlusion, which run one forward more than the others (the inputs themselves,
    and the baseline, before the copies), with its model's own waits (a language
    model's 3 or 4, its positions and masks; a vision-language model's 4, its image
    features' checks too), the copies' scores checked finite, and spans read once."""
    return 14 if _copies(method, (4,)) else 8


@pytest.mark.parametrize(
    "method, path",
    [(method, path) for method in METHODS for path in _paths(method)],
)
def test_vit_counts_do_not_grow_with_the_batch(path, method):
    """Every method, on each path it takes: 2 and 16 images of ViT-B/16's 197 tokens."""
    counts = []
    for batch in (2, 16):
        images = torch.randn(batch, 3, 112, 112, generator=torch.Generator().manual_seed(0))
        options = _copies(method, (14, 14))
        budget = ROOMY if options else None
        explainer = Explainer(_vit(), attention_path=path, memory_budget=budget)
        counter = count_ops(
            lambda e=explainer, x=images, o=options: e.explain(
                x, target=_target(method), method=method, **o
            )
        )
        counts.append(counter.total)
        assert counter.syncs <= _syncs(method), counter.ops
        floor = count_ops(lambda x=images: _vit_floor(x)).total
        assert counter.total <= _floor_ratio(method) * floor, (counter.total, floor)
    assert abs(counts[1] - counts[0]) <= 0.2 * counts[0], counts


@pytest.mark.parametrize("method", ["integrated_gradients", "occlusion"])
def test_copies_cost_launches_like_one_copy(method):
    """Integrated gradients' 2 and 32 points of the path, occlusion's 4 spans and 16
    patches, each in one forward (a budget that holds them): the copies go in the batch,
    not in a loop, so the count does not grow with them (the embedding hook's blend and
    the weighted sum are a few ops per forward, whatever the copies; given spans cost 6
    ops more to read, of 256)."""
    model = tiny_vit(depth=2, num_heads=2)
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    explainer = Explainer(model, memory_budget=ROOMY)
    quarters = torch.arange(4).reshape(2, 2).repeat_interleave(2, 0).repeat_interleave(2, 1)
    few, many = (
        ({"steps": 2}, {"steps": 32})
        if method == "integrated_gradients"
        else (
            {"spans": quarters},
            {},
        )
    )
    counts = [
        count_ops(lambda o=options: explainer.explain(images, method=method, target=0, **o))
        for options in (few, many)
    ]
    assert abs(counts[1].total - counts[0].total) <= 0.05 * counts[0].total, (
        counts[0].total,
        counts[1].total,
    )
    assert counts[1].syncs <= _syncs(method)


def _narrow_llama():
    return tiny_lm.tiny_causal_lm(
        "llama",
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=8192,
    )


def _lm_floor(model, ids):
    embeddings = model.get_input_embeddings()(ids).detach().requires_grad_()
    logits = model(inputs_embeds=embeddings).logits
    torch.autograd.grad(logits[:, -1, 0].sum(), embeddings)


def _language_model_methods() -> list[str]:
    """Every method a decoder-only language model takes (no LRP walk: see
    tests/test_lrp_op_counts.py for the walks at length)."""
    return engine.supported_methods(Explainer(_narrow_llama()).adapter)


@pytest.mark.parametrize("method", _language_model_methods())
def test_long_sequences_cost_launches_like_short_ones(method):
    """1,024 and 8,192 tokens of a narrow Llama on the auto path (on CPU from 384 tokens the
    fused one: streamed for the spread folds, A and dA recomputed whole for the last block
    of attention GradCAM, the model's own kernel for AttnLRP, CP-LRP and the baseline),
    256 MiB of maps at a time."""
    model = _narrow_llama()
    explainer = Explainer(model, memory_budget=256 << 20)
    target = _target(method)
    counts = []
    for tokens in (1024, 8192):
        ids = torch.randint(
            3, tiny_lm.VOCAB, (1, tokens), generator=torch.Generator().manual_seed(0)
        )
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        options = _copies(method, (tokens,))
        with OpCounter() as counter:
            result = explainer.explain(inputs, method=method, target=target, **options)
        assert result.settings["attention_path"] in ("streamed", "fused")
        assert counter.syncs <= _syncs(method), counter.ops
        counts.append(counter.total)
        floor = count_ops(lambda i=ids: _lm_floor(model, i)).total
        assert counter.total <= _floor_ratio(method) * floor, (counter.total, floor)
    assert counts[1] <= 1.5 * counts[0], counts


def _generation_floor(model, ids, width):
    """One forward and one backward of every generated token's logit to the input
    embeddings, batched over the tokens (`is_grads_batched`)."""
    embeddings = model.get_input_embeddings()(ids).detach().requires_grad_()
    logits = model(inputs_embeds=embeddings).logits[:, width - 1 : -1]
    scores = logits.gather(-1, ids[:, width:, None])[..., 0]  # (B, G)
    count = scores.shape[1]
    one_hot = torch.eye(count)[:, None, :].expand(count, *scores.shape)
    torch.autograd.grad(scores, embeddings, grad_outputs=one_hot, is_grads_batched=True)


def _generation_methods() -> list[str]:
    """Every registered method a generation takes (its pass is one GenerationPlan accepts)."""
    return sorted(name for name, spec in METHODS.items() if pass_for(spec) in GenerationPlan.passes)


@pytest.mark.parametrize("method", _generation_methods())
def test_generations_cost_launches_like_one_token(method):
    """A 256-token prompt with 8 and with 32 generated tokens: every column from one
    forward and (but for the forward-only methods) one backward batched over the
    columns. Each costs at most 1.5x the floor's count (one forward, one backward of
    every token to the embeddings, batched) and each further token at most 1.5x what it
    adds to the floor. The floor itself grows 1.44x from 8 to 32 tokens here, since
    PyTorch's batched backward runs some kernels once per column (CPU sdpa's backward,
    silu's, a gather's). The explanations grow less: generic 1.28x, attention GradCAM
    1.22x, AttnLRP 1.26x, CP-LRP 1.32x (CP-LRP's growth is sdpa's backward and the
    gather of the explained tokens' scores, both the floor's too: the logits are sliced,
    not indexed, since an index's backward also runs once per column), the forward-only
    methods (rollout, raw attention) not at all, but for the random baseline's one draw
    per column (1.08x)."""
    model = _narrow_llama()
    explainer = Explainer(model)
    counts, floors = [], []
    for new in (8, 32):
        ids = torch.randint(
            3, tiny_lm.VOCAB, (2, 256 + new), generator=torch.Generator().manual_seed(0)
        )
        generation = Generation(ids, torch.ones_like(ids), prompt_length=256)
        options = _copies(method, (256 + new,))
        counter = count_ops(
            lambda g=generation, o=options: explain_generation(explainer, g, method=method, **o)
        )
        assert counter.syncs <= _syncs(method), counter.ops
        floors.append(count_ops(lambda i=ids: _generation_floor(model, i, 256)).total)
        counts.append(counter.total)
        assert counter.total <= _generation_ratio(method) * floors[-1], (counter.total, floors[-1])
    assert counts[1] - counts[0] <= 1.5 * (floors[1] - floors[0]), (counts, floors)


def _generation_ratio(method: str) -> float:
    """1.5x the generation floor; one floor more for integrated gradients, which runs one
    forward more (the inputs and the baseline, before the path's points)."""
    return 2.5 if method in ("integrated_gradients", "smoothgrad") else 1.5


def _bart():
    """A tiny BART whose decoder takes 33 tokens (a start token and 32 more)."""
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(
        vocab_size=40,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=None,
    )
    torch.manual_seed(0)
    return BartForConditionalGeneration(config).eval()


def _seq2seq_floor(model, source, decoder):
    """One forward and one backward of every decoder token's logit (from the position
    before it) to the encoder's and the decoder's input embeddings, batched over the
    tokens (`is_grads_batched`)."""
    embed = model.get_input_embeddings()
    encoder = embed(source).detach().requires_grad_()
    decoded = embed(decoder).detach().requires_grad_()
    logits = model(inputs_embeds=encoder, decoder_inputs_embeds=decoded).logits[:, :-1]
    scores = logits.gather(-1, decoder[:, 1:, None])[..., 0]  # (B, P)
    count = scores.shape[1]
    one_hot = torch.eye(count)[:, None, :].expand(count, *scores.shape)
    torch.autograd.grad(scores, (encoder, decoded), grad_outputs=one_hot, is_grads_batched=True)


def test_every_decoder_position_costs_launches_like_one():
    """An encoder-decoder explaining every token of an 8- and a 32-token decoder sequence
    (position="all") after a 16-token source: one forward, one backward batched over the
    positions and the two-set rules of every position at once. Each costs at most 1.5x the
    floor's count (one forward, one backward of every position's token to the input
    embeddings, batched; 1.43x and 1.15x here) and each further position at most 1.5x what
    it adds to the floor. The floor itself grows 2.06x from 8 to 32 positions, since
    PyTorch's batched backward runs some kernels once per column (CPU sdpa's backward,
    layer norm's, GELU's, a gather's); the explanation, on the explicit attention path,
    grows 1.66x (1,519 to 2,527 ops), all of it such kernels (softmax's backward instead
    of sdpa's, and the backward of its indexing of the explained positions): none of its
    own operations runs once per position."""
    model = _bart()
    explainer = Explainer(model)
    counts, floors = [], []
    for new in (8, 32):
        generator = torch.Generator().manual_seed(0)
        source = torch.randint(3, 40, (2, 16), generator=generator)
        decoder = torch.randint(3, 40, (2, new + 1), generator=generator)
        decoder[:, 0] = model.config.decoder_start_token_id
        inputs = {"input_ids": source, "decoder_input_ids": decoder}
        counter = count_ops(lambda i=inputs: explainer.explain(i, position="all"))
        assert counter.syncs <= 8, counter.ops
        floors.append(count_ops(lambda s=source, d=decoder: _seq2seq_floor(model, s, d)).total)
        counts.append(counter.total)
        assert counter.total <= 1.5 * floors[-1], (counter.total, floors[-1])
    assert counts[1] - counts[0] <= 1.5 * (floors[1] - floors[0]), (counts, floors)


def _vision_language_answer(kind: str, new: int):
    """A tiny vision-language model, and two prompts about a photo each (its processor's
    output) followed by `new` generated tokens (words of the tiny vocabulary, no image
    token), as a `Generation`."""
    import numpy as np

    from explain.inputs import encode_image_prompt
    from explain.testing import tiny_vlm

    if kind == "llava":
        model, processor = tiny_vlm.tiny_llava("clip"), tiny_vlm.tiny_llava_processor("clip")
        photo = (np.random.default_rng(0).random((40, 60, 3)) * 255).astype(np.uint8)
        turn = [{"type": "image", "image": photo}, {"type": "text", "text": "w12 w13 w14"}]
        encoded = encode_image_prompt([[{"role": "user", "content": turn}]] * 2, processor)
    elif kind == "idefics3":
        model, processor = tiny_vlm.tiny_idefics3(), tiny_vlm.tiny_idefics3_processor()
        photo = (np.random.default_rng(0).random((40, 60, 3)) * 255).astype(np.uint8)
        turn = [{"type": "image", "image": photo}, {"type": "text", "text": "w12 w13 w14"}]
        encoded = encode_image_prompt([[{"role": "user", "content": turn}]] * 2, processor)
        encoded = Explainer(model).adapter.encode(encoded, processor)  # the tile layout
    elif kind == "qwen2_vl":
        model, processor = tiny_vlm.tiny_qwen2_vl(), tiny_vlm.tiny_qwen2_vl_processor()
        photo = (np.random.default_rng(0).random((40, 60, 3)) * 255).astype(np.uint8)
        turn = [{"type": "image", "image": photo}, {"type": "text", "text": "w12 w13 w14"}]
        encoded = encode_image_prompt([[{"role": "user", "content": turn}]] * 2, processor)
    else:
        model, processor = tiny_vlm.tiny_paligemma(), tiny_vlm.tiny_paligemma_processor()
        photo = (np.random.default_rng(0).random((40, 60, 3)) * 255).astype(np.uint8)
        encoded = encode_image_prompt({"image": [photo] * 2, "text": ["w12 w13"] * 2}, processor)
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    answer = torch.randint(3, 40, (ids.shape[0], new), generator=torch.Generator().manual_seed(0))
    kept = (
        "pixel_values",
        "token_type_ids",
        "pixel_attention_mask",
        "rows",
        "cols",
        "image_grid_thw",
        "mm_token_type_ids",
    )
    extra = {k: torch.as_tensor(v) for k, v in encoded.items() if k in kept}
    adapter = Explainer(model).adapter
    extra = adapter.continued(extra, new)
    generation = Generation(
        torch.cat([ids, answer], 1),
        torch.cat([mask, torch.ones_like(answer)], 1),
        ids.shape[1],
        extra,
    )
    return model, processor, generation


def _vision_language_floor(
    model, generation: Generation, tower: bool, positions: torch.Tensor | None
) -> None:
    """One forward and one backward of every generated token's logit to the language
    model's input embeddings (the image tokens' among them, which the model scatters in
    from its projector), batched over the tokens; with `tower`, to the pixels as well, so
    that the backward runs through the tower's blocks as depth "tower" needs it. Qwen2-VL
    takes its multimodal `positions`, which it cannot compute without the token ids."""
    ids, width = generation.input_ids, generation.prompt_length
    embeddings = model.get_input_embeddings()(ids).detach().requires_grad_()
    drop = ("rows", "cols", "mm_token_type_ids")
    extra = {k: v for k, v in generation.extra.items() if k not in drop}
    if positions is not None:
        extra["position_ids"] = positions
    pixels = extra.pop("pixel_values").detach().requires_grad_(tower)
    logits = model(
        inputs_embeds=embeddings,
        attention_mask=generation.attention_mask,
        pixel_values=pixels,
        **extra,
    ).logits[:, width - 1 : -1]
    scores = logits.gather(-1, ids[:, width:, None])[..., 0]  # (B, G)
    count = scores.shape[1]
    one_hot = torch.eye(count)[:, None, :].expand(count, *scores.shape)
    leaves = (embeddings, pixels) if tower else (embeddings,)
    torch.autograd.grad(scores, leaves, grad_outputs=one_hot, is_grads_batched=True)


def _vision_language_cases() -> list[tuple[str, str, str]]:
    """(family, method, depth) for every method a vision-language answer takes, at both
    depths where the method reaches the tower (the others read one block: depth "lm")."""
    from explain.engine.plans.image_text import DEPTHS, ImageTextPlan, reaches_tower

    methods = sorted(
        name for name, spec in METHODS.items() if pass_for(spec) in ImageTextPlan.passes
    )
    return [
        (family, method, depth)
        for family in ("llava", "paligemma", "idefics3", "qwen2_vl")
        for method in methods
        for depth in DEPTHS
        if depth == "lm" or reaches_tower(METHODS[method])
    ]


@pytest.mark.parametrize("family, method, depth", _vision_language_cases())
def test_vision_language_answers_cost_launches_like_one_token(family, method, depth):
    """A tiny LLaVA's, PaliGemma's, Idefics3's and Qwen2-VL's answers of 8 and of 32
    generated tokens about a photo: every column from one forward and (but for the
    forward-only methods) one backward batched over the columns; the image tokens of
    every column gathered and carried back onto the photo at once. The floor is one
    forward and one backward of every generated token to the language model's input
    embeddings, batched over the tokens (with depth "tower", to the pixels too: that
    backward runs through the tower's blocks). Each explanation costs at most 1.5x the
    floor's count, each further token at most 1.5x what it adds to the floor, and the
    call, as the next token of the prompts alone, waits for the device at most 8 times
    (2 or 3 of them in the model's own forward: its checks that image features and
    tokens match, its masks'; the inputs' checks one). A method without a backward folds
    every column from the one forward: its count grows at most 5% (the random baseline
    draws once per column). Measured with LLaVA from 8 to 32 tokens, where the floor
    grows 1.39x (1.64x to the pixels): rollout and raw attention 1.00x, generic 1.23x at
    depth lm and 1.35x at depth tower (1.16x and 1.09x the floor at 32 tokens),
    attention GradCAM 1.13x, the random baseline 1.04x; 5 or 6 syncs per answer, 7 or 8
    for the next token (its logits' positions read, its output checked)."""
    counts, floors = [], []
    for new in (8, 32):
        model, processor, generation = _vision_language_answer(family, new)
        options = _copies(method, (generation.input_ids.shape[1],))
        explainer = Explainer(model, tokenizer=processor, memory_budget=ROOMY if options else None)
        prepared = explainer.adapter.prepare(generation.inputs()).arguments
        positions = prepared["position_ids"] if family == "qwen2_vl" else None
        counter = count_ops(
            lambda e=explainer, g=generation, o=options: explain_generation(
                e, g, method=method, depth=depth, **o
            )
        )
        assert counter.syncs <= _syncs(method), counter.ops
        floors.append(
            count_ops(
                lambda m=model, g=generation, p=positions: _vision_language_floor(
                    m, g, depth == "tower", p
                )
            ).total
        )
        counts.append(counter.total)
        ratio = _generation_ratio(method)
        assert counter.total <= ratio * floors[-1], (counter.total, floors[-1])
    assert counts[1] - counts[0] <= 1.5 * (floors[1] - floors[0]), (counts, floors)
    width = generation.prompt_length
    prompts = {name: value[:, :width] for name, value in generation.inputs().items()}
    prompts["pixel_values"] = generation.extra["pixel_values"]
    options = _copies(method, (width,))
    next_token = count_ops(
        lambda: explainer.explain(prompts, method=method, depth=depth, **options)
    )
    assert next_token.syncs <= _syncs(method), next_token.ops
    if not METHODS[method].needs_gradients and not options:  # occlusion: columns one by one
        assert counts[1] <= 1.05 * counts[0], counts


def _detr_floor(model, images):
    """One forward and one backward of every query's first class logit to the pixels,
    batched over the queries (`is_grads_batched`)."""
    pixels = images.clone().requires_grad_()
    logits = model(pixel_values=pixels).logits[..., 0]  # (B, Q)
    count = logits.shape[1]
    one_hot = torch.eye(count)[:, None, :].expand(count, *logits.shape)
    torch.autograd.grad(logits, pixels, grad_outputs=one_hot, is_grads_batched=True)


def test_every_detection_costs_launches_like_one():
    """A tiny DETR with 8 and with 32 queries, every query a detection (threshold 0): one
    forward, one backward batched over the detections, the two-set rules of all of them
    at once and each detection's rows at its query read for all at once. Each costs at
    most 1.5x the floor's count (one forward, one backward of every query's logit to the
    pixels, batched: 1.04x and 0.76x here) and each further detection at most 1.5x what
    it adds to the floor (0.49x here: 1,774 -> 2,638 ops, the floor 1,699 -> 3,475)."""
    from explain.testing.tiny_models import tiny_detr

    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    counts, floors = [], []
    for queries in (8, 32):
        model = tiny_detr(num_queries=queries)
        explainer = Explainer(model)
        counter = count_ops(lambda e=explainer: e.explain(images, threshold=0.0))
        assert counter.syncs <= 8, counter.ops
        floors.append(count_ops(lambda m=model: _detr_floor(m, images)).total)
        counts.append(counter.total)
        assert counter.total <= 1.5 * floors[-1], (counter.total, floors[-1])
    assert counts[1] - counts[0] <= 1.5 * (floors[1] - floors[0]), (counts, floors)
