"""Split-context decode attention's launch rule v3 (capture/launch.py): the live-split
layout's programs per (row, kv head) (``HELIOS_ATTN_LIVE``), and with that knob 0 how many
splits one program walks, from the rows and the split count of the capacity; the opt-in
tensor-core body over bf16 planes (``HELIOS_ATTN_MMA``) and its refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
from helios_ignition.capture import launch
from helios_ignition.capture.buffers import decode_splits
from helios_ignition.kernels_aot import KernelCompileError, compile_variant

ELF_MAGIC = b"\x7fELF"
ROOT = Path(__file__).resolve().parents[2]


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


def test_mma_body_refuses_e4m3_planes_and_keeps_f32_launches(monkeypatch):
    """The knob on: launches over e4m3 planes are refused when their constants are chosen;
    launches over f32 planes keep the FMA body (capture records every launch over f32
    planes before the bf16 rewrite: an export whose cache stays f32 is refused before
    capture, test_mma_export_refusals)."""
    monkeypatch.setattr(launch, "ATTN_LIVE", 4096)
    monkeypatch.setattr(launch, "ATTN_LIVE_MIN_ROWS", 1)
    monkeypatch.setattr(launch, "ATTN_MMA", "2")
    with pytest.raises(ValueError) as exc:
        _split("attention_decode_split_fp8kv", 64, 4096, 32, 8, 128)
    assert str(exc.value) == (
        "HELIOS_ATTN_MMA=2 (tensor-core decode attention, GROUPED=4) reads bf16 KV planes "
        "only, not e4m3 planes: export with --kv-cache-dtype bf16 or with "
        "HELIOS_ATTN_MMA=off")
    mma = _split("attention_decode_split", 64, 4096, 32, 8, 128)
    monkeypatch.setattr(launch, "ATTN_MMA", "off")
    assert mma == _split("attention_decode_split", 64, 4096, 32, 8, 128)
    assert mma.constants["GROUPED"] == 2


@pytest.mark.parametrize(("kv", "what"), [
    (None, r"the recipe's f32 cache \(--kv-cache-dtype auto\)"),
    ("auto", r"the recipe's f32 cache \(--kv-cache-dtype auto\)"),
    ("fp8", "--kv-cache-dtype fp8")])
def test_mma_export_refusals(monkeypatch, kv, what):
    """``check_attention_mma``, what export_core calls before reading anything
    (tests/ignition/export/test_rejections.py: the export's and the CLI's refusals)."""
    monkeypatch.setattr(launch, "ATTN_MMA", "1")
    with pytest.raises(ValueError, match=rf"^HELIOS_ATTN_MMA=1 .* not {what}: export with "):
        launch.check_attention_mma(kv)
    launch.check_attention_mma("bf16")
    monkeypatch.setattr(launch, "ATTN_MMA", "off")
    launch.check_attention_mma(kv)


def test_mma_export_records_the_body(monkeypatch, tmp_path):
    """SmolLM2 exported with a bf16 cache and HELIOS_ATTN_MMA=2 (no kernels compiled):
    capture records the f32 ops, the bf16 rewrite relaunches them, and every split decode
    attention kernel the core keeps is the tensor-core body (one per bucket's LIVE), no
    f32 or FMA variant left, and so are the prefill attention's lane programs (one
    variant: the block programs' constants unchanged); the merge is unchanged."""
    from helios_ignition.export import export_core
    from helios_tools.core import generate_key, load_public_key, open_core, write_key_pair

    key = tmp_path / "key.pem"
    write_key_pair(generate_key(), key)
    monkeypatch.setattr(launch, "ATTN_MMA", "2")
    monkeypatch.setattr(launch, "ATTN_RULE", "v3")
    monkeypatch.setattr(launch, "ATTN_LIVE", 4096)
    monkeypatch.setattr(launch, "ATTN_LIVE_MIN_ROWS", 1)
    out = tmp_path / "smollm2-mma.core"
    export_core(ROOT / "recipes/smollm2_135m_instruct.py", checkpoint="smollm2", key_path=key,
                namespace="test.mma", out=out, weight_dtype="bf16", kv_cache_dtype="bf16",
                targets=())
    core = open_core(out, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])
    kernels = [k for k in core.manifest.kernels if "attention" in k.reference_op]
    split = [dict(k.constants) for k in kernels
             if k.reference_op == "attention_decode_split_bf16kv"]
    assert sorted(k.reference_op for k in kernels if k.reference_op not in (
        "attention_decode_split_bf16kv",)) == ["attention_decode_merge",
                                               "attention_prefill_bf16kv"]
    assert split and all(c == dict(BLOCK_N=64, BLOCK_HD=64, BLOCK_G=16, GROUPED=4, TERMS=2,
                                   EVEN_HD=1, WARPS=4, LIVE=c["LIVE"]) for c in split)
    assert [dict(k.constants) for k in kernels
            if k.reference_op == "attention_prefill_bf16kv"] == [
        dict(BLOCK_M=32, BLOCK_N=32, BLOCK_HD=64, BLOCK_G=16, LANE_TERMS=2, EVEN_HD=1,
             WARPS=4)]


@pytest.mark.parametrize("value", ["on", "3", "0", " "])
def test_mma_body_unknown_value(monkeypatch, value):
    monkeypatch.setattr(launch, "ATTN_MMA", value)
    with pytest.raises(ValueError, match=r"^HELIOS_ATTN_MMA must be 'off', '1' or '2', got "):
        _split("attention_decode_split_bf16kv", 8, 2048, 9, 3, 64)
    with pytest.raises(ValueError, match=r"^HELIOS_ATTN_MMA must be 'off', '1' or '2', got "):
        _prefill("attention_prefill_bf16kv", 64, 8, 9, 3, 64)


def _prefill(op: str, T: int, R: int, H: int, KVH: int, HD: int, W: int = 0):
    window = [W] if "window" in op else []
    return launch.launch_config(op, [T, R, 256, 16, H, KVH, HD, *window, 0.125])


PREFILL_OPS = ["attention_prefill", "attention_prefill_window"]
PREFILL_CASES = [
    (64, 8, 32, 8, 128, (10, 32, 1), 128, 4),   # the 8B: G = 4
    (512, 256, 9, 3, 64, (272, 9, 1), 64, 4),   # SmolLM2 at 256 lanes: G = 3
    (5, 2, 6, 2, 40, (3, 6, 1), 64, 4),         # an odd head dim
    (40, 40, 4, 1, 64, (42, 4, 1), 64, 4),      # G = 4 of one kv head, as many rows as tokens
]  # (T, R, H, KVH, HD, grid, BLOCK_HD, BLOCK_G off)  fmt: skip


@pytest.mark.parametrize("op", PREFILL_OPS)
@pytest.mark.parametrize(("T", "R", "H", "KVH", "HD", "grid", "bhd", "bg"), PREFILL_CASES)
def test_prefill_lanes_fma_by_default(monkeypatch, op, T, R, H, KVH, HD, grid, bhd, bg):
    """Without HELIOS_ATTN_MMA every plane's prefill attention keeps the FMA lanes: the
    constants of every core before the knob (no LANE_TERMS, BLOCK_G = next_pow2(G))."""
    assert launch.ATTN_MMA == "off"
    for form in ("", "_bf16kv", "_fp8kv"):
        c = _prefill(op + form, T, R, H, KVH, HD, W=37)
        assert c.grid == grid and c.block == (128, 1, 1)
        assert c.constants == dict(BLOCK_M=32, BLOCK_N=32, BLOCK_HD=bhd, BLOCK_G=bg, WARPS=4)


@pytest.mark.parametrize("terms", ["2", "1"])
@pytest.mark.parametrize("op", PREFILL_OPS)
@pytest.mark.parametrize(("T", "R", "H", "KVH", "HD", "grid", "bhd", "bg"), PREFILL_CASES)
def test_prefill_lanes_mma_opt_in(monkeypatch, terms, op, T, R, H, KVH, HD, grid, bhd, bg):
    """HELIOS_ATTN_MMA=2 (or 1): the bf16 forms' lane programs take the tensor-core body
    (LANE_TERMS, BLOCK_G 16, EVEN_HD for a power-of-two head dim) on the same grid, block
    programs' constants unchanged; the f32 forms (capture's first recording, before the
    bf16 rewrite) keep the constants of the knob off; e4m3 forms are refused."""
    monkeypatch.setattr(launch, "ATTN_MMA", terms)
    c = _prefill(op + "_bf16kv", T, R, H, KVH, HD, W=37)
    assert c.grid == grid and c.block == (128, 1, 1)
    assert c.constants == dict(BLOCK_M=32, BLOCK_N=32, BLOCK_HD=bhd, BLOCK_G=16,
                               LANE_TERMS=int(terms), EVEN_HD=int(HD == bhd), WARPS=4)
    f32 = _prefill(op, T, R, H, KVH, HD, W=37)
    assert f32.constants == dict(BLOCK_M=32, BLOCK_N=32, BLOCK_HD=bhd, BLOCK_G=bg, WARPS=4)
    assert f32.grid == grid
    with pytest.raises(ValueError) as exc:
        _prefill(op + "_fp8kv", T, R, H, KVH, HD, W=37)
    assert str(exc.value) == (
        f"HELIOS_ATTN_MMA={terms} (tensor-core decode attention, GROUPED=4) reads bf16 KV "
        "planes only, not e4m3 planes: export with --kv-cache-dtype bf16 or with "
        "HELIOS_ATTN_MMA=off")


def test_prefill_lane_constants_arguments():
    """`mma` given explicitly overrides ATTN_MMA; f32 planes keep the FMA lanes."""
    assert launch.prefill_lane_constants(32, 8, 128, "bf16", "2") == dict(
        BLOCK_G=16, LANE_TERMS=2, EVEN_HD=1)
    assert launch.prefill_lane_constants(6, 2, 40, "bf16", "1") == dict(
        BLOCK_G=16, LANE_TERMS=1, EVEN_HD=0)
    assert launch.prefill_lane_constants(32, 8, 128, "f32", "2") == dict(BLOCK_G=4)
    assert launch.prefill_lane_constants(32, 8, 128, "bf16", "off") == dict(BLOCK_G=4)
    assert launch.prefill_lane_constants(9, 3, 64) == dict(BLOCK_G=4)


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


def test_mma_lanes_compile_for_sm90_over_bf16_planes_only(monkeypatch):
    """The opted-in prefill attention (tensor-core lanes) compiles for sm_90, windowed and
    not, at the 8B and SmolLM2 geometries; the lane body's assertion rejects the f32 entry
    point even where the launch rule is bypassed."""
    monkeypatch.setattr(launch, "ATTN_MMA", "2")
    for H, KVH, HD in [(32, 8, 128), (9, 3, 64)]:
        for op in ("attention_prefill_bf16kv", "attention_prefill_window_bf16kv"):
            c = _prefill(op, 512, 256, H, KVH, HD, W=4096).constants
            assert c["LANE_TERMS"] == 2
            ck = compile_variant(op, c, "sm_90")
            assert ck.binary[:4] == ELF_MAGIC and ck.num_warps == 4
    with pytest.raises(KernelCompileError, match="attention_prefill for sm_90 failed"):
        compile_variant("attention_prefill", c, "sm_90")
