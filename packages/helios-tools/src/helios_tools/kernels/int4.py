"""INT4 weight-only (W4A16) products: group quantization and the NumPy reference of
``linear_int4``.

Storage (``STORAGE_TYPE_INT4``, proto/helios/v1/manifest.proto): two 4-bit codes a byte,
element 2i in the low nibble of byte i, rows contiguous; groups of ``G`` consecutive
elements along K share one f32 scale (``scales`` [N, K / G]); without zero points the
codes are symmetric around 8: ``w[n, k] = (code[n, k] - 8) * scale[n, k // G]``.
Activations stay f32 (weight-only: the product dequantizes in registers on the GPU).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

INT4_GROUP = 128


def pack_int4(codes: NDArray[np.integer]) -> NDArray[np.uint8]:
    """[N, K] codes in 0..15 (K even) -> [N, K / 2] bytes, element 2i in the low nibble."""
    c = np.asarray(codes, dtype=np.uint8)
    return (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)


def unpack_int4(packed: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """[N, K / 2] bytes -> [N, K] codes in 0..15 (inverse of ``pack_int4``)."""
    p = np.asarray(packed, dtype=np.uint8)
    out = np.empty((p.shape[0], p.shape[1] * 2), np.uint8)
    out[:, 0::2], out[:, 1::2] = p & 0xF, p >> 4
    return out


def quantize_int4(w: NDArray[np.floating], group: int = INT4_GROUP
                  ) -> tuple[NDArray[np.uint8], NDArray[np.float32]]:
    """Symmetric group quantization of `w` [N, K] (K a multiple of `group`):
    ``scale = max |group| / 7`` (1 for a zero group), ``code = clip(round(w / scale),
    -8, 7) + 8`` (round half to even). Returns (packed codes [N, K / 2] uint8,
    scales [N, K / group] f32)."""
    w = np.asarray(w, dtype=np.float32)
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    amax = np.abs(g).max(axis=-1, keepdims=True)
    scale = np.where(amax > 0, amax / np.float32(7), 1).astype(np.float32)
    codes = np.clip(np.rint(g / scale), -8, 7).astype(np.int16) + 8
    return pack_int4(codes.reshape(n, k)), scale.reshape(n, k // group)


def dequantize_int4(packed: NDArray[np.uint8], scales: NDArray[np.float32]
                    ) -> NDArray[np.float32]:
    """The f32 weight [N, K] of packed codes and group scales [N, K / G]."""
    codes = unpack_int4(packed).astype(np.float32) - 8
    n, k = codes.shape
    group = k // scales.shape[1]
    return (codes.reshape(n, k // group, group) * scales[:, :, None]).reshape(n, k)


def linear_int4(x: NDArray[np.float32], weight: NDArray[np.uint8],
                weight_scale: NDArray[np.float32], out: NDArray[np.float32],
                T: int, N: int, K: int) -> None:
    """``out = x @ w^T`` with `w` the INT4 weight (``dequantize_int4``), f32 activations.

    Args:
        x: ``[T, K]`` f32.
        weight: ``[N, K / 2]`` uint8 packed codes.
        weight_scale: ``[N, K / G]`` f32 group scales (G = K / its columns).
        out: ``[T, N]`` f32, written.
        T: token rows. N: output features. K: input features.
    """
    out[:T, :N] = x[:T, :K] @ dequantize_int4(weight[:N], weight_scale[:N]).T
