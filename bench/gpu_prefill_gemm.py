"""Prefill GEMMs on the tensor cores: the ``linear`` kernel's tile path (``TC=1``) against
torch.matmul (cuBLAS, bf16 x bf16) on the Llama-3.1-8B matrices, in one process.

    python bench/gpu_prefill_gemm.py --mode sweep|rule --json OUT.json [--rows 256,512,1024,4096]

Needs a GPU, torch (the yardstick only: serving never imports it), Triton and
cuda-bindings. Each variant is compiled ahead of time for the device's target through
``kernels_aot.compile_each`` and launched with ``cuLaunchKernel`` (the serving path's
compile and launch), on torch's stream so that torch allocates the buffers and a torch
CUDA graph of ``--reps`` launches times each (median of 5 replays, events).

Correctness first, on fresh random inputs (activations N(0, 1), bf16 weights
N(0, 1/K)): outputs are poisoned with NaN before the checked launch; every element must be
finite and a second launch bitwise equal; ``rel`` = ||out - ref|| / ||ref|| on 512 random
columns against a float64 product, ``rel_bf16x`` against the float64 product of the
activations rounded to bf16 (what a one-term ``XSPLIT=0`` product computes). The float64
product is itself checked against ``helios_tools.kernels.linear`` (NumPy) on 64 rows.
``--mode rule`` also checks the folded forms (``rmsnorm_linear``, ``linear_add``) of the
launch rule's choice against their NumPy references, and times both activation forms of
the packed path as capture records them: ``packed-rule`` (f32 activations: ``split_bf16``
then two terms) and ``packed-rule-bf16`` (``--activation-dtype bf16``: ``round_bf16``
then one term, ``XSPLIT=0``); every one-term variant runs over ``round_bf16``'s
``hi | 0`` buffer, and its ``+split`` time adds that pass.

Modes: ``sweep`` times a grid of tiles (both one-term and hi/lo activations, cp.async or
TMA loads, one program per tile or a persistent grid) plus HEAD's prefill tile
(``128,128,32,8,4,0,0``, the old rule); ``rule`` times what ``launch.launch_config``
records for each shape and row count, HEAD's tile and torch. FLOP/s count one
multiply-add as 2 FLOPs of the ``T x N x K`` product (the hi/lo form does twice the
tensor work for the same count).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time

import numpy as np
import torch

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336)}
SMS = 132
CHECK_COLS = 512
PACKED_TILES = ((128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (64, 256, 64, 4, 4),
                (256, 128, 64, 8, 3), (128, 256, 64, 8, 4))
HEAD = dict(BLOCK_T=128, BLOCK_N=128, BLOCK_K=32, WARPS=8, STAGES=4, PREFETCH=0, STACK=0,
            WBF16=1, K16=1)


class _View:  # what launch_config reads of a view
    def __init__(self, shape, dtype):
        self.shape, self.buffer = shape, type("D", (), {"dtype": dtype})()


def sweep_variants() -> list[dict]:
    """(constants, persistent?) pairs of the sweep; HEAD's tile first."""
    out = [dict(c=HEAD, persist=0, tag="head")]
    tiles = [(128, 256, 64, 8, 3), (128, 256, 32, 8, 4), (128, 256, 32, 8, 5),
             (256, 128, 64, 8, 3), (256, 128, 32, 8, 4), (128, 128, 64, 8, 4),
             (128, 128, 64, 4, 4), (128, 128, 32, 4, 5), (64, 256, 64, 4, 4)]
    for xsplit in (0, 1):
        for bt, bn, bk, warps, stages in tiles:
            for tma in (0, 1):
                c = dict(TC=1, BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk, WARPS=warps, STAGES=stages,
                         GROUP_T=8, XSPLIT=xsplit, WBF16=1, K16=1, EVEN_K=1)
                if tma:
                    c["TMA"] = 1
                for persist in (0, 1):
                    out.append(dict(c=c, persist=persist, tag="sweep"))
    return out


def _label(c: dict, persist: int) -> str:
    if not c.get("TC"):
        return "head " + ",".join(str(c[k]) for k in ("BLOCK_T", "BLOCK_N", "BLOCK_K", "WARPS",
                                                        "STAGES"))
    return (f"{c['BLOCK_T']}x{c['BLOCK_N']}x{c['BLOCK_K']} w{c['WARPS']} s{c['STAGES']}"
            f"{' tma' if c.get('TMA') else ''}{' pers' if persist else ''}"
            f" {'hilo' if c.get('XSPLIT', 1) else 'bf16'}")


def _grid(c: dict, persist: int, T: int, N: int) -> tuple[int, int, int]:
    if not c.get("TC"):
        return (-(-N // c["BLOCK_N"]), -(-T // c["BLOCK_T"]), 1)
    tiles = -(-N // c["BLOCK_N"]) * -(-T // c["BLOCK_T"])
    return (min(tiles, SMS * persist) if persist else tiles, 1, 1)


class Launcher:
    """Loads compiled variants into torch's context and launches them on its stream."""

    def __init__(self):
        from cuda.bindings import driver as cu
        from helios_serve.runtime.cuda import driver as drv

        self.cu, self.drv = cu, drv
        torch.cuda.init()
        torch.empty(1, device="cuda")  # torch makes the primary context current
        self.fns: dict[tuple, tuple] = {}
        self.failed: dict[tuple, str] = {}
        self.scratch: dict[int, torch.Tensor] = {}

    def compile(self, items: list[tuple[str, dict]], workers: int) -> None:
        from helios_ignition.kernels_aot import compile_each, variant_kernel

        keys = [(op, tuple(sorted(c.items()))) for op, c in items]
        keys = list(dict.fromkeys(keys))
        kernels = [variant_kernel(f"v{i}", op, dict(c)) for i, (op, c) in enumerate(keys)]
        major, minor = torch.cuda.get_device_capability()
        target = f"sm_{major}{minor}"
        compiled, failed = compile_each(kernels, target, workers)
        byid = {k.id: key for k, key in zip(kernels, keys, strict=True)}
        for kid, err in failed.items():
            self.failed[byid[kid]] = err
        cu, drv = self.cu, self.drv
        attr = cu.CUfunction_attribute
        for ck in compiled:
            key = byid[ck.kernel_id]
            if ck.shared_bytes > 227 * 1024:
                self.failed[key] = f"shared {ck.shared_bytes} bytes"
                continue
            mod = drv.call("load", cu.cuModuleLoadData(ck.binary))
            fn = drv.call("fn", cu.cuModuleGetFunction(mod, ck.entry_name.encode()))
            if ck.shared_bytes > 48 * 1024:
                drv.call("attr", cu.cuFuncSetAttribute(
                    fn, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, ck.shared_bytes))
            regs = drv.call("r", cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, fn))
            local = drv.call("r", cu.cuFuncGetAttribute(
                attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn))
            self.fns[key] = (fn, ck, drv.param_count(fn), int(regs), int(local))

    def launch(self, op: str, c: dict, grid, args: list) -> list:
        """Enqueue variant (op, c) on torch's current stream; returns what must outlive
        the launch (argument block)."""
        cu, drv = self.cu, self.drv
        fn, ck, count, _, _ = self.fns[(op, tuple(sorted(c.items())))]
        values = []
        for a in args:
            if isinstance(a, torch.Tensor):
                values.append(("ptr", a.data_ptr()))
            elif isinstance(a, float):
                values.append(("f32", a))
            else:
                values.append(("i32", int(a)))
        programs = grid[0] * grid[1] * grid[2]
        for per in (ck.global_scratch_bytes, ck.profile_scratch_bytes)[:count - len(args)]:
            if per:
                need = per * programs
                buf = self.scratch.get(id(ck))
                if buf is None or buf.numel() < need:
                    buf = self.scratch[id(ck)] = torch.empty(need, dtype=torch.uint8,
                                                             device="cuda")
                values.append(("ptr", buf.data_ptr()))
            else:
                values.append(("ptr", 0))
        values += [("ptr", 0)] * (count - len(values))
        ka = drv.KernelArgs(values)
        stream = torch.cuda.current_stream().cuda_stream
        drv.call("launch", cu.cuLaunchKernel(fn, *grid, 32 * ck.num_warps, 1, 1,
                                             ck.shared_bytes, stream, ka.address, 0))
        return [ka]


def _folded_config(rule, op: str, T: int, N: int, K: int):
    """launch_config of `op` (rmsnorm_linear or linear_add) over a bf16 weight."""
    w = _View((N, K), "bf16")
    if op == "rmsnorm_linear":
        return rule.launch_config(op, [T, N, K, 1e-5], [None, None, w, None])
    return rule.launch_config(op, [T, N, K], [None, w, None])


def timed(enqueue, reps: int) -> float:
    """Median microseconds per call of `enqueue` over 5 replays of a graph of `reps`."""
    keep = []
    enqueue(keep)  # warm (module load, first-touch)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            enqueue(keep)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000 / reps)
    del g, keep
    return float(np.median(times))


def bf16_bits(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("sweep", "rule"), default="sweep")
    ap.add_argument("--json")
    ap.add_argument("--rows", default="256,512,1024,4096")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--budget-s", type=float, default=240)
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows_list = [int(r) for r in args.rows.split(",")]
    tmax = max(rows_list)
    card = torch.cuda.get_device_name()
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True).stdout
    except OSError:
        smi = ""
    commit = os.environ.get("HELIOS_COMMIT", "")
    print(f"card {card} ({smi.strip()}), commit {commit}", flush=True)
    L = Launcher()

    from helios_ignition.capture import launch as rule
    from helios_tools import kernels as K

    # Every variant to time, per (shape, T): (label, op constants, persist)
    plan: dict[tuple[str, int], list[tuple[str, dict, int]]] = {}
    items = []
    for name, (N, Kd) in SHAPES.items():
        for T in rows_list:
            cell = []
            if args.mode == "sweep":
                for v in sweep_variants():
                    cell.append((_label(v["c"], v["persist"]), v["c"], v["persist"]))
            else:
                cell.append((_label(HEAD, 0), HEAD, 0))
                cfg = rule.launch_config("linear", [T, N, Kd], [None, _View((N, Kd), "bf16")])
                c = dict(cfg.constants)
                cell.append(("linear-rule " + _label(c, 0), c, 0))
                if c.get("TC"):  # the other activation form of the same tile
                    other = dict(c, XSPLIT=1 - c.get("XSPLIT", 1))
                    cell.append(("linear-other " + _label(other, 0), other, 0))
                picks = {rounded: rule.launch_config(
                    "linear_packed", [T, N, Kd, 1], [None, _View((N, Kd), "bf16")],
                    rounded=rounded).constants for rounded in (False, True)}
                for tile in PACKED_TILES:
                    for xsplit in (1, 0):
                        pc = dict(TC=1, BLOCK_T=tile[0], BLOCK_N=tile[1], BLOCK_K=tile[2],
                                  WARPS=tile[3], STAGES=tile[4], GROUP_T=8, XSPLIT=xsplit,
                                  EVEN_K=1, WBF16=1, K16=1, PACKED=1)
                        tag = ("packed " if pc != picks[not xsplit] else
                               "packed-rule " if xsplit else "packed-rule-bf16 ")
                        cell.append((tag + _label(pc, 0), pc, 0))
                for op in ("split_bf16", "round_bf16"):
                    items.append((op, dict(rule.launch_config(op, [T, Kd], []).constants)))
            plan[(name, T)] = cell
            items += [("linear_packed" if c.get("PACKED") else "linear", c) for _, c, _ in cell]
    if args.mode == "rule":  # the folded forms of the rule's choices
        for N, Kd in SHAPES.values():
            for op in ("rmsnorm_linear", "linear_add"):
                for T in (300, 1024):
                    items.append((op, dict(_folded_config(rule, op, T, N, Kd).constants)))
    L.compile(items, args.workers)
    print(f"compiled {len(L.fns)} variants ({len(L.failed)} failed) in "
          f"{time.perf_counter() - t0:.0f}s", flush=True)
    for key, err in L.failed.items():
        print("  compile failed:", key[0], dict(key[1]), err[:300])

    gen = torch.Generator(device="cuda").manual_seed(int(time.time()))
    results, checks = [], []
    for name, (N, Kd) in SHAPES.items():
        w = (torch.randn(N, Kd, device="cuda", generator=gen) / Kd ** 0.5).to(torch.bfloat16)
        x = torch.randn(tmax, Kd, device="cuda", generator=gen)
        xb = x.to(torch.bfloat16)
        out = torch.empty(tmax, N, device="cuda")
        cols = torch.randperm(N, device="cuda", generator=gen)[:CHECK_COLS]
        wc64 = w[cols].double()
        # NumPy check of the float64 reference on 64 rows
        xs = x[:64].cpu().numpy()
        wn = w[cols].float().cpu().numpy()
        ref_np = np.zeros((64, CHECK_COLS), np.float32)
        K.linear(xs, wn, ref_np, 64, CHECK_COLS, Kd)
        xs = torch.empty(tmax, Kd, device="cuda")  # packed hi|lo terms (split_bf16)
        xr = torch.empty(tmax, Kd, device="cuda")  # rounded hi|0 (round_bf16)
        for T in rows_list:
            ref = x[:T].double() @ wc64.T
            ref_b = xb[:T].double() @ wc64.T
            np_rel = float(np.linalg.norm(ref[:64].cpu().numpy() - ref_np)
                           / np.linalg.norm(ref_np))
            flop = 2.0 * T * N * Kd
            tm = timed(lambda keep, T=T, xb=xb, w=w: keep.append(torch.matmul(xb[:T], w.t())),
                       reps=10 if T < 1024 else 5)
            row = dict(shape=name, N=N, K=Kd, T=T, torch_us=tm, torch_tflops=flop / tm / 1e6,
                       ref_vs_numpy_rel=np_rel, variants=[])
            if args.mode == "rule":  # the producer pass the packed path adds (one launch)
                for op, dst, key in (("split_bf16", xs, "split_us"),
                                     ("round_bf16", xr, "round_us")):
                    sc = rule.launch_config(op, [T, Kd], [])
                    sa = [x, dst, T, Kd]
                    L.launch(op, dict(sc.constants), sc.grid, sa)
                    row[key] = timed(lambda keep, op=op, sc=sc, sa=sa: keep.extend(L.launch(
                        op, dict(sc.constants), sc.grid, sa)), reps=10)
            for label, c, persist in plan[(name, T)]:
                op = "linear_packed" if c.get("PACKED") else "linear"
                key = (op, tuple(sorted(c.items())))
                if key not in L.fns:
                    continue
                if time.perf_counter() - t0 > args.budget_s:
                    row["variants"].append(dict(label=label, skipped="budget"))
                    continue
                grid = _grid(c, persist, T, N)
                one_term = not c.get("XSPLIT", 1) and "round_us" in row
                fa = ([xr if one_term else xs, w, out, T, N, Kd, 1] if op == "linear_packed"
                      else [x, w, out, T, N, Kd])
                out.view(-1)[: T * N].fill_(float("nan"))
                L.launch(op, c, grid, fa)
                got = out[:T].clone()
                L.launch(op, c, grid, fa)
                same = bool(torch.equal(got.view(torch.int32), out[:T].view(torch.int32)))
                finite = bool(torch.isfinite(got).all())
                g64 = got[:, cols].double()
                rel = float((g64 - ref).norm() / ref.norm())
                rel_b = float((g64 - ref_b).norm() / ref_b.norm())
                us = timed(lambda keep, op=op, c=c, grid=grid, fa=fa: keep.extend(
                    L.launch(op, c, grid, fa)), reps=10 if T < 1024 else 5)
                if op == "linear_packed":  # with the producer pass it needs
                    us_split = us + row["round_us" if one_term else "split_us"]
                _, ck, _, regs, local = L.fns[key]
                row["variants"].append(dict(
                    label=label, op=op, constants=c, persist=persist, grid=grid, us=us,
                    us_with_split=us_split if op == "linear_packed" else us,
                    vs_torch_with_split=tm / (us_split if op == "linear_packed" else us),
                    tflops=flop / us / 1e6, vs_torch=tm / us, rel=rel, rel_bf16x=rel_b,
                    finite=finite, deterministic=same, regs=regs, local_bytes=local,
                    shared_bytes=ck.shared_bytes))
            results.append(row)
            print(f"{name} T={T} torch {tm:.1f} us; {len(row['variants'])} variants; "
                  f"t={time.perf_counter() - t0:.0f}s", flush=True)
        del w, x, xb, out
        torch.cuda.empty_cache()

    if args.mode == "rule":  # folded forms: rmsnorm_linear and linear_add vs NumPy
        for name, (N, Kd) in SHAPES.items():
            for T in (300, 1024):
                rng = np.random.default_rng(int(time.time()) + T)
                xn = (rng.standard_normal((T, Kd)) * 3).astype(np.float32)
                wn = (rng.standard_normal((N, Kd)) / np.sqrt(Kd)).astype(np.float32)
                wbt = torch.from_numpy(wn).cuda().to(torch.bfloat16)
                wn = wbt.float().cpu().numpy()
                gn = (1 + 0.1 * rng.standard_normal(Kd)).astype(np.float32)
                res = (rng.standard_normal((T, N)) * 3).astype(np.float32)
                for op in ("rmsnorm_linear", "linear_add"):
                    cfg = _folded_config(rule, op, T, N, Kd)
                    c = dict(cfg.constants)
                    if (op, tuple(sorted(c.items()))) not in L.fns:
                        checks.append(dict(op=op, shape=name, T=T, error="not compiled"))
                        continue
                    ref = res.copy() if op == "linear_add" else np.zeros((T, N), np.float32)
                    if op == "rmsnorm_linear":
                        K.rmsnorm_linear(xn, gn, wn, ref, T, N, Kd, 1e-5)
                        o = torch.full((T, N), float("nan"), device="cuda")
                        fa = [torch.from_numpy(xn).cuda(), torch.from_numpy(gn).cuda(), wbt, o,
                              T, N, Kd, 1e-5]
                    else:
                        K.linear_add(xn, wn, ref, T, N, Kd)
                        o = torch.from_numpy(res).cuda()
                        fa = [torch.from_numpy(xn).cuda(), wbt, o, T, N, Kd]
                    L.launch(op, c, cfg.grid, fa)
                    got = o.cpu().numpy().astype(np.float64)
                    base = res if op == "linear_add" else 0.0
                    r = float(np.linalg.norm(got - ref) / np.linalg.norm(ref - base)) \
                        if np.isfinite(got).all() else float("inf")
                    checks.append(dict(op=op, shape=name, T=T, rel=r, constants=c))
                    print(f"check {op} {name} T={T}: rel {r:.2e} ({_label(c, 0)})", flush=True)

    # Summary table: per cell, torch and the best verified variant of each kind
    print(f"\n{card}  commit {commit}  (us per product; xT = torch.matmul time / this; "
          f"packed rows add their producer pass, split_bf16 or round_bf16, in '+split')")
    summary = []
    for row in results:
        ok = [v for v in row["variants"] if "us" in v and v["finite"] and v["deterministic"]
              and (v["rel"] < 5e-5 if v["constants"].get("XSPLIT", 1)
                   else v["rel_bf16x"] < 5e-5)]
        kinds = {
            "head": [v for v in ok if v["label"].startswith("head")],
            "linear tc hilo": [v for v in ok if v["constants"].get("TC") and v["op"] == "linear"
                               and v["constants"].get("XSPLIT", 1)],
            "linear tc bf16": [v for v in ok if v["constants"].get("TC") and v["op"] == "linear"
                               and not v["constants"].get("XSPLIT", 1)],
            "packed hilo": [v for v in ok if v["op"] == "linear_packed"
                            and v["constants"]["XSPLIT"]],
            "packed bf16": [v for v in ok if v["op"] == "linear_packed"
                            and not v["constants"]["XSPLIT"]],
            "rule": [v for v in ok if "rule " in v["label"]],
            "rule bf16 act": [v for v in ok if "rule-bf16 " in v["label"]],
        }
        s_row = dict(shape=row["shape"], T=row["T"], torch_us=row["torch_us"],
                     torch_tflops=row["torch_tflops"], split_us=row.get("split_us"),
                     round_us=row.get("round_us"))
        print(f"{row['shape']:8} T={row['T']:5} torch {row['torch_us']:8.1f} us "
              f"({row['torch_tflops']:.0f} TFLOP/s)"
              + (f"  split_bf16 {row['split_us']:.1f} us" if row.get("split_us") else "")
              + (f"  round_bf16 {row['round_us']:.1f} us" if row.get("round_us") else ""))
        for kind, vs in kinds.items():
            for v in sorted(vs, key=lambda v: v["us"])[: (2 if kind == "rule" else 1)]:
                s_row.setdefault(kind, []).append(v)
                print(f"    {kind:15} {v['label'][:44]:44} {v['us']:8.1f} us x{v['vs_torch']:.2f}"
                      f"  +split x{v['vs_torch_with_split']:.2f}  rel {v['rel']:.1e}")
        summary.append(s_row)
    bad = [(r["shape"], r["T"], v["label"]) for r in results for v in r["variants"]
           if "us" in v and not (v["finite"] and v["deterministic"])]
    print(f"{len(bad)} variant runs not finite or not deterministic: {bad[:10]}")
    print(f"done in {time.perf_counter() - t0:.0f}s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(card=card, nvidia_smi=smi.strip(), commit=commit, mode=args.mode,
                           torch=torch.__version__, triton=__import__("triton").__version__,
                           summary=summary, rows=results, folded_checks=checks,
                           compile_failed={f"{k[0]} {dict(k[1])}": v
                                           for k, v in L.failed.items()}),
                      fh, indent=1, default=str)


if __name__ == "__main__":
    main()
