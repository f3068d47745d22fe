"""Kernels of startup tuning producers (specification: "startup tuning bindings").

A tuning producer is a captured program the runtime runs once at startup; it writes a
tuned buffer that serving graphs read. The decode-split producer times each candidate
split count of ``attention_decode_split_tuned`` + ``attention_decode_merge_tuned`` on a
synthetic workload, between ``timer_mark`` launches, and ``split_tuning_select`` writes
the fastest candidate. On the GPU the clock is the global timer (``%globaltimer``, ns) read
by a one-program kernel: launches of one stream run in order, so two marks bracket the
launches between them. The NumPy references read ``time.perf_counter_ns`` instead (the
CPU backend runs launches synchronously in order).
"""

from __future__ import annotations

import time

import numpy as np
from numpy.typing import NDArray

MAX_CANDIDATES = 4
CANDIDATE_STRIDE = 4  # i32 per candidate: each candidate view is 16-byte aligned


def timer_mark(stamps: NDArray[np.uint32], index: int) -> None:
    """Store the clock in nanoseconds as ``stamps[index] = (low 32 bits, high 32 bits)``.

    Args:
        stamps: ``[N, 2]`` u32.
        index: the mark, in ``[0, N)``.
    """
    now = time.perf_counter_ns()
    stamps.reshape(-1, 2)[index] = (now & 0xFFFFFFFF, (now >> 32) & 0xFFFFFFFF)


def split_tuning_setup(
    positions: NDArray[np.int32],
    slot: NDArray[np.int32],
    page_table: NDArray[np.int32],
    candidates: NDArray[np.int32],
    B: int,
    MP: int,
    PT: int,
    C: int,
    c0: int,
    c1: int,
    c2: int,
    c3: int,
) -> None:
    """The timing workload of the decode-split producer: ``B`` rows at the full context.

    Reference loop::

        for b in range(B):
            positions[b] = MP * PT - 1; slot[b] = b
            page_table[b, j] = (b + j) % MP        for j in range(MP)
        candidates[i, 0] = (c0, c1, c2, c3)[i]    for i in range(C)

    Row ``b`` reads every one of the ``MP`` pages of the producer's own K/V planes, starting
    at page ``b``, so rows do not read the same page at the same time.

    Args:
        positions: ``[B]`` i32, written.
        slot: ``[B]`` i32, written.
        page_table: ``[B, MP]`` i32, written.
        candidates: ``[MAX_CANDIDATES, CANDIDATE_STRIDE]`` i32, column 0 written.
        B: rows. MP: pages per row. PT: tokens per page.
        C: candidates, ``1..MAX_CANDIDATES``. c0..c3: the candidate split counts.
    """
    positions[:B] = MP * PT - 1
    slot[:B] = np.arange(B, dtype=np.int32)
    page_table.reshape(-1, MP)[:B] = (np.arange(B)[:, None] + np.arange(MP)[None, :]) % MP
    values = (c0, c1, c2, c3)[:C]
    candidates.reshape(-1, CANDIDATE_STRIDE)[:C, 0] = values


def split_tuning_select(
    stamps: NDArray[np.uint32],
    candidates: NDArray[np.int32],
    choice: NDArray[np.int32],
    C: int,
) -> None:
    """Write the candidate whose marks are closest: ``choice[0] = candidates[argmin_i
    (stamp[2i + 1] - stamp[2i]), 0]`` (the first of equal times).

    Args:
        stamps: ``[2 * C, 2]`` u32 marks (start and end of each candidate).
        candidates: ``[MAX_CANDIDATES, CANDIDATE_STRIDE]`` i32.
        choice: ``[1]`` i32, written (the tuned buffer).
        C: candidates.
    """
    marks = stamps.reshape(-1, 2)[:2 * C].astype(np.int64)
    ns = marks[:, 0] | (marks[:, 1] << 32)
    elapsed = ns[1::2] - ns[0::2]
    choice.reshape(-1)[0] = candidates.reshape(-1, CANDIDATE_STRIDE)[int(np.argmin(elapsed)), 0]
