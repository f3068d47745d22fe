"""Split-context decode attention's launch rule v3 (capture/launch.py): how many splits
one program walks, from the rows and the split count of the capacity."""

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
def test_splits_per_program_only_at_64_rows_and_128_splits(rows, capacity, H, KVH, HD,
                                                          grid, spp):
    ns, split = decode_splits(capacity)
    c = launch.launch_config("attention_decode_split",
                             [rows, capacity // 16, 16, H, KVH, HD, ns, split, 0.125])
    assert c.grid == grid
    assert c.constants.get("SPP") == spp
    assert c.constants["GROUPED"] == 2 and c.constants["BLOCK_N"] == split == 64
