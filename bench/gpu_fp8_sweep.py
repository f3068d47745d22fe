"""Sweep the FP8 W8A8 product tiles (kernels_triton/fp8.py) on the Llama-3.1-8B matrices;
verify each variant on the device; print and write the picks ``launch.fp8_constants`` reads.

    python bench/gpu_fp8_sweep.py --json OUT.json [--budget-s 240] [--dry-run]

For each 8B matrix as a decode step launches it (qkv 4096->6144 and gate_up 4096->28672
as ``rmsnorm_linear_fp8``, o 4096->4096 and down 14336->4096 as ``linear_add_fp8``) and
each row count of ``launch.FP8_ROWS``, times today's rule (``fp8_default``, the baseline
of every ratio) and a grid of variants: at 1 and 8 rows the FMA-unit GEMV (``MMA=0``:
weight rows a program, K step, warps, evict-first weight loads), from 8 rows on the
e4m3 ``tl.dot`` tiles (token rows, output columns, K step, warps, stages, and
``IMPRECISE``: 0, or Triton's promotion of the MMA's partial sums once per K step). Each runs as a CUDA
graph of launches over rotating weight copies that together exceed 192 MB (L2 is 50 MB:
each launch reads its weights from HBM, as a decode step does), replayed 10 times, best
of 2. In the same run: ``cuMemcpyDtoDAsync`` of the same weight bytes (``copy_TBps``,
bytes read plus written, the roofline's convention) and the bf16 GEMV's equivalent is
not timed here (bench/gpu_fp8.py compares whole decode steps).

Every variant's output (poisoned with NaN first) is checked against the NumPy reference
of its op (helios_tools.kernels.fp8: activations quantized per token, f32 accumulation)
on up to 512 columns (``rel`` = ||gpu - ref|| / ||ref||, at most 2e-3 as
tests/gpu/test_fp8.py bounds it) and relaunched to check it is bitwise deterministic;
failing variants are reported and never picked. The compiled binaries' registers and
local (spill) bytes are recorded. Picks: per (N, K, rows) the fastest good variant,
printed as the ``launch._FP8_TILES`` literal and written under ``"picks"`` (keys
"N,K,rows"), which ``HELIOS_FP8_TILES=OUT.json`` at capture reads. ``--dry-run`` (no GPU)
compiles every variant for sm_90 and prints registers and spills.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_commit, write_json  # bench/ is this script's folder
from helios_ignition.capture import launch as L
from helios_tools import kernels as K_

# (name, N, K, op) of one 8B decode step's products.
MATRICES = [("qkv", 6144, 4096, "rmsnorm_linear_fp8"), ("o", 4096, 4096, "linear_add_fp8"),
            ("gate_up", 28672, 4096, "rmsnorm_linear_fp8"),
            ("down", 4096, 14336, "linear_add_fp8")]
CHECK_COLS = 512
LAUNCHES, REPLAYS, MAX_COPIES = 10, 10, 64
REL_MAX = 2e-3


def gemv_variants(K: int, T: int) -> list[dict[str, int]]:
    """The swept ``MMA=0`` constants (with WARPS): 4-16 weight rows a tile (8-16 above one
    token row, where each program row re-reads its weights from L2), 1024- or 2048-wide
    K steps, 4 or 8 warps, evict-first weight loads, or 4 row tiles a program (one
    prologue pass over the activation row for all four)."""
    out = []
    for bn in ((4, 8, 16) if T == 1 else (8, 16)):
        for bk in (1024, 2048):
            for warps in (4, 8):
                if bn * bk > 16384 or bk > L._np2(K, 32):
                    continue
                for evict, tiles in ((0, 1), (1, 1), (0, 4)):
                    out.append(dict(MMA=0, BLOCK_T=1, BLOCK_N=bn, BLOCK_K=bk,
                                    BLOCK_KS=min(L._np2(K, 32), 1024), WARPS=warps,
                                    EVICT=evict, TILES=tiles))
    return out


def mma_variants(T: int, K: int) -> list[dict[str, int]]:
    """The swept ``MMA=1`` constants for `T` rows (with WARPS and STAGES): token tiles of
    the row count's power of two and the one below (16 to 128), 16-128 columns up to 16
    rows, 32-128 up to 64, 64-256 above, 64- or
    128-wide K steps, 4 or 8 warps, 3 stages, promotion per K step or none, 1 or (up to
    64 rows) 2 column tiles a program sharing one prologue pass; tiles whose
    accumulator or f32 activation tile would pass ~64 registers a thread are left out."""
    out = []
    top = min(max(L._np2(T), 16), 128)
    for bt in sorted({max(top // 2, 16), top}):
        # Narrow columns at decode sizes: no split-K here (it would need a reduce launch
        # or atomics), so 16-32 column tiles are how the 4096-wide matrices fill 132 SMs.
        for bn in ((16, 32, 64, 128) if T <= 16 else (32, 64, 128) if T <= 64
                   else (64, 128, 256)):
            for bk in (64, 128):
                for warps in (4, 8):
                    if bt * bn > 64 * 32 * warps or bt * bk > 64 * 32 * warps:
                        continue
                    for imprecise in (0, bk):
                        for tiles in ((1, 2) if T <= 64 else (1,)):
                            out.append(dict(MMA=1, BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk,
                                            BLOCK_KS=128, WARPS=warps, STAGES=3,
                                            IMPRECISE=imprecise, TILES=tiles))
    return out


def variants(T: int, N: int, K: int) -> list[dict[str, int]]:
    """Today's rule first, then the grid (GEMVs at 1 and 8 rows, tiles from 8 rows)."""
    out = [L.fp8_default(T, N, K)]
    if T <= 8:
        out += gemv_variants(K, T)
    if T >= 8:
        out += mma_variants(T, K)
    seen, uniq = set(), []
    for c in out:
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            uniq.append(c)
    return uniq


def kernel_key(op: str, K: int, c: dict[str, int]) -> tuple:
    """The compiled kernel of tiles `c` for `op` over `K` (its alignment flags)."""
    return op, tuple(sorted(full_constants(op, K, c).items()))


def full_constants(op: str, K: int, c: dict[str, int]) -> dict[str, int]:
    """What launch_config adds to tiles `c`: the alignment flags, PRO and ACC."""
    return dict(L.fp8_flags(K, c), PRO=L.FP8_PROLOGUE[op],
                ACC=int(op in ("linear_add_fp8", "swiglu_linear_add_fp8")))


def compile_all(items: list[tuple], workers: int):
    """Compile every (op, constants) for sm_90 -> ({key: CompiledKernel}, {key: error})."""
    from helios_ignition.kernels_aot import compile_each, variant_kernel

    kernels = [variant_kernel(f"f{i}", op, dict(c)) for i, (op, c) in enumerate(items)]
    byid = {k.id: key for k, key in zip(kernels, items, strict=True)}
    compiled, failed = compile_each(kernels, "sm_90", workers)
    return ({byid[ck.kernel_id]: ck for ck in compiled},
            {byid[kid]: err for kid, err in failed.items()})


def resource_usage(binary: bytes) -> tuple[int, int]:
    """(registers, stack bytes) of a cubin by Triton's bundled cuobjdump (-1 if absent)."""
    import triton

    tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(binary)
    try:
        text = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True,
                              text=True, check=False).stdout
    finally:
        os.unlink(f.name)
    regs = stack = -1
    for word in text.split():
        if word.startswith("REG:"):
            regs = int(word[4:])
        elif word.startswith("STACK:"):
            stack = int(word[6:])
    return regs, stack


def reference(op: str, x, g, codes, scales, T: int, N: int, K: int, cols):
    """The op's NumPy reference on columns `cols` ([T, len(cols)] f32; the residual
    subtracted for the _add forms)."""
    sub_codes, sub_scales = codes[cols], scales[cols]
    n = len(cols)
    out = np.zeros((T, n), np.float32)
    if op == "rmsnorm_linear_fp8":
        K_.reference_op(op)(x, g, sub_codes, sub_scales, out, T, n, K, 1e-5)
    else:
        K_.reference_op(op.replace("_add", ""))(x, sub_codes, sub_scales, out, T, n, K)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--budget-s", type=float, default=240,
                    help="stop timing new cells after this many seconds")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--rows", type=int, nargs="+", default=list(L.FP8_ROWS))
    ap.add_argument("--dry-run", action="store_true", help="compile only (no GPU)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    cells = [(name, N, K, op, T) for T in args.rows for name, N, K, op in MATRICES]
    items = sorted({kernel_key(op, K, c) for _, N, K, op, T in cells
                    for c in variants(T, N, K)})
    print(f"{len(cells)} cells, {len(items)} distinct (op, constants)", flush=True)
    compiled, failed = compile_all(items, args.workers)
    for key, err in failed.items():
        print("compile failed:", key, err[:300])
    usage = {key: resource_usage(ck.binary) for key, ck in compiled.items()}
    print(f"compiled {len(compiled)}/{len(items)} for sm_90 in "
          f"{time.perf_counter() - t_start:.0f}s", flush=True)
    if args.dry_run:
        for key, (regs, stack) in sorted(usage.items(), key=lambda kv: kv[1][1]):
            print(f"regs {regs:3} stack {stack:5}  {key[0]} {dict(key[1])}")
        return
    from helios_serve.runtime.cuda import driver as drv

    cu, stream = drv.current_stream()
    attr = cu.CUfunction_attribute

    def load(ck):
        mod = drv.call("l", cu.cuModuleLoadData(ck.binary))
        fn = drv.call("f", cu.cuModuleGetFunction(mod, ck.entry_name.encode()))
        if ck.shared_bytes > 48 * 1024:
            drv.call("s", cu.cuFuncSetAttribute(
                fn, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, ck.shared_bytes))
        return fn, drv.param_count(fn)

    fns = {key: (*load(ck), ck) for key, ck in compiled.items()}
    dev = drv.call("d", cu.cuCtxGetDevice())
    name = drv.call("n", cu.cuDeviceGetName(64, dev)).split(b"\0")[0].decode()
    rng = np.random.default_rng(0)
    tmax = max(args.rows)

    def alloc(nbytes):
        return int(drv.call("a", cu.cuMemAlloc(max(nbytes, 4))))

    def upload(ptr, arr):
        arr = np.ascontiguousarray(arr)
        drv.call("h", cu.cuMemcpyHtoD(ptr, arr.ctypes.data, arr.nbytes))

    def download(ptr, shape):
        host = np.empty(shape, np.float32)
        drv.call("c", cu.cuMemcpyDtoH(host.ctypes.data, ptr, host.nbytes))
        return host

    def timed(launch_one, copies) -> float:
        """Best of 2 timings of REPLAYS replays of a graph over rotating copies, us each."""
        keep = []
        drv.call("b", cu.cuStreamBeginCapture(
            stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        for i in range(max(LAUNCHES, len(copies))):
            keep.append(launch_one(copies[i % len(copies)]))
        graph = drv.call("e", cu.cuStreamEndCapture(stream))
        exe = drv.call("i", cu.cuGraphInstantiate(graph, 0))
        drv.call("g", cu.cuGraphLaunch(exe, stream))
        drv.call("s", cu.cuStreamSynchronize(stream))
        best = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            for _ in range(REPLAYS):
                drv.call("g", cu.cuGraphLaunch(exe, stream))
            drv.call("s", cu.cuStreamSynchronize(stream))
            best = min(best, (time.perf_counter() - t0) / (REPLAYS * len(keep)) * 1e6)
        cu.cuGraphExecDestroy(exe)
        cu.cuGraphDestroy(graph)
        return best

    result = {"commit": git_commit(), "device": name, "target": "sm_90", "rel_max": REL_MAX,
              "rows": [], "picks": {}, "baseline": {}}
    skipped, data = [], []
    for mname, N, K, op in MATRICES:  # every matrix on the device at once (~1 GB)
        wbytes = N * K
        # Random finite e4m3 codes (either sign, never NaN) and per-row scales: quantizing
        # 117M normal values would take the host longer than the sweep's timing.
        codes = (rng.integers(0, 0x7F, (N, K), dtype=np.uint8)
                 | (rng.integers(0, 2, (N, K), dtype=np.uint8) << 7))
        scales = (1 / (448 * np.sqrt(K)) * (1 + 0.1 * rng.random((N, 1)))).astype(np.float32)
        copies = min(MAX_COPIES, max(2, -(-(192 << 20) // wbytes)))
        w = [alloc(wbytes) for _ in range(copies)]
        upload(w[0], codes)
        for p in w[1:]:
            drv.call("d", cu.cuMemcpyDtoD(p, w[0], wbytes))
        d = dict(name=mname, N=N, K=K, op=op, codes=codes, scales=scales, w=w,
                 wbytes=wbytes, sc=alloc(4 * N), gd=alloc(4 * K),
                 g=(1 + 0.1 * rng.standard_normal(K)).astype(np.float32),
                 x=(rng.standard_normal((tmax, K)) * 2).astype(np.float32),
                 res=rng.standard_normal((tmax, N)).astype(np.float32),
                 cols=np.unique(np.concatenate([rng.integers(0, N, CHECK_COLS), [N - 1]])))
        upload(d["sc"], scales)
        upload(d["gd"], d["g"])
        d["xd"] = alloc(d["x"].nbytes)
        upload(d["xd"], d["x"])
        d["od"] = alloc(d["res"].nbytes)
        dst = alloc(wbytes)
        copy_us = timed(lambda p, dst=dst, n=wbytes: drv.call(
            "c", cu.cuMemcpyDtoDAsync(dst, p, n, stream)), w)
        cu.cuMemFree(dst)
        d["copy_TBps"] = 2 * wbytes / copy_us / 1e6
        result.setdefault("copy_TBps", {})[mname] = d["copy_TBps"]
        data.append(d)
    print(f"data ready at {time.perf_counter() - t_start:.0f}s", flush=True)

    def launch(d, fn, count, ck, c, wp, T):
        op = d["op"]
        bufs = [("ptr", d["xd"])] + ([("ptr", d["gd"])] if op.startswith("rmsnorm") else [])
        tail = [("i32", T), ("i32", d["N"]), ("i32", d["K"])]
        if op.startswith("rmsnorm"):
            tail.append(("f32", 1e-5))
        vals = bufs + [("ptr", wp), ("ptr", d["sc"]), ("ptr", d["od"])] + tail
        a = drv.KernelArgs(vals + [("ptr", 0)] * (count - len(vals)))
        gy = T if c["MMA"] == 0 else -(-T // c["BLOCK_T"])
        gx = -(-d["N"] // (c["BLOCK_N"] * c.get("TILES", 1)))
        drv.call("k", cu.cuLaunchKernel(fn, gx, gy, 1, 32 * ck.num_warps, 1, 1,
                                        ck.shared_bytes, stream, a.address, 0))
        return a

    for T in args.rows:  # row counts outer: a budget cut drops the largest counts
        for d in data:
            mname, N, K, op, wbytes = d["name"], d["N"], d["K"], d["op"], d["wbytes"]
            if time.perf_counter() - t_start > args.budget_s:
                skipped.append((mname, T))
                continue
            res, cols = d["res"][:T], d["cols"]
            ref = reference(op, d["x"][:T], d["g"], d["codes"], d["scales"], T, N, K,
                            cols)
            acc = op.endswith("_add_fp8")
            base_us = None
            for i, c in enumerate(variants(T, N, K)):
                key = kernel_key(op, K, c)
                if key not in fns:
                    continue
                fn, count, ck = fns[key]
                outs = []
                for _ in range(2):
                    if acc:
                        upload(d["od"], res)
                    else:
                        drv.call("p", cu.cuMemsetD32Async(d["od"], 0x7FC00000, T * N, stream))
                    keep = launch(d, fn, count, ck, c, d["w"][0], T)
                    drv.call("s", cu.cuStreamSynchronize(stream))
                    outs.append(download(d["od"], (T, N)))
                    del keep
                got = outs[0][:, cols] - (res[:, cols] if acc else 0)
                finite = bool(np.isfinite(outs[0]).all())
                rel = (float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
                       if finite else float("inf"))
                same = bool(np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)))
                us = timed(lambda wp, d=d, fn=fn, count=count, ck=ck, c=c, T=T:
                           launch(d, fn, count, ck, c, wp, T), d["w"])
                if i == 0:
                    base_us = us
                regs, stack = usage[key]
                row = {"matrix": mname, "op": op, "N": N, "K": K, "rows": T, "constants": c,
                       "baseline": i == 0, "us": us, "TBps": wbytes / us / 1e6,
                       "of_copy": wbytes / us / 1e6 / d["copy_TBps"],
                       "x_default": base_us / us if base_us else float("nan"),
                       "rel": rel, "finite": finite, "deterministic": same, "regs": regs,
                       "stack_bytes": stack, "good": finite and same and rel <= REL_MAX}
                result["rows"].append(row)
            mine = [r for r in result["rows"] if (r["matrix"], r["rows"]) == (mname, T)]
            ok = sorted((r for r in mine if r["good"]), key=lambda r: r["us"])
            if base_us:
                result["baseline"][f"{N},{K},{T}"] = base_us
            if ok:
                best = ok[0]
                result["picks"][f"{N},{K},{T}"] = best["constants"]
                print(f"{mname:8} T={T:<5} default {base_us or float('nan'):9.1f} us  best "
                      f"{best['us']:9.1f} us ({best['TBps']:.2f} TB/s, {best['of_copy']:.2f} "
                      f"of copy, x{best['x_default']:.2f}) rel {best['rel']:.1e} regs "
                      f"{best['regs']} stack {best['stack_bytes']}  {best['constants']}",
                      flush=True)
            for r in [r for r in mine if not r["good"]][:5]:
                print(f"  BAD {mname} T={T} rel {r['rel']:.1e} finite {r['finite']} "
                      f"deterministic {r['deterministic']} {r['constants']}")
    result["skipped_for_budget"] = skipped
    print(f"swept in {time.perf_counter() - t_start:.0f}s; skipped for the budget: {skipped}")
    print("\n_FP8_TILES = {")
    for key, c in result["picks"].items():
        n, k, t = key.split(",")
        print(f"    ({n}, {k}, {t}): {c},")
    print("}")
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
