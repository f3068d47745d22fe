"""The cpu backend's step time with quantized weights (``--weight-dtype gguf``: products
through ggml) against the f32 core (NumPy reference ops), same run.

Both cores of SmolLM2-135M-Instruct are exported into bench/out/ when absent (library
entry point). For each round and each core, alternating (a busy host slows both alike):

    prefill   B prompts of P tokens, one generated token (Driver.generate, wall time)
    decode    the same plus S tokens: (that time - prefill's) / S per decode step

Tokens/s: B x P / prefill, B / decode step. Medians over rounds; the JSON records the
ggml thread count (HELIOS_CPU_THREADS, default the cores), BLAS threads, machine and
commit. Figures only; never asserted on.

Run: `OPENBLAS_NUM_THREADS=1 uv run python bench/cpu_quantized_step.py [--batch 1]
[--prompt-tokens 64] [--decode-steps 16] [--rounds 3]` -> bench/results/cpu_quantized_step.json
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

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
OUT = BENCH / "out"
RECIPE = REPO / "recipes" / "smollm2_135m_instruct.py"
NAMESPACE = "bench.local/models"


def export(weight_dtype: str) -> tuple[Path, Path]:
    """(core, public key) of the SmolLM2 core in `weight_dtype`, exported when absent."""
    from helios_ignition.export import export_core
    from helios_tools.core import generate_key, write_key_pair

    OUT.mkdir(exist_ok=True)
    key, public = OUT / "quantized-step.key", OUT / "quantized-step.key.pub"
    if not public.is_file():
        write_key_pair(generate_key(), key)
    core = OUT / f"smollm2-{weight_dtype}.core"
    if not core.is_file():
        export_core(RECIPE, checkpoint="smollm2", key_path=key, namespace=NAMESPACE, out=core,
                    weight_dtype=weight_dtype)
    return core, public


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(BENCH / "results" / "cpu_quantized_step.json"))
    args = ap.parse_args()

    from helios_serve.runtime.driver import Driver
    from helios_serve.runtime.ggml_lib import default_threads, simd_features
    from helios_serve.testing.native import load_native
    from helios_tools.core import authorize, load_public_key, open_core

    models = {}
    for dtype in ("gguf", "f32"):
        core_path, public = export(dtype)
        core = open_core(core_path, [load_public_key(public)])
        authorize(core, NAMESPACE)
        models[dtype] = load_native(core, "cpu")
    prompts = [[1 + (7 * i + j) % 4000 for j in range(args.prompt_tokens)]
               for i in range(args.batch)]
    times: dict[str, dict[str, list[float]]] = {d: {"prefill": [], "decode": []}
                                                for d in models}
    for _ in range(args.rounds):
        for dtype, model in models.items():
            t0 = time.perf_counter()
            Driver(model).generate(prompts, 1)
            prefill = time.perf_counter() - t0
            t0 = time.perf_counter()
            Driver(model).generate(prompts, 1 + args.decode_steps)
            total = time.perf_counter() - t0
            times[dtype]["prefill"].append(prefill)
            times[dtype]["decode"].append((total - prefill) / args.decode_steps)
    rows = {}
    for dtype, t in times.items():
        prefill, decode = statistics.median(t["prefill"]), statistics.median(t["decode"])
        rows[dtype] = {"prefill_s": round(prefill, 4), "decode_step_ms": round(decode * 1e3, 2),
                       "prefill_tok_s": round(args.batch * args.prompt_tokens / prefill, 1),
                       "decode_tok_s": round(args.batch / decode, 1),
                       "ggml_graphs": models[dtype].backend.counters.get("ggml_graphs", 0)}
        print(f"{dtype:5s} prefill {rows[dtype]['prefill_tok_s']:8.1f} tok/s   decode "
              f"{rows[dtype]['decode_step_ms']:7.2f} ms/step ({rows[dtype]['decode_tok_s']} "
              "tok/s)")
    for model in models.values():
        model.close()
    result = {
        "commit": git_commit(),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "python": sys.version.split()[0],
                    "load_average": os.getloadavg(),
                    "shared": "may be shared with other jobs: compare within this run"},
        "ggml_threads": default_threads(), "ggml_simd": simd_features(),
        "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "batch": args.batch, "prompt_tokens": args.prompt_tokens,
        "decode_steps": args.decode_steps, "rounds": args.rounds, "statistic": "median",
        "cores": rows,
        "decode_speedup": round(rows["f32"]["decode_step_ms"] / rows["gguf"]["decode_step_ms"],
                                2),
    }
    print(f"wrote {write_json(args.out, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
