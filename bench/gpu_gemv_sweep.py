"""Batch-1 GEMV variants against today's kernel and a copy of the same bytes (issue 17).

    python bench/gpu_gemv_sweep.py --json OUT.json [--budget-s 110] [--dry-run]

The matrices of one decode step as the models run them: Llama-3.1-8B qkv 4096->6144,
o 4096->4096, gate/up 4096->2x14336, down 14336->4096 as ``swiglu_linear`` (the
activation is ``silu(gate) * up`` of a ``[1, 2 x 14336]`` row, as decode launches it),
lm_head 4096->128256; SmolLM2-135M's five likewise; and each down projection as a plain
``linear`` of a ``[1, 14336]`` row (``down_plain``), which with a ``silu_mul`` launch (timed
too) is the unfused alternative (``HELIOS_FUSE=0``). bf16 weights, f32 activations.

Variants are ``HELIOS_LINEAR_GEMV`` specs (``launch.gemv_constants``): "v1" (today's rule,
the baseline of every ratio), its STAGES 1 / 4 forms, and a grid over rows per program,
K step, warps, a persistent grid (``PERSIST`` x 132 programs looping over row tiles),
a register prefetch of the next weight tile (``PRE``) and evict-first weight loads
(``EVICT``). Each runs as a CUDA graph of max(10, copies) launches over rotating weight
copies that together exceed 192 MB (so L2, 50 MB, does not serve repeats: SmolLM2's
matrices are 0.7-57 MB), replayed 10 times, best of 2 timings. In the same run and
the same way: ``cuMemcpyDtoDAsync`` of the same weight bytes (``copy_TBps`` counts bytes
read plus written, the roofline's convention) and a read-only Triton kernel summing the
same bytes (``read_TBps``). ``of_copy`` = GEMV weight TB/s / copy TB/s.

Every variant's output (poisoned with NaN first) is checked against a float64 NumPy
reference on 512 columns (``rel``) and relaunched to check it is bitwise deterministic;
rows that fail are reported and never chosen. The summary per shape: v1, the best three
and the best of each family; per model: the linear ms of one decode step (layers x
(qkv + o + gate_up + down) + lm_head) under v1, under the best single spec for all
matrices, and under the best spec per matrix. ``--dry-run`` (no GPU) compiles every
variant for sm_90.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import triton
import triton.language as tl
from _report import write_json  # bench/ is this script's folder

# (name, N, K, op); layers per model for the step projection.
SHAPES = {"llama8b": [("qkv", 6144, 4096, "linear"), ("o", 4096, 4096, "linear"),
                      ("gate_up", 28672, 4096, "linear"),
                      ("down", 4096, 14336, "swiglu_linear"),
                      ("lm_head", 128256, 4096, "linear"),
                      ("down_plain", 4096, 14336, "linear")],
          "smollm2": [("qkv", 960, 576, "linear"), ("o", 576, 576, "linear"),
                      ("gate_up", 3072, 576, "linear"), ("down", 576, 1536, "swiglu_linear"),
                      ("lm_head", 49152, 576, "linear"), ("down_plain", 576, 1536, "linear")]}
STEP = ("qkv", "o", "gate_up", "down", "lm_head")  # what one decode step launches
LAYERS = {"llama8b": 32, "smollm2": 30}
CHECK_COLS = 512
LAUNCHES, REPLAYS, MAX_COPIES = 10, 10, 192


# --down: more rows per program still (the fused down projection computes silu(gate) * up
# once per program and K element: 32 rows per program read and compute it 8x less than 4).
WIDE_ROWS: tuple[tuple[int, int, int], ...] = ()


def gemv_specs() -> list[str]:
    """The swept HELIOS_LINEAR_GEMV specs (plus "v1" first); STAGES forms are "v1@S"."""
    out = ["v1", "v1@1", "v1@4", "4,2048,4,0,0,1"]
    for bn, bk, warps in WIDE_ROWS:
        for persist, pre in ((0, 0), (0, 1), (4, 1), (8, 0)):
            out.append(f"{bn},{bk},{warps},{persist},{pre},0")
    # More rows per program read each activation element fewer times (SwiGLU's down
    # projection reads gate and up, 8 bytes, per 2-byte weight column element).
    for bn, bk, warps in ((4, 2048, 4), (4, 4096, 8), (8, 1024, 4), (8, 2048, 8),
                          (2, 4096, 4), (4, 1024, 2), (8, 4096, 8), (16, 1024, 8),
                          (16, 2048, 8)):
        for persist in (0, 2, 4, 8):
            for pre in (0, 1):
                if (persist, pre) != (0, 0) or (bn, bk, warps) != (4, 2048, 4):
                    out.append(f"{bn},{bk},{warps},{persist},{pre},0")
        out.append(f"{bn},{bk},{warps},4,1,1")  # evict-first on the streamed form
    return out


def kernel_key(op: str, c: dict[str, int]) -> tuple:
    """The compiled kernel of constants `c`: the launch's program count is not a
    constant, and the kernel reads only whether PERSIST is set (its grid is the launch's)."""
    kc = {k: (min(v, 1) if k == "PERSIST" else v) for k, v in c.items() if k != "PROGRAMS"}
    return (op, tuple(sorted(kc.items())))


def constants(spec: str, N: int, K: int, op: str) -> dict[str, int]:
    """Kernel constants (with WARPS, PROGRAMS and STAGES) of `spec` for an N x K weight
    under `op` (``swiglu_linear`` is the linear kernel with SWIGLU=1, as launch_config
    makes it)."""
    from helios_ignition.capture import launch

    base, _, stages = spec.partition("@")
    c = launch.gemv_constants(N, K, base)
    c.update(BLOCK_T=1, WBF16=1, K16=int(K % 16 == 0))
    if op == "swiglu_linear":
        c["SWIGLU"] = 1
    if stages:
        c["STAGES"] = int(stages)
    return c


def family(spec: str) -> str:
    if spec.startswith("v1"):
        return spec
    _, _, _, persist, pre, evict = (int(v) for v in spec.split(","))
    return (("persistent" if persist else "grid") + ("+prefetch" if pre else "")
            + ("+evict" if evict else ""))


@triton.jit
def read_sum(src, out, n, BLOCK: tl.constexpr):
    """``out[p] = sum`` of program p's BLOCK bf16 elements: a read-only stream."""
    p = tl.program_id(0)
    offs = p.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(src + offs, mask=offs < n, other=0.0, eviction_policy="evict_first")
    tl.store(out + p, tl.sum(v.to(tl.float32), axis=0))


READ_BLOCK = 8192


def compile_all(items: set[tuple], workers: int):
    """Compile every (op, constants) for sm_90 -> ({key: CompiledKernel}, {key: error})."""
    from helios_ignition.kernels_aot import compile_each, variant_kernel

    keys = sorted(items)
    kernels = []
    for i, key in enumerate(keys):
        kernels.append(variant_kernel(f"g{i}", key[0], dict(key[1])))
    byid = {k.id: key for k, key in zip(kernels, keys, strict=True)}
    compiled, failed = compile_each(kernels, "sm_90", workers)
    return ({byid[ck.kernel_id]: ck for ck in compiled},
            {byid[kid]: err for kid, err in failed.items()})


def compile_read():
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(read_sum, {"src": "*bf16", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                    {"BLOCK": READ_BLOCK}, {(0,): [["tt.divisibility", 16]],
                                            (1,): [["tt.divisibility", 16]]})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 8, "num_stages": 1})


def work_items() -> set[tuple]:
    return {kernel_key(op, constants(spec, N, K, op)) for shapes in SHAPES.values()
            for _, N, K, op in shapes for spec in gemv_specs()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--budget-s", type=float, default=110,
                    help="stop timing new variants after this many seconds")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--dry-run", action="store_true", help="compile only (no GPU)")
    ap.add_argument("--down", action="store_true",
                    help="only the down projections (fused and plain) and wider row tiles")
    args = ap.parse_args()
    if args.down:
        global WIDE_ROWS
        WIDE_ROWS = ((32, 512, 8), (32, 1024, 8), (16, 1024, 4), (64, 256, 8))
        for model in SHAPES:
            SHAPES[model] = [s for s in SHAPES[model] if s[0] in ("down", "down_plain")]
    t_start = time.perf_counter()
    items = work_items()
    print(f"{len(gemv_specs())} specs, {len(items)} distinct (op, constants)", flush=True)
    compiled, failed = compile_all(items, args.workers)
    read_ck = compile_read()
    from helios_ignition.kernels_aot import compile_variant

    silu_ck = compile_variant("silu_mul", dict(BLOCK=1024, WARPS=4), "sm_90")
    for key, err in failed.items():
        print("compile failed:", key, err[:300])
    print(f"compiled {len(compiled)}/{len(items)} for sm_90 in "
          f"{time.perf_counter() - t_start:.0f}s", flush=True)
    if args.dry_run:
        return
    from helios_serve.runtime.cuda import driver as drv

    cu, stream = drv.current_stream()
    attr = cu.CUfunction_attribute

    def load(binary, entry, shared):
        mod = drv.call("l", cu.cuModuleLoadData(binary))
        fn = drv.call("f", cu.cuModuleGetFunction(mod, entry.encode()))
        if shared > 48 * 1024:
            drv.call("s", cu.cuFuncSetAttribute(
                fn, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared))
        return fn

    fns = {}
    for key, ck in compiled.items():
        fn = load(ck.binary, ck.entry_name, ck.shared_bytes)
        regs = drv.call("r", cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, fn))
        local = drv.call("r", cu.cuFuncGetAttribute(
            attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn))
        fns[key] = (fn, ck, drv.param_count(fn), int(regs), int(local))
    rmd = read_ck.metadata
    read_fn = load(bytes(read_ck.asm["cubin"]), rmd.name, int(rmd.shared))
    read_params = drv.param_count(read_fn)
    silu_fn = load(silu_ck.binary, silu_ck.entry_name, silu_ck.shared_bytes)
    silu_params = drv.param_count(silu_fn)

    rng = np.random.default_rng(0)
    pool = (rng.standard_normal(1 << 24, dtype=np.float32) * 0.02)
    pool_bits = (pool.view(np.uint32) >> 16).astype(np.uint16)
    maxw = max(N * K * 2 for s in SHAPES.values() for _, N, K, _ in s)
    dst = int(drv.call("a", cu.cuMemAlloc(maxw)))  # the copy's destination
    part = int(drv.call("a", cu.cuMemAlloc(4 * (maxw // 2 // READ_BLOCK + 1))))
    data = []
    for model, shapes in SHAPES.items():
        for name, N, K, op in shapes:
            wbytes = N * K * 2
            bits = np.resize(pool_bits, N * K)
            # Enough rotating copies that one graph streams >= 192 MB (L2 is 50 MB): each
            # launch reads its weights from HBM, as a decode step does (its 30-32 layers'
            # weights do not fit L2 either); 2 or more, so no launch repeats its predecessor's.
            copies = min(MAX_COPIES, max(2, -(-(192 << 20) // wbytes)))
            w = [int(drv.call("a", cu.cuMemAlloc(wbytes))) for _ in range(copies)]
            drv.call("h", cu.cuMemcpyHtoD(w[0], bits.ctypes.data, wbytes))
            for p in w[1:]:
                drv.call("d", cu.cuMemcpyDtoD(p, w[0], wbytes))
            cols = np.unique(np.concatenate([rng.integers(0, N, CHECK_COLS), [N - 1]]))
            wcols = (bits.reshape(N, K)[cols].astype(np.uint32) << 16).view(np.float32)
            swiglu = op == "swiglu_linear"
            x = (rng.standard_normal((1, 2 * K if swiglu else K)) * (3 if swiglu else 1)
                 ).astype(np.float32)
            xd = int(drv.call("a", cu.cuMemAlloc(x.nbytes)))
            drv.call("h", cu.cuMemcpyHtoD(xd, x.ctypes.data, x.nbytes))
            o = int(drv.call("a", cu.cuMemAlloc(N * 4)))
            a = x.astype(np.float64)
            if swiglu:
                g, u = a[:, :K], a[:, K:]
                a = g / (1 + np.exp(-g)) * u
            ref = a @ wcols.T.astype(np.float64)
            data.append(dict(model=model, name=name, N=N, K=K, op=op, w=w, x=xd, o=o,
                             cols=cols, ref=ref, wbytes=wbytes))
    print(f"data ready at {time.perf_counter() - t_start:.0f}s", flush=True)

    def timed(launch_one, w) -> float:
        """Best of 2 timings of REPLAYS replays of a graph of LAUNCHES launches, in us
        per launch."""
        keep = []
        drv.call("b", cu.cuStreamBeginCapture(
            stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        for i in range(max(LAUNCHES, len(w))):
            keep.append(launch_one(w[i % len(w)]))
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
        del keep
        return best

    refs = {}
    for d in data:
        n_el = d["N"] * d["K"]

        def read_one(wp, n_el=n_el):
            a = drv.KernelArgs([("ptr", wp), ("ptr", part), ("i32", n_el)]
                               + [("ptr", 0)] * (read_params - 3))
            drv.call("k", cu.cuLaunchKernel(read_fn, -(-n_el // READ_BLOCK), 1, 1, 256, 1, 1,
                                            int(rmd.shared), stream, a.address, 0))
            return a

        def copy_one(wp, nbytes=d["wbytes"]):
            drv.call("c", cu.cuMemcpyDtoDAsync(dst, wp, nbytes, stream))

        copy_us = timed(copy_one, d["w"])
        read_us = timed(read_one, d["w"])
        refs[(d["model"], d["name"])] = dict(
            copy_us=copy_us, copy_TBps=2 * d["wbytes"] / copy_us / 1e6, read_us=read_us,
            read_TBps=d["wbytes"] / read_us / 1e6)
        if d["op"] == "swiglu_linear":  # the unfused pair's first launch, on this input
            F = d["K"]
            act = int(drv.call("a", cu.cuMemAlloc(4 * F)))

            def silu_one(_wp, F=F, act=act, xd=d["x"]):
                a = drv.KernelArgs([("ptr", xd), ("ptr", act), ("i32", 1), ("i32", F)]
                                   + [("ptr", 0)] * (silu_params - 4))
                drv.call("k", cu.cuLaunchKernel(silu_fn, 1, -(-F // 1024), 1, 128, 1, 1,
                                                silu_ck.shared_bytes, stream, a.address, 0))
                return a

            refs[(d["model"], d["name"])]["silu_mul_us"] = timed(silu_one, [0])

    def launch(fn, ck, count, programs, d, wptr):
        a = drv.KernelArgs([("ptr", d["x"]), ("ptr", wptr), ("ptr", d["o"]), ("i32", 1),
                            ("i32", d["N"]), ("i32", d["K"])] + [("ptr", 0)] * (count - 6))
        drv.call("k", cu.cuLaunchKernel(fn, programs, 1, 1, 32 * ck.num_warps, 1, 1,
                                        ck.shared_bytes, stream, a.address, 0))
        return a

    def check(fn, ck, count, programs, d):
        outs, N = [], d["N"]
        for _ in range(2):
            # NaN, on the kernels' (non-blocking) stream so the poison is ordered before them
            drv.call("p", cu.cuMemsetD32Async(d["o"], 0x7FC00000, N, stream))
            keep = launch(fn, ck, count, programs, d, d["w"][0])
            drv.call("s", cu.cuStreamSynchronize(stream))
            host = np.empty((1, N), np.float32)
            drv.call("c", cu.cuMemcpyDtoH(host.ctypes.data, d["o"], host.nbytes))
            outs.append(host)
            del keep
        got = outs[0][:, d["cols"]].astype(np.float64)
        finite = bool(np.isfinite(outs[0]).all())
        rel = (float(np.linalg.norm(got - d["ref"]) / np.linalg.norm(d["ref"])) if finite
               else float("inf"))
        return rel, finite, bool(np.array_equal(outs[0].view(np.uint32),
                                                outs[1].view(np.uint32)))

    rows, skipped = [], 0
    for spec in gemv_specs():
        if time.perf_counter() - t_start > args.budget_s:
            skipped += 1
            continue
        for d in data:
            c = constants(spec, d["N"], d["K"], d["op"])
            key = kernel_key(d["op"], c)
            if key not in fns:
                continue
            fn, ck, count, regs, local = fns[key]
            programs = c["PROGRAMS"]
            rel, finite, same = check(fn, ck, count, programs, d)
            us = timed(lambda wp, fn=fn, ck=ck, count=count, programs=programs, d=d:
                       launch(fn, ck, count, programs, d, wp), d["w"])
            ref = refs[(d["model"], d["name"])]
            tbps = d["wbytes"] / us / 1e6
            rows.append({"model": d["model"], "matrix": d["name"], "op": d["op"], "N": d["N"],
                         "K": d["K"], "spec": spec, "family": family(spec), "us": us,
                         "TBps": tbps, "of_copy": tbps / ref["copy_TBps"],
                         "of_read": tbps / ref["read_TBps"], "rel": rel, "finite": finite,
                         "deterministic": same, "regs": regs, "local_bytes": local,
                         "programs": programs, "constants": c})
    print(f"timed {len(rows)} (spec, matrix) in {time.perf_counter() - t_start:.0f}s; "
          f"{skipped} specs skipped for the budget", flush=True)

    def good(r):
        return r["finite"] and r["deterministic"] and r["rel"] < 5e-5

    bad = [r for r in rows if not good(r)]
    summary, steps = [], []
    print(f"\n{'model':8} {'matrix':10} {'tag':30} {'spec':16} {'us':>8} {'TB/s':>5} "
          f"{'x v1':>5} {'ofcopy':>6} {'ofread':>6} {'rel':>7} regs")
    for model, shapes in SHAPES.items():
        for name, *_ in shapes:
            ref = refs[(model, name)]
            mine = [r for r in rows if (r["model"], r["matrix"]) == (model, name)]
            v1 = next((r for r in mine if r["spec"] == "v1"), None)
            base = v1["us"] if v1 else float("nan")
            ok = sorted((r for r in mine if good(r)), key=lambda r: r["us"])
            shown = [("v1 (today)", v1)] + [(f"best {i + 1}", r) for i, r in enumerate(ok[:3])]
            fams = {}
            for r in ok:
                if not r["spec"].startswith("v1"):
                    fams.setdefault(r["family"], r)
            shown += [(f"best {f}", r) for f, r in sorted(fams.items())]
            print(f"{model:8} {name:10} {'copy (same bytes)':30} {'':16} {ref['copy_us']:8.1f} "
                  f"{ref['copy_TBps']:5.2f}   (read+write)   read-only {ref['read_us']:.1f} us "
                  f"{ref['read_TBps']:.2f} TB/s")
            for tag, r in shown:
                if r is None:
                    continue
                print(f"{model:8} {name:10} {tag:30} {r['spec']:16} {r['us']:8.1f} "
                      f"{r['TBps']:5.2f} {base / r['us']:5.2f} {r['of_copy']:6.2f} "
                      f"{r['of_read']:6.2f} {r['rel']:7.1e} {r['regs']}")
                summary.append({"tag": tag, "x_v1": base / r["us"], **r})
        # One decode step's linear time: layers x (qkv + o + gate_up + down) + lm_head.
        names = list(STEP)
        weight = {n: (LAYERS[model] if n != "lm_head" else 1) for n in names}
        by_spec: dict[str, dict[str, float]] = {}
        for r in rows:
            if r["model"] == model and good(r):
                by_spec.setdefault(r["spec"], {})[r["matrix"]] = r["us"]
        full = {s: sum(weight[n] * t[n] for n in names) / 1e3
                for s, t in by_spec.items() if all(n in t for n in names)}
        best_each = {n: min((t[n], s) for s, t in by_spec.items() if n in t) for n in names
                     if any(n in t for t in by_spec.values())}
        copy_ms = sum(weight[n] * refs[(model, n)]["copy_us"] for n in names
                      if (model, n) in refs) / 1e3 / 2
        wbytes = sum(weight[n] * N * K * 2 for n, N, K, _ in shapes if n in weight)
        silu_us = refs.get((model, "down"), {}).get("silu_mul_us", float("nan"))
        plain = [(t["down_plain"], s) for s, t in by_spec.items() if "down_plain" in t]
        unfused = min(plain) if plain else None
        step = {"model": model, "weight_bytes": wbytes,
                "copy_ms_at_read_bytes": copy_ms,
                "v1_ms": full.get("v1"),
                "best_single": min(full.items(), key=lambda kv: kv[1]) if full else None,
                "best_per_matrix": {n: {"spec": s, "us": t} for n, (t, s) in best_each.items()},
                "best_per_matrix_ms": (sum(weight[n] * best_each[n][0] for n in names) / 1e3
                                       if len(best_each) == len(names) else None),
                "silu_mul_us": silu_us,
                "down_unfused_best": ({"spec": unfused[1], "linear_us": unfused[0],
                                       "with_silu_mul_us": unfused[0] + silu_us}
                                      if unfused else None)}
        steps.append(step)
        bs = step["best_single"]
        print(f"{model}: linear ms per decode step ({wbytes / 1e9:.2f} GB of weights): v1 "
              f"{step['v1_ms'] or float('nan'):.3f}; best single spec "
              f"{bs[0] if bs else '-'} {bs[1] if bs else float('nan'):.3f}; best per matrix "
              f"{step['best_per_matrix_ms'] or float('nan'):.3f}; a copy of the same bytes "
              f"(read+write at copy speed, halved) {copy_ms:.3f}")
        if unfused:
            fused = best_each.get("down", (float("nan"), "-"))
            print(f"{model}: down projection fused (best {fused[1]}) {fused[0]:.1f} us vs "
                  f"silu_mul {silu_us:.1f} us + linear (best {unfused[1]}) {unfused[0]:.1f} us "
                  f"= {unfused[0] + silu_us:.1f} us")
    print(f"\n{'model':8} {'matrix':10} {'copy TB/s':>9} {'read TB/s':>9} {'v1 us':>7} "
          f"{'v1 TB/s':>7} {'best spec':16} {'us':>7} {'TB/s':>5} {'of copy':>7} {'x v1':>5}")
    for model, shapes in SHAPES.items():
        for name, *_ in shapes:
            ref = refs[(model, name)]
            mine = [r for r in rows if (r["model"], r["matrix"]) == (model, name)]
            v1 = next((r for r in mine if r["spec"] == "v1"), None)
            ok = sorted((r for r in mine if good(r)), key=lambda r: r["us"])
            if not (v1 and ok):
                continue
            b = ok[0]
            print(f"{model:8} {name:10} {ref['copy_TBps']:9.2f} {ref['read_TBps']:9.2f} "
                  f"{v1['us']:7.1f} {v1['TBps']:7.2f} {b['spec']:16} {b['us']:7.1f} "
                  f"{b['TBps']:5.2f} {b['of_copy']:7.2f} {v1['us'] / b['us']:5.2f}")
    print(f"{len(bad)} rows failed verification (NaN, nondeterministic or rel >= 5e-5)")
    for r in bad[:20]:
        print("  FAIL", r["model"], r["matrix"], r["spec"], r["rel"], r["finite"],
              r["deterministic"])
    print(f"done in {time.perf_counter() - t_start:.0f}s", flush=True)
    if args.json:
        write_json(args.json, {"rows": rows, "summary": summary, "steps": steps,
                               "references": [{"model": m, "matrix": n, **v}
                                              for (m, n), v in refs.items()],
                               "compile_failed": {str(k): v for k, v in failed.items()},
                               "launches_per_graph": LAUNCHES, "replays": REPLAYS})


if __name__ == "__main__":
    main()
