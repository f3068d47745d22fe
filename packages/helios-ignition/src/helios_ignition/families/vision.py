"""A SigLIP vision tower and the pixel-shuffle connector, written against the builder
(HF ``Idefics3VisionTransformer`` + ``Idefics3Connector``; SmolVLM's tower).

Layer math, per window of NP = G x G patches (attention never crosses windows):
x = patch_w @ patchify(pixels) + patch_b + position; per layer x += out(attn(ln1(x))) and
x += fc2(gelu_tanh(fc1(ln2(x)))) (every product with its bias); h = post_ln(x);
features = proj(pixel_shuffle(h, R)) (no bias): NP / R^2 features of the text model's
width per window.

Buffers are ``V.*`` (weights: Q/K/V fused into one ``[3D, D]`` matrix and its bias) and
``vision.*`` (scratch sized for the captured window capacity).
"""

from __future__ import annotations

import math

from ..capture.builder import BufferTable, ProgramBuilder, View
from ..checkpoint.geometry import CONNECTOR, VISION_PREFIX, VisionGeometry


def owns(name: str) -> bool:
    """Whether weight buffer `name` is the tower's (``V.*``, ``V{i}.*``)."""
    head = name.split(".", 1)[0]
    return head == "V" or (head[:1] == "V" and head[1:].isdigit())

WINDOWS = "in.image_windows"  # f32 [windows, 3, S, S]: the layout's "windows" output
WINDOW_COUNT = "in.image_window_count"  # i32 [1]: the layout's "window_count" output
FEATURE_INDEX = "in.image_feature_index"  # i32 [tokens]: IMAGE_FEATURE_INDEX
FEATURES = "vision.features"  # f32 [windows * NP / R^2, text hidden]

_LAYER = {  # buffer kind -> HF tensors under encoder.layers.{i}., concatenated on axis 0
    "ln1_w": ["layer_norm1.weight"], "ln1_b": ["layer_norm1.bias"],
    "wqkv": ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"],
    "bqkv": ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"],
    "wo": ["self_attn.out_proj.weight"], "bo": ["self_attn.out_proj.bias"],
    "ln2_w": ["layer_norm2.weight"], "ln2_b": ["layer_norm2.bias"],
    "fc1": ["mlp.fc1.weight"], "fc1_b": ["mlp.fc1.bias"],
    "fc2": ["mlp.fc2.weight"], "fc2_b": ["mlp.fc2.bias"],
}
_TOP = {
    "patch_w": [VISION_PREFIX + "embeddings.patch_embedding.weight"],
    "patch_b": [VISION_PREFIX + "embeddings.patch_embedding.bias"],
    "pos": [VISION_PREFIX + "embeddings.position_embedding.weight"],
    "post_w": [VISION_PREFIX + "post_layernorm.weight"],
    "post_b": [VISION_PREFIX + "post_layernorm.bias"],
    "proj": [CONNECTOR],
}


def weight_layout(v: VisionGeometry) -> dict[str, tuple[int, ...]]:
    """Vision weight buffer name -> shape (vectors are stored f32, matrices in the core's
    weight dtype)."""
    d, f, p = v.hidden_size, v.intermediate_size, v.patch_size
    shapes: dict[str, tuple[int, ...]] = {
        "V.patch_w": (d, 3 * p * p), "V.patch_b": (d,), "V.pos": (v.grid ** 2, d)}
    for i in range(v.num_layers):
        shapes |= {f"V{i}.ln1_w": (d,), f"V{i}.ln1_b": (d,), f"V{i}.wqkv": (3 * d, d),
                   f"V{i}.bqkv": (3 * d,), f"V{i}.wo": (d, d), f"V{i}.bo": (d,),
                   f"V{i}.ln2_w": (d,), f"V{i}.ln2_b": (d,), f"V{i}.fc1": (f, d),
                   f"V{i}.fc1_b": (f,), f"V{i}.fc2": (d, f), f"V{i}.fc2_b": (d,)}
    shapes |= {"V.post_w": (d,), "V.post_b": (d,),
               "V.proj": (v.text_hidden, d * v.scale_factor ** 2)}
    return shapes


def checkpoint_tensors(name: str) -> list[str]:
    """HF tensors concatenated (axis 0) into vision weight buffer `name`."""
    head, kind = name.split(".", 1)
    if head == "V":
        return list(_TOP[kind])
    prefix = f"{VISION_PREFIX}encoder.layers.{head[1:]}."
    return [prefix + t for t in _LAYER[kind]]


def features_per_window(v: VisionGeometry) -> int:
    return v.grid ** 2 // v.scale_factor ** 2


def declare(t: BufferTable, v: VisionGeometry, windows: int, tokens: int) -> None:
    """The image inputs (pixels, live window count, per-token feature row) and the
    encoder's f32 scratch for `windows` windows."""
    S, NP, d = v.image_size, v.grid ** 2, v.hidden_size
    R2 = v.scale_factor ** 2
    t.declare(WINDOWS, "f32", (windows, 3, S, S), "input")
    t.declare(WINDOW_COUNT, "i32", (1,), "input")
    t.declare(FEATURE_INDEX, "i32", (tokens,), "input")
    rows = windows * NP
    for name, width in (("patches", 3 * v.patch_size ** 2), ("x", d), ("h", d),
                        ("qkv", 3 * d), ("attn", d),
                        ("ffn", v.intermediate_size), ("act", v.intermediate_size)):
        t.declare(f"vision.{name}", "f32", (rows, width), "scratch")
    t.declare("vision.shuffled", "f32", (rows // R2, d * R2), "scratch")
    t.declare(FEATURES, "f32", (rows // R2, v.text_hidden), "scratch")


def encode(b: ProgramBuilder, v: VisionGeometry, windows: int) -> View:
    """Record the tower and the connector over `windows` captured windows (the live ones:
    ``in.image_window_count``); returns the features view ``[windows * NP / R^2,
    text hidden]``."""
    t = b.table
    S, P, G, R = v.image_size, v.patch_size, v.grid, v.scale_factor
    NP, d, f = G * G, v.hidden_size, v.intermediate_size
    H = v.num_heads
    T = windows * NP
    eps = v.layer_norm_eps
    count = t.view(WINDOW_COUNT, (1,))

    def s(name: str, width: int, rows: int = T) -> View:
        return t.view(f"vision.{name}", (rows, width))

    def w(name: str, *shape: int) -> View:
        return t.view(name, shape)

    x, h, qkv, attn = s("x", d), s("h", d), s("qkv", 3 * d), s("attn", d)
    ffn, act = s("ffn", f), s("act", f)
    patches = s("patches", 3 * P * P)
    b.launch("patchify", t.view(WINDOWS, (windows, 3, S, S)), count, patches, windows, S, P)
    b.launch("linear", patches, w("V.patch_w", d, 3 * P * P), x, T, d, 3 * P * P)
    b.launch("bias_add", x, w("V.patch_b", d), T, d)
    b.launch("position_add", x, w("V.pos", NP, d), T, NP, d)
    for i in range(v.num_layers):
        L = f"V{i}."
        b.launch("layernorm", x, w(L + "ln1_w", d), w(L + "ln1_b", d), h, T, d, eps)
        b.launch("linear", h, w(L + "wqkv", 3 * d, d), qkv, T, 3 * d, d)
        b.launch("bias_add", qkv, w(L + "bqkv", 3 * d), T, 3 * d)
        b.launch("window_attention", qkv, count, attn, windows, NP, H, d // H,
                 1.0 / math.sqrt(d // H))
        b.launch("linear", attn, w(L + "wo", d, d), h, T, d, d)
        b.launch("bias_add", h, w(L + "bo", d), T, d)
        b.launch("add", x, h, x, T, d)
        b.launch("layernorm", x, w(L + "ln2_w", d), w(L + "ln2_b", d), h, T, d, eps)
        b.launch("linear", h, w(L + "fc1", f, d), ffn, T, f, d)
        b.launch("bias_add", ffn, w(L + "fc1_b", f), T, f)
        b.launch("gelu_tanh", ffn, act, T, f)
        b.launch("linear", act, w(L + "fc2", d, f), h, T, d, f)
        b.launch("bias_add", h, w(L + "fc2_b", d), T, d)
        b.launch("add", x, h, x, T, d)
    b.launch("layernorm", x, w("V.post_w", d), w("V.post_b", d), h, T, d, eps)
    F = T // (R * R)
    shuffled = s("shuffled", d * R * R, F)
    b.launch("pixel_shuffle", h, shuffled, windows, G, d, R)
    features = t.view(FEATURES, (F, v.text_hidden))
    b.launch("linear", shuffled, w("V.proj", v.text_hidden, d * R * R), features, F,
             v.text_hidden, d * R * R)
    return features
