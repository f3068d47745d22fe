"""GGUF blocks repacked, with integer operations only, into the element-wise code storage
the cuda kernels read (helios_tools/kernels/int4.py, int8.py): never through floats.

Per ggml block type (ggml-common.h's block_q4_0 ... structs; gguf-py's
``gguf.quants.*.dequantize_blocks`` is the reference arithmetic):

| GGUF | storage | group | code | scale | third side buffer |
| --- | --- | ---: | --- | --- | --- |
| Q4_0 | INT4 | 32 | q (0..15) | d | zero point 8 |
| Q4_1 | INT4_MIN | 32 | q (0..15) | d | min m |
| Q4_K | INT4_MIN | 32 | q (0..15) | d * sc | min -(dmin * m) |
| Q8_0 | INT8 | 32 | q (-128..127) | d | - |
| Q5_0 | INT8 | 32 | q - 16 | d | - |
| Q6_K | INT8 | 16 | q - 32 | d * sc | - |

Scales and minimums are f32: d, m, dmin are f16 (11 significant bits) and sc / m are 6-bit
(Q4_K) or int8 (Q6_K) integers, so d * sc and dmin * m are exact in f32 (at most 18
significant bits) where f16 could not hold them. With them the kernels' ``code * scale``
is exact and ``code * scale + min`` rounds once, as gguf-py's ``d * q + m`` and
``d * q - dm`` do: the repacked weight dequantizes to gguf-py's values bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from helios_contract.schema import manifest_pb2 as mpb
from helios_tools.kernels.int4 import pack_int4

# GGUF block type -> (storage type, group elements) of its repacked form.
REPACKED = {
    "Q4_0": (mpb.STORAGE_TYPE_INT4, 32),
    "Q4_1": (mpb.STORAGE_TYPE_INT4_MIN, 32),
    "Q4_K": (mpb.STORAGE_TYPE_INT4_MIN, 32),
    "Q8_0": (mpb.STORAGE_TYPE_INT8, 32),
    "Q5_0": (mpb.STORAGE_TYPE_INT8, 32),
    "Q6_K": (mpb.STORAGE_TYPE_INT8, 16),
}
# Bytes of one block of each type (ggml's structs).
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q4_K": 144, "Q8_0": 34, "Q5_0": 22, "Q6_K": 210}
_BLOCK_ELEMENTS = {"Q4_0": 32, "Q4_1": 32, "Q4_K": 256, "Q8_0": 32, "Q5_0": 32, "Q6_K": 256}


@dataclass(frozen=True)
class Repacked:
    """One matrix [rows, K] repacked: `codes` (INT4 / INT4_MIN: uint8 [rows, K / 2], two
    codes a byte, element 2i low; INT8: uint8 [rows, K], each a two's-complement code),
    `scales` f32 [rows, K / group], `third` f32 [rows, K / group] (INT4: zero points,
    INT4_MIN: minimums) or None (INT8)."""

    storage_type: int
    group: int
    codes: np.ndarray
    scales: np.ndarray
    third: np.ndarray | None


def _f16(b: np.ndarray) -> np.ndarray:
    """[n, 2] uint8 -> [n] f32 (little-endian f16, widened exactly)."""
    return np.ascontiguousarray(b).view(np.float16).reshape(-1).astype(np.float32)


def _nibbles(qs: np.ndarray, span: int) -> np.ndarray:
    """[n, c * span] bytes -> [n, c * 2 * span] codes: each chunk of `span` bytes gives its
    low nibbles (elements 0..span-1 of a 2 * span run), then its high nibbles."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, span) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(0x0F)).reshape(n, -1)


def _q4_k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[n, 12] packed 6-bit scales and minimums of Q4_K -> ([n, 8], [n, 8]) uint8."""
    s = scales.reshape(-1, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _blocks(kind: str, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """[n, block bytes] blocks -> (codes [n, elements] int16, scales [n, groups] f32,
    third [n, groups] f32 or None)."""
    n = b.shape[0]
    if kind in ("Q4_0", "Q4_1"):
        off = 2 if kind == "Q4_0" else 4
        d = _f16(b[:, :2])[:, None]
        third = (np.full((n, 1), 8, np.float32) if kind == "Q4_0"
                 else _f16(b[:, 2:4])[:, None])
        return _nibbles(b[:, off:], 16).astype(np.int16), d, third
    if kind == "Q8_0":
        return b[:, 2:].view(np.int8).astype(np.int16), _f16(b[:, :2])[:, None], None
    if kind == "Q5_0":
        qh = b[:, 2:6].copy().view(np.uint32).reshape(n, 1) >> np.arange(32, dtype=np.uint32)
        q = _nibbles(b[:, 6:], 16).astype(np.int16) | ((qh & 1).astype(np.int16) << 4)
        return q - 16, _f16(b[:, :2])[:, None], None
    if kind == "Q4_K":
        d, dmin = _f16(b[:, 0:2])[:, None], _f16(b[:, 2:4])[:, None]
        sc, mn = _q4_k_scale_min(b[:, 4:16])
        # Exact in f32 (11 x 6 significant bits); -(dmin * m) is gguf-py's "- dm".
        return (_nibbles(b[:, 16:], 32).astype(np.int16), d * sc.astype(np.float32),
                -(dmin * mn.astype(np.float32)))
    if kind == "Q6_K":
        ql = _nibbles(b[:, :128], 64).astype(np.int16)
        qh = (b[:, 128:192].reshape(n, -1, 1, 32)
              >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
        q = (ql | (qh.reshape(n, -1).astype(np.int16) << 4)) - 32
        sc = b[:, 192:208].view(np.int8).astype(np.float32)
        return q, _f16(b[:, 208:210])[:, None] * sc, None  # exact: 11 x 8 bits
    raise ValueError(f"GGUF {kind} blocks have no repacked form (known: "
                     f"{', '.join(REPACKED)})")


def repack(kind: str, blocks: np.ndarray) -> Repacked:
    """The repacked form (``REPACKED``) of a matrix stored as GGUF `kind` blocks.

    Args:
        kind: the ggml block type name ("Q4_1").
        blocks: ``[rows, row bytes]`` uint8, whole blocks along each row (as
            ``Checkpoint.blocks`` returns them).

    Raises:
        ValueError: a type without a repacked form, or rows that are not whole blocks.
    """
    if kind not in REPACKED:
        raise ValueError(f"GGUF {kind} blocks have no repacked form (known: "
                         f"{', '.join(REPACKED)})")
    raw = np.ascontiguousarray(blocks, dtype=np.uint8)
    rows, nbytes = raw.shape
    if nbytes % _BLOCK_BYTES[kind]:
        raise ValueError(f"GGUF {kind} rows of {nbytes} bytes are not whole "
                         f"{_BLOCK_BYTES[kind]}-byte blocks")
    k = nbytes // _BLOCK_BYTES[kind] * _BLOCK_ELEMENTS[kind]
    storage_type, group = REPACKED[kind]
    q, scales, third = _blocks(kind, raw.reshape(-1, _BLOCK_BYTES[kind]))
    q = q.reshape(rows, k)
    codes = (pack_int4(q) if storage_type != mpb.STORAGE_TYPE_INT8
             else q.astype(np.int8).view(np.uint8))
    sides = [np.ascontiguousarray(s.reshape(rows, k // group), dtype=np.float32)
             for s in (scales, third) if s is not None]
    return Repacked(storage_type, group, np.ascontiguousarray(codes), sides[0],
                    sides[1] if len(sides) > 1 else None)
