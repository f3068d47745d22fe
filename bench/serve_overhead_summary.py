"""Medians over repeated bench/serve_overhead.py runs of two trees (before / after).

    uv run python bench/serve_overhead_summary.py --before A1.json A2.json ... \
        --after B1.json B2.json ... --json bench/results/serve_overhead_<name>.json
    uv run python bench/serve_overhead_summary.py --engine-split RUN.json ... --json OUT.json

--engine-split compares the levels of `--engine-process both` runs: one process
(before) against the engine process (after), from the same files.

Per concurrency level and side: the median (and min-max) of server CPU per served token,
its split by thread, the worker's CPU per device launch, the HTTP loop's CPU per SSE
event, tokens per launch, the steady served / NativeModel ratio and the device busy
fraction, with each run's 1-minute load average. Figures only.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from _report import write_json  # bench/ is this script's folder

FIGURES = {
    "server_cpu_us_per_token": lambda lv: lv["served"]["server_cpu_us_per_token"],
    "worker_cpu_us_per_token": lambda lv: lv["served"]["thread_cpu_us_per_token"].get("worker"),
    "loop_cpu_us_per_token": lambda lv: lv["served"]["thread_cpu_us_per_token"].get("http_loop"),
    "engine_channel_cpu_us_per_token":
        lambda lv: lv["served"]["thread_cpu_us_per_token"].get("engine_channel"),
    "served_tokens_per_s": lambda lv: lv["served"]["steady_tokens_per_s"],
    "worker_cpu_us_per_launch": lambda lv: lv["served"]["worker_cpu_us_per_launch"],
    "loop_cpu_us_per_sse_event": lambda lv: lv["served"]["loop_cpu_us_per_sse_event"],
    "tokens_per_launch": lambda lv: lv["served"]["tokens_per_launch"],
    "ratio": lambda lv: lv["ratio"],
    "device_busy": lambda lv: lv["served"]["device_busy"],
}


def side(paths: list[str], engine: str | None = None) -> dict:
    """Medians of the levels in `paths` (only those served with --engine-process `engine`
    when given)."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    levels: dict[int, dict] = {}
    for run in runs:
        for lv in run["levels"]:
            if "served" not in lv:
                continue
            if engine is not None and lv.get("engine_process", "off") != engine:
                continue
            entry = levels.setdefault(lv["concurrency"], {k: [] for k in FIGURES})
            for key, get in FIGURES.items():
                value = get(lv)
                if value is not None:
                    entry[key].append(value)
    out = {}
    for c, entry in sorted(levels.items()):
        out[str(c)] = {k: {"median": statistics.median(v), "min": min(v), "max": max(v),
                           "runs": len(v)} for k, v in entry.items() if v}
    return {"files": paths, "commits": sorted({r["commit"] for r in runs}),
            "loadavg_1m": [r["host"]["loadavg_1m_before"] for r in runs],
            "settings": {k: runs[0].get(k) for k in ("client", "requests_per_client",
                                                     "prompt_tokens", "max_tokens")},
            "levels": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", nargs="+")
    ap.add_argument("--after", nargs="+")
    ap.add_argument("--engine-split", nargs="+", metavar="RUN",
                    help="before = one process, after = --engine-process, from these runs")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    if args.engine_split:
        result = {"label": args.label or "one process (before) / engine process (after)",
                  "before": side(args.engine_split, "off"),
                  "after": side(args.engine_split, "on")}
    elif args.before and args.after:
        result = {"label": args.label, "before": side(args.before), "after": side(args.after)}
    else:
        ap.error("give --before and --after, or --engine-split")
    print(f"{'C':>3}  {'figure':<26} {'before':>10} {'after':>10}   (medians)")
    for c, before in result["before"]["levels"].items():
        after = result["after"]["levels"].get(c, {})
        for key in FIGURES:
            if key in before and key in after:
                print(f"{c:>3}  {key:<26} {before[key]['median']:>10.2f} "
                      f"{after[key]['median']:>10.2f}")
    print("load average (1 min) before runs:", result["before"]["loadavg_1m"],
          result["after"]["loadavg_1m"])
    write_json(args.json, result)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
