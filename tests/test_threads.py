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
