"""GGUF blocks repacked into INT4 / INT4_MIN / INT8 storage (checkpoint/gguf_repack.py):
the repacked tensor's dequantization (helios_tools.kernels int4 / int8, what both backends
compute with) equals gguf-py's dequantization of the blocks bit for bit in f32.

Fixture: tests/fixtures/gguf_blocks/blocks.npz (real rows of the SmolLM2 and Gemma 3
GGUFs, gguf-py's Q4_0 of seeded values, and gguf-py's f32 dequantization of each:
make_fixture.py); plus whole real tensors of both GGUFs and random blocks of every type.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.checkpoint import gemma3_270m_gguf_path, smollm2_gguf_path
from helios_ignition.checkpoint.gguf_repack import REPACKED, repack
from helios_tools.kernels.int4 import dequantize_int4, unpack_int4
from helios_tools.kernels.int8 import dequantize_int4_min, dequantize_int8

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gguf_blocks" / "blocks.npz"
KINDS = ("Q4_0", "Q4_1", "Q4_K", "Q8_0", "Q5_0", "Q6_K")
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q4_K": 144, "Q8_0": 34, "Q5_0": 22, "Q6_K": 210}


def dequantized(r) -> np.ndarray:
    """The f32 weight of a repacked tensor, by its storage type's reference."""
    if r.storage_type == mpb.STORAGE_TYPE_INT4:
        return dequantize_int4(r.codes, r.scales, r.third)
    if r.storage_type == mpb.STORAGE_TYPE_INT4_MIN:
        return dequantize_int4_min(r.codes, r.scales, r.third)
    assert r.third is None
    return dequantize_int8(r.codes, r.scales)


def reference(kind: str, blocks: np.ndarray) -> np.ndarray:
    return gguf.quants.dequantize(blocks, getattr(gguf.GGMLQuantizationType, kind)
                                  ).astype(np.float32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    return a.shape == b.shape and bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))


@pytest.mark.parametrize("kind", KINDS)
def test_fixture_blocks_repack_to_gguf_py_values_bit_for_bit(kind):
    z = np.load(FIXTURE)
    r = repack(kind, z[kind])
    assert (r.storage_type, r.group) == REPACKED[kind]
    assert same_bits(dequantized(r), z[f"{kind}.f32"])
    assert same_bits(z[f"{kind}.f32"], reference(kind, z[kind]))  # gguf-py unchanged


def test_the_repacked_geometry_per_type():
    """Codes two a byte (4-bit types) or one (INT8); f32 scales and the third side buffer
    [rows, K / group]: Q4_0 zero points all 8, INT8 none."""
    z = np.load(FIXTURE)
    want = {"Q4_0": (256, 32, True), "Q4_1": (576, 32, True), "Q4_K": (1024, 32, True),
            "Q8_0": (576, 32, False), "Q5_0": (640, 32, False), "Q6_K": (2048, 16, False)}
    for kind, (k, group, four) in want.items():
        r = repack(kind, z[kind])
        assert r.codes.dtype == np.uint8 and r.codes.shape == (4, k // 2 if four else k)
        assert r.scales.dtype == np.float32 and r.scales.shape == (4, k // group)
        assert (r.third is not None) == four
        if four:
            assert r.third.dtype == np.float32 and r.third.shape == (4, k // group)
    assert np.all(repack("Q4_0", z["Q4_0"]).third == 8)


def test_q4_0_by_hand():
    """One Q4_0 block: d = 0.5 (f16 0x3800), qs[j] = j | (15 - j) << 4: element j is j,
    element 16 + j is 15 - j. INT4 element 2i sits in the low nibble of byte i; w = (q - 8)
    * 0.5."""
    block = np.zeros((1, 18), np.uint8)
    block[0, :2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    block[0, 2:] = np.arange(16) | ((15 - np.arange(16)) << 4)
    r = repack("Q4_0", block)
    assert unpack_int4(r.codes).tolist() == [list(range(16)) + list(range(15, -1, -1))]
    assert r.scales.tolist() == [[0.5]] and r.third.tolist() == [[8.0]]
    assert dequantize_int4(r.codes, r.scales, r.third).tolist() == [
        [(q - 8) * 0.5 for q in list(range(16)) + list(range(15, -1, -1))]]


def test_q4_k_scales_that_f16_cannot_hold_are_exact_in_f32():
    """Q4_K sub-block scale d * sc: d = 1 + 2^-10 (f16's finest step above 1) times sc = 63
    is 63 + 63 * 2^-10, 16 significant bits: no f16 holds it, the f32 scale does."""
    block = np.zeros((1, 144), np.uint8)
    block[0, :2] = np.frombuffer(np.float16(1 + 2 ** -10).tobytes(), np.uint8)
    block[0, 4:8] = 63  # sc of sub-blocks 0..3 (low 6 bits of bytes 0..3)
    r = repack("Q4_K", block)
    assert r.scales[0, 0] == np.float32(63 + 63 * 2 ** -10)
    assert float(np.float16(r.scales[0, 0])) != float(r.scales[0, 0])
    assert same_bits(dequantized(r), reference("Q4_K", block))


@pytest.mark.parametrize("kind", KINDS)
def test_random_blocks_repack_exactly(kind):
    """Every byte pattern with finite f16 scales: 6 rows of 2 super-blocks (K-quants) or 8
    blocks, random bytes, the f16 fields set to random finite values."""
    rng = np.random.default_rng(KINDS.index(kind))
    per_row = 2 if kind.endswith("K") else 8
    b = rng.integers(0, 256, (6 * per_row, BLOCK_BYTES[kind]), dtype=np.uint8)

    def f16(n):
        return (rng.standard_normal(n) * 0.05).astype(np.float16).view(np.uint8).reshape(n, 2)

    fields = {"Q4_1": (0, 2), "Q4_K": (0, 2), "Q6_K": (208,)}.get(kind, (0,))
    for at in fields:
        b[:, at:at + 2] = f16(len(b))
    raw = b.reshape(6, -1)
    assert same_bits(dequantized(repack(kind, raw)), reference(kind, raw))


@pytest.mark.parametrize(("path", "names"), [
    (smollm2_gguf_path, ("blk.0.attn_q.weight", "blk.0.ffn_down.weight",
                         "blk.29.ffn_up.weight", "token_embd.weight")),
    (gemma3_270m_gguf_path, ("blk.0.attn_q.weight", "blk.0.attn_v.weight",
                             "blk.0.attn_output.weight", "blk.0.ffn_down.weight",
                             "blk.17.ffn_gate.weight")),
])
def test_whole_real_tensors_repack_exactly(request, path, names):
    """Real tensors of both GGUFs (SmolLM2: Q4_1, Q8_0; Gemma 3 270M Q4_K_M: Q5_0, Q8_0,
    Q4_K, Q6_K), as stored (no row permutation: the repack is row-wise). Gemma 3's reader
    is the worker's `gemma3_gguf_reader` (17 s of CPU to open)."""
    reader = (request.getfixturevalue("gemma3_gguf_reader") if path is gemma3_270m_gguf_path
              else gguf.GGUFReader(path()))
    by_name = {t.name: t for t in reader.tensors}
    for name in names:
        t = by_name[name]
        raw = np.asarray(t.data)[:2048]  # the embedding's first 2048 rows (time)
        assert same_bits(dequantized(repack(t.tensor_type.name, raw)),
                         reference(t.tensor_type.name, raw)), name


def test_a_type_without_a_repacked_form_and_partial_blocks_are_refused():
    with pytest.raises(ValueError, match=r"GGUF Q5_1 blocks have no repacked form"):
        repack("Q5_1", np.zeros((1, 24), np.uint8))
    with pytest.raises(ValueError, match=r"GGUF Q8_0 rows of 40 bytes are not whole "
                                         r"34-byte blocks"):
        repack("Q8_0", np.zeros((1, 40), np.uint8))
