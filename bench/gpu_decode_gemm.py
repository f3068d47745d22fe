"""Batched-decode products on the tensor-core tile (issue 27): at the decode buckets (64 to
256 rows) of the Llama-3.1-8B matrices, the K-split packed path capture records today
(``split_bf16`` -> ``linear_packed`` over S K slices -> ``splitk_reduce``) against
linear_packed's ``TC=1`` tile with one slice (prefill's packed path: no reduction) over a
grid of tiles, both activation forms, and torch.matmul (cuBLAS, bf16 x bf16) in the same
process as the yardstick. The LM head (128256 x 4096) is measured too, against the path
capture records for it today at these rows (the ``linear`` kernel over f32 activations).

    python bench/gpu_decode_gemm.py --json OUT.json [--rows 64,96,128,160,192,224,256]

Needs a GPU, torch (the yardstick and the buffers only: serving never imports it), Triton
and cuda-bindings; compiles and launches through bench/gpu_prefill_gemm.py's Launcher
(the serving path's ahead-of-time compile and cuLaunchKernel), each timing the median of 5
replays of a torch CUDA graph of 10 launches.

Correctness first, on fresh random inputs (activations N(0, 3^2), bf16 weights
N(0, 1/K)): outputs are poisoned with NaN before the checked launch; every element must be
finite, a second launch bitwise equal, and ``rel`` = ||out - ref|| / ||ref|| on 512 random
columns against the float64 product below 5e-5 (hi/lo), or ``rel_bf16x`` against the
float64 product of the activations rounded to bf16 (hi only, ``XSPLIT=0``). Times with
``+split`` include the ``split_bf16`` pass both paths need.

Prints per cell the K-split path, the best verified TC tile of each form and torch, per
row count the four products of a layer summed and times 32 layers (the products' share of
an 8B decode step), and last the ``_DECODE_TC_TILES`` entries for
``capture/launch.py``: every cell where the best verified hi/lo TC tile beat the K-split
path (one line each, the speed-up in the comment).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _report import git_commit, write_json  # noqa: E402  bench/ is this script's folder
from gpu_prefill_gemm import CHECK_COLS, SHAPES, Launcher, _View, timed  # noqa: E402

LAYERS = 32  # Llama-3.1-8B
# The sweep's TC tiles: launch.DECODE_TILES plus narrower and deeper ones.
EXTRA_TILES = ((64, 64, 64, 4, 4), (64, 128, 64, 4, 3), (64, 256, 64, 4, 4),
               (128, 128, 64, 4, 4), (64, 128, 128, 4, 3))
REL_BOUND = 5e-5
# The layer products and the LM head (Llama-3.1-8B's vocabulary; today's path at decode
# rows is the linear kernel over f32 activations, no split pass).
ALL_SHAPES = {**SHAPES, "lm_head": (128256, 4096)}


def tc_constants(tile, xsplit: int) -> dict:
    bt, bn, bk, warps, stages = tile
    return dict(TC=1, BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk, WARPS=warps, STAGES=stages,
                GROUP_T=8, XSPLIT=xsplit, EVEN_K=1, WBF16=1, K16=1, PACKED=1)


def label(c: dict) -> str:
    return (f"{c['BLOCK_T']}x{c['BLOCK_N']}x{c['BLOCK_K']} w{c['WARPS']} s{c['STAGES']}"
            f" {'hilo' if c.get('XSPLIT', 1) else 'bf16'}")


def check(out, T: int, cols, ref, ref_b, enqueue) -> tuple[bool, bool, float, float]:
    """(finite, bitwise repeatable, rel, rel_bf16x) of what `enqueue` writes to out[:T]:
    out poisoned with NaN, two launches."""
    N = out.shape[1]
    out.view(-1)[: T * N].fill_(float("nan"))
    keep = []
    enqueue(keep)
    got = out[:T].clone()
    enqueue(keep)
    torch.cuda.synchronize()
    same = bool(torch.equal(got.view(torch.int32), out[:T].view(torch.int32)))
    g64 = got[:, cols].double()
    return (bool(torch.isfinite(got).all()), same, float((g64 - ref).norm() / ref.norm()),
            float((g64 - ref_b).norm() / ref_b.norm()))


def measure(L, rule, plan: dict, name: str, N: int, Kd: int, rows_list: list[int], gen,
            deadline: float) -> list[dict]:
    """One matrix at every row count: torch, split_bf16, the K-split path, the TC tiles
    (those past `deadline`, a perf_counter time, are recorded as skipped)."""
    tmax = max(rows_list)
    w = (torch.randn(N, Kd, device="cuda", generator=gen) / Kd ** 0.5).to(torch.bfloat16)
    x = torch.randn(tmax, Kd, device="cuda", generator=gen) * 3
    xb = x.to(torch.bfloat16)
    xs = torch.empty(tmax, Kd, device="cuda")  # packed hi|lo terms (split_bf16)
    out = torch.empty(tmax, N, device="cuda")
    cols = torch.randperm(N, device="cuda", generator=gen)[:CHECK_COLS]
    wc64 = w[cols].double()
    rows = []
    for T in rows_list:
        p = plan[(name, T)]
        ref = x[:T].double() @ wc64.T
        ref_b = xb[:T].double() @ wc64.T
        xt = xb[:T]
        tm = timed(lambda keep, xt=xt: keep.append(torch.matmul(xt, w.t())), reps=10)
        sc = rule.launch_config("split_bf16", [T, Kd], [])
        sa = [x, xs, T, Kd]
        L.launch("split_bf16", dict(sc.constants), sc.grid, sa)
        split_us = timed(lambda keep, sc=sc, sa=sa: keep.extend(L.launch(
            "split_bf16", dict(sc.constants), sc.grid, sa)), reps=10)
        row = dict(shape=name, N=N, K=Kd, T=T, torch_us=tm, split_us=split_us, ksplit=None,
                   tc=[])
        S, ks, red, op = p["S"], p["ksplit"], p["reduce"], p["op"]
        if (op, tuple(sorted(ks.items()))) in L.fns:
            part = torch.empty(S * T, N, device="cuda") if S > 1 else out
            if op == "linear":  # f32 activations, no split pass
                grid, pa, extra = p["grid"], [x, w, out, T, N, Kd], 0.0
            else:
                grid = (-(-N // ks["BLOCK_N"]), -(-T // ks["BLOCK_T"]), S)
                pa, extra = [xs, w, part, T, N, Kd, S], split_us
            ra = [part, out, T, N, S]

            def ksplit(keep, op=op, ks=ks, grid=grid, pa=pa, red=red, ra=ra):
                keep.extend(L.launch(op, ks, grid, pa))
                if red is not None:
                    keep.extend(L.launch("splitk_reduce", dict(red.constants), red.grid, ra))

            finite, same, rel, rel_b = check(out, T, cols, ref, ref_b, ksplit)
            us = timed(ksplit, reps=10)
            row["ksplit"] = dict(op=op, S=S, constants=ks, us=us, us_with_split=us + extra,
                                 vs_torch=tm / (us + extra), finite=finite,
                                 deterministic=same, rel=rel, rel_bf16x=rel_b)
        for c in p["tc"]:
            key = ("linear_packed", tuple(sorted(c.items())))
            if key not in L.fns:
                continue
            if time.perf_counter() > deadline:
                row["tc"].append(dict(label=label(c), skipped="budget"))
                continue
            grid = (-(-T // c["BLOCK_T"]) * -(-N // c["BLOCK_N"]), 1, 1)
            ta = [xs, w, out, T, N, Kd, 1]

            def tc(keep, c=c, grid=grid, ta=ta):
                keep.extend(L.launch("linear_packed", c, grid, ta))

            finite, same, rel, rel_b = check(out, T, cols, ref, ref_b, tc)
            us = timed(tc, reps=10)
            _, ck, _, regs, local = L.fns[key]
            row["tc"].append(dict(label=label(c), constants=c, grid=grid, us=us,
                                  us_with_split=us + split_us, vs_torch=tm / (us + split_us),
                                  finite=finite, deterministic=same, rel=rel, rel_bf16x=rel_b,
                                  regs=regs, local_bytes=local, shared_bytes=ck.shared_bytes))
        rows.append(row)
        kus = row["ksplit"]["us"] if row["ksplit"] else float("nan")
        print(f"{name} T={T} torch {tm:.1f} us, split {split_us:.1f} us, K-split S={S} "
              f"{kus:.1f} us; {len(row['tc'])} TC variants", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--rows", default="64,96,128,160,192,224,256")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--budget-s", type=float, default=420)
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows_list = [int(r) for r in args.rows.split(",")]
    card = torch.cuda.get_device_name()
    print(f"card {card}, commit {git_commit()}", flush=True)
    L = Launcher()

    from helios_ignition.capture import launch as rule

    rule.DECODE_TC = "off"  # the K-split path as the default rule records it today
    tiles = list(dict.fromkeys(rule.DECODE_TILES + EXTRA_TILES))
    plan: dict[tuple[str, int], dict] = {}
    items = []
    for name, (N, Kd) in ALL_SHAPES.items():
        w = _View((N, Kd), "bf16")
        for T in rows_list:
            tcs = [tc_constants(tile, x) for tile in tiles for x in (1, 0)]
            items.append(("split_bf16", dict(rule.launch_config("split_bf16", [T, Kd],
                                                                []).constants)))
            if name == "lm_head":  # the linear kernel, as capture records the head today
                cfg = rule.launch_config("linear", [T, N, Kd], [None, w])
                ks = dict(cfg.constants)
                plan[(name, T)] = dict(op="linear", S=1, ksplit=ks, reduce=None, tc=tcs,
                                       grid=cfg.grid)
                items += [("linear", ks)] + [("linear_packed", c) for c in tcs]
                continue
            S = rule.mma_plan(T, N, Kd)
            assert S is not None, (name, T)  # every 8B cell at 8-256 rows takes the path
            ks = dict(rule.launch_config("linear_packed", [T, N, Kd, S], [None, w]).constants)
            red = rule.launch_config("splitk_reduce", [T, N, S]) if S > 1 else None
            plan[(name, T)] = dict(op="linear_packed", S=S, ksplit=ks, reduce=red, tc=tcs)
            items += [("linear_packed", ks)] + [("linear_packed", c) for c in tcs]
            if red is not None:
                items.append(("splitk_reduce", dict(red.constants)))
    L.compile(items, args.workers)
    print(f"compiled {len(L.fns)} variants ({len(L.failed)} failed) in "
          f"{time.perf_counter() - t0:.0f}s", flush=True)
    for key, err in L.failed.items():
        print("  compile failed:", key[0], dict(key[1]), err[:300])

    gen = torch.Generator(device="cuda").manual_seed(int(time.time()))
    results = []
    for name, (N, Kd) in ALL_SHAPES.items():
        results += measure(L, rule, plan, name, N, Kd, rows_list, gen, t0 + args.budget_s)
        torch.cuda.empty_cache()
        print(f"{name}: t={time.perf_counter() - t0:.0f}s", flush=True)

    def verified(v, hilo: bool) -> bool:
        return ("us" in v and v["finite"] and v["deterministic"]
                and (v["rel"] if hilo else v["rel_bf16x"]) < REL_BOUND)

    print(f"\n{card}  commit {git_commit()}  (us per product with the split_bf16 pass; "
          f"xT = torch.matmul time / this)")
    summary, table = [], {}
    for row in results:
        ks = row["ksplit"]
        best = {}
        for form, hilo in (("hilo", True), ("bf16", False)):
            vs = [v for v in row["tc"] if v.get("constants", {}).get("XSPLIT") == int(hilo)
                  and verified(v, hilo)]
            best[form] = min(vs, key=lambda v: v["us"]) if vs else None
        ks_ok = ks is not None and verified(ks, True)
        s = dict(shape=row["shape"], N=row["N"], K=row["K"], T=row["T"],
                 torch_us=row["torch_us"], split_us=row["split_us"],
                 ksplit_us=ks["us_with_split"] if ks_ok else None,
                 tc_hilo=best["hilo"] and dict(label=best["hilo"]["label"],
                                               us=best["hilo"]["us_with_split"]),
                 tc_bf16=best["bf16"] and dict(label=best["bf16"]["label"],
                                               us=best["bf16"]["us_with_split"]))
        summary.append(s)
        line = f"{row['shape']:8} T={row['T']:4} torch {row['torch_us']:7.1f}"
        today = "linear" if ks and ks["op"] == "linear" else f"K-split S={ks and ks['S']}"
        line += (f"  {today} {ks['us_with_split']:7.1f} x{ks['vs_torch']:.2f}"
                 if ks_ok else "  K-split (not verified)")
        for form in ("hilo", "bf16"):
            v = best[form]
            line += (f"  TC {form} {v['label'][:18]:18} {v['us_with_split']:7.1f} "
                     f"x{v['vs_torch']:.2f}" if v else f"  TC {form} -")
        print(line)
        h = best["hilo"]
        if h and ks_ok and h["us_with_split"] < ks["us_with_split"]:
            c = h["constants"]
            table[(row["N"], row["K"], row["T"])] = (
                (c["BLOCK_T"], c["BLOCK_N"], c["BLOCK_K"], c["WARPS"], c["STAGES"]),
                row["shape"], ks["us_with_split"] / h["us_with_split"])
    print(f"\nper layer (the 4 products) and x{LAYERS} layers, ms per decode step:")
    per_rows = []
    for T in rows_list:
        cells = [s for s in summary if s["T"] == T and s["shape"] in SHAPES]
        head = next((s for s in summary if s["T"] == T and s["shape"] == "lm_head"), None)

        def total(get, cells=cells):
            vals = [get(s) for s in cells]
            return None if None in vals or len(vals) != len(SHAPES) else sum(vals)

        ks = total(lambda s: s["ksplit_us"])
        hl = total(lambda s: s["tc_hilo"] and s["tc_hilo"]["us"])
        b1 = total(lambda s: s["tc_bf16"] and s["tc_bf16"]["us"])
        best = total(lambda s: min([u for u in (s["ksplit_us"], s["tc_hilo"] and
                                                s["tc_hilo"]["us"]) if u is not None],
                                   default=None))
        tq = total(lambda s: s["torch_us"])
        per_rows.append(dict(T=T, ksplit_us=ks, tc_hilo_us=hl, tc_bf16_us=b1,
                             best_hilo_us=best, torch_us=tq, lm_head=head))

        def fmt(v):
            return f"{v:8.1f} us {v * LAYERS / 1e3:6.2f} ms" if v is not None else " " * 20

        print(f"  T={T:4} K-split {fmt(ks)} | TC hi/lo {fmt(hl)} | per-cell best {fmt(best)}"
              f" | TC bf16 {fmt(b1)} | torch {fmt(tq)}")
        if head:
            th = head["tc_hilo"]["us"] if head["tc_hilo"] else float("nan")
            print(f"         lm_head: linear {head['ksplit_us'] or float('nan'):8.1f} us | TC "
                  f"hi/lo {th:8.1f} us | torch {head['torch_us']:8.1f} us (once per step)")
    print("\n_DECODE_TC_TILES entries (cells where the TC hi/lo tile beat today's path):")
    for (N, Kd, T), (tile, shape, x) in table.items():
        print(f"    ({N}, {Kd}, {T}): {tile},  # {shape} x{x:.2f}")
    bad = [(r["shape"], r["T"], v["label"]) for r in results for v in r["tc"]
           if "us" in v and not (v["finite"] and v["deterministic"])]
    print(f"{len(bad)} TC variant runs not finite or not deterministic: {bad[:10]}")
    print(f"done in {time.perf_counter() - t0:.0f}s")
    if args.json:
        write_json(args.json, dict(
            card=card, commit=git_commit(), torch=torch.__version__,
            triton=__import__("triton").__version__, rows=rows_list, summary=summary,
            per_layer=per_rows, layers=LAYERS,
            decode_tc_tiles={f"{N},{Kd},{T}": dict(tile=t, shape=s, speedup=x)
                             for (N, Kd, T), (t, s, x) in table.items()},
            cells=results,
            compile_failed={f"{k[0]} {dict(k[1])}": v for k, v in L.failed.items()}),
            default=str)


if __name__ == "__main__":
    main()
