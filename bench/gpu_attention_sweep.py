"""Sweep split-context decode attention variants on the 8B and SmolLM2 geometries; verify
each on the device.

    python bench/gpu_attention_sweep.py --json OUT.json [--budget-s 150] [--dry-run]

For Llama-3.1-8B (H=32, KVH=8, HD=128) and SmolLM2-135M (H=9, KVH=3, HD=64), B in {1, 8,
64} rows, 160 and 1000 context positions, a page table of MP * PT = 2048 positions (NS,
SPLIT from ``decode_splits``), times ``attention_decode_split`` + ``attention_decode_merge``
per layer: the v1 launch rule (``HELIOS_ATTN_RULE=v1``, the baseline every ratio is
against), the v2 rule (the current ``launch_config`` default), v1's split with v2's merge,
and a grid of ``GROUPED=2`` (one program per kv head, f32 FMA) and ``GROUPED=0`` (per
query head) constants. Each is a CUDA graph of both launches for NL layers over separate
f32 caches (so L2 does not serve repeats), replayed 3 times. Every variant's outputs
(poisoned with NaN first) are checked against the NumPy reference (``rel``: max |gpu -
ref| / max |ref| over part_ml, part_o and the merged output), with NaN in cache positions
past each row's context and an unmapped page id in the page-table columns past its last
page, and relaunched to check they are bitwise deterministic. Prints one row per
(geometry, B, positions, variant): microseconds per layer, effective GB/s of the KV bytes
the context needs, ratio of the v1 time to this one (> 1 is faster). ``--dry-run`` (no
GPU) compiles the variant list for sm_90 and checks the v1 and v2 choices are in it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _report import write_json  # bench/ is this script's folder

GEOMS = {"llama8b": (32, 8, 128), "smollm2": (9, 3, 64)}  # H, KVH, HD
ROWS = (1, 8, 64)
POSITIONS = (160, 1000)
PT, MP = 16, 128  # MP * PT = 2048 positions
MAX_CTX = max(POSITIONS)
UNMAPPED = 1 << 30  # page id past the last page of a row: reading it faults


def _splits() -> tuple[int, int]:
    from helios_ignition.capture.buffers import decode_splits

    return decode_splits(MP * PT)


def rule_pair(B: int, H: int, KVH: int, HD: int, rule_split: str, rule_merge: str):
    from helios_ignition.capture import launch

    ns, split = _splits()
    return (launch.attention_split_constants(B, H, KVH, HD, ns, split, rule_split),
            launch.attention_merge_constants(HD, ns, rule_merge))


def _key(c: dict[str, int]) -> tuple:
    return tuple(sorted(c.items()))


def grid_pairs(H: int, KVH: int, HD: int) -> list[tuple[dict, dict]]:
    """Swept (split, merge) constants for one geometry (merge: v2's)."""
    from helios_ignition.capture import launch

    ns, _ = _splits()
    bhd = launch._np2(HD, 16)
    merge = launch.attention_merge_constants(HD, ns, "v2")
    out = []
    for bn in (64, 32, 16):
        for warps in (8, 4, 2):
            out.append((dict(BLOCK_N=bn, BLOCK_HD=bhd, BLOCK_G=launch._np2(H // KVH),
                             GROUPED=2, EVEN_HD=int(HD == bhd), WARPS=warps), merge))
    for warps in (8, 4):  # merge with 8 warps
        out.append((out[0][0] if warps == 8 else out[1][0], dict(merge, WARPS=8)))
    for bn, warps in ((64, 8), (32, 4), (16, 2)):  # per query head (v1's layout)
        out.append((dict(BLOCK_N=bn, BLOCK_HD=bhd, BLOCK_G=launch._np2(H // KVH, 16),
                         GROUPED=0, WARPS=warps), merge))
    return out


def variant_table():
    """All distinct constants per op, and the (geometry, B, label, split key, merge key)
    work list: the rule choices of every case first, then the grids."""
    allv = {"attention_decode_split": {}, "attention_decode_merge": {}}
    work = []
    for model, (H, KVH, HD) in GEOMS.items():
        for B in ROWS:
            pairs = [("v1 (old default)", *rule_pair(B, H, KVH, HD, "v1", "v1")),
                     ("v2 (new default)", *rule_pair(B, H, KVH, HD, "v2", "v2")),
                     ("v1 split+v2 merge", *rule_pair(B, H, KVH, HD, "v1", "v2"))]
            pairs += [("grid", sc, mc) for sc, mc in grid_pairs(H, KVH, HD)]
            seen = set()
            for label, sc, mc in pairs:
                ks, km = _key(sc), _key(mc)
                if (ks, km) in seen:
                    continue
                seen.add((ks, km))
                allv["attention_decode_split"].setdefault(ks, sc)
                allv["attention_decode_merge"].setdefault(km, mc)
                work.append((model, B, label, ks, km))
    return allv, work


def compile_variants(allv, workers: int):
    from helios_ignition.kernels_aot import compile_each, variant_kernel

    kernels, byid = [], {}
    for op, table in allv.items():
        for key, c in table.items():
            kernels.append(variant_kernel(f"v{len(kernels)}", op, c))
            byid[kernels[-1].id] = (op, key)
    compiled, failed = compile_each(kernels, "sm_90", workers)
    return ({byid[ck.kernel_id]: ck for ck in compiled},
            {byid[kid]: err for kid, err in failed.items()})


def _label(key: tuple) -> str:
    c = dict(key)
    if "GROUPED" in c:
        return (f"G{c['GROUPED']} N{c['BLOCK_N']} W{c['WARPS']}"
                + (" E" if c.get("EVEN_HD") else ""))
    return f"m W{c['WARPS']}" + (" skip" if c.get("SKIP_EMPTY") else "") + (
        " E" if c.get("EVEN_HD") else "")


def _rel(got, ref) -> float:
    """max |gpu - ref| / max |ref| over the live splits' (max, sum), part_o and the merged
    output; empty splits must be exactly (-1e30, 0) (else inf)."""
    gml, gpo, gout = got
    rml, rpo, rout = ref
    empty = rml[..., 0] == np.float32(-1.0e30)
    if not (np.array_equal(gml[empty], rml[empty]) and (gpo[empty] == 0).all()):
        return float("inf")
    errs = [(gml[~empty], rml[~empty]), (gpo, rpo), (gout, rout)]
    return max(float(np.abs(g.astype(np.float64) - r).max() / max(np.abs(r).max(), 1e-30))
               for g, r in errs)


def launch_pair(cu, drv, stream, fs, fm, sc, geo, d, kptr, vptr):
    """Launch split then merge of one layer on `stream`; returns the argument blocks
    (keep them alive until the launches ran)."""
    (fn_s, ck_s, cnt_s), (fn_m, ck_m, cnt_m) = fs, fm
    B, H, KVH, HD, NS, SPLIT, scale = geo
    a1 = drv.KernelArgs(
        [("ptr", d["qkv"]), ("ptr", d["pos"]), ("ptr", d["slot"]), ("ptr", d["pt"]),
         ("ptr", kptr), ("ptr", vptr), ("ptr", d["ml"]), ("ptr", d["po"]),
         ("i32", B), ("i32", MP), ("i32", PT), ("i32", H), ("i32", KVH),
         ("i32", HD), ("i32", NS), ("i32", SPLIT), ("f32", scale)]
        + [("ptr", 0)] * (cnt_s - 17))
    drv.call("k", cu.cuLaunchKernel(fn_s, B, KVH if sc["GROUPED"] else H, NS,
                                    32 * ck_s.num_warps, 1, 1, ck_s.shared_bytes, stream,
                                    a1.address, 0))
    a2 = drv.KernelArgs(
        [("ptr", d["ml"]), ("ptr", d["po"]), ("ptr", d["slot"]), ("ptr", d["out"]),
         ("i32", B), ("i32", H), ("i32", HD), ("i32", NS)] + [("ptr", 0)] * (cnt_m - 8))
    drv.call("k", cu.cuLaunchKernel(fn_m, B, H, 1, 32 * ck_m.num_warps, 1, 1,
                                    ck_m.shared_bytes, stream, a2.address, 0))
    return a1, a2


def make_case(rng, pool, B: int, H: int, KVH: int, HD: int):
    """Host inputs of one (geometry, B): every row its own pages, NaN past MAX_CTX in the
    last page is set per positions count by the caller."""
    pages_per_row = -(-MAX_CTX // PT)
    P = B * pages_per_row
    perm = rng.permutation(P).astype(np.int32).reshape(B, pages_per_row)
    pt = np.full((B, MP), UNMAPPED, np.int32)
    pt[:, :pages_per_row] = perm
    n = P * PT * KVH * HD
    kc = np.resize(pool, n).reshape(P, PT, KVH, HD).copy()
    vc = np.resize(pool[12345:], n).reshape(P, PT, KVH, HD).copy()
    qkv = rng.standard_normal((B, (H + 2 * KVH) * HD)).astype(np.float32)
    return pt, kc, vc, qkv


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--budget-s", type=float, default=150)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--dry-run", action="store_true", help="compile only (no GPU)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    allv, work = variant_table()
    nv = sum(len(t) for t in allv.values())
    print(f"{nv} variants, {len(work)} (case, variant) pairs x {len(POSITIONS)} positions",
          flush=True)
    if args.dry_run:
        compiled, failed = compile_variants(allv, args.workers)
        for key, err in failed.items():
            print("compile failed:", key, err)
        for model, (H, KVH, HD) in GEOMS.items():
            for B in ROWS:
                for rule in ("v1", "v2"):
                    sc, mc = rule_pair(B, H, KVH, HD, rule, rule)
                    assert ("attention_decode_split", _key(sc)) in compiled, (model, B, rule)
                    assert ("attention_decode_merge", _key(mc)) in compiled, (model, B, rule)
        print(f"dry run: compiled {len(compiled)}/{nv} for sm_90 in "
              f"{time.perf_counter() - t_start:.0f}s; max shared "
              f"{max(ck.shared_bytes for ck in compiled.values())} bytes")
        return
    from helios_serve.runtime.cuda import driver as drv
    from helios_tools import kernels as K

    cu, stream = drv.current_stream()
    compiled, failed = compile_variants(allv, args.workers)
    print(f"compiled {len(compiled)}/{nv} variants in {time.perf_counter() - t_start:.0f}s",
          flush=True)
    attr = cu.CUfunction_attribute
    fns = {}
    for key, ck in compiled.items():
        mod = drv.call("l", cu.cuModuleLoadData(ck.binary))
        fn = drv.call("f", cu.cuModuleGetFunction(mod, ck.entry_name.encode()))
        if ck.shared_bytes > 48 * 1024:
            drv.call("s", cu.cuFuncSetAttribute(
                fn, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, ck.shared_bytes))
        regs = drv.call("r", cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, fn))
        local = drv.call("r", cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                                                    fn))
        fns[key] = (fn, ck, drv.param_count(fn), int(regs), int(local))

    def alloc(nbytes):
        return int(drv.call("a", cu.cuMemAlloc(max(nbytes, 256))))

    def h2d(ptr, arr):
        drv.call("h", cu.cuMemcpyHtoD(ptr, arr.ctypes.data, arr.nbytes))

    def d2h(ptr, like):
        host = np.empty_like(like)
        drv.call("c", cu.cuMemcpyDtoH(host.ctypes.data, ptr, host.nbytes))
        return host

    rng = np.random.default_rng(0)
    pool = rng.standard_normal((1 << 22) + 12345, dtype=np.float32)
    NS, SPLIT = _splits()
    rows, skipped = [], 0
    by_case: dict[tuple, list] = {}
    for model, B, label, ks, km in work:
        by_case.setdefault((model, B), []).append((label, ks, km))
    for (model, B), items in by_case.items():
        H, KVH, HD = GEOMS[model]
        scale = HD ** -0.5
        geo = (B, H, KVH, HD, NS, SPLIT, scale)
        pt, kc, vc, qkv = make_case(rng, pool, B, H, KVH, HD)
        cache_bytes = kc.nbytes
        nl = int(max(2, min(8, (2 << 30) // (2 * cache_bytes))))  # layers (cache copies)
        kd = [alloc(cache_bytes) for _ in range(nl)]
        vd = [alloc(cache_bytes) for _ in range(nl)]
        for p in kd[1:]:
            h2d(p, kc)
        for p in vd[1:]:
            h2d(p, vc)
        slot = np.arange(B, dtype=np.int32)
        if B > 1:
            slot[B // 2] = -1  # one padding row
        d = {name: alloc(a.nbytes) for name, a in
             (("qkv", qkv), ("slot", slot), ("pt", pt))}
        h2d(d["qkv"], qkv)
        h2d(d["slot"], slot)
        h2d(d["pt"], pt)
        ml0 = np.zeros((B, H, NS, 2), np.float32)
        po0 = np.zeros((B, H, NS, HD), np.float32)
        out0 = np.zeros((B, H * HD), np.float32)
        d["pos"] = alloc(B * 4)
        d["ml"], d["po"], d["out"] = alloc(ml0.nbytes), alloc(po0.nbytes), alloc(out0.nbytes)
        for npos in POSITIONS:
            pos = np.full(B, npos - 1, np.int32)
            if B > 2:
                pos[1] = npos // 3  # one shorter row
            h2d(d["pos"], pos)
            # Copy 0 (the verified layer) gets NaN past each row's context in its last
            # page, and the page-table columns past it are unmapped.
            kn, vn, ptn = kc.copy(), vc.copy(), pt.copy()
            for b in range(B):
                c = int(pos[b]) + 1
                last = (c - 1) // PT
                kn[ptn[b, last], (c - 1) % PT + 1:] = np.nan
                vn[ptn[b, last], (c - 1) % PT + 1:] = np.nan
                ptn[b, last + 1:] = UNMAPPED
            h2d(kd[0], kn)
            h2d(vd[0], vn)
            h2d(d["pt"], ptn)
            rml, rpo, rout = ml0.copy(), po0.copy(), out0.copy()
            K.attention_decode_split(qkv, pos, slot, pt, kc, vc, rml, rpo, B, MP, PT, H, KVH,
                                     HD, NS, SPLIT, scale)
            K.attention_decode_merge(rml, rpo, slot, rout, B, H, HD, NS)
            live = slot >= 0
            kv_bytes = int(sum(int(pos[b]) + 1 for b in range(B) if live[b])) * KVH * HD * 8


            for label, ks, km in items:
                kS, kM = ("attention_decode_split", ks), ("attention_decode_merge", km)
                if kS not in fns or kM not in fns:
                    continue
                if time.perf_counter() - t_start > args.budget_s - 8:
                    skipped += 1
                    continue
                fn_s, ck_s, cnt_s, regs_s, local_s = fns[kS]
                fn_m, ck_m, cnt_m, regs_m, local_m = fns[kM]
                sc = dict(ks)
                fs, fm = (fn_s, ck_s, cnt_s), (fn_m, ck_m, cnt_m)
                outs = []
                for _ in range(2):
                    for name, a in (("ml", ml0), ("po", po0), ("out", out0)):
                        drv.call("p", cu.cuMemsetD32(d[name], 0x7FC00000, a.size))  # NaN
                    keep = launch_pair(cu, drv, stream, fs, fm, sc, geo, d, kd[0], vd[0])
                    drv.call("s", cu.cuStreamSynchronize(stream))
                    outs.append((d2h(d["ml"], ml0), d2h(d["po"], po0), d2h(d["out"], out0)))
                    del keep
                finite = all(bool(np.isfinite(a).all()) for a in outs[0])
                rel = _rel(outs[0], (rml, rpo, rout)) if finite else float("inf")
                same = all(np.array_equal(a.view(np.uint32), b.view(np.uint32))
                           for a, b in zip(outs[0], outs[1], strict=True))
                keep = []
                drv.call("b", cu.cuStreamBeginCapture(
                    stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
                for li in range(nl):
                    keep.append(launch_pair(cu, drv, stream, fs, fm, sc, geo, d, kd[li], vd[li]))
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
                             "variant": f"{_label(ks)} | {_label(km)}", "us": us,
                             "GBps": kv_bytes / us / 1e3, "rel": rel, "finite": finite,
                             "deterministic": same, "regs": [regs_s, regs_m],
                             "local_bytes": [local_s, local_m], "layers": nl,
                             "split": sc, "merge": dict(km)})
        for p in kd + vd + list(d.values()):
            cu.cuMemFree(p)
        print(f"{model} B={B} done at {time.perf_counter() - t_start:.0f}s", flush=True)
    print(f"timed {len(rows)} rows in {time.perf_counter() - t_start:.0f}s; {skipped} skipped "
          "for the budget", flush=True)

    ok = [r for r in rows if r["finite"] and r["deterministic"] and r["rel"] < 1e-5]
    summary = []
    print(f"{'geometry':8} {'B':>3} {'pos':>5} {'tag':18} {'variant':30} {'us/layer':>9} "
          f"{'GB/s':>7} {'x v1':>6} {'rel':>8} regs")
    for model in GEOMS:
        for B in ROWS:
            for npos in POSITIONS:
                mine = [r for r in rows if (r["model"], r["B"], r["positions"]) == (model, B, npos)]
                if not mine:
                    continue
                v1 = next((r for r in mine if r["label"].startswith("v1 (")), None)
                base = v1["us"] if v1 else float("nan")
                best = sorted((r for r in ok if r in mine), key=lambda r: r["us"])
                shown = [(r["label"], r) for r in mine if r["label"] != "grid"]
                shown += [(f"best {i + 1}", r) for i, r in enumerate(best[:3])]
                for tag, r in shown:
                    print(f"{model:8} {B:3} {npos:5} {tag:18} {r['variant']:30} "
                          f"{r['us']:9.2f} {r['GBps']:7.0f} {base / r['us']:6.2f} "
                          f"{r['rel']:8.1e} {r['regs']}")
                    summary.append({"tag": tag, "ratio_to_v1": base / r["us"], **r})
    bad = [r for r in rows if r not in ok]
    print(f"{len(bad)} rows failed verification (NaN, nondeterministic or rel >= 1e-5)")
    for r in bad[:20]:
        print("  FAIL", r["model"], r["B"], r["positions"], r["variant"], r["rel"],
              r["finite"], r["deterministic"])
    print(f"done in {time.perf_counter() - t_start:.0f}s", flush=True)
    if args.json:
        write_json(args.json, {"rows": rows, "summary": summary,
                               "compile_failed": {str(k): v for k, v in failed.items()}})


if __name__ == "__main__":
    main()
