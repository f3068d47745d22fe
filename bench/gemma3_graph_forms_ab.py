"""Gemma 3 270M on the cpu backend with and without the graph forms of `scale`,
`head_rmsnorm` and `gelu_mul`, in one process, rounds alternating (a shared machine's load
moves between separate runs by more than the difference).

"without" removes those ops from runtime.ggml_step.GRAPH_OPS before the model loads (a
private table: a bench, not an API), so they run as NumPy between graph runs, as before
the forms existed. Per round and variant (Driver, one request, wall time): a P-token
prefill with one generated token, then the same plus S tokens (decode = the difference /
S). Medians. Figures only; never asserted on.

    OPENBLAS_NUM_THREADS=1 uv run python bench/gemma3_graph_forms_ab.py [--threads 1 2]
    -> bench/results/gemma3_graph_forms_ab.json
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from _report import git_commit, write_json
from gemma3_cpu_vs_llamacpp import NAMESPACE, export

BENCH = Path(__file__).resolve().parent
FORMS = {"scale", "head_rmsnorm", "qk_rmsnorm", "gelu_mul"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(BENCH / "results" / "gemma3_graph_forms_ab.json"))
    args = ap.parse_args()
    load_at_start = os.getloadavg()

    # the runtime after the arguments: --help does not load it
    import helios_serve.runtime.ggml_step as ggml_step
    from helios_serve.runtime.driver import Driver
    from helios_serve.testing.native import load_native
    from helios_tools.core import authorize, load_public_key, open_core

    core_path, public = export()
    core = open_core(core_path, [load_public_key(public)])
    authorize(core, NAMESPACE)
    full = ggml_step.GRAPH_OPS
    models = {}
    for threads in args.threads:
        os.environ["HELIOS_CPU_THREADS"] = str(threads)
        for variant, ops in (("without_forms", full - FORMS), ("with_forms", full)):
            ggml_step.GRAPH_OPS = ops
            models[(threads, variant)] = load_native(core, "cpu")
    ggml_step.GRAPH_OPS = full
    prompt = [[2] + [100 + (7 * j) % 200000 for j in range(args.prompt_tokens - 1)]]
    times = {k: {"prefill": [], "decode": []} for k in models}
    try:
        for _ in range(args.rounds):
            for key, model in models.items():
                t0 = time.perf_counter()
                Driver(model).generate(prompt, 1)
                prefill = time.perf_counter() - t0
                t0 = time.perf_counter()
                Driver(model).generate(prompt, 1 + args.decode_steps)
                total = time.perf_counter() - t0
                times[key]["prefill"].append(args.prompt_tokens / prefill)
                times[key]["decode"].append(args.decode_steps / (total - prefill))
    finally:
        for model in models.values():
            model.close()
    results = {}
    for (threads, variant), t in times.items():
        row = {"prefill_tok_s": round(statistics.median(t["prefill"]), 1),
               "decode_tok_s": round(statistics.median(t["decode"]), 1),
               "prefill_rounds": [round(x, 1) for x in t["prefill"]],
               "decode_rounds": [round(x, 1) for x in t["decode"]]}
        results.setdefault(f"threads_{threads}", {})[variant] = row
        print(f"{threads} thr {variant:14s} prefill {row['prefill_tok_s']:7.1f} tok/s  "
              f"decode {row['decode_tok_s']:6.1f} tok/s")
    result = {
        "commit": git_commit(),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "python": sys.version.split()[0], "load_average_at_start": load_at_start,
                    "load_average": os.getloadavg(),
                    "shared": "may be shared with other jobs: compare within this run"},
        "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "prompt_tokens": args.prompt_tokens, "decode_steps": args.decode_steps,
        "rounds": args.rounds, "statistic": "median", "results": results,
    }
    print(f"wrote {write_json(args.out, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
