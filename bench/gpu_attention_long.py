"""Decode attention at long contexts (issue 17): split + merge variants and context
partitions against today's launch rule, on the device, each verified first.

    python bench/gpu_attention_long.py --json OUT.json [--budget-s 100] [--dry-run]

The serving recipes capture a KV capacity of 8,192 positions (MP = 512 pages of PT = 16),
for which ``decode_splits`` gives NS = 64 splits of SPLIT = 128 positions, while the v2
rule's BLOCK_N is 64: each split walks two tiles per query head (``_split_fma``'s slow
path). For SmolLM2-135M (H=9, KVH=3, HD=64) and Llama-3.1-8B (H=32, KVH=8, HD=128), B in
{1, 8, 64} rows and 130-4096 positions, this times ``attention_decode_split`` +
``attention_decode_merge`` per layer (a CUDA graph of both launches over NL separate
cache copies, at least ~128 MB of cache per replay so L2 does not serve repeats; 5
replays) for:

- ``today``: ``launch_config``'s rule at (NS, SPLIT) = ``decode_splits(8192)``;
- ``today@2048``: the same rule at a 2,048-position capacity (32 x 64: one tile per split,
  the shape of bench/gpu_models.py's cores; positions <= 2048 only);
- GROUPED=2 split + merge with one tile per split: 128 x 64 (BLOCK_N 64; 1, 2 or 4
  splits per program, ``SPP``: the same results, fewer programs for the empty splits of
  short contexts) and 64 x 128 (BLOCK_N 128);
- ``attention_decode_fused`` (one launch: the program completing a row's last split
  merges it, a one-split row is written directly, empty splits exit without a store):
  one tile per split at 128 x 64 and 64 x 128, GROUPED=3's walk at 32 x 256.
  (The first run, bench/results/h200_2026-12-02/attn_long_aad133f.json, also timed
  GROUPED=3 split + merge and a fused kernel that always walked: both slower.)

Each variant's merged output (outputs poisoned with NaN first) of at most 8 rows (the
first four, the padding row, the last two: every row is its own programs, and the
reference of 64 rows at 2,048 positions would take half the budget) is compared with the
NumPy ``attention_decode`` reference (``rel`` = max |gpu - ref| / max |ref|; the fused
kernel's split counters must be zero again after it), with NaN in
the cache past each row's context in its last page and an unmapped page id past it, one
padding row and one shorter row when B > 2; it is relaunched to check it is bitwise
deterministic. Prints per (geometry, B, positions): us per layer (both launches) of every variant and
its ratio to ``today`` (> 1 is faster). ``--dry-run`` (no GPU) compiles every variant for
sm_90.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _report import write_json  # bench/ is this script's folder
from gpu_attention_sweep import _label, compile_variants

GEOMS = {"smollm2": (9, 3, 64), "llama8b": (32, 8, 128)}  # H, KVH, HD
ROWS = (1, 8, 64)
POSITIONS = {1: (130, 512, 1024, 2048, 4096), 8: (130, 512, 1024, 4096),
             64: (130, 512, 2048)}
PT, CAPACITY = 16, 8192
MP = CAPACITY // PT
UNMAPPED = 1 << 30  # page id past the last page of a row: reading it faults


def variants(B: int, H: int, KVH: int, HD: int) -> list[tuple[str, int, int, dict, dict]]:
    """(label, NS, SPLIT, split constants with WARPS, merge constants with WARPS)."""
    from helios_ignition.capture import launch
    from helios_ignition.capture.buffers import decode_splits

    bhd = launch._np2(HD, 16)
    bg = launch._np2(H // KVH)
    even = int(HD == bhd)

    def merge(ns: int) -> dict:
        return launch.attention_merge_constants(HD, ns, "v2")

    def sc(grouped: int, bn: int, warps: int) -> dict:
        return dict(BLOCK_N=bn, BLOCK_HD=bhd, BLOCK_G=bg, GROUPED=grouped, EVEN_HD=even,
                    WARPS=warps)

    out = []
    for label, cap in (("today", CAPACITY), ("today@2048", 2048)):
        ns, split = decode_splits(cap)
        out.append((label, ns, split, launch.attention_split_constants(B, H, KVH, HD, ns, split),
                    launch.attention_merge_constants(HD, ns)))
    for grouped, bn, warps, ns, split, spp in ((2, 64, 4, 128, 64, 1), (2, 64, 4, 128, 64, 2),
                                               (2, 64, 4, 128, 64, 4), (2, 64, 8, 128, 64, 4),
                                               (2, 128, 4, 64, 128, 1)):
        c = sc(grouped, bn, warps)
        if spp > 1:
            c["SPP"] = spp
        out.append((f"G{grouped} N{bn} W{warps} S{spp} @{ns}x{split}", ns, split, c,
                    merge(ns)))
    # One launch (attention_decode_fused): one tile per split where SPLIT <= BLOCK_N, else
    # GROUPED=3's walk.
    for bn, warps, ns, split in ((64, 4, 128, 64), (64, 8, 128, 64), (128, 4, 64, 128),
                                 (64, 4, 32, 256)):
        c = dict(BLOCK_N=bn, BLOCK_HD=bhd, BLOCK_G=bg, BLOCK_S=launch._np2(ns, 2),
                 EVEN_HD=even, WARPS=warps)
        out.append((f"fused N{bn} W{warps} @{ns}x{split}", ns, split, c, None))
    return out


def _key(c: dict) -> tuple:
    return tuple(sorted(c.items()))


def variant_table():
    allv = {"attention_decode_split": {}, "attention_decode_merge": {},
            "attention_decode_fused": {}}
    for B in ROWS:
        for H, KVH, HD in GEOMS.values():
            for _, _, _, s, m in variants(B, H, KVH, HD):
                if m is None:
                    allv["attention_decode_fused"].setdefault(_key(s), s)
                    continue
                allv["attention_decode_split"].setdefault(_key(s), s)
                allv["attention_decode_merge"].setdefault(_key(m), m)
    return allv


def _vlabel(s_c: dict, m_c: dict | None) -> str:
    if m_c is None:
        return (f"fused N{s_c['BLOCK_N']} W{s_c['WARPS']} S{s_c['BLOCK_S']}"
                + (" E" if s_c.get("EVEN_HD") else ""))
    return f"{_label(_key(s_c))} | {_label(_key(m_c))}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--budget-s", type=float, default=100)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--dry-run", action="store_true", help="compile only (no GPU)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    allv = variant_table()
    nv = sum(len(t) for t in allv.values())
    compiled, failed = compile_variants(allv, args.workers)
    print(f"compiled {len(compiled)}/{nv} variants for sm_90 in "
          f"{time.perf_counter() - t_start:.0f}s", flush=True)
    for key, err in failed.items():
        print("compile failed:", key, err)
    if args.dry_run:
        return
    from helios_serve.runtime.cuda import driver as drv
    from helios_tools import kernels as K

    cu, stream = drv.current_stream()
    attr = cu.CUfunction_attribute
    fns = {}
    for key, ck in compiled.items():
        mod = drv.call("l", cu.cuModuleLoadData(ck.binary))
        fn = drv.call("f", cu.cuModuleGetFunction(mod, ck.entry_name.encode()))
        if ck.shared_bytes > 48 * 1024:
            drv.call("s", cu.cuFuncSetAttribute(
                fn, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, ck.shared_bytes))
        regs = drv.call("r", cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, fn))
        local = drv.call("r", cu.cuFuncGetAttribute(
            attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn))
        fns[key] = (fn, ck, drv.param_count(fn), int(regs), int(local))

    def alloc(nbytes):
        return int(drv.call("a", cu.cuMemAlloc(max(nbytes, 256))))

    def h2d(ptr, arr, offset=0):
        arr = np.ascontiguousarray(arr)
        drv.call("h", cu.cuMemcpyHtoD(ptr + offset, arr.ctypes.data, arr.nbytes))

    def d2h(ptr, like):
        host = np.empty_like(like)
        drv.call("c", cu.cuMemcpyDtoH(host.ctypes.data, ptr, host.nbytes))
        return host

    def launch_pair(fs, fm, geo, d, kptr, vptr, z):
        (fn_s, ck_s, cnt_s), (fn_m, ck_m, cnt_m) = fs, fm
        B, H, KVH, HD, NS, SPLIT, scale = geo
        a1 = drv.KernelArgs(
            [("ptr", d["qkv"]), ("ptr", d["pos"]), ("ptr", d["slot"]), ("ptr", d["pt"]),
             ("ptr", kptr), ("ptr", vptr), ("ptr", d["ml"]), ("ptr", d["po"]),
             ("i32", B), ("i32", MP), ("i32", PT), ("i32", H), ("i32", KVH),
             ("i32", HD), ("i32", NS), ("i32", SPLIT), ("f32", scale)]
            + [("ptr", 0)] * (cnt_s - 17))
        drv.call("k", cu.cuLaunchKernel(fn_s, B, KVH, z, 32 * ck_s.num_warps,
                                        1, 1, ck_s.shared_bytes, stream, a1.address, 0))
        a2 = drv.KernelArgs(
            [("ptr", d["ml"]), ("ptr", d["po"]), ("ptr", d["slot"]), ("ptr", d["out"]),
             ("i32", B), ("i32", H), ("i32", HD), ("i32", NS)] + [("ptr", 0)] * (cnt_m - 8))
        drv.call("k", cu.cuLaunchKernel(fn_m, B, H, 1, 32 * ck_m.num_warps, 1, 1,
                                        ck_m.shared_bytes, stream, a2.address, 0))
        return a1, a2

    def launch_fused(ff, geo, d, kptr, vptr):
        fn, ck, cnt = ff
        B, H, KVH, HD, NS, SPLIT, scale = geo
        a = drv.KernelArgs(
            [("ptr", d["qkv"]), ("ptr", d["pos"]), ("ptr", d["slot"]), ("ptr", d["pt"]),
             ("ptr", kptr), ("ptr", vptr), ("ptr", d["ml"]), ("ptr", d["po"]),
             ("ptr", d["arrivals"]), ("ptr", d["out"]),
             ("i32", B), ("i32", MP), ("i32", PT), ("i32", H), ("i32", KVH),
             ("i32", HD), ("i32", NS), ("i32", SPLIT), ("f32", scale)]
            + [("ptr", 0)] * (cnt - 19))
        drv.call("k", cu.cuLaunchKernel(fn, B, KVH, NS, 32 * ck.num_warps, 1, 1,
                                        ck.shared_bytes, stream, a.address, 0))
        return (a,)

    rng = np.random.default_rng(0)
    pool = rng.standard_normal((1 << 22) + 12345, dtype=np.float32)
    rows, skipped = [], 0
    for model, (H, KVH, HD) in GEOMS.items():
        for B in ROWS:
            scale = HD ** -0.5
            npos_max = max(POSITIONS[B])
            ppr = -(-npos_max // PT)  # pages per row
            P = B * ppr
            perm = rng.permutation(P).astype(np.int32).reshape(B, ppr)
            pt = np.full((B, MP), UNMAPPED, np.int32)
            pt[:, :ppr] = perm
            n = P * PT * KVH * HD
            kc = np.resize(pool, n).reshape(P, PT, KVH, HD)
            vc = np.resize(pool[12345:], n).reshape(P, PT, KVH, HD)
            qkv = rng.standard_normal((B, (H + 2 * KVH) * HD)).astype(np.float32)
            cache_bytes = kc.nbytes
            nl = int(max(2, min(30, -(-(128 << 20) // (2 * cache_bytes)))))
            kd = [alloc(cache_bytes) for _ in range(nl)]
            vd = [alloc(cache_bytes) for _ in range(nl)]
            for p in kd:
                h2d(p, kc)
            for p in vd:
                h2d(p, vc)
            slot = np.arange(B, dtype=np.int32)
            if B > 1:
                slot[B // 2] = -1  # one padding row
            d = {"qkv": alloc(qkv.nbytes), "slot": alloc(slot.nbytes), "pt": alloc(pt.nbytes),
                 "pos": alloc(B * 4), "out": alloc(B * H * HD * 4),
                 "ml": alloc(B * H * 128 * 2 * 4), "po": alloc(B * H * 128 * HD * 4),
                 "arrivals": alloc(B * KVH * 4)}
            drv.call("z", cu.cuMemsetD32Async(d["arrivals"], 0, B * KVH, stream))
            arr0 = np.zeros(B * KVH, np.int32)
            h2d(d["qkv"], qkv)
            h2d(d["slot"], slot)
            out0 = np.zeros((B, H * HD), np.float32)
            row_elems = KVH * HD
            for npos in POSITIONS[B]:
                pos = np.full(B, npos - 1, np.int32)
                if B > 2:
                    pos[1] = npos // 3  # one shorter row
                h2d(d["pos"], pos)
                # Layer copy 0 (the verified one): NaN past each row's context in its last
                # page, unmapped page ids past it.
                ptn = pt.copy()
                tails = []
                for b in range(B):
                    c = int(pos[b]) + 1
                    last = (c - 1) // PT
                    page, off = int(ptn[b, last]), (c - 1) % PT + 1
                    ptn[b, last + 1:] = UNMAPPED
                    if off < PT:
                        n = (PT - off) * row_elems
                        at = (page * PT + off) * row_elems * 4
                        nan = np.full(n, np.nan, np.float32)
                        h2d(kd[0], nan, at)
                        h2d(vd[0], nan, at)
                        tails.append((page, off, at))
                h2d(d["pt"], ptn)
                # The reference on at most 8 rows (every row is its own program: the
                # padding row, the shorter row, the first and the last ones).
                vr = np.unique(np.r_[np.arange(min(B, 4)), B // 2, B - 2 if B > 1 else 0,
                                     B - 1])
                ref = np.zeros((vr.size, H * HD), np.float32)
                K.attention_decode(qkv[vr], pos[vr], slot[vr], pt, kc, vc, ref, vr.size, MP,
                                   PT, H, KVH, HD, scale)
                live = slot >= 0
                kv_bytes = int(sum(int(pos[b]) + 1 for b in range(B) if live[b])) * row_elems * 8
                for label, NS, SPLIT, s_c, m_c in variants(B, H, KVH, HD):
                    if npos > NS * SPLIT:
                        continue
                    if m_c is None:
                        kS, kM = ("attention_decode_fused", _key(s_c)), None
                    else:
                        kS = ("attention_decode_split", _key(s_c))
                        kM = ("attention_decode_merge", _key(m_c))
                    if kS not in fns or (kM is not None and kM not in fns):
                        continue
                    if time.perf_counter() - t_start > args.budget_s - 5:
                        skipped += 1
                        continue
                    fn_s, ck_s, cnt_s, regs_s, local_s = fns[kS]
                    fn_m, ck_m, cnt_m, regs_m, local_m = fns[kM] if kM else (0, 0, 0, 0, 0)
                    fs, fm = (fn_s, ck_s, cnt_s), (fn_m, ck_m, cnt_m)
                    geo = (B, H, KVH, HD, NS, SPLIT, scale)

                    # (the launch rule's grid: LIVE programs a (row, kv head), else
                    # a program per SPP splits)
                    z = s_c.get("LIVE") or -(-NS // s_c.get("SPP", 1))

                    def one(d, kptr, vptr, fs=fs, fm=fm, geo=geo, fused=kM is None, z=z):
                        if fused:
                            return launch_fused(fs, geo, d, kptr, vptr)
                        return launch_pair(fs, fm, geo, d, kptr, vptr, z)
                    outs = []
                    for _ in range(2):
                        for name, n in (("ml", B * H * NS * 2), ("po", B * H * NS * HD),
                                        ("out", B * H * HD)):
                            # NaN, ordered on the kernels' stream (the legacy stream's
                            # memset is not ordered with a non-blocking stream)
                            drv.call("p", cu.cuMemsetD32Async(d[name], 0x7FC00000, n, stream))
                        keep = one(d, kd[0], vd[0])
                        drv.call("s", cu.cuStreamSynchronize(stream))
                        outs.append(d2h(d["out"], out0))
                        del keep
                    arrivals_zero = bool((d2h(d["arrivals"], arr0) == 0).all())
                    if not arrivals_zero:  # for the next variants
                        drv.call("z", cu.cuMemsetD32Async(d["arrivals"], 0, B * KVH, stream))
                    finite = bool(np.isfinite(outs[0]).all() and np.isfinite(outs[1]).all())
                    rel = (float(np.abs(outs[0][vr].astype(np.float64) - ref).max()
                                 / max(np.abs(ref).max(), 1e-30)) if finite else float("inf"))
                    same = np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
                    keep = []
                    drv.call("b", cu.cuStreamBeginCapture(
                        stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
                    for li in range(nl):
                        keep.append(one(d, kd[li], vd[li]))
                    graph = drv.call("e", cu.cuStreamEndCapture(stream))
                    exe = drv.call("i", cu.cuGraphInstantiate(graph, 0))
                    drv.call("g", cu.cuGraphLaunch(exe, stream))
                    drv.call("s", cu.cuStreamSynchronize(stream))
                    reps = 5
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        drv.call("g", cu.cuGraphLaunch(exe, stream))
                    drv.call("s", cu.cuStreamSynchronize(stream))
                    us = (time.perf_counter() - t0) / (reps * nl) * 1e6
                    cu.cuGraphExecDestroy(exe)
                    cu.cuGraphDestroy(graph)
                    rows.append({"model": model, "B": B, "positions": npos, "label": label,
                                 "NS": NS, "SPLIT": SPLIT,
                                 "variant": _vlabel(s_c, m_c), "launches": 1 if kM is None else 2,
                                 "us": us, "GBps": kv_bytes / us / 1e3, "rel": rel,
                                 "finite": finite, "deterministic": bool(same),
                                 "arrivals_zero": arrivals_zero,
                                 "regs": [regs_s, regs_m], "local_bytes": [local_s, local_m],
                                 "layers": nl, "split": s_c, "merge": m_c})
                for page, off, at in tails:  # restore copy 0's tails
                    h2d(kd[0], kc[page, off:], at)
                    h2d(vd[0], vc[page, off:], at)
            for p in kd + vd + list(d.values()):
                cu.cuMemFree(p)
            print(f"{model} B={B} done at {time.perf_counter() - t_start:.0f}s", flush=True)
    ok = [r for r in rows if r["finite"] and r["deterministic"] and r["rel"] < 1e-5
          and r["arrivals_zero"]]
    print(f"timed {len(rows)} rows in {time.perf_counter() - t_start:.0f}s; {skipped} skipped "
          f"for the budget; {len(rows) - len(ok)} failed verification")
    for r in rows:
        if r not in ok:
            print("  FAIL", r["model"], r["B"], r["positions"], r["label"], r["rel"],
                  r["finite"], r["deterministic"])
    labels = [v[0] for v in variants(1, 9, 3, 64)]
    summary = []
    for model in GEOMS:
        print(f"\n{model}: us per layer (split + merge); x = today / this (> 1 faster); "
              "'-' not run, '!' failed verification")
        print(f"{'variant':24}" + "".join(f" {f'B{B}@{p}':>13}" for B in ROWS
                                           for p in POSITIONS[B]))
        for label in labels:
            cells = []
            for B in ROWS:
                for p in POSITIONS[B]:
                    r = next((r for r in rows if (r["model"], r["B"], r["positions"],
                                                  r["label"]) == (model, B, p, label)), None)
                    t = next((r for r in rows if (r["model"], r["B"], r["positions"],
                                                  r["label"]) == (model, B, p, "today")), None)
                    if r is None:
                        cells.append(f"{'-':>13}")
                        continue
                    x = t["us"] / r["us"] if t else float("nan")
                    flag = "" if r in ok else "!"
                    cells.append(f" {r['us']:6.2f} {x:4.2f}x{flag}"[-13:].rjust(13))
                    summary.append({"model": model, "B": B, "positions": p, "label": label,
                                    "us": r["us"], "over_today": x, "ok": r in ok})
            print(f"{label:24}" + "".join(f" {c}" for c in cells))
    print(f"done in {time.perf_counter() - t_start:.0f}s", flush=True)
    if args.json:
        write_json(args.json, {"capacity": CAPACITY, "page_tokens": PT, "rows": rows,
                               "summary": summary,
                               "compile_failed": {str(k): v for k, v in failed.items()}})


if __name__ == "__main__":
    main()
