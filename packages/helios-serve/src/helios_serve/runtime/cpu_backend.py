"""The CPU backend: executes a graph variant by running its launch records with the
NumPy reference kernels (helios_tools.kernels) over buffers allocated once at load;
launches over quantized weights (GGUF blocks, Buffer.storage) run as ggml graphs built
once at load over the same buffers (runtime.ggml_lib).

Invariant: after `__init__` no buffer is allocated or reshaped; a step only writes
request inputs (through shared packing) and runs the bound launch list. bf16 weights
are widened to float32 once at load because NumPy has no bf16 arithmetic.

Load order: a cache the options size (--num-pages, --kv-cache-memory, the prepared
default) checked against the host's available memory with the tier rows; weights and
every other buffer (continuation and host-tier planes included, sized by `tiers`); the
paged KV cache sized from what is left (runtime.cache_sizing); then the launch lists of
every graph and tuning producer are bound (binding takes views of the cache planes, so it
follows their allocation). On the host, the host tier is plain memory like everything
else.

Execution frames mirror the cuda backend's: request inputs and the completion record
have one staging array per frame, copied into (out of) the working buffers when that
frame's step runs, so packing step N + 1 never disturbs step N. Steps run synchronously
inside `launch` (NumPy holds the host anyway) and `wait` returns at once, so a second
frame buys no overlap here and would only delay each token's publication by a step: the
default is one frame; two exercise the cuda backend's submission order on the CPU.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import numpy as np
from helios_contract import STORAGE_BLOCKS, stored_nbytes
from helios_contract.schema import manifest_pb2 as mpb
from helios_tools.kernels import kernel_params, reference_op
from helios_tools.kernels.collective import COLLECTIVE_OPS
from helios_tools.kernels.fp8 import FP8_FORMS, decode_e4m3
from helios_tools.kernels.int4 import INT4_FORMS, dequantize_int4
from helios_tools.kernels.int8 import (
    INT4_MIN_FORMS,
    INT8_FORMS,
    dequantize_int4_min,
    dequantize_int8,
)

from ..config import format_bytes
from ..startup import StartupLog
from .cache_sizing import HOST_MEMORY, CacheSizing, MemoryAsk, check_fits, host_available_bytes
from .collectives import Collectives, SingleRank
from .completion import completion_buffers, confidence_buffers
from .errors import RuntimeLoadError
from .ggml_lib import GgmlPrograms
from .ggml_step import StepPrograms, step_graphs_enabled
from .tiers import TierRows

FP8_OPS = frozenset(FP8_FORMS.values())
INT4_OPS = frozenset(INT4_FORMS.values())
# Each element-wise code form -> the dequantization of its weight and side buffers (the
# arguments from the weight on: codes, scales[, zero points or minimums]).
DEQUANTIZE = {**{op: (dequantize_int4, 3) for op in INT4_OPS},
              **{op: (dequantize_int4_min, 3) for op in INT4_MIN_FORMS.values()},
              **{op: (dequantize_int8, 2) for op in INT8_FORMS.values()}}

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


def _compute_dtype(decl: mpb.Buffer) -> type:
    """The NumPy dtype `decl` is held in (bf16 as float32; an e4m3 cache plane's codes
    as uint8, read by the ``*_fp8kv`` references; a bf16 cache plane as its uint16 bit
    patterns, two bytes an element as on the GPU, read and written by the ``*_bf16kv``
    references, which widen and round exactly as the cuda kernels do).

    Raises:
        RuntimeLoadError: a dtype the cpu backend does not execute.
    """
    if decl.role == mpb.BUFFER_ROLE_CACHE_PLANE and decl.HasField("storage"):
        return np.uint8
    if decl.role == mpb.BUFFER_ROLE_CACHE_PLANE and decl.dtype == mpb.D_TYPE_BF16:
        return np.uint16
    if decl.dtype not in COMPUTE_DTYPE:
        raise RuntimeLoadError(f"buffer {decl.name}: dtype {mpb.DType.Name(decl.dtype)} "
                               "is not supported by the cpu backend")
    return COMPUTE_DTYPE[decl.dtype]


def _row_bytes(decl: mpb.Buffer) -> int:
    """Host bytes of one leading row of `decl` (a page of a cache plane, as stored: an
    e4m3 plane's codes take a byte an element)."""
    if decl.HasField("storage"):
        return stored_nbytes(decl, leading=1)
    itemsize = np.dtype(_compute_dtype(decl)).itemsize
    return math.prod(int(s) for s in decl.shape[1:]) * itemsize


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns -> float32 (exact)."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


class CpuBackend:
    """Buffers and bound launch lists of every graph variant.

    Args:
        manifest: the execution manifest.
        read_resource: resource id -> decoded bytes (weights).
        cache: how the physical KV page count is chosen (default: the prepared count).
        frames: execution frames offered (1 or 2; see the module docstring).
        log: startup phases (weights, cache sizing, graphs) are recorded here.
        rank: the tensor-parallel rank this backend executes (its weights are each split
            buffer's ``rank_weight_resource_ids[rank]``); 0 for a single-rank core.
        collectives: what the collective ops of the programs run on (the rank peers of
            runtime.ranks); default: one rank.
        tiers: rows of the continuation and host-tier planes (default: none declared).

    Attributes:
        cache: the chosen KV capacity (`cache.num_pages` replaces the prepared count).

    Raises:
        RuntimeLoadError: a buffer dtype or weight resource does not fit the manifest, or
            the cache budget holds no page.
        ValueError: frames outside 1..2.
    """

    name = "cpu"

    def __init__(self, manifest: mpb.ExecutionManifest, read_resource: Callable[[str], bytes],
                 cache: CacheSizing | None = None, frames: int = 1,
                 log: StartupLog | None = None, tiers: TierRows | None = None, *,
                 rank: int = 0, collectives: Collectives | None = None):
        if frames not in (1, 2):
            raise ValueError(f"the cpu backend offers 1 or 2 execution frames, not {frames}")
        log = log if log is not None else StartupLog()
        self.frames = frames
        self.rank = rank
        self._collectives = collectives if collectives is not None else SingleRank()
        # Load-time resources (as the cuda backend counts them); fixed while serving.
        self.counters: Counter[str] = Counter()
        self.buffers: dict[str, np.ndarray] = {}
        self._decls = {b.name: b for b in manifest.buffers}
        # Quantized weights (Buffer.storage): kept as their blocks; the launches reading
        # them run as ggml graphs built below, once (runtime.ggml_lib).
        # FP8 codes stay uint8 [rows, K] for the NumPy W8A8 ops (kernels.fp8) that name them;
        # FP8, INT4, INT4_MIN and INT8 codes are decoded to f32 once, at the first launch
        # binding them.
        storage = {b.name: b.storage for b in manifest.buffers if b.HasField("storage")
                   and b.storage.type in STORAGE_BLOCKS}
        self._ggml = GgmlPrograms(storage) if storage else None
        self._decoded: dict[str, np.ndarray] = {}
        tiers = tiers or TierRows()
        planes = [b for b in manifest.buffers if b.role == mpb.BUFFER_ROLE_CACHE_PLANE
                  and b.name not in tiers.rows]
        page_bytes = max(sum(_row_bytes(d) for d in planes), 1)
        prepared = int(planes[0].shape[0]) if planes else 0
        # The tier rows are allocated but untouched: the available memory omits them.
        tier_rows = MemoryAsk("--snapshots / --host-cache-bytes", "the cache tiers",
                              sum(_row_bytes(d) * rows for d in manifest.buffers
                                  if (rows := tiers.rows.get(d.name)) is not None
                                  and d.name not in tiers.window))
        # The sliding-window region's pool: its planes keep their manifest extent.
        window = [MemoryAsk("the core", "sliding-window pages",
                            sum(_row_bytes(d) * tiers.rows[d.name] for d in manifest.buffers
                                if d.name in tiers.window))] if tiers.window else []
        sizing = cache or CacheSizing()
        # A cache the options size fails here, in a second, not after the weights load.
        fixed = sizing.fixed_ask(backend="cpu", page_bytes=page_bytes, prepared_pages=prepared)
        check_fits([tier_rows, *window, *([fixed] if fixed else [])], memory=HOST_MEMORY,
                   available=host_available_bytes())
        with log.phase("weights") as phase:
            for decl in manifest.buffers:
                if decl.name in tiers.rows:
                    self.buffers[decl.name] = self._allocate(decl, read_resource,
                                                             tiers.rows[decl.name])
                elif decl.role != mpb.BUFFER_ROLE_CACHE_PLANE:
                    self.buffers[decl.name] = self._allocate(decl, read_resource, 0)
            weights = [self.buffers[b.name] for b in manifest.buffers
                       if b.role == mpb.BUFFER_ROLE_WEIGHT]
            nbytes = sum(w.nbytes for w in weights)
            phase.detail = (f"{len(weights)} tensors, {format_bytes(nbytes)} (f32 on the host"
                            + (f", {len(storage)} in quantized blocks)" if storage else ")"))
        with log.phase("cache sizing") as phase:
            self.cache = sizing.choose(backend="cpu", page_bytes=page_bytes,
                                       prepared_pages=prepared, reserved=[tier_rows])
            for decl in planes:
                self.buffers[decl.name] = self._allocate(decl, read_resource,
                                                         self.cache.num_pages)
            phase.detail = self.cache.describe()
        with log.phase("graphs") as phase:
            programs = [*manifest.graphs, *manifest.tuning.producers]
            self._records: dict[str, list[tuple[str, list[str | None], tuple]]] = {}
            self._programs: dict[str, list[tuple[Callable[..., None], tuple]]] = {
                g.name: [self._bind(launch, manifest, self._records.setdefault(g.name, []))
                         for launch in g.launches]
                for g in programs}
            self._steps: dict[str, Callable[[], None]] = {}
            self._step_programs: StepPrograms | None = None
            if self._ggml is not None:
                self._ggml.seal()
                self.counters["ggml_graphs"] = self._ggml.graph_count
                self.counters["ggml_pool_graphs"] = self._ggml.pool_graph_count
                if step_graphs_enabled():  # whole programs, captured once (ggml_step)
                    steps = StepPrograms(self._ggml)
                    for g in manifest.graphs:
                        steps.add_program(g.name, self._records[g.name],
                                          self._programs[g.name])
                    steps.seal()
                    self._steps = {name: steps.runner(name) for name in steps.programs()}
                    self._step_programs = steps
                    self.counters["ggml_step_graphs"] = steps.graph_count
                    self.counters["ggml_step_programs"] = len(self._steps)
            phase.detail = (f"{len(manifest.graphs)} graphs and "
                            f"{len(manifest.tuning.producers)} tuning producers bound to the "
                            "NumPy reference ops"
                            + (f" and {self._ggml.graph_count} ggml graphs over quantized "
                               f"weights ({self._ggml.threads} threads)" if self._ggml else "")
                            + (f"; {len(self._steps)} programs as {steps.graph_count} "
                               f"whole-program ggml graphs" if self._steps else ""))
        per_frame = {b.name for b in manifest.buffers
                     if b.role in (mpb.BUFFER_ROLE_REQUEST_INPUT, mpb.BUFFER_ROLE_OUTPUT)}
        framed = confidence_buffers(manifest.graphs)
        per_frame -= framed
        shared = {name: np.zeros_like(self.buffers[name]) for name in framed}
        self._staging = [{name: shared.get(name, np.zeros_like(a) if name in per_frame else a)
                          for name, a in self.buffers.items()} for _ in range(self.frames)]
        self.counters["device_allocations"] = len(self.buffers)
        self.counters["host_allocations"] = len(per_frame) * self.frames
        self.counters["graph_captures"] = len(self._programs)
        self._inputs = {g.name: [t.destination for t in g.transports
                                 if t.destination in per_frame] for g in manifest.graphs}
        self._completion = {g.name: completion_buffers(g.completion) for g in manifest.graphs}
        # graph -> (framed confidence buffer, rows) of programs producing confidence
        self._confidence = {g.name: (g.completion.confidence_buffer, int(g.completion.rows))
                            for g in manifest.graphs if g.completion.confidence_buffer}

    @property
    def num_pages(self) -> int:
        """Physical pages backing each cache plane."""
        return self.cache.num_pages

    def run_producers(self, names: list[str]) -> None:
        """Run tuning producers `names` once, in order (startup, before any step)."""
        for name in names:
            self.run(name)

    def _allocate(self, decl: mpb.Buffer, read_resource, rows: int) -> np.ndarray:
        """Allocate `decl` (a cache plane leads with `rows`)."""
        dtype = _compute_dtype(decl)
        shape = [int(s) for s in decl.shape]
        if decl.role == mpb.BUFFER_ROLE_CACHE_PLANE:
            shape[0] = rows
        if decl.role != mpb.BUFFER_ROLE_WEIGHT:
            return np.zeros(shape, dtype)
        resource = (decl.rank_weight_resource_ids[self.rank] if decl.rank_weight_resource_ids
                    else decl.weight_resource_id)
        data = read_resource(resource)
        if decl.HasField("storage"):  # blocks as they are, [rows, row bytes] uint8
            if len(data) != stored_nbytes(decl):
                raise RuntimeLoadError(f"weight {decl.name}: resource {resource} holds "
                                       f"{len(data)} bytes, its blocks need "
                                       f"{stored_nbytes(decl)}")
            rows = math.prod(shape[:-1])
            return np.frombuffer(data, dtype=np.uint8).reshape(rows, -1)  # read only
        stored = STORED_DTYPE[decl.dtype]
        expected = math.prod(shape) * stored.itemsize
        if len(data) != expected:
            raise RuntimeLoadError(f"weight {decl.name}: resource {resource} "
                                   f"holds {len(data)} bytes, the buffer needs {expected}")
        array = np.frombuffer(data, dtype=stored).reshape(shape)
        if decl.dtype == mpb.D_TYPE_BF16:
            return bf16_bits_to_f32(array)
        return array.astype(dtype, copy=True)

    def _view(self, view: mpb.BufferView) -> np.ndarray:
        decl = self._decls[view.buffer]
        array = self.buffers[view.buffer]
        shape = tuple(int(s) for s in view.shape)
        if decl.HasField("storage"):  # a quantized weight or e4m3 plane is read whole
            if view.byte_offset or shape != tuple(int(s) for s in decl.shape):
                raise RuntimeLoadError(f"a view of quantized weight {decl.name} must be the "
                                       f"whole buffer {list(decl.shape)}, not {list(shape)} at "
                                       f"byte {view.byte_offset}")
            return array
        if view.byte_offset == 0 and math.prod(shape) == math.prod(decl.shape):
            return array  # the whole buffer (cache planes keep their loaded page count)
        offset = view.byte_offset // STORED_DTYPE[decl.dtype].itemsize
        return array.reshape(-1)[offset:offset + math.prod(shape)].reshape(shape)

    def _bind(self, launch: mpb.Launch, manifest: mpb.ExecutionManifest,
              records: list[tuple[str, list[str | None], tuple]]):
        """The launch's callable and arguments; (op, buffer names, arguments) is appended
        to `records` (what the whole-program graphs are built from)."""
        kernel = next(k for k in manifest.kernels if k.id == launch.kernel)
        args = []
        names: list[str | None] = []
        for arg in launch.args:
            kind = arg.WhichOneof("value")
            names.append(arg.buffer.buffer if kind == "buffer" else None)
            if kind == "buffer":
                args.append(self._view(arg.buffer))
            elif kind == "int_value":
                args.append(int(arg.int_value))
            else:
                args.append(float(arg.float_value))
        if kernel.reference_op in FP8_OPS:  # e4m3 codes decoded once, shared by launches
            at = [p.name for p in kernel_params(kernel.reference_op)].index("weight")
            if names[at] not in self._decoded:
                self._decoded[names[at]] = decode_e4m3(args[at])
            args[at] = self._decoded[names[at]]
        if kernel.reference_op in DEQUANTIZE:  # codes dequantized once (their sides follow)
            dequantize, count = DEQUANTIZE[kernel.reference_op]
            at = [p.name for p in kernel_params(kernel.reference_op)].index("weight")
            if names[at] not in self._decoded:
                self._decoded[names[at]] = dequantize(*args[at:at + count])
            args[at] = self._decoded[names[at]]
        records.append((kernel.reference_op, names, tuple(args)))
        if kernel.reference_op in COLLECTIVE_OPS:  # joins the ranks: their peers run it
            return getattr(self._collectives, kernel.reference_op), tuple(args)
        if self._ggml is not None and any(n in self._ggml.storage for n in names if n):
            return self._ggml.form(kernel.reference_op, names, tuple(args)), ()
        return reference_op(kernel.reference_op), tuple(args)

    def staging(self, frame: int) -> dict[str, np.ndarray]:
        """Host arrays packing writes for `frame`: per-frame request inputs and completion,
        and the working buffers themselves for persistent state (page tables, histogram)."""
        return self._staging[frame]

    def launch(self, graph: str, frame: int, dirty=()) -> None:
        """Run `graph` from `frame`'s staging: copy its request inputs in, execute every
        launch in order, copy the completion record out to the frame.

        `dirty` (physical-row ranges packing wrote) needs no upload here: persistent
        state is packed into the working buffers directly.
        """
        staged = self._staging[frame]
        for name in self._inputs[graph]:
            self.buffers[name][...] = staged[name]
        self.run(graph)
        self.counters["graph_launches"] += 1
        for done in self._completion[graph]:
            staged[done][...] = self.buffers[done]
        framed = self._confidence.get(graph)
        if framed is not None:  # the launches' plane-0 rows -> this frame's plane
            name, rows = framed
            staged[name][frame, :rows] = self.buffers[name][0, :rows]

    def wait(self, frame: int) -> None:
        """Steps complete inside `launch`: nothing to wait for."""

    def run(self, graph: str, dirty=()) -> None:
        """Execute every launch of `graph` in order on the working buffers (synchronous):
        its whole-program ggml graphs where it has them (same results)."""
        step = self._steps.get(graph)
        if step is not None:
            step()
            return
        for fn, args in self._programs[graph]:
            fn(*args)

    def read_buffer(self, name: str) -> np.ndarray:
        """A copy of buffer `name` (tests, the startup log; bf16 widened to f32)."""
        array = self.buffers[name]
        if array.dtype == np.uint16:  # a bf16 cache plane's bit patterns
            return bf16_bits_to_f32(array)
        return array.copy()

    def write_state(self, name: str, byte_offset: int, values: np.ndarray) -> None:
        """Overwrite elements of persistent buffer `name` starting at `byte_offset`
        (host restoration, e.g. a host-fed pending token). Call with no step in flight."""
        flat = self.buffers[name].reshape(-1)
        start = byte_offset // flat.itemsize
        flat[start:start + len(values)] = values
