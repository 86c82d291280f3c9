"""Relevance of two token sets (ICCV 2021): the encoder-decoder and co-attention rules.

Two sets q and i carry four relevance matrices per sample (R_qq = I, R_ii = I, R_qi =
R_iq = 0 to start), which every block updates with its Abar = mean_h (G * A)+ by its role
(`BlockRole`: self-, cross- or co-attention). The cross update needs the full normalised
matrices, so these rules cannot fold a readout row: `TwoSetFold` keeps every block's
matrix and replays the blocks in forward order, for every column of a call at once.
docs/multimodal.md ("Encoder-decoders", "Co-attention") gives the rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor

from explain.rules.fold import compute_dtype
from explain.rules.gradient import gradient_weighted
from explain.rules.registry import SpreadMode

__all__ = [
    "TWO_SET_METHODS",
    "BlockRole",
    "TwoSetFold",
    "TwoSetRelevance",
    "co_attention_update",
    "cross_attention_update",
    "normalize_residual",
    "row_at",
    "self_attention_update",
    "two_set_relevance",
]

TokenSet = Literal["q", "i"]

TWO_SET_METHODS = frozenset({"generic"})
"""The methods whose rule `TwoSetFold` has in its two-set form (ICCV 2021): those a
detector's and an encoder-decoder's plans run."""

_MATRICES = ("qq", "qi", "iq", "ii")
"""The names of the four relevance matrices (rows' set, then columns')."""


def normalize_residual(relevance: Tensor) -> Tensor:
    """norm(R) = I + (R - I) / rowsum(R - I) for (B, N, N) R; zero rows of R - I stay 0.

    The residual's identity is kept apart so that the accumulated attention part of each
    row sums to one, which keeps the cross-attention update on the scale of its Abar.
    """
    identity = torch.eye(relevance.shape[-1], dtype=relevance.dtype, device=relevance.device)
    attention_part = relevance - identity
    sums = attention_part.sum(dim=-1, keepdim=True)
    zero = sums == 0
    scaled = attention_part / torch.where(zero, torch.ones_like(sums), sums)
    return identity + torch.where(zero, torch.zeros_like(scaled), scaled)


@dataclass(frozen=True)
class TwoSetRelevance:
    """The four relevance matrices of two token sets, each (B, rows, columns), or
    (C, B, rows, columns) for C score columns folded together."""

    qq: Tensor
    qi: Tensor
    iq: Tensor
    ii: Tensor

    @classmethod
    def initial(
        cls, batch: int, num_q: int, num_i: int, *, dtype: torch.dtype, device: torch.device
    ) -> TwoSetRelevance:
        """R_qq = I, R_ii = I, R_qi = R_iq = 0."""

        def eye(n: int) -> Tensor:
            return torch.eye(n, dtype=dtype, device=device).expand(batch, n, n).clone()

        return cls(
            qq=eye(num_q),
            qi=torch.zeros(batch, num_q, num_i, dtype=dtype, device=device),
            iq=torch.zeros(batch, num_i, num_q, dtype=dtype, device=device),
            ii=eye(num_i),
        )

    def get(self, rows: TokenSet, columns: TokenSet) -> Tensor:
        return getattr(self, rows + columns)


def _other(token_set: TokenSet) -> TokenSet:
    return "i" if token_set == "q" else "q"


def self_attention_update(
    state: TwoSetRelevance, token_set: TokenSet, matrix: Tensor
) -> TwoSetRelevance:
    """Self-attention of `token_set` s with Abar `matrix` (B, N_s, N_s):
    R_ss += Abar @ R_ss and R_so += Abar @ R_so (same Abar, matrices before the update)."""
    s, o = token_set, _other(token_set)
    return replace(
        state,
        **{
            s + s: state.get(s, s) + torch.bmm(matrix, state.get(s, s)),
            s + o: state.get(s, o) + torch.bmm(matrix, state.get(s, o)),
        },
    )


def _cross_additions(
    state: TwoSetRelevance, query_set: TokenSet, matrix: Tensor
) -> dict[str, Tensor]:
    s, o = query_set, _other(query_set)
    added_so = torch.bmm(normalize_residual(state.get(s, s)).transpose(-1, -2), matrix)
    return {
        s + o: torch.bmm(added_so, normalize_residual(state.get(o, o))),
        s + s: torch.bmm(matrix, state.get(o, s)),
    }


def cross_attention_update(
    state: TwoSetRelevance, query_set: TokenSet, matrix: Tensor
) -> TwoSetRelevance:
    """Cross-attention with queries from `query_set` s and keys from the other set o,
    Abar `matrix` (B, N_s, N_o): R_so += norm(R_ss)^T @ Abar @ norm(R_oo) and
    R_ss += Abar @ R_os, all from the matrices before this block."""
    additions = _cross_additions(state, query_set, matrix)
    return replace(state, **{key: state.get(*key) + value for key, value in additions.items()})


def co_attention_update(
    state: TwoSetRelevance, matrix_qi: Tensor, matrix_iq: Tensor
) -> TwoSetRelevance:
    """Cross-attention in both directions in one layer (two-stream models): both
    directions' updates are computed from the matrices before the layer and then added."""
    additions = _cross_additions(state, "q", matrix_qi)
    additions.update(_cross_additions(state, "i", matrix_iq))  # the four keys are disjoint
    return replace(state, **{key: state.get(*key) + value for key, value in additions.items()})


@dataclass(frozen=True)
class BlockRole:
    """What one recorded attention site is in a two-set model.

    `token_set` is the set its queries come from; `kind` is "self", "cross" (keys from
    the other set) or "co": one direction of a bi-directional co-attention layer, listed
    as two adjacent roles (queries from q, then from i) that are applied together. Roles
    are listed in forward order: the rules replay them that way.
    """

    layer: int
    token_set: TokenSet
    kind: Literal["self", "cross", "co"]


def two_set_relevance(
    roles: Sequence[BlockRole], matrices: Mapping[int, Tensor], num_q: int, num_i: int
) -> TwoSetRelevance:
    """R_qq, R_qi, R_iq, R_ii after every block: the rules replayed over `roles` in forward
    order, from each block's Abar `matrices[layer]` ((B, n, m), or (C, B, n, m) for C
    columns at once: the rules run over every leading axis as one batch of products)."""
    leading = matrices[roles[0].layer].shape[:-2]
    flat = {layer: matrix.flatten(0, -3) for layer, matrix in matrices.items()}
    first = flat[roles[0].layer]
    state = TwoSetRelevance.initial(
        first.shape[0], num_q, num_i, dtype=first.dtype, device=first.device
    )
    ordered = iter(roles)
    for role in ordered:
        matrix = flat[role.layer]
        if role.kind == "self":
            state = self_attention_update(state, role.token_set, matrix)
        elif role.kind == "cross":
            state = cross_attention_update(state, role.token_set, matrix)
        else:
            partner = next(ordered)
            state = co_attention_update(state, matrix, flat[partner.layer])
    return TwoSetRelevance(**{key: state.get(*key).unflatten(0, leading) for key in _MATRICES})


def _checked_layers(roles: Sequence[BlockRole]) -> range:
    """The model-wide layers of `roles`, once they are known to be consecutive layers in
    forward order with co-attention in adjacent pairs (queries from q, then from i)."""
    layers = [role.layer for role in roles]
    if not layers or layers != list(range(layers[0], layers[0] + len(layers))):
        raise ValueError("block roles must be consecutive layers, once each, in forward order")
    co = [role for role in roles if role.kind == "co"]
    pairs = zip(co[::2], co[1::2], strict=False)
    if len(co) % 2 or any(
        (a.token_set, b.token_set, b.layer - a.layer) != ("q", "i", 1) for a, b in pairs
    ):
        raise ValueError("co-attention roles come in adjacent pairs: queries from q, then i")
    return range(layers[0], layers[-1] + 1)


class TwoSetFold:
    """The two-set rules over `roles` (forward order) for every column of a call: each
    block's Abar = mean_h (G * A)+ for a chunk of columns as one (c, B, n, m) tensor on
    arrival (the maps are then released), and the rules replayed in forward order once
    per chunk, as soon as its last block has arrived, batched over its columns and
    samples. `result()` is the four relevance matrices of every column, (C, B, rows,
    columns) each, which the plan reads at its rows (`row_at`).

    It folds both token sets at once, so it is the call's fold itself; blocks may arrive
    in any order (the backward pass delivers the last block first).
    """

    spread: SpreadMode | None = None  # no block of it is a spread: its maps are needed whole

    def __init__(self, roles: Sequence[BlockRole], num_q: int, num_i: int) -> None:
        self.roles = tuple(roles)
        self.shape = (num_q, num_i)
        self.layers = _checked_layers(self.roles)
        self._pending: dict[int, dict[int, Tensor]] = {}  # first column of a chunk -> Abar
        self._done: dict[int, TwoSetRelevance] = {}  # first column of a chunk -> its result

    def add(self, layer: int, columns: slice, attention: Tensor, gradients: Tensor | None) -> None:
        if layer not in self.layers:
            return
        start = columns.start or 0
        matrices = self._pending.setdefault(start, {})
        matrices[layer] = _abar(attention, gradients)
        if len(matrices) == len(self.layers):
            del self._pending[start]
            self._done[start] = two_set_relevance(self.roles, matrices, *self.shape)

    def result(self) -> TwoSetRelevance:
        """R_qq, R_qi, R_iq, R_ii after every block, (C, B, rows, columns) each."""
        for matrices in self._pending.values():
            _require_every_block(self.layers, matrices)
        if not self._done:
            _require_every_block(self.layers, {})
        chunks = [self._done[start] for start in sorted(self._done)]
        if len(chunks) == 1:
            return chunks[0]
        return TwoSetRelevance(
            **{key: torch.cat([chunk.get(*key) for chunk in chunks]) for key in _MATRICES}
        )


def row_at(matrix: Tensor, rows: Tensor) -> Tensor:
    """Row `rows[..., b]` of `matrix` (..., B, n, m) for each sample b: (..., B, m), for
    any leading dimensions (columns) at once."""
    index = rows[..., None, None].expand(*rows.shape, 1, matrix.shape[-1])
    return matrix.gather(-2, index).squeeze(-2)


def _abar(attention: Tensor, gradient: Tensor | None) -> Tensor:
    """The generic block matrix in the rules' dtype (explain.rules.fold.compute_dtype)."""
    dtype = compute_dtype(attention)
    gradient = gradient.to(dtype) if gradient is not None else None
    return gradient_weighted(attention.to(dtype), gradient)


def _require_every_block(layers: range, matrices: Mapping[int, Tensor]) -> None:
    missing = set(layers) - set(matrices)
    if missing:
        raise RuntimeError(f"blocks {sorted(missing)} never arrived; cannot apply the rules")
