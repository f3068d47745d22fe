"""INT4 weight-only (W4A16) products: group quantization and the NumPy references of the
``*_int4`` ops.

Storage (``STORAGE_TYPE_INT4``, proto/helios/v1/manifest.proto): two 4-bit codes a byte,
element 2i in the low nibble of byte i, rows contiguous; groups of ``G`` consecutive
elements along K share one f32 scale and one f32 zero point (``scales`` and
``zero_points``, each [N, K / G]):
``w[n, k] = (code[n, k] - zero[n, k // G]) * scale[n, k // G]``.
This is the asymmetric group-128 scheme AWQ writes (and GPTQ with ``sym=False``); a
symmetric checkpoint (GPTQ ``sym=True``) is the same form with every zero point 8.
Activations stay f32 (weight-only: the product dequantizes in registers on the GPU).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .elementwise import silu_mul
from .norm import rmsnorm

INT4_GROUP = 128


def int4_group(k: int) -> int | None:
    """The group an export uses for a weight of `k` input features: 128 (AWQ's and GPTQ's
    default), else the largest of 64 and 32 dividing `k` (SmolLM2's hidden size is 576 =
    9 x 64); None when none divides `k` (the weight stays plain)."""
    return next((g for g in (INT4_GROUP, 64, 32) if k % g == 0), None)


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
                  ) -> tuple[NDArray[np.uint8], NDArray[np.float32], NDArray[np.float32]]:
    """Asymmetric (min/max) group quantization of `w` [N, K] (K a multiple of `group`),
    AWQ's ``pseudo_quantize_tensor`` with ``zero_point=True`` in f32:
    ``scale = max(max - min, 1e-5) / 15`` over the group,
    ``zero = clip(-round(min / scale), 0, 15)``, ``code = clip(round(w / scale) + zero,
    0, 15)`` (round half to even, as torch.round).

    Returns:
        (packed codes [N, K / 2] uint8, scales [N, K / group] f32, zero points
        [N, K / group] f32 holding integers 0..15).
    """
    w = np.asarray(w, dtype=np.float32)
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    hi = g.max(axis=-1, keepdims=True)
    lo = g.min(axis=-1, keepdims=True)
    scale = (np.maximum(hi - lo, np.float32(1e-5)) / np.float32(15)).astype(np.float32)
    zero = np.clip(-np.rint(lo / scale), 0, 15).astype(np.float32)
    codes = np.clip(np.rint(g / scale) + zero, 0, 15).astype(np.uint8)
    return (pack_int4(codes.reshape(n, k)), scale.reshape(n, k // group),
            zero.reshape(n, k // group))


def dequantize_int4(packed: NDArray[np.uint8], scales: NDArray[np.float32],
                    zeros: NDArray[np.float32]) -> NDArray[np.float32]:
    """The f32 weight [N, K] of packed codes [N, K / 2], group scales and zero points
    [N, K / G]: ``(code - zero) * scale`` in f32 (exact: code - zero is a small integer)."""
    codes = unpack_int4(packed).astype(np.float32)
    n, k = codes.shape
    groups = np.asarray(scales).shape[1]
    group = k // groups
    z = np.asarray(zeros, dtype=np.float32)[:, :, None]
    s = np.asarray(scales, dtype=np.float32)[:, :, None]
    return ((codes.reshape(n, groups, group) - z) * s).reshape(n, k)


def _weight(weight, weight_scale, weight_zero, N: int) -> NDArray[np.float32]:
    # f32 weights are the codes dequantized once (the cpu backend's binding).
    if weight.dtype == np.float32:
        return weight[:N]
    return dequantize_int4(weight[:N], weight_scale[:N], weight_zero[:N])


def _product(a, weight, weight_scale, weight_zero, out, T: int, N: int, K: int,
             add: bool) -> None:
    acc = a[:T, :K] @ _weight(weight, weight_scale, weight_zero, N)[:, :K].T
    if add:
        out[:T, :N] += acc
    else:
        out[:T, :N] = acc


def linear_int4(x: NDArray[np.float32], weight: NDArray[np.uint8],
                weight_scale: NDArray[np.float32], weight_zero: NDArray[np.float32],
                out: NDArray[np.float32], T: int, N: int, K: int) -> None:
    """``out = x @ w^T`` with `w` the INT4 weight (``dequantize_int4``), f32 activations.

    Args:
        x: ``[T, K]`` f32.
        weight: ``[N, K / 2]`` uint8 packed codes (or their ``dequantize_int4`` as f32
            ``[N, K]``: the same product; the cpu backend dequantizes each weight once).
        weight_scale: ``[N, K / G]`` f32 group scales (G = K / its columns).
        weight_zero: ``[N, K / G]`` f32 group zero points (integers 0..15).
        out: ``[T, N]`` f32, written.
        T: token rows. N: output features. K: input features.
    """
    _product(x, weight, weight_scale, weight_zero, out, T, N, K, add=False)


def linear_add_int4(x, weight, weight_scale, weight_zero, out, T: int, N: int,
                    K: int) -> None:
    """``linear_int4`` added into `out` (``[T, N]`` f32, read and written: the residual)."""
    _product(x, weight, weight_scale, weight_zero, out, T, N, K, add=True)


def rmsnorm_linear_int4(x, norm_weight, weight, weight_scale, weight_zero, out, T: int,
                        N: int, K: int, eps: float) -> None:
    """``linear_int4(rmsnorm(x))``: `x` ``[T, K]`` f32, `norm_weight` ``[K]`` f32, `eps`
    added to the mean square; the rest as ``linear_int4``."""
    h = np.zeros((T, K), np.float32)
    rmsnorm(x, norm_weight, h, T, K, eps)
    _product(h, weight, weight_scale, weight_zero, out, T, N, K, add=False)


def _swiglu(x, T: int, K: int) -> NDArray[np.float32]:
    act = np.zeros((T, K), np.float32)
    silu_mul(x, act, T, K)
    return act


def swiglu_linear_int4(x, weight, weight_scale, weight_zero, out, T: int, N: int,
                       K: int) -> None:
    """``linear_int4(silu(gate) * up)`` of `x` ``[T, 2K]`` f32 (gate columns, then up)."""
    _product(_swiglu(x, T, K), weight, weight_scale, weight_zero, out, T, N, K, add=False)


def swiglu_linear_add_int4(x, weight, weight_scale, weight_zero, out, T: int, N: int,
                           K: int) -> None:
    """``swiglu_linear_int4`` added into `out` (``[T, N]`` f32, the residual)."""
    _product(_swiglu(x, T, K), weight, weight_scale, weight_zero, out, T, N, K, add=True)


# Each op reading a weight -> its INT4 form (scales, then zero points, follow the weight).
INT4_FORMS = {"linear": "linear_int4", "linear_add": "linear_add_int4",
              "rmsnorm_linear": "rmsnorm_linear_int4", "swiglu_linear": "swiglu_linear_int4",
              "swiglu_linear_add": "swiglu_linear_add_int4"}
