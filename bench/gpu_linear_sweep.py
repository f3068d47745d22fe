"""Sweep linear variants (tile sizes, warps, stages, activation split) on two 8B shapes.

    python bench/gpu_linear_sweep.py --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

CASES = [(28672, 4096), (4096, 14336), (3072, 576)]


def variants(T):
    bt = 16 if T <= 16 else 64
    out = []
    for bn in (16, 32, 64):
        for bk in (64, 128, 256):
            for warps in (4, 8):
                for stages in (3,):
                    for pre in (0, 1):
                        for xs in (1, 0):
                            out.append(dict(BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk, WBF16=1, K16=1,
                                            WARPS=warps, STAGES=stages, PREFETCH=pre,
                                            XSPLIT=xs))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--budget-s", type=float, default=150)
    args = ap.parse_args()
    from helios_contract.schema import manifest_pb2 as mpb
    from helios_ignition.kernels_aot import compile_all
    from helios_serve.runtime.cuda import driver as drv

    cu = drv.require_driver()
    dev = drv.call("dev", cu.cuDeviceGet(0))
    ctx = drv.call("ctx", cu.cuDevicePrimaryCtxRetain(dev))
    drv.call("set", cu.cuCtxSetCurrent(ctx))
    stream = drv.call("stream", cu.cuStreamCreate(1))
    t_start = time.perf_counter()
    # compile every variant once, in parallel
    allv = {}
    for T in (8, 64):
        for c in variants(T):
            allv[tuple(sorted(c.items()))] = c
    kernels = []
    for i, c in enumerate(allv.values()):
        k = mpb.Kernel(id=f"v{i}", reference_op="linear")
        for key, v in c.items():
            k.constants[key] = v
        kernels.append(k)
    try:
        compiled = compile_all(kernels, ("sm_90",), workers=16)
    except Exception as exc:  # a variant that does not fit: compile one by one
        print("parallel compile failed:", exc)
        compiled = []
        for k in kernels:
            try:
                compiled += compile_all([k], ("sm_90",), workers=1)
            except Exception as e2:
                print("skip", dict(k.constants), str(e2)[:200])
    print(f"compiled {len(compiled)} variants in {time.perf_counter() - t_start:.0f}s",
          flush=True)
    byid = {k.id: dict(k.constants) for k in kernels}
    fns = {}
    for ck in compiled:
        if ck.shared_bytes > 227 * 1024:
            continue
        mod = drv.call("l", cu.cuModuleLoadData(ck.binary))
        fn = drv.call("f", cu.cuModuleGetFunction(mod, ck.entry_name.encode()))
        if ck.shared_bytes > 48 * 1024:
            drv.call("s", cu.cuFuncSetAttribute(
                fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                ck.shared_bytes))
        fns[ck.kernel_id] = (fn, ck, drv.param_count(fn))
    rows = []
    for N, K in CASES:
        wbytes = N * K * 2
        copies = max(1, min(4, (1 << 30) // wbytes))
        w = [int(drv.call("a", cu.cuMemAlloc(wbytes))) for _ in range(copies)]
        for p in w:
            drv.call("m", cu.cuMemsetD16(p, 0x3C00, N * K))
        x = int(drv.call("a", cu.cuMemAlloc(64 * K * 4)))
        o = int(drv.call("a", cu.cuMemAlloc(64 * N * 4)))
        for kid, (fn, ck, count) in fns.items():
            c = byid[kid]
            T = 8 if c["BLOCK_T"] == 16 else 64
            if time.perf_counter() - t_start > args.budget_s:
                break
            grid = (-(-N // c["BLOCK_N"]), -(-T // c["BLOCK_T"]), 1)
            keep = []
            drv.call("b", cu.cuStreamBeginCapture(
                stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
            for i in range(10):
                a = drv.KernelArgs([("ptr", x), ("ptr", w[i % copies]), ("ptr", o), ("i32", T),
                                    ("i32", N), ("i32", K)] + [("ptr", 0)] * (count - 6))
                keep.append(a)
                drv.call("k", cu.cuLaunchKernel(fn, *grid, 32 * ck.num_warps, 1, 1,
                                                ck.shared_bytes, stream, a.address, 0))
            graph = drv.call("e", cu.cuStreamEndCapture(stream))
            exe = drv.call("i", cu.cuGraphInstantiate(graph, 0))
            drv.call("g", cu.cuGraphLaunch(exe, stream))
            drv.call("s", cu.cuStreamSynchronize(stream))
            t0 = time.perf_counter()
            for _ in range(3):
                drv.call("g", cu.cuGraphLaunch(exe, stream))
            drv.call("s", cu.cuStreamSynchronize(stream))
            us = (time.perf_counter() - t0) / 30 * 1e6
            rows.append({"N": N, "K": K, "T": T, "us": us, "GBps": wbytes / us / 1e3, **c})
            cu.cuGraphExecDestroy(exe)
            cu.cuGraphDestroy(graph)
        for p in w + [x, o]:
            cu.cuMemFree(p)
    for N, K in CASES:
        for T in (8, 64):
            best = sorted((r for r in rows if r["N"] == N and r["K"] == K and r["T"] == T),
                          key=lambda r: r["us"])[:5]
            for r in best:
                print(f"N={N} K={K} T={T}: {r['us']:.1f} us {r['GBps']:.0f} GB/s "
                      f"BN={r['BLOCK_N']} BK={r['BLOCK_K']} W={r['WARPS']} S={r['STAGES']} "
                      f"PRE={r['PREFETCH']} XS={r['XSPLIT']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
