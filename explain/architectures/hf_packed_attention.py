"""Attention over a packed sequence of images, seen image by image: the vision towers of
Qwen2-VL and Qwen2.5-VL, which attend piece by piece (each image, or a window of one)
and return no maps. Their blocks are recorded as the fused path records any block, on
either path (`AttentionSite.recomputed`): transformers' sdpa runs through
hf_attention_probe's wrapper, which hands every piece's q, k and v to the module's
`PackedProbe`, shown to the recorder as one batch of images with their pieces (`Pieces`);
`packed_recording` is what a call needs in place. docs/multimodal.md ("Vision-language
models", depth "tower" for Qwen2-VL) says what the folds then do with them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from functools import partial
from itertools import accumulate
from typing import Any

import torch
from torch import Tensor, nn

from explain.architectures.base import this_thread_only, whole_output
from explain.architectures.hf_attention_probe import (
    AttentionProbe,
    probe_of,
    registered,
    shown_mask,
)
from explain.architectures.hf_common import split_heads
from explain.errors import ExplainError
from explain.layout import FusedAttentionSite, Pieces

__all__ = ["PackedProbe", "packed_recording", "packed_sites"]


class PackedProbe(AttentionProbe):
    """The probe of one packed attention module (module docstring): it keeps the pieces
    of the module's current call and shows them together in `show`."""

    def __init__(self) -> None:
        super().__init__()
        self._pieces: list[tuple[Tensor, Tensor, Tensor]] = []
        self.images: tuple[int, int] | None = None
        """(k images, n tokens each) of the call, read as the tower starts."""

    def see(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, output: Tensor
    ) -> Tensor:
        if mask is not None:
            raise ExplainError("a packed attention piece came with a mask, which is not read")
        # Outside autograd: the recorder recomputes A from them without a graph.
        self._pieces.append((query.detach(), key.detach(), value.detach()))
        return output

    def show(self, packed: Tensor) -> Tensor:
        """The module's whole attention output (N, H * d), as it enters the output
        projection: the block shown to the recorder; returns what the projection gets
        instead (equal in value, through the recorder's output probe)."""
        pieces, self._pieces = self._pieces, []
        if self.images is None:
            raise ExplainError("a packed attention module ran outside its tower's forward")
        if not pieces:
            raise ExplainError(
                "a packed attention module's pieces were not seen: its attention function "
                "did not run through transformers' attention interface (is its attention "
                "implementation overridden in code?)"
            )
        count, tokens = self.images
        lengths = [piece[0].shape[2] for piece in pieces]
        images_end = set(range(tokens, count * tokens + 1, tokens))
        if packed.shape[0] != count * tokens or not images_end <= set(accumulate(lengths)):
            raise ExplainError(
                f"the packed attention's pieces {lengths} are not {count} images of "
                f"{tokens} tokens, each a whole number of pieces"
            )
        query, key, value = (
            torch.cat(parts, dim=2)[0].unflatten(1, (count, tokens)).transpose(0, 1)
            for parts in zip(*pieces, strict=True)
        )
        self.query(query)
        self.key(key)
        self.value(value)
        # Every image has one grid, hence the same pieces (windows) as the first.
        pieces = tuple(lengths[: len(lengths) // count])
        if list(pieces) * count != lengths:
            raise ExplainError(
                f"the packed attention's pieces {lengths} differ between its {count} images"
            )
        self.mask(None if len(pieces) == 1 else Pieces(pieces))  # one piece: the image
        shown = self.output(packed.view(count, tokens, -1))
        return shown.view(packed.shape)

    def clear(self) -> None:
        self._pieces = []
        self.images = None


def packed_sites(attention: Sequence[nn.Module], first_layer: int) -> list[FusedAttentionSite]:
    """The fused sites of the packed attention modules `attention` (one per block, in
    order, numbered from `first_layer`), through their `PackedProbe`s."""
    sites = []
    for layer, module in enumerate(attention, start=first_layer):
        probe = probe_of(module, PackedProbe)
        sites.append(
            FusedAttentionSite(
                layer=layer,
                query=probe.query,
                key=probe.key,
                value=probe.value,
                values=whole_output,
                output=probe.output,
                heads=partial(split_heads, int(module.head_dim)),
                scale=1.0,  # the probe shows q * scaling
                mask_module=probe.mask,
                masks=shown_mask,
            )
        )
    return sites


@contextlib.contextmanager
def packed_recording(
    tower: nn.Module, attention: Sequence[nn.Module], projections: Sequence[nn.Module]
) -> Iterator[None]:
    """What a call of a model with the packed `tower` needs in place (module docstring):
    the wrapper registered, the tower's images seen in its `grid_thw` (k rows (1, h, w)
    of one grid) and its patches, and each `attention` module's pieces shown as its
    output enters its output projection (`projections`, in the same order)."""
    probes = [probe_of(module, PackedProbe) for module in attention]

    def see_images(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        grid = kwargs["grid_thw"] if "grid_thw" in kwargs else args[1]
        patches = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        # Every image is one frame on one grid (the family's image_arguments checked it):
        # the images are the grid's rows, the patches shared equally among them, so
        # nothing is read from the device.
        count = grid.shape[0]
        tokens = patches.shape[0] // count
        for probe in probes:
            probe.images = (count, tokens)

    with contextlib.ExitStack() as undo:
        undo.enter_context(registered())
        for probe in probes:
            undo.callback(probe.clear)
        handle = tower.register_forward_pre_hook(this_thread_only(see_images), with_kwargs=True)
        undo.callback(handle.remove)
        for probe, projection in zip(probes, projections, strict=True):
            handle = projection.register_forward_pre_hook(
                this_thread_only(lambda module, args, p=probe: (p.show(args[0]), *args[1:]))
            )
            undo.callback(handle.remove)
        yield
