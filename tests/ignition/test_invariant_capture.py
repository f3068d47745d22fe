"""The row-invariant linear in captured drafter cores: one kernel variant per weight
matrix, shared by every decode and SPECULATIVE graph whatever their row counts (the
launches differ only in their grids), which is what makes a verified row's logits the
decode row's on the GPU (kernels_triton/invariant.py; the device checks the compiled
reduction in tests/gpu/test_invariant.py)."""

from __future__ import annotations

from collections import defaultdict

import pytest
from helios_ignition.capture import launch
from helios_ignition.testing import tiny_core


def test_invariant_constants_follow_the_matrix_alone(monkeypatch):
    for N, K in ((960, 576), (49152, 576), (6144, 4096), (4096, 14336), (37, 100)):
        configs = [launch.launch_config("linear_invariant", [T, N, K]) for T in range(1, 41)]
        assert all(c.constants == configs[0].constants for c in configs)
        c = configs[0].constants
        assert c["ROWS"] == launch.INVARIANT_ROWS == 8
        gemv = launch.gemv_constants(N, K)
        assert (c["BLOCK_N"], c["BLOCK_K"], c["WARPS"]) == (gemv["BLOCK_N"], gemv["BLOCK_K"],
                                                            gemv["WARPS"])
        tiles = -(-N // c["BLOCK_N"])
        assert [x.grid for x in configs[:9]] == [(tiles, 1, 1)] * 8 + [(2 * tiles, 1, 1)]
    # the 8B down projection: the long-K GEMV tile (1024-wide K steps, 2 warps)
    assert launch.invariant_constants(4096, 14336) == dict(BLOCK_N=4, BLOCK_K=1024, ROWS=8,
                                                           WARPS=2)
    # a persistent, prefetching, evict-first GEMV spec keeps only its tile and EVICT
    monkeypatch.setattr(launch, "LINEAR_GEMV", "8,64,4,2,1,1")
    assert launch.invariant_constants(960, 576) == dict(BLOCK_N=8, BLOCK_K=64, ROWS=8, WARPS=4,
                                                        EVICT=1)


def test_one_variant_per_matrix_in_decode_and_speculative_graphs():
    core = tiny_core(speculative_widths=(1, 2, 3, 4))
    manifest = core.manifest
    kernels = {k.id: k for k in manifest.kernels}
    by_matrix: dict[tuple, set] = defaultdict(set)
    rows_seen: dict[tuple, set] = defaultdict(set)
    graphs = {g.name: g for g in manifest.graphs}
    spec_graphs = [g for g in graphs.values() if g.name.startswith("spec_")]
    assert spec_graphs
    for g in graphs.values():
        for x in g.launches:
            k = kernels[x.kernel]
            if k.reference_op != "linear_invariant":
                continue
            weight = x.args[1].buffer.buffer
            T, N, K = (a.int_value for a in x.args[3:6])
            by_matrix[(weight, N, K)].add(x.kernel)
            rows_seen[(weight, N, K)].add(T)
            assert x.grid[0] == -(-T // 8) * -(-N // k.constants["BLOCK_N"])
    assert by_matrix
    assert all(len(ids) == 1 for ids in by_matrix.values()), by_matrix
    # the target's products run at decode row counts and at verification row counts
    assert max(len(t) for t in rows_seen.values()) >= 3


def test_the_packed_rule_records_one_tile_and_split_per_matrix(monkeypatch):
    """HELIOS_LINEAR_INVARIANT=packed: the drafter core's row-invariant target products
    take split_bf16 + linear_packed_rows (+ splitk_reduce), one kernel variant and one K
    split per matrix at every row count, scratch sized for them."""
    from helios_ignition.capture.buffers import Speculation
    from helios_ignition.capture.programs import capture
    from helios_ignition.testing import TINY_CAPACITIES, TINY_SHAPES, tiny_drafter, tiny_weights

    assert launch.invariant_splits(6144, 4096, "rows") is None
    assert launch.invariant_splits(960, 576, "packed") is None  # small: linear_rows
    # S: the fewest slices giving each of the 132 SMs a program at one token tile
    assert launch.invariant_splits(4096, 14336, "packed") == 3  # 64 column tiles
    assert launch.invariant_splits(6144, 4096, "packed") == 2  # 96
    assert launch.invariant_splits(28672, 4096, "packed") == 1  # 224
    with pytest.raises(ValueError, match="HELIOS_LINEAR_INVARIANT must be 'rows' or "
                                         "'packed', got 'x'"):
        launch.invariant_splits(6144, 4096, "x")
    c = [launch.launch_config("linear_packed_rows", [T, 4096, 14336, 3])
         for T in (1, 8, 32, 33, 256)]
    assert all(x.constants == c[0].constants for x in c)
    assert c[0].constants["BLOCK_T"] == 32 and c[0].constants["ROWS_FIRST"] == 1
    # token tiles first: one for up to 32 rows (a batch-8 W = 4 step), then adjacent ones
    assert [x.grid for x in c] == [(1, 64, 3)] * 3 + [(2, 64, 3), (8, 64, 3)]

    monkeypatch.setattr(launch, "INVARIANT_LINEAR", "packed")
    monkeypatch.setattr(launch, "MMA_MIN_WEIGHTS", 0)  # let the tiny matrices take it
    monkeypatch.setattr(launch, "mma_splits", lambda T, N, K, c=None: 2)
    geometry, _ = tiny_drafter(TINY_SHAPES, 48, 0, tiny_weights(TINY_SHAPES, 0))
    manifest, _ = capture(TINY_SHAPES, TINY_CAPACITIES, "bf16",
                          spec=Speculation(geometry, (1, 2, 3, 4)))
    kernels = {k.id: k for k in manifest.kernels}
    ids: dict[str, set] = defaultdict(set)
    rows: dict[str, set] = defaultdict(set)
    for g in manifest.graphs:
        ops = [kernels[x.kernel].reference_op for x in g.launches]
        if g.name.startswith("spec_") or g.name.startswith("decode"):
            assert "linear_packed" not in ops and "linear_packed_rows" in ops, g.name
        for x in g.launches:
            if kernels[x.kernel].reference_op == "linear_packed_rows":
                T, S = x.args[3].int_value, x.args[6].int_value
                ids[x.args[1].buffer.buffer].add(x.kernel)
                rows[x.args[1].buffer.buffer].add(T)
                assert S == 2
    assert ids and all(len(v) == 1 for v in ids.values())
    assert max(len(t) for t in rows.values()) >= 3
    assert {b.name for b in manifest.buffers} >= {"scratch.xsplit", "scratch.mma_partial"}
    # and the recorded variants compile for sm_90 (Triton, no GPU)
    from helios_ignition.kernels_aot import compile_variant

    for kid in set().union(*ids.values()):
        k = kernels[kid]
        assert compile_variant(k.reference_op, dict(k.constants), "sm_90").binary[:4] == \
            b"\x7fELF"


def test_linear_invariant_variants_compile_for_sm90():
    from helios_ignition.kernels_aot import compile_variant

    core = tiny_core(speculative_widths=(1, 4))
    variants = [k for k in core.manifest.kernels if k.reference_op == "linear_invariant"]
    assert variants
    for k in variants:
        assert compile_variant(k.reference_op, dict(k.constants), "sm_90").binary[:4] == \
            b"\x7fELF"
