"""Decode attention at many rows (issue 27): rule v3's live-split layout (``LIVE``,
``HELIOS_ATTN_LIVE``) against the NS-programs-a-row grid it replaces, over f32 and bf16
KV planes, with the live layout's warps and tile length as further axes, and over bf16
planes the opt-in tensor-core body (``GROUPED=4``, ``HELIOS_ATTN_MMA``); on the device,
each variant verified first.

    python bench/gpu_attention_live.py --json OUT.json [--quick] [--budget-s 420]
        [--dry-run] [--models llama8b smollm2] [--planes f32 bf16]
        [--targets 1024 2048 4096 8192] [--warps 4] [--block-n 64]
        [--mma-terms 2] [--mma-targets 4096]
        [--rows 1 8 64 256] [--positions 160 1024 2048 4096] [--capacities 2048 8192]

At 256 rows of ~160 positions the 8B geometry's ``attention_decode_split`` took ~400 us a
layer on the H100 (bench/results/h100_2026-12-06h/decode_breakdown_dc8d9d8.json: 32
splits a row, 65,536 programs, ~3 of 32 splits live a row); at 256 rows of ~780
positions it still took 1.0 ms a layer, 73 % of the decode step, reading 1.64 GB of f32
K/V at ~1.6 TB/s (bench/results/h100_2026-12-06k/README.md, section 5). For
Llama-3.1-8B (H=32, KVH=8, HD=128) and SmolLM2-135M (H=9, KVH=3, HD=64), B rows,
capacities of C positions (NS splits of SPLIT from ``decode_splits``: 2,048 -> 32 x 64,
the bench cores'; 4,096 -> 64 x 64, the serving bench recipe's; 8,192 -> 128 x 64) and
contexts of about P positions (each row 0-15 shorter), this times
``attention_decode_split`` (``attention_decode_split_bf16kv`` over bf16 planes: the same
Triton body compiled with bf16 plane pointers) + ``attention_decode_merge`` per layer (a
CUDA graph of both launches over NL layers whose page tables point at separate pages of
one pool, at least ~256 MB of KV a replay where the rows allow, so L2 does not serve
repeats; replayed for at least 30 ms, 5 to 200 times) for:

- ``old``: rule v3 with ``HELIOS_ATTN_LIVE=0`` (a program per split; 2 or 4 splits a
  program at 64+ rows of 128 splits);
- ``live T Ln Ww Nb``: rule v3 with ``HELIOS_ATTN_LIVE=T`` (about T programs in all, n a
  (row, kv head), each striding over its row's live splits; the default T is marked
  ``*``), compiled with ``WARPS`` = w (``--warps``) and ``BLOCK_N`` = b (``--block-n``):
  b = SPLIT is one tile a split (``GROUPED=2``), a shorter b walks the split's tiles with
  every query head's online state (``GROUPED=3``, the rule's body for longer splits); a b
  longer than SPLIT or not dividing it is skipped with its reason printed. A variant whose
  constants equal an earlier one's is not repeated.
- ``mmaK T Ln Ww Nb`` (bf16 planes only): the tensor-core body (``GROUPED=4``,
  kernels_triton/attention.py ``_split_mma_at``: the query heads of a kv head padded to
  16 MMA rows, bf16 K/V tiles fed to ``tl.dot`` as stored) with K bf16 terms of the
  queries and probabilities (``--mma-terms``: 2 is the servable form, 1 measures what the
  second term costs) in the live layout at the targets ``--mma-targets``, x WARPS x
  BLOCK_N as above (a b shorter than SPLIT walks the split's tiles in the same body).

Every variant runs once first with NaN-poisoned outputs: the merged output of up to 6
rows must match the NumPy reference of its plane dtype (``attention_decode_split`` or
``attention_decode_split_bf16kv`` over the same bf16-rounded values, then
``attention_decode_merge``; ``rel`` = max |gpu - ref| / max |ref| < 1e-5), and every row
must be bitwise ``old``'s of the same planes where the variant keeps old's split
arithmetic (same BLOCK_N and body: speculative verification rows and decode rows sit in
different buckets). A variant with another BLOCK_N or body reduces in another order
(``reorders`` in the JSON): only the reference applies to it. The tensor-core body
always reorders and is held to its own bound instead of 1e-5 (``rel`` below
``launch.ATTN_MMA_BOUND[K]``: 5e-5 with two terms, 5e-2 with one; ``tol`` in the JSON);
one-term rows are timed and tabled but never picked as a cell's fastest (``serving``
false: not for serving). Prints per geometry and
plane dtype a table of us per layer, the fraction of the copy roofline and old's time over
this one; then the fastest verified variant of each cell. The roofline: the live KV bytes
(K and V, 4 bytes an element in f32 planes, 2 in bf16) over the time, against the bytes a
device-to-device copy moves per second (it reads and writes n bytes: 2n over its time,
measured in the same run; the attention only reads, so 1.0 is the whole of the memory
bandwidth a copy reaches). The JSON holds every row with its constants, grid, registers,
local (spill) bytes, the commit and the card.

``--quick`` is the preset one device call holds (about 6 minutes of a warm H100 with
compiles): the 8B geometry, 256 and 64 rows, 1,024 and 2,048 positions at a 4,096-position
capacity, both planes, LIVE targets 2,048-16,384, WARPS 4 and 8, BLOCK_N 64 and 32, and
the tensor-core body with 2 and 1 terms at LIVE targets 4,096 and 16,384 (flags given
beside it override its values): 200 timed rows, 75 kernels. Left out of it to stay
within the call: the tensor-core body at the 2,048 and 8,192 targets, and BLOCK_N 128
(the preset's splits are 64 positions: a 128 tile would be half masked; ``--capacities
16384 --block-n 128`` times it on 128-position splits; it compiles at 204-255 registers
without spills). ``--dry-run`` (no GPU) compiles every variant for sm_90 and prints how
many rows a run would time.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import numpy as np
from _report import git_commit, write_json  # bench/ is this script's folder
from gpu_attention_sweep import compile_variants

GEOMS = {"llama8b": (32, 8, 128), "smollm2": (9, 3, 64)}  # H, KVH, HD
# plane dtype -> (split op over planes of it, bytes an element)
PLANES = {"f32": ("attention_decode_split", 4), "bf16": ("attention_decode_split_bf16kv", 2)}
MERGE = "attention_decode_merge"  # reads no plane: one op for both dtypes
POSITIONS = (160, 1024, 2048, 4096)
CAPACITIES = (2048, 8192)
PT = 16
UNMAPPED = 1 << 30  # page id past a row's last page: reading it faults
REPLAY_BYTES = 256 << 20  # KV bytes a replay should stream at least (H100 L2: 50 MB)
MAX_LAYERS = 64
BLOCK_PAGES = 1024  # the pool repeats this many random pages
REF_REL = 1e-5
TIMED_S = 0.03  # seconds of replays a row is timed over, at least
# One device call (<= 10 minutes, ~6 of them timed): the serving bench recipe's 4,096
# positions (decode_splits: 64 splits of 64), where the 8B decode step is attention-bound;
# 256 rows first, so the budget cuts the 64-row cells if anything.
QUICK = dict(models=["llama8b"], rows=[256, 64], positions=[1024, 2048], capacities=[4096],
             planes=["f32", "bf16"], targets=[2048, 4096, 8192, 16384], warps=[4, 8],
             block_n=[64, 32], mma_terms=[2, 1], mma_targets=[4096, 16384], budget_s=330)


def _key(c: dict) -> tuple:
    return tuple(sorted(c.items()))


@dataclass(frozen=True)
class Variant:
    """One split + merge layout: ``split`` and ``merge`` are the constants (with WARPS) of
    ``attention_decode_split`` (or its bf16 form) and ``attention_decode_merge``;
    ``reorders``: its split arithmetic is not old's (another BLOCK_N or body), so its
    results need not be bitwise old's; ``planes``: the plane dtypes it runs over; ``tol``:
    its bound on ``rel`` against the reference; ``serving``: a form that may be picked as
    a cell's fastest (the tensor-core body's one-term form is for measuring only)."""

    label: str
    ns: int
    split_len: int
    split: dict
    merge: dict
    reorders: bool
    planes: tuple[str, ...] = tuple(PLANES)
    tol: float = REF_REL
    serving: bool = True


def variants(B: int, H: int, KVH: int, HD: int, cap: int, targets: list[int],
             warps: list[int] = (4,), block_ns: list[int] = (64,),
             mma_terms: list[int] = (), mma_targets: list[int] = ()
             ) -> tuple[list[Variant], list[str]]:
    """``old`` first, then one per distinct live layout x WARPS x BLOCK_N, each target's
    tensor-core variants (bf16 planes: `mma_targets` x BLOCK_N x WARPS x `mma_terms`)
    after its FMA ones; and the reasons of the combinations skipped (a BLOCK_N longer than
    SPLIT, or not dividing it)."""
    from helios_ignition.capture import launch
    from helios_ignition.capture.buffers import decode_splits

    ns, split = decode_splits(cap)
    merge = launch.attention_merge_constants(HD, ns, "v3")
    saved = launch.ATTN_LIVE, launch.ATTN_LIVE_MIN_ROWS
    out, seen, skipped = [], set(), []
    try:
        launch.ATTN_LIVE_MIN_ROWS = 1
        launch.ATTN_LIVE = 0
        # the FMA layouts whatever HELIOS_ATTN_MMA says (it would refuse f32 planes)
        old = launch.attention_split_constants(B, H, KVH, HD, ns, split, "v3", mma="off")
        out.append(Variant("old", ns, split, old, merge, False))
        seen.add(_key(old))
        fma_targets = dict.fromkeys([saved[0], *targets])
        for t in dict.fromkeys([*fma_targets, *mma_targets]):  # the default's label first
            if t <= 0:
                continue
            launch.ATTN_LIVE = t
            c = launch.attention_split_constants(B, H, KVH, HD, ns, split, "v3", mma="off")
            mark = "*" if t == saved[0] else ""
            for bn in block_ns:
                if bn > split or split % bn:
                    skipped.append(f"BLOCK_N {bn} at SPLIT {split}: "
                                   + ("longer than a split" if bn > split
                                      else "does not divide a split"))
                    continue
                for w in warps if t in fma_targets else ():
                    # one tile a split (GROUPED=2) or the online walk over its tiles
                    # (GROUPED=3): launch.attention_split_constants' own choice by length
                    v = dict(c, WARPS=w, BLOCK_N=bn, GROUPED=2 if bn >= split else 3)
                    if _key(v) in seen:
                        continue
                    seen.add(_key(v))
                    reorders = (bn, v["GROUPED"]) != (old["BLOCK_N"], old["GROUPED"])
                    out.append(Variant(f"live {t}{mark} L{c['LIVE']} W{w} N{bn}", ns, split,
                                       v, merge, reorders))
            for bn in block_ns if t in mma_targets else ():
                if bn > split or split % bn:
                    continue  # (named above)
                for w in warps:
                    for terms in mma_terms:
                        m = launch.attention_split_constants(B, H, KVH, HD, ns, split, "v3",
                                                             plane="bf16", mma=str(terms))
                        v = dict(m, WARPS=w, BLOCK_N=bn)
                        if _key(v) in seen:
                            continue
                        seen.add(_key(v))
                        out.append(Variant(f"mma{terms} {t}{mark} L{m['LIVE']} W{w} N{bn}",
                                           ns, split, v, merge, True, ("bf16",),
                                           launch.ATTN_MMA_BOUND[terms], terms == 2))
    finally:
        launch.ATTN_LIVE, launch.ATTN_LIVE_MIN_ROWS = saved
    return out, list(dict.fromkeys(skipped))


def _grid_z(c: dict, ns: int) -> int:
    return c.get("LIVE") or -(-ns // c.get("SPP", 1))


def variant_table(args) -> tuple[dict, int, list[str]]:
    """``({op: {constants key: constants}}, rows a run would time, skip reasons)``."""
    allv = {PLANES[p][0]: {} for p in args.planes}
    allv[MERGE] = {}
    timed, skipped = 0, []
    for B in args.rows:
        for model in args.models:
            H, KVH, HD = GEOMS[model]
            for cap in args.capacities:
                vs, why = variants(B, H, KVH, HD, cap, args.targets, args.warps, args.block_n,
                                   args.mma_terms, args.mma_targets)
                skipped += why
                timed += (sum(len(set(v.planes) & set(args.planes)) for v in vs)
                          * sum(p <= cap for p in args.positions))
                for v in vs:
                    for p in set(v.planes) & set(args.planes):
                        allv[PLANES[p][0]].setdefault(_key(v.split), v.split)
                    allv[MERGE].setdefault(_key(v.merge), v.merge)
    return allv, timed, list(dict.fromkeys(skipped))


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true",
                    help="the preset one device call holds (flags given beside it win)")
    ap.add_argument("--budget-s", type=float, default=420,
                    help="stop timing new rows this many seconds after the start")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--models", nargs="+", choices=list(GEOMS), default=list(GEOMS))
    ap.add_argument("--planes", nargs="+", choices=list(PLANES), default=list(PLANES))
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--positions", type=int, nargs="+", default=list(POSITIONS))
    ap.add_argument("--targets", type=int, nargs="+", default=[1024, 2048, 4096, 8192],
                    help="HELIOS_ATTN_LIVE values of the live layouts")
    ap.add_argument("--warps", type=int, nargs="+", default=[4],
                    help="WARPS of the live layouts' split kernel (the rule's: 4)")
    ap.add_argument("--block-n", type=int, nargs="+", default=[64],
                    help="BLOCK_N of the live layouts' split kernel (the rule's: 64)")
    ap.add_argument("--mma-terms", type=int, nargs="*", choices=[1, 2], default=[2],
                    help="bf16 terms of the tensor-core body's variants (bf16 planes; "
                         "none: no such variants)")
    ap.add_argument("--mma-targets", type=int, nargs="+", default=[4096],
                    help="HELIOS_ATTN_LIVE values of the tensor-core body's variants")
    ap.add_argument("--capacities", type=int, nargs="+", default=list(CAPACITIES),
                    help="positions of capacity (over 8,192: splits of several tiles)")
    ap.add_argument("--dry-run", action="store_true", help="compile only (no GPU)")
    if "--quick" in (sys.argv[1:] if argv is None else argv):
        ap.set_defaults(**QUICK)
    args = ap.parse_args(argv)
    for name in ("rows", "positions", "targets", "warps", "block_n", "capacities",
                 "mma_targets"):
        if min(getattr(args, name)) <= 0:
            ap.error(f"--{name.replace('_', '-')} takes positive integers")
    return args


def main() -> None:
    args = parse_args()
    t_start = time.perf_counter()
    allv, n_timed, skipped_combos = variant_table(args)
    for why in skipped_combos:
        print("skipped:", why)
    nv = sum(len(t) for t in allv.values())
    compiled, failed = compile_variants(allv, args.workers)
    t_compile = time.perf_counter() - t_start
    print(f"compiled {len(compiled)}/{nv} variants for sm_90 in {t_compile:.0f}s "
          f"({', '.join(f'{op} {len(t)}' for op, t in allv.items())}); a run times "
          f"{n_timed} rows", flush=True)
    for key, err in failed.items():
        print("compile failed:", key, err)
    if args.dry_run:
        return
    from helios_ignition.capture.buffers import decode_splits
    from helios_serve.runtime.cuda import driver as drv
    from helios_tools import kernels as K
    from helios_tools.kernels.kv_bf16 import encode_bf16

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
        local = drv.call("r", cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                                                     fn))
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

    # The roofline: the bytes a device-to-device copy moves per second (reads and writes
    # n bytes each).
    n = 1 << 30
    src, dst = alloc(n), alloc(n)
    drv.call("m", cu.cuMemcpyDtoDAsync(dst, src, n, stream))
    drv.call("s", cu.cuStreamSynchronize(stream))
    t0 = time.perf_counter()
    for _ in range(5):
        drv.call("m", cu.cuMemcpyDtoDAsync(dst, src, n, stream))
    drv.call("s", cu.cuStreamSynchronize(stream))
    copy_read_gbps = 5 * n / (time.perf_counter() - t0) / 1e9
    copy_gbps = 2 * copy_read_gbps
    cu.cuMemFree(src)
    cu.cuMemFree(dst)
    print(f"{card}: a device copy reads {copy_read_gbps:.0f} GB/s, moves {copy_gbps:.0f}",
          flush=True)

    def launch_pair(v, geo, d, pt_ptr, kv):
        (fn_s, ck_s, cnt_s, _, _), (fn_m, ck_m, cnt_m, _, _), z = v
        B, H, KVH, HD, NS, SPLIT, MP, scale = geo
        a1 = drv.KernelArgs(
            [("ptr", d["qkv"]), ("ptr", d["pos"]), ("ptr", d["slot"]), ("ptr", pt_ptr),
             ("ptr", kv[0]), ("ptr", kv[1]), ("ptr", d["ml"]), ("ptr", d["po"]),
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
    for model in args.models:
        H, KVH, HD = GEOMS[model]
        scale = HD ** -0.5
        page_elems = PT * KVH * HD
        kb = rng.standard_normal((BLOCK_PAGES, PT, KVH, HD), dtype=np.float32)
        vb = rng.standard_normal((BLOCK_PAGES, PT, KVH, HD), dtype=np.float32)
        # per plane dtype: the host block as stored (bf16: its bit patterns, the values the
        # reference reads through Bf16Plane), the pool's pages and device planes
        host = {"f32": (kb, vb), "bf16": (encode_bf16(kb), encode_bf16(vb))}
        pool, planes = {}, {}
        for p in args.planes:
            esize = PLANES[p][1]
            pages = max(max(args.rows) * -(-max(args.positions) // PT),
                        -(-REPLAY_BYTES // (2 * page_elems * esize)) + BLOCK_PAGES)
            pool[p] = pages
            planes[p] = (alloc(pages * page_elems * esize), alloc(pages * page_elems * esize))
            for at in range(0, pages, BLOCK_PAGES):  # page q holds block page q % NB
                m = min(BLOCK_PAGES, pages - at)
                for ptr, blk in zip(planes[p], host[p], strict=True):
                    h2d(ptr, blk[:m], at * page_elems * esize)
        d = {}
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
                vlist, _ = variants(B, H, KVH, HD, cap, args.targets, args.warps, args.block_n,
                                    args.mma_terms, args.mma_targets)
                for npos in args.positions:
                    if npos > cap:
                        continue
                    pos = (npos - 1 - rng.integers(0, 16, B)).astype(np.int32)
                    h2d(d["pos"], pos)
                    ppr = -(-npos // PT)
                    vr = np.unique(np.r_[np.arange(min(B, 3)), B // 2, B - 2 if B > 1 else 0,
                                         B - 1])
                    for p in args.planes:
                        op, esize = PLANES[p]
                        kv_bytes = int((pos.astype(np.int64) + 1).sum()) * KVH * HD * esize * 2
                        layer_bytes = B * ppr * page_elems * esize * 2
                        nl = int(max(1, min(MAX_LAYERS, -(-REPLAY_BYTES // layer_bytes),
                                            pool[p] // (B * ppr))))
                        pts = np.full((nl, B, MP), UNMAPPED, np.int32)
                        for li in range(nl):  # each layer its own pages of the pool
                            pts[li, :, :ppr] = (li * B * ppr + rng.permutation(B * ppr)
                                                ).reshape(B, ppr)
                        for b in range(B):  # unmapped past each row's last page
                            pts[:, b, int(pos[b]) // PT + 1:] = UNMAPPED
                        d["pt"] = alloc(pts.nbytes)
                        h2d(d["pt"], pts)
                        NS, SPLIT = vlist[0].ns, vlist[0].split_len
                        nr = vr.size
                        ml = np.zeros((nr, H, NS, 2), np.float32)
                        po = np.zeros((nr, H, NS, HD), np.float32)
                        K.reference_op(op)(qkv[vr], pos[vr], slot[:nr], pts[0, vr] % BLOCK_PAGES,
                                           *host[p], ml, po, nr, MP, PT, H, KVH, HD, NS, SPLIT,
                                           scale)
                        ref = np.zeros((nr, H * HD), np.float32)
                        K.attention_decode_merge(ml, po, slot[:nr], ref, nr, H, HD, NS)
                        old_out = None
                        for v in vlist:
                            kS, kM = (op, _key(v.split)), (MERGE, _key(v.merge))
                            if p not in v.planes or kS not in fns or kM not in fns:
                                continue
                            if time.perf_counter() - t_start > args.budget_s - 5:
                                skipped += 1
                                continue
                            t_row = time.perf_counter()
                            z = _grid_z(v.split, NS)
                            fv = (fns[kS], fns[kM], z)
                            geo = (B, H, KVH, HD, NS, SPLIT, MP, scale)
                            for name, cnt in (("ml", B * H * NS * 2), ("po", B * H * NS * HD),
                                              ("out", B * H * HD)):
                                drv.call("p", cu.cuMemsetD32Async(d[name], 0x7FC00000, cnt,
                                                                  stream))
                            keep = launch_pair(fv, geo, d, d["pt"], planes[p])
                            drv.call("s", cu.cuStreamSynchronize(stream))
                            del keep
                            got = d2h(d["out"], out0)
                            finite = bool(np.isfinite(got).all())
                            rel = (float(np.abs(got[vr].astype(np.float64) - ref).max()
                                         / max(np.abs(ref).max(), 1e-30)) if finite
                                   else float("inf"))
                            if v.label == "old":
                                old_out = got
                            same_as_old = (None if old_out is None else bool(
                                np.array_equal(got.view(np.uint32), old_out.view(np.uint32))))
                            ref_ok = finite and rel < v.tol
                            ok = ref_ok and (v.reorders or same_as_old is True)
                            keep = []
                            drv.call("b", cu.cuStreamBeginCapture(
                                stream,
                                cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
                            for li in range(nl):
                                keep.append(launch_pair(fv, geo, d, d["pt"] + li * B * MP * 4,
                                                        planes[p]))
                            graph = drv.call("e", cu.cuStreamEndCapture(stream))
                            exe = drv.call("i", cu.cuGraphInstantiate(graph, 0))
                            t0 = time.perf_counter()
                            drv.call("g", cu.cuGraphLaunch(exe, stream))
                            drv.call("s", cu.cuStreamSynchronize(stream))
                            # at least TIMED_S of replays (5 to 200): a one-layer graph of
                            # ~300 MB takes ~0.1 ms, where 5 replays would be mostly noise
                            reps = int(min(200, max(5, TIMED_S // max(
                                time.perf_counter() - t0, 1e-6))))
                            t0 = time.perf_counter()
                            for _ in range(reps):
                                drv.call("g", cu.cuGraphLaunch(exe, stream))
                            drv.call("s", cu.cuStreamSynchronize(stream))
                            us = (time.perf_counter() - t0) / (reps * nl) * 1e6
                            cu.cuGraphExecDestroy(exe)
                            cu.cuGraphDestroy(graph)
                            gbps = kv_bytes / us / 1e3
                            rows.append({
                                "model": model, "planes": p, "B": B, "capacity": cap,
                                "positions": npos, "label": v.label, "NS": NS,
                                "SPLIT": SPLIT, "grid": [B, KVH, z], "us": us, "GBps": gbps,
                                "roofline_fraction": gbps / copy_gbps,
                                "copy_read_fraction": gbps / copy_read_gbps,
                                "kv_bytes": kv_bytes, "rel": rel, "tol": v.tol,
                                "serving": v.serving, "finite": finite,
                                "bitwise_old": same_as_old, "reorders": v.reorders,
                                "ref_ok": ref_ok, "ok": ok,
                                "regs": [fns[kS][3], fns[kM][3]],
                                "local_bytes": [fns[kS][4], fns[kM][4]], "layers": nl,
                                "replays": reps,
                                "split": v.split, "merge": v.merge,
                                "row_s": time.perf_counter() - t_row})
                        cu.cuMemFree(d.pop("pt"))
            for name in ("qkv", "slot", "pos", "out", "ml", "po"):
                cu.cuMemFree(d.pop(name))
            print(f"{model} B={B} done at {time.perf_counter() - t_start:.0f}s", flush=True)
        for ptrs in planes.values():
            for ptr in ptrs:
                cu.cuMemFree(ptr)
    summary, best = report(rows, args)
    print(f"timed {len(rows)} of {n_timed} rows in {time.perf_counter() - t_start:.0f}s "
          f"(compile {t_compile:.0f}s); {skipped} skipped for the budget", flush=True)
    if args.json:
        write_json(args.json, {"commit": git_commit(), "card": card,
                               "copy_read_GBps": copy_read_gbps, "copy_GBps": copy_gbps,
                               "page_tokens": PT, "compile_s": t_compile,
                               "args": vars(args), "rows": rows, "summary": summary,
                               "best": best, "skipped_combinations": skipped_combos,
                               "compile_failed": {str(k): v for k, v in failed.items()}})


def report(rows: list[dict], args) -> tuple[list[dict], list[dict]]:
    """Print the failures, a table per (geometry, plane dtype) and the fastest verified
    serving variant of each cell (and the fastest within the reference where that one is
    not bitwise old's: a WARPS change may reorder a reduction too; and the tensor-core
    body's fastest one-term row, which measures what its second term costs); returns the
    summary rows and the best ones (JSON)."""
    bad = [r for r in rows if not r["ok"]]
    print(f"{len(bad)} of {len(rows)} rows failed verification")
    for r in bad:
        print("  FAIL", r["model"], r["planes"], r["B"], r["capacity"], r["positions"],
              r["label"], "rel", r["rel"], "tol", r["tol"], "finite", r["finite"],
              "bitwise_old",
              r["bitwise_old"], "reorders", r["reorders"])
    summary, best = [], []
    for model in args.models:
        for p in args.planes:
            print(f"\n{model}, {p} planes: us per layer (split + merge), fraction of the copy "
                  "roofline, old / this (> 1 faster); '!' off the reference, 'b' within it "
                  "but not bitwise old's, '~' reorders (reference only), '1' one-term "
                  "tensor-core form (within its bound; not for serving)")
            for cap in args.capacities:
                for B in args.rows:
                    cell = [r for r in rows if (r["model"], r["planes"], r["capacity"], r["B"])
                            == (model, p, cap, B)]
                    for label in dict.fromkeys(r["label"] for r in cell):
                        line = f"  cap {cap:5} B{B:<4} {label:28}"
                        for pos in args.positions:
                            r = next((r for r in cell
                                      if (r["positions"], r["label"]) == (pos, label)), None)
                            o = next((r for r in cell
                                      if (r["positions"], r["label"]) == (pos, "old")), None)
                            if r is None:
                                line += f" {'-':>25}"
                                continue
                            x = o["us"] / r["us"] if o else float("nan")
                            flag = ("!" if not r["ref_ok"] else "b" if not r["ok"]
                                    else "1" if not r["serving"]
                                    else "~" if r["reorders"] else "")
                            line += (f" @{pos:<5}{r['us']:8.1f} {r['roofline_fraction']:4.2f} "
                                     f"{x:5.2f}x{flag}")
                            summary.append({"model": model, "planes": p, "capacity": cap,
                                            "B": B, "positions": pos, "label": label,
                                            "us": r["us"],
                                            "roofline_fraction": r["roofline_fraction"],
                                            "old_over_this": x, "ok": r["ok"],
                                            "ref_ok": r["ref_ok"],
                                            "reorders": r["reorders"]})
                        print(line)
    print("\nfastest verified variant per cell (us per layer, fraction of the copy roofline)")
    cells = dict.fromkeys((r["model"], r["planes"], r["capacity"], r["B"], r["positions"])
                          for r in rows)
    for cell in cells:
        mine = [r for r in rows
                if (r["model"], r["planes"], r["capacity"], r["B"], r["positions"]) == cell]
        ok = [r for r in mine if r["ok"] and r["serving"]]
        near = min((r for r in mine if r["ref_ok"] and r["serving"]), key=lambda r: r["us"],
                   default=None)
        one = min((r for r in mine if r["ok"] and not r["serving"]), key=lambda r: r["us"],
                  default=None)
        if not ok:
            print("  ", *cell, "no verified variant")
            continue
        r = min(ok, key=lambda r: r["us"])
        o = next((o for o in ok if o["label"] == "old"), None)
        alt = near if near is not None and near is not r else None
        best.append({"model": cell[0], "planes": cell[1], "capacity": cell[2], "B": cell[3],
                     "positions": cell[4], "label": r["label"], "us": r["us"],
                     "roofline_fraction": r["roofline_fraction"],
                     "old_us": o["us"] if o else None,
                     "fastest_within_reference": None if alt is None else {
                         "label": alt["label"], "us": alt["us"],
                         "roofline_fraction": alt["roofline_fraction"]},
                     "fastest_one_term": None if one is None else {
                         "label": one["label"], "us": one["us"],
                         "roofline_fraction": one["roofline_fraction"]}})
        print(f"  {cell[0]} {cell[1]:4} cap {cell[2]} B{cell[3]:<4} @{cell[4]:<5} "
              f"{r['label']:28} {r['us']:8.1f} {r['roofline_fraction']:4.2f}"
              + (f" (old {o['us']:.1f})" if o else "")
              + (f"; not bitwise old's: {alt['label']} {alt['us']:.1f} "
                 f"{alt['roofline_fraction']:.2f}" if alt else "")
              + (f"; one term: {one['label']} {one['us']:.1f}" if one else ""))
    return summary, best


if __name__ == "__main__":
    main()
