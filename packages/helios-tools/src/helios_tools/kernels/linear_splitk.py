"""References of the batched-decode GEMM path: packed bf16 activation terms, K-split
products and their fixed-order reduction (GPU kernels: ``kernels_triton/mma.py``).

Packed layout: a ``[T, K]`` f32 buffer whose row ``t`` holds, as ``2K`` little-endian
bf16 values, ``hi[t, 0:K]`` then ``lo[t, 0:K]`` with ``hi = bf16(a)`` and
``lo = bf16(a - hi)`` (round to nearest even, the ``.to(bfloat16)`` of the kernels);
``hi + lo`` is exact in f32 and keeps about 16 mantissa bits of ``a``.

Rounded layout (bf16 activations, ``ignition export --activation-dtype bf16``): the same
buffer with ``lo = 0``, written by ``round_bf16`` / ``swiglu_round_bf16``: the consumer
multiplies ``hi = bf16(a)`` alone, and the GPU's ``linear_packed`` skips the zero terms
(``XSPLIT=0``) without changing a value.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .elementwise import silu_mul

SLICE_ALIGN = 128  # K slices start at multiples of this (every BLOCK_K divides it)
# The ops writing the rounded layout (hi | 0): a bf16-activation core's producers.
ROUNDED_PRODUCERS = ("round_bf16", "swiglu_round_bf16")


def _bf16(a: NDArray[np.float32]) -> NDArray[np.uint16]:
    """Round-to-nearest-even bf16 bits of f32 `a` (finite inputs)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _widen(bits: NDArray[np.uint16]) -> NDArray[np.float32]:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def pack_terms(a: NDArray[np.float32]) -> NDArray[np.float32]:
    """The packed ``[T, K]`` buffer (f32 view of ``hi | lo`` bf16 rows) of f32 `a`."""
    hi = _bf16(a)
    lo = _bf16(a - _widen(hi))
    return np.ascontiguousarray(np.concatenate([hi, lo], axis=1)).view(np.float32)


def round_terms(a: NDArray[np.float32]) -> NDArray[np.float32]:
    """The rounded ``[T, K]`` buffer (f32 view of ``hi | 0`` bf16 rows) of f32 `a`."""
    hi = _bf16(a)
    return np.ascontiguousarray(np.concatenate([hi, np.zeros_like(hi)], axis=1)
                                ).view(np.float32)


def unpack_terms(packed: NDArray[np.float32], T: int, K: int) -> NDArray[np.float32]:
    """``hi + lo`` (f32, exact) of the first `T` rows of a packed ``[T, K]`` buffer."""
    bits = np.ascontiguousarray(packed[:T, :K]).view(np.uint16).reshape(T, 2 * K)
    return _widen(bits[:, :K]) + _widen(bits[:, K:])


def splitk_slice(K: int, S: int, s: int) -> tuple[int, int]:
    """K range ``[start, stop)`` of slice `s` of `S`: ``128 * cdiv(cdiv(K, S), 128)``
    wide, the last ones clipped at K (possibly empty)."""
    per = -(-K // S)
    span = SLICE_ALIGN * -(-per // SLICE_ALIGN)
    return min(s * span, K), min((s + 1) * span, K)


def split_bf16(x: NDArray[np.float32], out: NDArray[np.float32], T: int, K: int) -> None:
    """``out[t]`` = packed ``hi | lo`` terms of ``x[t]``.

    Args:
        x: ``[T, K]`` f32 activations.
        out: ``[T, K]`` f32 storage, written with ``2K`` bf16 values a row.
        T: token rows.
        K: features.
    """
    out[:T, :K] = pack_terms(x[:T, :K])


def swiglu_split_bf16(x: NDArray[np.float32], out: NDArray[np.float32], T: int,
                      K: int) -> None:
    """``split_bf16`` of ``silu_mul(x)``: ``x`` is ``[T, 2K]`` gate|up, ``out``
    ``[T, K]`` packed (the down projection's input)."""
    act = np.zeros((T, K), np.float32)
    silu_mul(x, act, T, K)
    out[:T, :K] = pack_terms(act)


def round_bf16(x: NDArray[np.float32], out: NDArray[np.float32], T: int, K: int) -> None:
    """``out[t]`` = ``bf16(x[t]) | 0``: the activation rounded to bf16 (round to nearest
    even) in the packed layout, its lo terms zero (``split_bf16``'s bf16-activation form).

    Args:
        x: ``[T, K]`` f32 activations (finite).
        out: ``[T, K]`` f32 storage, written with ``2K`` bf16 values a row (the last
            ``K`` zero).
        T: token rows.
        K: features.
    """
    out[:T, :K] = round_terms(x[:T, :K])


def swiglu_round_bf16(x: NDArray[np.float32], out: NDArray[np.float32], T: int,
                      K: int) -> None:
    """``round_bf16`` of ``silu_mul(x)``: ``x`` is ``[T, 2K]`` gate|up, ``out``
    ``[T, K]`` rounded (the down projection's input)."""
    act = np.zeros((T, K), np.float32)
    silu_mul(x, act, T, K)
    out[:T, :K] = round_terms(act)


def _partials(a: NDArray[np.float32], weight: NDArray[np.float32],
              partial: NDArray[np.float32], T: int, N: int, K: int, S: int) -> None:
    for s in range(S):
        k0, k1 = splitk_slice(K, S, s)
        partial[s * T:(s + 1) * T, :N] = a[:T, k0:k1] @ weight[:N, k0:k1].T


def linear_packed(x: NDArray[np.float32], weight: NDArray[np.float32],
                  partial: NDArray[np.float32], T: int, N: int, K: int, S: int) -> None:
    """``partial[s*T + t] = (hi + lo)[t, slice s] @ weight[:, slice s]^T`` for each of the
    `S` slices of ``splitk_slice`` (``S = 1``: the whole product).

    Args:
        x: ``[T, K]`` packed terms (``split_bf16``).
        weight: ``[N, K]`` f32 (bf16 values).
        partial: ``[S*T, N]`` f32, written.
        T, N, K: rows, output features, input features.
        S: K slices (>= 1).
    """
    _partials(unpack_terms(x, T, K), weight, partial, T, N, K, S)


def linear_packed_rows(x: NDArray[np.float32], weight: NDArray[np.float32],
                       partial: NDArray[np.float32], T: int, N: int, K: int, S: int) -> None:
    """``linear_packed`` whose rows do not depend on T or on the other rows: every row of
    every slice is one matrix-vector product (BLAS GEMV), as ``linear_invariant``
    computes its rows (a GEMM picks another kernel and rounding per row count). The op
    of drafter cores' row-invariant products on the packed path (capture.launch.
    invariant_splits); on the GPU, ``linear_packed`` with one tile per matrix.

    Args: as ``linear_packed``.
    """
    a = unpack_terms(x, T, K)
    for s in range(S):
        k0, k1 = splitk_slice(K, S, s)
        w = weight[:N, k0:k1]
        for t in range(T):
            np.dot(w, a[t, k0:k1], out=partial[s * T + t, :N])


def linear_partial(x: NDArray[np.float32], weight: NDArray[np.float32],
                   partial: NDArray[np.float32], T: int, N: int, K: int, S: int) -> None:
    """``linear_packed`` over f32 activations ``x`` ``[T, K]`` (the kernel splits them
    into the two bf16 terms in registers)."""
    _partials(x, weight, partial, T, N, K, S)


def splitk_reduce(partial: NDArray[np.float32], out: NDArray[np.float32], T: int, N: int,
                  S: int) -> None:
    """``out[t] = partial[t] + partial[T + t] + ...`` over the `S` slices, in f32, in
    slice order (``partial`` ``[S*T, N]``, ``out`` ``[T, N]``)."""
    acc = partial[:T, :N].copy()
    for s in range(1, S):
        acc += partial[s * T:(s + 1) * T, :N]
    out[:T, :N] = acc


def splitk_reduce_add(partial: NDArray[np.float32], out: NDArray[np.float32], T: int,
                      N: int, S: int) -> None:
    """``splitk_reduce`` added into ``out`` (the residual epilogue)."""
    acc = partial[:T, :N].copy()
    for s in range(1, S):
        acc += partial[s * T:(s + 1) * T, :N]
    out[:T, :N] = out[:T, :N] + acc
