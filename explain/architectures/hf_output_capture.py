"""transformers' output-capturing hooks, there for one call and gone after it.

A model whose forward transformers decorates with `capture_outputs` installs forward
hooks on its layers the first time a forward asks for hidden states or attentions, marks
itself (`_output_capturing_hooks_installed`) and keeps them for good: the first call of
`explain` on a fresh LLaVA (whose vision tower always records a hidden state) left 8
hooks on its tower. So a session installs them itself where they are missing, under
transformers' own lock, notes exactly the hooks that this added, and removes those and
the mark on exit. A model that had them keeps them; hooks anyone else adds are never
touched. Forwards of another model sharing such a module, run by another thread at the
instant a call ends, are the case README's Threads promise leaves out.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from torch import nn

__all__ = ["output_capture_for_the_call"]

_MARK = "_output_capturing_hooks_installed"
_HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


@contextlib.contextmanager
def output_capture_for_the_call(modules: list[nn.Module]) -> Iterator[None]:
    """Within: every transformers model among `modules` (a model's, outermost first) has
    its output-capturing hooks; after: only those it had before."""
    capturing = sys.modules.get("transformers.utils.output_capturing")
    registry = getattr(capturing, "_CAN_RECORD_REGISTRY", None)
    if registry is None:  # transformers not imported (or too old to capture this way)
        yield
        return
    marks = {id(module): module.__dict__.get(_MARK) for module in modules}
    added: list[tuple[nn.Module, int]] = []
    with capturing._hook_installation_lock:
        for model in modules:
            if registry.get(model) and not getattr(model, _MARK, False):
                before = {id(m): set(m._forward_hooks) for m in model.modules()}
                capturing.install_all_output_capturing_hooks(model)  # inner models too
                added += [
                    (m, key)
                    for m in model.modules()
                    for key in m._forward_hooks
                    if key not in before[id(m)]
                ]
    try:
        yield
    finally:
        for module, key in added:
            for name in _HOOK_DICTS:
                getattr(module, name).pop(key, None)
        for module in modules:
            mark = marks[id(module)]
            if module.__dict__.get(_MARK) != mark:
                if mark is None:
                    del module.__dict__[_MARK]
                else:
                    module.__dict__[_MARK] = mark
