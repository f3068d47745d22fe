"""Vision encoder kernels: SigLIP-style patch embedding, per-window attention, layer
norm, tanh GELU, the pixel-shuffle connector and the merge of image features into the
prompt's embedding rows.

Index spaces: a *window* is one encoder input (a tile or the global view) of ``S x S``
pixels cut into ``G x G`` patches of ``P x P`` (``NP = G * G``); window rows are packed
window-major (row ``w * NP + i * G + j`` is patch (i, j) of window w). Only the first
``count[0]`` windows are live; every other row is written as zeros, so a step with fewer
windows than the captured capacity computes nothing stale.

Sources: transformers' ``Idefics3VisionEmbeddings`` (a stride-P convolution plus learned
positions), ``Idefics3VisionAttention`` (full attention inside a window),
``Idefics3Connector.pixel_shuffle`` and ``Idefics3Model.inputs_merger``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def _live(count: NDArray[np.int32], W: int) -> int:
    n = int(count[0])
    if not 0 <= n <= W:
        raise ValueError(f"window count {n} outside [0, {W}]")
    return n


def patchify(
    windows: NDArray[np.float32],
    count: NDArray[np.int32],
    out: NDArray[np.float32],
    W: int,
    S: int,
    P: int,
) -> None:
    """Cut each live window into its patch rows (the input of the patch embedding, a
    stride-P convolution written as a product with the ``[D, 3 P P]`` kernel).

    Reference loop::

        for w < count[0], patch (i, j):
            out[w*NP + i*G + j] = windows[w, :, i*P:(i+1)*P, j*P:(j+1)*P].reshape(3*P*P)
        rows of windows >= count[0]: zeros

    Args:
        windows: ``[W, 3, S, S]`` f32 normalized pixels.
        count: ``[1]`` i32 live windows.
        out: ``[W * NP, 3 * P * P]`` f32, written (patch values in (c, y, x) order).
    """
    G = S // P
    NP = G * G
    n = _live(count, W)
    x = windows[:W].reshape(W, 3, S, S)[:n]
    o = out[:W * NP, :3 * P * P]
    o[:n * NP] = x.reshape(n, 3, G, P, G, P).transpose(0, 2, 4, 1, 3, 5).reshape(n * NP, -1)
    o[n * NP:] = 0.0


def position_add(
    x: NDArray[np.float32],
    positions: NDArray[np.float32],
    T: int,
    NP: int,
    D: int,
) -> None:
    """``x[t] += positions[t % NP]`` in place (each window's learned patch positions).

    Args:
        x: ``[T, D]`` f32 window-major patch rows. positions: ``[NP, D]`` f32.
    """
    rows = x[:T, :D].reshape(T // NP, NP, D)
    rows += positions[:NP, :D]


def layernorm(
    x: NDArray[np.float32],
    weight: NDArray[np.float32],
    bias: NDArray[np.float32],
    out: NDArray[np.float32],
    T: int,
    D: int,
    eps: float,
) -> None:
    """``out[t] = (x[t] - mean) / sqrt(var + eps) * weight + bias`` (biased variance).

    Args:
        x: ``[T, D]`` f32. weight, bias: ``[D]`` f32. out: ``[T, D]`` f32, written.
    """
    v = x[:T, :D]
    mean = v.mean(axis=1, keepdims=True)
    var = ((v - mean) ** 2).mean(axis=1, keepdims=True)
    out[:T, :D] = (v - mean) / np.sqrt(var + np.float32(eps)) * weight[:D] + bias[:D]


def bias_add(x: NDArray[np.float32], bias: NDArray[np.float32], T: int, N: int) -> None:
    """``x[t, :] += bias`` in place. x: ``[T, N]`` f32; bias: ``[N]`` f32."""
    x[:T, :N] += bias[:N]


def gelu_tanh(x: NDArray[np.float32], out: NDArray[np.float32], T: int, N: int) -> None:
    """``out = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`` (PyTorch's
    ``gelu(approximate="tanh")``). x, out: ``[T, N]`` f32."""
    v = x[:T, :N]
    c = np.float32(np.sqrt(2.0 / np.pi))
    out[:T, :N] = 0.5 * v * (1.0 + np.tanh(c * (v + np.float32(0.044715) * v * v * v)))


def window_attention(
    qkv: NDArray[np.float32],
    count: NDArray[np.int32],
    out: NDArray[np.float32],
    W: int,
    NP: int,
    H: int,
    HD: int,
    scale: float,
) -> None:
    """Full (non-causal) attention among the patches of each live window.

    Reference loop::

        for w < count[0], head h, patch p:
            q = qkv[w*NP + p, h*HD:(h+1)*HD]               # row: [q (H HD), k, v]
            s[r] = q . qkv[w*NP + r, H*HD + h*HD: ...] * scale   for r < NP
            out[w*NP + p, h*HD:(h+1)*HD] = softmax(s) @ v-rows of window w

    Args:
        qkv: ``[W * NP, 3 * H * HD]`` f32 fused [q; k; v] rows.
        count: ``[1]`` i32 live windows.
        out: ``[W * NP, H * HD]`` f32, written (zeros past the live windows).
    """
    n = _live(count, W)
    E = H * HD
    o = out[:W * NP, :E]
    for w in range(n):  # one window at a time: [H, NP, NP] scores (SmolVLM: 50 MB)
        x = qkv[w * NP:(w + 1) * NP, :3 * E].reshape(NP, 3, H, HD)
        q, k, v = (x[:, i].transpose(1, 0, 2) for i in range(3))  # [H, NP, HD]
        s = (q @ k.transpose(0, 2, 1)) * np.float32(scale)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        o[w * NP:(w + 1) * NP] = (s @ v).transpose(1, 0, 2).reshape(NP, E)
    o[n * NP:] = 0.0


def pixel_shuffle(
    x: NDArray[np.float32],
    out: NDArray[np.float32],
    W: int,
    G: int,
    D: int,
    R: int,
) -> None:
    """Merge each ``R x R`` block of a window's ``G x G`` patch grid into one feature of
    width ``D * R * R`` (transformers' ``Idefics3Connector.pixel_shuffle``).

    Reference loop::

        for w, feature (a, b) of the (G/R x G/R) grid, (dy, dx) of its block:
            out[w*(G/R)^2 + a*(G/R) + b, (dy*R + dx)*D : +D] = x[w*G*G + (a*R+dy)*G + b*R+dx]

    Args:
        x: ``[W * G * G, D]`` f32 patch rows.
        out: ``[W * (G / R)^2, D * R * R]`` f32, written.
    """
    F = G // R
    v = x[:W * G * G, :D].reshape(W, F, R, F, R, D)  # [w, a, dy, b, dx, d]
    out[:W * F * F, :D * R * R] = v.transpose(0, 1, 3, 2, 4, 5).reshape(W * F * F, R * R * D)


def image_merge(
    features: NDArray[np.float32],
    index: NDArray[np.int32],
    x: NDArray[np.float32],
    T: int,
    F: int,
    D: int,
) -> None:
    """Write image features into the prompt's embedding rows.

    Reference loop::

        for t in range(T):
            if 0 <= index[t] < F:          # the packed token is a feature sentinel
                x[t, :] = features[index[t], :]

    Args:
        features: ``[F, D]`` f32 connector outputs of the step's windows.
        index: ``[T]`` i32 per packed token: its feature row, or -1 (a text token).
        x: ``[T, D]`` f32 embedding rows, updated in place.
    """
    idx = index[:T]
    live = (idx >= 0) & (idx < F)
    x[:T, :D][live] = features[idx[live], :D]
