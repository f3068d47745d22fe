"""Rotary position embedding (Su et al. 2021), HF ``rotate_half`` (half-split) layout."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def rope(
    qkv: NDArray[np.float32],
    positions: NDArray[np.int32],
    inv_freq: NDArray[np.float32],
    T: int,
    H: int,
    KVH: int,
    HD: int,
) -> None:
    """Rotate the query and key heads of the fused QKV rows in place; values untouched.

    ``inv_freq`` is data, so Llama-3 style frequency scaling needs no code. Angles are
    computed in f32 as HF transformers does (``position * inv_freq``).

    Reference loop::

        for t in range(T):
            for h in range(H + KVH):          # q heads, then k heads
                x = qkv[t, h*HD:(h+1)*HD].copy()
                for i in range(HD // 2):
                    a = positions[t] * inv_freq[i]
                    qkv[t, h*HD + i]        = x[i] * cos(a) - x[i + HD//2] * sin(a)
                    qkv[t, h*HD + HD//2 + i] = x[i + HD//2] * cos(a) + x[i] * sin(a)

    Padding tokens are rotated by whatever position they carry (harmless, finite).

    Args:
        qkv: ``[T, (H + 2*KVH) * HD]`` f32, q and k heads rotated in place.
        positions: ``[T]`` i32 token positions (packed tokens).
        inv_freq: ``[HD/2]`` f32 inverse frequencies.
        T: token rows.
        H: query heads.
        KVH: key/value heads.
        HD: head dim (even).
    """
    half = HD // 2
    width = (H + KVH) * HD
    angle = positions[:T].astype(np.float32)[:, None] * inv_freq[None, :half]  # [T, HD/2]
    cos = np.cos(angle)[:, None, :]
    sin = np.sin(angle)[:, None, :]
    x = qkv[:T, :width].reshape(T, H + KVH, HD)
    x1 = x[..., :half]
    x2 = x[..., half:]
    r1 = x1 * cos - x2 * sin
    r2 = x2 * cos + x1 * sin
    qkv[:T, :width] = np.concatenate([r1, r2], axis=-1).reshape(T, width)
