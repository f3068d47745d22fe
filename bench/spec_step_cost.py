"""Where a speculative step's time goes: device time per graph against the host path.

    python bench/spec_step_cost.py --core SPEC.core --trust KEY.pub --accept NS \
        [--baseline-core DEFAULT.core] --backend cuda --json OUT.json

For each graph asked (default: decode and SPECULATIVE widths 1-4 at batch 1, decode and
width 4 at batch 8), on one core:

    execute_ms   median of `NativeModel.execute(plan)` (pack, upload, one graph launch,
                 wait, completion read: one frame, what a speculative round costs the
                 worker when it cannot schedule ahead)
    device_ms    back-to-back replays of the graph with no host work between them
    host_ms      execute_ms - device_ms (the host's exposed share of a serial step)

and a device ms per op breakdown of the widest batch-1 SPECULATIVE graph and of the
batch-1 decode graph (cuda only: one throwaway CUDA graph per op, bench/gpu_common.py
`profile_ops`). `--baseline-core` adds the same rows for a core without a drafter (the
embedded default's decode). Lanes propose learned drafts only (no copied candidates);
positions sit at --context with arbitrary cache contents: timing, not outputs.

Issue 12/13 context: on the H200 a width-4 step of the SmolLM2 speculative core took
~2.1 ms per step through the scheduler (spec_history_0def058.json: 1,572 tokens/s at
3.29 tokens per step), against 0.82 ms for a default-core decode step; this says how much
of that is device time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_json  # noqa: E402  bench/ is this script's folder


def _open(path: str, trust: str, accept: str, backend: str):
    from helios_serve.bootstrap import Bootstrap
    from helios_serve.testing.native import load_native

    boot = Bootstrap.load(path, [trust], accept)
    return boot, load_native(boot.core, backend)


def _plan(model, kind: StepKind, batch: int, width: int, context: int) -> StepPlan:
    g = model.manifests
    per = min(g.max_pages_per_request, g.num_pages // g.slots)
    pages = -(-(context + width) // g.page_tokens)
    rows = tuple(RowPlan(request_id=i, slot=i, generation=1, tokens=(5,),
                         start_position=context,
                         page_ids=tuple(range(i * per, i * per + pages)), sample=True,
                         sampling=SamplingParams(),
                         query_length=width if kind is StepKind.SPECULATIVE else 0)
                 for i in range(batch))
    return StepPlan(kind, rows)


def time_graph(model, kind: StepKind, batch: int, width: int, context: int,
               steps: int) -> dict:
    """execute() median and back-to-back device time of the graph the plan selects."""
    plan = _plan(model, kind, batch, width, context)
    name = model.select_graph(plan)
    for _ in range(5):
        model.execute(plan)
    samples = []
    for _ in range(steps):
        t0 = time.perf_counter()
        model.execute(plan)
        samples.append(time.perf_counter() - t0)
    execute = statistics.median(samples)
    row = {"graph": name, "kind": kind.value, "batch": batch, "width": width,
           "execute_ms": round(execute * 1e3, 4)}
    backend = model.backend
    if backend.name == "cuda":
        program = next(g for g in model.prepared.manifest.graphs if g.name == name)
        backend.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            backend.launch_only(name)
        backend.synchronize()
        device = (time.perf_counter() - t0) / steps
        row.update(device_ms=round(device * 1e3, 4),
                   host_ms=round((execute - device) * 1e3, 4),
                   launches=len(program.launches),
                   device_us_per_launch=round(device * 1e6 / len(program.launches), 2))
    return row


def bench(model, label: str, graphs, context: int, steps: int, breakdown: bool) -> list[dict]:
    from gpu_common import profile_ops

    rows = []
    for kind, batch, width in graphs:
        row = {"core": label, **time_graph(model, kind, batch, width, context, steps)}
        if breakdown and model.backend.name == "cuda" and batch == 1 and (
                kind is StepKind.DECODE or width == max(w for k, b, w in graphs
                                                        if k is StepKind.SPECULATIVE)):
            row["breakdown"] = profile_ops(model.backend, row["graph"])
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "breakdown"}), flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--core", required=True, help="a core with a drafter (SPECULATIVE)")
    ap.add_argument("--baseline-core", help="a core without one (decode rows only)")
    ap.add_argument("--trust", required=True)
    ap.add_argument("--accept", required=True)
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    graphs = []
    for batch in args.batches:
        graphs.append((StepKind.DECODE, batch, 1))
        widths = args.widths if batch == min(args.batches) else [max(args.widths)]
        graphs += [(StepKind.SPECULATIVE, batch, w) for w in widths]
    result = {"backend": args.backend, "context": args.context, "steps": args.steps,
              "rows": []}
    boot, model = _open(args.core, args.trust, args.accept, args.backend)
    try:
        result["rows"] += bench(model, "speculative", graphs, args.context, args.steps, True)
    finally:
        model.close()
        boot.close()
    if args.baseline_core:
        boot, model = _open(args.baseline_core, args.trust, args.accept, args.backend)
        try:
            result["rows"] += bench(model, "default", [(StepKind.DECODE, b, 1)
                                                       for b in args.batches],
                                    args.context, args.steps, True)
        finally:
            model.close()
            boot.close()
    print(f"{'core':12} {'graph':18} {'execute ms':>10} {'device ms':>10} {'host ms':>8} "
          f"{'launches':>8}")
    for r in result["rows"]:
        print(f"{r['core']:12} {r['graph']:18} {r['execute_ms']:10.3f} "
              f"{r.get('device_ms', float('nan')):10.3f} {r.get('host_ms', float('nan')):8.3f} "
              f"{r.get('launches', 0):8d}")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
