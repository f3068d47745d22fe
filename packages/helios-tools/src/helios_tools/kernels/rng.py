"""Philox4x32-10 counter-based RNG, vectorized over NumPy arrays.

Source: Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC'11,
and the Random123 reference implementation (``philox4x32round`` and key bump). The sampler
draws one uniform per (request seed, position, token index), so a seeded request samples
the same token whatever its batch neighbours or row order.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

PHILOX_M4X32_0 = np.uint64(0xD2511F53)
PHILOX_M4X32_1 = np.uint64(0xCD9E8D57)
PHILOX_W32_0 = np.uint64(0x9E3779B9)
PHILOX_W32_1 = np.uint64(0xBB67AE85)
PHILOX_ROUNDS = 10

_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)


def philox4x32_10(counter: ArrayLike, key: ArrayLike) -> NDArray[np.uint32]:
    """Philox4x32 with 10 rounds, broadcast over leading axes.

    Reference loop (Random123 ``philox4x32_R``), all arithmetic modulo 2**32::

        for round in range(10):
            if round > 0:
                k0 += 0x9E3779B9; k1 += 0xBB67AE85
            hi0, lo0 = mulhilo(0xD2511F53, c0)
            hi1, lo1 = mulhilo(0xCD9E8D57, c2)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0

    Args:
        counter: ``[..., 4]`` unsigned 32-bit words (c0, c1, c2, c3).
        key: ``[..., 2]`` unsigned 32-bit words (k0, k1); broadcast against ``counter``.

    Returns:
        ``[..., 4]`` uint32 output words.

    Raises:
        ValueError: if the last axis of ``counter`` is not 4 or of ``key`` is not 2.
    """
    c = np.asarray(counter, dtype=np.uint64)
    k = np.asarray(key, dtype=np.uint64)
    if c.shape[-1:] != (4,) or k.shape[-1:] != (2,):
        raise ValueError(f"counter must be [...,4] and key [...,2], got {c.shape} and {k.shape}")
    c0, c1, c2, c3 = c[..., 0], c[..., 1], c[..., 2], c[..., 3]
    k0, k1 = k[..., 0], k[..., 1]
    for rnd in range(PHILOX_ROUNDS):
        if rnd:
            k0 = (k0 + PHILOX_W32_0) & _MASK32
            k1 = (k1 + PHILOX_W32_1) & _MASK32
        p0 = c0 * PHILOX_M4X32_0  # a 32x32-bit product fits in uint64 exactly
        p1 = c2 * PHILOX_M4X32_1
        c0, c1, c2, c3 = (
            (p1 >> _SHIFT32) ^ c1 ^ k0,
            p1 & _MASK32,
            (p0 >> _SHIFT32) ^ c3 ^ k1,
            p0 & _MASK32,
        )
    out = np.stack(np.broadcast_arrays(c0, c1, c2, c3), axis=-1)
    return out.astype(np.uint32)


def philox_uniform(
    seed_lo: int, seed_hi: int, position: int, index: ArrayLike, stream: int = 0
) -> NDArray[np.float64]:
    """Uniforms in (0, 1) for one request position, one per token index.

    ``counter = (index, position, stream, 0)``, ``key = (seed_lo, seed_hi)``; output word 0
    becomes ``u = ((x0 >> 8) + 0.5) * 2**-24``. The value is exact in float64 (in float32,
    ``2**24 - 0.5`` would round up to ``2**24`` and give ``u == 1``).

    Args:
        seed_lo: key word 0 (uint32).
        seed_hi: key word 1 (uint32).
        position: token position of the draw; negative values wrap modulo 2**32.
        index: ``[N]`` token indices (vocabulary ids).
        stream: counter word 2, the draw's reservation (0: the sampler's token draws;
            speculative streams in helios_tools.kernels.speculative).

    Returns:
        ``[N]`` float64 uniforms strictly inside (0, 1).
    """
    idx = np.asarray(index, dtype=np.int64).astype(np.uint64) & _MASK32
    n = idx.shape[0]
    counter = np.zeros((n, 4), dtype=np.uint64)
    counter[:, 0] = idx
    counter[:, 1] = np.uint64(int(position) & 0xFFFFFFFF)
    counter[:, 2] = np.uint64(int(stream) & 0xFFFFFFFF)
    key = np.array([int(seed_lo) & 0xFFFFFFFF, int(seed_hi) & 0xFFFFFFFF], dtype=np.uint64)
    x0 = philox4x32_10(counter, key)[:, 0]
    return ((x0 >> np.uint32(8)).astype(np.float64) + 0.5) * 2.0**-24
