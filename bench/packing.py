"""Host cost of shared packing: one step's value bindings written into staging.

Packing runs on the host for every step (graph selection, then `SharedPacking.pack`, then
the launch); with two execution frames it overlaps the device for decode, not for
prefill. This times `pack` for the decode variants at 1 / 8 / 64 rows and a 4-row,
256-token prefill, on the tiny model captured with SmolLM2's serving capacities (the
bindings, and so the packing work, depend on the contract, not on the model's size).

Run: `uv run python bench/packing.py [--steps 2000] [--json bench/out/packing.json]`
-> prints a table (median µs per step, µs per row) and writes JSON. Figures only.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from helios_ignition.recipe import Capacities
from helios_ignition.testing import tiny_core
from helios_serve.engine.plan import (
    PENDING_PLACEHOLDER,
    RowPlan,
    SamplingParams,
    StepKind,
    StepPlan,
)
from helios_serve.runtime import NativeModel

CAPS = Capacities(decode_batch=(1, 8, 64), prefill_tokens=(256,), prefill_rows=8,
                  context_tokens=512, page_tokens=16, prepared_pages=64 * 32)
SAMPLING = SamplingParams(temperature=0.7, top_p=0.9, seed=7)


def decode_plan(rows: int) -> StepPlan:
    return StepPlan(StepKind.DECODE, tuple(
        RowPlan(request_id=s, slot=s, generation=1, tokens=(PENDING_PLACEHOLDER,),
                start_position=100, page_ids=tuple(range(s * 32, s * 32 + 7)), sample=True,
                sampling=SAMPLING) for s in range(rows)))


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--json", default="bench/out/packing.json")
    args = ap.parse_args()
    model = NativeModel.load(tiny_core(caps=CAPS), "cpu")
    cases = [(f"decode b{b}", decode_plan(b)) for b in (1, 8, 64)]
    cases.append(("prefill 4 rows x 64 tokens", prefill_plan()))
    rows = []
    print(f"{'step':28} {'bindings':>8} {'median us':>10} {'us/row':>8}")
    for label, plan in cases:
        name = model.select_graph(plan)
        bindings = len(next(g for g in model.contract.model.graphs if g.name == name).bindings)
        s = time_pack(model, plan, args.steps)
        row = {"step": label, "graph": name, "bindings": bindings, "rows": len(plan.rows),
               "median_us": s * 1e6, "us_per_row": s * 1e6 / len(plan.rows)}
        rows.append(row)
        print(f"{label:28} {bindings:>8} {row['median_us']:>10.1f} {row['us_per_row']:>8.2f}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.processor() or platform.machine(),
                               "python": platform.python_version(), "steps": args.steps,
                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
