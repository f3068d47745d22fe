"""Decode attention at many rows (issue 27): rule v3's live-split layout (``LIVE``,
``HELIOS_ATTN_LIVE``) against the NS-programs-a-row grid it replaces, on the device,
each verified first.

    python bench/gpu_attention_live.py --json OUT.json [--budget-s 420] [--dry-run]
        [--targets 1024 2048 4096 8192] [--rows 1 8 64 256] [--capacities 2048 8192]

At 256 rows of ~160 positions the 8B geometry's ``attention_decode_split`` took ~400 us a
layer on the H100 (bench/results/h100_2026-12-06h/decode_breakdown_dc8d9d8.json: 32
splits a row, 65,536 programs, ~3 of 32 splits live a row). For Llama-3.1-8B (H=32, KVH=8,
HD=128) and SmolLM2-135M (H=9, KVH=3, HD=64), B in {1, 8, 64, 256} rows, capacities of
2,048 (``decode_splits``: 32 x 64, the bench cores') and 8,192 positions (128 x 64, the
serving recipes'), contexts of about 160 / 1,024 / 2,048 / 4,096 positions (each row 0-15
shorter), this times ``attention_decode_split`` + ``attention_decode_merge`` per layer (a
CUDA graph of both launches over NL layers whose page tables point at separate pages of
one pool, at least ~256 MB of KV a replay where the rows allow, so L2 does not serve
repeats; 5 replays) for:

- ``old``: rule v3 with ``HELIOS_ATTN_LIVE=0`` (a program per split; 2 or 4 splits a
  program at 64+ rows of 128 splits);
- ``live T Ln``: rule v3 with ``HELIOS_ATTN_LIVE=T`` (about T programs in all, n a (row,
  kv head), each striding over its row's live splits; the default T is marked ``*``; a T
  giving the same layout as an earlier one is not repeated).

Every variant runs once first with NaN-poisoned outputs: the merged output of up to 6
rows must match the NumPy ``attention_decode`` reference (``rel`` = max |gpu - ref| /
max |ref| < 1e-5), and every row must be bitwise ``old``'s (the layout must not change a
bit: speculative verification rows and decode rows sit in different buckets). Prints per
geometry a table of us per layer and the fraction of the measured-copy roofline (the
live KV bytes, f32 K and V, over the time, against a device-to-device copy's read
bandwidth measured in the same run); the JSON holds every row with its constants,
grid, registers, the commit and the card. ``--dry-run`` (no GPU) compiles every variant
for sm_90.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _report import git_commit, write_json  # bench/ is this script's folder
from gpu_attention_sweep import compile_variants

GEOMS = {"llama8b": (32, 8, 128), "smollm2": (9, 3, 64)}  # H, KVH, HD
POSITIONS = (160, 1024, 2048, 4096)
CAPACITIES = (2048, 8192)
PT = 16
UNMAPPED = 1 << 30  # page id past a row's last page: reading it faults
REPLAY_BYTES = 256 << 20  # KV bytes a replay should stream at least (H100 L2: 50 MB)
MAX_LAYERS = 64
BLOCK_PAGES = 1024  # the pool repeats this many random pages


def _key(c: dict) -> tuple:
    return tuple(sorted(c.items()))


def variants(B: int, H: int, KVH: int, HD: int, cap: int, targets: list[int]):
    """``[(label, NS, SPLIT, split constants with WARPS, merge constants with WARPS)]``:
    ``old`` first, then one per distinct live layout."""
    from helios_ignition.capture import launch
    from helios_ignition.capture.buffers import decode_splits

    ns, split = decode_splits(cap)
    merge = launch.attention_merge_constants(HD, ns, "v3")
    saved = launch.ATTN_LIVE, launch.ATTN_LIVE_MIN_ROWS
    out, seen = [], set()
    try:
        launch.ATTN_LIVE_MIN_ROWS = 1
        for t in dict.fromkeys([0, saved[0], *targets]):  # the default's label first
            launch.ATTN_LIVE = t
            c = launch.attention_split_constants(B, H, KVH, HD, ns, split, "v3")
            if _key(c) in seen:
                continue
            seen.add(_key(c))
            mark = "*" if t == saved[0] else ""
            out.append(("old" if t == 0 else f"live {t}{mark} L{c['LIVE']}", ns, split, c,
                        merge))
    finally:
        launch.ATTN_LIVE, launch.ATTN_LIVE_MIN_ROWS = saved
    return out


def _grid_z(c: dict, ns: int) -> int:
    return c.get("LIVE") or -(-ns // c.get("SPP", 1))


def variant_table(rows, targets, capacities):
    allv = {"attention_decode_split": {}, "attention_decode_merge": {}}
    for B in rows:
        for H, KVH, HD in GEOMS.values():
            for cap in capacities:
                for _, _, _, s, m in variants(B, H, KVH, HD, cap, targets):
                    allv["attention_decode_split"].setdefault(_key(s), s)
                    allv["attention_decode_merge"].setdefault(_key(m), m)
    return allv


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--targets", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    ap.add_argument("--capacities", type=int, nargs="+", default=list(CAPACITIES),
                    help="positions of capacity (over 8,192: splits of several tiles)")
    ap.add_argument("--dry-run", action="store_true", help="compile only (no GPU)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    allv = variant_table(args.rows, args.targets, args.capacities)
    nv = sum(len(t) for t in allv.values())
    compiled, failed = compile_variants(allv, args.workers)
    print(f"compiled {len(compiled)}/{nv} variants for sm_90 in "
          f"{time.perf_counter() - t_start:.0f}s", flush=True)
    for key, err in failed.items():
        print("compile failed:", key, err)
    if args.dry_run:
        return
    from helios_ignition.capture.buffers import decode_splits
    from helios_serve.runtime.cuda import driver as drv
    from helios_tools import kernels as K

    cu, stream = drv.current_stream()
    attr = cu.CUfunction_attribute
    dev = drv.call("d", cu.cuCtxGetDevice())
    card = drv.call("n", cu.cuDeviceGetName(64, dev)).split(b"\0")[0].decode()
    fns = {}
    for key, ck in compiled.items():
        mod = drv.call("l", cu.cuModuleLoadData(ck.binary))
        fn = drv.call("f", cu.cuModuleGetFunction(mod, ck.entry_name.encode()))
        if ck.shared_bytes > 48 * 1024:
            drv.call("s", cu.cuFuncSetAttribute(
                fn, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, ck.shared_bytes))
        regs = drv.call("r", cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, fn))
        fns[key] = (fn, ck, drv.param_count(fn), int(regs))

    def alloc(nbytes):
        return int(drv.call("a", cu.cuMemAlloc(max(nbytes, 256))))

    def h2d(ptr, arr, offset=0):
        arr = np.ascontiguousarray(arr)
        drv.call("h", cu.cuMemcpyHtoD(ptr + offset, arr.ctypes.data, arr.nbytes))

    def d2h(ptr, like):
        host = np.empty_like(like)
        drv.call("c", cu.cuMemcpyDtoH(host.ctypes.data, ptr, host.nbytes))
        return host

    # The roofline: a device-to-device copy's read bandwidth (it reads and writes n bytes).
    n = 1 << 30
    src, dst = alloc(n), alloc(n)
    drv.call("m", cu.cuMemcpyDtoDAsync(dst, src, n, stream))
    drv.call("s", cu.cuStreamSynchronize(stream))
    t0 = time.perf_counter()
    for _ in range(5):
        drv.call("m", cu.cuMemcpyDtoDAsync(dst, src, n, stream))
    drv.call("s", cu.cuStreamSynchronize(stream))
    copy_read_gbps = 5 * n / (time.perf_counter() - t0) / 1e9
    cu.cuMemFree(src)
    cu.cuMemFree(dst)
    print(f"{card}: device copy reads {copy_read_gbps:.0f} GB/s", flush=True)

    def launch_pair(v, geo, d, pt_ptr):
        (fn_s, ck_s, cnt_s, _), (fn_m, ck_m, cnt_m, _), z = v
        B, H, KVH, HD, NS, SPLIT, MP, scale = geo
        a1 = drv.KernelArgs(
            [("ptr", d["qkv"]), ("ptr", d["pos"]), ("ptr", d["slot"]), ("ptr", pt_ptr),
             ("ptr", d["k"]), ("ptr", d["v"]), ("ptr", d["ml"]), ("ptr", d["po"]),
             ("i32", B), ("i32", MP), ("i32", PT), ("i32", H), ("i32", KVH),
             ("i32", HD), ("i32", NS), ("i32", SPLIT), ("f32", scale)]
            + [("ptr", 0)] * (cnt_s - 17))
        drv.call("k", cu.cuLaunchKernel(fn_s, B, KVH, z, 32 * ck_s.num_warps, 1, 1,
                                        ck_s.shared_bytes, stream, a1.address, 0))
        a2 = drv.KernelArgs(
            [("ptr", d["ml"]), ("ptr", d["po"]), ("ptr", d["slot"]), ("ptr", d["out"]),
             ("i32", B), ("i32", H), ("i32", HD), ("i32", NS)] + [("ptr", 0)] * (cnt_m - 8))
        drv.call("k", cu.cuLaunchKernel(fn_m, B, H, 1, 32 * ck_m.num_warps, 1, 1,
                                        ck_m.shared_bytes, stream, a2.address, 0))
        return a1, a2

    rng = np.random.default_rng(0)
    rows, skipped = [], 0
    max_ns = max(decode_splits(cap)[0] for cap in args.capacities)
    for model, (H, KVH, HD) in GEOMS.items():
        scale = HD ** -0.5
        page_elems = PT * KVH * HD
        pool_pages = max(args.rows) * -(-max(POSITIONS) // PT)
        pool_pages = max(pool_pages, -(-REPLAY_BYTES // (2 * page_elems * 4)) + BLOCK_PAGES)
        kb = rng.standard_normal((BLOCK_PAGES, PT, KVH, HD), dtype=np.float32)
        vb = rng.standard_normal((BLOCK_PAGES, PT, KVH, HD), dtype=np.float32)
        d = {"k": alloc(pool_pages * page_elems * 4), "v": alloc(pool_pages * page_elems * 4)}
        for at in range(0, pool_pages, BLOCK_PAGES):  # page p holds block page p % NB
            m = min(BLOCK_PAGES, pool_pages - at)
            h2d(d["k"], kb[:m], at * page_elems * 4)
            h2d(d["v"], vb[:m], at * page_elems * 4)
        for B in args.rows:
            qkv = rng.standard_normal((B, (H + 2 * KVH) * HD)).astype(np.float32)
            slot = np.arange(B, dtype=np.int32)
            d.update(qkv=alloc(qkv.nbytes), slot=alloc(slot.nbytes), pos=alloc(B * 4),
                     out=alloc(B * H * HD * 4), ml=alloc(B * H * max_ns * 2 * 4),
                     po=alloc(B * H * max_ns * HD * 4))
            h2d(d["qkv"], qkv)
            h2d(d["slot"], slot)
            out0 = np.zeros((B, H * HD), np.float32)
            for cap in args.capacities:
                MP = cap // PT
                for npos in POSITIONS:
                    if npos > cap:
                        continue
                    pos = (npos - 1 - rng.integers(0, 16, B)).astype(np.int32)
                    ppr = -(-npos // PT)
                    kv_bytes = int((pos.astype(np.int64) + 1).sum()) * KVH * HD * 4 * 2
                    layer_bytes = B * ppr * page_elems * 4 * 2
                    nl = int(max(1, min(MAX_LAYERS, -(-REPLAY_BYTES // layer_bytes),
                                        pool_pages // (B * ppr))))
                    pts = np.full((nl, B, MP), UNMAPPED, np.int32)
                    for li in range(nl):  # each layer its own pages of the pool
                        pts[li, :, :ppr] = (li * B * ppr + rng.permutation(B * ppr)
                                            ).reshape(B, ppr)
                    for b in range(B):  # unmapped past each row's last page
                        pts[:, b, int(pos[b]) // PT + 1:] = UNMAPPED
                    d["pt"] = alloc(pts.nbytes)
                    h2d(d["pt"], pts)
                    h2d(d["pos"], pos)
                    vr = np.unique(np.r_[np.arange(min(B, 3)), B // 2, B - 2 if B > 1 else 0,
                                         B - 1])
                    ref = np.zeros((vr.size, H * HD), np.float32)
                    K.attention_decode(qkv[vr], pos[vr], slot[:vr.size], pts[0, vr] % BLOCK_PAGES,
                                       kb, vb, ref, vr.size, MP, PT, H, KVH, HD, scale)
                    old_out = None
                    for label, NS, SPLIT, s_c, m_c in variants(B, H, KVH, HD, cap, args.targets):
                        kS = ("attention_decode_split", _key(s_c))
                        kM = ("attention_decode_merge", _key(m_c))
                        if kS not in fns or kM not in fns:
                            continue
                        if time.perf_counter() - t_start > args.budget_s - 5:
                            skipped += 1
                            continue
                        z = _grid_z(s_c, NS)
                        v = (fns[kS], fns[kM], z)
                        geo = (B, H, KVH, HD, NS, SPLIT, MP, scale)
                        for name, n in (("ml", B * H * NS * 2), ("po", B * H * NS * HD),
                                        ("out", B * H * HD)):
                            drv.call("p", cu.cuMemsetD32Async(d[name], 0x7FC00000, n, stream))
                        keep = launch_pair(v, geo, d, d["pt"])
                        drv.call("s", cu.cuStreamSynchronize(stream))
                        del keep
                        got = d2h(d["out"], out0)
                        finite = bool(np.isfinite(got).all())
                        rel = (float(np.abs(got[vr].astype(np.float64) - ref).max()
                                     / max(np.abs(ref).max(), 1e-30)) if finite
                               else float("inf"))
                        if old_out is None:
                            old_out = got
                        same_as_old = bool(np.array_equal(got.view(np.uint32),
                                                          old_out.view(np.uint32)))
                        keep = []
                        drv.call("b", cu.cuStreamBeginCapture(
                            stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
                        for li in range(nl):
                            keep.append(launch_pair(v, geo, d, d["pt"] + li * B * MP * 4))
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
                        gbps = kv_bytes / us / 1e3
                        rows.append({
                            "model": model, "B": B, "capacity": cap, "positions": npos,
                            "label": label, "NS": NS, "SPLIT": SPLIT,
                            "grid": [B, KVH, z], "us": us, "GBps": gbps,
                            "roofline_fraction": gbps / copy_read_gbps, "kv_bytes": kv_bytes,
                            "rel": rel, "finite": finite, "bitwise_old": same_as_old,
                            "regs": [fns[kS][3], fns[kM][3]], "layers": nl,
                            "split": s_c, "merge": m_c})
                    cu.cuMemFree(d.pop("pt"))
            for name in ("qkv", "slot", "pos", "out", "ml", "po"):
                cu.cuMemFree(d.pop(name))
            print(f"{model} B={B} done at {time.perf_counter() - t_start:.0f}s", flush=True)
        cu.cuMemFree(d.pop("k"))
        cu.cuMemFree(d.pop("v"))
    ok = [r for r in rows if r["finite"] and r["rel"] < 1e-5 and r["bitwise_old"]]
    print(f"timed {len(rows)} rows in {time.perf_counter() - t_start:.0f}s; {skipped} skipped "
          f"for the budget; {len(rows) - len(ok)} failed verification")
    for r in rows:
        if r not in ok:
            print("  FAIL", r["model"], r["B"], r["capacity"], r["positions"], r["label"],
                  r["rel"], r["finite"], "bitwise_old", r["bitwise_old"])
    summary = []
    for model in GEOMS:
        print(f"\n{model}: us per layer (split + merge), fraction of the copy roofline, "
              "old / this (> 1 faster); '!' failed verification")
        for cap in args.capacities:
            for B in args.rows:
                cell = [r for r in rows if (r["model"], r["capacity"], r["B"]) == (model, cap, B)]
                for label in dict.fromkeys(r["label"] for r in cell):
                    line = f"  cap {cap:5} B{B:<4} {label:16}"
                    for p in POSITIONS:
                        r = next((r for r in cell if (r["positions"], r["label"]) == (p, label)),
                                 None)
                        o = next((r for r in cell if (r["positions"], r["label"]) == (p, "old")),
                                 None)
                        if r is None:
                            line += f" {'-':>24}"
                            continue
                        x = o["us"] / r["us"] if o else float("nan")
                        flag = "" if r in ok else "!"
                        line += (f" @{p:<5}{r['us']:8.1f} {r['roofline_fraction']:4.2f} "
                                 f"{x:5.2f}x{flag}")
                        summary.append({"model": model, "capacity": cap, "B": B, "positions": p,
                                        "label": label, "us": r["us"],
                                        "roofline_fraction": r["roofline_fraction"],
                                        "old_over_this": x, "ok": r in ok})
                    print(line)
    print(f"done in {time.perf_counter() - t_start:.0f}s", flush=True)
    if args.json:
        write_json(args.json, {"commit": git_commit(), "card": card,
                               "copy_read_GBps": copy_read_gbps, "page_tokens": PT,
                               "rows": rows, "summary": summary,
                               "compile_failed": {str(k): v for k, v in failed.items()}})


if __name__ == "__main__":
    main()
