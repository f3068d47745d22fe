"""Host cost of one serving step: shared packing alone, and the whole host step.

Packing runs on the host for every step (graph selection, then `SharedPacking.pack`, then
the launch); with two execution frames it overlaps the device for decode, not for
prefill. Both tables use the tiny model captured with decode capacities 1 / 8 / 64 / 256
(the bindings, and so the host work, depend on the contract, not on the model's size).

    pack       `SharedPacking.pack` of a fixed decode plan at 1 / 8 / 64 / 256 rows, the
               same plans carrying their RowColumns (as the scheduler's plain decode
               plans do: "columns"), and a 4-row, 256-token prefill (page tables already
               uploaded)
    host step  the worker's scheduling path in steady decode with B live requests, two
               frames, decode submitted ahead: `Scheduler.schedule` + `NativeModel.submit`
               (graph selection, packing, the launch call) + `NativeModel.wait` +
               `Scheduler.complete`, over a device that takes no time
               (helios_serve.testing.paced); the output pipeline is not included
               (bench/serve_overhead.py measures it). Targets: <= 50 µs at batch 1,
               <= 300 µs at batch 64 (issue 17) and at 256 rows (issue 27); on the GPU the launch call and the
               page-table uploads add the driver's cost (bench/gpu_models.py host_us).

Times are wall-clock medians (`time.perf_counter`, 0.1 µs a reading; the thread CPU
clock costs about 6 µs a reading on the shared VM, more than the parts it would time), so
other processes on a shared host inflate them: the JSON records the load average, and
each host-step part's lower decile (`p10`) beside its median.

Run: `uv run python bench/packing.py [--steps 2000] [--json bench/out/packing.json]`
-> prints both tables (median µs) and writes JSON. Figures only.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np
from _report import git_commit, write_json  # bench/ is this script's folder
from helios_ignition.recipe import Capacities
from helios_ignition.testing import tiny_core
from helios_serve.engine.plan import (
    PENDING_PLACEHOLDER,
    RowColumns,
    RowPlan,
    SamplingParams,
    StepKind,
    StepPlan,
)
from helios_serve.runtime import NativeModel
from helios_serve.scheduler import SchedRequest, Scheduler
from helios_serve.testing.native import load_native
from helios_serve.testing.paced import paced_model

CAPS = Capacities(decode_batch=(1, 8, 64, 256), prefill_tokens=(256,), prefill_rows=8,
                  context_tokens=512, page_tokens=16, prepared_pages=256 * 32)
BATCHES = (1, 8, 64, 256)
SAMPLING = SamplingParams(temperature=0.7, top_p=0.9, seed=7)


def decode_plan(rows: int) -> StepPlan:
    return StepPlan(StepKind.DECODE, tuple(
        RowPlan(request_id=s, slot=s, generation=1, tokens=(PENDING_PLACEHOLDER,),
                start_position=100, page_ids=tuple(range(s * 32, s * 32 + 7)), sample=True,
                sampling=SAMPLING) for s in range(rows)))


def row_count(plan: StepPlan) -> int:
    """Rows of `plan` without building the rows a plan of a newer tree leaves unbuilt
    (StepPlan.row_count; an older tree has no such property)."""
    return plan.row_count if hasattr(plan, "row_count") else len(plan.rows)


def with_columns(plan: StepPlan) -> StepPlan:
    """`plan` carrying its rows' RowColumns, as Scheduler._build_plain attaches them to a
    windowed core's plans (rows built; the fed tokens where this tree's columns hold
    them)."""
    rows = plan.rows
    values = (rows, np.array([r.slot for r in rows], np.intp),
              np.array([r.generation for r in rows], np.int64),
              np.array([r.start_position for r in rows], np.int64),
              np.array([-1 if r.sampling.logprobs is None else r.sampling.logprobs
                        for r in rows], np.int64),
              tuple(r.sampling for r in rows))
    try:
        columns = RowColumns(*values, request_ids=[r.request_id for r in rows],
                             fed=np.array([r.tokens[0] for r in rows], np.int64))
    except TypeError:  # an older tree's RowColumns
        columns = RowColumns(*values)
    return StepPlan(plan.kind, rows, columns=columns)


def prefill_plan() -> StepPlan:
    return StepPlan(StepKind.PREFILL, tuple(
        RowPlan(request_id=s, slot=s, generation=1, tokens=tuple(range(3, 67)),
                start_position=64, page_ids=tuple(range(s * 32, s * 32 + 8)), sample=True,
                sampling=SAMPLING) for s in range(4)))


def time_pack(model: NativeModel, plan: StepPlan, steps: int) -> float:
    """Median seconds of one `pack` of `plan` (page tables already uploaded)."""
    name = model.select_graph(plan)
    program = model._programs[name]
    model.packing.pack(name, plan, program.batch_capacity, program.token_capacity)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        model.packing.pack(name, plan, program.batch_capacity, program.token_capacity)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def host_steps(batch: int, steps: int) -> dict:
    """Median µs of each part of the steady-state decode step at `batch` live requests."""
    model = paced_model(tiny_core(caps=CAPS), lambda graph: 0.0, range(3, 90))
    sched = Scheduler(model.manifests, frames=model.frames, device_pending=model.device_pending)
    budget = CAPS.context_tokens - 100
    for i in range(batch):
        sched.add(SchedRequest(request_id=i, prompt_tokens=tuple(range(3, 103)),
                               max_output_tokens=budget, sampling=SAMPLING))
    inflight: list = []
    parts: dict[str, list[float]] = {"schedule": [], "submit": [], "wait": [], "complete": []}
    clock = time.perf_counter
    while len(parts["complete"]) < steps:
        if sched.can_schedule_ahead():
            t0 = clock()
            plan = sched.schedule()
            t1 = clock()
            if plan is not None:
                inflight.append((plan, model.submit(plan)))
                t2 = clock()
                steady = plan.kind.value == "decode" and row_count(plan) == batch
                if steady:
                    parts["schedule"].append(t1 - t0)
                    parts["submit"].append(t2 - t1)
                if sched.can_schedule_ahead():
                    continue
        plan, ticket = inflight.pop(0)
        t0 = clock()
        sampled = model.wait(ticket)
        t1 = clock()
        sched.complete(plan, sampled)
        t2 = clock()
        if plan.kind.value == "decode" and row_count(plan) == batch:
            parts["wait"].append(t1 - t0)
            parts["complete"].append(t2 - t1)
        if sched.stats().running and all(  # restart before the output budget runs out
                s.num_output_tokens > budget - 8 for s in sched.live.running):
            break
    out = {k: statistics.median(v) * 1e6 for k, v in parts.items()}
    out["total"] = sum(out.values())
    out["steps"] = len(parts["complete"])
    # Lower decile of each part: what a step costs when no other process takes the core
    # (the median moves with the shared host's load; compare runs by both).
    low = {k: statistics.quantiles(v, n=10)[0] * 1e6 for k, v in parts.items()}
    out["p10"] = {**low, "total": sum(low.values())}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--json", default="bench/out/packing.json")
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES),
                    help="decode rows (each one of CAPS' decode capacities)")
    args = ap.parse_args()
    model = load_native(tiny_core(caps=CAPS), "cpu")
    cases = [(f"decode b{b}", decode_plan(b)) for b in args.batches]
    cases += [(f"decode b{b} columns", with_columns(decode_plan(b))) for b in args.batches]
    cases.append(("prefill 4 rows x 64 tokens", prefill_plan()))
    rows = []
    print(f"{'step':28} {'bindings':>8} {'median us':>10} {'us/row':>8}")
    for label, plan in cases:
        name = model.select_graph(plan)
        bindings = len(model.prepared.graphs[name].bindings)
        s = time_pack(model, plan, args.steps)
        row = {"step": label, "graph": name, "bindings": bindings, "rows": len(plan.rows),
               "median_us": s * 1e6, "us_per_row": s * 1e6 / len(plan.rows)}
        rows.append(row)
        print(f"{label:28} {bindings:>8} {row['median_us']:>10.1f} {row['us_per_row']:>8.2f}")
    print(f"\n{'host step (median us)':24} {'schedule':>9} {'submit':>8} {'wait':>6} "
          f"{'complete':>9} {'total':>7}")
    host = []
    for batch in args.batches:
        h = {"batch": batch, **host_steps(batch, min(args.steps, 300))}
        host.append(h)
        print(f"{'decode b' + str(batch):24} {h['schedule']:>9.1f} {h['submit']:>8.1f} "
              f"{h['wait']:>6.1f} {h['complete']:>9.1f} {h['total']:>7.1f}")
    write_json(args.json, {"commit": git_commit(),
                           "machine": platform.processor() or platform.machine(),
                           "python": platform.python_version(), "steps": args.steps,
                           "cpus": os.cpu_count(), "loadavg_1m": os.getloadavg()[0],
                           "rows": rows, "host_step": host})


if __name__ == "__main__":
    main()
