"""The cuda backend: executes graph variants as CUDA graphs through the driver API.

Invariant (specification, "Ownership and bootstrap"): everything is allocated, uploaded,
loaded and captured in ``__init__``; a step only writes pinned staging (shared packing),
uploads the physical rows packing reports dirty, and issues ONE ``cuGraphLaunch`` whose
graph holds the staging -> device input copies, every kernel launch and the completion
copy back to pinned host memory. ``counters`` counts driver allocations, module loads and
graph captures; tests check they do not move while serving.

Load order: weights and every other buffer, the kernel modules, then the KV cache sized
from the device memory still free (runtime.cache_sizing), then capture (a graph holds the
cache planes' addresses, so it follows their allocation), then the tuning producers the
selected graphs need run once.

Two execution frames: request inputs and the completion record have one pinned staging
array per frame, and every variant is captured once per frame (its copies read that
frame's staging and write that frame's completion), so the host packs step N + 1 while
step N runs on the one stream; an event per frame marks its completion. Request inputs
are copied whole (the bytes the graph reads) inside the graph every step; persistent
state rows (page tables, histogram rows) have one pinned host mirror and are uploaded,
stream-ordered before the launch, only when packing reports them dirty: the device copy
is the truth between admissions (the sampler counts tokens there).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
from helios_contract import stored_nbytes
from helios_contract.schema import manifest_pb2 as mpb

from ..config import format_bytes
from ..startup import StartupLog
from .cache_sizing import DEVICE_MEMORY, CacheSizing, MemoryAsk, check_fits
from .completion import completion_buffers, confidence_buffers, record_rows
from .cuda import driver as drv
from .errors import RuntimeLoadError
from .tiers import TierRows

STORED_DTYPE = {
    mpb.D_TYPE_F32: np.dtype("<f4"),
    mpb.D_TYPE_BF16: np.dtype("<u2"),
    mpb.D_TYPE_I32: np.dtype("<i4"),
    mpb.D_TYPE_U32: np.dtype("<u4"),
}
ARG_KIND = {mpb.PARAM_KIND_I32: "i32", mpb.PARAM_KIND_F32: "f32"}
MAX_DEFAULT_SHARED = 48 * 1024


def _page_bytes(planes: list[mpb.Buffer]) -> int:
    """Bytes of one page across the paged cache planes, as stored (an e4m3 plane: a byte
    an element)."""
    return sum(stored_nbytes(d, leading=1) for d in planes)


def _scratch_sizes(binary: mpb.KernelBinary, extras: int) -> list[int]:
    """Per-program bytes of each scratch pointer a kernel taking `extras` of them gets
    (global scratch, then profile scratch; 0: a null pointer)."""
    sizes = [int(binary.global_scratch_bytes), int(binary.profile_scratch_bytes)][:extras]
    return sizes + [0] * (extras - len(sizes))


class CudaBackend:
    """Device buffers, loaded kernels and one instantiated CUDA graph per variant.

    Args:
        manifest: the execution manifest (with binaries for this GPU's target).
        read_resource: resource id -> decoded bytes (weights, kernel binaries).
        cache: how the physical KV page count is chosen (default: 0.9 of the device memory
            free once everything else is loaded).
        device: CUDA device ordinal.
        log: startup phases (weights, kernels, cache sizing, graphs) are recorded here.
        tiers: rows of the continuation planes (device memory, allocated with the weights,
            before the paged cache is sized) and of the host-tier planes (pinned host
            memory mapped into the device's address space: the RESTORE programs' kernels
            copy rows to and from it directly; NativeModel.load checks them against the
            host's memory).
        snapshot_option: the option that sized the continuation rows, named if they do
            not fit ("--snapshots 100", "the core's prepared_snapshots 64").

    Attributes:
        cache: the chosen KV capacity (`cache.num_pages` replaces the prepared count).

    Raises:
        RuntimeLoadError: no driver/GPU, no binary for this GPU's target, a weight of the
            wrong size, or device memory too small: before anything is allocated, the
            model's buffers, the kernel scratch, the snapshot rows and (when an option
            fixes its size) the KV cache are checked against the free device memory
            (cache_sizing.check_fits: one line naming the option, the bytes asked and the
            bytes available); the KV cache again once the kernels are loaded.
    """

    name = "cuda"
    frames = 2

    def __init__(self, manifest: mpb.ExecutionManifest, read_resource: Callable[[str], bytes],
                 cache: CacheSizing | None = None, device: int = 0,
                 log: StartupLog | None = None, tiers: TierRows | None = None,
                 snapshot_option: str = "--snapshots"):
        t0 = time.perf_counter()
        log = log if log is not None else StartupLog()
        cu = drv.require_driver()
        self._cu = cu
        self.counters: Counter[str] = Counter()
        self._dev_ptrs: dict[str, int] = {}
        self._dev_bytes: dict[str, int] = {}
        self._pinned: list[dict[str, drv.PinnedArray]] = [{} for _ in range(self.frames)]
        self._host_planes: dict[str, drv.PinnedArray] = {}  # host tier, device-mapped
        self._events: list = []
        self._extra_allocs: list[int] = []
        self._modules: list = []
        self._graphs: dict[str, tuple] = {}
        self._functions: dict[str, tuple] = {}
        self._closed = False
        count = drv.call("cuDeviceGetCount", cu.cuDeviceGetCount())
        if count <= device:
            raise RuntimeLoadError(f"cuda backend: no CUDA GPU (device {device}; {count} found)")
        self._device = drv.call("cuDeviceGet", cu.cuDeviceGet(device))
        major = drv.call("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self._device))
        minor = drv.call("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self._device))
        name = drv.call("cuDeviceGetName", cu.cuDeviceGetName(64, self._device))
        self.device_name = bytes(name).split(b"\0", 1)[0].decode(errors="replace")
        self.target = f"sm_{major}{minor}"
        self._kernels = {k.id: k for k in manifest.kernels}
        self._manifest_graphs = list(manifest.graphs)
        self._check_binaries(manifest)
        self._ctx = drv.call("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(self._device))
        drv.call("cuCtxSetCurrent", cu.cuCtxSetCurrent(self._ctx))
        self._stream = drv.call("cuStreamCreate", cu.cuStreamCreate(
            cu.CUstream_flags.CU_STREAM_NON_BLOCKING.value))
        try:
            self._decls = {b.name: b for b in manifest.buffers}
            self._framed = confidence_buffers(manifest.graphs)
            tiers = tiers or TierRows()
            planes = [b for b in manifest.buffers if b.role == mpb.BUFFER_ROLE_CACHE_PLANE
                      and b.name not in tiers.rows]
            others = [b for b in manifest.buffers if b.role != mpb.BUFFER_ROLE_CACHE_PLANE
                      or (b.name in tiers.rows and b.name not in tiers.host)]
            host = [b for b in manifest.buffers if b.name in tiers.host]
            self._shapes = {b.name: tuple(int(x) for x in b.shape) for b in others + host}
            for b in others + host:
                if b.name in tiers.rows:
                    self._shapes[b.name] = (tiers.rows[b.name], *self._shapes[b.name][1:])
            programs = [*manifest.graphs, *manifest.tuning.producers]
            self._check_memory(others, planes, programs, tiers, cache or CacheSizing(),
                               snapshot_option)
            staged = self._staged_names(manifest)
            with log.phase("weights") as phase:
                for decl in others:
                    self._allocate(decl, read_resource, decl.name in staged)
                for decl in host:
                    self._allocate_host(decl)
                phase.detail = (f"{sum(d.role == mpb.BUFFER_ROLE_WEIGHT for d in others)} "
                                f"tensors, {format_bytes(self.counters['weight_bytes'])} "
                                "uploaded")
            with log.phase("kernels") as phase:
                self._functions = self._load_kernels(read_resource)
                phase.detail = f"{len(self._functions)} kernel modules for {self.target}"
            with log.phase("cache sizing") as phase:
                self.cache = self._size_cache(planes, programs, cache or CacheSizing())
                for decl in planes:
                    self._shapes[decl.name] = (self.cache.num_pages,
                                               *(int(x) for x in decl.shape[1:]))
                    self._allocate(decl, read_resource, decl.name in staged)
                phase.detail = self.cache.describe()
            self._staging = [{n: p.array for n, p in frame.items()} for frame in self._pinned]
            self.buffers = self._staging[0]
            with log.phase("graphs") as phase:
                for g in manifest.graphs:
                    self._graphs[g.name] = self._capture(g)
                for g in manifest.tuning.producers:  # run once at startup: one instance
                    self._graphs[g.name] = self._capture(g, frames=1)
                phase.detail = (f"{len(manifest.graphs)} graphs x {self.frames} frames and "
                                f"{len(manifest.tuning.producers)} tuning producers captured")
            flags = cu.CUevent_flags.CU_EVENT_DISABLE_TIMING.value
            self._events = [drv.call("cuEventCreate", cu.cuEventCreate(flags))
                            for _ in range(self.frames)]
            drv.call("cuStreamSynchronize", cu.cuStreamSynchronize(self._stream))
        except BaseException:
            self.close()
            raise
        self.load_seconds = time.perf_counter() - t0

    # ----------------------------------------------------------------------------- load

    def _check_binaries(self, manifest: mpb.ExecutionManifest) -> None:
        missing = [k.id for k in manifest.kernels
                   if not any(b.target == self.target for b in k.binaries)]
        if missing:
            have = ", ".join(manifest.targets) or "none"
            raise RuntimeLoadError(
                f"cuda backend: the core has no kernel binaries for this GPU's target "
                f"{self.target} ({self.device_name}); core targets: {have}; "
                f"{len(missing)} kernels lack it (e.g. {missing[0]}). Re-export with "
                f"`ignition export ... --target {self.target}`")

    def _nbytes(self, decl: mpb.Buffer) -> int:
        if decl.HasField("storage"):  # a quantized weight or e4m3 plane: codes as stored
            return stored_nbytes(decl, leading=self._shapes[decl.name][0])
        return math.prod(self._shapes[decl.name]) * STORED_DTYPE[decl.dtype].itemsize

    def _check_memory(self, others: list[mpb.Buffer], planes: list[mpb.Buffer],
                      programs: list[mpb.GraphProgram], tiers: TierRows, cache: CacheSizing,
                      snapshot_option: str) -> None:
        """Before anything is allocated, `_device_asks` must fit in the free device memory."""
        asks = self._device_asks(others, planes, programs, tiers, cache, snapshot_option)
        free, _ = drv.call("cuMemGetInfo", self._cu.cuMemGetInfo())
        check_fits(asks, memory=DEVICE_MEMORY, available=free)

    def _device_asks(self, others: list[mpb.Buffer], planes: list[mpb.Buffer],
                     programs: list[mpb.GraphProgram], tiers: TierRows, cache: CacheSizing,
                     snapshot_option: str) -> list[MemoryAsk]:
        """What startup allocates in device memory, in the order check_fits counts it: the
        model's buffers (`others` but the continuation planes), the kernel scratch, the
        snapshot rows, then the KV cache (`planes`) when an option fixes its size (a
        fraction is of what is left once loaded: `_size_cache`).

        Raises:
            RuntimeLoadError: a buffer dtype the backend does not store.
            CacheSizingError: a --kv-cache-memory that holds no page.
        """
        for decl in [*others, *planes]:
            if decl.dtype not in STORED_DTYPE:
                raise RuntimeLoadError(f"buffer {decl.name}: dtype {mpb.DType.Name(decl.dtype)} "
                                       "is not supported by the cuda backend")
        snapshots = [d for d in others if d.name in tiers.rows and d.name not in tiers.window]
        window = [d for d in others if d.name in tiers.window]
        model = sum(self._nbytes(d) for d in others if d.name not in tiers.rows)
        rows = tiers.rows[snapshots[0].name] if snapshots else 0
        asks = [MemoryAsk("the core", "the model", model, "weights and other buffers"),
                MemoryAsk("the core", "kernel scratch", self._scratch_nbytes(programs)),
                MemoryAsk(snapshot_option, "snapshot storage",
                          sum(self._nbytes(d) for d in snapshots), f"{rows} rows"),
                *([MemoryAsk("the core", "sliding-window pages",
                             sum(self._nbytes(d) for d in window),
                             f"{tiers.rows[window[0].name]} pages")] if window else []),
                cache.fixed_ask(backend="cuda", page_bytes=max(_page_bytes(planes), 1),
                                prepared_pages=int(planes[0].shape[0]) if planes else 0)]
        return [a for a in asks if a is not None]

    def _scratch_nbytes(self, programs: list[mpb.GraphProgram]) -> int:
        """Kernel scratch (global/profile) the launches of `programs` will allocate at
        capture (before the kernels are loaded: each binary's both kinds, as Triton
        >= 3.6 binaries take both pointers)."""
        total = 0
        for g in programs:
            for launch in g.launches:
                kernel = self._kernels[launch.kernel]
                binary = next(b for b in kernel.binaries if b.target == self.target)
                extras = self._functions[launch.kernel][2] if self._functions else 2
                total += sum(_scratch_sizes(binary, extras)) * math.prod(
                    int(x) for x in launch.grid)
        return total

    def _size_cache(self, planes: list[mpb.Buffer], programs: list[mpb.GraphProgram],
                    cache: CacheSizing):
        """Choose the page count from the device memory free now (after the buffers and
        the kernels), less the kernel scratch capture will allocate.

        Raises:
            CacheSizingError: the budget holds no page, or the chosen pages do not fit.
        """
        free, _ = drv.call("cuMemGetInfo", self._cu.cuMemGetInfo())
        scratch = MemoryAsk("the core", "kernel scratch", self._scratch_nbytes(programs))
        return cache.choose(backend="cuda", page_bytes=max(_page_bytes(planes), 1),
                            prepared_pages=int(planes[0].shape[0]) if planes else 0,
                            free_bytes=free, reserved=[scratch])

    @property
    def num_pages(self) -> int:
        """Physical pages backing each cache plane."""
        return self.cache.num_pages

    def run_producers(self, names: list[str]) -> None:
        """Launch tuning producers `names` once, in order, and wait for them."""
        for name in names:
            drv.call(f"tuning producer {name}",
                     self._cu.cuGraphLaunch(self._graphs[name][1][0], self._stream))
            self.counters["graph_launches"] += 1
        self.synchronize()

    @staticmethod
    def _staged_names(manifest: mpb.ExecutionManifest) -> set[str]:
        names = {t.destination for g in manifest.graphs for t in g.transports}
        names |= {n for g in manifest.graphs for n in completion_buffers(g.completion)}
        return names | confidence_buffers(manifest.graphs)

    def _allocate(self, decl: mpb.Buffer, read_resource, staged: bool) -> None:
        cu = self._cu
        nbytes = self._nbytes(decl)
        try:
            ptr = int(drv.call("cuMemAlloc", cu.cuMemAlloc(max(nbytes, 256))))
        except drv.CudaError as exc:
            what = (f"the KV cache plane {decl.name} ({self._shapes[decl.name][0]} pages)"
                    if decl.role == mpb.BUFFER_ROLE_CACHE_PLANE else f"buffer {decl.name}")
            raise RuntimeLoadError(f"cuda backend: device out of memory allocating {what}: "
                                   f"{format_bytes(nbytes)} did not fit ({exc.code})") from None
        self.counters["device_allocations"] += 1
        self._dev_ptrs[decl.name] = ptr
        self._dev_bytes[decl.name] = nbytes
        if decl.role == mpb.BUFFER_ROLE_WEIGHT:
            data = read_resource(decl.weight_resource_id)
            if len(data) != nbytes:
                raise RuntimeLoadError(f"weight {decl.name}: resource {decl.weight_resource_id} "
                                       f"holds {len(data)} bytes, the buffer needs {nbytes}")
            host = np.frombuffer(data, dtype=np.uint8)
            drv.call(f"upload {decl.name}", cu.cuMemcpyHtoD(ptr, host.ctypes.data, nbytes))
            self.counters["weight_bytes"] += nbytes
        else:
            drv.call("cuMemsetD8", cu.cuMemsetD8(ptr, 0, max(nbytes, 256)))
        if staged:
            dtype = np.float32 if decl.dtype == mpb.D_TYPE_BF16 else STORED_DTYPE[decl.dtype]
            # (the framed confidence record is one host array: plane f = frame f)
            per_frame = decl.role in (mpb.BUFFER_ROLE_REQUEST_INPUT, mpb.BUFFER_ROLE_OUTPUT) \
                and decl.name not in self._framed
            shared = None
            for frame in self._pinned:  # one array per frame; one shared state mirror
                if per_frame or shared is None:
                    shared = drv.PinnedArray(self._shapes[decl.name], dtype)
                    self.counters["host_allocations"] += 1
                frame[decl.name] = shared

    def _allocate_host(self, decl: mpb.Buffer) -> None:
        """A host-tier plane: pinned host memory, mapped for the kernels (zeroed)."""
        if decl.dtype not in STORED_DTYPE:
            raise RuntimeLoadError(f"buffer {decl.name}: dtype {mpb.DType.Name(decl.dtype)} "
                                   "is not supported by the cuda backend")
        try:
            pinned = drv.PinnedArray(self._shapes[decl.name], np.uint8 if decl.HasField(
                "storage") else STORED_DTYPE[decl.dtype], mapped=True)  # e4m3: a byte each
        except drv.CudaError as exc:
            raise RuntimeLoadError(f"cuda backend: pinned host memory for the host tier plane "
                                   f"{decl.name} ({self._shapes[decl.name][0]} rows, "
                                   f"{format_bytes(self._nbytes(decl))}) could not be allocated "
                                   f"({exc.code}); lower --host-cache-bytes") from None
        self.counters["host_allocations"] += 1
        self._host_planes[decl.name] = pinned
        self._dev_ptrs[decl.name] = pinned.device_ptr
        self._dev_bytes[decl.name] = self._nbytes(decl)

    @property
    def host_tier_bytes(self) -> int:
        """Pinned host memory backing the host tier's planes."""
        return sum(p.nbytes for p in self._host_planes.values())

    def _load_kernels(self, read_resource) -> dict[str, tuple]:
        cu = self._cu
        functions = {}
        for kid, kernel in self._kernels.items():
            binary = next(b for b in kernel.binaries if b.target == self.target)
            blob = read_resource(binary.resource_id)
            module = drv.call(f"cuModuleLoadData {kid}", cu.cuModuleLoadData(blob))
            self._modules.append(module)
            self.counters["module_loads"] += 1
            fn = drv.call(f"cuModuleGetFunction {kid}",
                          cu.cuModuleGetFunction(module, binary.entry_name.encode()))
            if binary.shared_bytes > MAX_DEFAULT_SHARED:
                drv.call("cuFuncSetAttribute", cu.cuFuncSetAttribute(
                    fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    binary.shared_bytes))
            extras = drv.param_count(fn) - len(kernel.params)
            if extras < 0:
                raise RuntimeLoadError(f"kernel {kid}: binary takes fewer parameters than the "
                                       "manifest declares")
            functions[kid] = (fn, binary, extras)
        return functions

    def _launch_args(self, launch: mpb.Launch) -> drv.KernelArgs:
        # Argument counts (manifest rule launch.args) and 16-byte alignment (capability
        # runtime.alignment, helios_tools.capabilities.CUDA) were checked at load.
        fn, binary, extras = self._functions[launch.kernel]
        values: list[tuple[str, int | float]] = []
        for arg in launch.args:
            which = arg.WhichOneof("value")
            if which == "buffer":
                values.append(("ptr", self._dev_ptrs[arg.buffer.buffer]
                               + int(arg.buffer.byte_offset)))
            elif which == "int_value":
                values.append(("i32", int(arg.int_value)))
            else:
                values.append(("f32", float(arg.float_value)))
        scratch = _scratch_sizes(binary, extras)
        programs = math.prod(int(x) for x in launch.grid)
        for per_program in scratch:
            if per_program:
                ptr = int(drv.call("cuMemAlloc", self._cu.cuMemAlloc(per_program * programs)))
                self._extra_allocs.append(ptr)
                self.counters["device_allocations"] += 1
                values.append(("ptr", ptr))
            else:
                values.append(("ptr", 0))
        return drv.KernelArgs(values)

    def _input_copies(self, g: mpb.GraphProgram) -> list[tuple[str, int]]:
        """(buffer, bytes) of the request inputs the graph reads, copied every step."""
        used: dict[str, int] = {}
        for launch in g.launches:
            for arg in launch.args:
                if arg.WhichOneof("value") == "buffer":
                    v = arg.buffer
                    decl = self._decls[v.buffer]
                    end = int(v.byte_offset) + math.prod(int(s) for s in v.shape) * \
                        STORED_DTYPE[decl.dtype].itemsize
                    used[v.buffer] = max(used.get(v.buffer, 0), end)
        copies = []
        for t in g.transports:
            decl = self._decls[t.destination]
            if decl.role != mpb.BUFFER_ROLE_REQUEST_INPUT or t.destination not in self._pinned[0]:
                continue
            n = min(used.get(t.destination, int(t.nbytes)), self._dev_bytes[t.destination])
            copies.append((t.destination, n))
        return copies

    def _capture(self, g: mpb.GraphProgram, frames: int | None = None) -> tuple:
        """Instantiate `g` once per execution frame (or `frames` times); returns (graphs,
        execs, launch args)."""
        keep = [self._launch_args(launch) for launch in g.launches]  # allocs before capture
        graphs, execs = [], []
        for frame in range(self.frames if frames is None else frames):
            graph, exe = self._capture_frame(g, frame, keep)
            graphs.append(graph)
            execs.append(exe)
        return graphs, execs, keep

    def _capture_frame(self, g: mpb.GraphProgram, frame: int, keep: list) -> tuple:
        cu = self._cu
        s = self._stream
        pinned = self._pinned[frame]
        drv.call("cuStreamBeginCapture", cu.cuStreamBeginCapture(
            s, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        try:
            for name, n in self._input_copies(g):
                drv.call(f"capture copy {name}", cu.cuMemcpyHtoDAsync(
                    self._dev_ptrs[name], pinned[name].ptr, n, s))
            for launch, args in zip(g.launches, keep, strict=True):
                fn, binary, _ = self._functions[launch.kernel]
                grid = list(launch.grid) + [1] * (3 - len(launch.grid))
                block = 32 * binary.num_warps
                drv.call(f"capture launch {launch.kernel}", cu.cuLaunchKernel(
                    fn, grid[0], grid[1], grid[2], block, 1, 1, binary.shared_bytes, s,
                    args.address, 0))
            rows = int(g.completion.rows)
            for done in completion_buffers(g.completion):  # the record's leading rows
                decl = self._decls[done]
                copied = record_rows(g, done)  # a scores record: the packed tokens
                if g.completion.HasField("speculative"):  # one [6 + W] lane record per row
                    per_row = 6 + g.completion.speculative.token_width
                else:
                    per_row = math.prod(int(d) for d in decl.shape[1:])
                n = copied * per_row * STORED_DTYPE[decl.dtype].itemsize
                drv.call("capture completion copy", cu.cuMemcpyDtoHAsync(
                    pinned[done].ptr, self._dev_ptrs[done], n, s))
            framed = g.completion.confidence_buffer
            if framed:  # the launches' plane-0 rows -> plane `frame` of the host record
                shape = self._shapes[framed]
                plane = math.prod(int(d) for d in shape[1:]) * 4
                n = rows * int(shape[2]) * 4
                drv.call("capture confidence copy", cu.cuMemcpyDtoHAsync(
                    pinned[framed].ptr + frame * plane, self._dev_ptrs[framed], n, s))
        finally:
            graph = drv.call("cuStreamEndCapture", cu.cuStreamEndCapture(s))
        exe = drv.call(f"cuGraphInstantiate {g.name}", cu.cuGraphInstantiate(graph, 0))
        self.counters["graph_captures"] += 1
        return graph, exe

    # ---------------------------------------------------------------------------- serve

    def staging(self, frame: int) -> dict[str, np.ndarray]:
        """Pinned host arrays packing writes for `frame`: that frame's request inputs and
        completion record, and the shared mirror of persistent state rows."""
        return self._staging[frame]

    def launch(self, graph: str, frame: int, dirty=()) -> None:
        """Enqueue the dirty physical-row uploads and ONE launch of `graph`'s `frame`
        instance, then record the frame's event. Does not wait."""
        cu = self._cu
        s = self._stream
        for d in dirty:
            host = self._staging[frame][d.destination]
            item = host.itemsize
            row_bytes = host.strides[0] if host.ndim > 1 else item
            offset = d.row * row_bytes + d.start * item
            cu.cuMemcpyHtoDAsync(self._dev_ptrs[d.destination] + offset,
                                 host.ctypes.data + offset, (d.end - d.start) * item, s)
        err = cu.cuGraphLaunch(self._graphs[graph][1][frame], s)[0]
        if err != cu.CUresult.CUDA_SUCCESS:
            raise drv.CudaError(f"cuGraphLaunch {graph}", err.name)
        err = cu.cuEventRecord(self._events[frame], s)[0]
        if err != cu.CUresult.CUDA_SUCCESS:
            raise drv.CudaError(f"cuEventRecord {graph}", err.name)
        self.counters["graph_launches"] += 1

    def wait(self, frame: int) -> None:
        """Block until `frame`'s step (and its completion copy) finished."""
        err = self._cu.cuEventSynchronize(self._events[frame])[0]
        if err != self._cu.CUresult.CUDA_SUCCESS:
            raise drv.CudaError(f"step in frame {frame}", err.name)

    def run(self, graph: str, dirty=()) -> None:
        """Launch `graph` in frame 0 and wait for it."""
        self.launch(graph, 0, dirty)
        self.wait(0)

    def write_state(self, name: str, byte_offset: int, values: np.ndarray) -> None:
        """Overwrite bytes of device buffer `name` from `values` (host restoration, e.g. a
        host-fed pending token). Synchronous; call with no step in flight."""
        data = np.ascontiguousarray(values)
        if byte_offset < 0 or byte_offset + data.nbytes > self._dev_bytes[name]:
            raise ValueError(f"{name}: bytes [{byte_offset}, {byte_offset + data.nbytes}) "
                             f"outside its {self._dev_bytes[name]} bytes")
        drv.call("cuMemcpyHtoDAsync", self._cu.cuMemcpyHtoDAsync(
            self._dev_ptrs[name] + byte_offset, data.ctypes.data, data.nbytes, self._stream))
        self.synchronize()

    def launch_only(self, graph: str, frame: int = 0) -> None:
        """Enqueue `graph` without waiting (benchmarks pair it with ``synchronize``)."""
        drv.call("cuGraphLaunch", self._cu.cuGraphLaunch(self._graphs[graph][1][frame],
                                                         self._stream))

    def synchronize(self) -> None:
        drv.call("cuStreamSynchronize", self._cu.cuStreamSynchronize(self._stream))

    # ---------------------------------------------------------------------------- tests

    def read_buffer(self, name: str) -> np.ndarray:
        """Copy device buffer `name` to a new host array (tests; bf16 widened to f32). A
        buffer with storage comes back as its stored bytes (uint8): an e4m3 cache plane in
        its shape (one code an element), a quantized weight flat."""
        decl = self._decls[name]
        if decl.HasField("storage"):  # codes as stored: _nbytes, not shape x dtype
            out = np.empty(self._dev_bytes[name], np.uint8)
            drv.call("cuMemcpyDtoH", self._cu.cuMemcpyDtoH(out.ctypes.data,
                                                            self._dev_ptrs[name], out.nbytes))
            shape = self._shapes[name]
            return out.reshape(shape) if out.size == math.prod(shape) else out
        stored = STORED_DTYPE[decl.dtype]
        out = np.empty(self._shapes[name], stored)
        drv.call("cuMemcpyDtoH", self._cu.cuMemcpyDtoH(out.ctypes.data, self._dev_ptrs[name],
                                                        out.nbytes))
        if decl.dtype == mpb.D_TYPE_BF16:
            return (out.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return out

    def write_buffer(self, name: str, array: np.ndarray) -> None:
        """Overwrite device buffer `name` from a host array of its stored dtype (tests)."""
        decl = self._decls[name]
        data = np.ascontiguousarray(array, dtype=STORED_DTYPE[decl.dtype])
        if data.nbytes != self._dev_bytes[name]:
            raise ValueError(f"{name}: {data.nbytes} bytes given, buffer holds "
                             f"{self._dev_bytes[name]}")
        drv.call("cuMemcpyHtoD", self._cu.cuMemcpyHtoD(self._dev_ptrs[name], data.ctypes.data,
                                                        data.nbytes))

    @property
    def device_bytes(self) -> int:
        return sum(self._dev_bytes.values())

    def close(self) -> None:
        """Free graphs, modules and memory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        cu = self._cu
        if getattr(self, "_stream", None) is not None:
            cu.cuStreamSynchronize(self._stream)  # no graph may run while it is destroyed
        for graphs, execs, _ in self._graphs.values():
            for graph, exe in zip(graphs, execs, strict=True):
                cu.cuGraphExecDestroy(exe)
                cu.cuGraphDestroy(graph)
        self._graphs.clear()
        for event in self._events:
            cu.cuEventDestroy(event)
        self._events = []
        for m in self._modules:
            cu.cuModuleUnload(m)
        for name, ptr in list(self._dev_ptrs.items()):
            if name not in self._host_planes:
                cu.cuMemFree(ptr)
        for ptr in self._extra_allocs:
            cu.cuMemFree(ptr)
        self._dev_ptrs.clear()
        for p in self._host_planes.values():
            p.free()
        self._host_planes.clear()
        freed = set()
        for frame in self._pinned:
            for p in frame.values():
                if id(p) not in freed:
                    freed.add(id(p))
                    p.free()
        if getattr(self, "_stream", None) is not None:
            cu.cuStreamDestroy(self._stream)
            self._stream = None
        if getattr(self, "_ctx", None) is not None:
            cu.cuDevicePrimaryCtxRelease(self._device)
            self._ctx = None
