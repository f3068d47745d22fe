"""llama.cpp and the Helios cpu backend on the same GGUF, same threads, same run.

llama.cpp is an outside peer, never a dependency: build it yourself (any release; e.g.
``cmake -B build && cmake --build build --target llama-bench`` in its source tree, or a
packaged build that ships ``llama-bench``) and name its binary folder with
``--llama-bin`` or ``LLAMA_CPP_BIN``. llama-bench runs with ``--repack 0``: its AMX and
repacked-weight buffers are off (the AMX path crashes where the kernel grants no AMX
tiles, and Helios reads the blocks as the GGUF stores them, as ggml's plain kernels do).

Measured, alternating llama.cpp and Helios each round (a busy host slows both alike):

    llama.cpp  llama-bench -p PROMPT -n GEN -t THREADS (pp PROMPT and tg GEN, tokens/s)
    helios     the ``--weight-dtype gguf`` core of the recipe (exported into bench/out/
               when absent), NativeModel through runtime.driver.Driver, batch 1:
               prefill of PROMPT tokens (one step, wall time) and GEN decode steps
               after a one-token prompt (tg, as llama-bench's: an empty context); in a
               fresh process each round, with the wheel's ggml ("helios") and, where
               the llama.cpp folder has its own libggml-cpu.so, with that native build
               too ("helios_native_ggml", HELIOS_GGML_LIB): same kernels as the peer;
               and the launch-by-launch path ("helios_launch_path")

Tokens/s are medians over rounds; ratio = Helios / llama.cpp. The JSON records the
commit, machine, load average, threads and ggml's SIMD build. Figures only; never asserted.

Run: `uv run python bench/cpu_peer.py --llama-bin /path/to/llama.cpp/build/bin
[--threads 2] [--prompt 256] [--gen 64] [--rounds 3]` -> bench/results/cpu_peer.json
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
from cpu_quantized_step import NAMESPACE, export

BENCH = Path(__file__).resolve().parent


def llama_bench(binary: Path, gguf: Path, threads: int, prompt: int, gen: int) -> dict:
    """One llama-bench run: {"pp": tokens/s, "tg": tokens/s} (its own mean of 3 reps)."""
    cmd = [str(binary), "-m", str(gguf), "-t", str(threads), "-p", str(prompt),
           "-n", str(gen), "-r", "3", "--repack", "0", "-o", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"llama-bench failed ({done.returncode}): {done.stderr[-400:]}")
    rows = json.loads(done.stdout)
    out = {}
    for row in rows:
        key = "pp" if row["n_prompt"] and not row["n_gen"] else "tg"
        out[key] = float(row["avg_ts"])
        out["build"] = f"{row.get('build_commit')} ({row.get('build_number')})"
        out["cpu"] = row.get("cpu_info")
    return out


def helios_round(model, prompt: int, gen: int) -> dict:
    """{"pp": tokens/s of one PROMPT-token prefill, "tg": GEN decode steps per second}."""
    from helios_serve.runtime.driver import Driver  # the child alone loads the runtime

    tokens = [1 + (7 * j) % 4000 for j in range(prompt)]
    t0 = time.perf_counter()
    Driver(model).generate([tokens], 1)
    pp = prompt / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    Driver(model).generate([[1]], 1)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    Driver(model).generate([[1]], 1 + gen)
    tg = gen / (time.perf_counter() - t0 - first)
    return {"pp": pp, "tg": tg}


def helios_child(prompt: int, gen: int) -> int:
    """One Helios round in this process (ggml from HELIOS_GGML_LIB or the wheel): loads
    the gguf core, warms it, prints {"pp", "tg", "simd", "lib", "step_graphs"} as JSON."""
    # the child alone loads the runtime (its ggml from the environment the parent set)
    from helios_serve.runtime.ggml_lib import library_folder, simd_features
    from helios_serve.testing.native import load_native
    from helios_tools.core import authorize, load_public_key, open_core

    core_path, public = export("gguf")
    core = open_core(core_path, [load_public_key(public)])
    authorize(core, NAMESPACE)
    model = load_native(core, "cpu")
    helios_round(model, 16, 4)  # warm: first touch of the weights, graphs placed
    got = helios_round(model, prompt, gen)
    got.update(simd=simd_features(), lib=library_folder(),
               step_graphs=model.backend.counters.get("ggml_step_graphs", 0))
    model.close()
    print(json.dumps(got))
    return 0


def helios_run(prompt: int, gen: int, threads: int, setup: dict[str, str]) -> dict:
    """A Helios round in a fresh process (the ggml libraries load once per process) with
    the environment `setup` adds."""
    env = dict(os.environ, HELIOS_CPU_THREADS=str(threads))
    env.pop("HELIOS_GGML_LIB", None)
    env.pop("HELIOS_CPU_STEP_GRAPHS", None)
    env.update(setup)
    done = subprocess.run([sys.executable, __file__, "--child", "--prompt", str(prompt),
                           "--gen", str(gen)], capture_output=True, text=True, env=env,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"Helios round failed: {done.stderr[-600:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_CPP_BIN"),
                    help="folder holding llama-bench (default: $LLAMA_CPP_BIN)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(BENCH / "results" / "cpu_peer.json"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return helios_child(args.prompt, args.gen)
    if not args.llama_bin:
        ap.error("name llama.cpp's binary folder: --llama-bin or LLAMA_CPP_BIN")
    binary = Path(args.llama_bin) / "llama-bench"
    if not binary.is_file():
        ap.error(f"no llama-bench in {args.llama_bin}")
    from helios_ignition.checkpoint import smollm2_gguf_path  # after parsing: start-up

    gguf = Path(smollm2_gguf_path())
    export("gguf")  # once, before the rounds
    # Helios with the wheel's ggml (what it ships), and with llama.cpp's own ggml build
    # when the folder has one (the same kernels as the peer: separates the graph from
    # the kernel library's SIMD build).
    # The launch-by-launch path (HELIOS_CPU_STEP_GRAPHS=0) shows what the graphs buy.
    variants: dict[str, dict[str, str]] = {"helios": {},
                                           "helios_launch_path": {"HELIOS_CPU_STEP_GRAPHS": "0"}}
    if (Path(args.llama_bin) / "libggml-cpu.so").is_file():
        variants["helios_native_ggml"] = {"HELIOS_GGML_LIB":
                                          str(Path(args.llama_bin).resolve())}
    runs: dict[str, dict[str, list[float]]] = {
        name: {"pp": [], "tg": []} for name in ["llama.cpp", *variants]}
    info: dict = {}
    for r in range(args.rounds):
        peer = llama_bench(binary, gguf, args.threads, args.prompt, args.gen)
        info["llama.cpp"] = {"build": peer["build"], "cpu": peer["cpu"], "repack": 0}
        got = {"llama.cpp": peer}
        for name, setup in variants.items():
            got[name] = helios_run(args.prompt, args.gen, args.threads, setup)
            info[name] = {"env": setup, "ggml": got[name]["lib"],
                          "ggml_simd": got[name]["simd"],
                          "ggml_step_graphs": got[name]["step_graphs"]}
        for name, row in got.items():
            for key in ("pp", "tg"):
                runs[name][key].append(row[key])
        print(f"round {r}: " + " | ".join(f"{n} pp{args.prompt} {g['pp']:6.1f} "
                                          f"tg{args.gen} {g['tg']:5.1f}"
                                          for n, g in got.items()), flush=True)
    med = {name: {key: round(statistics.median(v), 1) for key, v in d.items()}
           for name, d in runs.items()}
    result = {
        "commit": git_commit(),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "cpu": info["llama.cpp"].get("cpu"), "python": sys.version.split()[0],
                    "load_average": os.getloadavg(),
                    "shared": "may be shared with other jobs: compare within this run"},
        "gguf": gguf.name, "threads": args.threads, "prompt_tokens": args.prompt,
        "gen_tokens": args.gen, "rounds": args.rounds, "statistic": "median",
        "helios_core": "--weight-dtype gguf, whole-program ggml graphs (runtime.ggml_step)",
        "setups": info,
        "tokens_per_s": med,
        "per_round": runs,
        "ratio_to_llama_cpp": {name: {key: round(med[name][key] / med["llama.cpp"][key], 2)
                                      for key in ("pp", "tg")} for name in variants},
    }
    print(f"median tokens/s {med}  ratio {result['ratio_to_llama_cpp']}")
    print(f"wrote {write_json(args.out, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
