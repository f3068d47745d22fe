"""Linear (GEMV / skinny GEMM) microbenchmark: bf16 weights, f32 activations, on the GPU.

    python bench/gpu_linear.py --json OUT.json

For each (N, K) of SmolLM2-135M and Llama-3.1-8B and T in {1, 8, 64}, times both
multi-row layouts (``SWAP=1`` weights as the MMA's M operand; ``SWAP=0`` tokens as M)
as a CUDA graph of 20 back-to-back launches, over 4 rotating weight copies when they
fit (so L2 does not serve repeats). Reports weight GB/s (bytes of W per launch / time).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from _report import write_json  # bench/ is this script's folder

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"smollm2": [(960, 576), (3072, 576), (576, 1536), (49152, 576)],
          "llama8b": [(6144, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    import helios_ignition.capture.launch as launch
    from helios_ignition.kernels_aot import compile_variant
    from helios_serve.runtime.cuda import driver as drv

    cu, stream = drv.current_stream()
    rows = []
    cache = {}

    class V:  # what launch_config reads of a view
        def __init__(self, shape, dtype):
            self.shape, self.buffer = shape, type("D", (), {"dtype": dtype})()

    for model, shapes in SHAPES.items():
        for N, K in shapes:
            wbytes = N * K * 2
            copies = max(1, min(4, (1 << 30) // wbytes))
            w = [int(drv.call("a", cu.cuMemAlloc(wbytes))) for _ in range(copies)]
            for p in w:
                drv.call("m", cu.cuMemsetD16(p, 0x3C00, N * K))  # bf16 1.0 (speed only)
            x = int(drv.call("a", cu.cuMemAlloc(64 * K * 4)))
            o = int(drv.call("a", cu.cuMemAlloc(64 * N * 4)))
            for T in (1, 8, 64):
                for swap in ((0,) if T == 1 else (1, 0)):
                    launch.LINEAR_SWAP = bool(swap)
                    cfg = launch.launch_config("linear", [T, N, K],
                                               [V((T, K), "f32"), V((N, K), "bf16"),
                                                V((T, N), "f32")])
                    key = tuple(sorted(cfg.constants.items()))
                    if key not in cache:
                        ck = compile_variant("linear", dict(key), "sm_90")
                        mod = drv.call("l", cu.cuModuleLoadData(ck.binary))
                        fn = drv.call("f", cu.cuModuleGetFunction(mod, ck.entry_name.encode()))
                        if ck.shared_bytes > 48 * 1024:
                            drv.call("s", cu.cuFuncSetAttribute(
                                fn, cu.CUfunction_attribute
                                .CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                ck.shared_bytes))
                        cache[key] = (fn, ck, drv.param_count(fn))
                    fn, ck, count = cache[key]
                    keep = []
                    drv.call("b", cu.cuStreamBeginCapture(
                        stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
                    for i in range(20):
                        vals = [("ptr", x), ("ptr", w[i % copies]), ("ptr", o), ("i32", T),
                                ("i32", N), ("i32", K)] + [("ptr", 0)] * (count - 6)
                        a = drv.KernelArgs(vals)
                        keep.append(a)
                        g = cfg.grid
                        drv.call("k", cu.cuLaunchKernel(fn, g[0], g[1], g[2],
                                                        32 * ck.num_warps, 1, 1,
                                                        ck.shared_bytes, stream, a.address, 0))
                    graph = drv.call("e", cu.cuStreamEndCapture(stream))
                    exe = drv.call("i", cu.cuGraphInstantiate(graph, 0))
                    for _ in range(2):
                        drv.call("g", cu.cuGraphLaunch(exe, stream))
                    drv.call("s", cu.cuStreamSynchronize(stream))
                    t0 = time.perf_counter()
                    for _ in range(5):
                        drv.call("g", cu.cuGraphLaunch(exe, stream))
                    drv.call("s", cu.cuStreamSynchronize(stream))
                    us = (time.perf_counter() - t0) / 100 * 1e6
                    r = {"model": model, "N": N, "K": K, "T": T, "swap": swap, "us": us,
                         "weight_GBps": wbytes / us / 1e3, "grid": cfg.grid,
                         "constants": cfg.constants}
                    rows.append(r)
                    print(f"{model:8} N={N:6} K={K:5} T={T:2} swap={swap} {us:8.1f} us "
                          f"{r['weight_GBps']:7.0f} GB/s", flush=True)
            for p in w + [x, o]:
                cu.cuMemFree(p)
    if args.json:
        write_json(args.json, rows)
    _ = (np, sys, ROOT)


if __name__ == "__main__":
    main()
