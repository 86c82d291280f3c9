"""The session: borrowing a model for one call, and giving it back exactly as found.

Everything in `explain` that runs a model (an explanation's passes, a trace, generation,
the forwards of evaluation and of a dual encoder's pairing) does it inside a `Session`.
For the duration of the call the session

- holds the model's parts (see Threads below),
- forks the global RNG (CPU and the model's CUDA devices), so that nothing the model
  does inside the call changes the random numbers training will draw next,
- enables autograd (`differentiable`) or disables it,
- puts every module in eval mode and turns off every parameter's `requires_grad`,
- sets the attention-path flags (the explicit path's, or the fused path's), after
  entering what the path needs in place besides them (`Adapter.path_context`,
  `FusedPath.context`: an attention function registered in a library), and
- registers the module hooks that change what the model computes for the call (the
  Gradient x Input rules of AttnLRP and CP-LRP: canonizers in zennit's terms), on a
  module's output or, for an `InputHook`, on its inputs.

Every change is undone on exit, in reverse order, whether the call succeeded or not: one
undo list, each entry pushed just after its change is made. Recording what the model
computes is not the session's job: a `Recorder` (explain.engine.recorder) does it inside
an active session.

Threads: a session holds every object it changes, the model's modules (so its
parameters) and each flag's owner (a Hugging Face config), from entry to exit, in a
process-wide table outside the model (no attribute is written onto the user's objects).
So two sessions that would change a shared object, two models sharing one config or two
heads sharing one backbone, take turns, each saving and restoring the state the user left,
never the other call's; sessions on disjoint models run in parallel. Forwards outside
any session (another thread running a second model that shares a module, a tower, with
this one) are not held back: the hooks a call registers act only in its own thread
(`this_thread_only`), so they are never recorded, but they see the shared module as the
call has set it (eval mode, requires_grad, flags). A session waits
until all it needs is free and then takes it all at once, so two waiting sessions never
hold part of what the other needs. Nesting:

- a session for an object this thread already holds is refused (an `explain` inside a
  target callable on the same model): explanations on one model cannot be nested;
- a nested session on another model is allowed, unless waiting for it would close a
  cycle (thread 1 explains A and, inside, B; thread 2 explains B and, inside, A): the
  session that would close it is refused with `NestedExplanationError` instead of
  deadlocking, and its outer call unwinds, which frees what the other thread waits for.

After `fork`, the child process starts with an empty table except for what the forking
thread itself held (`os.register_at_fork`): the threads that held the rest do not exist in
the child, and a copied lock they held would never be released.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence

import torch
from torch import nn

from explain.architectures.base import Adapter, this_thread_only
from explain.architectures.wrappers import execution_devices
from explain.errors import ExplainError, NestedExplanationError
from explain.layout import FlagSetting, FusedPath, InputHook, ModuleHook

__all__ = ["Session"]


class _Holdings:
    """Which thread holds which objects (by id), and what each waiting thread wants.

    One condition guards both; a session takes everything it needs at once, or waits."""

    def __init__(self, held: dict[int, int] | None = None) -> None:
        self.condition = threading.Condition()
        self.holder: dict[int, int] = held or {}  # id(object) -> thread ident
        self.wanted: dict[int, frozenset[int]] = {}  # waiting thread -> ids it waits for

    def acquire(self, ids: frozenset[int]) -> None:
        me = threading.get_ident()
        with self.condition:
            if any(self.holder.get(key) == me for key in ids):
                raise NestedExplanationError(
                    "explanations cannot be nested: this thread is already explaining this "
                    "model (was explain called inside a target callable?); compute what the "
                    "target needs before the call, or explain a separate copy of the model"
                )
            try:
                while any(key in self.holder for key in ids):
                    self.wanted[me] = ids
                    if self._waits_for(me, me):
                        raise NestedExplanationError(
                            "explanations cannot be nested across models here: another "
                            "thread is explaining this model and waits, inside its own "
                            "explanation, for a model this thread is explaining, so the two "
                            "would wait for each other forever; explain the inner model "
                            "before or after the outer call"
                        )
                    self.condition.wait()
            finally:
                self.wanted.pop(me, None)
            for key in ids:
                self.holder[key] = me

    def _waits_for(self, thread: int, target: int) -> bool:
        """Whether `thread`, waiting, is blocked (directly or through other waiting
        threads) by what `target` holds."""
        seen: set[int] = set()
        stack = [thread]
        while stack:
            waiting = stack.pop()
            for key in self.wanted.get(waiting, ()):
                holder = self.holder.get(key)
                if holder == target:
                    return True
                if holder is not None and holder not in seen:
                    seen.add(holder)
                    stack.append(holder)
        return False

    def release(self, ids: frozenset[int]) -> None:
        with self.condition:
            for key in ids:
                del self.holder[key]
            self.condition.notify_all()

    def after_fork(self) -> _Holdings:
        """The child's table: what the forking thread holds, nothing else."""
        me = threading.get_ident()
        return _Holdings({key: owner for key, owner in self.holder.items() if owner == me})


_HOLDINGS = _Holdings()


def _reset_after_fork() -> None:
    global _HOLDINGS
    _HOLDINGS = _HOLDINGS.after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)


def _set_requires_grad(module: nn.Module, name: str, flag: bool) -> None:
    parameter = module._parameters.get(name)
    if parameter is not None:
        parameter.requires_grad_(flag)


class Session(contextlib.AbstractContextManager["Session"]):
    """Borrow `adapter.model` for one call (module docstring).

    Args:
        adapter: the model's architecture adapter.
        differentiable: build an autograd graph (any gradient needs one); when False the
            calls inside run under `torch.no_grad()`.
        fused: the adapter's fused attention path when the call keeps the fused kernel
            (its flags are set, and a recorder recomputes attention from its sites);
            None: the explicit path's flags (`Adapter.path_flags`).
        hooks: (module, hook) pairs that change what the model computes for the call: a
            forward hook, or an `InputHook` run before the module; registered after every
            other change and removed first.
    """

    def __init__(
        self,
        adapter: Adapter,
        *,
        differentiable: bool = False,
        fused: FusedPath | None = None,
        hooks: Sequence[tuple[nn.Module, ModuleHook | InputHook]] = (),
    ) -> None:
        self.adapter = adapter
        self.model: nn.Module = adapter.model
        self.differentiable = differentiable
        self.fused = fused
        self._hooks = tuple(hooks)
        self._undo = contextlib.ExitStack()  # every change's undo, last change first
        self._held: frozenset[int] | None = None

    @property
    def active(self) -> bool:
        """Whether the session is entered (and the model borrowed)."""
        return self._held is not None

    def __enter__(self) -> Session:
        if torch.is_inference_mode_enabled():
            raise ExplainError(
                "explanations need autograd, which torch.inference_mode() disables; call "
                "explain outside inference_mode (torch.no_grad() is fine)"
            )
        if self.active:
            raise ExplainError("a Session cannot be entered twice")
        flags = self.fused.flags if self.fused is not None else self.adapter.path_flags()
        modules = list(self.model.modules())
        held = frozenset(id(obj) for obj in [*modules, *(flag.owner for flag in flags)])
        _HOLDINGS.acquire(held)  # a shared module or config: other sessions wait
        self._held = held
        try:
            self._fork_rng()
            self._undo.enter_context(
                torch.enable_grad() if self.differentiable else torch.no_grad()
            )
            self._freeze(modules)
            context = self.adapter.path_context() if self.fused is None else None
            if self.fused is not None and self.fused.context is not None:
                context = self.fused.context()
            if context is not None:
                self._undo.enter_context(context)
            self._set_flags(flags)
            for module, hook in self._hooks:
                if isinstance(hook, InputHook):
                    handle = module.register_forward_pre_hook(
                        this_thread_only(hook.hook), with_kwargs=True
                    )
                else:
                    handle = module.register_forward_hook(this_thread_only(hook), with_kwargs=True)
                self._undo.callback(handle.remove)
        except BaseException:
            self._give_back()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._give_back()

    def _give_back(self) -> None:
        try:
            self._undo.close()
        finally:
            if self._held is not None:  # last: the next session finds everything restored
                _HOLDINGS.release(self._held)
                self._held = None

    def _fork_rng(self) -> None:
        # The parameters' devices, and those accelerate runs offloaded modules on.
        found = {p.device for p in self.model.parameters()} | execution_devices(self.model)
        devices = sorted({device.index or 0 for device in found if device.type == "cuda"})
        self._undo.enter_context(torch.random.fork_rng(devices=devices))

    def _freeze(self, modules: list[nn.Module]) -> None:
        # Modes are saved and set per module: model.train(mode) would overwrite submodules
        # that the user had deliberately put in another mode.
        modes = [(module, module.training) for module in modules]
        self._undo.callback(lambda: [setattr(m, "training", mode) for m, mode in modes])
        for module in modules:
            module.training = False
        # Restored by owner and name, not on the parameter objects: accelerate's offloading
        # replaces an offloaded parameter with a new one at every forward.
        flags = [
            (module, name, parameter.requires_grad)
            for module in modules
            for name, parameter in module._parameters.items()
            if parameter is not None
        ]
        self._undo.callback(lambda: [_set_requires_grad(*flag) for flag in flags])
        for module, name, _ in flags:
            _set_requires_grad(module, name, False)

    def _set_flags(self, flags: Sequence[FlagSetting]) -> None:
        for setting in flags:
            old = getattr(setting.owner, setting.name)
            self._undo.callback(lambda s=setting, v=old: setattr(s.owner, s.name, v))
            setattr(setting.owner, setting.name, setting.value)
