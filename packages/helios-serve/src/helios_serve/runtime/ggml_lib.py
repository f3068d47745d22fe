"""ggml, the cpu backend's kernel library for quantized weights (docs/cpu-kernels.md says
why ggml: measured against onnxruntime by bench/cpu_kernel_lib.py).

The shared libraries come from the prebuilt ``libggml-python`` wheel (no compiler on the
machine); this module binds the few functions the backend uses through ctypes. A launch
whose weight is stored as GGUF blocks becomes one small ggml graph, built once at load
over the backend's own NumPy buffers (tensors point into them: no copy in or out) and
computed per step with a persistent thread pool; intermediates share one arena (the
graphs run one at a time), as do the graphs' work buffers. Graphs of at least
POOL_MIN_MACS run on the whole pool, smaller ones on the calling thread.

Quantized forms (each the same math as its NumPy reference op in helios_tools.kernels,
with the weight decoded by ggml's block kernels): ``linear``, ``linear_add``,
``rmsnorm_linear``, ``swiglu_linear``, ``swiglu_linear_add`` and ``embedding``.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
from helios_contract.schema import manifest_pb2 as mpb
from helios_tools.capabilities import CPU_STORAGE_OPS

from .errors import RuntimeLoadError

GGML_F32, GGML_I32 = 0, 26
# StorageType -> ggml_type (ggml.h): the GGUF block layouts are ggml's own.
GGML_TYPE = {
    mpb.STORAGE_TYPE_GGUF_Q4_0: 2,
    mpb.STORAGE_TYPE_GGUF_Q4_1: 3,
    mpb.STORAGE_TYPE_GGUF_Q5_0: 6,
    mpb.STORAGE_TYPE_GGUF_Q8_0: 8,
    mpb.STORAGE_TYPE_GGUF_Q4_K: 12,
    mpb.STORAGE_TYPE_GGUF_Q6_K: 14,
}
# The ops with a quantized form here: the cpu capability table's (lint reads the same).
QUANTIZED_OPS = CPU_STORAGE_OPS
_ALIGN = 64
# Multiply-accumulates from which a graph is computed by the whole pool; smaller ones
# (a decode step's projections: 0.1-7 M) run on the calling thread alone. Waking a pool
# costs little on a quiet machine, but where its other thread is descheduled every
# call waits a scheduler quantum (measured: 40 ms against 41 us for 1536x576 at one row,
# two threads on a shared 2-core machine); 16 M is about a millisecond of one core's work.
POOL_MIN_MACS = 16 << 20
# Tensors a launch graph holds at most (inputs, views, ops): the graphs are tiny.
_GRAPH_NODES = 32
_TENSOR_SLOTS = 16
SIMD_FEATURES = ("avx", "avx2", "avx_vnni", "fma", "f16c", "avx512", "avx512_vnni",
                 "avx512_bf16", "amx_int8")


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


class _PoolParams(ctypes.Structure):  # struct ggml_threadpool_params (ggml.h)
    _fields_ = [("cpumask", ctypes.c_bool * 512),  # GGML_MAX_N_THREADS
                ("n_threads", ctypes.c_int), ("prio", ctypes.c_int),
                ("poll", ctypes.c_uint32), ("strict_cpu", ctypes.c_bool),
                ("paused", ctypes.c_bool)]


# The pool's polling level after a graph: 0, its threads sleep on a condition variable
# at once. ggml's default (50) spins each idle thread through 1024 * 128 * 50 pause
# instructions (tens of ms) after every graph compute; a server's host work (sampling,
# the scheduler, HTTP, detokenizing) then runs against spinning threads on the same
# cores. Between nodes of one graph the threads still spin at ggml's barrier; waking a
# sleeping pool costs once per graph compute (docs/cpu-kernels.md, Threads).
POOL_POLL = 0


class _CPlan(ctypes.Structure):  # struct ggml_cplan (ggml-cpu.h)
    _fields_ = [("work_size", ctypes.c_size_t), ("work_data", ctypes.c_void_p),
                ("n_threads", ctypes.c_int), ("threadpool", ctypes.c_void_p),
                ("abort_callback", ctypes.c_void_p), ("abort_callback_data", ctypes.c_void_p),
                ("use_ref", ctypes.c_bool)]


_LIBS: tuple[ctypes.CDLL, ctypes.CDLL] | None = None


def libraries() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """(libggml-base, libggml-cpu) of the libggml-python wheel, loaded once per process.

    Raises:
        RuntimeLoadError: the wheel's libraries are missing or do not load.
    """
    global _LIBS
    if _LIBS is not None:
        return _LIBS
    lib = _library_folder()
    try:
        base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise RuntimeLoadError(f"cannot load ggml from {lib}: {e}") from e
    vp, i64, i32, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
    sig = {
        (base, "ggml_init"): ([_InitParams], vp),
        (base, "ggml_free"): ([vp], None),
        (base, "ggml_new_tensor_1d"): ([vp, i32, i64], vp),
        (base, "ggml_new_tensor_2d"): ([vp, i32, i64, i64], vp),
        (base, "ggml_view_2d"): ([vp, vp, i64, i64, sz, sz], vp),
        (base, "ggml_mul_mat"): ([vp, vp, vp], vp),
        (base, "ggml_add_inplace"): ([vp, vp, vp], vp),
        (base, "ggml_mul"): ([vp, vp, vp], vp),
        (base, "ggml_rms_norm"): ([vp, vp, ctypes.c_float], vp),
        (base, "ggml_swiglu"): ([vp, vp], vp),
        (base, "ggml_get_rows"): ([vp, vp, vp], vp),
        (base, "ggml_cpy"): ([vp, vp, vp], vp),
        (base, "ggml_cont"): ([vp, vp], vp),
        (base, "ggml_nbytes"): ([vp], sz),
        (base, "ggml_get_data"): ([vp], vp),
        (base, "ggml_new_graph_custom"): ([vp, sz, ctypes.c_bool], vp),
        (base, "ggml_build_forward_expand"): ([vp, vp], None),
        (base, "ggml_graph_overhead_custom"): ([sz, ctypes.c_bool], sz),
        (base, "ggml_tensor_overhead"): ([], sz),
        (base, "ggml_threadpool_params_init"): ([vp, i32], None),
        (base, "ggml_backend_cpu_buffer_from_ptr"): ([vp, sz], vp),
        (base, "ggml_backend_tensor_alloc"): ([vp, vp, vp], i32),
        (base, "ggml_backend_buffer_free"): ([vp], None),
        (cpu, "ggml_threadpool_new"): ([vp], vp),
        (cpu, "ggml_threadpool_free"): ([vp], None),
        (cpu, "ggml_graph_plan"): ([vp, i32, vp], _CPlan),
        (cpu, "ggml_graph_compute"): ([vp, ctypes.POINTER(_CPlan)], i32),
    }
    for (so, name), (args, res) in sig.items():
        fn = getattr(so, name)
        fn.argtypes, fn.restype = args, res
    _LIBS = (base, cpu)
    return _LIBS


def _library_folder() -> Path:
    """HELIOS_GGML_LIB (a folder holding libggml-base.so and libggml-cpu.so, e.g. a
    native llama.cpp build's, for its SIMD: bench/cpu_peer.py's kernel comparison), else
    the libggml-python wheel's.

    Raises:
        RuntimeLoadError: the folder lacks the libraries, or the wheel is missing.
    """
    override = os.environ.get("HELIOS_GGML_LIB")
    if override:
        folder = Path(override)
        if not (folder / "libggml-cpu.so").is_file():
            raise RuntimeLoadError(f"HELIOS_GGML_LIB={override!r}: no libggml-cpu.so there")
        return folder
    try:
        import libggml  # imported here: only cores with quantized weights need it
    except ImportError as e:
        raise RuntimeLoadError(f"quantized weights need the libggml-python package: {e}") from e
    return Path(libggml.__file__).parent / "lib64"


def library_folder() -> str:
    """Where the loaded ggml libraries come from (for reports)."""
    return str(_library_folder())


def simd_features() -> dict[str, bool]:
    """The instruction sets ggml's CPU library was compiled with (ggml_cpu_has_*)."""
    _, cpu = libraries()
    out = {}
    for name in SIMD_FEATURES:
        fn = getattr(cpu, f"ggml_cpu_has_{name}", None)
        if fn is not None:
            fn.restype = ctypes.c_int
            out[name] = bool(fn())
    return out


def default_threads() -> int:
    """Threads of the pool: HELIOS_CPU_THREADS when set (a positive integer), else the
    cores this process may run on.

    Raises:
        RuntimeLoadError: HELIOS_CPU_THREADS is not a positive integer.
    """
    text = os.environ.get("HELIOS_CPU_THREADS")
    if text is not None:
        if not text.strip().isdigit() or int(text) < 1:
            raise RuntimeLoadError(f"HELIOS_CPU_THREADS={text!r}: not a positive integer")
        return int(text)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class _Graph:
    """One launch's graph while it is built: its tensors needing memory, then its plan."""

    def __init__(self, programs: GgmlPrograms):
        self.p = programs
        self.scratch: list[tuple[int, int]] = []  # (tensor, bytes) placed in the arena
        self.graph = None
        self.macs = 0  # multiply-accumulates of its products (picks its thread count)

    def bind(self, array: np.ndarray, ggml_type: int, ne0: int, ne1: int,
             row_elements: int | None = None) -> int:
        """A 2-D tensor [ne1 rows, ne0 elements] over `array`'s memory whose rows are
        `row_elements` apart (default ne0): the array is not copied, the graph reads and
        writes it."""
        base, _ = self.p.libs
        full = row_elements or ne0
        if self.p.row_bytes(ggml_type, full) * ne1 > array.nbytes:
            raise RuntimeLoadError(f"ggml tensor of {ne1}x{full} over an array of "
                                   f"{array.nbytes} bytes")
        t = base.ggml_new_tensor_2d(self.p.ctx, ggml_type, full, ne1)
        self.p.attach(t, array, 0)
        if full == ne0:
            return t
        return base.ggml_view_2d(self.p.ctx, t, ne0, ne1,
                                 self.p.row_bytes(ggml_type, full), 0)

    def op(self, tensor: int) -> int:
        """An op's result: memory from the shared arena."""
        base, _ = self.p.libs
        self.scratch.append((tensor, base.ggml_nbytes(tensor)))
        return tensor

    def finish(self, result: int) -> None:
        base, _ = self.p.libs
        self.graph = base.ggml_new_graph_custom(self.p.ctx, _GRAPH_NODES, False)
        base.ggml_build_forward_expand(self.graph, result)


class GgmlPrograms:
    """Launches over quantized weights as ggml graphs built once at load.

    Use: ``form(op, args)`` for each such launch while binding (returns the step's
    callable), then ``seal()`` once every launch is bound (places intermediates and work
    buffers, computes the plans); calls made before ``seal`` raise.

    Args:
        storage: quantized weight buffer name -> its TensorStorage.
        threads: the pool's threads (default: the cores this process may run on).
    """

    def __init__(self, storage: dict[str, mpb.TensorStorage], threads: int | None = None):
        self.libs = libraries()
        base, cpu = self.libs
        self.storage = storage
        self.threads = threads or default_threads()
        self._graphs: list[_Graph] = []
        self._buffers: list[int] = []
        self._meta_size = 1 << 16
        self.ctx = None
        self._ctx_for(0)
        params = _PoolParams()
        base.ggml_threadpool_params_init(ctypes.byref(params), self.threads)
        if params.n_threads != self.threads:  # the struct is not this library's
            raise RuntimeLoadError("ggml_threadpool_params: unexpected layout")
        params.poll = POOL_POLL
        self.pool = cpu.ggml_threadpool_new(ctypes.byref(params))
        self._arena = np.zeros(0, np.uint8)
        self._work = np.zeros(0, np.uint8)
        self.sealed = False

    def _ctx_for(self, graphs: int) -> None:
        """A metadata context (no tensor data) with room for `graphs` more graphs."""
        base, _ = self.libs
        size = graphs * (base.ggml_graph_overhead_custom(_GRAPH_NODES, False)
                         + _TENSOR_SLOTS * base.ggml_tensor_overhead())
        self._contexts = getattr(self, "_contexts", [])
        self.ctx = base.ggml_init(_InitParams(max(size, 1 << 20), None, True))
        self._contexts.append(self.ctx)
        self._room = max(graphs, 1)

    def row_bytes(self, ggml_type: int, ne0: int) -> int:
        """Bytes of one row of `ne0` elements."""
        if ggml_type in (GGML_F32, GGML_I32):
            return 4 * ne0
        st = next(s for s in self.storage.values() if GGML_TYPE[s.type] == ggml_type)
        return ne0 // st.block_elements * st.block_bytes

    def attach(self, tensor: int, array: np.ndarray, offset: int) -> None:
        """Point `tensor` at `array`'s memory + `offset` bytes."""
        base, _ = self.libs
        ptr = array.ctypes.data
        # ggml wants the buffer's base 32-byte aligned; a NumPy view may start anywhere.
        # The buffer only names a range (nothing clears or frees it), so its base is
        # rounded down; the tensor still starts at the array.
        start = ptr - ptr % 32
        buf = base.ggml_backend_cpu_buffer_from_ptr(start, ptr - start + array.nbytes)
        self._buffers.append(buf)
        if base.ggml_backend_tensor_alloc(buf, tensor, ptr + offset) != 0:
            raise RuntimeLoadError("ggml could not place a tensor in a backend buffer")

    def _new(self) -> _Graph:
        if self.sealed:
            raise RuntimeLoadError("ggml programs are sealed: no launch can be added")
        if self._room == 0:
            self._ctx_for(64)
        self._room -= 1
        g = _Graph(self)
        self._graphs.append(g)
        return g

    def _weight(self, g: _Graph, name: str, w: np.ndarray, n: int, k: int) -> int:
        st = self.storage[name]
        if k % st.block_elements:
            raise RuntimeLoadError(f"weight {name}: {k} columns are not whole blocks")
        return g.bind(w, GGML_TYPE[st.type], k, n)

    def _f32(self, g: _Graph, a: np.ndarray, rows: int, cols: int) -> int:
        """a[:rows, :cols] of a 2-D f32 array."""
        if a.dtype != np.float32 or a.ndim != 2 or a.shape[0] < rows or a.shape[1] < cols:
            raise RuntimeLoadError(f"ggml form: a {a.dtype} array {a.shape} cannot hold "
                                   f"{rows}x{cols} f32")
        if not a.flags.c_contiguous:
            raise RuntimeLoadError(f"ggml form: a strided array {a.shape}")
        return g.bind(a, GGML_F32, cols, rows, row_elements=a.shape[1])

    def _store(self, g: _Graph, y: int, out: np.ndarray, rows: int, cols: int,
               add: bool) -> int:
        """out[:rows, :cols] = y (or += y)."""
        base, _ = self.libs
        dst = self._f32(g, out, rows, cols)
        if add:
            return base.ggml_add_inplace(self.ctx, dst, y)
        return base.ggml_cpy(self.ctx, y, dst)

    def form(self, op: str, names: list[str | None], args: tuple) -> Callable[[], None]:
        """The step callable of launch `op(*args)`; `names[i]` is the buffer argument i
        views (None for scalars).

        Raises:
            RuntimeLoadError: `op` has no quantized form, or its arrays do not fit one.
        """
        base, cpu = self.libs
        if op not in QUANTIZED_OPS:
            raise RuntimeLoadError(f"reference op {op!r} has no quantized form on the cpu "
                                   f"backend (it has {', '.join(sorted(QUANTIZED_OPS))})")
        g = self._new()
        ctx = self.ctx
        pre: Callable[[], None] | None = None
        if op in ("linear", "linear_add"):
            x, w, out, T, N, K = args
            g.macs = T * N * K
            y = g.op(base.ggml_mul_mat(ctx, self._weight(g, names[1], w, N, K),
                                       self._f32(g, x, T, K)))
            result = self._store(g, y, out, T, N, add=op == "linear_add")
        elif op == "rmsnorm_linear":
            x, gain, w, out, T, N, K, eps = args
            g.macs = T * N * K
            h = g.op(base.ggml_rms_norm(ctx, self._f32(g, x, T, K), float(eps)))
            gw = self._f32(g, gain.reshape(1, -1), 1, K)
            h = g.op(base.ggml_mul(ctx, h, gw))
            y = g.op(base.ggml_mul_mat(ctx, self._weight(g, names[2], w, N, K), h))
            result = self._store(g, y, out, T, N, add=False)
        elif op in ("swiglu_linear", "swiglu_linear_add"):
            x, w, out, T, N, K = args
            g.macs = T * N * K
            act = g.op(base.ggml_swiglu(ctx, self._f32(g, x, T, 2 * K)))
            y = g.op(base.ggml_mul_mat(ctx, self._weight(g, names[1], w, N, K), act))
            result = self._store(g, y, out, T, N, add=op == "swiglu_linear_add")
        else:  # embedding: padding and out-of-range ids read row 0, as the reference
            ids, table, out, T, D = args
            vocab = table.shape[0]
            safe = np.zeros(max(T, 1), np.int32)
            src = ids[:T]

            def pre() -> None:
                np.copyto(safe[:T], src)
                safe[(safe < 0) | (safe >= vocab)] = 0

            rows_t = base.ggml_new_tensor_1d(ctx, GGML_I32, T)
            self.attach(rows_t, safe, 0)
            y = g.op(base.ggml_get_rows(ctx, self._weight(g, names[1], table, vocab, D),
                                        rows_t))
            result = self._store(g, y, out, T, D, add=False)
        g.finish(result)
        plan_holder: list[_CPlan] = []
        g.plan_holder = plan_holder  # type: ignore[attr-defined]

        def run() -> None:
            if pre is not None:
                pre()
            cpu.ggml_graph_compute(g.graph, plan_holder[0])

        return run

    def seal(self) -> None:
        """Place every graph's intermediates in one arena and plan them over one work
        buffer (the graphs run one at a time); after this the launches can run."""
        base, cpu = self.libs
        sizes = [sum(-(-n // _ALIGN) * _ALIGN for _, n in g.scratch) for g in self._graphs]
        self._arena = np.zeros(max(sizes, default=0) + _ALIGN, np.uint8)
        for g in self._graphs:
            offset = 0
            for tensor, n in g.scratch:
                self.attach(tensor, self._arena, offset)
                offset += -(-n // _ALIGN) * _ALIGN
        plans = [cpu.ggml_graph_plan(g.graph, self.threads if g.macs >= POOL_MIN_MACS else 1,
                                     self.pool) for g in self._graphs]
        self._work = np.zeros(max((p.work_size for p in plans), default=0) + _ALIGN, np.uint8)
        for g, plan in zip(self._graphs, plans, strict=True):
            plan.work_data = self._work.ctypes.data
            g.plan_holder.append(ctypes.pointer(plan))  # type: ignore[attr-defined]
        self.sealed = True

    @property
    def graph_count(self) -> int:
        return len(self._graphs)

    @property
    def pool_graph_count(self) -> int:
        """Graphs computed by the whole pool (at least POOL_MIN_MACS)."""
        return sum(g.macs >= POOL_MIN_MACS for g in self._graphs) if self.threads > 1 else 0

    def close(self) -> None:
        """Stop the pool's threads and free the contexts (the backend's arrays stay)."""
        base, cpu = self.libs
        if self.pool:
            cpu.ggml_threadpool_free(self.pool)
            self.pool = None
        for buf in self._buffers:
            base.ggml_backend_buffer_free(buf)
        self._buffers.clear()
        for c in self._contexts:
            base.ggml_free(c)
        self._contexts.clear()
