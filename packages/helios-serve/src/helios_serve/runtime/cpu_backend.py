"""The CPU backend: executes a graph variant by running its launch records with the
NumPy reference kernels (helios_tools.kernels) over buffers allocated once at load.

Invariant: after `__init__` no buffer is allocated or reshaped; a step only writes
request inputs (through shared packing) and runs the bound launch list. bf16 weights
are widened to float32 once at load because NumPy has no bf16 arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from helios_contract.schema import manifest_pb2 as mpb
from helios_tools.kernels import reference_op

from .errors import RuntimeLoadError

STORED_DTYPE = {
    mpb.D_TYPE_F32: np.dtype("<f4"),
    mpb.D_TYPE_BF16: np.dtype("<u2"),
    mpb.D_TYPE_I32: np.dtype("<i4"),
    mpb.D_TYPE_U32: np.dtype("<u4"),
}
COMPUTE_DTYPE = {
    mpb.D_TYPE_F32: np.float32,
    mpb.D_TYPE_BF16: np.float32,
    mpb.D_TYPE_I32: np.int32,
    mpb.D_TYPE_U32: np.uint32,
}


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns -> float32 (exact)."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


class CpuBackend:
    """Buffers and bound launch lists of every graph variant.

    Args:
        manifest: the execution manifest.
        read_resource: resource id -> decoded bytes (weights).
        num_pages: physical pages backing each cache plane (replaces the prepared count).

    Raises:
        RuntimeLoadError: a buffer dtype or weight resource does not fit the manifest.
    """

    name = "cpu"

    def __init__(self, manifest: mpb.ExecutionManifest, read_resource: Callable[[str], bytes],
                 num_pages: int):
        self.buffers: dict[str, np.ndarray] = {}
        self._decls = {b.name: b for b in manifest.buffers}
        for decl in manifest.buffers:
            self.buffers[decl.name] = self._allocate(decl, read_resource, num_pages)
        self._programs: dict[str, list[tuple[Callable[..., None], tuple]]] = {
            g.name: [self._bind(launch, manifest) for launch in g.launches]
            for g in manifest.graphs}

    def _allocate(self, decl: mpb.Buffer, read_resource, num_pages: int) -> np.ndarray:
        if decl.dtype not in COMPUTE_DTYPE:
            raise RuntimeLoadError(f"buffer {decl.name}: dtype {mpb.DType.Name(decl.dtype)} "
                                   "is not supported by the cpu backend")
        shape = [int(s) for s in decl.shape]
        if decl.role == mpb.BUFFER_ROLE_CACHE_PLANE:
            shape[0] = num_pages
        if decl.role != mpb.BUFFER_ROLE_WEIGHT:
            return np.zeros(shape, COMPUTE_DTYPE[decl.dtype])
        data = read_resource(decl.weight_resource_id)
        stored = STORED_DTYPE[decl.dtype]
        expected = math.prod(shape) * stored.itemsize
        if len(data) != expected:
            raise RuntimeLoadError(f"weight {decl.name}: resource {decl.weight_resource_id} "
                                   f"holds {len(data)} bytes, the buffer needs {expected}")
        array = np.frombuffer(data, dtype=stored).reshape(shape)
        if decl.dtype == mpb.D_TYPE_BF16:
            return bf16_bits_to_f32(array)
        return array.astype(COMPUTE_DTYPE[decl.dtype], copy=True)

    def _view(self, view: mpb.BufferView) -> np.ndarray:
        decl = self._decls[view.buffer]
        array = self.buffers[view.buffer]
        shape = tuple(int(s) for s in view.shape)
        if view.byte_offset == 0 and math.prod(shape) == math.prod(decl.shape):
            return array  # the whole buffer (cache planes keep their loaded page count)
        offset = view.byte_offset // STORED_DTYPE[decl.dtype].itemsize
        return array.reshape(-1)[offset:offset + math.prod(shape)].reshape(shape)

    def _bind(self, launch: mpb.Launch, manifest: mpb.ExecutionManifest):
        kernel = next(k for k in manifest.kernels if k.id == launch.kernel)
        args = []
        for arg in launch.args:
            kind = arg.WhichOneof("value")
            if kind == "buffer":
                args.append(self._view(arg.buffer))
            elif kind == "int_value":
                args.append(int(arg.int_value))
            else:
                args.append(float(arg.float_value))
        return reference_op(kernel.reference_op), tuple(args)

    def run(self, graph: str, dirty=()) -> None:
        """Execute every launch of `graph` in order (synchronous).

        `dirty` (physical-row ranges packing wrote) needs no upload here: the staging
        arrays are the buffers.
        """
        for fn, args in self._programs[graph]:
            fn(*args)
