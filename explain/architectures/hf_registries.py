"""What `explain` puts in transformers' attention registries for the calls that need it.

transformers looks a model's attention function (`AttentionInterface`) and its mask
function (`AttentionMaskInterface`) up by the name in `config._attn_implementation`, at
every forward, in process-wide tables. A `Registration` puts entries there while at least
one call needs them (calls in parallel are counted) and puts back what was there when the
last one leaves; its functions act for the threads inside such a call only, and give every
other thread what it would get without `explain`.

Two registrations use it: the fused path's probing sdpa wrapper
(explain.architectures.hf_attention_probe), and `finite_eager_masks`, which keeps the
eager masks of a float64 model finite where the eager attention reads them (below).
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["Entry", "Registration", "finite_eager_masks"]

Entry = tuple[type, str, Callable[[Callable[..., Any] | None], Callable[..., Any]]]
"""(registry class, name, make): `make(previous)` gives the function registered under the
name, from the one it replaces (None where the name was free)."""


class Registration:
    """`entries()`'s functions in transformers' registries for the duration of the calls
    that enter this context manager (module docstring); `entries` is called on first use,
    so that transformers is imported only by the calls that need it."""

    def __init__(self, entries: Callable[[], Sequence[Entry]]) -> None:
        self._entries = entries
        self._guard = threading.Lock()
        self._threads: Counter[int] = Counter()  # thread -> its calls inside
        self._saved: list[tuple[type, str, Callable[..., Any] | None]] = []

    def in_this_thread(self) -> bool:
        """Whether the running thread is inside a call that needs the entries."""
        return threading.get_ident() in self._threads

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._guard:
            if not self._threads:
                for registry, name, make in self._entries():
                    previous = registry._global_mapping.get(name)
                    self._saved.append((registry, name, previous))
                    registry.register(name, make(previous))
            self._threads[me] += 1
        try:
            yield
        finally:
            with self._guard:
                self._threads[me] -= 1
                if not self._threads[me]:
                    del self._threads[me]
                if not self._threads:  # `register` has no inverse: put back what was there
                    for registry, name, previous in reversed(self._saved):
                        if previous is None:
                            registry._global_mapping.pop(name, None)
                        else:
                            registry._global_mapping[name] = previous
                    self._saved.clear()


def _finite_eager_mask(original: Callable[..., Tensor | None]) -> Callable[..., Tensor | None]:
    """transformers' eager mask function `original`, whose float64 masks are raised to
    float32's lowest finite value for the threads inside an explain call.

    The eager attention of most families (Llama, Gemma, Qwen, Mistral, Phi-3, OLMo 2,
    GPT-NeoX, ...) adds the mask to the scores and takes the softmax in float32 whatever
    the model's dtype; a float64 mask holds float64's lowest value, which is -inf in
    float32. A query that sees no real key (a left pad under the causal mask) gets a row
    of -inf and NaN probabilities, and its NaN output reaches every real token through
    the next block's keys and values. With float32's lowest value the masked scores are
    exactly 0 after the softmax, as in float32, and a padded query's row is finite."""
    floor = torch.finfo(torch.float32).min

    def mask(*args: Any, **kwargs: Any) -> Tensor | None:
        built = original(*args, **kwargs)
        if (
            built is None
            or not finite_eager_masks.in_this_thread()
            or not built.is_floating_point()
            or torch.finfo(built.dtype).min >= floor
        ):
            return built
        return built.clamp_(min=floor)

    return mask


def _eager_mask_entries() -> list[Entry]:
    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:  # transformers before 4.53 builds its masks without a registry
        return []

    def make(previous: Callable[..., Any] | None) -> Callable[..., Any]:
        assert previous is not None, "transformers registers an eager mask function"
        return _finite_eager_mask(previous)

    return [(AttentionMaskInterface, "eager", make)]


finite_eager_masks = Registration(_eager_mask_entries)
"""transformers' eager masks kept finite in float32 for a float64 model (see
`_finite_eager_mask`), for the calls that enter it: a causal language model's explicit
path, and generating on the model's own path. Float32 and half-precision masks are left
as they are."""
