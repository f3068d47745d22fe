"""FP8 (e4m3) W8A8 products: the encoding and the NumPy references of the ``*_fp8`` ops.

Weights are stored as ``STORAGE_TYPE_FP8_E4M3`` codes (one byte an element, the
``float8_e4m3fn`` encoding: 1 sign, 4 exponent bits biased by 7, 3 mantissa bits, no
infinities, 0x7F/0xFF NaN, largest finite 448) with one f32 scale per output row (the
``scales`` side buffer, ``[N, 1]``): ``w[n, k] = decode(codes[n, k]) * scale[n]``.

Activations are quantized per token when the product runs (dynamic W8A8): row ``t`` of the
product's input ``a`` ([T, K], after the op's prologue: RMS norm, SwiGLU) has the scale
``s[t] = max|a[t]| / 448`` (1 for an all-zero row) and the codes ``encode(a[t] / s[t])``.
The product is ``out[t, n] = s[t] * scale[n] * sum_k decode(qa[t, k]) decode(codes[n, k])``
with f32 accumulation: the GPU kernels multiply e4m3 operands on the tensor cores (or the
decoded values on the FMA units at one row) and apply both scales in the epilogue.

Encoding (``encode_e4m3``) is round to nearest even with saturation at +-448, as
``x.clamp(-448, 448).to(torch.float8_e4m3fn)`` and the GPU's ``cvt.rn.satfinite.e4m3x2``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .elementwise import silu_mul
from .norm import rmsnorm

E4M3_MAX = 448.0
# The smallest subnormal, 2^-9: every e4m3 value is an integer multiple of it.
_E4M3_TINY = 2.0 ** -9


def _decode_table() -> NDArray[np.float32]:
    codes = np.arange(256, dtype=np.uint32)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    value = np.where(exp == 0, man * _E4M3_TINY, (1.0 + man / 8.0) * 2.0 ** (exp.astype(np.int64) - 7))
    value = np.where((codes & 0x7F) == 0x7F, np.nan, value)
    return (sign * value).astype(np.float32)


E4M3_VALUES = _decode_table()  # code -> value, 256 f32 (NaN at 0x7F and 0xFF)
# The 127 non-negative finite values in code order (codes 0..126 increase with value).
_POSITIVE = E4M3_VALUES[:127].astype(np.float64)


def decode_e4m3(codes: NDArray[np.uint8]) -> NDArray[np.float32]:
    """e4m3 codes (uint8, any shape) -> their f32 values (same shape)."""
    return E4M3_VALUES[np.asarray(codes, dtype=np.uint8)]


def encode_e4m3(x: NDArray[np.floating]) -> NDArray[np.uint8]:
    """f32 values (any shape) -> e4m3 codes (uint8, same shape): round to nearest, ties to
    the even code (even mantissa), saturating at +-448; NaN -> 0x7F (with its sign bit).
    -0.0 keeps its sign (0x80)."""
    x = np.asarray(x, dtype=np.float32)
    mag = np.minimum(np.abs(x).astype(np.float64), E4M3_MAX)
    # The largest value <= mag and the next one up; ties go to the even code.
    below = np.searchsorted(_POSITIVE, mag, side="right") - 1
    above = np.minimum(below + 1, 126)
    lo, hi = _POSITIVE[below], _POSITIVE[above]
    up = (mag - lo > hi - mag) | ((mag - lo == hi - mag) & (below % 2 == 1))
    code = np.where(up, above, below).astype(np.uint8)
    code = np.where(np.isnan(x), np.uint8(0x7F), code)
    return (code | np.where(np.signbit(x), np.uint8(0x80), np.uint8(0))).astype(np.uint8)


def quantize_rows(a: NDArray[np.floating]) -> tuple[NDArray[np.uint8], NDArray[np.float32]]:
    """Per-row (per output channel of a weight, per token of an activation) e4m3 codes.

    Args:
        a: ``[R, K]`` finite floats.

    Returns:
        ``(codes [R, K] uint8, scales [R, 1] f32)`` with ``scales[r] = max|a[r]| / 448``
        (1 for an all-zero row) and ``codes = encode_e4m3(a / scales)``.
    """
    a = np.asarray(a, dtype=np.float32)
    amax = np.abs(a).max(axis=-1, keepdims=True) if a.shape[-1] else np.zeros((*a.shape[:-1], 1))
    scales = np.where(amax > 0, amax / np.float32(E4M3_MAX), 1.0).astype(np.float32)
    return encode_e4m3(a / scales), scales


def dequantize_rows(codes: NDArray[np.uint8], scales: NDArray[np.float32]
                    ) -> NDArray[np.float32]:
    """``decode_e4m3(codes) * scales`` ([R, K] codes, [R, 1] scales) as f32."""
    return decode_e4m3(codes) * np.asarray(scales, dtype=np.float32).reshape(-1, 1)


def _product(a: NDArray[np.float32], weight: NDArray[np.uint8], weight_scale, out,
             T: int, N: int, K: int, add: bool) -> None:
    qa, sa = quantize_rows(a[:T, :K])
    # f32 weights are the codes' values decoded once (the cpu backend's binding).
    w = weight[:N, :K] if weight.dtype == np.float32 else decode_e4m3(weight[:N, :K])
    acc = (decode_e4m3(qa) @ w.T) * sa * weight_scale[:N].reshape(1, N)
    if add:
        out[:T, :N] += acc
    else:
        out[:T, :N] = acc


def linear_fp8(x: NDArray[np.float32], weight: NDArray[np.uint8],
               weight_scale: NDArray[np.float32], out: NDArray[np.float32],
               T: int, N: int, K: int) -> None:
    """``out = x @ w^T`` in W8A8: `x` quantized per token, `weight` e4m3 codes with one
    scale per output row (the module docstring's product).

    Args:
        x: ``[T, K]`` f32 activations.
        weight: ``[N, K]`` uint8 e4m3 codes (or ``decode_e4m3`` of them as f32: the same
            product; the cpu backend decodes each weight once at load).
        weight_scale: ``[N, 1]`` f32 per-row scales.
        out: ``[T, N]`` f32, written.
        T: token rows. N: output features. K: input features.
    """
    _product(x, weight, weight_scale, out, T, N, K, add=False)


def linear_add_fp8(x, weight, weight_scale, out, T: int, N: int, K: int) -> None:
    """``linear_fp8`` added into `out` (``[T, N]`` f32, read and written: the residual)."""
    _product(x, weight, weight_scale, out, T, N, K, add=True)


def rmsnorm_linear_fp8(x, norm_weight, weight, weight_scale, out, T: int, N: int, K: int,
                       eps: float) -> None:
    """``linear_fp8(rmsnorm(x))``: the normalized rows are quantized per token.

    Args: `x` ``[T, K]`` f32, `norm_weight` ``[K]`` f32, `eps` added to the mean square;
    the rest as ``linear_fp8``.
    """
    h = np.zeros((T, K), np.float32)
    rmsnorm(x, norm_weight, h, T, K, eps)
    _product(h, weight, weight_scale, out, T, N, K, add=False)


def _swiglu(x, T: int, K: int) -> NDArray[np.float32]:
    act = np.zeros((T, K), np.float32)
    silu_mul(x, act, T, K)
    return act


def swiglu_linear_fp8(x, weight, weight_scale, out, T: int, N: int, K: int) -> None:
    """``linear_fp8(silu(gate) * up)`` of `x` ``[T, 2K]`` f32 (gate columns, then up):
    the SwiGLU rows are quantized per token."""
    _product(_swiglu(x, T, K), weight, weight_scale, out, T, N, K, add=False)


def swiglu_linear_add_fp8(x, weight, weight_scale, out, T: int, N: int, K: int) -> None:
    """``swiglu_linear_fp8`` added into `out` (``[T, N]`` f32, the residual)."""
    _product(_swiglu(x, T, K), weight, weight_scale, out, T, N, K, add=True)


# Each op reading a weight -> its FP8 form (the weight's scale buffer follows the weight).
FP8_FORMS = {"linear": "linear_fp8", "linear_add": "linear_add_fp8",
             "rmsnorm_linear": "rmsnorm_linear_fp8", "swiglu_linear": "swiglu_linear_fp8",
             "swiglu_linear_add": "swiglu_linear_add_fp8"}
