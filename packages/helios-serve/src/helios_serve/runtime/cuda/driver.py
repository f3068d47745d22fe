"""Checked calls into the CUDA driver API (``cuda.bindings.driver``), pinned host arrays
and kernel argument packing.

Every driver call goes through ``call``, which raises ``CudaError`` (with the driver's
error name) on any result but CUDA_SUCCESS, so no return code is ever ignored.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np

from ..errors import RuntimeLoadError

try:  # cuda-python >= 12.6 ships the driver bindings as cuda.bindings
    from cuda.bindings import driver as cu
except ImportError:  # pragma: no cover - depends on the environment
    try:
        from cuda import cuda as cu  # older cuda-python layout
    except ImportError:
        cu = None


class CudaError(RuntimeError):
    """A driver call failed; ``code`` is the CUresult name."""

    def __init__(self, what: str, code: str):
        super().__init__(f"{what}: {code}")
        self.code = code


def require_driver():
    """The driver module, initialized, or a one-line RuntimeLoadError."""
    if cu is None:
        raise RuntimeLoadError("cuda backend: cuda-python is not installed "
                               "(pip install 'helios-serve[cuda]')")
    try:
        (err,) = cu.cuInit(0)
    except RuntimeError as exc:  # no libcuda: cuda-pathfinder raises DynamicLibNotFoundError
        raise RuntimeLoadError(f"cuda backend: no CUDA driver found ({exc})") from None
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeLoadError(f"cuda backend: no usable CUDA driver or GPU ({err.name})")
    return cu


def current_stream(device: int = 0):
    """Make `device`'s primary context current and create a non-blocking stream on it
    (benchmarks and sweeps; the backend manages its own). Returns ``(driver, stream)``.

    Raises:
        RuntimeLoadError: no cuda-python, driver or GPU.
        CudaError: a failing driver call.
    """
    driver = require_driver()
    dev = call("cuDeviceGet", driver.cuDeviceGet(device))
    ctx = call("cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(dev))
    call("cuCtxSetCurrent", driver.cuCtxSetCurrent(ctx))
    flags = driver.CUstream_flags.CU_STREAM_NON_BLOCKING.value
    return driver, call("cuStreamCreate", driver.cuStreamCreate(flags))


def call(what: str, result):
    """Unwrap a driver call's ``(CUresult, *values)``; raise CudaError on failure."""
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if err != cu.CUresult.CUDA_SUCCESS:
        raise CudaError(what, getattr(err, "name", str(err)))
    if not values:
        return None
    return values[0] if len(values) == 1 else values


class PinnedArray:
    """A page-locked host allocation viewed as a NumPy array (freed by ``free``).

    With ``mapped``, the allocation is also mapped into the device's address space
    (CU_MEMHOSTALLOC_DEVICEMAP): ``device_ptr`` is the address kernels read and write it
    at (over the host link), e.g. the host tier's planes.
    """

    def __init__(self, shape: Sequence[int], dtype: np.dtype, mapped: bool = False):
        dtype = np.dtype(dtype)
        self.nbytes = max(int(np.prod(shape)) * dtype.itemsize, 1)
        # CU_MEMHOSTALLOC_DEVICEMAP is 0x02 in cuda.h (a #define; cuda-python exports it).
        flags = getattr(cu, "CU_MEMHOSTALLOC_DEVICEMAP", 0x02) if mapped else 0
        self.ptr = int(call("cuMemHostAlloc", cu.cuMemHostAlloc(self.nbytes, flags)))
        self.device_ptr = (int(call("cuMemHostGetDevicePointer",
                                    cu.cuMemHostGetDevicePointer(self.ptr, 0)))
                           if mapped else 0)
        raw = (ctypes.c_byte * self.nbytes).from_address(self.ptr)
        self.array = np.frombuffer(raw, dtype=np.uint8, count=int(np.prod(shape)) * dtype.itemsize
                                   ).view(dtype).reshape(tuple(shape))
        self.array[...] = 0

    def free(self) -> None:
        if self.ptr:
            call("cuMemFreeHost", cu.cuMemFreeHost(self.ptr))
            self.ptr = 0


class KernelArgs:
    """ctypes storage for one launch's arguments and the ``void*[]`` that points at them.

    Args:
        values: ``("ptr", int) | ("i32", int) | ("f32", float)`` in parameter order.
    """

    CTYPES = {"ptr": ctypes.c_uint64, "i32": ctypes.c_int32, "f32": ctypes.c_float}

    def __init__(self, values: Sequence[tuple[str, int | float]]):
        self.slots = [self.CTYPES[kind](value) for kind, value in values]
        self.array = (ctypes.c_void_p * max(len(self.slots), 1))(
            *[ctypes.addressof(s) for s in self.slots])

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)


def param_count(function) -> int:
    """Number of parameters of a loaded kernel (``cuFuncGetParamInfo`` until it fails)."""
    n = 0
    while True:
        result = cu.cuFuncGetParamInfo(function, n)
        if result[0] != cu.CUresult.CUDA_SUCCESS:
            return n
        n += 1
