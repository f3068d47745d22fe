"""Split-context decode attention's launch rule v3 (capture/launch.py): the live-split
layout's programs per (row, kv head) (``HELIOS_ATTN_LIVE``), and with that knob 0 how many
splits one program walks, from the rows and the split count of the capacity."""

from __future__ import annotations

import pytest
from helios_ignition.capture import launch
from helios_ignition.capture.buffers import decode_splits


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
