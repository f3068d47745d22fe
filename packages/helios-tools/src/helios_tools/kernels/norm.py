"""RMS normalization kernels (Zhang & Sennrich 2019, as in HF ``LlamaRMSNorm``)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def _rms_scale(x: NDArray[np.float32], eps: float) -> NDArray[np.float32]:
    # x: [T, D] f32 -> [T, 1] f32 reciprocal RMS
    ms = np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32)
    ms += np.float32(eps)
    return np.float32(1.0) / np.sqrt(ms)


def rmsnorm(
    x: NDArray[np.float32],
    weight: NDArray[np.float32],
    out: NDArray[np.float32],
    T: int,
    D: int,
    eps: float,
) -> None:
    """RMS norm of each token row, written to ``out``.

    Reference loop::

        for t in range(T):
            r = 1 / sqrt(sum(x[t, d] ** 2 for d in range(D)) / D + eps)
            for d in range(D):
                out[t, d] = x[t, d] * r * weight[d]

    Padding rows are normalized like any other row (rows are independent).

    Args:
        x: ``[T, D]`` f32 activations (packed tokens).
        weight: ``[D]`` f32 gain.
        out: ``[T, D]`` f32, written.
        T: token rows to process.
        D: hidden size.
        eps: added to the mean square.
    """
    xs = x[:T, :D]
    o = out[:T, :D]
    np.multiply(xs, _rms_scale(xs, eps), out=o)
    np.multiply(o, weight[:D], out=o)


def add_rmsnorm(
    x: NDArray[np.float32],
    residual: NDArray[np.float32],
    weight: NDArray[np.float32],
    out: NDArray[np.float32],
    T: int,
    D: int,
    eps: float,
) -> None:
    """Fused residual add and RMS norm.

    Reference loop::

        for t in range(T):
            for d in range(D):
                residual[t, d] += x[t, d]
            r = 1 / sqrt(sum(residual[t, d] ** 2 for d in range(D)) / D + eps)
            for d in range(D):
                out[t, d] = residual[t, d] * r * weight[d]

    Args:
        x: ``[T, D]`` f32 block output to add.
        residual: ``[T, D]`` f32 residual stream, updated in place.
        weight: ``[D]`` f32 gain.
        out: ``[T, D]`` f32 normalized result, written (may not alias ``residual``).
        T: token rows to process.
        D: hidden size.
        eps: added to the mean square.
    """
    res = residual[:T, :D]
    np.add(res, x[:T, :D], out=res)
    o = out[:T, :D]
    np.multiply(res, _rms_scale(res, eps), out=o)
    np.multiply(o, weight[:D], out=o)


def qk_rmsnorm(
    qkv: NDArray[np.float32],
    q_weight: NDArray[np.float32],
    k_weight: NDArray[np.float32],
    T: int,
    H: int,
    KVH: int,
    HD: int,
    eps: float,
) -> None:
    """RMS norm of every query and key head of fused ``[q; k; v]`` rows, in place (QK-norm:
    Qwen3's and Gemma 3's ``q_norm`` / ``k_norm``, before RoPE; values are untouched).

    Reference loop::

        for t in range(T):
            for h in range(H + KVH):
                head = qkv[t, h * HD:(h + 1) * HD]
                g = q_weight if h < H else k_weight
                r = 1 / sqrt(sum(head[d] ** 2 for d in range(HD)) / HD + eps)
                head[:] = head * r * g

    Args:
        qkv: ``[T, (H + 2 KVH) HD]`` f32, updated in place.
        q_weight: ``[HD]`` f32 gain of the query heads.
        k_weight: ``[HD]`` f32 gain of the key heads.
        T: token rows.
        H: query heads.
        KVH: key/value heads.
        HD: head width.
        eps: added to the mean square.
    """
    width = (H + 2 * KVH) * HD
    heads = qkv[:T, :width].reshape(T, H + 2 * KVH, HD)
    for lo, hi, gain in ((0, H, q_weight), (H, H + KVH, k_weight)):
        x = heads[:, lo:hi]
        ms = np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32)
        ms += np.float32(eps)
        np.multiply(x, np.float32(1.0) / np.sqrt(ms), out=x)
        np.multiply(x, gain[:HD], out=x)


# Gemma 3's name for the same operation (its cores launch ``head_rmsnorm``); both names stay
# registered until one family's capture moves to the other's.
head_rmsnorm = qk_rmsnorm
