"""Sweep multi-row linear variants on the 8B and SmolLM2 shapes; verify each on the device.

    python bench/gpu_linear_sweep.py --json OUT.json [--budget-s 150] [--dry-run]

For T in {8, 32, 64} and the (N, K) of Llama-3.1-8B and SmolLM2-135M, times the v1 launch
rule (``HELIOS_LINEAR_RULE=v1``, the baseline every ratio is against), the v2 rule, the
v3 rule (the current ``launch_config`` default, picked from this sweep's first run) and a grid of variant constants (tile sizes, warps,
stages, ``PREFETCH``, ``STACK``, ``SWAP``, a few ``XSPLIT=0``), each as a CUDA graph of 10
launches over up to 4 rotating weight copies (so L2 does not serve repeats). Weights are
random bf16; every variant's output (poisoned with NaN first) is checked against a
float64 NumPy reference on 512 columns (``rel``: ||gpu - ref|| / ||ref||) and relaunched
to check it is bitwise deterministic. Prints one table row per (shape, T, variant):
microseconds, weight TB/s, ratio of the v1 time to this one (> 1 is faster), and the
best variant per (shape, T). ``--dry-run`` (no GPU) compiles the variant list for sm_90
and checks that the v1, v2 and v3 choices are in it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _report import write_json  # bench/ is this script's folder

SHAPES = {"llama8b": [(6144, 4096), (28672, 4096), (4096, 14336), (128256, 4096)],
          "smollm2": [(960, 576), (3072, 576), (576, 1536), (49152, 576)]}
ROWS = (1, 8, 32, 64)
CHECK_COLS = 512


class _View:  # what launch_config reads of a view
    def __init__(self, shape, dtype):
        self.shape, self.buffer = shape, type("D", (), {"dtype": dtype})()


def rule_constants(T: int, N: int, K: int, rule: str) -> dict[str, int]:
    """The launch rule's constants for a bf16 weight (with WARPS, WBF16, K16); one row is
    the GEMV of ``launch_config`` under every rule, and v3 includes its few-row FMA path."""
    from helios_ignition.capture import launch

    if T == 1 or (rule == "v3" and launch.linear_fma(T, N)):  # what launch_config picks
        c = launch.launch_config("linear", [T, N, K], [None, _View((N, K), "bf16")])
        return dict(c.constants)
    return dict(launch.linear_constants(T, N, K, rule), WBF16=1, K16=int(K % 16 == 0))


def fma_variants() -> list[dict[str, int]]:
    """The swept few-row FMA constants (``FMA=1``, 8-row token tiles)."""
    return [dict(BLOCK_T=8, BLOCK_N=bn, BLOCK_K=bk, WARPS=warps, FMA=1, WBF16=1, K16=1)
            for bn in (2, 4, 8) for bk in (128, 256, 512, 1024) for warps in (4, 8)]


def prefill_variants() -> list[dict[str, int]]:
    """The swept prefill tiles (256 and 1024 rows): wide tiles, both load schemes, hi/lo
    stacked or not; at most 128 accumulator values a thread."""
    out = []
    for bt in (64, 128):
        for bn in (64, 128, 256):
            for bk in (32, 64):
                for warps in (4, 8):
                    for stack in (0, 1):
                        if bt * bn * (2 if stack else 1) > 128 * 32 * warps:
                            continue
                        base = dict(BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk, WARPS=warps,
                                    STACK=stack, WBF16=1, K16=1)
                        out.append(dict(base, PREFETCH=1))
                        for stages in (3, 4):
                            out.append(dict(base, PREFETCH=0, STAGES=stages))
    return out


def gemv_variants() -> list[dict[str, int]]:
    """The swept GEMV (one token row) constants: rows per program, K step, warps."""
    out = []
    for bn in (4, 8, 16, 32):
        for bk in (512, 1024, 2048, 4096):
            for warps in (2, 4, 8):
                if bn * bk <= 32768:
                    out.append(dict(BLOCK_T=1, BLOCK_N=bn, BLOCK_K=bk, WARPS=warps, WBF16=1,
                                    K16=1))
    return out


def _key(c: dict[str, int]) -> tuple:
    full = {**dict(SWAP=0, PREFETCH=1, XSPLIT=1, STACK=0, STAGES=3, FMA=0), **c}
    return tuple(sorted(full.items()))


def grid_variants(bt: int) -> list[dict[str, int]]:
    """The swept constants for token tiles of `bt` rows (bf16 weights, K % 16 == 0)."""
    base = dict(BLOCK_T=bt, WBF16=1, K16=1)
    out = []
    for bn in (32, 64, 128, 256):
        for bk in (32, 64, 128):
            for warps in (4, 8):
                if (bn == 256 and (bk == 128 or warps == 4)) or (bn * bk >= 128 * 128
                                                                  and warps == 4):
                    continue
                for stack in (0, 1):
                    for stages in (3, 4):  # Triton-pipelined loads
                        out.append(dict(base, BLOCK_N=bn, BLOCK_K=bk, WARPS=warps,
                                        STAGES=stages, PREFETCH=0, STACK=stack))
                    if bk >= 64 and bn <= 128:  # v1's hand prefetch (no pipelining)
                        out.append(dict(base, BLOCK_N=bn, BLOCK_K=bk, WARPS=warps,
                                        PREFETCH=1, STACK=stack))
    for bn, bk in ((32, 64), (64, 64), (128, 64)):  # one-term activation (about 3 digits)
        out.append(dict(base, BLOCK_N=bn, BLOCK_K=bk, WARPS=8, PREFETCH=0, XSPLIT=0))
    if bt <= 32:  # weights as the MMA's M operand, tokens as its N
        for bn in (64, 128):
            for bk in (64, 128, 256):
                for warps in (4, 8):
                    for stack in (0, 1):
                        out.append(dict(base, BLOCK_N=bn, BLOCK_K=bk, WARPS=warps,
                                        SWAP=1, STACK=stack, STAGES=4 if bk < 256 else 3))
    return out


def variant_table() -> tuple[dict[tuple, dict], list[tuple[int, tuple]]]:
    """All distinct constants, and the (T, key) pairs to time in order: the rule choices
    of every T first, then the grids interleaved (T = 64 first), so a budget cut drops
    grid points evenly."""
    allv: dict[tuple, dict] = {}
    rules, grids = [], {}
    for T in ROWS:
        for rule in ("v1", "v2", "v3"):
            for shapes in SHAPES.values():
                for N, K in shapes:
                    c = rule_constants(T, N, K, rule)
                    allv.setdefault(_key(c), c)
                    rules.append((T, _key(c)))
        grids[T] = []
        if T > 64:
            for c in prefill_variants():
                allv.setdefault(_key(c), c)
                grids[T].append((T, _key(c)))
            continue
        for bt in ((1,) if T == 1 else (16, 32) if T <= 8 else (32,) if T <= 32 else (64,)):
            variants = gemv_variants() if bt == 1 else grid_variants(bt)
            if bt in (16, 32) and T <= 32:
                variants = fma_variants() + variants  # few rows on the FMA units
            for c in variants:
                allv.setdefault(_key(c), c)
                grids[T].append((T, _key(c)))
    order = list(rules)
    for i in range(max(len(g) for g in grids.values())):
        order += [grids[T][i] for T in sorted(ROWS, reverse=True) if i < len(grids[T])]
    return allv, list(dict.fromkeys(order))


def compile_variants(allv: dict[tuple, dict], workers: int) -> tuple[dict, dict]:
    from helios_ignition.kernels_aot import compile_each, variant_kernel

    kernels = [variant_kernel(f"v{i}", "linear", c) for i, c in enumerate(allv.values())]
    byid = {k.id: key for k, key in zip(kernels, allv, strict=True)}
    compiled, failed = compile_each(kernels, "sm_90", workers)
    return ({byid[ck.kernel_id]: ck for ck in compiled},
            {byid[kid]: err for kid, err in failed.items()})


def _label(key: tuple) -> str:
    c = dict(key)
    s = (f"T{c['BLOCK_T']} N{c['BLOCK_N']} K{c['BLOCK_K']} W{c['WARPS']} S{c['STAGES']} "
         f"P{c['PREFETCH']} ST{c['STACK']}")
    return (s + (" SWAP" if c["SWAP"] else "") + ("" if c["XSPLIT"] else " XS0")
            + (" FMA" if c["FMA"] else ""))


def _prefill_pick(rows: list[dict], bad: list[dict]) -> str:
    """The 1024-row variant with the least total time over the 8B shapes (verified rows
    timed on all of them), as a HELIOS_LINEAR_PREFILL spec, against v1's total."""
    failed = {id(r) for r in bad}
    shapes = {(n, k) for n, k in SHAPES["llama8b"]}
    total: dict[str, list[float]] = {}
    spec: dict[str, str] = {}
    for r in rows:
        if r["T"] == 1024 and (r["N"], r["K"]) in shapes and id(r) not in failed \
                and r["constants"]["XSPLIT"]:
            total.setdefault(r["variant"], []).append(r["us"])
            c = {**dict(STAGES=3, PREFETCH=1, STACK=0), **r["constants"]}
            spec[r["variant"]] = ",".join(str(c[k]) for k in (
                "BLOCK_T", "BLOCK_N", "BLOCK_K", "WARPS", "STAGES", "PREFETCH", "STACK"))
    full = {v: sum(t) for v, t in total.items() if len(t) == len(shapes)}
    if not full:
        return "no 1024-row variant was timed on every 8B shape"
    best = min(full, key=full.get)
    v1 = _label(_key(rule_constants(1024, 6144, 4096, "v1")))
    base = full.get(v1, float("nan"))
    return (f"prefill pick: HELIOS_LINEAR_PREFILL={spec[best]}  ({best}: {full[best]:.0f} us "
            f"over the 8B shapes; v1 {base:.0f} us; x{base / full[best]:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--budget-s", type=float, default=150)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--dry-run", action="store_true", help="compile only (no GPU)")
    ap.add_argument("--prefill", action="store_true",
                    help="prefill rows (256, 1024) and tiles instead; LM heads left out")
    args = ap.parse_args()
    if args.prefill:  # the LM head runs on the last row of each prompt, not on every token
        global ROWS
        ROWS = (256, 1024)
        for model in SHAPES:
            SHAPES[model] = [(n, k) for n, k in SHAPES[model] if n < 30000]
    t_start = time.perf_counter()
    allv, work = variant_table()
    print(f"{len(allv)} variants, {len(work)} (T, variant) pairs", flush=True)
    if args.dry_run:
        compiled, failed = compile_variants(allv, args.workers)
        for key, err in failed.items():
            print("compile failed:", _label(key), err)
        print(f"dry run: compiled {len(compiled)}/{len(allv)} for sm_90 in "
              f"{time.perf_counter() - t_start:.0f}s; max shared "
              f"{max(ck.shared_bytes for ck in compiled.values())} bytes")
        return
    from helios_serve.runtime.cuda import driver as drv

    cu, stream = drv.current_stream()
    compiled, failed = compile_variants(allv, args.workers)
    print(f"compiled {len(compiled)}/{len(allv)} variants in "
          f"{time.perf_counter() - t_start:.0f}s", flush=True)
    attr = cu.CUfunction_attribute
    fns = {}
    for key, ck in compiled.items():
        if ck.shared_bytes > 227 * 1024:
            failed[key] = f"shared {ck.shared_bytes} bytes"
            continue
        mod = drv.call("l", cu.cuModuleLoadData(ck.binary))
        fn = drv.call("f", cu.cuModuleGetFunction(mod, ck.entry_name.encode()))
        if ck.shared_bytes > 48 * 1024:
            drv.call("s", cu.cuFuncSetAttribute(
                fn, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, ck.shared_bytes))
        regs = drv.call("r", cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, fn))
        local = drv.call("r", cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                                                    fn))
        fns[key] = (fn, ck, drv.param_count(fn), int(regs), int(local))

    # Every shape's weights, activations and output stay resident (about 3 GB).
    rng = np.random.default_rng(0)
    pool = (rng.standard_normal(1 << 24, dtype=np.float32) * 0.02)
    pool_bits = (pool.view(np.uint32) >> 16).astype(np.uint16)
    data = {}
    tmax = max(ROWS)
    for model, shapes in SHAPES.items():
        for N, K in shapes:
            wbytes = N * K * 2
            bits = np.resize(pool_bits, N * K)
            copies = max(1, min(4, (1 << 30) // wbytes))
            w = [int(drv.call("a", cu.cuMemAlloc(wbytes))) for _ in range(copies)]
            drv.call("h", cu.cuMemcpyHtoD(w[0], bits.ctypes.data, wbytes))
            for p in w[1:]:
                drv.call("d", cu.cuMemcpyDtoD(p, w[0], wbytes))
            cols = np.unique(np.concatenate([rng.integers(0, N, CHECK_COLS), [N - 1]]))
            wcols = (bits.reshape(N, K)[cols].astype(np.uint32) << 16).view(np.float32)
            x = rng.standard_normal((tmax, K)).astype(np.float32)
            xd = int(drv.call("a", cu.cuMemAlloc(x.nbytes)))
            drv.call("h", cu.cuMemcpyHtoD(xd, x.ctypes.data, x.nbytes))
            o = int(drv.call("a", cu.cuMemAlloc(tmax * N * 4)))
            refs = {T: x[:T].astype(np.float64) @ wcols.T.astype(np.float64) for T in ROWS}
            data[(N, K)] = dict(model=model, N=N, K=K, w=w, x=xd, o=o, cols=cols, refs=refs,
                                wbytes=wbytes)
    print(f"data ready at {time.perf_counter() - t_start:.0f}s", flush=True)

    def launch(fn, ck, count, grid, d, T, wptr):
        a = drv.KernelArgs([("ptr", d["x"]), ("ptr", wptr), ("ptr", d["o"]), ("i32", T),
                            ("i32", d["N"]), ("i32", d["K"])] + [("ptr", 0)] * (count - 6))
        drv.call("k", cu.cuLaunchKernel(fn, *grid, 32 * ck.num_warps, 1, 1, ck.shared_bytes,
                                        stream, a.address, 0))
        return a

    def check(fn, ck, count, grid, d, T):
        outs, N = [], d["N"]
        for _ in range(2):
            drv.call("p", cu.cuMemsetD32(d["o"], 0x7FC00000, T * N))  # NaN
            keep = launch(fn, ck, count, grid, d, T, d["w"][0])
            drv.call("s", cu.cuStreamSynchronize(stream))
            host = np.empty((T, N), np.float32)
            drv.call("c", cu.cuMemcpyDtoH(host.ctypes.data, d["o"], host.nbytes))
            outs.append(host)
            del keep
        ref = d["refs"][T]
        got = outs[0][:, d["cols"]].astype(np.float64)
        finite = bool(np.isfinite(outs[0]).all())
        rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref)) if finite else float("inf")
        return rel, finite, bool(np.array_equal(outs[0].view(np.uint32),
                                                outs[1].view(np.uint32)))

    rows, skipped = [], 0
    for T, key in work:
        if key not in fns:
            continue
        if time.perf_counter() - t_start > args.budget_s - 10:
            skipped += 1
            continue
        fn, ck, count, regs, local = fns[key]
        c = dict(key)
        for (N, K), d in data.items():
            grid = (-(-N // c["BLOCK_N"]), -(-T // c["BLOCK_T"]), 1)
            rel, finite, same = check(fn, ck, count, grid, d, T)
            keep = []
            drv.call("b", cu.cuStreamBeginCapture(
                stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
            for i in range(10):
                keep.append(launch(fn, ck, count, grid, d, T, d["w"][i % len(d["w"])]))
            graph = drv.call("e", cu.cuStreamEndCapture(stream))
            exe = drv.call("i", cu.cuGraphInstantiate(graph, 0))
            drv.call("g", cu.cuGraphLaunch(exe, stream))
            drv.call("s", cu.cuStreamSynchronize(stream))
            t0 = time.perf_counter()
            for _ in range(3):
                drv.call("g", cu.cuGraphLaunch(exe, stream))
            drv.call("s", cu.cuStreamSynchronize(stream))
            us = (time.perf_counter() - t0) / 30 * 1e6
            cu.cuGraphExecDestroy(exe)
            cu.cuGraphDestroy(graph)
            rows.append({"model": d["model"], "N": N, "K": K, "T": T, "us": us,
                         "TBps": d["wbytes"] / us / 1e6, "rel": rel, "finite": finite,
                         "deterministic": same, "regs": regs, "local_bytes": local,
                         "shared_bytes": ck.shared_bytes, "variant": _label(key),
                         "constants": c})
    print(f"timed {len(rows)} (shape, T, variant) in {time.perf_counter() - t_start:.0f}s;"
          f" {skipped} variant x T skipped for the budget", flush=True)

    summary = []
    for (N, K), d in data.items():
        for T in ROWS:
            mine = [r for r in rows if (r["N"], r["K"], r["T"]) == (N, K, T)]
            if not mine:
                continue
            by = {r["variant"]: r for r in mine}
            v1 = by.get(_label(_key(rule_constants(T, N, K, "v1"))))
            v2 = by.get(_label(_key(rule_constants(T, N, K, "v2"))))
            v3 = by.get(_label(_key(rule_constants(T, N, K, "v3"))))
            base = v1["us"] if v1 else float("nan")
            ok = [r for r in mine if r["finite"] and r["deterministic"]
                  and r["rel"] < (5e-5 if r["constants"]["XSPLIT"] else 1e-2)]
            best = sorted((r for r in ok if r["constants"]["XSPLIT"]), key=lambda r: r["us"])
            shown = [("v1", v1), ("v2", v2), ("v3 (default)", v3)]
            shown += [(f"best {i + 1}", r) for i, r in enumerate(best[:3])]
            xs0 = sorted((r for r in ok if not r["constants"]["XSPLIT"]), key=lambda r: r["us"])
            shown += [("best XSPLIT=0", xs0[0])] if xs0 else []
            for tag, r in shown:
                if r is None:
                    continue
                line = (f"{d['model']:8} N={N:6} K={K:5} T={T:2} {tag:17} {r['variant']:38} "
                        f"{r['us']:8.1f} us {r['TBps']:5.2f} TB/s x{base / r['us']:5.2f} "
                        f"rel {r['rel']:.1e} regs {r['regs']} spill {r['local_bytes']}")
                print(line)
                summary.append({"tag": tag, "N": N, "K": K, "T": T,
                                "ratio_to_v1": base / r["us"], **r})
    bad = [r for r in rows if not (r["finite"] and r["deterministic"])
           or r["rel"] >= (5e-5 if r["constants"]["XSPLIT"] else 1e-2)]
    print(f"{len(bad)} rows failed verification (NaN, nondeterministic or rel too large)")
    for r in bad[:20]:
        print("  FAIL", r["model"], r["N"], r["K"], r["T"], r["variant"], r["rel"],
              r["finite"], r["deterministic"])
    if args.prefill:
        print(_prefill_pick(rows, bad))
    print(f"done in {time.perf_counter() - t_start:.0f}s", flush=True)
    if args.json:
        write_json(args.json, {"rows": rows, "summary": summary,
                               "compile_failed": {_label(k): v for k, v in failed.items()}})


if __name__ == "__main__":
    main()
