"""Before/after host step on a shared host: bench/packing.py over two code trees, alternated.

A shared machine's load moves every figure by tens of percent within a minute (the
2-core CPU machine runs every engineer's tests), so one run of each side compares two
moments, not two codes. This runs THIS checkout's `bench/packing.py` (same script, same
settings) alternately over the packages of `--base` (a worktree of the older commit,
with its own synced `.venv`) and of this checkout, `--runs` times each, and reports per
side the median and the minimum over the runs of each part's median and lower decile
(`p10`): the minimum is the run that other processes disturbed least.

Run: `uv run python bench/packing_ab.py --base /path/to/old/worktree [--runs 8]
[--json bench/out/packing_ab.json]` -> prints the table, writes every run and the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from _report import write_json  # bench/ is this script's folder

HERE = Path(__file__).resolve().parent
PARTS = ("schedule", "submit", "wait", "complete", "total")


def commit(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()


def run_once(tree: Path, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "packing.json"
        subprocess.run(["uv", "run", "--no-sync", "python", str(HERE / "packing.py"),
                        "--steps", str(steps), "--json", str(out)],
                       cwd=tree, check=True, capture_output=True)
        result = json.loads(out.read_text())
    result["loadavg_after"] = os.getloadavg()[0]
    return result


def summary(runs: list[dict]) -> dict:
    out: dict = {"pack": {}, "host_step": {}}
    for j, row in enumerate(runs[0]["rows"]):
        values = [r["rows"][j]["median_us"] for r in runs]
        out["pack"][row["step"]] = {"median": statistics.median(values), "min": min(values)}
    for j, h in enumerate(runs[0]["host_step"]):
        per = {}
        for part in PARTS:
            med = [r["host_step"][j][part] for r in runs]
            low = [r["host_step"][j]["p10"][part] for r in runs]
            per[part] = {"median_of_medians": statistics.median(med), "min_median": min(med),
                         "median_of_p10": statistics.median(low), "min_p10": min(low)}
        out["host_step"][f"b{h['batch']}"] = per
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, type=Path, help="worktree of the older code")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--json", default="bench/out/packing_ab.json")
    args = ap.parse_args()
    trees = {"before": args.base.resolve(), "after": HERE.parent}
    runs: dict[str, list[dict]] = {side: [] for side in trees}
    for _ in range(args.runs):
        for side, tree in trees.items():
            runs[side].append(run_once(tree, args.steps))
    result = {"commits": {side: commit(tree) for side, tree in trees.items()},
              "runs_per_side": args.runs, "cpus": os.cpu_count(),
              "loadavg": [r["loadavg_1m"] for side in runs for r in runs[side]],
              "summary": {side: summary(r) for side, r in runs.items()}, "runs": runs}
    s = result["summary"]
    print(f"before {result['commits']['before']}  after {result['commits']['after']}  "
          f"({args.runs} alternated runs each; load average "
          f"{min(result['loadavg']):.1f}-{max(result['loadavg']):.1f})")
    print(f"{'host step total (us)':22} {'min median':>18} {'median of medians':>20} "
          f"{'min p10':>16}")
    for b in s["before"]["host_step"]:
        cells = []
        for key in ("min_median", "median_of_medians", "min_p10"):
            x, y = (s[side]["host_step"][b]["total"][key] for side in ("before", "after"))
            cells.append(f"{x:6.1f} -> {y:6.1f} {y / x:4.2f}")
        print(f"{b:22} {cells[0]:>18} {cells[1]:>20} {cells[2]:>16}")
    write_json(args.json, result)


if __name__ == "__main__":
    main()
