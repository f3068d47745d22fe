"""Collective ops of tensor-parallel programs: their parameter lists' semantics and the
NumPy references every rank-peer implementation is checked against.

A tensor-parallel core (``ExecutionManifest.rank_count`` = N > 1) runs the same program
on every rank (SPMD) over that rank's slice of the weights (Megatron-LM's split:
column-parallel Q/K/V and gate/up, row-parallel O and down, a vocabulary-parallel head;
Shoeybi et al. 2019, arXiv:1909.08053, §3). Three collectives join the ranks:

- ``all_reduce_sum(x, T, N)``: after a row-parallel product each rank holds a partial
  ``x[T, N]``; afterwards every rank holds the same sum over ranks (in place).
- ``all_gather_columns(x, out, T, NL, N)``: each rank holds ``NL`` columns of the head's
  logits ``x[T, NL]`` (rank r: columns ``[r * NL, (r + 1) * NL)``; the last rank's pad
  columns past ``N`` are dropped); afterwards every rank holds all ``out[T, N]``.
- ``broadcast_rank0(x, T, N)``: afterwards every rank holds rank 0's ``x[T, N]`` (in
  place). Speculative prefix-limit programs broadcast the head's proposal confidence
  before device allocation (the specification, "Complete speculative generation":
  rank-zero confidence is broadcast before allocation), so every rank allocates the same
  verification rows even if their heads' confidences differed in the last bit.

A launch's arguments are one rank's views, so unlike every other op a collective cannot
run from its arguments alone: a backend binds it to its rank peers
(``helios_serve.runtime.ranks``), whose implementation must equal these references
(element for element; the sum in rank order). On one rank they are local: the sum of
one part is the part itself, rank 0's values are the rank's own.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from helios_contract import COLLECTIVE_OPS
from numpy.typing import NDArray

__all__ = ["COLLECTIVE_OPS", "all_gather_columns", "all_reduce_sum", "broadcast_rank0"]


def all_reduce_sum(parts: Sequence[NDArray[np.float32]], T: int, N: int
                   ) -> NDArray[np.float32]:
    """The sum over ranks of ``parts[r][:T, :N]``, accumulated in rank order (f32).

    Args:
        parts: one ``[>= T, >= N]`` f32 array per rank, rank 0 first.

    Returns:
        A new ``[T, N]`` f32 array (every rank's result).

    Raises:
        ValueError: no parts.
    """
    if not parts:
        raise ValueError("all_reduce_sum needs the part of at least one rank")
    total = np.array(parts[0][:T, :N], dtype=np.float32, copy=True)
    for part in parts[1:]:
        total += part[:T, :N]
    return total


def all_gather_columns(parts: Sequence[NDArray[np.float32]], T: int, NL: int, N: int
                       ) -> NDArray[np.float32]:
    """Columns ``[r * NL, min((r + 1) * NL, N))`` of the result from rank r's first
    columns of ``parts[r][:T]``.

    Args:
        parts: one ``[>= T, >= NL]`` f32 array per rank.
        NL: columns per rank (``ceil(N / ranks)``).
        N: columns of the result.

    Returns:
        A new ``[T, N]`` f32 array.

    Raises:
        ValueError: the ranks' columns do not cover ``N`` exactly once (NL x ranks < N,
            or a whole rank would lie past N).
    """
    ranks = len(parts)
    if ranks == 0 or NL * ranks < N or NL * (ranks - 1) >= N:
        raise ValueError(f"all_gather_columns: {ranks} ranks of {NL} columns do not cover "
                         f"{N} columns")
    out = np.empty((T, N), np.float32)
    for r, part in enumerate(parts):
        stop = min((r + 1) * NL, N)
        out[:, r * NL:stop] = part[:T, :stop - r * NL]
    return out


def broadcast_rank0(parts: Sequence[NDArray[np.float32]], T: int, N: int
                    ) -> NDArray[np.float32]:
    """Rank 0's ``parts[0][:T, :N]``, what every rank holds afterwards.

    Args:
        parts: one ``[>= T, >= N]`` f32 array per rank, rank 0 first.

    Returns:
        A new ``[T, N]`` f32 array.

    Raises:
        ValueError: no parts.
    """
    if not parts:
        raise ValueError("broadcast_rank0 needs the part of at least one rank")
    return np.array(parts[0][:T, :N], dtype=np.float32, copy=True)
