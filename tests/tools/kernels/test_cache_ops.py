"""The row_copy reference: whole rows between planes, padding rows copy nothing."""

from __future__ import annotations

import numpy as np
import pytest
from helios_tools.kernels import row_copy


def test_row_copy_moves_whole_rows_and_skips_padding():
    src = np.arange(4 * 2 * 3, dtype=np.float32).reshape(4, 2, 3)
    dst = np.full((3, 2, 3), -1.0, np.float32)
    row_copy(src, dst, np.array([3, -1, 0, 2], np.int32), np.array([0, 1, -1, 2], np.int32),
             4, 6)
    np.testing.assert_array_equal(dst[0], src[3])
    np.testing.assert_array_equal(dst[1], np.full((2, 3), -1.0))  # source padding
    np.testing.assert_array_equal(dst[2], src[2])


def test_row_copy_reads_every_source_before_writing():
    plane = np.arange(3 * 4, dtype=np.float32).reshape(3, 4)
    before = plane.copy()
    row_copy(plane, plane, np.array([0, 1], np.int32), np.array([1, 2], np.int32), 2, 4)
    np.testing.assert_array_equal(plane[1], before[0])
    np.testing.assert_array_equal(plane[2], before[1])


def test_row_copy_rejects_rows_outside_the_planes():
    src = np.zeros((2, 4), np.float32)
    dst = np.zeros((2, 4), np.float32)
    with pytest.raises(IndexError, match="outside planes of 2 / 2 rows"):
        row_copy(src, dst, np.array([0], np.int32), np.array([2], np.int32), 1, 4)
