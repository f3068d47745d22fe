"""Split-context decode attention's launch rule v3 (capture/launch.py): the live-split
layout's programs per (row, kv head) (``HELIOS_ATTN_LIVE``), and with that knob 0 how many
splits one program walks, from the rows and the split count of the capacity; the opt-in
tensor-core body over bf16 planes (``HELIOS_ATTN_MMA``) and its refusals."""

from __future__ import annotations

import pytest
from helios_ignition.capture import launch
from helios_ignition.capture.buffers import decode_splits
from helios_ignition.kernels_aot import KernelCompileError, compile_variant

ELF_MAGIC = b"\x7fELF"


@pytest.mark.parametrize(("rows", "capacity", "H", "KVH", "HD", "grid", "spp"), [
    (64, 8192, 9, 3, 64, (64, 3, 32), 4),      # SmolLM2 b64, 128 splits: 4 a program
    (64, 8192, 32, 8, 128, (64, 8, 64), 2),    # Llama-3.1-8B b64: 2 a program
    (32, 8192, 9, 3, 64, (32, 3, 128), None),  # below 64 rows: one split a program
    (64, 2048, 9, 3, 64, (64, 3, 32), None),   # 32 splits: one a program (as before v3)
    (256, 4096, 9, 3, 64, (256, 3, 64), None),
])  # fmt: skip
def test_splits_per_program_only_at_64_rows_and_128_splits(monkeypatch, rows, capacity, H,
                                                          KVH, HD, grid, spp):
    monkeypatch.setattr(launch, "ATTN_LIVE", 0)
    ns, split = decode_splits(capacity)
    c = launch.launch_config("attention_decode_split",
                             [rows, capacity // 16, 16, H, KVH, HD, ns, split, 0.125])
    assert c.grid == grid
    assert c.constants.get("SPP") == spp
    assert c.constants["GROUPED"] == 2 and c.constants["BLOCK_N"] == split == 64


@pytest.mark.parametrize(("rows", "capacity", "H", "KVH", "HD", "live"), [
    (256, 2048, 32, 8, 128, 2),    # the 8B at 256 rows: 4,096 programs, not 65,536
    (64, 8192, 32, 8, 128, 8),
    (8, 8192, 32, 8, 128, 64),
    (1, 2048, 32, 8, 128, 32),     # one row: every split its program (at most NS)
    (256, 8192, 9, 3, 64, 6),      # SmolLM2: ceil(4096 / 768)
    (5, 8192, 6, 2, 40, 128),      # an odd head dim: no 128-bit loads, same layout
])  # fmt: skip
def test_live_layout_programs(monkeypatch, rows, capacity, H, KVH, HD, live):
    monkeypatch.setattr(launch, "ATTN_LIVE", 4096)
    monkeypatch.setattr(launch, "ATTN_LIVE_MIN_ROWS", 1)
    ns, split = decode_splits(capacity)
    c = launch.launch_config("attention_decode_split",
                             [rows, capacity // 16, 16, H, KVH, HD, ns, split, 0.125])
    assert c.grid == (rows, KVH, live)
    assert c.constants["LIVE"] == live and "SPP" not in c.constants
    assert c.constants["GROUPED"] == 2 and c.constants["BLOCK_N"] == split == 64
    assert c.constants["EVEN_HD"] == int(HD in (64, 128))
    merge = launch.launch_config("attention_decode_merge", [rows, H, HD, ns])
    assert merge.constants["SKIP_EMPTY"] == 1  # the merge reads no unwritten output


def test_live_layout_knob(monkeypatch):
    """HELIOS_ATTN_LIVE_MIN_ROWS keeps smaller buckets on the old grid; the tuned kernel
    never takes it; splits longer than a tile (capacities over 8,192: GROUPED=3) do."""
    monkeypatch.setattr(launch, "ATTN_LIVE", 4096)
    monkeypatch.setattr(launch, "ATTN_LIVE_MIN_ROWS", 64)
    ns, split = decode_splits(8192)
    assert launch.attention_split_constants(64, 32, 8, 128, ns, split)["LIVE"] == 8
    assert "LIVE" not in launch.attention_split_constants(32, 32, 8, 128, ns, split)
    assert "LIVE" not in launch.attention_split_constants(64, 32, 8, 128, ns, split,
                                                          tuned=True)
    ns, split = decode_splits(32768)
    assert split == 256
    c = launch.attention_split_constants(256, 32, 8, 128, ns, split)
    assert c["GROUPED"] == 3 and c["LIVE"] == 2
    monkeypatch.setattr(launch, "ATTN_LIVE", 0)
    assert "LIVE" not in launch.attention_split_constants(256, 32, 8, 128, ns, split)


def _split(op: str, rows: int, capacity: int, H: int, KVH: int, HD: int):
    ns, split = decode_splits(capacity)
    return launch.launch_config(op, [rows, capacity // 16, 16, H, KVH, HD, ns, split, 0.125])


def test_mma_body_is_off_by_default(monkeypatch):
    """Without HELIOS_ATTN_MMA a bf16 cache keeps the FMA body (GROUPED=2, no TERMS)."""
    monkeypatch.setattr(launch, "ATTN_LIVE", 4096)
    monkeypatch.setattr(launch, "ATTN_LIVE_MIN_ROWS", 1)
    assert launch.ATTN_MMA == "off"
    c = _split("attention_decode_split_bf16kv", 256, 4096, 32, 8, 128)
    assert c.grid == (256, 8, 2)
    assert c.constants["GROUPED"] == 2 and "TERMS" not in c.constants


@pytest.mark.parametrize(("rows", "capacity", "H", "KVH", "HD", "live", "block_n"), [
    (256, 4096, 32, 8, 128, 2, 64),     # the 8B at 256 rows of 64-position splits
    (64, 4096, 9, 3, 64, 22, 64),       # SmolLM2: G = 3 padded to 16 MMA rows
    (256, 32768, 32, 8, 128, 2, 64),    # splits of 256 positions: the online walk
    (5, 2048, 6, 2, 40, 32, 64),        # an odd head dim: masked, no 128-bit loads
])  # fmt: skip
@pytest.mark.parametrize("terms", ["2", "1"])
def test_mma_body_opt_in(monkeypatch, rows, capacity, H, KVH, HD, live, block_n, terms):
    """HELIOS_ATTN_MMA=2 (or 1) puts bf16 caches on GROUPED=4 in the live layout (the
    same grid as the FMA body's) with BLOCK_G >= 16; with HELIOS_ATTN_LIVE=0 on the grid
    of NS splits a row, never SPP; the tuned kernel and the merge keep theirs."""
    monkeypatch.setattr(launch, "ATTN_LIVE", 4096)
    monkeypatch.setattr(launch, "ATTN_LIVE_MIN_ROWS", 1)
    monkeypatch.setattr(launch, "ATTN_MMA", terms)
    ns, _ = decode_splits(capacity)
    c = _split("attention_decode_split_bf16kv", rows, capacity, H, KVH, HD)
    assert c.grid == (rows, KVH, live)
    assert c.block == (128, 1, 1)
    assert c.constants == dict(BLOCK_N=block_n, BLOCK_HD=-(-HD // 64) * 64, BLOCK_G=16,
                               GROUPED=4, TERMS=int(terms), EVEN_HD=int(HD in (64, 128)),
                               LIVE=live, WARPS=4)
    monkeypatch.setattr(launch, "ATTN_LIVE", 0)
    c = _split("attention_decode_split_bf16kv", rows, capacity, H, KVH, HD)
    assert c.grid == (rows, KVH, ns)
    assert c.constants["GROUPED"] == 4 and "SPP" not in c.constants
    assert "LIVE" not in c.constants
    tuned = _split("attention_decode_split_tuned_bf16kv", rows, capacity, H, KVH, HD)
    assert tuned.constants["GROUPED"] in (2, 3) and "TERMS" not in tuned.constants
    merge = launch.launch_config("attention_decode_merge", [rows, H, HD, ns])
    monkeypatch.setattr(launch, "ATTN_MMA", "off")
    assert launch.launch_config("attention_decode_merge", [rows, H, HD, ns]) == merge


@pytest.mark.parametrize(("op", "plane"), [
    ("attention_decode_split", "f32"), ("attention_decode_split_fp8kv", "e4m3"),
    ("attention_decode_split_tuned", "f32")])
def test_mma_body_refuses_other_planes(monkeypatch, op, plane):
    """The knob on over f32 or e4m3 planes is refused when the constants are chosen (at
    capture), naming the planes and both ways out."""
    monkeypatch.setattr(launch, "ATTN_MMA", "2")
    with pytest.raises(ValueError) as exc:
        _split(op, 64, 4096, 32, 8, 128)
    assert str(exc.value) == (
        "HELIOS_ATTN_MMA=2 (tensor-core decode attention, GROUPED=4) reads bf16 KV planes "
        f"only; this cache's planes are {plane}: export with --kv-cache-dtype bf16 or "
        "capture with HELIOS_ATTN_MMA=off")


@pytest.mark.parametrize("value", ["on", "3", "0", " "])
def test_mma_body_unknown_value(monkeypatch, value):
    monkeypatch.setattr(launch, "ATTN_MMA", value)
    with pytest.raises(ValueError, match=r"^HELIOS_ATTN_MMA must be 'off', '1' or '2', got "):
        _split("attention_decode_split_bf16kv", 8, 2048, 9, 3, 64)


def test_mma_body_compiles_for_sm90_over_bf16_planes_only(monkeypatch):
    """The opted-in variants compile for sm_90 (no GPU: the 8B and SmolLM2 geometries, two
    terms); the body's own assertion rejects the f32 entry point even where the launch
    rule is bypassed."""
    monkeypatch.setattr(launch, "ATTN_LIVE", 4096)
    monkeypatch.setattr(launch, "ATTN_LIVE_MIN_ROWS", 1)
    monkeypatch.setattr(launch, "ATTN_MMA", "2")
    for H, KVH, HD in [(32, 8, 128), (9, 3, 64)]:
        c = _split("attention_decode_split_bf16kv", 256, 4096, H, KVH, HD).constants
        ck = compile_variant("attention_decode_split_bf16kv", c, "sm_90")
        assert ck.binary[:4] == ELF_MAGIC and ck.num_warps == 4
    with pytest.raises(KernelCompileError, match="attention_decode_split for sm_90 failed"):
        compile_variant("attention_decode_split", c, "sm_90")
