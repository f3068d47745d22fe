"""Run one Triton kernel variant eagerly on the GPU over NumPy arrays (tests only).

The variant is chosen by ``capture.launch.launch_config`` (as in program capture),
compiled by ``kernels_aot.compile_variant`` for this GPU and launched through the
driver helpers the cuda backend uses, so a kernel test exercises the same compile and
launch path as serving. Output buffers are poisoned before the launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
from helios_ignition.capture.launch import launch_config
from helios_ignition.kernels_aot import compile_variant
from helios_serve.runtime.cuda import driver as drv
from helios_tools.kernels import kernel_params


@dataclass(frozen=True)
class _View:
    """What launch_config reads of a buffer argument (shape and declared dtype)."""

    shape: tuple[int, ...]
    buffer: object


@dataclass(frozen=True)
class _Decl:
    dtype: str


# Bytes of an element of each declared buffer dtype (kernel_params, plus bf16 bits).
_ITEMSIZE = {"f32": 4, "i32": 4, "u32": 4, "u8": 1, "bf16": 2}


def bf16_round(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bf16 bits as uint16, the same values widened to f32), round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    bits = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32)


class Gpu:
    """A CUDA context for eager kernel tests."""

    def __init__(self):
        self.cu = drv.require_driver()
        cu = self.cu
        dev = drv.call("cuDeviceGet", cu.cuDeviceGet(0))
        major = drv.call("attr", cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
        minor = drv.call("attr", cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
        self.target = f"sm_{major}{minor}"
        self.ctx = drv.call("retain", cu.cuDevicePrimaryCtxRetain(dev))
        drv.call("set", cu.cuCtxSetCurrent(self.ctx))

    @cache  # noqa: B019 - one Gpu per session
    def function(self, op: str, constants: tuple):
        ck = compile_variant(op, dict(constants), self.target)
        module = drv.call("load", self.cu.cuModuleLoadData(ck.binary))
        fn = drv.call("fn", self.cu.cuModuleGetFunction(module, ck.entry_name.encode()))
        if ck.shared_bytes > 48 * 1024:
            drv.call("attr", self.cu.cuFuncSetAttribute(
                fn, self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                ck.shared_bytes))
        return fn, ck, drv.param_count(fn)

    def run(self, op: str, *args, bf16: tuple[str, ...] = (),
            rounded: bool = False) -> dict[str, np.ndarray]:
        """Launch `op` over `args` (arrays and scalars in KERNEL_PARAMS order).

        Args:
            bf16: names of buffer params passed as bf16 bits (uint16 arrays).
            rounded: a packed product over ``round_bf16``'s output (launch_config's
                `rounded`: ``XSPLIT=0``).

        Returns:
            Every buffer param's contents after the kernel, by name (bf16 as bits).

        Raises:
            TypeError: a floating array whose element size is not its param's dtype's.
        """
        cu = self.cu
        params = kernel_params(op)
        views, scalars, ptrs, values = [], [], {}, []
        for spec, arg in zip(params, args, strict=True):
            if spec.kind == "buffer":
                arr = np.ascontiguousarray(arg)
                dtype = "bf16" if spec.name in bf16 else spec.dtype
                if arr.dtype.kind == "f" and arr.dtype.itemsize != _ITEMSIZE[dtype]:
                    # the kernel reads raw bytes: an f64 array would arrive as garbage
                    raise TypeError(f"{op}: buffer {spec.name!r} is {arr.dtype}, the kernel "
                                    f"reads {dtype}")
                views.append(_View(arr.shape, _Decl(dtype)))
                n = max(arr.nbytes, 256)
                ptr = int(drv.call("alloc", cu.cuMemAlloc(n)))
                if spec.direction == "out":
                    poison = np.full(arr.shape, np.nan if arr.dtype.kind == "f" else -7777,
                                     arr.dtype)
                    drv.call("h2d", cu.cuMemcpyHtoD(ptr, poison.ctypes.data, arr.nbytes))
                else:
                    drv.call("h2d", cu.cuMemcpyHtoD(ptr, arr.ctypes.data, arr.nbytes))
                ptrs[spec.name] = (ptr, arr)
                values.append(("ptr", ptr))
            else:
                scalars.append(arg)
                values.append((spec.kind, arg))
        config = launch_config(op, list(scalars), views, rounded=rounded)
        fn, ck, count = self.function(op, tuple(sorted(config.constants.items())))
        g = config.grid
        scratch = []  # global / profile scratch, per program (TMA descriptors live there)
        for per in (ck.global_scratch_bytes, ck.profile_scratch_bytes)[:count - len(params)]:
            if per:
                scratch.append(int(drv.call("alloc", cu.cuMemAlloc(per * g[0] * g[1] * g[2]))))
            values.append(("ptr", scratch[-1] if per else 0))
        values += [("ptr", 0)] * (count - len(values))
        kargs = drv.KernelArgs(values)
        drv.call("launch", cu.cuLaunchKernel(fn, g[0], g[1], g[2], 32 * ck.num_warps, 1, 1,
                                             ck.shared_bytes, 0, kargs.address, 0))
        drv.call("sync", cu.cuCtxSynchronize())
        for ptr in scratch:
            drv.call("free", cu.cuMemFree(ptr))
        out = {}
        for name, (ptr, arr) in ptrs.items():
            res = np.empty_like(arr)
            drv.call("d2h", cu.cuMemcpyDtoH(res.ctypes.data, ptr, arr.nbytes))
            drv.call("free", cu.cuMemFree(ptr))
            out[name] = res
        return out
