"""Triton kernels of the vision tower and connector (references: helios_tools/kernels/
vision.py, which states each loop). One program per row (patch row, token or feature)
and, for attention, per (query patch, head); correctness first, not tuned: the image
prefill benchmark (bench/gpu_vision.py) measures them.
"""

from __future__ import annotations

import triton
import triton.language as tl  # noqa: F401 (triton.jit below)


@triton.jit
def patchify(windows, count, out, W, S, P, BLOCK: tl.constexpr):
    """Row ``pid`` = patch (i, j) of window w, values in (c, y, x) order; zeros past the
    live windows; grid ``(W * NP,)``."""
    pid = tl.program_id(0)
    G = S // P
    NP = G * G
    w = pid // NP
    i = (pid % NP) // G
    j = pid % G
    e = tl.arange(0, BLOCK)
    me = e < 3 * P * P
    c = e // (P * P)
    y = (e // P) % P
    x = e % P
    live = w < tl.load(count)
    src = windows + w.to(tl.int64) * 3 * S * S + c * S * S + (i * P + y) * S + j * P + x
    v = tl.load(src, mask=me & live, other=0.0)
    tl.store(out + pid.to(tl.int64) * 3 * P * P + e, v, mask=me)


@triton.jit
def position_add(x, positions, T, NP, D, BLOCK_D: tl.constexpr, WBF16: tl.constexpr):
    """``x[t] += positions[t % NP]`` (positions bf16 when WBF16); grid ``(T,)``."""
    t = tl.program_id(0)
    d = tl.arange(0, BLOCK_D)
    md = d < D
    row = x + t.to(tl.int64) * D + d
    p = tl.load(positions + (t % NP).to(tl.int64) * D + d, mask=md, other=0.0).to(tl.float32)
    tl.store(row, tl.load(row, mask=md, other=0.0) + p, mask=md)


@triton.jit
def layernorm(x, weight, bias, out, T, D, eps, BLOCK_D: tl.constexpr):
    """``out[t] = (x[t] - mean) / sqrt(var + eps) * weight + bias``; grid ``(T,)``."""
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    md = d < D
    v = tl.load(x + t * D + d, mask=md, other=0.0)
    mean = tl.sum(v, axis=0) / D
    c = tl.where(md, v - mean, 0.0)
    var = tl.sum(c * c, axis=0) / D
    inv = tl.math.div_rn(1.0, tl.math.sqrt_rn(var + eps))
    g = tl.load(weight + d, mask=md, other=0.0)
    b = tl.load(bias + d, mask=md, other=0.0)
    tl.store(out + t * D + d, c * inv * g + b, mask=md)


@triton.jit
def bias_add(x, bias, T, N, BLOCK_D: tl.constexpr):
    """``x[t] += bias``; grid ``(T,)``."""
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    md = d < N
    row = x + t * N + d
    tl.store(row, tl.load(row, mask=md, other=0.0) + tl.load(bias + d, mask=md, other=0.0),
             mask=md)


@triton.jit
def gelu_tanh(x, out, T, N, BLOCK_D: tl.constexpr):
    """``out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``; grid ``(T,)``.
    tanh(z) = 1 - 2 / (exp(2 z) + 1), exact at both infinities."""
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    md = d < N
    v = tl.load(x + t * N + d, mask=md, other=0.0)
    z = 0.7978845608028654 * (v + 0.044715 * v * v * v)
    th = 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)
    tl.store(out + t * N + d, 0.5 * v * (1.0 + th), mask=md)


@triton.jit
def window_attention(qkv, count, out, W, NP, H, HD, scale, BLOCK_N: tl.constexpr,
                     BLOCK_HD: tl.constexpr):
    """Query row ``pid0`` (patch p of window w), head ``pid1``: softmax over the window's
    keys (online, BLOCK_N keys a step) times its values; zeros past the live windows;
    grid ``(W * NP, H)``."""
    row = tl.program_id(0)
    h = tl.program_id(1)
    w = row // NP
    E = H * HD
    d = tl.arange(0, BLOCK_HD)
    md = d < HD
    live = w < tl.load(count)
    q = tl.load(qkv + row.to(tl.int64) * 3 * E + h * HD + d, mask=md & live, other=0.0)
    m = tl.full((), float("-inf"), tl.float32)
    den = tl.zeros((), tl.float32)
    acc = tl.zeros((BLOCK_HD,), tl.float32)
    base = (w * NP).to(tl.int64)
    for start in range(0, NP, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        mn = (n < NP) & live
        keys = qkv + (base + n)[:, None] * 3 * E + E + h * HD + d[None, :]
        k = tl.load(keys, mask=mn[:, None] & md[None, :], other=0.0)
        s = tl.sum(k * q[None, :], axis=1) * scale
        s = tl.where(mn, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe)
        alpha = tl.exp(m - m_safe)
        v = tl.load(keys + E, mask=mn[:, None] & md[None, :], other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        den = den * alpha + tl.sum(p, axis=0)
        m = m_new
    o = tl.where(live, acc / tl.where(den > 0, den, 1.0), 0.0)
    tl.store(out + row.to(tl.int64) * E + h * HD + d, o, mask=md)


@triton.jit
def pixel_shuffle(x, out, W, G, D, R, BLOCK_D: tl.constexpr):
    """Feature row ``pid`` (window w, grid cell (a, b) of G/R x G/R) = the R x R patches
    of its block, (dy, dx) major; grid ``(W * (G / R)^2,)``."""
    pid = tl.program_id(0)
    F = G // R
    w = pid // (F * F)
    a = (pid % (F * F)) // F
    b = pid % F
    e = tl.arange(0, BLOCK_D)
    me = e < D * R * R
    k = e // D
    src = (w * G * G + (a * R + k // R) * G + b * R + k % R).to(tl.int64) * D + e % D
    v = tl.load(x + src, mask=me, other=0.0)
    tl.store(out + pid.to(tl.int64) * D * R * R + e, v, mask=me)


@triton.jit
def image_merge(features, index, x, T, F, D, BLOCK_D: tl.constexpr):
    """``x[t] = features[index[t]]`` where ``0 <= index[t] < F``; grid ``(T,)``."""
    t = tl.program_id(0)
    i = tl.load(index + t)
    ok = (i >= 0) & (i < F)
    d = tl.arange(0, BLOCK_D)
    md = d < D
    v = tl.load(features + tl.where(ok, i, 0).to(tl.int64) * D + d, mask=md & ok, other=0.0)
    tl.store(x + t.to(tl.int64) * D + d, v, mask=md & ok)


__all__ = ["bias_add", "gelu_tanh", "image_merge", "layernorm", "patchify", "pixel_shuffle",
           "position_add", "window_attention"]
