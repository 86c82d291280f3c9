"""Concurrent calls on one model: serialised, so results and model state are as if
sequential; an explanation nested in another on the same model is refused, not deadlocked."""

from __future__ import annotations

import threading

import pytest
import torch

from explain import Explainer, ExplainError
from explain.testing import ModelState, tiny_vit

CALLS_PER_THREAD = 20
METHODS = ("generic", "rollout", "transformer_attribution", "attention_gradcam")


def _training_model() -> torch.nn.Module:
    """A ViT mid-training: dropout on, one block in eval mode, one frozen weight, grads."""
    model = tiny_vit(drop_rate=0.2, attn_drop_rate=0.2, proj_drop_rate=0.2, depth=2)
    model.train()
    model.blocks[1].eval()
    model.patch_embed.proj.weight.requires_grad_(False)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    return model


def _inputs(thread: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(thread)
    return [torch.randn(2, 3, 32, 32, generator=generator) for _ in range(CALLS_PER_THREAD)]


@pytest.mark.parametrize("shared", [True, False], ids=["one-explainer", "two-explainers"])
def test_two_threads_on_one_model_equal_sequential_calls(shared):
    model = _training_model()
    inputs = [_inputs(0), _inputs(1)]

    def call(explainer: Explainer, images: torch.Tensor, index: int) -> torch.Tensor:
        return explainer.explain(images, method=METHODS[index % len(METHODS)]).relevance

    sequential = Explainer(model)
    expected = [[call(sequential, x, i) for i, x in enumerate(batch)] for batch in inputs]
    torch.manual_seed(5)
    before = ModelState.capture(model)

    explainers = [Explainer(model)] * 2 if shared else [Explainer(model), Explainer(model)]
    results: list[list[torch.Tensor]] = [[], []]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def work(thread: int) -> None:
        start.wait()
        try:
            for index, images in enumerate(inputs[thread]):
                results[thread].append(call(explainers[thread], images, index))
        except BaseException as error:  # reported below, in the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    for thread in range(2):
        assert len(results[thread]) == CALLS_PER_THREAD
        for got, want in zip(results[thread], expected[thread], strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert before.differences(ModelState.capture(model)) == []


def test_a_nested_explanation_is_refused_and_the_model_restored():
    model = _training_model()
    explainer = Explainer(model)
    images = torch.randn(2, 3, 32, 32)
    before = ModelState.capture(model)

    def nested(logits: torch.Tensor) -> torch.Tensor:
        explainer.explain(images)
        return logits[:, 0]

    with pytest.raises(ExplainError, match="explanations cannot be nested"):
        explainer.explain(images, target=nested)
    assert before.differences(ModelState.capture(model)) == []
    explainer.explain(images)  # the lock was released: the model is usable again


def test_a_target_may_explain_another_model():
    """The lock is per model: explaining a different model inside a target is fine."""
    outer, inner = tiny_vit(depth=2), tiny_vit(depth=2, seed=1)
    images = torch.randn(2, 3, 32, 32)
    inner_maps = []

    def target(logits: torch.Tensor) -> torch.Tensor:
        inner_maps.append(Explainer(inner).explain(images).relevance)
        return logits[:, 0]

    Explainer(outer).explain(images, target=target)
    torch.testing.assert_close(inner_maps[0], Explainer(inner).explain(images).relevance)


@pytest.mark.parametrize("path", ["explicit", "fused"])
def test_a_model_sharing_a_tower_runs_in_another_thread_during_an_explanation(path):
    """Model B shares its vision tower with model A. While A is explained (inside its
    target callable: between A's forward and backward, its hooks in place), another thread
    runs a training step of B. A's recording never sees B's forward (issue 37: B's backward
    raised inside explain's hooks, and A's call failed); B computes what it computes
    alone, but with the state the explanation gives the shared tower for the call (eval
    mode, requires_grad off, the explicit path's eager attention: see the README, Threads),
    so its tower gets no gradient meanwhile."""
    import numpy as np

    from explain.inputs import encode_image_prompt
    from explain.testing.tiny_vlm import tiny_llava, tiny_llava_processor

    a, processor = tiny_llava("clip").double(), tiny_llava_processor("clip")
    b = tiny_llava("clip", seed=1).double()
    b.model.vision_tower = a.model.vision_tower  # one module, one config
    photo = (np.random.default_rng(0).random((40, 60, 3)) * 255).astype(np.uint8)
    chat = [
        {
            "role": "user",
            "content": [{"type": "image", "image": photo}, {"type": "text", "text": "w12"}],
        }
    ]
    inputs = encode_image_prompt(chat, processor)
    inputs["pixel_values"] = inputs["pixel_values"].double()
    tower_weight = a.model.vision_tower.embeddings.patch_embedding.weight

    def train_b() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One step of B: its logits, its head's gradient and the shared tower's."""
        b.zero_grad(set_to_none=True)
        logits = b(**inputs).logits
        logits.sum().backward()
        tower = None if tower_weight.grad is None else tower_weight.grad.clone()
        return logits.detach(), b.lm_head.weight.grad.clone(), tower

    alone = train_b()
    assert alone[2] is not None
    explainer = Explainer(a, tokenizer=processor, attention_path=path)
    expected = explainer.explain(chat, depth="tower").relevances["image"]
    during: list = []

    def target(logits: torch.Tensor) -> torch.Tensor:
        def work() -> None:
            try:
                during.append(train_b())
            except BaseException as error:  # reported below, in the main thread
                during.append(error)

        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
        return logits.argmax(dim=-1)

    found = explainer.explain(chat, depth="tower", target=target).relevances["image"]
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)
    (step,) = during
    assert not isinstance(step, BaseException), repr(step)
    logits, head, tower = step
    # The fused path's wrapper gives B sdpa's own output; the explicit path's eager flag
    # is the shared config's, and CLIP's eager attention takes its softmax in float32.
    tolerance = dict(rtol=1e-10, atol=1e-12) if path == "fused" else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits, alone[0], **tolerance)
    torch.testing.assert_close(head, alone[1], **tolerance)
    assert tower is None  # the tower's requires_grad is off for the explanation
    assert a.model.vision_tower.config._attn_implementation == "sdpa"
