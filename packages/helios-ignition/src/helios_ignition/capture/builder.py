"""Program capture: record kernel launches over named physical buffers.

A model family's forward pass is written once against `ProgramBuilder` and run once
per graph variant (operation x captured capacity). The records, the buffer table and
the kernel variants form the execution manifest (docs/architecture.md, "Preparation: from a recipe to a core"). Nothing is
executed here: a launch record carries what a GPU launch needs (kernel, grid, block,
shared bytes, ordered arguments) and what the CPU backend needs (the reference op and
typed views).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from helios_contract.schema import manifest_pb2 as mpb
from helios_tools.kernels import check_launch, kernel_params

from ..recipe import SUPPORTED_ACTIVATION_DTYPES as ACTIVATION_DTYPES
from .launch import launch_config

DTYPE_ENUM = {
    "f32": mpb.D_TYPE_F32,
    "bf16": mpb.D_TYPE_BF16,
    "i32": mpb.D_TYPE_I32,
    "u32": mpb.D_TYPE_U32,
}
ITEMSIZE = {"f32": 4, "bf16": 2, "i32": 4, "u32": 4}
# What a reference kernel sees: bf16 weights are widened to f32 by the backend.
COMPUTE_DTYPE = {"f32": np.float32, "bf16": np.float32, "i32": np.int32, "u32": np.uint32}

ROLE_ENUM = {
    "weight": mpb.BUFFER_ROLE_WEIGHT,
    "state": mpb.BUFFER_ROLE_PERSISTENT_STATE,
    "cache": mpb.BUFFER_ROLE_CACHE_PLANE,
    "input": mpb.BUFFER_ROLE_REQUEST_INPUT,
    "output": mpb.BUFFER_ROLE_OUTPUT,
    "scratch": mpb.BUFFER_ROLE_SCRATCH,
    "tuned": mpb.BUFFER_ROLE_TUNED,
}


class CaptureError(ValueError):
    """A forward pass asked for something the buffer table cannot give."""


@dataclass(frozen=True)
class BufferDecl:
    """A declared physical buffer (shape in elements, dtype name, role name)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    role: str
    weight_resource_id: str = ""
    # A weight split between tensor-parallel ranks: rank r's resource (then
    # weight_resource_id is empty).
    rank_weight_resource_ids: tuple[str, ...] = ()

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class View:
    """A typed view of a declared buffer: `shape` elements from `offset` elements in."""

    buffer: BufferDecl
    shape: tuple[int, ...]
    offset: int = 0

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(COMPUTE_DTYPE[self.buffer.dtype])


@dataclass
class BufferTable:
    """The ordered table of physical buffers a family declares."""

    buffers: dict[str, BufferDecl] = field(default_factory=dict)

    def declare(self, name: str, dtype: str, shape: tuple[int, ...], role: str,
                weight_resource_id: str = "",
                rank_weight_resource_ids: tuple[str, ...] = ()) -> BufferDecl:
        """Declare a buffer once; declaring the same name twice is a capture error."""
        if name in self.buffers:
            raise CaptureError(f"buffer {name!r} declared twice")
        decl = BufferDecl(name, dtype, tuple(int(s) for s in shape), role, weight_resource_id,
                          tuple(rank_weight_resource_ids))
        self.buffers[name] = decl
        return decl

    def view(self, name: str, shape: tuple[int, ...], offset: int = 0) -> View:
        """A view of `shape` elements of buffer `name` starting `offset` elements in.

        Raises:
            CaptureError: unknown buffer, or the view does not fit inside it.
        """
        try:
            decl = self.buffers[name]
        except KeyError:
            raise CaptureError(f"unknown buffer {name!r}") from None
        shape = tuple(int(s) for s in shape)
        if offset < 0 or offset + math.prod(shape) > decl.numel:
            raise CaptureError(
                f"view {shape} at element {offset} exceeds buffer {name!r} of shape {decl.shape}")
        return View(decl, shape, offset)

    def to_proto(self) -> list[mpb.Buffer]:
        return [mpb.Buffer(name=d.name, dtype=DTYPE_ENUM[d.dtype], shape=list(d.shape),
                           role=ROLE_ENUM[d.role], weight_resource_id=d.weight_resource_id,
                           rank_weight_resource_ids=list(d.rank_weight_resource_ids))
                for d in self.buffers.values()]


class ProgramBuilder:
    """Records the ordered launches of one graph variant.

    Args:
        table: the buffer table every launch argument must come from.
        kernels: shared kernel-variant table (id -> Kernel), filled as ops are launched.
        activations: the packed products' activation dtype, ACTIVATION_DTYPES ("f32":
            hi | lo terms; "bf16": rounded, hi | 0; capture.layers.product).
    """

    def __init__(self, table: BufferTable, kernels: dict[str, mpb.Kernel],
                 activations: str = "f32"):
        if activations not in ACTIVATION_DTYPES:
            raise CaptureError(f"activation dtype must be one of "
                               f"{', '.join(ACTIVATION_DTYPES)}, not {activations!r}")
        self.table = table
        self.kernels = kernels
        self.activations = activations
        self.launches: list[mpb.Launch] = []

    def launch(self, op: str, *args: View | int | float, rounded: bool = False) -> None:
        """Record one launch of `op` with arguments in KERNEL_PARAMS order (`rounded`: a
        packed product over a ``round_bf16`` output: ``launch.launch_config``).

        Raises:
            TypeError/KeyError: the arguments do not match the op's parameter list.
        """
        check_launch(op, args)
        scalars = [a for a in args if not isinstance(a, View)]
        config = launch_config(op, scalars, [a for a in args if isinstance(a, View)],
                               rounded=rounded)
        kernel_id = self._kernel_variant(op, config.constants)
        record = mpb.Launch(kernel=kernel_id, grid=list(config.grid), block=list(config.block),
                            shared_bytes=config.shared_bytes)
        for arg in args:
            if isinstance(arg, View):
                view = mpb.BufferView(buffer=arg.buffer.name, shape=list(arg.shape),
                                      byte_offset=arg.offset * ITEMSIZE[arg.buffer.dtype])
                record.args.add(buffer=view)
            elif isinstance(arg, (float, np.floating)):
                record.args.add(float_value=float(arg))
            else:
                record.args.add(int_value=int(arg))
        self.launches.append(record)

    def _kernel_variant(self, op: str, constants: dict[str, int]) -> str:
        suffix = "_".join(f"{k}{v}" for k, v in sorted(constants.items()))
        kernel_id = f"{op}__{suffix}" if suffix else op
        if kernel_id not in self.kernels:

            kernel = mpb.Kernel(id=kernel_id, reference_op=op)
            kinds = {"buffer": mpb.PARAM_KIND_BUFFER, "i32": mpb.PARAM_KIND_I32,
                     "f32": mpb.PARAM_KIND_F32}
            for spec in kernel_params(op):
                kernel.params.add(name=spec.name, kind=kinds[spec.kind])
            for key, value in constants.items():
                kernel.constants[key] = value
            self.kernels[kernel_id] = kernel
        return kernel_id
