"""The session holds what it changes: shared parts across models and threads, fork, nested
calls across models, and transformers' attention registry borrowed for the call only.

The thread tests force the interleaving that breaks an unguarded model: the first call
waits inside its target callable for the second one to get inside too (which it cannot,
when the two are serialised: the wait then times out), and the second one waits there
for the first to finish, so that it restores its state last."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from tolerances import FLOAT32
from transformers import BertConfig, BertForSequenceClassification

from explain import Explainer, ExplainError, NestedExplanationError
from explain.testing import ModelState, tiny_lm, tiny_vit

IDS = {"input_ids": torch.tensor([[2, 7, 9, 3], [2, 5, 3, 0]])}
IDS["attention_mask"] = (IDS["input_ids"] > 0).long()


def _bert_config() -> BertConfig:
    return BertConfig(
        vocab_size=30,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=3,
        attn_implementation="sdpa",
    )


def _bert(config: BertConfig, seed: int) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    return BertForSequenceClassification(config).train()


def _interleaved(first: torch.nn.Module, second: torch.nn.Module) -> list[BaseException]:
    """Explain `first` and `second` from two threads, the second starting while the first
    is inside its call and finishing after it; returns the errors raised."""
    first_inside, second_inside, first_done = (threading.Event() for _ in range(3))
    errors: list[BaseException] = []

    def first_target(logits: torch.Tensor) -> torch.Tensor:
        first_inside.set()
        second_inside.wait(timeout=0.5)
        return logits[:, 0]

    def second_target(logits: torch.Tensor) -> torch.Tensor:
        second_inside.set()
        first_done.wait(timeout=5)
        return logits[:, 0]

    def run_first() -> None:
        try:
            Explainer(first).explain(IDS, target=first_target)
        except BaseException as error:
            errors.append(error)
        finally:
            first_done.set()

    def run_second() -> None:
        first_inside.wait(timeout=5)
        try:
            Explainer(second).explain(IDS, target=second_target)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run_first), threading.Thread(target=run_second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "the calls deadlocked"
    return errors


def test_two_models_sharing_a_config_restore_it_from_two_threads():
    config = _bert_config()
    first, second = _bert(config, 0), _bert(config, 1)
    assert _interleaved(first, second) == []
    assert config._attn_implementation == "sdpa"


def test_two_heads_on_one_backbone_leave_it_trainable_from_two_threads():
    first = _bert(_bert_config(), 0)
    second = _bert(_bert_config(), 1)
    second.bert = first.bert  # two heads, one backbone
    before = ModelState.capture(first)
    assert _interleaved(first, second) == []
    assert before.differences(ModelState.capture(first)) == []
    assert all(p.requires_grad for p in first.bert.parameters())
    assert first.bert.training


def test_nested_calls_across_models_in_two_threads_are_refused_not_deadlocked():
    """Thread 1 explains A and, inside, B; thread 2 explains B and, inside, A. Waiting
    would close a cycle: one of the inner calls is refused, its outer call unwinds, and
    the other thread's calls both complete."""
    models = {"A": tiny_vit(depth=2), "B": tiny_vit(depth=2, seed=1)}
    images = torch.randn(2, 3, 32, 32)
    inside = {"A": threading.Event(), "B": threading.Event()}
    errors: dict[str, BaseException] = {}
    done: list[str] = []

    def run(outer: str, inner: str) -> None:
        def target(logits: torch.Tensor) -> torch.Tensor:
            inside[outer].set()
            inside[inner].wait(timeout=5)
            Explainer(models[inner]).explain(images)
            return logits[:, 0]

        try:
            Explainer(models[outer]).explain(images, target=target)
            done.append(outer)
        except BaseException as error:
            errors[outer] = error

    threads = [
        threading.Thread(target=run, args=("A", "B"), daemon=True),
        threading.Thread(target=run, args=("B", "A"), daemon=True),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "the nested calls deadlocked"
    assert len(done) == 1 and len(errors) == 1, (done, errors)
    (error,) = errors.values()
    assert isinstance(error, NestedExplanationError)
    assert isinstance(error, ExplainError)
    assert "wait for each other" in str(error)
    for model in models.values():  # both usable again
        Explainer(model).explain(images)


def _forked_mid_explanation(model: torch.nn.Module, images: torch.Tensor, child) -> int:
    """Fork while another thread is inside an explanation of `model` (paused in its target
    callable, its hooks and settings in place); the child runs `child()`, whose int is its
    exit code (an exception: 4, printed). The child's exit code; a child that hangs on a
    lock held by a thread it does not have is killed and fails the test."""
    inside, forked = threading.Event(), threading.Event()

    def target(logits: torch.Tensor) -> torch.Tensor:
        inside.set()
        forked.wait(timeout=30)
        return logits[:, 0]

    thread = threading.Thread(
        target=lambda: Explainer(model).explain(images, target=target), daemon=True
    )
    thread.start()
    assert inside.wait(timeout=30)
    pid = os.fork()
    if pid == 0:  # the child: only this thread exists; the other's call is gone
        code = 4
        try:
            signal.alarm(60)  # a hung child must not outlive the test run
            # GNU OpenMP's thread pool does not survive fork (its threads stay in the
            # parent): any PyTorch work in a forked child needs one thread, lock or not.
            torch.set_num_threads(1)
            code = child()
        except BaseException as error:
            print("the forked child failed:", repr(error), flush=True)
        finally:
            os._exit(code)
    forked.set()
    thread.join(timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung on a lock held by a thread it does not have")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_another_thread_explains_can_explain():
    model = tiny_vit(depth=2)
    images = torch.randn(2, 3, 32, 32)

    def child() -> int:
        relevance = Explainer(model).explain(images).relevance
        return 0 if bool(torch.isfinite(relevance).all()) else 1

    assert _forked_mid_explanation(model, images, child) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_mid_explanation_runs_a_model_sharing_a_block_as_alone():
    # Issue 46: two models share a block; the parent's thread is inside an explanation of
    # the first (its hooks on the shared block, its session's settings in place) when the
    # process forks. The child inherits that instant, and no thread of its own will end
    # the call: the shared block keeps the explicit path's attention (timm's fused_attn
    # off, the same maths, float32 rounding apart; README, Threads) and the hooks, which
    # record only the parent's call. The second model's forward is what it is alone, and
    # the child can explain it and leave it so.
    a, b = tiny_vit(depth=2, seed=0), tiny_vit(depth=2, seed=1)
    b.blocks[0] = a.blocks[0]
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        alone = b(images)

    def as_alone() -> bool:
        with torch.no_grad():
            return torch.allclose(b(images), alone, **FLOAT32)

    def child() -> int:  # 1: the forward differs, 2: the explanation, 3: left changed
        if not as_alone():
            return 1
        if not bool(torch.isfinite(Explainer(b).explain(images).relevance).all()):
            return 2
        return 0 if as_alone() else 3

    assert _forked_mid_explanation(a, images, child) == 0


def test_the_sdpa_wrapper_is_registered_for_the_call_only():
    """The fused path of a decoder-only language model selects explain's wrapper of sdpa
    by name in transformers' attention registries: the entries exist during the call
    only, also when two calls overlap in two threads."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from explain.architectures.hf_attention_probe import IMPLEMENTATION

    registries = (AttentionInterface._global_mapping, AttentionMaskInterface._global_mapping)
    models = [tiny_lm.tiny_causal_lm("llama"), tiny_lm.tiny_causal_lm("qwen2")]
    ids = {"input_ids": torch.tensor([[4, 14, 7, 33]]), "attention_mask": torch.ones(1, 4)}
    both_inside = threading.Barrier(2, timeout=30)
    first_done = threading.Event()
    seen: list[bool] = []

    def first_target(logits: torch.Tensor) -> torch.Tensor:
        both_inside.wait()
        return logits[:, 0]

    def second_target(logits: torch.Tensor) -> torch.Tensor:
        both_inside.wait()
        first_done.wait(timeout=30)  # the first call is out: the entries must remain
        seen.append(all(IMPLEMENTATION in registry for registry in registries))
        return logits[:, 0]

    def run_first() -> None:
        try:
            Explainer(models[0], attention_path="fused").explain(ids, target=first_target)
        finally:
            first_done.set()

    threads = [
        threading.Thread(target=run_first),
        threading.Thread(
            target=lambda: Explainer(models[1], attention_path="fused").explain(
                ids, target=second_target
            )
        ),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert seen == [True]
    assert not any(IMPLEMENTATION in registry for registry in registries)


def test_finite_eager_masks_act_in_the_calls_thread_only():
    """A float64 causal language model's explicit path keeps transformers' eager masks
    finite in float32 for its own thread: the registry's "eager" entry is explain's during
    the call, gives another thread exactly transformers' own mask meanwhile, and is
    transformers' own again afterwards."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    model = tiny_lm.tiny_causal_lm("llama").to(torch.float64)
    mask = torch.tensor([[0, 0, 1, 1]])
    left_padded = {"input_ids": torch.tensor([[0, 0, 4, 14]]), "attention_mask": mask}
    arguments = {
        "batch_size": 1,
        "q_length": 4,
        "kv_length": 4,
        "attention_mask": mask.bool(),
        "dtype": torch.float64,
    }
    inside, checked = threading.Event(), threading.Event()

    def target(logits: torch.Tensor) -> torch.Tensor:
        inside.set()
        checked.wait(timeout=30)
        return logits[:, 0]

    results: list[torch.Tensor] = []

    def explain() -> None:
        # generic: the explicit path, whose eager masks these are (cp_lrp, the default, is fused)
        explainer = Explainer(model)
        results.append(explainer.explain(left_padded, method="generic", target=target).relevance)

    thread = threading.Thread(target=explain)
    thread.start()
    try:
        assert inside.wait(timeout=30)
        during = ALL_MASK_ATTENTION_FUNCTIONS["eager"]
        assert during is not eager_mask
        elsewhere = during(**arguments)
        assert torch.equal(elsewhere, eager_mask(**arguments))
        assert elsewhere.min() == torch.finfo(torch.float64).min
    finally:
        checked.set()
        thread.join(timeout=60)
    assert ALL_MASK_ATTENTION_FUNCTIONS["eager"] is eager_mask
    assert len(results) == 1 and bool(torch.isfinite(results[0]).all())
