"""CPU backend throughput against the plain NumPy forward loop, in the same run.

The CPU backend (`load_native(core, "cpu")` + `Driver`) runs a real float32 export of
SmolLM2-135M-Instruct (written to bench/out/ by `ignition export` when absent). The baseline
is `PlainLlama` (bench/numpy_forward.py) on the same GGUF: contiguous KV, no paging, no
kernel library, argmax instead of the sampling kernel. Both see the same 256-token prompt.

    prefill   one 256-token prompt (backend: the prefill_t256 graph, one step)
    decode B  one token for each of B rows at context 256..256+steps (B = 1, 8)

Figures are medians over steps. Backend and plain steps alternate one for one (each
backend step is followed by a plain step of the same kind), so a busy host slows both
alike. ratio = backend tokens/s / plain tokens/s (target >= 0.9). Export
runs in a child process (`ignition` console script): its wall time and peak RSS
(getrusage RUSAGE_CHILDREN) are recorded when it runs, and reused from the sidecar JSON
otherwise. Peak RSS of this process holds both models. A per-op profile of one step of
each kind (bound launch list of `model.backend._programs[graph]`, plus packing) shows
where backend time goes.

Run: `cd /work/main && uv run python bench/cpu_forward.py [--decode-steps 16]
[--rounds 3] [--reexport]` -> prints tables and writes bench/out/cpu_forward.json.
On a busy shared host prefer `OPENBLAS_NUM_THREADS=1` (recorded in host.blas_threads): with
more BLAS threads than free cores, a small matmul waits for a descheduled peer thread and
takes a scheduler quantum (about 20 ms) instead of microseconds. Figures only; never
asserted on.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from _report import write_json  # bench/ is this script's folder

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
OUT = BENCH / "out"
CORE = OUT / "smollm2-f32.core"
EXPORT_RECORD = OUT / "smollm2-f32.export.json"
KEY = OUT / "bench-publisher.key"
NAMESPACE = "helios.bench/models"
RECIPE = REPO / "recipes" / "smollm2_135m_instruct.py"
TARGET_RATIO = 0.9


def _plain_llama_class():
    spec = importlib.util.spec_from_file_location("helios_bench_numpy_forward",
                                                  BENCH / "numpy_forward.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    return module.PlainLlama, module.KVCache


def _rss_bytes() -> int:
    """Current resident set size (VmRSS) of this process."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _peak_rss_bytes(who: int = resource.RUSAGE_SELF) -> int:
    return resource.getrusage(who).ru_maxrss * 1024  # Linux reports KiB


def ensure_core(reexport: bool) -> dict:
    """Export the f32 core into bench/out/ unless present; returns the export record."""
    from helios_tools.core import generate_key, write_key_pair

    OUT.mkdir(parents=True, exist_ok=True)
    if CORE.is_file() and EXPORT_RECORD.is_file() and KEY.is_file() and not reexport:
        record = json.loads(EXPORT_RECORD.read_text())
        record["reused"] = True
        return record
    if not KEY.is_file():
        write_key_pair(generate_key(), KEY)
    script = Path(sys.executable).parent / "ignition"
    cmd = [str(script), "export", str(RECIPE), "--checkpoint", "smollm2", "--key", str(KEY),
           "--namespace", NAMESPACE, "--out", str(CORE), "--weight-dtype", "f32", "--force"]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"export failed ({proc.returncode}):\n{proc.stderr}")
    record = {"command": " ".join(cmd[1:]), "wall_s": seconds,
              "peak_rss_bytes": _peak_rss_bytes(resource.RUSAGE_CHILDREN),
              "core_bytes": CORE.stat().st_size, "summary": proc.stdout.strip(),
              "loadavg_1m_after": os.getloadavg()[0]}
    write_json(EXPORT_RECORD, record, indent=2)
    record["reused"] = False
    return record


class PlainStepper:
    """The plain loop, one step at a time: prefill of the prompt, decode of `batch` rows.

    Decode rows start from the prompt's cache replicated `batch` times, so every row
    decodes at the backend's context (prompt length + tokens decoded so far).
    """

    def __init__(self, plain, kv_cache_cls, prompt: np.ndarray, batch: int, steps: int):
        self.plain, self.prompt, self.capacity = plain, prompt, prompt.shape[1] + steps + 2
        one = plain.new_cache(1, self.capacity)
        last = plain.forward(prompt, one)
        self.cache = kv_cache_cls(np.repeat(one.k, batch, axis=1),
                                  np.repeat(one.v, batch, axis=1), one.length_tokens)
        self.next = np.repeat(np.argmax(last, axis=-1)[:, None], batch, axis=0)

    def prefill(self) -> float:
        cache = self.plain.new_cache(1, self.capacity)
        t = time.perf_counter()
        self.plain.forward(self.prompt, cache)
        return time.perf_counter() - t

    def decode(self) -> float:
        t = time.perf_counter()
        logits = self.plain.forward(self.next, self.cache)
        seconds = time.perf_counter() - t
        self.next = np.argmax(logits, axis=-1)[:, None]
        return seconds


class Interleaved:
    """Wraps NativeModel.execute: times each backend step, then one plain step of the
    same kind, so the two see the same host load step by step.

    Samples are (phase, implementation) -> step seconds; phase is "prefill" or
    "decode_b{rows}".
    """

    def __init__(self, model):
        self.model = model
        self.stepper: PlainStepper | None = None
        self.samples: dict[tuple[str, str], list[float]] = defaultdict(list)
        self._execute = model.execute
        model.execute = self.execute

    def execute(self, plan):
        t = time.perf_counter()
        out = self._execute(plan)
        seconds = time.perf_counter() - t
        if self.stepper is not None:
            decode = plan.kind.value == "decode"
            phase = f"decode_b{len(plan.rows)}" if decode else "prefill"
            self.samples[(phase, "backend")].append(seconds)
            step = self.stepper.decode if decode else self.stepper.prefill
            self.samples[(phase, "plain")].append(step())
        return out


def profile_ops(model, driver, prompt: list[int], batch: int, steps: int) -> dict:
    """Per-op seconds of one step, median over the steps of each graph (packing included).

    Returns:
        graph name -> op name -> median seconds per step, largest first.
    """
    backend = model.backend
    # graph -> one {op: seconds} per executed step
    per_step: dict[str, list[dict[str, float]]] = defaultdict(list)
    real_run, real_pack = backend.run, model.packing.pack
    packing_s: list[float] = []

    def run(graph, dirty=()):
        ops: dict[str, float] = defaultdict(float)
        ops["(packing)"] = packing_s.pop()
        for fn, args in backend._programs[graph]:
            t = time.perf_counter()
            fn(*args)
            ops[fn.__name__] += time.perf_counter() - t
        per_step[graph].append(ops)

    def pack(name, *args, **kwargs):
        t = time.perf_counter()
        dirty = real_pack(name, *args, **kwargs)
        packing_s.append(time.perf_counter() - t)
        return dirty

    backend.run, model.packing.pack = run, pack
    try:
        driver.generate([prompt] * batch, max_new_tokens=steps + 1)
    finally:
        backend.run, model.packing.pack = real_run, real_pack
    out = {}
    for graph, steps_ops in per_step.items():
        medians = {op: statistics.median(s.get(op, 0.0) for s in steps_ops)
                   for op in steps_ops[0]}
        out[graph] = dict(sorted(medians.items(), key=lambda kv: -kv[1]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--decode-steps", type=int, default=16, help="per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--reexport", action="store_true", help="export the core again")
    parser.add_argument("--out", default=str(OUT / "cpu_forward.json"))
    args = parser.parse_args()

    export = ensure_core(args.reexport)

    from helios_ignition.checkpoint import load_gguf, smollm2_gguf_path
    from helios_serve.runtime.driver import Driver
    from helios_serve.testing.native import load_native
    from helios_tools.core import authorize, load_public_key, open_core

    rss0 = _rss_bytes()
    t = time.perf_counter()
    core = open_core(CORE, [load_public_key(KEY.with_name(KEY.name + ".pub"))])
    authorize(core, NAMESPACE)
    model = load_native(core, "cpu")
    backend_load_s = time.perf_counter() - t
    rss_backend = _rss_bytes() - rss0

    plain_cls, kv_cache_cls = _plain_llama_class()
    rss1 = _rss_bytes()
    t = time.perf_counter()
    plain = plain_cls(load_gguf(smollm2_gguf_path()),
                      max_context=args.prompt_tokens + args.decode_steps + 8)
    plain_load_s = time.perf_counter() - t
    rss_plain = _rss_bytes() - rss1

    rng = np.random.default_rng(0)
    prompt = rng.integers(100, plain.geometry.vocab_size, size=args.prompt_tokens).tolist()
    prompt_np = np.asarray([prompt])
    driver = Driver(model)
    interleaved = Interleaved(model)
    # Warm-up (not recorded): first touches of buffers, BLAS thread start-up.
    driver.generate([prompt], max_new_tokens=3)
    PlainStepper(plain, kv_cache_cls, prompt_np, 1, 2).decode()
    for _ in range(args.rounds):
        for batch in args.batches:
            interleaved.stepper = PlainStepper(plain, kv_cache_cls, prompt_np, batch,
                                               args.decode_steps)
            driver.generate([prompt] * batch, max_new_tokens=args.decode_steps + 1)
    interleaved.stepper = None
    model.execute = interleaved._execute
    samples: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for (phase, impl), secs in interleaved.samples.items():
        samples[phase][impl] = secs

    phases = {}
    for phase, by_impl in samples.items():
        tokens = args.prompt_tokens if phase == "prefill" else int(phase.split("_b")[1])
        row = {"tokens_per_step": tokens}
        for impl, secs in by_impl.items():
            med = statistics.median(secs)
            row[impl] = {"step_ms_median": med * 1e3, "tokens_per_s": tokens / med,
                         "steps": len(secs)}
        row["ratio"] = row["backend"]["tokens_per_s"] / row["plain"]["tokens_per_s"]
        phases[phase] = row

    profile = {}
    for batch in args.batches:
        profile.update(profile_ops(model, driver, prompt, batch, args.decode_steps))
    result = {
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF dequantized), f32 core, CPU backend",
        "prompt_tokens": args.prompt_tokens,
        "rounds": args.rounds,
        "decode_steps_per_round": args.decode_steps,
        "target_ratio": TARGET_RATIO,
        "phases": phases,
        "export": export,
        "backend_load_s": backend_load_s,
        "plain_load_s": plain_load_s,
        "rss_bytes": {"backend_model": rss_backend, "plain_model": rss_plain,
                      "peak_process": _peak_rss_bytes()},
        "weight_bytes_per_step": plain.weight_bytes(),
        "profile_s_per_step": profile,
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "numpy": np.__version__, "python": platform.python_version(),
                 "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"),
                 # Other processes on a shared host skew CPU figures: record how busy it was.
                 "loadavg_1m_after": os.getloadavg()[0]},
    }
    _print(result)
    print(f"wrote {write_json(args.out, result, indent=2)}")


def _print(r: dict) -> None:
    print(f"CPU backend vs plain NumPy loop, SmolLM2-135M f32 (load avg "
          f"{r['host']['loadavg_1m_after']:.1f} on {r['host']['cpus']} CPUs)")
    print(f"{'phase':<16}{'backend tok/s':>14}{'plain tok/s':>13}{'backend ms':>12}"
          f"{'plain ms':>10}{'ratio':>8}")
    for phase, row in r["phases"].items():
        b, p = row["backend"], row["plain"]
        flag = "" if row["ratio"] >= r["target_ratio"] else "  < target"
        print(f"{phase:<16}{b['tokens_per_s']:>14.1f}{p['tokens_per_s']:>13.1f}"
              f"{b['step_ms_median']:>12.1f}{p['step_ms_median']:>10.1f}"
              f"{row['ratio']:>8.2f}{flag}")
    e = r["export"]
    print(f"export: {e['wall_s']:.1f} s, peak RSS {e['peak_rss_bytes'] / 2**20:.0f} MiB, core "
          f"{e['core_bytes'] / 2**20:.0f} MiB{' (earlier run)' if e['reused'] else ''}")
    rss = r["rss_bytes"]
    print(f"load: backend {r['backend_load_s']:.1f} s (+{rss['backend_model'] / 2**20:.0f} MiB "
          f"RSS), plain {r['plain_load_s']:.1f} s (+{rss['plain_model'] / 2**20:.0f} MiB); "
          f"peak RSS {rss['peak_process'] / 2**20:.0f} MiB")
    for graph, ops in r["profile_s_per_step"].items():
        total = sum(ops.values())
        top = ", ".join(f"{op} {s * 1e3:.1f}" for op, s in list(ops.items())[:6])
        print(f"profile {graph}: {total * 1e3:.1f} ms/step (sum of per-op medians); {top}")


if __name__ == "__main__":
    main()
