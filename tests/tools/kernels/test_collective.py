"""NumPy references of the collective ops (kernels/collective.py): exact values."""

from __future__ import annotations

import numpy as np
import pytest
from helios_tools.kernels import KERNEL_PARAMS, reference_op
from helios_tools.kernels.collective import all_gather_columns, all_reduce_sum, broadcast_rank0


def test_all_reduce_sum_adds_in_rank_order_within_the_view():
    parts = [np.full((3, 5), r + 1, np.float32) for r in range(3)]
    parts[1][2, 4] = 100.0
    out = all_reduce_sum(parts, 2, 4)  # rows/columns past T, N are not the collective's
    np.testing.assert_array_equal(out, np.full((2, 4), 6.0, np.float32))
    assert out.dtype == np.float32
    # Rank order: f32 addition is not associative; the result is ((p0 + p1) + p2).
    a, b, c = (np.array([[v]], np.float32) for v in (1e8, -1e8, 1.0))
    assert all_reduce_sum([a, b, c], 1, 1)[0, 0] == np.float32(1.0)
    assert all_reduce_sum([a, c, b], 1, 1)[0, 0] == np.float32(0.0)


def test_all_gather_columns_drops_the_last_ranks_padding():
    parts = [np.arange(8, dtype=np.float32).reshape(2, 4) + 10 * r for r in range(3)]
    out = all_gather_columns(parts, 2, 4, 10)  # 3 ranks x 4 columns cover 10 (2 pad)
    np.testing.assert_array_equal(out[:, 0:4], parts[0])
    np.testing.assert_array_equal(out[:, 4:8], parts[1])
    np.testing.assert_array_equal(out[:, 8:10], parts[2][:, :2])


@pytest.mark.parametrize(("ranks", "nl", "n"), [(2, 4, 9), (3, 4, 8), (0, 4, 4)])
def test_all_gather_columns_rejects_columns_that_do_not_cover_n(ranks, nl, n):
    parts = [np.zeros((1, nl), np.float32)] * ranks
    with pytest.raises(ValueError, match=f"{ranks} ranks of {nl} columns do not cover {n}"):
        all_gather_columns(parts, 1, nl, n)


def test_collectives_are_in_the_kernel_table_but_have_no_local_reference():
    assert [p.name for p in KERNEL_PARAMS["all_reduce_sum"]] == ["x", "T", "N"]
    assert KERNEL_PARAMS["all_reduce_sum"][0].direction == "inout"
    assert [p.name for p in KERNEL_PARAMS["all_gather_columns"]] == ["x", "out", "T", "NL", "N"]
    with pytest.raises(KeyError, match="all_reduce_sum is a collective"):
        reference_op("all_reduce_sum")


def test_broadcast_rank0_copies_rank_zeros_view():
    parts = [np.full((3, 4), float(r), np.float32) for r in range(3)]
    got = broadcast_rank0(parts, 2, 3)
    np.testing.assert_array_equal(got, np.zeros((2, 3), np.float32))
    assert got is not parts[0] and got.dtype == np.float32
    with pytest.raises(ValueError, match="at least one rank"):
        broadcast_rank0([], 1, 1)
