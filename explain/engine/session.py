"""The session: borrowing a model for one call, and giving it back exactly as found.

Everything that runs a model does it inside a `Session`: it holds the model's parts
against other calls, forks the RNG, sets autograd, eval mode, `requires_grad`,
transformers' output-capturing hooks (explain.architectures.hf_output_capture), the
attention path's flags (a call that records no attention may keep the model's own path)
and the rule hooks of the call, and undoes every change on exit,
in reverse order, whatever happened. Recording is the `Recorder`'s job, inside it.
docs/architecture.md ("Borrowing the model") says how threads, nesting and `fork` are
handled.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence

import torch
from torch import nn

from explain.architectures.base import Adapter, this_thread_only
from explain.architectures.hf_output_capture import output_capture_for_the_call
from explain.architectures.wrappers import (
    ACCELERATE_HOOK,
    HELD_LAYER_PACKAGES,
    execution_devices,
    held_still,
)
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
        own_path: keep the attention path the model's user chose (no flags, no path
            context), for a call that records no attention: what it computes is then
            what the model computes without `explain`. Not with `fused`.
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
        own_path: bool = False,
    ) -> None:
        if own_path and fused is not None:
            raise ExplainError("a Session on the model's own path cannot take the fused path")
        self.adapter = adapter
        self.model: nn.Module = adapter.model
        self.differentiable = differentiable
        self.fused = fused
        self.own_path = own_path
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
        flags: Sequence[FlagSetting] = ()
        if self.fused is not None:
            flags = self.fused.flags
        elif not self.own_path:
            flags = self.adapter.path_flags()
        # On its own path too the flags' owners are held: no other call may switch the
        # path of a config this model shares while this one runs.
        owners = [flag.owner for flag in (self.adapter.path_flags() if self.own_path else flags)]
        modules = list(self.model.modules())
        held = frozenset(id(obj) for obj in [*modules, *owners])
        _HOLDINGS.acquire(held)  # a shared module or config: other sessions wait
        self._held = held
        # What a wrapping library put in the model (accelerate's hooks, bitsandbytes'
        # layers), found in one pass; a plain model has none and asks wrappers.py nothing.
        wrapped = [
            module
            for module in modules
            if hasattr(module, ACCELERATE_HOOK)
            or type(module).__module__.startswith(HELD_LAYER_PACKAGES)
        ]
        # transformers' models (their class says what it may record), whose output-capturing
        # hooks it installs lazily; a timm or custom model has none and skips the step
        recording = [m for m in modules if hasattr(type(m), "_can_record_outputs")]
        try:
            if recording:  # first, so undone last: those hooks there for the call only
                self._undo.enter_context(output_capture_for_the_call(recording))
            self._fork_rng(wrapped)
            self._undo.enter_context(
                torch.enable_grad() if self.differentiable else torch.no_grad()
            )
            self._freeze(modules)
            context = None
            if self.fused is not None and self.fused.context is not None:
                context = self.fused.context()
            elif self.fused is None and not self.own_path:
                context = self.adapter.path_context()
            if context is not None:
                self._undo.enter_context(context)
            self._set_flags([*flags, *(held_still(wrapped) if wrapped else ())])
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

    def _fork_rng(self, wrapped: list[nn.Module]) -> None:
        # The parameters' devices, and those accelerate runs offloaded modules on.
        found = {p.device for p in self.model.parameters()}
        if wrapped:
            found.update(execution_devices(wrapped))
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
