"""Weight assembly: HF-named checkpoint tensors -> the family's physical weight buffers.

Fused buffers are concatenations along the output axis (`[q; k; v]`, `[gate; up]`), so a
decode step reads each weight once. Under tensor parallelism a split buffer is stored
once per rank, each the concatenation of that rank's slices (families/llama.py). Stored bytes are little-endian in the buffer dtype;
bf16 is rounded to nearest even from float32.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from helios_contract import STORAGE_BLOCKS
from helios_contract.schema import manifest_pb2 as mpb

from .capture.buffers import rank_weight_resource_id, weight_resource_id
from .checkpoint.gguf_repack import REPACKED, repack
from .families.llama import LlamaShapes, rope_inv_freq
from .quantize import SCALE_SUFFIX, STORAGE_FORMS, ZERO_SUFFIX, fp8_codes, int4_codes


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(x)
    out = rounded.astype(np.uint16)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def iter_weight_buffers(checkpoint, shapes: LlamaShapes, weight_dtype: str
                        ) -> Iterator[tuple[str, np.ndarray]]:
    """Yield `(buffer name, stored array)` one buffer at a time (a single-rank core).

    Matrices are stored in `weight_dtype` (bf16 as uint16 bit patterns); norm vectors and
    the RoPE table stay float32.
    """
    for stored in iter_stored_weights(checkpoint, shapes, weight_dtype):
        yield stored.buffer, stored.array


@dataclass(frozen=True)
class Slice:
    """Elements [start, stop) along `axis` of checkpoint tensor `tensor`."""

    tensor: str
    axis: int
    start: int
    stop: int


@dataclass(frozen=True)
class StoredWeight:
    """One stored weight resource: buffer, resource id, the rank it belongs to (None:
    every rank reads it), the checkpoint views it concatenates (along axis 0; rows past
    them are zero padding), and the stored array."""

    buffer: str
    resource_id: str
    rank: int | None
    sources: tuple[Slice, ...]
    array: np.ndarray


def _rank_sources(name: str, s: LlamaShapes, rank: int, head_source: str
                  ) -> tuple[Slice, ...]:
    """The checkpoint views of rank `rank`'s part of split weight `name` (the family's
    `split_widths`: its heads and FFN columns; the LM head: its rows)."""
    if name == "lm_head":
        stop = min((rank + 1) * s.head_rows, s.vocab)
        return (Slice(head_source, 0, rank * s.head_rows, stop),)
    axis = s.weight_split(name)
    assert axis is not None
    return tuple(Slice(src, axis, rank * width, (rank + 1) * width)
                 for src, width in zip(s.checkpoint_tensors(name), s.split_widths(name),
                                       strict=True))


def _read(checkpoint, sources: tuple[Slice, ...], shape: tuple[int, ...]) -> np.ndarray:
    parts = []
    for sl in sources:
        tensor = checkpoint.tensor(sl.tensor)
        index = [slice(None)] * tensor.ndim
        index[sl.axis] = slice(sl.start, sl.stop)
        parts.append(tensor[tuple(index)])
    array = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
    if array.shape[0] < shape[0]:  # the vocabulary-parallel head's last rank: zero rows
        pad = np.zeros((shape[0] - array.shape[0], *array.shape[1:]), array.dtype)
        array = np.concatenate([array, pad], axis=0)
    assert array.shape == shape, (sources, array.shape, shape)
    return array


# Bytes of one 32-element block (an f16 scale d, then the quants) of the block types
# whose every value is d * q with q an integer in -16..15: Q4_0 (q = nibble - 8) and Q5_0
# (q = nibble + 16 * high bit - 16). Q8_0 holds the same d and q (int8) exactly.
_BLOCK32_BYTES = {"Q4_0": 18, "Q5_0": 22, "Q8_0": 34}


def as_q8_0_blocks(kind: str, blocks: np.ndarray) -> np.ndarray:
    """`blocks` (uint8 [rows, row bytes] of ggml type `kind`: Q4_0, Q5_0 or Q8_0) as Q8_0
    blocks (uint8 [rows, blocks * 34]) of exactly the same values: each block keeps its
    f16 scale d, its quants become int8 (ggml's layouts: element j < 16 in the low nibble
    of byte j, element j + 16 in its high nibble; Q5_0's fifth bit of element j is bit j
    of the little-endian uint32 before them)."""
    if kind == "Q8_0":
        return blocks
    rows = blocks.shape[0]
    b = blocks.reshape(rows, -1, _BLOCK32_BYTES[kind])
    nibbles = b[..., -16:]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).astype(np.int16)  # [.., 32]
    if kind == "Q4_0":
        q -= 8
    else:
        high = b[..., 2:6].copy().view("<u4")  # [.., 1]
        q += ((high >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int16) * 16 - 16
    out = np.empty((*b.shape[:2], _BLOCK32_BYTES["Q8_0"]), np.uint8)
    out[..., :2] = b[..., :2]
    out[..., 2:] = q.astype(np.int8).view(np.uint8)
    return out.reshape(rows, -1)


def gguf_blocks(checkpoint, shapes: LlamaShapes) -> dict[str, str]:
    """Weight buffers of a single-rank core that keep the checkpoint's GGUF blocks (the
    ``gguf`` weight dtype): buffer name -> ggml block type ("Q4_1"), for every matrix whose
    source tensors are all stored in one block type (a fused buffer's rows are its sources'
    rows, so their blocks concatenate), or in Q4_0, Q5_0 and Q8_0 together: those are
    stored as Q8_0, each value exactly as the checkpoint holds it (``as_q8_0_blocks``), so the
    fused product still runs over 8-bit activation blocks, as separate products of the
    sources would (Gemma 3 270M's [q; k; v] of Q5_0 and Q8_0 rows, where llama.cpp runs
    three products). Other matrices are stored as float32, and so are stacked expert
    matrices (`[experts, rows, columns]`: the expert operations have no GGUF block form).
    """
    out = {}
    for name, shape in shapes.weight_layout().items():
        if len(shape) != 2 or name == "rope_inv_freq":
            continue
        kinds = {checkpoint.block_type(src) for src in shapes.checkpoint_tensors(name)}
        if len(kinds) == 1 and None not in kinds:
            out[name] = kinds.pop()
        elif kinds <= set(_BLOCK32_BYTES):
            out[name] = "Q8_0"
    return out


def repack_storage(checkpoint, shapes: LlamaShapes) -> dict[str, tuple[int, int]]:
    """Weight matrices of a single-rank core whose GGUF blocks can be stored repacked
    (``checkpoint.gguf_repack``): buffer name -> (storage type, group), for every matrix
    whose source tensors are all stored in block types of one repacked form (a fused
    buffer's rows concatenate: Gemma 3's Q5_0 query/key and Q8_0 value rows are all INT8
    in groups of 32)."""
    out = {}
    for name, shape in shapes.weight_layout().items():
        if len(shape) != 2 or name == "rope_inv_freq":
            continue
        kinds = {checkpoint.block_type(src) for src in shapes.checkpoint_tensors(name)}
        forms = {REPACKED.get(k) for k in kinds}
        if len(forms) == 1 and None not in forms:
            out[name] = forms.pop()
    return out


def declare_storage(manifest, blocks: dict[str, str]) -> None:
    """Declare each buffer of `blocks` (``gguf_blocks``) as GGUF block storage of f32
    elements in `manifest` (Buffer.storage; geometry from helios_contract's table)."""
    for decl in manifest.buffers:
        kind = blocks.get(decl.name)
        if kind is None:
            continue
        storage_type = mpb.StorageType.Value(f"STORAGE_TYPE_GGUF_{kind}")
        elements, nbytes = STORAGE_BLOCKS[storage_type]
        decl.dtype = mpb.D_TYPE_F32
        decl.storage.CopyFrom(mpb.TensorStorage(type=storage_type, block_elements=elements,
                                                block_bytes=nbytes))


def iter_stored_weights(checkpoint, shapes: LlamaShapes, weight_dtype: str,
                        blocks: dict[str, str] | None = None,
                        fp8: frozenset[str] = frozenset(),
                        int4: frozenset[str] = frozenset(),
                        repacked: frozenset[str] = frozenset()) -> Iterator[StoredWeight]:
    """Yield every weight resource of a core with `shapes` (one rank's shapes when
    `shapes.ranks` > 1: each split weight yields one resource per rank), one at a time.

    Matrices are stored in `weight_dtype` (bf16 as uint16 bit patterns; ``gguf``: those
    named in `blocks` as the checkpoint's blocks, uint8 [rows, row bytes], the others as
    float32); norm vectors and the RoPE table stay float32. The sources of each are what
    the core's weight catalog records. Matrices named in `fp8` (``quantize.fp8_weights``)
    are stored as e4m3 codes (uint8 [rows, K]), each followed by its per-row scales
    (``<name>.scale``, f32 [rows, 1]): the checkpoint's own FP8 codes where every source
    has them, else quantized here (``quantize.fp8_codes``). Matrices named in `int4` are
    stored as packed 4-bit codes (uint8 [rows, K / 2]) followed by ``<name>.scale`` and
    ``<name>.zero`` (f32 [rows, K / 128] each; ``quantize.int4_codes``). Matrices named in
    `repacked` (``quantize.repacked_weights``) are the checkpoint's GGUF blocks repacked
    (``checkpoint.gguf_repack``, each source by its own block type): codes, then scales
    and (INT4 / INT4_MIN) zero points or minimums.
    """
    blocks = blocks or {}
    head_source = shapes.checkpoint_tensors("lm_head")[0]
    for name, shape in shapes.weight_layout().items():
        computed = _computed_weight(shapes, name, checkpoint)
        if computed is not None:
            yield StoredWeight(name, weight_resource_id(name), None, (), computed)
            continue
        split = shapes.ranks > 1 and shapes.weight_split(name) is not None
        for rank in range(shapes.ranks) if split else (None,):
            if rank is None and name in blocks:  # GGUF blocks as they are, rows concatenated
                names = shapes.checkpoint_tensors(name)
                parts = [checkpoint.blocks(src) for src in names]
                if blocks[name] == "Q8_0":  # Q4_0 / Q5_0 sources re-encoded exactly
                    parts = [("Q8_0", as_q8_0_blocks(kind, p)) for kind, p in parts]
                assert all(kind == blocks[name] for kind, _ in parts), (name, parts)
                parts = [p for _, p in parts]
                sources = tuple(Slice(src, 0, 0, int(p.shape[0]))
                                for src, p in zip(names, parts, strict=True))
                array = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
                assert array.shape[0] == shape[0], (name, array.shape, shape)
                yield StoredWeight(name, weight_resource_id(name), None, sources,
                                   np.ascontiguousarray(array))
                continue
            if rank is None and name in repacked:  # GGUF blocks repacked, rows concatenated
                names = shapes.checkpoint_tensors(name)
                parts = [repack(*checkpoint.blocks(src)) for src in names]
                sources = tuple(Slice(src, 0, 0, int(p.codes.shape[0]))
                                for src, p in zip(names, parts, strict=True))
                suffixes = STORAGE_FORMS[parts[0].storage_type][1]
                arrays = [np.concatenate([getattr(p, f) for p in parts], axis=0)
                          for f in ("codes", "scales", "third")[:len(suffixes) + 1]]
                assert arrays[0].shape[0] == shape[0], (name, arrays[0].shape, shape)
                yield StoredWeight(name, weight_resource_id(name), None, sources,
                                   np.ascontiguousarray(arrays[0]))
                for suffix, side in zip(suffixes, arrays[1:], strict=True):
                    yield StoredWeight(name + suffix, weight_resource_id(name + suffix), None,
                                       sources, np.ascontiguousarray(side))
                continue
            if rank is None and name in fp8:  # e4m3 codes, then their per-row scales
                names = shapes.checkpoint_tensors(name)
                sources = tuple(Slice(src, 0, 0, checkpoint.expected_shape(src)[0])
                                for src in names)
                codes, scales = fp8_codes(checkpoint, list(names))
                assert codes.shape == shape, (name, codes.shape, shape)
                yield StoredWeight(name, weight_resource_id(name), None, sources, codes)
                scale = name + SCALE_SUFFIX
                yield StoredWeight(scale, weight_resource_id(scale), None, sources, scales)
                continue
            if rank is None and name in int4:  # packed codes, scales, zero points
                names = shapes.checkpoint_tensors(name)
                sources = tuple(Slice(src, 0, 0, checkpoint.expected_shape(src)[0])
                                for src in names)
                codes, scales, zeros = int4_codes(checkpoint, list(names))
                assert codes.shape == (shape[0], shape[1] // 2), (name, codes.shape, shape)
                yield StoredWeight(name, weight_resource_id(name), None, sources, codes)
                for suffix, side in ((SCALE_SUFFIX, scales), (ZERO_SUFFIX, zeros)):
                    yield StoredWeight(name + suffix, weight_resource_id(name + suffix), None,
                                       sources, side)
                continue
            if rank is None:  # whole tensors
                names = shapes.checkpoint_tensors(name)
                parts = [checkpoint.tensor(src) for src in names]
                sources = tuple(Slice(src, 0, 0, int(p.shape[0]))
                                for src, p in zip(names, parts, strict=True))
                array = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
                if len(shape) == 3:  # stacked experts [E, rows, in]: the sources' rows in order
                    array = array.reshape(shape)
                assert array.shape == shape, (name, array.shape, shape)
                if hasattr(shapes, "stored_value"):  # a family's value rule (Gemma's 1 + w)
                    array = shapes.stored_value(name, array)
                rid = weight_resource_id(name)
            else:
                sources = _rank_sources(name, shapes, rank, head_source)
                array = _read(checkpoint, sources, shape)
                rid = rank_weight_resource_id(name, rank)
            if len(shape) > 1 and weight_dtype == "bf16":
                array = to_bf16_bits(array)
            else:
                array = np.ascontiguousarray(array, dtype=np.float32)
            yield StoredWeight(name, rid, rank, sources, array)


def _computed_weight(shapes, name: str, checkpoint) -> np.ndarray | None:
    """The value of a buffer the family computes instead of reading (RoPE tables), or None.
    A family may define ``computed_weight(name, checkpoint)``; else the Llama rule: the
    one ``rope_inv_freq`` table with the checkpoint's RoPE scaling."""
    if hasattr(shapes, "computed_weight"):
        return shapes.computed_weight(name, checkpoint)
    if name == "rope_inv_freq":
        return rope_inv_freq(shapes, checkpoint.geometry.rope_scaling)
    return None


def weight_catalogs(stored: list[StoredWeight], ranks: int) -> list:
    """Per-rank weight catalogs (manifest WeightCatalog, version 1) of `stored`: rank r
    lists the replicated weights and its own parts. Empty for a single-rank core."""

    if ranks <= 1:
        return []
    catalogs = [mpb.WeightCatalog(version=1, rank=r) for r in range(ranks)]
    for w in stored:
        for r in range(ranks) if w.rank is None else (w.rank,):
            entry = catalogs[r].weights.add(buffer=w.buffer, resource_id=w.resource_id)
            for sl in w.sources:
                entry.sources.add(tensor=sl.tensor, axis=sl.axis, start=sl.start, stop=sl.stop)
    return catalogs


def iter_drafter_buffers(drafter, checkpoint, shapes: LlamaShapes, weight_dtype: str
                         ) -> Iterator[tuple[str, np.ndarray]]:
    """Yield the learned drafter's `(buffer name, stored array)` (families/draft.py names).

    Matrices in `weight_dtype`, norms float32, `D.vocab_map` int32; `D.lm_head` is the
    target's LM head (the tied embedding when tied) restricted to the rows `vocab_map`,
    so the head shares the target's output projection.
    """
    for name, array in drafter.tensors.items():
        if name == "vocab_map":
            yield "D.vocab_map", np.ascontiguousarray(array, dtype=np.int32)
        elif array.ndim > 1 and weight_dtype == "bf16":
            yield f"D.{name}", to_bf16_bits(array)
        else:
            yield f"D.{name}", np.ascontiguousarray(array, dtype=np.float32)
    head = checkpoint.tensor(shapes.checkpoint_tensors("lm_head")[0])[drafter.vocab_map]
    yield "D.lm_head", to_bf16_bits(head) if weight_dtype == "bf16" else np.ascontiguousarray(head)
