"""slot_gather / slot_scatter: the device-owned pending token's read and write."""

from __future__ import annotations

import numpy as np
from helios_tools.kernels import slot_gather, slot_scatter


def test_slot_gather_reads_each_rows_slot_and_pads_with_minus_one():
    src = np.array([10, 11, 12, 13], np.int32)
    slot = np.array([2, -1, 0, 4, 3], np.int32)
    out = np.full(6, -7777, np.int32)
    slot_gather(src, slot, out, 5, 4)
    assert out.tolist() == [12, -1, 10, -1, 13, -7777]  # row 5 is past R: untouched


def test_slot_scatter_writes_sampling_rows_with_valid_slots_only():
    dst = np.array([0, 1, 2, 3], np.int32)
    values = np.array([40, 41, 42, 43, 44], np.int32)
    slot = np.array([3, 1, -1, 0, 2], np.int32)
    decision = np.array([1, 0, 1, 1, 1], np.int32)
    slot_scatter(values, slot, decision, dst, 4, 4)  # row 4 is past R
    assert dst.tolist() == [43, 1, 2, 40]


def test_gather_after_scatter_round_trips():
    dst = np.zeros(8, np.int32)
    slot = np.array([5, 2, 7], np.int32)
    slot_scatter(np.array([9, 8, 7], np.int32), slot, np.ones(3, np.int32), dst, 3, 8)
    out = np.zeros(3, np.int32)
    slot_gather(dst, slot[::-1].copy(), out, 3, 8)
    assert out.tolist() == [7, 8, 9]
