"""Fused kernels: two library ops in one launch, defined as their composition.

Each fused op has exactly the outputs of running its parts in order, so the NumPy
reference is that sequence; GPU kernels fuse them to save a launch per layer (decode is
launch-bound at small batch).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .cache import kv_write
from .elementwise import silu_mul
from .linear import linear
from .norm import rmsnorm
from .rope import rope


def rope_kv_write(
    qkv: NDArray[np.float32],
    positions: NDArray[np.int32],
    inv_freq: NDArray[np.float32],
    token_row: NDArray[np.int32],
    slot: NDArray[np.int32],
    page_table: NDArray[np.int32],
    k_cache: NDArray[np.float32],
    v_cache: NDArray[np.float32],
    T: int,
    R: int,
    MP: int,
    PT: int,
    H: int,
    KVH: int,
    HD: int,
) -> None:
    """``rope`` then ``kv_write``: rotate q and k in place, store k and v in the cache.

    Reference::

        rope(qkv, positions, inv_freq, T, H, KVH, HD)
        kv_write(qkv, positions, token_row, slot, page_table, k_cache, v_cache,
                 T, R, MP, PT, H, KVH, HD)

    Args: as ``rope`` and ``kv_write`` (qkv ``[T, (H + 2 KVH) HD]`` f32 updated; caches
    ``[P, PT, KVH, HD]`` f32 updated at each live token's position).
    """
    rope(qkv, positions, inv_freq, T, H, KVH, HD)
    kv_write(qkv, positions, token_row, slot, page_table, k_cache, v_cache,
             T, R, MP, PT, H, KVH, HD)


def swiglu_linear(
    x: NDArray[np.float32],
    weight: NDArray[np.float32],
    out: NDArray[np.float32],
    T: int,
    N: int,
    K: int,
) -> None:
    """SwiGLU then the down projection: ``out = (silu(gate) * up) @ weight^T``.

    Reference::

        act = zeros([T, K]); silu_mul(x, act, T, K)
        linear(act, weight, out, T, N, K)

    Args:
        x: ``[T, 2K]`` f32, gate columns then up columns.
        weight: ``[N, K]`` f32.
        out: ``[T, N]`` f32, written.
        T: token rows.
        N: output features.
        K: FFN width (half of x's row).
    """
    act = np.zeros((T, K), np.float32)
    silu_mul(x, act, T, K)
    linear(act, weight, out, T, N, K)


def rmsnorm_linear(
    x: NDArray[np.float32],
    norm_weight: NDArray[np.float32],
    weight: NDArray[np.float32],
    out: NDArray[np.float32],
    T: int,
    N: int,
    K: int,
    eps: float,
) -> None:
    """RMS norm of each row, then the projection: ``out = rmsnorm(x) @ weight^T``.

    The normalized rows are not stored (the GPU kernel recomputes each row's RMS in its
    prologue), so the norm costs no launch of its own.

    Reference::

        h = zeros([T, K]); rmsnorm(x, norm_weight, h, T, K, eps)
        linear(h, weight, out, T, N, K)

    Args:
        x: ``[T, K]`` f32 residual stream rows.
        norm_weight: ``[K]`` f32 RMS-norm gain.
        weight: ``[N, K]`` f32.
        out: ``[T, N]`` f32, written.
        T: token rows.
        N: output features.
        K: input features (hidden size).
        eps: added to the mean square.
    """
    h = np.zeros((T, K), np.float32)
    rmsnorm(x, norm_weight, h, T, K, eps)
    linear(h, weight, out, T, N, K)


def linear_add(
    x: NDArray[np.float32],
    weight: NDArray[np.float32],
    out: NDArray[np.float32],
    T: int,
    N: int,
    K: int,
) -> None:
    """The projection added into ``out`` (the residual add in the product's epilogue):
    ``out += x @ weight^T``.

    Reference::

        y = zeros([T, N]); linear(x, weight, y, T, N, K)
        out[:T, :N] += y

    Args:
        x: ``[T, K]`` f32 activations.
        weight: ``[N, K]`` f32.
        out: ``[T, N]`` f32 residual stream, updated in place.
        T: token rows.
        N: output features.
        K: input features.
    """
    y = np.zeros((T, N), np.float32)
    linear(x, weight, y, T, N, K)
    res = out[:T, :N]
    np.add(res, y, out=res)


def swiglu_linear_add(
    x: NDArray[np.float32],
    weight: NDArray[np.float32],
    out: NDArray[np.float32],
    T: int,
    N: int,
    K: int,
) -> None:
    """``swiglu_linear`` added into ``out``: ``out += (silu(gate) * up) @ weight^T``.

    Reference::

        y = zeros([T, N]); swiglu_linear(x, weight, y, T, N, K)
        out[:T, :N] += y

    Args:
        x: ``[T, 2K]`` f32, gate columns then up columns.
        weight: ``[N, K]`` f32.
        out: ``[T, N]`` f32 residual stream, updated in place.
        T: token rows.
        N: output features.
        K: FFN width (half of x's row).
    """
    y = np.zeros((T, N), np.float32)
    swiglu_linear(x, weight, y, T, N, K)
    res = out[:T, :N]
    np.add(res, y, out=res)
