"""Whole programs as ggml graphs: a captured program's launches, translated at load into
one ggml graph per run of consecutive launches that have a graph form, replayed each step
with only host values rewritten (token ids, cache rows, attention masks).

The translation reads the program's launch records (reference op, argument buffers,
scalars): nothing here knows a model. Each launch with a graph form adds nodes to the
current graph; its outputs stay graph values (later launches read them directly) and are
copied into their buffers when the graph ends, so the buffers hold what the launch-by-
launch path leaves there. A launch without a graph form (sampling, slot gather/scatter)
ends the graph and runs as its bound NumPy or ggml callable, as before. The launch-by-
launch path stays the oracle: a step whose host values fall outside what the graph was
built for (a context longer than every variant, no live row) runs it instead.

Graph forms (each the math of its NumPy reference op in helios_tools.kernels):
``embedding``, ``rmsnorm``, ``add_rmsnorm``, ``linear``, ``linear_add``,
``swiglu_linear``, ``swiglu_linear_add``, ``silu_mul``, ``gelu_mul``, ``scale``,
``head_rmsnorm`` (= ``qk_rmsnorm``: ``rms_norm`` per head), ``rope_kv_write`` (RoPE in
ggml's half-split layout, then the keys and values stored in the paged cache by row
index), ``attention_decode_split`` followed by its ``attention_decode_merge`` (one
attention over the gathered cache rows: the split is a GPU scheduling detail),
``attention_prefill``, and the sliding-window ``attention_decode_window`` and
``attention_prefill_window`` (the same forms gathering each row's window only: no
page-table entry behind it is read).

Attention reads a fixed number of gathered cache positions per row, so a program with
attention is built once per context bucket (64, 128, ... positions up to the page table's
reach); a step runs the smallest bucket that holds its longest row, masking the rest.
Intermediates of every graph share one ggml-alloc buffer planned for the largest graph.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .errors import RuntimeLoadError
from .ggml_lib import GGML_F32, GGML_I32, GGML_TYPE, GgmlPrograms, _InitParams, libraries

GGML_I64 = 27
GGML_ROPE_NEOX = 2  # ggml's half-split rotation (HF rotate_half), the rope reference's
YARN_ORIG_CTX = 4096
# Context buckets: the smallest is a few pages; each next doubles, up to the page table's
# reach. Larger buckets cost gathered rows per step, smaller ones more graphs at load.
FIRST_BUCKET = 64
# Decode batch capacities with a whole-program graph: a bucket's gathered keys and
# values grow with rows x positions (8 rows at 8192 positions: 100 MB of f32 per layer's
# gather, planned once for the largest graph); larger batches keep the launch path.
MAX_GRAPH_ROWS = 8
# Bytes of one layer's attention values a bucket may need (gathered keys and values,
# scores); steps with longer contexts take the launch path. ggml-alloc reuses them
# across layers, so this bounds the shared intermediate buffer.
ATTENTION_BYTES = 64 << 20
GRAPH_OPS = frozenset({"embedding", "rmsnorm", "add_rmsnorm", "linear", "linear_add",
                       "swiglu_linear", "swiglu_linear_add", "silu_mul", "rope_kv_write",
                       "attention_decode_split", "attention_decode_merge",
                       "attention_prefill", "attention_decode_window",
                       "attention_prefill_window", "head_rmsnorm", "qk_rmsnorm",
                       "gelu_mul", "scale"})


def step_graphs_enabled() -> bool:
    """HELIOS_CPU_STEP_GRAPHS: "0" runs every program launch by launch (the oracle),
    "1" or unset builds the whole-program graphs.

    Raises:
        RuntimeLoadError: any other value.
    """
    text = os.environ.get("HELIOS_CPU_STEP_GRAPHS", "1")
    if text not in ("0", "1"):
        raise RuntimeLoadError(f"HELIOS_CPU_STEP_GRAPHS={text!r}: not 0 or 1")
    return text == "1"


class Unfusable(Exception):
    """This launch cannot join the graph being built (the graph ends before it)."""


@dataclass
class _Value:
    """A buffer region's current value inside the graph: rows x cols f32, contiguous."""

    tensor: int
    rows: int
    cols: int


@dataclass
class _Host:
    """Host arrays a graph reads, rewritten before each replay."""

    arrays: list[np.ndarray] = field(default_factory=list)
    writers: list[Callable[[int], bool]] = field(default_factory=list)


class _Lib:
    """The ggml graph-building functions this module binds (beyond ggml_lib's)."""

    def __init__(self):
        base, cpu = libraries()
        vp, i64, i32, sz, f = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t,
                               ctypes.c_float)
        sig = {
            "ggml_new_tensor_1d": ([vp, i32, i64], vp),
            "ggml_new_tensor_2d": ([vp, i32, i64, i64], vp),
            "ggml_new_tensor_4d": ([vp, i32, i64, i64, i64, i64], vp),
            "ggml_view_2d": ([vp, vp, i64, i64, sz, sz], vp),
            "ggml_view_3d": ([vp, vp, i64, i64, i64, sz, sz, sz], vp),
            "ggml_view_4d": ([vp, vp, i64, i64, i64, i64, sz, sz, sz, sz], vp),
            "ggml_reshape_2d": ([vp, vp, i64, i64], vp),
            "ggml_reshape_3d": ([vp, vp, i64, i64, i64], vp),
            "ggml_reshape_4d": ([vp, vp, i64, i64, i64, i64], vp),
            "ggml_permute": ([vp, vp, i32, i32, i32, i32], vp),
            "ggml_cont": ([vp, vp], vp),
            "ggml_cpy": ([vp, vp, vp], vp),
            "ggml_add": ([vp, vp, vp], vp),
            "ggml_mul": ([vp, vp, vp], vp),
            "ggml_rms_norm": ([vp, vp, f], vp),
            "ggml_mul_mat": ([vp, vp, vp], vp),
            "ggml_out_prod": ([vp, vp, vp], vp),
            "ggml_swiglu": ([vp, vp], vp),
            "ggml_geglu": ([vp, vp], vp),
            "ggml_scale": ([vp, vp, f], vp),
            "ggml_get_rows": ([vp, vp, vp], vp),
            "ggml_set_rows": ([vp, vp, vp, vp], vp),
            "ggml_concat": ([vp, vp, vp, i32], vp),
            "ggml_soft_max_ext": ([vp, vp, vp, f, f], vp),
            "ggml_rope_ext": ([vp, vp, vp, vp, i32, i32, i32, f, f, f, f, f, f], vp),
            "ggml_new_graph_custom": ([vp, sz, ctypes.c_bool], vp),
            "ggml_build_forward_expand": ([vp, vp], None),
            "ggml_graph_n_nodes": ([vp], i32),
            "ggml_graph_overhead_custom": ([sz, ctypes.c_bool], sz),
            "ggml_tensor_overhead": ([], sz),
            "ggml_init": ([_InitParams], vp),
            "ggml_free": ([vp], None),
            "ggml_backend_cpu_buffer_type": ([], vp),
            "ggml_gallocr_new": ([vp], vp),
            "ggml_gallocr_free": ([vp], None),
            "ggml_gallocr_reserve": ([vp, vp], ctypes.c_bool),
            "ggml_gallocr_alloc_graph": ([vp, vp], ctypes.c_bool),
            "ggml_gallocr_get_buffer_size": ([vp, i32], sz),
        }
        for name, (args, res) in sig.items():
            so = base if hasattr(base, name) else cpu
            fn = getattr(so, name)
            fn.argtypes, fn.restype = args, res
            setattr(self, name.removeprefix("ggml_"), fn)
        self.base, self.cpu = base, cpu


def _nb1(tensor: int) -> int:
    """A tensor's nb[1] (bytes between rows): struct ggml_tensor holds its type (int),
    a buffer pointer, ne[4] (int64) at byte 16 and nb[4] (size_t) at byte 48."""
    return ctypes.c_size_t.from_address(tensor + 48 + 8).value


class _Builder:
    """Builds one graph (one context bucket of one run of launches)."""

    def __init__(self, owner: StepPrograms, ctx: int, bucket: int):
        self.o = owner
        self.g = owner.lib
        self.ctx = ctx
        self.bucket = bucket
        self.values: dict[tuple, _Value] = {}  # (buffer, byte offset, shape) -> value
        self.names: dict[str, tuple] = {}  # buffer -> its key holding a value
        self.pending: dict[tuple, tuple[np.ndarray, int, int]] = {}  # flushed at the end
        self.in_place: set[tuple] = set()  # values that live in their buffer already
        self.heads: list[int] = []

    # --- values -------------------------------------------------------------------
    def key(self, name: str, a: np.ndarray) -> tuple:
        return (name, a.__array_interface__["data"][0], a.shape)

    def leaf(self, a: np.ndarray, ggml_type: int, ne0: int, ne1: int, row: int) -> int:
        """A 2-D tensor [ne1, ne0] over `a`'s memory, rows `row` elements apart."""
        return self.o.bind(self.ctx, a, ggml_type, ne0, ne1, row)

    def read(self, name: str, a: np.ndarray, rows: int, cols: int) -> int:
        """a[:rows, :cols] (f32) as a graph tensor: its graph value, or the buffer."""
        k = self.key(name, a)
        held = self.names.get(name)
        if held is not None and held != k:
            raise Unfusable(f"{name} read through another view")
        v = self.values.get(k)
        if v is not None:
            if (v.rows, v.cols) == (rows, cols):
                return v.tensor
            if k in self.in_place:
                raise Unfusable(f"{name} read in another shape")
            raise Unfusable(f"{name} read as {rows}x{cols}, held as {v.rows}x{v.cols}")
        if a.dtype != np.float32 or a.ndim != 2 or not a.flags.c_contiguous:
            raise Unfusable(f"{name}: not a 2-D f32 array")
        return self.leaf(a, GGML_F32, cols, rows, a.shape[1])

    def write(self, name: str, a: np.ndarray, t: int, rows: int, cols: int) -> None:
        """a[:rows, :cols] = t (copied into the buffer when the graph ends)."""
        k = self.key(name, a)
        held = self.names.get(name)
        if held is not None and held != k:
            raise Unfusable(f"{name} written through another view")
        if a.dtype != np.float32 or a.ndim != 2 or a.shape[0] < rows or a.shape[1] < cols:
            raise Unfusable(f"{name}: cannot hold {rows}x{cols} f32")
        self.values[k] = _Value(t, rows, cols)
        self.names[name] = k
        self.pending[k] = (a, rows, cols)

    def weight(self, name: str, w: np.ndarray, n: int, k: int) -> int:
        """A weight [n rows, k elements]: GGUF blocks or f32."""
        st = self.o.storage.get(name)
        if st is None:
            if w.dtype != np.float32 or w.ndim != 2:
                raise Unfusable(f"weight {name}: not a 2-D f32 array")
            return self.leaf(w, GGML_F32, k, n, w.shape[1])
        if k % st.block_elements:
            raise RuntimeLoadError(f"weight {name}: {k} columns are not whole blocks")
        return self.leaf(w, GGML_TYPE[st.type], k, n, k)

    def host(self, dtype, n: int, ggml_type: int, shape4=None) -> tuple[np.ndarray, int]:
        """A host array the step's writer fills, and its tensor (1-D, or `shape4`)."""
        a = np.zeros(max(n, 1), dtype)
        if shape4 is None:
            t = self.g.new_tensor_1d(self.ctx, ggml_type, n)
        else:
            t = self.g.new_tensor_4d(self.ctx, ggml_type, *shape4)
        self.o.attach(t, a)
        return a, t

    def flush(self) -> None:
        for k, (a, rows, cols) in self.pending.items():
            if k in self.in_place:
                continue
            dst = self.leaf(a, GGML_F32, cols, rows, a.shape[1])
            self.heads.append(self.g.cpy(self.ctx, self.values[k].tensor, dst))


class _Run:
    """A run of consecutive launches built as graphs (one per context bucket)."""

    def __init__(self, launches: list[tuple], fallback: list[tuple]):
        self.launches = launches  # (op, names, args)
        self.fallback = fallback  # the bound callables of the same launches
        self.graphs: dict[int, tuple] = {}  # bucket -> (graph, plan)
        self.writers: dict[int, list[Callable[[], int | None]]] = {}  # bucket -> writers
        self.buckets: list[int] = [0]
        # the longest context of the step's rows (None: no live row or past the table)
        self.need: Callable[[], int | None] = lambda: 0

    def choose(self) -> int | None:
        """Write the step's host values; the bucket to run, or None (the launch path)."""
        need = self.need()
        if need is None:
            return None
        bucket = next((b for b in self.buckets if b >= need), None)
        if bucket is None:
            return None
        for write in self.writers[bucket]:
            if write() is None:
                return None
        return bucket


class StepPrograms:
    """The whole-program graphs of a cpu backend's programs.

    Args:
        ggml: the backend's GgmlPrograms (its storage table, pool and thread count).
    """

    def __init__(self, ggml: GgmlPrograms):
        self.lib = _Lib()
        self.ggml = ggml
        self.storage = ggml.storage
        self.threads = ggml.threads
        self._contexts: list[int] = []
        self._keep: list[np.ndarray] = []  # host arrays the graphs point into
        self._programs: dict[str, list] = {}
        self._all_graphs: list[int] = []
        self._galloc = self.lib.gallocr_new(self.lib.backend_cpu_buffer_type())
        self._current: int | None = None
        self._work = np.zeros(0, np.uint8)
        self.sealed = False

    # --- memory -------------------------------------------------------------------
    def _new_ctx(self, launches: int) -> tuple[int, int]:
        """A metadata context (no tensor data) for a graph of `launches` launches, and
        the node capacity of its graph."""
        g = self.lib
        nodes = _NODES_PER_LAUNCH * launches + 64
        size = (g.graph_overhead_custom(nodes, False)
                + (_TENSORS_PER_LAUNCH * launches + 64) * g.tensor_overhead())
        ctx = g.init(_InitParams(size, None, True))
        if not ctx:
            raise RuntimeLoadError("ggml_init failed for a step graph")
        self._contexts.append(ctx)
        return ctx, nodes

    def attach(self, tensor: int, array: np.ndarray) -> None:
        """Point `tensor` at `array`, which lives as long as the graphs (kept here)."""
        self.ggml.attach(tensor, array, 0)
        self._keep.append(array)

    def bind(self, ctx: int, a: np.ndarray, ggml_type: int, ne0: int, ne1: int,
             row: int) -> int:
        g = self.lib
        t = g.new_tensor_2d(ctx, ggml_type, row, ne1)
        if self.ggml.row_bytes(ggml_type, row) * ne1 > a.nbytes:
            raise RuntimeLoadError(f"ggml tensor of {ne1}x{row} over an array of "
                                   f"{a.nbytes} bytes")
        self.attach(t, a)
        if row == ne0:
            return t
        return g.view_2d(ctx, t, ne0, ne1, self.ggml.row_bytes(ggml_type, row), 0)

    # --- building -----------------------------------------------------------------
    def add_program(self, name: str, launches: list[tuple], bound: list[tuple]) -> bool:
        """Translate program `name` (launches: (op, buffer names, arguments) in order;
        bound: the launch path's (callable, arguments) of the same launches). Returns
        whether any graph was built for it."""
        plan: list = []
        i = 0
        built = False
        while i < len(launches):
            j = self._extent(launches, i)
            if j == i:
                plan.append(bound[i])
                i += 1
                continue
            run = _Run(launches[i:j], bound[i:j])
            try:
                self._build(run)
            except Unfusable:
                plan.extend(bound[i:j])
                i = j
                continue
            plan.append(run)
            built = True
            i = j
        if built:
            self._programs[name] = plan
        return built

    def _extent(self, launches: list[tuple], i: int) -> int:
        """End of the run of graph-form launches starting at i (i: none)."""
        j = i
        while j < len(launches) and launches[j][0] in GRAPH_OPS:
            op = launches[j][0]
            if op == "attention_decode_split":
                nxt = launches[j + 1] if j + 1 < len(launches) else None
                if nxt is None or nxt[0] != "attention_decode_merge" \
                        or nxt[1][:2] != launches[j][1][6:8]:
                    break
                j += 2
                continue
            if op == "attention_decode_merge":
                break
            j += 1
        return j

    def _build(self, run: _Run) -> None:
        # One bucket list for every attention of the run: a run may hold window and
        # whole-context attentions (Gemma 3's local and global layers in one graph), and
        # its bucket must hold the longest context any of them gathers.
        extents = [e for op, _, args in run.launches if (e := _attention_extent(op, args))]
        if extents:
            # layers of one kind share their host arrays: one need each
            needs = list({key: need for _, _, key, need in extents}.values())

            def longest() -> int | None:
                got = [need() for need in needs]
                return None if None in got else max(got)

            self._bucket(run, max(e[0] for e in extents), max(e[1] for e in extents),
                         longest)
        hosts: dict[tuple, tuple] = {}
        for bucket in run.buckets:
            ctx, nodes = self._new_ctx(len(run.launches))
            builder = _Builder(self, ctx, bucket)
            writers: list[Callable[[], int | None]] = []
            for op, names, args in run.launches:
                _FORMS[op](builder, names, args, writers, hosts)
            builder.flush()
            graph = self.lib.new_graph_custom(ctx, nodes, False)
            for t in builder.heads:
                self.lib.build_forward_expand(graph, t)
            run.graphs[bucket] = (graph, None)
            run.writers[bucket] = writers
            self._all_graphs.append(graph)

    def _bucket(self, run: _Run, reach: int, floats_per_position: int,
                need: Callable[[], int | None]) -> None:
        """Context buckets of `run` (FIRST_BUCKET doubling up to `reach`), those whose
        per-layer attention values (`floats_per_position` f32 per gathered position)
        stay within ATTENTION_BYTES; a longer step takes the launch path."""
        buckets, b = [], FIRST_BUCKET
        while b < reach:
            buckets.append(b)
            b *= 2
        buckets.append(reach)
        kept = [b for b in buckets if 4 * b * floats_per_position <= ATTENTION_BYTES]
        if not kept:
            raise Unfusable("no context bucket fits the attention budget")
        run.buckets = kept
        run.need = need

    def seal(self) -> None:
        """Plan the shared intermediate buffer (the largest graph) and the graphs'
        thread plans; after this the programs can run."""
        g, cpu = self.lib, self.lib.cpu
        for graph in self._all_graphs:
            if not g.gallocr_reserve(self._galloc, graph):
                raise RuntimeLoadError("ggml-alloc could not plan a step graph")
        plans = {}
        for graph in self._all_graphs:
            plans[graph] = cpu.ggml_graph_plan(graph, self.threads, self.ggml.pool)
        size = max((p.work_size for p in plans.values()), default=0)
        self._work = np.zeros(size + 64, np.uint8)
        for plan_list in self._programs.values():
            for item in plan_list:
                if isinstance(item, _Run):
                    for bucket, (graph, _) in list(item.graphs.items()):
                        p = plans[graph]
                        p.work_data = self._work.ctypes.data
                        item.graphs[bucket] = (graph, ctypes.pointer(p))
        self.sealed = True

    @property
    def buffer_bytes(self) -> int:
        return int(self.lib.gallocr_get_buffer_size(self._galloc, 0))

    @property
    def graph_count(self) -> int:
        return len(self._all_graphs)

    def programs(self) -> list[str]:
        return sorted(self._programs)

    def runner(self, name: str) -> Callable[[], None] | None:
        """The step callable of program `name`, or None (it has no graph)."""
        plan = self._programs.get(name)
        if plan is None:
            return None
        g, cpu = self.lib, self.lib.cpu

        def run() -> None:
            for item in plan:
                if not isinstance(item, _Run):
                    fn, args = item
                    fn(*args)
                    continue
                bucket = item.choose()
                if bucket is None:  # outside what the graphs hold: the launch path
                    for fn, args in item.fallback:
                        fn(*args)
                    continue
                graph, plan_ptr = item.graphs[bucket]
                if self._current != graph:
                    if not g.gallocr_alloc_graph(self._galloc, graph):
                        raise RuntimeError("ggml-alloc could not place a step graph")
                    self._current = graph
                cpu.ggml_graph_compute(graph, plan_ptr)

        return run

    def close(self) -> None:
        if self._galloc:
            self.lib.gallocr_free(self._galloc)
            self._galloc = None
        for c in self._contexts:
            self.lib.free(c)
        self._contexts.clear()


def _attention_extent(op: str, args: tuple) -> tuple[int, int, tuple, Callable] | None:
    """An attention launch's (reach: the most positions it may gather, f32 values per
    gathered position, a key equal for launches of equal needs, the step's need) for the
    run's context buckets; None for any other launch.

    Raises:
        Unfusable: a decode attention of more than MAX_GRAPH_ROWS rows.
    """
    if op == "attention_decode_split":
        _, positions, slot, _, _, _, _, _, B, MP, PT, H, KVH, HD, NS, SPLIT, _ = args
        if B > MAX_GRAPH_ROWS:
            raise Unfusable(f"{B} attention rows")
        return (min(MP * PT, NS * SPLIT), B * (3 * KVH * HD + H),
                ("decode", positions.ctypes.data, slot.ctypes.data, B, 0),
                _decode_need(positions, slot, B))
    if op == "attention_prefill":
        _, positions, token_row, slot, _, _, _, _, T, R, MP, PT, H, KVH, HD, _ = args
        return (R * MP * PT, 3 * KVH * HD + T * H,
                ("prefill", positions.ctypes.data, token_row.ctypes.data, T, R, 0),
                _prefill_need(positions, token_row, slot, T, R))
    if op == "attention_decode_window":
        _, positions, slot, _, _, _, _, B, MP, PT, H, KVH, HD, W, _ = args
        if B > MAX_GRAPH_ROWS:
            raise Unfusable(f"{B} attention rows")
        return (min(MP * PT, W), B * (3 * KVH * HD + H),
                ("decode", positions.ctypes.data, slot.ctypes.data, B, W),
                _decode_need(positions, slot, B, W))
    if op == "attention_prefill_window":
        _, positions, token_row, slot, _, _, _, _, T, R, MP, PT, H, KVH, HD, W, _ = args
        # a row gathers its tokens' span and the W - 1 positions before it
        return (_window_prefill_reach(R, MP, PT, T, W), 3 * KVH * HD + T * H,
                ("prefill", positions.ctypes.data, token_row.ctypes.data, T, R, W),
                _prefill_need(positions, token_row, slot, T, R, W))
    return None


def _window_prefill_reach(R: int, MP: int, PT: int, T: int, W: int) -> int:
    """The most positions a window prefill attention gathers: each live row its tokens'
    span and the W - 1 positions before it, within the page tables' reach."""
    return min(R * MP * PT, R * (W - 1) + T)


# Graph nodes and tensors a launch adds at most (attention: about 20 of each).
_NODES_PER_LAUNCH = 24
_TENSORS_PER_LAUNCH = 32


# --- forms: (builder, buffer names, args, step writers, shared host values) ------------

def _embedding(b: _Builder, names, args, writers, hosts) -> None:
    ids, table, out, T, D = args
    vocab = table.shape[0]
    safe, t_ids = b.host(np.int32, T, GGML_I32)
    src = ids[:T]

    def write() -> int:
        np.copyto(safe[:T], src)
        safe[(safe < 0) | (safe >= vocab)] = 0  # padding reads row 0, as the reference
        return 0

    writers.append(write)
    rows = b.g.get_rows(b.ctx, b.weight(names[1], table, vocab, D), t_ids)
    b.write(names[2], out, rows, T, D)


def _norm(b: _Builder, x: int, gain_name: str, gain: np.ndarray, D: int, eps: float) -> int:
    gw = b.leaf(gain.reshape(1, -1), GGML_F32, D, 1, gain.shape[-1])
    return b.g.mul(b.ctx, b.g.rms_norm(b.ctx, x, float(eps)), gw)


def _rmsnorm(b: _Builder, names, args, writers, hosts) -> None:
    x, gain, out, T, D, eps = args
    b.write(names[2], out, _norm(b, b.read(names[0], x, T, D), names[1], gain, D, eps), T, D)


def _add_rmsnorm(b: _Builder, names, args, writers, hosts) -> None:
    x, residual, gain, out, T, D, eps = args
    r = b.g.add(b.ctx, b.read(names[1], residual, T, D), b.read(names[0], x, T, D))
    b.write(names[1], residual, r, T, D)
    b.write(names[3], out, _norm(b, r, names[2], gain, D, eps), T, D)


def _linear(b: _Builder, names, args, writers, hosts, op="linear") -> None:
    x, w, out, T, N, K = args
    y = b.g.mul_mat(b.ctx, b.weight(names[1], w, N, K), b.read(names[0], x, T, K))
    if op.endswith("_add"):
        y = b.g.add(b.ctx, b.read(names[2], out, T, N), y)
    b.write(names[2], out, y, T, N)


def _swiglu_linear(b: _Builder, names, args, writers, hosts, op="swiglu_linear") -> None:
    x, w, out, T, N, K = args
    act = b.g.swiglu(b.ctx, b.read(names[0], x, T, 2 * K))
    y = b.g.mul_mat(b.ctx, b.weight(names[1], w, N, K), act)
    if op.endswith("_add"):
        y = b.g.add(b.ctx, b.read(names[2], out, T, N), y)
    b.write(names[2], out, y, T, N)


def _silu_mul(b: _Builder, names, args, writers, hosts) -> None:
    x, out, T, K = args
    b.write(names[1], out, b.g.swiglu(b.ctx, b.read(names[0], x, T, 2 * K)), T, K)


def _gelu_mul(b: _Builder, names, args, writers, hosts) -> None:
    """GeGLU: ``geglu`` (ggml's tanh GELU of the gate half times the up half, the kernel
    llama.cpp runs for Gemma's feed-forward)."""
    x, out, T, F = args
    b.write(names[1], out, b.g.geglu(b.ctx, b.read(names[0], x, T, 2 * F)), T, F)


def _scale(b: _Builder, names, args, writers, hosts) -> None:
    """``x *= factor`` in place: ``scale`` by the factor rounded to f32, as the reference."""
    x, T, D, factor = args
    y = b.g.scale(b.ctx, b.read(names[0], x, T, D), float(np.float32(factor)))
    b.write(names[0], x, y, T, D)


def _head_rmsnorm(b: _Builder, names, args, writers, hosts) -> None:
    """RMS norm of every query and key head of fused [q; k; v] rows, in place
    (``head_rmsnorm`` / ``qk_rmsnorm``): the q and k columns viewed as [HD, H + KVH, T],
    one ``rms_norm`` over each head, times a gain table [HD, H + KVH] (the query gain on
    the query heads, the key gain on the key heads, built once at load), the values
    appended unchanged."""
    qkv, q_gain, k_gain, T, H, KVH, HD, eps = args
    g, ctx = b.g, b.ctx
    W = (H + 2 * KVH) * HD
    x = b.read(names[0], qkv, T, qkv.shape[1])
    if qkv.shape[1] != W:
        raise Unfusable("qkv rows wider than q, k and v")
    row = _nb1(x)
    key = ("head gains", q_gain.ctypes.data, k_gain.ctypes.data, H, KVH, HD)
    if key not in hosts:  # the gains are weights: constant after load
        hosts[key] = np.concatenate([np.tile(q_gain[:HD], (H, 1)),
                                     np.tile(k_gain[:HD], (KVH, 1))]).astype(np.float32)
    gains = g.new_tensor_2d(ctx, GGML_F32, HD, H + KVH)
    b.o.attach(gains, hosts[key])
    heads = g.view_3d(ctx, x, HD, H + KVH, T, HD * 4, row, 0)
    qk = g.mul(ctx, g.rms_norm(ctx, heads, float(eps)), gains)
    v = g.cont(ctx, g.view_2d(ctx, x, KVH * HD, T, row, (H + KVH) * HD * 4))
    y = g.concat(ctx, g.reshape_2d(ctx, qk, (H + KVH) * HD, T), v, 0)
    b.write(names[0], qkv, y, T, W)


def _rope_freqs(inv_freq: np.ndarray, HD: int) -> tuple[float, np.ndarray | None]:
    """(freq_base, freq factors or None) with ggml's theta_i = pos * base^(-2i/HD) / f_i
    equal to pos * inv_freq[i].

    The base is fitted to every inv_freq (log-linear in i) and rounded to f32, as ggml
    holds it; where the table is that geometric series (to 1e-5) no factors are passed,
    so the angles are ggml's own (llama.cpp's) to the last bit. Otherwise (frequency
    scaling, e.g. Llama 3) the factors carry the difference.
    """
    half = HD // 2
    inv = inv_freq[:half].astype(np.float64)
    i = np.arange(1, half)
    if half < 2 or np.any(inv <= 0):
        return 10000.0, None
    base = float(np.float32(np.exp(np.mean(-np.log(inv[1:]) * HD / (2 * i)))))
    factors = base ** (-2 * np.arange(half) / HD) / inv
    if np.all(np.abs(factors - 1) < 1e-5):
        return base, None
    return base, factors.astype(np.float32)


def _cache_rows(hosts, positions, token_row, slot, page_table, T, R, MP, PT):
    """The host arrays of a step's cache-row writes, shared by every layer: destination
    row per token (page * PT + position % PT) and the source token it copies (padding
    tokens repeat a live token's write). Keyed by the page table too: a sliding-window
    region's layers write through their own."""
    key = ("rows", positions.ctypes.data, token_row.ctypes.data, slot.ctypes.data,
           page_table.ctypes.data, T)
    if key in hosts:
        return hosts[key]
    dst = np.zeros(T, np.int64)
    src = np.zeros(T, np.int32)

    def write() -> int | None:
        rows = token_row[:T].astype(np.int64)
        s = np.where(rows >= 0, slot[:R][np.clip(rows, 0, R - 1)], -1)
        live = np.flatnonzero(s >= 0)
        if live.size == 0:
            return None
        pos = positions[:T].astype(np.int64)
        if pos[live].min() < 0 or (pos[live] // PT).max() >= MP:
            return None  # the launch path raises the reference's error
        page = page_table[s[live], pos[live] // PT].astype(np.int64)
        dst[:] = page[0] * PT + pos[live[0]] % PT
        src[:] = live[0]
        dst[live] = page * PT + pos[live] % PT
        src[live] = live
        return 0

    hosts[key] = (dst, src, write)
    return hosts[key]


def _rope_kv_write(b: _Builder, names, args, writers, hosts) -> None:
    (qkv, positions, inv_freq, token_row, slot, page_table, k_cache, v_cache,
     T, R, MP, PT, H, KVH, HD) = args
    g, ctx = b.g, b.ctx
    W = (H + 2 * KVH) * HD
    x = b.read(names[0], qkv, T, qkv.shape[1])
    if qkv.shape[1] != W:
        raise Unfusable("qkv rows wider than q, k and v")
    row = _nb1(x)
    pos_t = g.new_tensor_1d(ctx, GGML_I32, T)
    b.o.attach(pos_t, positions[:T] if positions[:T].flags.c_contiguous else positions)
    base, factors = _rope_freqs(inv_freq, HD)
    ff = None
    if factors is not None:
        key = ("ff", inv_freq.ctypes.data)
        if key not in hosts:
            hosts[key] = factors
        ff = g.new_tensor_1d(ctx, GGML_F32, HD // 2)
        b.o.attach(ff, hosts[key])

    def rope(offset: int, heads: int) -> int:
        view = g.view_3d(ctx, x, HD, heads, T, HD * 4, row, offset)
        # No YaRN (ext_factor 0): its ramp is still computed, from a positive original
        # context and llama.cpp's default betas, so it stays finite (0 x NaN is NaN).
        r = g.rope_ext(ctx, view, pos_t, ff, HD, GGML_ROPE_NEOX, YARN_ORIG_CTX, base, 1.0,
                       0.0, 1.0, 32.0, 1.0)
        return g.reshape_2d(ctx, r, heads * HD, T)

    q = rope(0, H)
    k = rope(H * HD * 4, KVH)
    v = g.cont(ctx, g.view_2d(ctx, x, KVH * HD, T, row, (H + KVH) * HD * 4))
    b.write(names[0], qkv, g.concat(ctx, g.concat(ctx, q, k, 0), v, 0), T, W)
    dst, src, write = _cache_rows(hosts, positions, token_row, slot, page_table, T, R, MP, PT)
    if write not in writers:
        writers.append(write)
    t_dst = g.new_tensor_1d(ctx, GGML_I64, T)
    b.o.attach(t_dst, dst)
    t_src = g.new_tensor_1d(ctx, GGML_I32, T)
    b.o.attach(t_src, src)
    for name, cache, val in ((names[6], k_cache, k), (names[7], v_cache, v)):
        plane = cache.reshape(cache.shape[0] * PT, KVH * HD)
        k_ = (name, cache.__array_interface__["data"][0], cache.shape)
        held = b.values.get(k_)
        c = held.tensor if held is not None else b.leaf(plane, GGML_F32, KVH * HD,
                                                         plane.shape[0], KVH * HD)
        stored = g.set_rows(ctx, c, g.get_rows(ctx, val, t_src), t_dst)
        b.values[k_] = _Value(stored, plane.shape[0], KVH * HD)
        b.names[name] = k_
        b.in_place.add(k_)
        b.heads.append(stored)


def _decode_need(positions, slot, B, W: int = 0) -> Callable[[], int | None]:
    """The step's longest context of one-token rows, or within a window of `W` > 0
    tokens its longest window (None: no live row)."""
    def need() -> int | None:
        live = slot[:B] >= 0
        if not live.any():
            return None
        ctx = int(positions[:B][live].max()) + 1
        return min(ctx, W) if W else ctx
    return need


def _first_seen(pmin: int, W: int) -> int:
    """The first position a row's tokens see: 0, or within a window of `W` > 0 tokens
    the earliest token's window start."""
    return max(0, pmin - W + 1) if W else 0


def _prefill_need(positions, token_row, slot, T, R, W: int = 0) -> Callable[[], int | None]:
    """The step's gathered positions for packed prefill tokens: the sum over live rows
    of the positions they see (`_first_seen` .. their last token's; None: no live
    token)."""
    def need() -> int | None:
        rows = token_row[:T]
        live = rows >= 0
        live[live] = slot[:R][rows[live]] >= 0
        if not live.any():
            return None
        pos = positions[:T]
        total = 0
        for r in np.unique(rows[live]):
            mine = pos[live & (rows == r)]
            total += int(mine.max()) + 1 - _first_seen(int(mine.min()), W)
        return total
    return need


def _attention_rows(hosts, positions, slot, page_table, B, MP, PT, L, W=0):
    """Host arrays of one bucket's attention: gathered cache row per (row, position),
    the additive mask (0 or -inf) and the live-row factor; shared by every layer. Row b
    gathers positions lo_b + i (i < L): lo_b = 0, or within a window of `W` > 0 tokens
    ctx_b - W, so no page-table entry behind its window is read."""
    key = ("attn", positions.ctypes.data, slot.ctypes.data, page_table.ctypes.data, B, L, W)
    if key in hosts:
        return hosts[key]
    idx = np.zeros(L * B, np.int32)
    mask = np.zeros((B, L), np.float32)
    live_f = np.zeros(B, np.float32)
    j = np.arange(L)

    def write() -> int | None:
        s = slot[:B].astype(np.int64)
        live = s >= 0
        if not live.any():
            return None
        ctx_len = np.where(live, positions[:B].astype(np.int64) + 1, 1)
        worst = int(ctx_len.max())
        if (worst + PT - 1) // PT > MP:
            return None
        lo = np.maximum(ctx_len - W, 0) if W else np.zeros_like(ctx_len)
        at = lo[:, None] + j[None, :]
        valid = at < ctx_len[:, None]
        sl = np.where(live, s, s[live][0])
        jc = np.where(valid, at, lo[:, None])
        rows = page_table[sl[:, None], jc // PT].astype(np.int64) * PT + jc % PT
        idx[:] = rows.reshape(-1)
        mask[:] = np.where(valid, 0.0, -np.inf)
        live_f[:] = live
        return int((ctx_len - lo).max())

    hosts[key] = (idx, mask, live_f, write)
    return hosts[key]


def _attention_split(b: _Builder, names, args, writers, hosts) -> None:
    b.split = (names, args)  # type: ignore[attr-defined]  # the merge completes it


def _attention_merge(b: _Builder, names, args, writers, hosts) -> None:
    snames, sargs = b.split  # type: ignore[attr-defined]
    (qkv, positions, slot, page_table, k_cache, v_cache, _, _,
     B, MP, PT, H, KVH, HD, NS, SPLIT, scale) = sargs
    _, _, _, out, _, _, _, _ = args
    _decode_form(b, (snames[0], snames[4], snames[5], names[3]),
                 (qkv, positions, slot, page_table, k_cache, v_cache, out,
                  B, MP, PT, H, KVH, HD, 0, scale), writers, hosts)


def _attention_decode_window(b: _Builder, names, args, writers, hosts) -> None:
    _decode_form(b, (names[0], names[4], names[5], names[6]), args, writers, hosts)


def _decode_form(b: _Builder, names, args, writers, hosts) -> None:
    """One-token-per-row attention over each row's gathered positions (its context, or
    its window of W > 0 tokens); `names`: (qkv, k cache, v cache, out) buffers."""
    (qkv, positions, slot, page_table, k_cache, v_cache, out,
     B, MP, PT, H, KVH, HD, W, scale) = args
    g, ctx = b.g, b.ctx
    # a window row needs at most W positions, in a bucket sized for whole contexts too
    L = min(b.bucket, W) if W else b.bucket
    x = b.read(names[0], qkv, B, qkv.shape[1])
    row = _nb1(x)
    q = g.view_4d(ctx, x, HD, 1, H, B, HD * 4, HD * 4, row, 0)
    idx, mask, live_f, write = _attention_rows(hosts, positions, slot, page_table, B, MP,
                                               PT, L, W)
    if write not in writers:
        writers.append(write)
    t_idx = g.new_tensor_1d(ctx, GGML_I32, L * B)
    b.o.attach(t_idx, idx)
    t_mask = g.new_tensor_4d(ctx, GGML_F32, L, 1, 1, B)
    b.o.attach(t_mask, mask)
    t_live = g.new_tensor_4d(ctx, GGML_F32, 1, 1, 1, B)
    b.o.attach(t_live, live_f)

    def gathered(name: str, cache: np.ndarray) -> int:
        rows = g.get_rows(ctx, _cache_value(b, name, cache, PT, KVH * HD), t_idx)
        return g.reshape_4d(ctx, rows, HD, KVH, L, B)

    k = g.permute(ctx, gathered(names[1], k_cache), 0, 2, 1, 3)  # [HD, L, KVH, B]
    kq = g.mul_mat(ctx, k, q)  # [L, 1, H, B]
    kq = g.soft_max_ext(ctx, kq, t_mask, float(scale), 0.0)
    # o = sum over positions of p * v: out_prod contracts the gathered values' position
    # axis in place, where mul_mat would need them transposed into a copy (`cont`: at
    # batch 8 that copy cost more than the products, bench/cpu_step_breakdown.py)
    v = g.permute(ctx, gathered(names[2], v_cache), 0, 2, 1, 3)  # [HD, L, KVH, B]
    o = g.out_prod(ctx, v, g.reshape_4d(ctx, kq, 1, L, H, B))  # [HD, 1, H, B]
    o = g.mul(ctx, o, t_live)  # padding rows: zeros, as the reference
    b.write(names[3], out, g.reshape_2d(ctx, o, H * HD, B), B, H * HD)


def _prefill_rows(hosts, positions, token_row, slot, page_table, T, R, MP, PT, L, W=0):
    """Host arrays of one bucket's prefill attention, shared by every layer: the live
    rows' contexts gathered one after another (row r: its positions `_first_seen` .. its
    last token's, cache row page * PT + position) into `L` slots [L], the additive mask
    [T, L] (a token sees its own row's positions up to its own, and within a window of
    `W` > 0 tokens none at or before its position - W) and the live-token factor [T].
    Gathering only live rows keeps the work to the contexts there are."""
    key = ("prefill", positions.ctypes.data, token_row.ctypes.data, slot.ctypes.data,
           page_table.ctypes.data, T, L, W)
    if key in hosts:
        return hosts[key]
    idx = np.zeros(L, np.int32)
    mask = np.zeros((T, L), np.float32)
    live_f = np.zeros(T, np.float32)

    def write() -> int | None:
        rows = token_row[:T].astype(np.int64)
        s = np.where(rows >= 0, slot[:R][np.clip(rows, 0, R - 1)], -1)
        live = s >= 0
        if not live.any():
            return None
        pos = positions[:T].astype(np.int64)
        if pos[live].min() < 0 or (int(pos[live].max()) + PT) // PT > MP:
            return None
        mask[:] = -np.inf
        idx[:] = 0
        start = 0
        for r in np.unique(rows[live]):
            mine = np.flatnonzero(live & (rows == r))
            first = _first_seen(int(pos[mine].min()), W)
            n = int(pos[mine].max()) + 1 - first
            if start + n > L:
                return None
            j = np.arange(first, first + n)
            idx[start:start + n] = page_table[int(slot[r]), j // PT].astype(np.int64) * PT \
                + j % PT
            seen = j[None, :] <= pos[mine, None]  # [tokens, n]
            if W:
                seen &= j[None, :] > pos[mine, None] - W
            block = mask[mine, start:start + n]
            block[seen] = 0.0
            mask[mine, start:start + n] = block
            start += n
        mask[~live, 0] = 0.0  # padding tokens: one finite score (their output is zeroed)
        live_f[:] = live
        return start

    hosts[key] = (idx, mask, live_f, write)
    return hosts[key]


def _attention_prefill(b: _Builder, names, args, writers, hosts) -> None:
    (qkv, positions, token_row, slot, page_table, k_cache, v_cache, out,
     T, R, MP, PT, H, KVH, HD, scale) = args
    _prefill_form(b, names, (qkv, positions, token_row, slot, page_table, k_cache, v_cache,
                             out, T, R, MP, PT, H, KVH, HD, 0, scale), writers, hosts)


def _prefill_form(b: _Builder, names, args, writers, hosts) -> None:
    """Causal attention of packed prefill tokens over their rows' gathered contexts
    (bucket `b.bucket` positions in all), within a window of W > 0 tokens when given
    (``attention_prefill_window``'s arguments)."""
    (qkv, positions, token_row, slot, page_table, k_cache, v_cache, out,
     T, R, MP, PT, H, KVH, HD, W, scale) = args
    g, ctx = b.g, b.ctx
    L = min(b.bucket, _window_prefill_reach(R, MP, PT, T, W)) if W else b.bucket
    x = b.read(names[0], qkv, T, qkv.shape[1])
    row = _nb1(x)
    q = g.permute(ctx, g.view_3d(ctx, x, HD, H, T, HD * 4, row, 0), 0, 2, 1, 3)  # [HD,T,H]
    idx, mask, live_f, write = _prefill_rows(hosts, positions, token_row, slot, page_table,
                                             T, R, MP, PT, L, W)
    if write not in writers:
        writers.append(write)
    t_idx = g.new_tensor_1d(ctx, GGML_I32, L)
    b.o.attach(t_idx, idx)
    t_mask = g.new_tensor_2d(ctx, GGML_F32, L, T)
    b.o.attach(t_mask, mask)
    t_live = g.new_tensor_2d(ctx, GGML_F32, 1, T)
    b.o.attach(t_live, live_f)

    def gathered(name: str, cache: np.ndarray) -> int:
        rows = g.get_rows(ctx, _cache_value(b, name, cache, PT, KVH * HD), t_idx)
        return g.reshape_3d(ctx, rows, HD, KVH, L)

    k = g.permute(ctx, gathered(names[5], k_cache), 0, 2, 1, 3)  # [HD, L, KVH]
    kq = g.soft_max_ext(ctx, g.mul_mat(ctx, k, q), t_mask, float(scale), 0.0)  # [L, T, H]
    v = g.cont(ctx, g.permute(ctx, gathered(names[6], v_cache), 1, 2, 0, 3))  # [L, HD, KVH]
    o = g.permute(ctx, g.mul_mat(ctx, v, kq), 0, 2, 1, 3)  # [HD, H, T]
    o = g.mul(ctx, g.reshape_2d(ctx, g.cont(ctx, o), H * HD, T), t_live)
    b.write(names[7], out, o, T, H * HD)


def _cache_value(b: _Builder, name: str, cache: np.ndarray, PT: int, row: int) -> int:
    """Cache plane `name` as [row, pages * PT]: its value in this graph (after this
    step's writes) or the buffer."""
    k_ = (name, cache.__array_interface__["data"][0], cache.shape)
    held = b.values.get(k_)
    if held is not None:
        return held.tensor
    plane = cache.reshape(cache.shape[0] * PT, row)
    return b.leaf(plane, GGML_F32, row, plane.shape[0], row)


_FORMS: dict[str, Callable] = {
    "attention_prefill": _attention_prefill,
    "attention_prefill_window": _prefill_form,  # its arguments are the form's
    "attention_decode_window": _attention_decode_window,
    "embedding": _embedding,
    "rmsnorm": _rmsnorm,
    "add_rmsnorm": _add_rmsnorm,
    "linear": _linear,
    "linear_add": lambda *a: _linear(*a, op="linear_add"),
    "swiglu_linear": _swiglu_linear,
    "swiglu_linear_add": lambda *a: _swiglu_linear(*a, op="swiglu_linear_add"),
    "silu_mul": _silu_mul,
    "gelu_mul": _gelu_mul,
    "scale": _scale,
    "head_rmsnorm": _head_rmsnorm,
    "qk_rmsnorm": _head_rmsnorm,  # the same operation under Qwen3's name
    "rope_kv_write": _rope_kv_write,
    "attention_decode_split": _attention_split,
    "attention_decode_merge": _attention_merge,
}
