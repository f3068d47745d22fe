"""bf16 KV cache: the ``*_bf16kv`` forms of the cache write and of every attention that
reads the paged cache.

A cache plane of ``D_TYPE_BF16`` elements holds each key or value as its bfloat16 bit
pattern, ``[P, PT, KVH, HD]`` uint16 (the element type of the buffer, not a storage
encoding: no blocks, no scales; two bytes an element, half an f32 plane's pages).

- The write rounds: ``bits = encode_bf16(x)``, the f32 value rounded to the nearest
  bfloat16, ties to even (the GPU's ``cvt.rn.bf16.f32``; NaN stays NaN).
- Every reader takes exactly its f32 op's arithmetic over the widened keys and values
  ``decode_bf16(bits)`` (exact: a bfloat16 is an f32 with the low 16 bits zero): the
  reference loops of kernels/attention.py and kernels/attention_split.py with ``K[j]``
  and ``V[j]`` read that way. Only the positions an attention reads are widened
  (``Bf16Plane``), never a whole plane.

Each form's parameters are its f32 op's, with ``k_cache``/``v_cache`` (``row_copy``:
``src``/``dst``) bf16 planes. ``row_copy_bf16kv`` (the TRANSFER programs' row copy
between a bf16 plane and its continuation or host-tier plane) is ``row_copy`` over
uint16 rows.
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
from .cache import kv_write
from .fused import rope_kv_write

# f32 op -> its bf16-cache form (the launch geometry and GPU body are the f32 op's).
KV_BF16_FORMS = {
    "kv_write": "kv_write_bf16kv",
    "rope_kv_write": "rope_kv_write_bf16kv",
    "attention_prefill": "attention_prefill_bf16kv",
    "attention_prefill_window": "attention_prefill_window_bf16kv",
    "attention_decode_window": "attention_decode_window_bf16kv",
    "attention_decode_split": "attention_decode_split_bf16kv",
    "attention_decode_split_tuned": "attention_decode_split_tuned_bf16kv",
    "attention_decode_fused": "attention_decode_fused_bf16kv",
    "row_copy": "row_copy_bf16kv",
}
KV_BF16_BASE = {form: op for op, form in KV_BF16_FORMS.items()}
# Parameters through which a form reads or writes a bf16 plane.
BF16_PLANE_PARAMS = ("k_cache", "v_cache", "src", "dst")


def encode_bf16(x: NDArray[np.float32]) -> NDArray[np.uint16]:
    """f32 values -> their bfloat16 bit patterns (same shape, uint16): round to nearest,
    ties to even; beyond the largest bfloat16 to +-inf; NaN to a quiet NaN of its sign."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))))
    out = (rounded >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(np.asarray(x, np.float32))
    if nan.any():
        out[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return out


def decode_bf16(bits: NDArray[np.uint16]) -> NDArray[np.float32]:
    """bfloat16 bit patterns -> f32 (exact; same shape)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


class Bf16Plane:
    """A bf16 cache plane as the f32 references index it: reads widen, writes round.

    ``plane.reshape(-1, KVH, HD)[idx]`` is the widened ``[*idx.shape, KVH, HD]`` f32 rows
    at flat token indices `idx` (``page * PT + offset``); ``plane[page, off] = x`` stores
    ``encode_bf16(x)`` (kv_write's store).

    Args:
        bits: ``[P, PT, KVH, HD]`` (or its flat ``[-1, KVH, HD]`` view) uint16 bfloat16 bit
            patterns, written in place.
    """

    def __init__(self, bits: NDArray[np.uint16]):
        if bits.dtype != np.uint16:
            raise TypeError(f"a bf16 plane holds uint16 bit patterns, not {bits.dtype}")
        self._bits = bits

    @property
    def shape(self) -> tuple[int, ...]:
        return self._bits.shape

    def reshape(self, *shape: int) -> Bf16Plane:
        """Only the flat token view ``(-1, KVH, HD)`` the references take."""
        KVH, HD = self._bits.shape[-2:]
        if shape != (-1, KVH, HD):
            raise ValueError(f"a bf16 plane is read as (-1, {KVH}, {HD}), not {shape}")
        return Bf16Plane(self._bits.reshape(-1, KVH, HD))

    def __getitem__(self, idx) -> NDArray[np.float32]:
        return decode_bf16(self._bits[idx])

    def __setitem__(self, idx, value) -> None:
        self._bits[idx] = encode_bf16(value)


def kv_write_bf16kv(qkv, positions, token_row, slot, page_table, k_cache, v_cache, T, R, MP,
                    PT, H, KVH, HD) -> None:
    """``kv_write`` into bf16 planes: each real token's key and value heads stored as
    ``encode_bf16`` of their f32 values.

    Args:
        k_cache, v_cache: ``[P, PT, KVH, HD]`` uint16 bfloat16 bits, written at the real
            tokens.
        Others: as ``kv_write`` (kernels/cache.py).

    Raises:
        IndexError: as ``kv_write``.
    """
    kv_write(qkv, positions, token_row, slot, page_table, Bf16Plane(k_cache),
             Bf16Plane(v_cache), T, R, MP, PT, H, KVH, HD)


def rope_kv_write_bf16kv(qkv, positions, inv_freq, token_row, slot, page_table, k_cache,
                         v_cache, T, R, MP, PT, H, KVH, HD) -> None:
    """``rope_kv_write`` into bf16 planes (``rope``, then ``kv_write_bf16kv``): `qkv`
    keeps the rotated f32 keys; the planes get them rounded.

    Args: as ``rope_kv_write`` (kernels/fused.py), the planes uint16 bfloat16 bits.
    """
    rope_kv_write(qkv, positions, inv_freq, token_row, slot, page_table, Bf16Plane(k_cache),
                  Bf16Plane(v_cache), T, R, MP, PT, H, KVH, HD)


# The readers: each f32 reference over Bf16Plane views of the bits (``K[j] =
# decode_bf16(k_cache[j])``, V alike, in that op's reference loop). Arguments and errors
# are the f32 op's, with ``k_cache``/``v_cache`` ``[P, PT, KVH, HD]`` uint16 bits.


def attention_prefill_bf16kv(qkv, positions, token_row, slot, page_table, k_cache, v_cache,
                             out, T, R, MP, PT, H, KVH, HD, scale) -> None:
    """``attention_prefill`` over bf16 planes."""
    attention_prefill(qkv, positions, token_row, slot, page_table, Bf16Plane(k_cache),
                      Bf16Plane(v_cache), out, T, R, MP, PT, H, KVH, HD, scale)


def attention_prefill_window_bf16kv(qkv, positions, token_row, slot, page_table, k_cache,
                                    v_cache, out, T, R, MP, PT, H, KVH, HD, W, scale) -> None:
    """``attention_prefill_window`` over bf16 planes."""
    attention_prefill_window(qkv, positions, token_row, slot, page_table, Bf16Plane(k_cache),
                             Bf16Plane(v_cache), out, T, R, MP, PT, H, KVH, HD, W, scale)


def attention_decode_window_bf16kv(qkv, positions, slot, page_table, k_cache, v_cache, out, B,
                                   MP, PT, H, KVH, HD, W, scale) -> None:
    """``attention_decode_window`` over bf16 planes."""
    attention_decode_window(qkv, positions, slot, page_table, Bf16Plane(k_cache),
                            Bf16Plane(v_cache), out, B, MP, PT, H, KVH, HD, W, scale)


def attention_decode_split_bf16kv(qkv, positions, slot, page_table, k_cache, v_cache, part_ml,
                                  part_o, B, MP, PT, H, KVH, HD, NS, SPLIT, scale) -> None:
    """``attention_decode_split`` over bf16 planes."""
    attention_decode_split(qkv, positions, slot, page_table, Bf16Plane(k_cache),
                           Bf16Plane(v_cache), part_ml, part_o, B, MP, PT, H, KVH, HD, NS,
                           SPLIT, scale)


def attention_decode_split_tuned_bf16kv(qkv, positions, slot, page_table, k_cache, v_cache,
                                        part_ml, part_o, choice, B, MP, PT, H, KVH, HD, NS,
                                        SPLIT, scale) -> None:
    """``attention_decode_split_tuned`` over bf16 planes."""
    attention_decode_split_tuned(qkv, positions, slot, page_table, Bf16Plane(k_cache),
                                 Bf16Plane(v_cache), part_ml, part_o, choice, B, MP, PT, H,
                                 KVH, HD, NS, SPLIT, scale)


def attention_decode_fused_bf16kv(qkv, positions, slot, page_table, k_cache, v_cache, part_ml,
                                  part_o, arrivals, out, B, MP, PT, H, KVH, HD, NS, SPLIT,
                                  scale) -> None:
    """``attention_decode_fused`` over bf16 planes."""
    attention_decode_fused(qkv, positions, slot, page_table, Bf16Plane(k_cache),
                           Bf16Plane(v_cache), part_ml, part_o, arrivals, out, B, MP, PT, H,
                           KVH, HD, NS, SPLIT, scale)
