"""The kernel table agrees with the reference functions and checks launches."""

import inspect

import numpy as np
import pytest
from helios_tools.kernels import (
    KERNEL_PARAMS,
    REFERENCE_OPS,
    check_launch,
    kernel_params,
    reference_op,
)
from helios_tools.kernels.collective import COLLECTIVE_OPS


def test_table_names_every_reference_parameter_in_order():
    assert REFERENCE_OPS.keys() | set(COLLECTIVE_OPS) == KERNEL_PARAMS.keys()
    for op, fn in REFERENCE_OPS.items():
        names = list(inspect.signature(fn).parameters)
        assert names == [p.name for p in KERNEL_PARAMS[op]], op
        kinds = [p.kind for p in KERNEL_PARAMS[op]]
        # buffers first, then scalars
        assert kinds == sorted(kinds, key=lambda k: k != "buffer"), op
        for p in KERNEL_PARAMS[op]:
            assert (p.dtype is None) == (p.kind != "buffer"), (op, p)
            assert p.kind == "buffer" or p.direction == "in", (op, p)


def test_outputs_are_declared():
    out = {op: [p.name for p in ps if p.direction != "in"] for op, ps in KERNEL_PARAMS.items()}
    assert out["add_rmsnorm"] == ["residual", "out"]
    assert out["rope"] == ["qkv"]
    assert out["kv_write"] == ["k_cache", "v_cache"]
    assert out["sample"] == ["histogram", "sampled"]


def test_unknown_op_lists_the_known_ones():
    with pytest.raises(KeyError, match="known ops: embedding, rmsnorm"):
        reference_op("flash_attention")
    with pytest.raises(KeyError, match="sample"):
        kernel_params("nope")


def test_check_launch():
    x = np.zeros((2, 3), np.float32)
    w = np.zeros((4, 3), np.float32)
    o = np.zeros((2, 4), np.float32)
    check_launch("linear", [x, w, o, 2, 4, 3])
    check_launch("rmsnorm", [x, x[0], x, 2, 3, 1e-5])
    with pytest.raises(TypeError, match="expected 6 arguments"):
        check_launch("linear", [x, w, o, 2, 4])
    with pytest.raises(TypeError, match=r"linear\.weight: expected a f32 buffer"):
        check_launch("linear", [x, w.astype(np.float64), o, 2, 4, 3])
    with pytest.raises(TypeError, match=r"linear\.K: expected an i32"):
        check_launch("linear", [x, w, o, 2, 4, 3.0])
    with pytest.raises(TypeError, match="does not fit"):
        check_launch("linear", [x, w, o, 2, 4, 2**31])
    with pytest.raises(TypeError, match=r"rmsnorm\.eps: expected an f32"):
        check_launch("rmsnorm", [x, x[0], x, 2, 3, None])
    from helios_tools.kernels import DTYPES

    args = [
        np.zeros(1, DTYPES[p.dtype]) if p.kind == "buffer" else 1 for p in KERNEL_PARAMS["sample"]
    ]
    check_launch("sample", args)
    args[4] = args[4].astype(np.int32)  # seed must be u32
    with pytest.raises(TypeError, match=r"sample\.seed: expected a u32 buffer"):
        check_launch("sample", args)
