"""The INT4 products' launch rule: one row in the word form, 2-31 rows in the rows form
(``HELIOS_INT4_ROWS``), output tiles from INT4_MMA_ROWS rows (``HELIOS_INT4_TILE``), the
older forms both knobs keep selectable, and their rejections."""

from __future__ import annotations

import types

import pytest
from helios_ignition.capture import launch


def _config(op: str, T: int, N: int, K: int, group: int = 128) -> launch.LaunchConfig:
    view = types.SimpleNamespace(shape=(N, K // group),
                                 buffer=types.SimpleNamespace(dtype="f32"))
    scalars = [T, N, K, 1e-5] if op.startswith("rmsnorm") else [T, N, K]
    return launch.launch_config(op, scalars, [view] * 4)


def test_one_row_words_few_rows_rows_form():
    c = _config("linear_int4", 1, 4096, 4096)
    assert c.constants == dict(GROUP=128, PRO=0, ACC=0, MMA=0, ROWS=1, BLOCK_T=1,
                               BLOCK_N=8, BLOCK_G=16, WORDS=1, WARPS=4)
    assert c.grid == (1, 512, 1) and c.block == (128, 1, 1)
    c = _config("swiglu_linear_add_int4", 20, 4096, 14336)  # 16 rows a tile, two tiles
    assert c.constants == dict(GROUP=128, PRO=2, ACC=1, MMA=0, ROWS=1, BLOCK_T=16,
                               BLOCK_N=16, BLOCK_G=2, WARPS=8)
    assert c.grid == (2, 256, 1) and c.block == (256, 1, 1)
    c = _config("rmsnorm_linear_int4", 3, 960, 576, group=64)  # K steps of 256: 4 groups
    assert (c.constants["BLOCK_T"], c.constants["BLOCK_G"], c.constants["GROUP"]) == \
        (4, 4, 64)
    assert c.grid == (1, 60, 1)


def test_tiles_from_mma_rows():
    c = _config("linear_add_int4", 64, 4096, 4096)
    assert c.constants == dict(GROUP=128, PRO=0, ACC=1, MMA=2, BLOCK_T=64, BLOCK_N=64,
                               WARPS=8)
    assert c.grid == (64, 1, 1) and c.block == (256, 1, 1)
    c = _config("linear_int4", launch.INT4_MMA_ROWS, 4096, 4096)
    assert c.constants["BLOCK_T"] == 32 and c.grid == (64, 1, 1)
    assert _config("linear_int4", 256, 6144, 4096).grid == (96, 4, 1)


def test_older_forms_selectable(monkeypatch):
    """v1 records the constants cores before the rows form and the MMA=2 tile recorded
    (the same kernel ids)."""
    monkeypatch.setattr(launch, "INT4_ROWS", "v1")
    monkeypatch.setattr(launch, "INT4_TILE", "v1")
    c = _config("linear_int4", 8, 4096, 4096)
    assert c.constants == dict(GROUP=128, PRO=0, ACC=0, MMA=0, BLOCK_T=32, BLOCK_N=16,
                               BLOCK_B=256, WARPS=4)
    assert c.grid == (8, 256, 1)
    c = _config("linear_int4", 64, 4096, 4096)
    assert c.constants == dict(GROUP=128, PRO=0, ACC=0, MMA=1, BLOCK_T=64, BLOCK_N=64,
                               BLOCK_B=16, WARPS=4)
    assert c.grid == (64, 1, 1)


def test_specs_and_rejections(monkeypatch):
    monkeypatch.setattr(launch, "INT4_ROWS", "16,1024,8,0,4,512,2")
    c = _config("linear_int4", 1, 4096, 4096)
    assert "WORDS" not in c.constants and c.constants["BLOCK_G"] == 8
    assert c.grid == (1, 256, 1) and c.block == (256, 1, 1)
    c = _config("linear_int4", 5, 4096, 4096)
    assert (c.constants["BLOCK_N"], c.constants["BLOCK_G"]) == (4, 4)
    assert c.block == (64, 1, 1)
    monkeypatch.setattr(launch, "INT4_TILE", "32,128,4")
    c = _config("linear_int4", 64, 4096, 4096)
    assert (c.constants["BLOCK_T"], c.constants["BLOCK_N"]) == (32, 128)
    assert c.grid == (32, 2, 1)
    monkeypatch.setattr(launch, "INT4_ROWS", "16,1024")
    with pytest.raises(ValueError, match="HELIOS_INT4_ROWS must be 'v1', 'v2' or "
                                         "'BLOCK_N,BLOCK_K,WARPS,WORDS,.*got '16,1024'"):
        _config("linear_int4", 1, 4096, 4096)
    monkeypatch.setattr(launch, "INT4_TILE", "big")
    with pytest.raises(ValueError, match="HELIOS_INT4_TILE must be 'v1', 'v2' or "
                                         "'BLOCK_T,BLOCK_N,WARPS', got 'big'"):
        _config("linear_int4", 64, 4096, 4096)
