"""Device-owned pending tokens: gather a slot's pending token, scatter a sampled one.

Specification ("Host values and graph state"): a device-owned pending token lives in a
readable state view, one int32 per physical request row. A generating graph reads the
token it feeds from that view (``slot_gather``) and writes the token it samples back
(``slot_scatter``), so the host need not know step N's token to submit step N + 1.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def slot_gather(
    src: NDArray[np.int32],
    slot: NDArray[np.int32],
    out: NDArray[np.int32],
    R: int,
    S: int,
) -> None:
    """``out[r] = src[slot[r]]``; -1 for a padding row (slot outside ``[0, S)``).

    Reference loop::

        for r in range(R):
            out[r] = src[slot[r]] if 0 <= slot[r] < S else -1

    Args:
        src: ``[S]`` i32 per-slot values (the pending-token state view).
        slot: ``[R]`` i32 physical request row of each submission row.
        out: ``[R]`` i32, written (the fed tokens; -1 embeds as zeros).
        R: submission rows.
        S: physical request rows.
    """
    s = slot[:R]
    valid = (s >= 0) & (s < S)
    out[:R] = np.where(valid, src[np.where(valid, s, 0)], -1)


def slot_scatter(
    values: NDArray[np.int32],
    slot: NDArray[np.int32],
    decision: NDArray[np.int32],
    dst: NDArray[np.int32],
    R: int,
    S: int,
) -> None:
    """``dst[slot[r]] = values[r]`` for each sampling row with a valid slot.

    Rows with ``decision[r] == 0`` (a non-final prefill chunk) or a slot outside
    ``[0, S)`` (padding) write nothing. Slots of one step are distinct, so the order of
    the writes does not matter.

    Reference loop::

        for r in range(R):
            if decision[r] != 0 and 0 <= slot[r] < S:
                dst[slot[r]] = values[r]

    Args:
        values: ``[R]`` i32 sampled ids (the completion record).
        slot: ``[R]`` i32 physical request rows.
        decision: ``[R]`` i32 sampling decision per submission row.
        dst: ``[S]`` i32 per-slot state, updated.
        R: submission rows.
        S: physical request rows.
    """
    s = slot[:R]
    keep = (decision[:R] != 0) & (s >= 0) & (s < S)
    dst[s[keep]] = values[:R][keep]
