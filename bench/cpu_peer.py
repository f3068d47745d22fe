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

Tokens/s are medians over rounds; ratio = Helios / llama.cpp. Then, once (`served_run`;
--no-served skips it): the NativeModel loop's aggregate decode tokens/s at batch 1, 4 and
8 (--native-batches), helios-serve on the same core with the demo's settings through HTTP
at C1 and C4 (--concurrency; served/native against the loop at batch C: the target's
ratio is `served_over_native_request`, over the loop timed from the prompt's prefill to
its last token, as a served request's wall is; `served_over_native` over the loop's
decode steps alone is kept beside it), and the
server's peak RSS against 1.5x the GGUF plus its KV cache. The JSON records the commit,
machine, load average (and --machine-note), threads and ggml's SIMD build. Figures only;
never asserted.

Run: `uv run python bench/cpu_peer.py --llama-bin /path/to/llama.cpp/build/bin
[--threads 2] [--prompt 256] [--gen 64] [--rounds 3]` -> bench/results/cpu_peer.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import serve_load  # bench/ is this script's folder
from _report import git_commit, write_json
from cpu_quantized_step import NAMESPACE, export
from server import ServeProcess

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


def vm_kib(pid: int) -> dict[str, int]:
    """VmHWM (peak resident set) and VmRSS of process `pid`, KiB (/proc/PID/status)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            fields[key] = int(value.split()[0])
    return fields


def served_run(threads: int, prompt: int, gen: int, concurrency: list[int],
               native_batches: list[int], log: Path) -> dict:
    """The served path beside the NativeModel loop, on the ``gguf`` core at `threads`
    threads (HELIOS_CPU_THREADS for both):

        native    serve_load.native_loop in a child process: greedy decode at batch B for
                  each of `native_batches` (aggregate tokens/s of the decode steps, rows
                  at a PROMPT-token context; and request_tokens_per_s, timed from the
                  PROMPT-token prefill's submit to the last token)
        served    helios-serve with the demo's settings (the recipe's max active rows, no
                  options) and ``serve_load.run_level``: at each of `concurrency`, C
                  streams of PROMPT-token chat prompts and GEN tokens (ignore_eos), after
                  one unrecorded round; served/native request (the target's ratio) =
                  output tokens/s over the loop's request_tokens_per_s at batch C (both
                  walls hold the prefill); served/native = over its decode-only rate
        rss       the server's VmHWM after startup and after the levels (KiB), against
                  1.5 x the GGUF's size + the KV cache it allocated (its startup log)
    """
    # the runtime after the environment is set (the loop's child and the server read it)
    from helios_ignition.checkpoint import smollm2_gguf_path
    from helios_serve.bootstrap import Bootstrap

    core, public = export("gguf")
    os.environ["HELIOS_CPU_THREADS"] = str(threads)  # the loop's child and the server
    os.environ.pop("HELIOS_GGML_LIB", None)
    os.environ.pop("HELIOS_CPU_STEP_GRAPHS", None)
    workload = [(prompt, gen)]
    native = serve_load.native_in_child(
        Namespace(core=core, trust=public, accept=NAMESPACE, backend="cpu", native_steps=gen,
                  seed=0, concurrency=sorted(set(native_batches) | set(concurrency))),
        workload)
    aggregate = {str(n["concurrency"]): round(n["tokens_per_s"], 1) for n in native}
    bootstrap = Bootstrap.load(core, [public], NAMESPACE)
    model = bootstrap.contract.served_id
    prompts = serve_load.PromptMaker(bootstrap, 0)
    levels = []
    with ServeProcess(core, public, NAMESPACE, log=log) as served:
        startup = vm_kib(served.proc.pid)
        ignore_eos, _ = serve_load.probe_ignore_eos(served.url, model)
        for c in concurrency:
            serve_load.run_level(served.url, model, [prompts.make(prompt) for _ in range(c)],
                                 c, 8, ignore_eos, 1)  # every graph of the level run once
            level = serve_load.run_level(
                served.url, model, [prompts.make(prompt) for _ in range(max(4, 2 * c))], c,
                gen, ignore_eos, 1)
            ref = next(n for n in native if n["concurrency"] == c)
            level.update(serve_load.ratios(level, ref))
            levels.append({k: level[k] for k in (
                "concurrency", "completed", "errors", "output_tokens_per_s", "ttft_ms",
                "tpot_ms", "native_tokens_per_s", "served_over_native",
                "decode_over_native", "native_request_tokens_per_s",
                "served_over_native_request")})
            print(f"served C={c}: {level['output_tokens_per_s']:.1f} tok/s; native with "
                  f"its prefill {ref['request_tokens_per_s']:.1f} (served/native "
                  f"{level['served_over_native_request']:.2f}), native decode only "
                  f"{ref['tokens_per_s']:.1f} (served {level['served_over_native']:.2f}, "
                  f"decode {level['decode_over_native']:.2f})", flush=True)
        after = vm_kib(served.proc.pid)
    bootstrap.close()
    sizing = next((line for line in log.read_text().splitlines() if "cache sizing" in line), "")
    kv = re.search(r"([0-9.]+) MiB", sizing)
    kv_mib = float(kv.group(1)) if kv else None
    gguf_mib = Path(smollm2_gguf_path()).stat().st_size / 2**20
    bound = 1.5 * gguf_mib + kv_mib if kv_mib is not None else None
    peak = after["VmHWM"] / 1024
    return {
        "workload": {"prompt_tokens": prompt, "output_tokens": gen,
                     "ignore_eos": ignore_eos},
        "native_loop": native,
        "native_aggregate_tokens_per_s": aggregate,
        "native_b8_over_b1": (round(aggregate["8"] / aggregate["1"], 2)
                              if "8" in aggregate and "1" in aggregate else None),
        "served": levels,
        "served_target": "served_over_native_request >= 0.9: output tokens/s of the served "
                         "level over the loop's request_tokens_per_s (prefill of the same "
                         "prompt length, its sampled token and the decode steps, one wall; "
                         "like the served wall, which holds each request's TTFT). "
                         "served_over_native (over the loop's decode-only rate) and "
                         "decode_over_native (C / TPOT p50 over it) are kept beside it",
        "server_rss": {
            "startup_peak_mib": round(startup["VmHWM"] / 1024, 1),
            "peak_mib": round(peak, 1),
            "gguf_mib": round(gguf_mib, 1), "kv_cache_mib": kv_mib,
            "bound_mib": round(bound, 1) if bound else None,
            "peak_over_bound": round(peak / bound, 2) if bound else None,
            "note": "VmHWM of the helios-serve process (the demo's settings: the recipe's "
                    "max active rows and KV pages); the KV cache is allocated whole but "
                    "only the pages written become resident",
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_CPP_BIN"),
                    help="folder holding llama-bench (default: $LLAMA_CPP_BIN)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3,
                    help="llama.cpp / Helios rounds (0: the served part alone)")
    ap.add_argument("--served-prompt", type=int, default=128,
                    help="prompt tokens of the served levels and the loop's context")
    ap.add_argument("--served-gen", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--native-batches", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--no-served", dest="served", action="store_false",
                    help="skip the served path, the batch aggregate and the RSS")
    ap.add_argument("--machine-note", default="may be shared with other jobs: compare "
                    "within this run", help="how busy the machine was (into the JSON)")
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
    served = (served_run(args.threads, args.served_prompt, args.served_gen,
                         args.concurrency, args.native_batches,
                         Path(args.out).with_suffix(".server.log"))
              if args.served else None)
    med = {name: {key: round(statistics.median(v), 1) if v else None
                  for key, v in d.items()} for name, d in runs.items()}
    result = {
        "commit": git_commit(),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "cpu": info.get("llama.cpp", {}).get("cpu"), "python": sys.version.split()[0],
                    "load_average": os.getloadavg(),
                    "shared": args.machine_note},
        "gguf": gguf.name, "threads": args.threads, "prompt_tokens": args.prompt,
        "gen_tokens": args.gen, "rounds": args.rounds, "statistic": "median",
        "helios_core": "--weight-dtype gguf, whole-program ggml graphs (runtime.ggml_step)",
        "setups": info,
        "tokens_per_s": med,
        "per_round": runs,
        "ratio_to_llama_cpp": ({name: {key: round(med[name][key] / med["llama.cpp"][key], 2)
                                       for key in ("pp", "tg")} for name in variants}
                               if args.rounds else None),
        "served": served,
    }
    print(f"median tokens/s {med}  ratio {result['ratio_to_llama_cpp']}")
    if served:
        print(f"native aggregate tokens/s {served['native_aggregate_tokens_per_s']}; "
              f"server peak RSS {served['server_rss']['peak_mib']} MiB "
              f"(bound {served['server_rss']['bound_mib']} MiB)")
    print(f"wrote {write_json(args.out, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
