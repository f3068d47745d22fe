"""Decode attention over an f32 KV cache against an e4m3 one (issue 31 item 4) and a bf16
one (issue 27), on the device, each variant verified first.

    HELIOS_COMMIT=<sha> python bench/gpu_kv_fp8.py --json OUT.json [--dry-run]
        [--forms f32,fp8,bf16]

Llama-3.1-8B geometry (H=32, KVH=8, HD=128), the serving recipes' 8,192-position
capacity (MP = 512 pages of PT = 16: ``decode_splits`` gives the split partition), B in
{1, 64} rows at 1,024 / 2,048 / 4,096 / 8,192 positions (B=64 at 8,192: 64 x 8,192
positions, 2 GiB of f32 K/V per layer copy), and B = 256 (the serving recipe's decode
bucket) at 1,024 / 2,048. For each, the serving rule's ``attention_decode_split`` +
``attention_decode_merge`` (``launch_config``, the default rule) over f32 planes,
``attention_decode_split_fp8kv`` + merge (the same constants) over e4m3 planes with
per-head scales and ``attention_decode_split_bf16kv`` + merge over bf16 planes: per
layer, as a CUDA graph of both launches over NL separate cache copies (at least ~256 MB
of cache per replay so L2 does not serve repeats), 5 replays. Reported: us per layer, the
bytes of K/V read (live rows' positions x KVH x HD x 2 planes x 4, 1 or 2 bytes) over the
time (GB/s), and each form's speed-up over f32.

Each variant's merged output (poisoned with NaN first) of up to 4 rows is compared with
the NumPy reference (``attention_decode`` over the f32 planes; over the dequantized
planes for e4m3): ``rel`` = max |gpu - ref| / max |ref| must be < 1e-5.

e4m3 reads a quarter of the f32 cache's bytes, bf16 half; ``--dry-run`` (no GPU) compiles
the kernels for sm_90.
Writes JSON with the commit, the card and every row.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
from _report import git_commit, write_json  # bench/ is this script's folder

H, KVH, HD = 32, 8, 128
ROWS = (1, 64, 256)
POSITIONS = (1024, 2048, 4096, 8192)
# (rows, positions) measured: 256 rows stop at 2,048 positions (16 GiB of f32 K/V a layer
# copy at 8,192).
CASES = tuple((B, n) for B in ROWS for n in POSITIONS if B < 256 or n <= 2048)
OPS = {"f32": "attention_decode_split", "fp8": "attention_decode_split_fp8kv",
       "bf16": "attention_decode_split_bf16kv"}
ELEMENT_BYTES = {"f32": 4, "fp8": 1, "bf16": 2}
PT, CAPACITY = 16, 8192
MP = CAPACITY // PT
REPS = 5


def _constants():
    from helios_ignition.capture import launch
    from helios_ignition.capture.buffers import decode_splits

    ns, split = decode_splits(CAPACITY)
    out = {}
    for B in ROWS:
        sc = launch.launch_config("attention_decode_split",
                                  [B, MP, PT, H, KVH, HD, ns, split, HD ** -0.5]).constants
        mc = launch.launch_config("attention_decode_merge", [B, H, HD, ns]).constants
        out[B] = (ns, split, dict(sc), dict(mc))
    return out


def _compile(consts):
    from helios_ignition.kernels_aot import compile_all, variant_kernel

    kernels, keys = [], []
    for B, (_, _, sc, mc) in consts.items():
        for op, c in (*((op, sc) for op in OPS.values()), ("attention_decode_merge", mc)):
            kernels.append(variant_kernel(f"k{len(kernels)}", op, c))
            keys.append((B, op))
    return dict(zip(keys, compile_all(kernels, ("sm_90",), workers=4), strict=True))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--dry-run", action="store_true", help="compile only (no GPU)")
    ap.add_argument("--forms", default="f32,fp8,bf16",
                    help="comma-separated caches to measure (f32 is the baseline)")
    args = ap.parse_args()
    forms = ["f32", *(f for f in args.forms.split(",") if f != "f32")]
    t_start = time.perf_counter()
    consts = _constants()
    compiled = _compile(consts)
    print(f"compiled {len(compiled)} kernels in {time.perf_counter() - t_start:.0f}s",
          flush=True)
    if args.dry_run:
        return
    from helios_serve.runtime.cuda import driver as drv
    from helios_tools import kernels as K
    from helios_tools.kernels.kv_bf16 import Bf16Plane, encode_bf16
    from helios_tools.kernels.kv_fp8 import E4m3Plane, quantize_kv

    cu, stream = drv.current_stream()
    _, device = drv.call("dev", cu.cuCtxGetDevice())
    card = drv.call("name", cu.cuDeviceGetName(64, device)).decode().rstrip("\x00")
    fns = {}
    for key, ck in compiled.items():
        mod = drv.call("l", cu.cuModuleLoadData(ck.binary))
        fn = drv.call("f", cu.cuModuleGetFunction(mod, ck.entry_name.encode()))
        if ck.shared_bytes > 48 * 1024:
            drv.call("s", cu.cuFuncSetAttribute(
                fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                ck.shared_bytes))
        fns[key] = (fn, ck, drv.param_count(fn))

    def alloc(nbytes):
        return int(drv.call("a", cu.cuMemAlloc(max(nbytes, 256))))

    def h2d(ptr, arr):
        arr = np.ascontiguousarray(arr)
        drv.call("h", cu.cuMemcpyHtoD(ptr, arr.ctypes.data, arr.nbytes))

    def d2h(ptr, like):
        host = np.empty_like(like)
        drv.call("c", cu.cuMemcpyDtoH(host.ctypes.data, ptr, host.nbytes))
        return host

    rng = np.random.default_rng(0)
    scale = HD ** -0.5
    ks = (0.5 + rng.random(KVH)).astype(np.float32) / 64
    vs = (0.5 + rng.random(KVH)).astype(np.float32) / 64
    # Caches are tiled from pools of whole head rows (so each element keeps its head's
    # scale): quantizing gigabytes element by element would take minutes.
    pool_rows = 1 << 12
    pools = [rng.standard_normal((pool_rows, KVH, HD), dtype=np.float32) for _ in range(2)]
    coded = [quantize_kv(pools[0], ks), quantize_kv(pools[1], vs)]
    halved = [encode_bf16(p) for p in pools]
    rows = []
    for B, npos in CASES:
        ns, split, sc, mc = consts[B]
        pages = -(-npos // PT)
        P = B * pages
        pt = rng.permutation(P).astype(np.int32).reshape(B, pages)
        table = np.zeros((B, MP), np.int32)
        table[:, :pages] = pt
        pos = np.full(B, npos - 1, np.int32)
        slot = np.arange(B, dtype=np.int32)
        qkv = rng.standard_normal((B, (H + 2 * KVH) * HD)).astype(np.float32)
        shape = (P, PT, KVH, HD)
        k32, v32 = (np.resize(p, shape) for p in pools)
        caches = {"f32": (k32, v32)}
        if "fp8" in forms:
            caches["fp8"] = tuple(np.resize(c, shape) for c in coded)
        if "bf16" in forms:
            caches["bf16"] = tuple(np.resize(c, shape) for c in halved)
        vr = np.unique([0, B // 2, B - 1])[:4]
        d = {"qkv": alloc(qkv.nbytes), "pos": alloc(pos.nbytes), "slot": alloc(slot.nbytes),
             "pt": alloc(table.nbytes), "ml": alloc(B * H * ns * 2 * 4),
             "po": alloc(B * H * ns * HD * 4), "out": alloc(B * H * HD * 4),
             "ks": alloc(KVH * 4), "vs": alloc(KVH * 4)}
        for name, arr in (("qkv", qkv), ("pos", pos), ("slot", slot), ("pt", table),
                          ("ks", ks), ("vs", vs)):
            h2d(d[name], arr)
        out0 = np.zeros((B, H * HD), np.float32)
        for form, (kc, vc) in caches.items():
            nbytes = kc.nbytes
            nl = int(max(2, min(32, -(-(256 << 20) // (2 * nbytes)))))
            planes = []
            for _ in range(nl):
                kp, vp = alloc(nbytes), alloc(nbytes)
                h2d(kp, kc)
                h2d(vp, vc)
                planes.append((kp, vp))
            op = OPS[form]
            fn_s, ck_s, cnt_s = fns[(B, op)]
            fn_m, ck_m, cnt_m = fns[(B, "attention_decode_merge")]
            grid_z = -(-ns // sc.get("SPP", 1))
            grid_y = KVH if sc["GROUPED"] else H

            def launch(kp, vp, fn_s=fn_s, ck_s=ck_s, cnt_s=cnt_s, fn_m=fn_m, ck_m=ck_m,
                       cnt_m=cnt_m, grid_y=grid_y, grid_z=grid_z, form=form, d=d, B=B,
                       ns=ns, split=split):
                planes_args = [("ptr", kp), ("ptr", vp)]
                if form == "fp8":
                    planes_args += [("ptr", d["ks"]), ("ptr", d["vs"])]
                head = [("ptr", d["qkv"]), ("ptr", d["pos"]), ("ptr", d["slot"]),
                        ("ptr", d["pt"]), *planes_args, ("ptr", d["ml"]), ("ptr", d["po"]),
                        ("i32", B), ("i32", MP), ("i32", PT), ("i32", H), ("i32", KVH),
                        ("i32", HD), ("i32", ns), ("i32", split), ("f32", scale)]
                a1 = drv.KernelArgs(head + [("ptr", 0)] * (cnt_s - len(head)))
                drv.call("k", cu.cuLaunchKernel(fn_s, B, grid_y, grid_z,
                                                32 * ck_s.num_warps, 1, 1,
                                                ck_s.shared_bytes, stream, a1.address, 0))
                tail = [("ptr", d["ml"]), ("ptr", d["po"]), ("ptr", d["slot"]),
                        ("ptr", d["out"]), ("i32", B), ("i32", H), ("i32", HD), ("i32", ns)]
                a2 = drv.KernelArgs(tail + [("ptr", 0)] * (cnt_m - len(tail)))
                drv.call("k", cu.cuLaunchKernel(fn_m, B, H, 1, 32 * ck_m.num_warps, 1, 1,
                                                ck_m.shared_bytes, stream, a2.address, 0))
                return a1, a2

            drv.call("p", cu.cuMemsetD32Async(d["out"], 0x7FC00000, B * H * HD, stream))
            keep = launch(*planes[0])
            drv.call("s", cu.cuStreamSynchronize(stream))
            got = d2h(d["out"], out0)[vr]
            del keep
            ref = np.zeros((vr.size, H * HD), np.float32)
            if form == "fp8":  # the reference reads what the kernel reads, decoded
                kf, vf = E4m3Plane(kc, ks), E4m3Plane(vc, vs)
            elif form == "bf16":
                kf, vf = Bf16Plane(kc), Bf16Plane(vc)
            else:
                kf, vf = kc, vc
            K.attention_decode(qkv[vr], pos[vr], slot[vr], table, kf, vf, ref, vr.size, MP,
                               PT, H, KVH, HD, scale)
            finite = bool(np.isfinite(got).all())
            rel = (float(np.abs(got.astype(np.float64) - ref).max()
                         / max(np.abs(ref).max(), 1e-30)) if finite else float("inf"))
            keep = []
            drv.call("b", cu.cuStreamBeginCapture(
                stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
            for kp, vp in planes:
                keep.append(launch(kp, vp))
            graph = drv.call("e", cu.cuStreamEndCapture(stream))
            exe = drv.call("i", cu.cuGraphInstantiate(graph, 0))
            drv.call("g", cu.cuGraphLaunch(exe, stream))
            drv.call("s", cu.cuStreamSynchronize(stream))
            t0 = time.perf_counter()
            for _ in range(REPS):
                drv.call("g", cu.cuGraphLaunch(exe, stream))
            drv.call("s", cu.cuStreamSynchronize(stream))
            us = (time.perf_counter() - t0) / (REPS * nl) * 1e6
            cu.cuGraphExecDestroy(exe)
            cu.cuGraphDestroy(graph)
            kv_bytes = B * npos * KVH * HD * 2 * ELEMENT_BYTES[form]
            rows.append({"B": B, "positions": npos, "cache": form, "us": us,
                         "GBps": kv_bytes / us / 1e3, "rel": rel, "ok": rel < 1e-5,
                         "layers": nl, "split": sc, "merge": mc, "NS": ns, "SPLIT": split})
            print(f"B={B:3d} positions={npos:5d} {form}: {us:8.2f} us/layer "
                  f"{kv_bytes / us / 1e3:7.1f} GB/s rel {rel:.1e}", flush=True)
            for kp, vp in planes:
                cu.cuMemFree(kp)
                cu.cuMemFree(vp)
        for p in d.values():
            cu.cuMemFree(p)
    others = forms[1:]
    print(f"\n{'B':>3} {'positions':>9} {'f32 us':>9} "
          + " ".join(f"{f + ' us':>9} {'x':>6}" for f in others))
    summary = []
    for B, npos in CASES:
        got = {r["cache"]: r for r in rows if (r["B"], r["positions"]) == (B, npos)}
        ok = all(r["ok"] for r in got.values())
        entry = {"B": B, "positions": npos, "f32_us": got["f32"]["us"], "ok": ok}
        for f in others:
            entry[f"{f}_us"] = got[f]["us"]
            entry[f"{f}_speedup"] = got["f32"]["us"] / got[f]["us"]
        summary.append(entry)
        print(f"{B:3d} {npos:9d} {got['f32']['us']:9.2f} "
              + " ".join(f"{got[f]['us']:9.2f} {entry[f + '_speedup']:5.2f}x" for f in others)
              + ("" if ok else "  FAILED verification"))
    if args.json:
        write_json(args.json, {"commit": git_commit(), "machine": platform.node(), "card": card,
                               "geometry": {"H": H, "KVH": KVH, "HD": HD},
                               "capacity": CAPACITY, "page_tokens": PT, "rows": rows,
                               "summary": summary,
                               "seconds": round(time.perf_counter() - t_start, 1)})


if __name__ == "__main__":
    main()
