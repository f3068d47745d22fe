"""Elementwise kernels: residual add and the SwiGLU gate."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def add(
    a: NDArray[np.float32],
    b: NDArray[np.float32],
    out: NDArray[np.float32],
    T: int,
    D: int,
) -> None:
    """``out = a + b``.

    Reference loop::

        for t in range(T):
            for d in range(D):
                out[t, d] = a[t, d] + b[t, d]

    Args:
        a: ``[T, D]`` f32.
        b: ``[T, D]`` f32.
        out: ``[T, D]`` f32, written (may alias ``a`` or ``b``).
        T: token rows.
        D: row width.
    """
    np.add(a[:T, :D], b[:T, :D], out=out[:T, :D])


def silu_mul(gate_up: NDArray[np.float32], out: NDArray[np.float32], T: int, F: int) -> None:
    """SwiGLU activation: ``out = silu(gate) * up`` with ``gate_up = [gate | up]``.

    Reference loop::

        for t in range(T):
            for f in range(F):
                g = gate_up[t, f]
                out[t, f] = g / (1 + exp(-g)) * gate_up[t, F + f]

    Args:
        gate_up: ``[T, 2F]`` f32, gate columns then up columns.
        out: ``[T, F]`` f32, written.
        T: token rows.
        F: intermediate size.
    """
    g = gate_up[:T, :F]
    o = out[:T, :F]
    with np.errstate(over="ignore"):  # exp(-g) -> inf for g << 0 gives the right limit 0
        np.exp(-g, out=o)
    o += np.float32(1.0)
    np.divide(g, o, out=o)
    np.multiply(o, gate_up[:T, F : 2 * F], out=o)


def gelu_mul(gate_up: NDArray[np.float32], out: NDArray[np.float32], T: int, F: int) -> None:
    """GeGLU activation: ``out = gelu_tanh(gate) * up`` with ``gate_up = [gate | up]``
    (the tanh approximation of GELU, as HF's ``gelu_pytorch_tanh`` and ggml's
    ``ggml_gelu``).

    Reference loop::

        for t in range(T):
            for f in range(F):
                g = gate_up[t, f]
                c = sqrt(2 / pi) * (g + 0.044715 * g ** 3)
                out[t, f] = 0.5 * g * (1 + tanh(c)) * gate_up[t, F + f]

    Args:
        gate_up: ``[T, 2F]`` f32, gate columns then up columns.
        out: ``[T, F]`` f32, written.
        T: token rows.
        F: intermediate size.
    """
    g = gate_up[:T, :F]
    o = out[:T, :F]
    np.multiply(g, g, out=o)
    o *= np.float32(0.044715)
    o += np.float32(1.0)
    o *= g
    o *= np.float32(np.sqrt(2.0 / np.pi))
    np.tanh(o, out=o)
    o += np.float32(1.0)
    o *= g
    o *= np.float32(0.5)
    np.multiply(o, gate_up[:T, F : 2 * F], out=o)


def scale(x: NDArray[np.float32], T: int, D: int, factor: float) -> None:
    """``x *= factor`` in place (an embedding scale such as sqrt(hidden)).

    Reference loop::

        for t in range(T):
            for d in range(D):
                x[t, d] = x[t, d] * factor

    Args:
        x: ``[T, D]`` f32, updated.
        T: token rows.
        D: row width.
        factor: f32 multiplier.
    """
    x[:T, :D] *= np.float32(factor)
