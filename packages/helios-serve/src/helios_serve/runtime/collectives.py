"""What the collective ops of a tensor-parallel program run on, per rank.

A CPU backend binds each collective launch (``all_reduce_sum``, ``all_gather_columns``,
``broadcast_rank0``) to one
rank's `Collectives` (the launch's arguments are that rank's views). Every implementation
computes exactly the NumPy references of ``helios_tools.kernels.collective`` (the sum in
rank order), so every rank ends a collective with the same bytes:

- `SingleRank`: a single-rank core (the sum of one part is the part).
- `ThreadGroup.member(r)`: RankPeers::Threads, ranks as threads of one process sharing
  memory: each rank publishes its view, a barrier, each reads every part, a barrier.
- ``runtime.rank_processes``: RankPeers::Processes (MPI through mpi4py).

A collective whose group is broken (a rank failed, or the group was closed) raises
`RankLost` on every rank instead of waiting forever.
"""

from __future__ import annotations

import threading
from typing import Protocol

import numpy as np
from helios_tools.kernels import collective as reference

from .errors import RankLost


class Collectives(Protocol):
    """One rank's side of the collectives (arguments as the kernel table's)."""

    def all_reduce_sum(self, x: np.ndarray, T: int, N: int) -> None: ...

    def all_gather_columns(self, x: np.ndarray, out: np.ndarray, T: int, NL: int,
                           N: int) -> None: ...

    def broadcast_rank0(self, x: np.ndarray, T: int, N: int) -> None: ...


class SingleRank:
    """The collectives of a single-rank core: local copies."""

    def all_reduce_sum(self, x: np.ndarray, T: int, N: int) -> None:
        """Nothing to add: the sum over one rank is its part."""

    def all_gather_columns(self, x: np.ndarray, out: np.ndarray, T: int, NL: int,
                           N: int) -> None:
        out[:T, :N] = reference.all_gather_columns([x], T, NL, N)

    def broadcast_rank0(self, x: np.ndarray, T: int, N: int) -> None:
        """Nothing to copy: the rank is rank 0."""


class ThreadGroup:
    """Shared-memory collectives of `ranks` threads of one process.

    Args:
        ranks: threads taking part (each calls through its `member`).
        timeout_s: a rank that does not reach a collective within this time breaks the
            group (RankLost on every rank) instead of hanging the others.
    """

    def __init__(self, ranks: int, timeout_s: float = 600.0):
        self.ranks = ranks
        self._parts: list[np.ndarray | None] = [None] * ranks
        self._barrier = threading.Barrier(ranks, timeout=timeout_s)
        self.broken_by: str | None = None

    def member(self, rank: int) -> _ThreadMember:
        return _ThreadMember(self, rank)

    def abort(self, reason: str) -> None:
        """Break the group: every rank inside or entering a collective raises RankLost."""
        if self.broken_by is None:
            self.broken_by = reason
        self._barrier.abort()

    def _wait(self) -> None:
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            raise RankLost(f"collective abandoned: {self.broken_by or 'a rank timed out'}"
                           ) from None

    def _exchange(self, rank: int, part: np.ndarray) -> list[np.ndarray]:
        """Publish `part`, wait for every rank's; returns them in rank order."""
        self._parts[rank] = part
        self._wait()
        return [p for p in self._parts if p is not None]


class _ThreadMember:
    """Rank `rank`'s side of a ThreadGroup."""

    def __init__(self, group: ThreadGroup, rank: int):
        self._group = group
        self.rank = rank

    def all_reduce_sum(self, x: np.ndarray, T: int, N: int) -> None:
        parts = self._group._exchange(self.rank, x)
        total = reference.all_reduce_sum(parts, T, N)
        self._group._wait()  # every rank has read every part: now overwrite in place
        x[:T, :N] = total

    def all_gather_columns(self, x: np.ndarray, out: np.ndarray, T: int, NL: int,
                           N: int) -> None:
        parts = self._group._exchange(self.rank, x)
        out[:T, :N] = reference.all_gather_columns(parts, T, NL, N)
        self._group._wait()  # no rank rewrites its part before every rank copied it

    def broadcast_rank0(self, x: np.ndarray, T: int, N: int) -> None:
        parts = self._group._exchange(self.rank, x)
        first = reference.broadcast_rank0(parts, T, N)
        self._group._wait()  # every rank has read rank 0's part: now overwrite in place
        x[:T, :N] = first
