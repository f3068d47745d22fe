"""Vision reference kernels (helios_tools/kernels/vision.py): the tower and connector of
the tiny Idefics3 fixture against transformers' features for the same pixel values, and
each op's contract (live windows only, shuffle order, merge by index)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from helios_ignition.checkpoint.safetensors_loader import load_safetensors_dir
from helios_tools.kernels import vision as K

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "idefics3_tiny"


def test_tower_and_connector_equal_transformers():
    ck = load_safetensors_dir(FIXTURE / "checkpoint")
    ref = np.load(FIXTURE / "reference.npz")
    v = ck.geometry.vision
    pixels = ref["pixel_values"]
    W, D, F, NP, H = pixels.shape[0], v.hidden_size, v.intermediate_size, v.grid ** 2, v.num_heads
    T = W * NP
    count = np.array([W], np.int32)
    t, P = ck.tensor, "model.vision_model."
    x, h = np.zeros((T, D), np.float32), np.zeros((T, D), np.float32)
    patches = np.zeros((T, 3 * v.patch_size ** 2), np.float32)
    K.patchify(pixels, count, patches, W, v.image_size, v.patch_size)
    x[:] = patches @ t(P + "embeddings.patch_embedding.weight").T
    K.bias_add(x, t(P + "embeddings.patch_embedding.bias"), T, D)
    K.position_add(x, t(P + "embeddings.position_embedding.weight"), T, NP, D)
    for i in range(v.num_layers):
        L = f"{P}encoder.layers.{i}."
        K.layernorm(x, t(L + "layer_norm1.weight"), t(L + "layer_norm1.bias"), h, T, D, 1e-6)
        w = np.concatenate([t(L + f"self_attn.{k}_proj.weight") for k in "qkv"])
        qkv = (h @ w.T).astype(np.float32)
        K.bias_add(qkv, np.concatenate([t(L + f"self_attn.{k}_proj.bias") for k in "qkv"]),
                   T, 3 * D)
        attn = np.zeros((T, D), np.float32)
        K.window_attention(qkv, count, attn, W, NP, H, D // H, 1 / math.sqrt(D // H))
        x += attn @ t(L + "self_attn.out_proj.weight").T + t(L + "self_attn.out_proj.bias")
        K.layernorm(x, t(L + "layer_norm2.weight"), t(L + "layer_norm2.bias"), h, T, D, 1e-6)
        f = (h @ t(L + "mlp.fc1.weight").T + t(L + "mlp.fc1.bias")).astype(np.float32)
        g = np.zeros_like(f)
        K.gelu_tanh(f, g, T, F)
        x += g @ t(L + "mlp.fc2.weight").T + t(L + "mlp.fc2.bias")
    K.layernorm(x, t(P + "post_layernorm.weight"), t(P + "post_layernorm.bias"), h, T, D, 1e-6)
    R = v.scale_factor
    shuffled = np.zeros((T // R ** 2, D * R ** 2), np.float32)
    K.pixel_shuffle(h, shuffled, W, v.grid, D, R)
    features = shuffled @ t("model.connector.modality_projection.proj.weight").T
    np.testing.assert_allclose(features, ref["image_features"], atol=2e-5, rtol=0)


def test_only_live_windows_are_computed():
    rng = np.random.default_rng(0)
    windows = rng.standard_normal((3, 3, 4, 4)).astype(np.float32)
    out = np.full((12, 12), 9.0, np.float32)
    K.patchify(windows, np.array([2], np.int32), out, 3, 4, 2)
    assert (out[4 + 2] == windows[1, :, 2:4, 0:2].reshape(12)).all()  # window 1, patch (1, 0)
    assert (out[8:] == 0).all()
    rows = np.ones((8, 2), np.float32)
    K.position_add(rows, np.array([[1, 2], [3, 4], [5, 6], [7, 8]], np.float32), 8, 4, 2)
    assert rows[:, 0].tolist() == [2, 4, 6, 8, 2, 4, 6, 8]
    qkv = rng.standard_normal((12, 6)).astype(np.float32)
    attn = np.full((12, 2), 9.0, np.float32)
    K.window_attention(qkv, np.array([1], np.int32), attn, 3, 4, 1, 2, 1.0)
    s = qkv[:4, :2] @ qkv[:4, 2:4].T
    p = np.exp(s - s.max(1, keepdims=True))
    np.testing.assert_allclose(attn[:4], (p / p.sum(1, keepdims=True)) @ qkv[:4, 4:6],
                               rtol=1e-5)
    assert (attn[4:] == 0).all()
    with pytest.raises(ValueError, match=r"window count 4 outside \[0, 3\]"):
        K.window_attention(qkv, np.array([4], np.int32), attn, 3, 4, 1, 2, 1.0)


def test_pixel_shuffle_order_and_merge():
    x = np.arange(16, dtype=np.float32).reshape(16, 1)  # one window, 4 x 4 patches, D = 1
    out = np.zeros((4, 4), np.float32)
    K.pixel_shuffle(x, out, 1, 4, 1, 2)
    assert out.tolist() == [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]
    rows = np.zeros((4, 2), np.float32)
    K.image_merge(np.array([[1, 2], [3, 4]], np.float32), np.array([-1, 1, 0, 5], np.int32),
                  rows, 4, 2, 2)
    assert rows.tolist() == [[0, 0], [3, 4], [1, 2], [0, 0]]
