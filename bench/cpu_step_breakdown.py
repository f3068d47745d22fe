"""Where a decode step (or a prefill) of the ``gguf`` core goes, per operation.

ggml times operations only in debug builds, so this script times the real step's pieces
itself, on SmolLM2-135M-Instruct's ``--weight-dtype gguf`` core (exported into bench/out/
when absent), cpu backend, whole-program graphs, 1 ggml thread by default:

    step       Driver.generate: B rows of a PROMPT-token prompt, then GEN decode steps;
               the step period is the median time from one decode program call's start
               to the next's (the driver's and NativeModel's host work included); each
               decode program call is timed by an instrumented copy of
               StepPrograms.runner's loop, split into host values (the graph run's
               `choose`: token ids, cache rows, masks), the graph's compute
               (ggml_graph_compute) and the launches after it (NumPy sampling)
    nodes      after the loop, the last decode graph computed node by node: the graph's
               node array is narrowed to one node (struct ggml_cgraph's n_nodes and nodes
               fields) and computed with the step's own plan, REPEATS sweeps over all
               nodes, the median per node kept. Nodes are grouped by op (ggml_op_desc)
               and, for mul_mat, by the weight it reads (type and shape: q/o, k/v,
               gate/up, down, the LM head; f32 operands = attention's two products)

A node computed alone pays a ctypes call and a plan walk (the `NONE`/view nodes show that
cost); the table reports the sum over nodes beside the whole graph's time. The machine may
be shared: the JSON records the load average before and after; compare within one run.
This reads the backend's private fields (`_step_programs`, `_programs`): a bench, not an
interface. Figures only; never asserted on.

With ``--prefill`` the same is done for the prefill program instead: one row of a
PROMPT-token prompt (llama-bench's pp PROMPT), each call of the prefill program timed as
above (its period is the program call: the driver's work around it is not a step), the
last prefill graph profiled node by node, batch 1 only.

Run: `HELIOS_CPU_THREADS=1 uv run python bench/cpu_step_breakdown.py [--batches 1 8]
[--prompt 128] [--gen 32] [--repeats 5] [--prefill]` ->
bench/results/cpu_step_breakdown_t1.json
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from _report import git_commit, write_json  # bench/ is this script's folder
from cpu_quantized_step import NAMESPACE, export

BENCH = Path(__file__).resolve().parent
# struct ggml_tensor (ggml.h): type at 0, ne[4] at 16, op at 80, src[10] at 152.
_NE, _SRC = 16, 152
# struct ggml_cgraph (ggml-impl.h): int size, n_nodes, n_leafs; then the nodes pointer.
_N_NODES, _NODES = 4, 16
# weight shapes [K, N] (ggml ne0, ne1) -> the matrix they are in SmolLM2-135M
MATRICES = {(576, 960): "wqkv (q|k|v fused)", (576, 576): "q / o", (576, 192): "k / v",
            (576, 3072): "w_gate_up (fused)", (576, 1536): "gate / up",
            (1536, 576): "down", (576, 49152): "LM head"}


def _i64(addr: int, n: int) -> list[int]:
    return list((ctypes.c_int64 * n).from_address(addr))


def _ptr(addr: int) -> int:
    return ctypes.c_void_p.from_address(addr).value or 0


class Instrumented:
    """A decode program run as StepPrograms.runner runs it, with its pieces timed."""

    def __init__(self, steps, name: str):
        self.steps, self.plan = steps, steps._programs[name]
        self.times: dict[str, list[float]] = defaultdict(list)
        self.last: list[tuple[int, object, int]] = []  # the last call's graphs, in order
        self.started: list[float] = []

    def __call__(self) -> None:
        steps, g, cpu = self.steps, self.steps.lib, self.steps.lib.cpu
        start = time.perf_counter()
        self.started.append(start)
        host = compute = after = 0.0
        seen_graph = False
        graphs = []
        for item in self.plan:
            t0 = time.perf_counter()
            if not hasattr(item, "choose"):  # a launch without a graph form
                fn, args = item
                fn(*args)
                dt = time.perf_counter() - t0
                if seen_graph:
                    after += dt
                else:
                    host += dt
                continue
            bucket = item.choose()
            t1 = time.perf_counter()
            host += t1 - t0
            if bucket is None:
                raise SystemExit("a decode step left the graphs (launch path): not measured")
            graph, plan_ptr = item.graphs[bucket]
            if steps._current != graph:
                if not g.gallocr_alloc_graph(steps._galloc, graph):
                    raise RuntimeError("ggml-alloc could not place a step graph")
                steps._current = graph
            cpu.ggml_graph_compute(graph, plan_ptr)
            compute += time.perf_counter() - t1
            seen_graph = True
            graphs.append((graph, plan_ptr, bucket))
        self.last = graphs
        self.times["host_values"].append(host)
        self.times["graph_compute"].append(compute)
        self.times["after_graph_numpy"].append(after)
        self.times["program_call"].append(time.perf_counter() - start)


def classify(base, node: int) -> str:
    """The row of the table a graph node belongs to."""
    op = base.ggml_op_desc(node).decode()
    if op != "MUL_MAT":
        return op
    w = _ptr(node + _SRC)
    wtype = base.ggml_type_name(ctypes.c_int.from_address(w).value).decode()
    ne = _i64(w + _NE, 4)
    if wtype == "f32":
        return "MUL_MAT attention (f32)"
    return f"MUL_MAT {MATRICES.get((ne[0], ne[1]), f'{ne[0]}x{ne[1]}')} ({wtype})"


def node_profile(steps, graph: int, plan_ptr, repeats: int) -> tuple[dict, float]:
    """Per-node median seconds grouped by class, and the whole graph's median seconds."""
    base, cpu = steps.lib.base, steps.lib.cpu
    n = ctypes.c_int.from_address(graph + _N_NODES)
    nodes_field = ctypes.c_void_p.from_address(graph + _NODES)
    total, nodes_ptr = n.value, nodes_field.value
    if total != steps.lib.graph_n_nodes(graph):
        raise SystemExit("struct ggml_cgraph layout differs from this script's offsets")
    nodes = [_ptr(nodes_ptr + 8 * i) for i in range(total)]
    per_node: list[list[float]] = [[] for _ in range(total)]
    whole = []
    try:
        for _ in range(repeats):
            n.value, nodes_field.value = total, nodes_ptr
            t0 = time.perf_counter()
            cpu.ggml_graph_compute(graph, plan_ptr)
            whole.append(time.perf_counter() - t0)
            n.value = 1
            for i in range(total):
                nodes_field.value = nodes_ptr + 8 * i
                t0 = time.perf_counter()
                cpu.ggml_graph_compute(graph, plan_ptr)
                per_node[i].append(time.perf_counter() - t0)
    finally:
        n.value, nodes_field.value = total, nodes_ptr
    groups: dict[str, dict] = {}
    for node, samples in zip(nodes, per_node, strict=True):
        key = classify(base, node)
        entry = groups.setdefault(key, {"nodes": 0, "ms": 0.0})
        entry["nodes"] += 1
        entry["ms"] += statistics.median(samples) * 1e3
    return groups, statistics.median(whole)


def measure(model, batch: int, prompt: int, gen: int, repeats: int,
            kind: str = "decode") -> dict:
    """One row of the table: ``kind`` "decode" times GEN decode steps of B rows, "prefill"
    the prefill program's calls for B rows of a PROMPT-token prompt."""
    from helios_serve.runtime.driver import Driver  # after HELIOS_CPU_THREADS is set

    backend = model.backend
    steps = backend._step_programs
    decode = [name for name in steps.programs() if name.startswith(kind)]
    originals = dict(backend._steps)
    tools = {name: Instrumented(steps, name) for name in decode}
    prompts = [[1 + (7 * j + 13 * r) % 4000 for j in range(prompt)] for r in range(batch)]
    Driver(model).generate(prompts, 4)  # warm: graphs placed, pages touched
    backend._steps.update(tools)
    try:
        if kind == "decode":
            Driver(model).generate(prompts, 1 + gen)
        else:  # three prefills of different prompts (no prefix reuse between them)
            for rep in range(3):
                Driver(model).generate([[1 + (t + 101 * (rep + 1)) % 4000 for t in p]
                                        for p in prompts], 1)
    finally:
        backend._steps.update(originals)
    used = [t for t in tools.values() if t.times["graph_compute"]]
    tool = max(used, key=lambda t: len(t.times["graph_compute"]))
    pieces = {k: statistics.median(v) * 1e3 for k, v in tool.times.items()}
    # a decode step's period: start to start of consecutive decode calls (the driver's
    # and NativeModel's host work between them included)
    step_s = (statistics.median(b - a for a, b in zip(tool.started, tool.started[1:],
                                                                 strict=False))
              if kind == "decode" else pieces["program_call"] / 1e3)
    tokens = batch if kind == "decode" else batch * prompt
    # every graph of the program's last call (a program whose launches leave the graphs
    # at some operation runs as several graphs), profiled node by node and summed
    groups, whole = {}, 0.0
    for graph, plan_ptr, _ in tool.last:
        if steps._current != graph:
            if not steps.lib.gallocr_alloc_graph(steps._galloc, graph):
                raise RuntimeError("ggml-alloc could not place a step graph")
            steps._current = graph
        part, part_whole = node_profile(steps, graph, plan_ptr, repeats)
        whole += part_whole
        for key, entry in part.items():
            total = groups.setdefault(key, {"nodes": 0, "ms": 0.0})
            total["nodes"] += entry["nodes"]
            total["ms"] += entry["ms"]
    bucket = tool.last[-1][2]
    return {
        "batch": batch, "kind": kind,
        "decode_program": next(k for k, v in tools.items() if v is tool),
        "context_bucket": bucket, "graphs": len(tool.last),
        "step_ms": round(step_s * 1e3, 2),
        "tokens_per_s": round(tokens / step_s, 1),
        "pieces_ms": {k: round(v, 3) for k, v in pieces.items()},
        "graph_nodes": sum(g["nodes"] for g in groups.values()),
        "graph_whole_ms": round(whole * 1e3, 3),
        "node_sum_ms": round(sum(g["ms"] for g in groups.values()), 3),
        "ops": {k: {"nodes": v["nodes"], "ms": round(v["ms"], 3)}
                for k, v in sorted(groups.items(), key=lambda kv: -kv[1]["ms"])},
    }


def table(results: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in results for k in r["ops"]))
    keys.sort(key=lambda k: -max(r["ops"].get(k, {"ms": 0})["ms"] for r in results))
    head = "| op | " + " | ".join(f"B={r['batch']} nodes | B={r['batch']} ms"
                                  for r in results)
    if len(results) == 2:
        head += " | ratio"
    lines = [head + " |", "|" + "---|" * (head.count("|"))]

    def row(label: str, vals: list[float], counts: list[str]) -> str:
        cells = " | ".join(f"{c} | {v:.3f}" for c, v in zip(counts, vals, strict=True))
        ratio = (f" | {vals[1] / vals[0]:.2f}" if len(vals) == 2 and vals[0] else
                 (" | -" if len(vals) == 2 else ""))
        return f"| {label} | {cells}{ratio} |"

    for k in keys:
        lines.append(row(k, [r["ops"].get(k, {"ms": 0.0})["ms"] for r in results],
                         [str(r["ops"].get(k, {"nodes": 0})["nodes"]) for r in results]))
    lines.append(row("sum of nodes alone", [r["node_sum_ms"] for r in results],
                     [str(r["graph_nodes"]) for r in results]))
    lines.append(row("whole graph", [r["graph_whole_ms"] for r in results],
                     ["" for _ in results]))
    for piece in ("host_values", "graph_compute", "after_graph_numpy", "program_call"):
        lines.append(row(f"step: {piece}", [r["pieces_ms"][piece] for r in results],
                         ["" for _ in results]))
    lines.append(row("step period (decode call to call; prefill: the call)", [r["step_ms"] for r in results],
                     ["" for _ in results]))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prefill", action="store_true",
                    help="profile the prefill program (batch 1) instead of decode steps")
    ap.add_argument("--out", default=str(BENCH / "results" / "cpu_step_breakdown_t1.json"))
    a = ap.parse_args()
    os.environ.setdefault("HELIOS_CPU_THREADS", "1")
    os.environ.pop("HELIOS_CPU_STEP_GRAPHS", None)
    # the runtime after the environment is set (the backend reads HELIOS_CPU_THREADS)
    from helios_serve.runtime.ggml_lib import libraries, simd_features
    from helios_serve.testing.native import load_native
    from helios_tools.core import authorize, load_public_key, open_core

    base, _ = libraries()
    base.ggml_op_desc.argtypes, base.ggml_op_desc.restype = [ctypes.c_void_p], ctypes.c_char_p
    base.ggml_type_name.argtypes, base.ggml_type_name.restype = [ctypes.c_int], ctypes.c_char_p
    core_path, public = export("gguf")
    core = open_core(core_path, [load_public_key(public)])
    authorize(core, NAMESPACE)
    load_before = os.getloadavg()
    model = load_native(core, "cpu")
    results = []
    kind = "prefill" if a.prefill else "decode"
    for b in ([1] if a.prefill else a.batches):
        r = measure(model, b, a.prompt, a.gen, a.repeats, kind)
        results.append(r)
        print(f"batch {b}: {r['step_ms']} ms/step, {r['tokens_per_s']} tok/s", flush=True)
    model.close()
    print(table(results))
    write_json(a.out, {
        "bench": "cpu_step_breakdown", "commit": git_commit(),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": os.cpu_count(), "python": sys.version.split()[0],
                    "load_average_before": [round(x, 2) for x in load_before],
                    "load_average_after": [round(x, 2) for x in os.getloadavg()],
                    "note": "2-core machine shared with other agents' jobs"},
        "threads": int(os.environ["HELIOS_CPU_THREADS"]), "ggml_simd": simd_features(),
        "workload": {"kind": kind, "prompt_tokens": a.prompt, "decode_steps": a.gen,
                     "node_repeats": a.repeats},
        "results": results, "table": table(results).splitlines(),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
