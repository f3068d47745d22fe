"""Repacked GGUF weights: the NumPy references of the INT4_MIN (``*_int4_min``) and INT8
(``*_int8``) weight-only products.

Storage (proto/helios/v1/manifest.proto), rows contiguous, groups of ``G`` consecutive
elements along K sharing one f32 scale (``scales``, [N, K / G]):

- ``STORAGE_TYPE_INT4_MIN``: 4-bit codes packed as INT4's (two a byte, element 2i in the
  low nibble of byte i) with one f32 minimum per group (``mins``, [N, K / G]):
  ``w[n, k] = code[n, k] * scale[n, k // G] + min[n, k // G]``. GGUF Q4_1 (scale d, min m)
  and Q4_K (scale d * sc, min -dmin * m per 32-element sub-block) are this form exactly.
- ``STORAGE_TYPE_INT8``: one two's-complement byte a code,
  ``w[n, k] = code[n, k] * scale[n, k // G]``. GGUF Q8_0 (G 32), Q5_0 (codes q - 16, G 32)
  and Q6_K (codes q - 32, scale d * sc, G 16) are this form exactly.

In f32, ``code * scale`` is exact (a code of at most 8 bits times a scale of at most 19
significant bits) and the added minimum rounds once: the same arithmetic as ggml's and
gguf-py's dequantization, so the repacked weights equal theirs bit for bit.
Activations stay f32 (weight-only).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .elementwise import silu_mul
from .embedding import embedding
from .int4 import unpack_int4
from .norm import rmsnorm


def dequantize_int4_min(packed: NDArray[np.uint8], scales: NDArray[np.float32],
                        mins: NDArray[np.float32]) -> NDArray[np.float32]:
    """The f32 weight [N, K] of packed 4-bit codes [N, K / 2], group scales and minimums
    [N, K / G]: ``code * scale + min`` in f32."""
    codes = unpack_int4(packed).astype(np.float32)
    n, k = codes.shape
    groups = np.asarray(scales).shape[1]
    s = np.asarray(scales, dtype=np.float32)[:, :, None]
    m = np.asarray(mins, dtype=np.float32)[:, :, None]
    return (codes.reshape(n, groups, k // groups) * s + m).reshape(n, k)


def dequantize_int8(codes: NDArray, scales: NDArray[np.float32]) -> NDArray[np.float32]:
    """The f32 weight [N, K] of int8 codes [N, K] (stored as bytes: uint8 or int8) and group
    scales [N, K / G]: ``code * scale`` in f32 (exact)."""
    c = np.asarray(codes).view(np.int8).astype(np.float32)
    n, k = c.shape
    groups = np.asarray(scales).shape[1]
    s = np.asarray(scales, dtype=np.float32)[:, :, None]
    return (c.reshape(n, groups, k // groups) * s).reshape(n, k)


def _product(a, w, out, T: int, N: int, K: int, add: bool) -> None:
    acc = a[:T, :K] @ w[:N, :K].T
    if add:
        out[:T, :N] += acc
    else:
        out[:T, :N] = acc


def _swiglu(x, T: int, K: int) -> NDArray[np.float32]:
    act = np.zeros((T, K), np.float32)
    silu_mul(x, act, T, K)
    return act


def _rmsnorm(x, norm_weight, T: int, K: int, eps: float) -> NDArray[np.float32]:
    h = np.zeros((T, K), np.float32)
    rmsnorm(x, norm_weight, h, T, K, eps)
    return h


# f32 weights are the codes dequantized once (the cpu backend's binding).
def _w4m(weight, scale, mins, N: int) -> NDArray[np.float32]:
    if weight.dtype == np.float32:
        return weight[:N]
    return dequantize_int4_min(weight[:N], scale[:N], mins[:N])


def _w8(weight, scale, N: int) -> NDArray[np.float32]:
    if weight.dtype == np.float32:
        return weight[:N]
    return dequantize_int8(weight[:N], scale[:N])


def linear_int4_min(x: NDArray[np.float32], weight: NDArray[np.uint8],
                    weight_scale: NDArray[np.float32], weight_min: NDArray[np.float32],
                    out: NDArray[np.float32], T: int, N: int, K: int) -> None:
    """``out = x @ w^T`` with `w` the INT4_MIN weight (``dequantize_int4_min``).

    Args:
        x: ``[T, K]`` f32.
        weight: ``[N, K / 2]`` uint8 packed codes (or their ``dequantize_int4_min`` as f32
            ``[N, K]``: the same product; the cpu backend dequantizes each weight once).
        weight_scale: ``[N, K / G]`` f32 group scales (G = K / its columns).
        weight_min: ``[N, K / G]`` f32 group minimums.
        out: ``[T, N]`` f32, written.
        T: token rows. N: output features. K: input features.
    """
    _product(x, _w4m(weight, weight_scale, weight_min, N), out, T, N, K, add=False)


def linear_add_int4_min(x, weight, weight_scale, weight_min, out, T: int, N: int,
                        K: int) -> None:
    """``linear_int4_min`` added into `out` (``[T, N]`` f32, the residual)."""
    _product(x, _w4m(weight, weight_scale, weight_min, N), out, T, N, K, add=True)


def rmsnorm_linear_int4_min(x, norm_weight, weight, weight_scale, weight_min, out, T: int,
                            N: int, K: int, eps: float) -> None:
    """``linear_int4_min(rmsnorm(x))``: `norm_weight` ``[K]`` f32, `eps` added to the mean
    square; the rest as ``linear_int4_min``."""
    _product(_rmsnorm(x, norm_weight, T, K, eps), _w4m(weight, weight_scale, weight_min, N),
             out, T, N, K, add=False)


def swiglu_linear_int4_min(x, weight, weight_scale, weight_min, out, T: int, N: int,
                           K: int) -> None:
    """``linear_int4_min(silu(gate) * up)`` of `x` ``[T, 2K]`` f32 (gate, then up)."""
    _product(_swiglu(x, T, K), _w4m(weight, weight_scale, weight_min, N), out, T, N, K,
             add=False)


def swiglu_linear_add_int4_min(x, weight, weight_scale, weight_min, out, T: int, N: int,
                               K: int) -> None:
    """``swiglu_linear_int4_min`` added into `out` (``[T, N]`` f32, the residual)."""
    _product(_swiglu(x, T, K), _w4m(weight, weight_scale, weight_min, N), out, T, N, K,
             add=True)


def linear_int8(x: NDArray[np.float32], weight: NDArray[np.uint8],
                weight_scale: NDArray[np.float32], out: NDArray[np.float32], T: int, N: int,
                K: int) -> None:
    """``out = x @ w^T`` with `w` the INT8 weight (``dequantize_int8``), f32 activations.

    Args:
        x: ``[T, K]`` f32.
        weight: ``[N, K]`` bytes, each a two's-complement int8 code (or their
            ``dequantize_int8`` as f32 ``[N, K]``, the cpu backend's binding).
        weight_scale: ``[N, K / G]`` f32 group scales (G = K / its columns).
        out: ``[T, N]`` f32, written.
        T: token rows. N: output features. K: input features.
    """
    _product(x, _w8(weight, weight_scale, N), out, T, N, K, add=False)


def linear_add_int8(x, weight, weight_scale, out, T: int, N: int, K: int) -> None:
    """``linear_int8`` added into `out` (``[T, N]`` f32, the residual)."""
    _product(x, _w8(weight, weight_scale, N), out, T, N, K, add=True)


def rmsnorm_linear_int8(x, norm_weight, weight, weight_scale, out, T: int, N: int, K: int,
                        eps: float) -> None:
    """``linear_int8(rmsnorm(x))``: `norm_weight` ``[K]`` f32, `eps` added to the mean
    square; the rest as ``linear_int8``."""
    _product(_rmsnorm(x, norm_weight, T, K, eps), _w8(weight, weight_scale, N), out, T, N,
             K, add=False)


def swiglu_linear_int8(x, weight, weight_scale, out, T: int, N: int, K: int) -> None:
    """``linear_int8(silu(gate) * up)`` of `x` ``[T, 2K]`` f32 (gate, then up)."""
    _product(_swiglu(x, T, K), _w8(weight, weight_scale, N), out, T, N, K, add=False)


def swiglu_linear_add_int8(x, weight, weight_scale, out, T: int, N: int, K: int) -> None:
    """``swiglu_linear_int8`` added into `out` (``[T, N]`` f32, the residual)."""
    _product(_swiglu(x, T, K), _w8(weight, weight_scale, N), out, T, N, K, add=True)


def embedding_int8(ids: NDArray[np.int32], weight: NDArray[np.uint8],
                   weight_scale: NDArray[np.float32], out: NDArray[np.float32], T: int,
                   D: int) -> None:
    """``embedding`` of the INT8 table: ``out[t] = w[ids[t]]`` (``dequantize_int8``), zeros
    for an id outside ``[0, V)``.

    Args:
        ids: ``[T]`` i32 token ids.
        weight: ``[V, D]`` bytes, int8 codes (or their ``dequantize_int8`` as f32, the cpu
            backend's binding).
        weight_scale: ``[V, D / G]`` f32 group scales.
        out: ``[T, D]`` f32, written.
        T: token rows. D: hidden size.
    """
    table = weight if weight.dtype == np.float32 else dequantize_int8(weight, weight_scale)
    embedding(ids, table, out, T, D)


# Each op reading a weight -> its INT4_MIN form (scales, then minimums, after the weight).
INT4_MIN_FORMS = {"linear": "linear_int4_min", "linear_add": "linear_add_int4_min",
                  "rmsnorm_linear": "rmsnorm_linear_int4_min",
                  "swiglu_linear": "swiglu_linear_int4_min",
                  "swiglu_linear_add": "swiglu_linear_add_int4_min"}
# Each op reading a weight -> its INT8 form (the scales after the weight; the embedding's
# table is its weight: a tied LM head and the embedding read one INT8 table).
INT8_FORMS = {"linear": "linear_int8", "linear_add": "linear_add_int8",
              "rmsnorm_linear": "rmsnorm_linear_int8", "swiglu_linear": "swiglu_linear_int8",
              "swiglu_linear_add": "swiglu_linear_add_int8", "embedding": "embedding_int8"}
