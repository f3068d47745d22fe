"""The sampler's launches alone on the GPU: each sampling mode against greedy at 1, 8, 64
and 256 rows on SmolLM2's (49,152 ids) and the Llama-3.1-8B geometry's (128,256 ids)
vocabularies, for the candidate race (the default capture) and the slot race (the wide
form, cores exported before it), with a sweep of the candidate race's tunables.

    python bench/gpu_sampling.py --json OUT.json [--budget-s 540] [--dry-run]

Per (vocabulary, rows, form, variant, mode): the sampler step's device time, a CUDA graph
of STEPS copies of the form's launches over fixed f32 logits replayed REPS times
(``sampling_decision`` 0, so the histogram and every input stay as they are), in
microseconds per step; ``extra_us`` over the same form's greedy step; and
``predicted_over_greedy``, the decode tokens/s ratio that extra gives on a decode step
of ``greedy_step_ms`` (the H100 device steps of bench/results/h100_2026-12-06c/
llama8b_wide_9b77d74.json and h100_2026-12-06b/smollm2_sampling_ace5daa.json; 256-row
SmolLM2 extrapolated), the issue-27 target being >= 0.95. Every mode's tokens are checked
against the slot race's on the same logits (both are sample_biased's draw exactly):
``agrees`` in each row.

Modes (all seeded): greedy; top_p (T 1.0, top_p 0.95: what the OpenAI client sends);
temp_top_p (T 0.8, top_p 0.95); min_p (T 0.8, min_p 0.05); penalties (T 0.8, top_p 0.95,
presence 0.5, frequency 0.3, repetition 1.1 over 1 % of the ids seen); logit_bias (T 0.8,
top_p 0.95, 32 biased ids); all (every one of these at once). Logits: ``flat`` (N(0, 2),
nuclei of thousands of ids: the bench's random-weight models) and ``lm`` (30 ids far
above the rest: short nuclei, real text).

Sweep (candidate race): ids per chunk C in {1024, 2048, 4096} x candidates per chunk M in
{2, 4, 8} x warps of sample_race_top / sample_race_mass in {4, 8}, timed on the ``all``
and ``top_p`` modes over flat logits; the captured default (C 2048, M RACE_TOP,
HELIOS_RACE_WARPS) runs every mode. The summary prints, per vocabulary and rows, the
fastest variant and its worst predicted ratio over the modes. ``--dry-run`` (no GPU)
compiles every variant for sm_90.
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
from _report import git_commit, write_json  # bench/ is this script's folder

VOCABS = {"llama8b": 128256, "smollm2": 49152}  # the 8B first: the budget may cut the end
ROWS = (1, 8, 64, 256)
# Greedy decode device steps (ms) on the H100, by vocabulary and rows (see the docstring).
GREEDY_STEP_MS = {"llama8b": {1: 6.129, 8: 6.842, 64: 10.683, 256: 30.262},
                  "smollm2": {1: 0.822, 8: 1.502, 64: 2.811, 256: 8.0}}
MODES = ("greedy", "top_p", "temp_top_p", "min_p", "penalties", "logit_bias", "all")
SWEEP_MODES = ("top_p", "all")
STEPS, REPS = 8, 3
KM, KN, NB = 64, 256, 128  # CANDIDATES, NUCLEUS, RACE_SLOTS


def race_variants(default_warps: int, race_top: int) -> list[tuple[int, int, int]]:
    """(C, M, warps) of the sweep; the captured default first."""
    default = (2048, race_top, default_warps)
    grid = itertools.product((1024, 2048, 4096), (2, 4, 8), (4, 8))
    return [default] + [v for v in grid if v != default]


def launches(form: str, R: int, V: int, W: int, variant: tuple[int, int, int]):
    """The form's launches in order: (op, scalars, constants override)."""
    C, M, warps = variant
    P = -(-V // C)
    if form == "race":
        w = {"WARPS": warps}
        return [("sample_chunks_mass", [R, V, W, C, KM], {}),
                ("sample_merge", [R, V, P, KM], {}),
                ("sample_race_top", [R, V, W, C, M], w),
                ("sample_race_mass", [R, V, W, C, M], w),
                ("sample_race_pick", [R, V, W, P, M], {})]
    return [("sample_chunks_wide", [R, V, W, C, KM], {}),
            ("sample_merge_nucleus", [R, V, P, C, KM, KN], {}),
            ("sample_race", [R, V, W, C, NB, 1], {}), ("sample_pick", [R, V, P, NB, 1], {}),
            ("sample_race", [R, V, W, C, NB, 2], {}), ("sample_pick", [R, V, P, NB, 2], {}),
            ("sample_rest", [R, V, W], {})]


def cases(race_top: int, default_warps: int):
    """Every (vocab, R, form, variant, mode, logits) timed, in order."""
    out = []
    default = (2048, race_top, default_warps)
    for vocab, R in itertools.product(VOCABS, ROWS):
        for kind in ("flat", "lm"):
            for mode in MODES:
                out.append((vocab, R, "wide", (2048, 0, 8), mode, kind))
                out.append((vocab, R, "race", default, mode, kind))
        for variant in race_variants(default_warps, race_top)[1:]:
            for mode in ("greedy",) + SWEEP_MODES:
                out.append((vocab, R, "race", variant, mode, "flat"))
    return out


def constants_of(op, scalars, override):
    from helios_ignition.capture.launch import launch_config

    cfg = launch_config(op, scalars)
    return cfg, {**cfg.constants, **override}


def compile_all_variants(work, workers: int):
    from helios_ignition.kernels_aot import compile_each, variant_kernel

    table = {}
    for vocab, R, form, variant, _, _ in work:
        V = VOCABS[vocab]
        for op, scalars, override in launches(form, R, V, (V + 31) // 32, variant):
            _, c = constants_of(op, scalars, override)
            table.setdefault((op, tuple(sorted(c.items()))), c)
    kernels, byid = [], {}
    for key, c in table.items():
        kernels.append(variant_kernel(f"s{len(kernels)}", key[0], c))
        byid[kernels[-1].id] = key
    compiled, failed = compile_each(kernels, "sm_90", workers)
    return ({byid[ck.kernel_id]: ck for ck in compiled},
            {byid[k]: err for k, err in failed.items()})


def mode_inputs(rng, mode: str, R: int, V: int, S: int) -> dict[str, np.ndarray]:
    """Host inputs of a mode's rows (every row the same settings, own seed)."""
    W = (V + 31) // 32
    p = dict(slot=np.arange(R, dtype=np.int32), positions=rng.integers(0, 4000, R, np.int32),
             sampling_decision=np.zeros(R, np.int32),
             seed=rng.integers(0, 2**32, (R, 2), dtype=np.uint64).astype(np.uint32),
             temperature=np.full(R, 0.8, np.float32), top_p=np.full(R, 0.95, np.float32),
             top_k=np.zeros(R, np.int32), min_p=np.zeros(R, np.float32),
             presence=np.zeros(R, np.float32), frequency=np.zeros(R, np.float32),
             repetition=np.ones(R, np.float32),
             histogram=np.zeros((S, V), np.int32), logit_bias=np.zeros((S, V), np.float32),
             use_bias=np.zeros(R, np.int32), grammar_mask=np.full((R, W), -1, np.int32),
             use_mask=np.zeros(R, np.int32))
    if mode == "greedy":
        p["temperature"][:] = 0.0
    if mode == "top_p":
        p["temperature"][:] = 1.0
    if mode == "min_p":
        p["top_p"][:], p["min_p"][:] = 1.0, 0.05
    if mode in ("penalties", "all"):
        seen = rng.random((S, V)) < 0.01
        p["histogram"] = (seen * rng.integers(1, 4, (S, V))).astype(np.int32)
        p["presence"][:], p["frequency"][:], p["repetition"][:] = 0.5, 0.3, 1.1
    if mode in ("logit_bias", "all"):
        ids = (7 + 1009 * np.arange(32)) % V
        p["logit_bias"][:, ids] = ((-1.0) ** np.arange(32) * (2.0 + np.arange(32) % 5))
        p["use_bias"][:] = 1
    if mode == "all":
        p["min_p"][:] = 0.05
    return p


def logits_of(rng, kind: str, R: int, V: int) -> np.ndarray:
    z = (rng.standard_normal((R, V)) * 2.0).astype(np.float32)
    if kind == "lm":
        for r in range(R):
            head = rng.choice(V, 30, replace=False)
            z[r, head] += np.float32(20.0) + rng.exponential(2.0, 30).astype(np.float32)
    return z


def scratch_shapes(R: int, V: int, variant) -> dict[str, tuple[tuple[int, ...], type]]:
    C, M, _ = variant
    P = -(-V // C)
    M = max(M, 1)
    return {"chunk_max": ((R, P), np.float32), "chunk_arg": ((R, P), np.int32),
            "chunk_mass": ((R, P), np.float32), "cand_key": ((R, P * KM), np.int32),
            "cand_id": ((R, P * KM), np.int32), "selected": ((R, 2 * KN), np.int32),
            "sampled": ((R,), np.int32), "top_score": ((R, 2 * P * M), np.int32),
            "top_id": ((R, P * M), np.int32), "top_zt": ((R, P * M), np.float32),
            "ahead": ((R, P * M), np.float32), "race_level": ((R, 2), np.int32),
            "race_mass": ((R, P * NB), np.float32), "race_best": ((R, 2 * P * NB), np.int32),
            "race_arg": ((R, P * NB), np.int32)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="seconds from the start (compiles included) after which the "
                         "remaining cases are skipped (counted in 'skipped')")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--dry-run", action="store_true",
                    help="compile every variant for sm_90 and stop (no GPU)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    from helios_ignition.capture.launch import RACE_WARPS
    from helios_tools.kernels import kernel_params
    from helios_tools.kernels.sampling_chunks import RACE_TOP

    work = cases(RACE_TOP, RACE_WARPS)
    compiled, failed = compile_all_variants(work, args.workers)
    print(f"compiled {len(compiled)} variants ({len(failed)} failed) in "
          f"{time.perf_counter() - t_start:.0f}s", flush=True)
    for key, err in failed.items():
        print("FAILED", key[0], dict(key[1]), err)
    if args.dry_run:
        return
    from helios_serve.runtime.cuda import driver as drv

    cu, stream = drv.current_stream()
    fns = {}
    for key, ck in compiled.items():
        mod = drv.call("l", cu.cuModuleLoadData(ck.binary))
        fn = drv.call("f", cu.cuModuleGetFunction(mod, ck.entry_name.encode()))
        fns[key] = (fn, ck, drv.param_count(fn))
    dev = drv.call("dev", cu.cuDeviceGet(0))
    name = drv.call("name", cu.cuDeviceGetName(64, dev))
    device = bytes(name).split(b"\0", 1)[0].decode(errors="replace")

    def alloc(nbytes):
        return int(drv.call("a", cu.cuMemAlloc(max(int(nbytes), 256))))

    def h2d(ptr, arr):
        arr = np.ascontiguousarray(arr)
        drv.call("h", cu.cuMemcpyHtoD(ptr, arr.ctypes.data, arr.nbytes))

    def d2h(ptr, like):
        host = np.empty_like(like)
        drv.call("c", cu.cuMemcpyDtoH(host.ctypes.data, ptr, host.nbytes))
        return host

    def launch_all(form, R, V, W, variant, ptrs, keep) -> bool:
        for op, scalars, override in launches(form, R, V, W, variant):
            cfg, c = constants_of(op, scalars, override)
            key = (op, tuple(sorted(c.items())))
            if key not in fns:
                return False
            fn, ck, count = fns[key]
            values, it = [], iter(scalars)
            for spec in kernel_params(op):
                values.append(("ptr", ptrs[spec.name]) if spec.kind == "buffer"
                              else (spec.kind, next(it)))
            values += [("ptr", 0)] * (count - len(values))
            kargs = drv.KernelArgs(values)
            keep.append(kargs)
            g = cfg.grid
            drv.call("k", cu.cuLaunchKernel(fn, g[0], g[1], g[2], 32 * ck.num_warps, 1, 1,
                                            ck.shared_bytes, stream, kargs.address, 0))
        return True

    rng = np.random.default_rng(0)
    rows, skipped = [], 0
    tokens: dict[tuple, np.ndarray] = {}
    by_case: dict[tuple, list] = {}
    for vocab, R, form, variant, mode, kind in work:
        by_case.setdefault((vocab, R, kind, mode), []).append((form, variant))
    for (vocab, R, kind, mode), items in by_case.items():
        V = VOCABS[vocab]
        W = (V + 31) // 32
        p = mode_inputs(rng, mode, R, V, R)
        p["logits"] = logits_of(rng, kind, R, V)
        inputs = {k: alloc(v.nbytes) for k, v in p.items()}
        for k, v in p.items():
            h2d(inputs[k], v)
        for form, variant in items:
            if time.perf_counter() - t_start > args.budget_s:
                skipped += 1
                continue
            shapes = scratch_shapes(R, V, variant)
            scratch = {k: alloc(np.prod(s) * np.dtype(d).itemsize) for k, (s, d) in
                       shapes.items()}
            ptrs = {**inputs, **scratch}
            keep: list = []
            if not launch_all(form, R, V, W, variant, ptrs, keep):
                for ptr in scratch.values():
                    cu.cuMemFree(ptr)
                continue
            drv.call("s", cu.cuStreamSynchronize(stream))
            got = d2h(ptrs["sampled"], np.zeros(R, np.int32))
            ref = tokens.setdefault((vocab, R, kind, mode), got) if form == "wide" else \
                tokens.get((vocab, R, kind, mode))
            agrees = None if ref is None else bool(np.array_equal(got, ref))
            keep = []
            drv.call("b", cu.cuStreamBeginCapture(
                stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
            for _ in range(STEPS):
                launch_all(form, R, V, W, variant, ptrs, keep)
            graph = drv.call("e", cu.cuStreamEndCapture(stream))
            exe = drv.call("i", cu.cuGraphInstantiate(graph, 0))
            drv.call("g", cu.cuGraphLaunch(exe, stream))
            drv.call("s", cu.cuStreamSynchronize(stream))
            times = []
            for _ in range(REPS):
                t0 = time.perf_counter()
                drv.call("g", cu.cuGraphLaunch(exe, stream))
                drv.call("s", cu.cuStreamSynchronize(stream))
                times.append((time.perf_counter() - t0) / STEPS * 1e6)
            cu.cuGraphExecDestroy(exe)
            cu.cuGraphDestroy(graph)
            for ptr in scratch.values():
                cu.cuMemFree(ptr)
            C, M, warps = variant
            rows.append({"vocab": vocab, "rows": R, "logits": kind, "mode": mode,
                         "form": form, "C": C, "M": M, "warps": warps,
                         "us": float(np.median(times)), "agrees": agrees})
        for ptr in inputs.values():
            cu.cuMemFree(ptr)
        print(f"{vocab} R={R} {kind} {mode} done at {time.perf_counter() - t_start:.0f}s",
              flush=True)
    greedy = {(r["vocab"], r["rows"], r["logits"], r["form"], r["C"], r["M"], r["warps"]):
              r["us"] for r in rows if r["mode"] == "greedy"}
    for r in rows:
        g = greedy.get((r["vocab"], r["rows"], r["logits"], r["form"], r["C"], r["M"],
                        r["warps"]))
        if g is None:
            continue
        step = GREEDY_STEP_MS[r["vocab"]][r["rows"]] * 1e3
        r["extra_us"] = r["us"] - g
        r["predicted_over_greedy"] = step / (step + max(r["extra_us"], 0.0))
    summary = []
    print(f"\n{'vocab':>8} {'rows':>4} {'logits':>6} {'mode':>11} {'form':>5} "
          f"{'C':>5} {'M':>2} {'w':>2} {'us':>9} {'extra':>8} {'pred':>6} agrees")
    for r in rows:
        if r["form"] == "wide" or (r["C"], r["M"], r["warps"]) == (2048, RACE_TOP,
                                                                     RACE_WARPS):
            print(f"{r['vocab']:>8} {r['rows']:>4} {r['logits']:>6} {r['mode']:>11} "
                  f"{r['form']:>5} {r['C']:>5} {r['M']:>2} {r['warps']:>2} {r['us']:>9.1f} "
                  f"{r.get('extra_us', 0):>8.1f} {r.get('predicted_over_greedy', 1):>6.3f} "
                  f"{r['agrees']}")
    print("\nfastest candidate-race variant per vocabulary and rows (worst predicted ratio "
          "over the swept modes, flat logits):")
    for vocab, R in itertools.product(VOCABS, ROWS):
        best = None
        for variant in race_variants(RACE_WARPS, RACE_TOP):
            sel = [r for r in rows if (r["vocab"], r["rows"], r["logits"], r["form"]) ==
                   (vocab, R, "flat", "race") and (r["C"], r["M"], r["warps"]) == variant
                   and r["mode"] in SWEEP_MODES and "predicted_over_greedy" in r]
            if len(sel) < len(SWEEP_MODES):
                continue
            worst = min(r["predicted_over_greedy"] for r in sel)
            if best is None or worst > best[1]:
                best = (variant, worst)
        if best:
            summary.append({"vocab": vocab, "rows": R, "C": best[0][0], "M": best[0][1],
                            "warps": best[0][2], "worst_predicted_over_greedy": best[1]})
            print(f"  {vocab} R={R}: C {best[0][0]}, M {best[0][1]}, warps {best[0][2]} -> "
                  f"{best[1]:.3f}")
    disagree = [r for r in rows if r["agrees"] is False]
    print(f"{len(disagree)} timed steps whose tokens differ from the slot race's; "
          f"{skipped} skipped past the budget")
    if args.json:
        write_json(args.json, {"commit": git_commit(), "device": device, "rows": rows,
                               "best": summary, "steps_per_graph": STEPS, "reps": REPS,
                               "greedy_step_ms": GREEDY_STEP_MS, "skipped": skipped,
                               "disagreements": len(disagree),
                               "total_s": time.perf_counter() - t_start})


if __name__ == "__main__":
    main()
