"""Where a many-row decode step of the Llama-3.1-8B geometry spends its device time
(issue 27, items 3 and 7), and the decode products' launch rule and activation dtype old
against new in one process: for each capture variant (``HELIOS_LINEAR_DECODE_TC``'s value
set on ``capture.launch`` before each capture, and capture's ``activations``: the export
option ``--activation-dtype``), decode tokens/s at each batch, the TTFT of a
``--ttft``-token prompt (one chunk and 256-token chunks), and a per-op breakdown of the
largest batch's graph by op class (products, lm_head, attention, norms, sampling, other)
and by launch group (op and its integer scalars, e.g. linear_packed's T, N, K, S).

    python bench/gpu_decode_breakdown.py --variants table:f32 table:bf16 \\
        --batches 1 8 64 128 256 --json OUT.json

A variant is ``RULE[:ACT]``: RULE is HELIOS_LINEAR_DECODE_TC's value ("table", "off" or a
row threshold), ACT the packed products' activations ("f32", the default: hi | lo terms;
"bf16": rounded by ``round_bf16``, one tensor-core term, executed the same way by the cpu
backend). Seeded random bf16 weights (bench/gpu_common.py), 128-token random prompts,
greedy; every variant's core is captured, compiled for this GPU, loaded, measured and
closed before the next. Needs a GPU (about 18 GB of weights and 32 GiB of KV cache at
256 rows).

Breakdown: for each launch group a throwaway CUDA graph of just its launches (the same
arguments) is captured and replayed (``gpu_common.profile_ops``' method at a finer key);
``sum_ms`` against ``device_step_ms`` (back-to-back replays of the whole step) says how
much the split into groups adds. Prints a table per variant and writes JSON.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_commit, write_json  # bench/ is this script's folder
from gpu_common import (  # noqa: E402
    build_core,
    decode_bench,
    device_target,
    geometry_checkpoint,
    random_bf16_weights,
)
from helios_ignition.capture import launch as rule  # noqa: E402
from helios_ignition.checkpoint.synthetic import NAMED_GEOMETRIES  # noqa: E402
from helios_ignition.export import resolve_recipe  # noqa: E402
from helios_ignition.families.llama import LlamaShapes  # noqa: E402
from helios_ignition.recipe import Capacities  # noqa: E402
from helios_serve.engine.plan import SamplingParams  # noqa: E402
from helios_serve.testing.native import load_native  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PRODUCTS = {"split_bf16", "swiglu_split_bf16", "linear_packed", "linear_packed_rows",
            "splitk_reduce", "splitk_reduce_add", "linear", "linear_add", "rmsnorm_linear",
            "swiglu_linear", "swiglu_linear_add", "linear_invariant", "silu_mul"}
ATTENTION = ("attention", "rope", "kv_write")
NORMS = {"rmsnorm", "add_rmsnorm", "add", "qk_rmsnorm", "head_rmsnorm"}
SAMPLING = ("sample", "token_logprobs", "gather_last", "split_tuning")


def op_class(op: str, scalars: tuple[int, ...], vocab: int) -> str:
    """The op class of a launch: the LM head is the product whose N is the vocabulary."""
    if op in PRODUCTS:
        return "lm_head" if len(scalars) > 1 and scalars[1] == vocab else "products"
    if op.startswith(ATTENTION):
        return "attention"
    if op in NORMS:
        return "norms"
    if op.startswith(SAMPLING):
        return "sampling"
    return "other"


def profile_groups(backend, graph: str, vocab: int, reps: int = 20) -> list[dict]:
    """Device ms per step of each launch group of `graph` (op + integer scalars), each
    timed as a throwaway CUDA graph of its launches (profiling only: it captures graphs
    after the serving measurements)."""
    from helios_serve.runtime.cuda import driver as drv

    cu = backend._cu
    g = next(p for p in backend._manifest_graphs if p.name == graph)
    _, _, args = backend._graphs[graph]  # (graphs per frame, execs per frame, args)
    groups: dict[tuple, list] = {}
    for launch, a in zip(g.launches, args, strict=True):
        op = backend._kernels[launch.kernel].reference_op
        scalars = tuple(int(x.int_value) for x in launch.args if x.WhichOneof("value")
                        == "int_value")
        groups.setdefault((op, scalars), []).append((launch, a))
    s = backend._stream
    out = []
    for (op, scalars), items in groups.items():
        drv.call("begin", cu.cuStreamBeginCapture(
            s, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        for launch, a in items:
            fn, binary, _ = backend._functions[launch.kernel]
            grid = list(launch.grid) + [1] * (3 - len(launch.grid))
            drv.call("launch", cu.cuLaunchKernel(fn, grid[0], grid[1], grid[2],
                                                 32 * binary.num_warps, 1, 1,
                                                 binary.shared_bytes, s, a.address, 0))
        graph_ = drv.call("end", cu.cuStreamEndCapture(s))
        exe = drv.call("inst", cu.cuGraphInstantiate(graph_, 0))
        for _ in range(3):
            drv.call("launch", cu.cuGraphLaunch(exe, s))
        drv.call("sync", cu.cuStreamSynchronize(s))
        t0 = time.perf_counter()
        for _ in range(reps):
            drv.call("launch", cu.cuGraphLaunch(exe, s))
        drv.call("sync", cu.cuStreamSynchronize(s))
        ms = (time.perf_counter() - t0) / reps * 1e3
        cu.cuGraphExecDestroy(exe)
        cu.cuGraphDestroy(graph_)
        kernel = backend._kernels[items[0][0].kernel]
        out.append(dict(op=op, scalars=list(scalars), cls=op_class(op, scalars, vocab),
                        launches=len(items), ms=ms,
                        constants={k: int(v) for k, v in kernel.constants.items()}))
    return out


def parse_variant(v: str) -> tuple[str, str]:
    rule_, _, act = v.partition(":")
    rule.decode_tc(128, 4096, 4096, rule_)  # ValueError on a bad rule
    if act not in ("", "f32", "bf16"):
        raise ValueError(f"variant {v!r}: the activations are f32 or bf16")
    return rule_, act or "f32"


def ttft(model, tokens: int, chunk: int, reps: int = 3) -> float:
    """Median seconds to the first token of a `tokens`-token prompt prefilled in `chunk`
    token chunks into row 0, on pages 0.. (the decode rows' page split aside: the prompt
    needs more pages than one of them holds; the decode runs are over by then)."""
    import numpy as np
    from helios_serve.engine.plan import RowPlan, StepKind, StepPlan

    prompt = np.random.default_rng(7).integers(3, 40000, tokens).tolist()
    page = model.manifests.page_tokens

    def once(generation: int) -> float:
        t0 = time.perf_counter()
        for start in range(0, tokens, chunk):
            piece = tuple(prompt[start:start + chunk])
            end = start + len(piece)
            row = RowPlan(request_id=0, slot=0, generation=generation, tokens=piece,
                          start_position=start, page_ids=tuple(range(-(-end // page))),
                          sample=end == tokens, sampling=SamplingParams(),
                          histogram_tokens=tuple(prompt) if start == 0 else None)
            model.execute(StepPlan(StepKind.PREFILL, (row,)))
        return time.perf_counter() - t0

    once(100)  # warm
    return sorted(once(101 + i) for i in range(reps))[reps // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=["table:f32", "table:bf16"],
                    help="RULE[:ACT] per capture (module docstring)")
    ap.add_argument("--ttft", type=int, default=1024,
                    help="prompt tokens of the TTFT measurement (0: none)")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--json")
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variants]
    t_start = time.perf_counter()
    target = device_target()
    geometry = NAMED_GEOMETRIES["llama-3.1-8b"]
    ckpt = geometry_checkpoint(geometry, "llama-3.1-8b")
    recipe = resolve_recipe(ROOT / "recipes/llama.py", ckpt)
    shapes = LlamaShapes.from_geometry(geometry)
    weights = random_bf16_weights(shapes, 0, geometry.rope_scaling)
    caps = Capacities(decode_batch=tuple(args.batches),
                      prefill_tokens=(256, args.ttft) if args.ttft > 256 else (256,),
                      prefill_rows=8, context_tokens=2048, page_tokens=16,
                      prepared_pages=max(args.batches) * 32)
    greedy = SamplingParams()
    result = dict(commit=git_commit(), batches=args.batches, steps=args.steps,
                  prompt_tokens=args.prompt, target=target, ttft_tokens=args.ttft,
                  variants=[])
    for dtc, act in variants:
        rule.DECODE_TC = dtc
        t0 = time.perf_counter()
        core, info = build_core(recipe, ckpt, caps, target, weights, activations=act)
        model = load_native(core, "cuda")
        backend = model.backend
        result["device"] = backend.device_name
        entry = dict(decode_tc=dtc, activations=act, setup_s=time.perf_counter() - t0,
                     kernels=info["kernels"], decode=[], ttft_ms={})
        for b in args.batches:
            r = decode_bench(model, b, args.prompt, args.steps, 256, greedy)
            entry["decode"].append({k: r[k] for k in ("batch", "graph", "tokens_per_s",
                                                      "step_ms", "device_step_ms", "host_us")})
            print(f"{dtc}:{act} b{b}: {r['tokens_per_s']:.1f} tok/s, step {r['step_ms']:.2f} "
                  f"ms, device {r['device_step_ms']:.2f} ms", flush=True)
        for chunk in sorted({args.ttft, 256}, reverse=True) if args.ttft else ():
            entry["ttft_ms"][f"chunk{chunk}"] = ttft(model, args.ttft, chunk) * 1e3
            print(f"{dtc}:{act} TTFT {args.ttft} tokens in {chunk}-token chunks: "
                  f"{entry['ttft_ms'][f'chunk{chunk}']:.1f} ms", flush=True)
        last = entry["decode"][-1]
        groups = profile_groups(backend, last["graph"], shapes.vocab)
        classes: dict[str, float] = {}
        for grp in groups:
            classes[grp["cls"]] = classes.get(grp["cls"], 0.0) + grp["ms"]
        entry["breakdown"] = dict(batch=last["batch"], device_step_ms=last["device_step_ms"],
                                  sum_ms=sum(classes.values()), classes=classes,
                                  groups=sorted(groups, key=lambda g: -g["ms"]))
        model.close()
        del model, backend, core
        result["variants"].append(entry)
    result["total_s"] = time.perf_counter() - t_start

    print(f"\nLlama-3.1-8B geometry on {result.get('device')}, commit {result['commit']}")
    base = result["variants"][0]
    print(f"{'variant':>10} " + " ".join(f"{'b' + str(b) + ' tok/s':>12} {'dev ms':>7}"
                                         for b in args.batches))
    for e in result["variants"]:
        print(f"{e['decode_tc'] + ':' + e['activations']:>10} " + " ".join(
            f"{d['tokens_per_s']:>12.1f} {d['device_step_ms']:>7.2f}" for d in e["decode"]))
    for e in result["variants"][1:]:
        print(f"{e['decode_tc']}:{e['activations']} over {base['decode_tc']}:"
              f"{base['activations']}: " + ", ".join(
            f"b{d['batch']} x{d['tokens_per_s'] / o['tokens_per_s']:.3f}"
            for d, o in zip(e["decode"], base["decode"], strict=True)))
    for e in result["variants"]:
        bd = e["breakdown"]
        print(f"\n{e['decode_tc']}:{e['activations']} decode_b{bd['batch']} device step "
              f"{bd['device_step_ms']:.2f} ms (groups timed apart: {bd['sum_ms']:.2f} ms)")
        for cls, ms in sorted(bd["classes"].items(), key=lambda kv: -kv[1]):
            print(f"  {cls:10} {ms:8.3f} ms  {100 * ms / bd['sum_ms']:5.1f} %")
        print("  top launch groups:")
        for grp in bd["groups"][:14]:
            print(f"    {grp['op']:22} {str(grp['scalars'])[:40]:40} x{grp['launches']:<3} "
                  f"{grp['ms']:8.3f} ms")
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
