"""Kernel launches per decode step, before and after layer folding, from the captured
manifests (no GPU, no weights: capture needs only the geometry).

Each decode step is one CUDA graph whose kernels are exactly the manifest's launches of
that decode variant, so counting them is counting the kernels the device runs per step
(issue 17: SmolLM2 at batch 1 is launch-bound, ~3 µs per kernel). For SmolLM2-135M and
the Llama-3.1-8B geometry, at the benchmark's decode batches (bench/gpu_models.py's
capacities), it captures the graphs with the one-launch bisection sampler and no folding
(the default before issue 17), by default (the chunked sampler: three launches instead of
one), and with ``fold_layers`` as well (``ignition export --fold-layers``), and counts
launches per op.

Run: `uv run python bench/launches.py [--json bench/results/launches.json]`
-> prints the table (launches per step, per layer) and writes JSON with the per-op counts.
"""

from __future__ import annotations

import argparse
from collections import Counter

from _report import git_commit, write_json  # bench/ is this script's folder
from helios_ignition.capture.programs import capture
from helios_ignition.checkpoint.synthetic import NAMED_GEOMETRIES
from helios_ignition.families.llama import LlamaShapes
from helios_ignition.recipe import Capacities

BATCHES = (1, 8, 32, 64)


def decode_ops(manifest, batch: int) -> Counter:
    """Launches per reference op of the decode graph for `batch` rows."""
    ops = {k.id: k.reference_op for k in manifest.kernels}
    graph = next(g for g in manifest.graphs if g.name == f"decode_b{batch}")
    return Counter(ops[launch.kernel] for launch in graph.launches)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="bench/results/launches.json")
    args = ap.parse_args()
    caps = Capacities(decode_batch=BATCHES, prefill_tokens=(256, 1024), prefill_rows=8,
                      context_tokens=2048, page_tokens=16, prepared_pages=max(BATCHES) * 128)
    commit = git_commit()
    result: dict = {"commit": commit, "batches": list(BATCHES), "models": {}}
    rows = []
    for name in ("smollm2-135m", "llama-3.1-8b"):
        shapes = LlamaShapes.from_geometry(NAMED_GEOMETRIES[name])
        entry: dict = {"layers": shapes.layers, "variants": {}}
        for key, fold, chunked in (("bisection", False, False), ("default", False, True),
                                   ("folded", True, True)):
            manifest, _ = capture(shapes, caps, "bf16", fold_layers=fold,
                                  chunked_sampling=chunked)
            per_batch = {}
            for b in BATCHES:
                ops = decode_ops(manifest, b)
                per_batch[b] = {"launches": sum(ops.values()), "by_op": dict(sorted(ops.items()))}
            entry["variants"][key] = per_batch
            for b in BATCHES:
                rows.append((name, key, b, per_batch[b]["launches"]))
        result["models"][name] = entry
    print(f"{'model':<14} {'capture':<8} {'batch':>5} {'launches/step':>14} {'per layer':>10}")
    for name, key, b, n in rows:
        layers = result["models"][name]["layers"]
        print(f"{name:<14} {key:<8} {b:>5} {n:>14} {n / layers:>10.2f}")
    for name, entry in result["models"].items():
        b, d, f = (entry["variants"][k][1]["launches"] for k in ("bisection", "default",
                                                                   "folded"))
        print(f"{name}: batch 1: {b} launches per step with the bisection sampler, {d} by "
              f"default (chunked sampler), {f} folded")
    write_json(args.json, result)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
