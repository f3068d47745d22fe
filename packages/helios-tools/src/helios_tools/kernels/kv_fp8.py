"""FP8 (e4m3) KV cache: the ``*_fp8kv`` forms of the cache write and of every attention
that reads the paged cache.

A cache plane declared with ``STORAGE_TYPE_FP8_E4M3`` storage holds one e4m3 code (the
``float8_e4m3fn`` encoding of kernels/fp8.py) per element, ``[P, PT, KVH, HD]`` uint8,
with one f32 scale per kv head (the storage's ``scales`` side buffer, ``[KVH]``, a
weight of the core): the stored key of kv head ``h`` is ``decode(code) * scale[h]``.

- The write quantizes: ``code = encode_e4m3(x / scale[h])`` (f32 division, then round to
  nearest even, saturating at +-448: a value beyond ``448 * scale`` stores as +-448).
- Every reader takes exactly its f32 op's arithmetic over the dequantized keys and values
  ``decode(code) * scale[h]`` (one f32 product each): the reference loops of kernels/
  attention.py and kernels/attention_split.py with ``K[j]`` and ``V[j]`` read that way.
  Only the positions an attention reads are decoded (``E4m3Plane``), never a whole plane.

Each form's parameters are its f32 op's with ``k_scale, v_scale`` (``[KVH]`` f32) right
after ``v_cache``; ``k_cache``/``v_cache`` are the uint8 codes. ``row_copy_fp8kv`` (the
TRANSFER programs' row copy between an e4m3 plane and its continuation or host-tier
plane) is ``row_copy`` over uint8 rows: codes move as bytes, the scales stay put.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .attention import attention_decode_window, attention_prefill, attention_prefill_window
from .attention_split import (
    attention_decode_fused,
    attention_decode_split,
    attention_decode_split_tuned,
)
from .cache import kv_destinations
from .fp8 import decode_e4m3, encode_e4m3
from .rope import rope

# f32 op -> its e4m3-cache form (the launch geometry and GPU body are the f32 op's).
KV_FP8_FORMS = {
    "kv_write": "kv_write_fp8kv",
    "rope_kv_write": "rope_kv_write_fp8kv",
    "attention_prefill": "attention_prefill_fp8kv",
    "attention_prefill_window": "attention_prefill_window_fp8kv",
    "attention_decode_window": "attention_decode_window_fp8kv",
    "attention_decode_split": "attention_decode_split_fp8kv",
    "attention_decode_split_tuned": "attention_decode_split_tuned_fp8kv",
    "attention_decode_fused": "attention_decode_fused_fp8kv",
    "row_copy": "row_copy_fp8kv",
}
KV_FP8_BASE = {form: op for op, form in KV_FP8_FORMS.items()}


def quantize_kv(x: NDArray[np.float32], scale: NDArray[np.float32]) -> NDArray[np.uint8]:
    """``[..., KVH, HD]`` f32 keys or values -> their e4m3 codes (same shape, uint8):
    ``encode_e4m3(x / scale[h])`` per kv head ``h`` (``scale``: ``[KVH]`` f32, > 0)."""
    return encode_e4m3(np.asarray(x, np.float32) / scale.astype(np.float32)[:, None])


def dequantize_kv(codes: NDArray[np.uint8], scale: NDArray[np.float32]) -> NDArray[np.float32]:
    """``[..., KVH, HD]`` e4m3 codes -> f32 ``decode(code) * scale[h]`` (same shape)."""
    return decode_e4m3(codes) * scale.astype(np.float32)[:, None]


class E4m3Plane:
    """A read-only e4m3 cache plane as the f32 attention references index it:
    ``plane.reshape(-1, KVH, HD)[idx]`` is the dequantized ``[*idx.shape, KVH, HD]`` f32
    rows at flat token indices `idx` (``page * PT + offset``), decoded on the gather.

    Args:
        codes: ``[P, PT, KVH, HD]`` uint8 e4m3 codes.
        scale: ``[KVH]`` f32 per-head scales.
    """

    def __init__(self, codes: NDArray[np.uint8], scale: NDArray[np.float32]):
        self._codes = codes
        self._scale = np.asarray(scale, np.float32).reshape(-1)

    def reshape(self, *shape: int) -> E4m3Plane:
        """Only the flat token view ``(-1, KVH, HD)`` the references take."""
        KVH, HD = self._codes.shape[-2:]
        if shape != (-1, KVH, HD):
            raise ValueError(f"an e4m3 plane is read as (-1, {KVH}, {HD}), not {shape}")
        return E4m3Plane(self._codes.reshape(-1, KVH, HD), self._scale)

    def __getitem__(self, idx: NDArray[np.int64]) -> NDArray[np.float32]:
        return dequantize_kv(self._codes[idx], self._scale[: self._codes.shape[-2]])


def kv_write_fp8kv(qkv, positions, token_row, slot, page_table, k_cache, v_cache, k_scale,
                   v_scale, T, R, MP, PT, H, KVH, HD) -> None:
    """``kv_write`` into e4m3 planes: each real token's key and value heads are stored as
    ``quantize_kv(x, scale)`` at its position.

    Args:
        k_cache, v_cache: ``[P, PT, KVH, HD]`` uint8 codes, written at the real tokens.
        k_scale, v_scale: ``[KVH]`` f32 per-head scales.
        Others: as ``kv_write`` (kernels/cache.py).

    Raises:
        IndexError: as ``kv_write``.
    """
    t_idx, page, off = kv_destinations(positions, token_row, slot, page_table, T, R, MP, PT)
    if t_idx.size == 0:
        return
    k0, v0 = H * HD, (H + KVH) * HD
    k_cache[page, off] = quantize_kv(qkv[t_idx, k0:v0].reshape(-1, KVH, HD), k_scale[:KVH])
    v_cache[page, off] = quantize_kv(qkv[t_idx, v0:v0 + KVH * HD].reshape(-1, KVH, HD),
                                     v_scale[:KVH])


def rope_kv_write_fp8kv(qkv, positions, inv_freq, token_row, slot, page_table, k_cache,
                        v_cache, k_scale, v_scale, T, R, MP, PT, H, KVH, HD) -> None:
    """``rope`` then ``kv_write_fp8kv`` (``rope_kv_write`` into e4m3 planes).

    Args: as ``rope_kv_write`` (kernels/fused.py), the planes uint8 codes with their
    ``[KVH]`` f32 scales after them.
    """
    rope(qkv, positions, inv_freq, T, H, KVH, HD)
    kv_write_fp8kv(qkv, positions, token_row, slot, page_table, k_cache, v_cache, k_scale,
                   v_scale, T, R, MP, PT, H, KVH, HD)


# The readers: each f32 reference over E4m3Plane views of the codes (``K[j] =
# decode(k_cache[j]) * k_scale[h]``, V alike, in that op's reference loop). Arguments and
# errors are the f32 op's, with ``k_cache``/``v_cache`` ``[P, PT, KVH, HD]`` uint8 codes and
# ``k_scale``/``v_scale`` ``[KVH]`` f32 after them.


def attention_prefill_fp8kv(qkv, positions, token_row, slot, page_table, k_cache, v_cache,
                            k_scale, v_scale, out, T, R, MP, PT, H, KVH, HD, scale) -> None:
    """``attention_prefill`` over e4m3 planes."""
    attention_prefill(qkv, positions, token_row, slot, page_table, E4m3Plane(k_cache, k_scale),
                      E4m3Plane(v_cache, v_scale), out, T, R, MP, PT, H, KVH, HD, scale)


def attention_prefill_window_fp8kv(qkv, positions, token_row, slot, page_table, k_cache,
                                   v_cache, k_scale, v_scale, out, T, R, MP, PT, H, KVH, HD,
                                   W, scale) -> None:
    """``attention_prefill_window`` over e4m3 planes."""
    attention_prefill_window(qkv, positions, token_row, slot, page_table,
                             E4m3Plane(k_cache, k_scale), E4m3Plane(v_cache, v_scale), out, T,
                             R, MP, PT, H, KVH, HD, W, scale)


def attention_decode_window_fp8kv(qkv, positions, slot, page_table, k_cache, v_cache, k_scale,
                                  v_scale, out, B, MP, PT, H, KVH, HD, W, scale) -> None:
    """``attention_decode_window`` over e4m3 planes."""
    attention_decode_window(qkv, positions, slot, page_table, E4m3Plane(k_cache, k_scale),
                            E4m3Plane(v_cache, v_scale), out, B, MP, PT, H, KVH, HD, W, scale)


def attention_decode_split_fp8kv(qkv, positions, slot, page_table, k_cache, v_cache, k_scale,
                                 v_scale, part_ml, part_o, B, MP, PT, H, KVH, HD, NS, SPLIT,
                                 scale) -> None:
    """``attention_decode_split`` over e4m3 planes."""
    attention_decode_split(qkv, positions, slot, page_table, E4m3Plane(k_cache, k_scale),
                           E4m3Plane(v_cache, v_scale), part_ml, part_o, B, MP, PT, H, KVH, HD,
                           NS, SPLIT, scale)


def attention_decode_split_tuned_fp8kv(qkv, positions, slot, page_table, k_cache, v_cache,
                                       k_scale, v_scale, part_ml, part_o, choice, B, MP, PT, H,
                                       KVH, HD, NS, SPLIT, scale) -> None:
    """``attention_decode_split_tuned`` over e4m3 planes."""
    attention_decode_split_tuned(qkv, positions, slot, page_table, E4m3Plane(k_cache, k_scale),
                                 E4m3Plane(v_cache, v_scale), part_ml, part_o, choice, B, MP,
                                 PT, H, KVH, HD, NS, SPLIT, scale)


def attention_decode_fused_fp8kv(qkv, positions, slot, page_table, k_cache, v_cache, k_scale,
                                 v_scale, part_ml, part_o, arrivals, out, B, MP, PT, H, KVH, HD,
                                 NS, SPLIT, scale) -> None:
    """``attention_decode_fused`` over e4m3 planes."""
    attention_decode_fused(qkv, positions, slot, page_table, E4m3Plane(k_cache, k_scale),
                           E4m3Plane(v_cache, v_scale), part_ml, part_o, arrivals, out, B, MP,
                           PT, H, KVH, HD, NS, SPLIT, scale)
