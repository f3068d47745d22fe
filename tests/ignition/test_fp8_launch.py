"""The FP8 products' launch rule (``launch.fp8_constants``): the swept table's cells by
row bucket, the unswept defaults, the few-row GEMV (``HELIOS_FP8_FEW``), the alignment
flags, and ``HELIOS_FP8_TILES`` (a bench/gpu_fp8_sweep.py JSON) read at capture, with
their rejections."""

from __future__ import annotations

import json

import pytest
from helios_ignition.capture import launch


def test_defaults_gemv_at_one_row_tiles_above(monkeypatch):
    c = launch.launch_config("linear_fp8", [1, 6144, 4096])
    assert c.constants == dict(MMA=0, BLOCK_T=1, BLOCK_N=8, BLOCK_K=1024, BLOCK_KS=1024,
                               WARPS=4, K16=1, EVEN_K=1, PRO=0, ACC=0)
    assert c.grid == (768, 1, 1) and c.block == (128, 1, 1)
    monkeypatch.setattr(launch, "FP8_EARLY", "1")  # HELIOS_FP8_EARLY=1
    assert launch.launch_config("linear_fp8", [1, 6144, 4096]).constants["EARLY"] == 1
    assert "EARLY" not in launch.launch_config("linear_fp8", [64, 6144, 4096]).constants
    monkeypatch.setattr(launch, "FP8_EARLY", "0")
    monkeypatch.setattr(launch, "FP8_FEW", "table")  # the tiles below 64 rows
    c = launch.launch_config("swiglu_linear_add_fp8", [8, 4096, 14336])
    assert c.constants == dict(MMA=1, BLOCK_T=16, BLOCK_N=32, BLOCK_K=64, BLOCK_KS=128,
                               WARPS=4, STAGES=3, IMPRECISE=64, K16=1, EVEN_K=1, PRO=2,
                               ACC=1)
    assert c.grid == (128, 1, 1)
    assert launch.launch_config("linear_fp8", [8, 28672, 4096]).constants["BLOCK_N"] == 64
    c = launch.launch_config("rmsnorm_linear_fp8", [1024, 28672, 4096, 1e-5])
    assert c.constants["BLOCK_T"] == 64 and c.constants["BLOCK_N"] == 128
    assert c.grid == (224, 16, 1) and c.block == (256, 1, 1)


def test_alignment_flags_follow_k():
    c = launch.launch_config("linear_fp8", [3, 40, 100]).constants
    assert (c["K16"], c["EVEN_K"]) == (0, 0)
    c = launch.launch_config("linear_fp8", [3, 40, 160]).constants  # 16 | K, 64 does not
    assert (c["K16"], c["EVEN_K"]) == (1, 0)


def test_few_rows_gemv_serves_every_row_of_a_tile(monkeypatch):
    """Under "rows", 2-16 rows: the GEMV with BLOCK_T = the power of two >= T token rows a
    program (one program row), whatever the table says; 17 rows take the table / default
    tiles."""
    monkeypatch.setattr(launch, "FP8_FEW", "rows")
    c = launch.launch_config("rmsnorm_linear_fp8", [8, 6144, 4096, 1e-5])
    assert c.constants == dict(MMA=0, BLOCK_T=8, BLOCK_N=16, BLOCK_K=256, BLOCK_KS=256,
                               WARPS=4, K16=1, EVEN_K=1, PRO=1, ACC=0)
    assert c.grid == (384, 1, 1) and c.block == (128, 1, 1)
    c = launch.launch_config("linear_fp8", [5, 40, 100])
    assert c.constants["BLOCK_T"] == 8 and c.constants["BLOCK_K"] == 128
    assert (c.constants["K16"], c.constants["EVEN_K"]) == (0, 0)
    assert c.grid == (3, 1, 1)
    assert launch.launch_config("linear_fp8", [16, 4096, 4096]).constants["BLOCK_T"] == 16
    assert launch.launch_config("linear_fp8", [17, 4096, 4096]).constants["MMA"] == 1


def test_few_rows_spec_and_rejection(monkeypatch):
    monkeypatch.setattr(launch, "FP8_FEW", "32,512,8")
    c = launch.launch_config("linear_fp8", [3, 4096, 4096])
    assert (c.constants["BLOCK_T"], c.constants["BLOCK_N"], c.constants["BLOCK_K"]) == \
        (4, 32, 512)
    assert c.grid == (128, 1, 1) and c.block == (256, 1, 1)
    monkeypatch.setattr(launch, "FP8_FEW", "32,512")
    with pytest.raises(ValueError, match="HELIOS_FP8_FEW must be 'rows', 'table' or "
                                         "'BLOCK_N,BLOCK_K,WARPS', got '32,512'"):
        launch.launch_config("linear_fp8", [3, 4096, 4096])


def test_table_cell_by_row_bucket(monkeypatch):
    monkeypatch.setattr(launch, "FP8_FEW", "table")
    gemv = dict(MMA=0, BLOCK_T=1, BLOCK_N=16, BLOCK_K=2048, BLOCK_KS=1024, WARPS=8,
                TILES=4)
    monkeypatch.setattr(launch, "_FP8_TILES", {(4096, 4096, 8): gemv})
    c = launch.launch_config("linear_add_fp8", [5, 4096, 4096])  # 5 rows: the 8-row cell
    assert c.grid == (64, 5, 1) and c.block == (256, 1, 1)  # 4096 / (16 * 4); a row each
    assert c.constants["TILES"] == 4 and c.constants["ACC"] == 1
    assert launch.launch_config("linear_add_fp8", [9, 4096, 4096]).constants["MMA"] == 1


def test_tiles_file_read_and_rejected(monkeypatch, tmp_path):
    path = tmp_path / "sweep.json"
    pick = dict(MMA=1, BLOCK_T=32, BLOCK_N=128, BLOCK_K=64, BLOCK_KS=128, WARPS=4,
                STAGES=3, IMPRECISE=0, TILES=2)
    path.write_text(json.dumps({"picks": {"6144,4096,64": pick}}))
    monkeypatch.setattr(launch, "FP8_TILES_FILE", str(path))
    c = launch.launch_config("rmsnorm_linear_fp8", [40, 6144, 4096, 1e-5])
    assert c.grid == (24, 2, 1) and c.constants["IMPRECISE"] == 0
    path.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="HELIOS_FP8_TILES=.*not a bench/gpu_fp8_sweep.py"):
        launch.launch_config("rmsnorm_linear_fp8", [40, 6144, 4096, 1e-5])
