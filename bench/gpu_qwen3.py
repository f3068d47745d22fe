"""GPU benchmark of Qwen3 on Helios' cuda backend: the Qwen3-8B (dense) and Qwen3-30B-A3B
(mixture of experts) geometries with seeded random bf16 weights, in-memory cores (as
bench/gpu_models.py's 8B benchmark), and the compiled torch peer (bench/peer_qwen3.py)
on the same card in the same run.

    python bench/gpu_qwen3.py --json bench/results/gpu_qwen3.json
    python bench/gpu_qwen3.py --model qwen3-30b-a3b --batches 1 8 --json OUT.json

Per model: device-to-device copy bandwidth (the roofline), decode tokens/s at each batch
(median step through NativeModel, two frames), device time per step (back-to-back
replays), the per-op device breakdown at the smallest and largest batch. For Qwen3-8B the
peer's decode tokens/s at the same batches. For Qwen3-30B-A3B the expert kernels' share
of the step (moe_route, moe_align, moe_gate_up, moe_down, moe_sum, the router product is
a linear) and, at batch 1, the achieved bandwidth against the active-parameter roofline:
bytes a batch-1 step must read (attention, norms, routers, the K routed experts of every
layer, the LM head; one embedding row) over the copy bandwidth. The expert kernels' tiles
(capture.launch.moe_constants) have not been swept yet: this run is their first
measurement; a sweep reruns the MoE model with other tiles at capture:

    HELIOS_MOE_TILES=32,128,4 python bench/gpu_qwen3.py --model qwen3-30b-a3b \
        --batches 1 8 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_commit, write_json  # bench/ is this script's folder
from gpu_common import (  # noqa: E402
    MemoryCore,
    copy_bandwidth,
    decode_bench,
    profile_ops,
    random_bf16_weights,
)
from helios_ignition.capture.programs import capture  # noqa: E402
from helios_ignition.checkpoint.qwen3 import QWEN3_GEOMETRIES  # noqa: E402
from helios_ignition.export import build_contract, resolve_recipe  # noqa: E402
from helios_ignition.families.registry import family_shapes  # noqa: E402
from helios_ignition.kernels_aot import compile_targets  # noqa: E402
from helios_ignition.recipe import Capacities  # noqa: E402
from helios_serve.engine.plan import SamplingParams  # noqa: E402
from helios_serve.runtime.cache_sizing import CacheSizing  # noqa: E402
from helios_serve.testing.native import load_native  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BATCHES = {"qwen3-8b": (1, 8, 64), "qwen3-30b-a3b": (1, 8, 64, 256)}
EXPERT_OPS = ("moe_route", "moe_align", "moe_gate_up", "moe_down", "moe_sum")
PROMPT, STEPS = 128, 40


def step_bytes(shapes) -> int:
    """Bytes a batch-1 decode step reads: every bf16 matrix (one embedding row; of an
    expert stack only the K routed experts) and every f32 vector."""
    total = 0
    for name, shape in shapes.weight_layout().items():
        n = 1
        for s in shape:
            n *= s
        if name == "embed":
            n = shape[1] if not shapes.tied else n  # a tied embedding is the LM head
        elif name.endswith(("experts_gate_up", "experts_down")):
            n = n // shape[0] * shapes.experts_per_token
        total += n * (2 if len(shape) > 1 else 4)
    return total


def build(model: str, target: str, batches: tuple[int, ...]):
    geometry = QWEN3_GEOMETRIES[model]
    ckpt = SimpleNamespace(geometry=geometry, tokenizer_json="{}", chat_template="",
                           eos_token_ids=(151645,), special_tokens={},
                           source=f"synthetic:{model}:seed=0")
    recipe = resolve_recipe(ROOT / "recipes" / "qwen3.py", ckpt)
    # Pages for the decode runs (prompt + warmup + steps of two frames per row), not for
    # the recipe's whole context: the 30B-A3B weights (61 GB bf16) leave ~15 GB on an H100.
    per_row = -(-(PROMPT + 3 * (STEPS + 5) + 16) // 16)
    caps = Capacities(decode_batch=batches, prefill_tokens=(128,), prefill_rows=8,
                      context_tokens=per_row * 16, page_tokens=16,
                      prepared_pages=max(batches) * per_row)
    # the recipe's output default (1,024) must fit the short benchmark context
    recipe = replace(recipe, capacities=caps, sampling=replace(
        recipe.sampling, max_output_tokens=min(recipe.sampling.max_output_tokens,
                                               caps.context_tokens)))
    shapes = family_shapes(geometry.family, geometry)
    t0 = time.perf_counter()
    manifest, graphs = capture(shapes, caps, "bf16")
    t1 = time.perf_counter()
    blobs = compile_targets(manifest, (target,))
    t2 = time.perf_counter()
    contract = build_contract(recipe, ckpt, shapes, graphs, manifest)
    resources = dict(random_bf16_weights(shapes, 0))
    resources.update(blobs)
    info = {"capture_s": t1 - t0, "compile_s": t2 - t1, "kernels": len(manifest.kernels)}
    return MemoryCore(contract, manifest, resources), shapes, caps, info


def bench_model(model: str, target: str, batches: tuple[int, ...], cu) -> dict:
    core, shapes, caps, info = build(model, target, batches)
    started = time.perf_counter()
    native = load_native(core, "cuda", cache=CacheSizing(num_pages=caps.prepared_pages))
    info["load_s"] = time.perf_counter() - started
    bw = copy_bandwidth(cu)
    need = step_bytes(shapes)
    result = {"model": model, "device": native.backend.device_name, "copy_bw_Bps": bw,
              "b1_bytes_per_step": need, "b1_roofline_tokens_per_s": bw / need,
              "setup": info, "decode": []}
    greedy = SamplingParams()
    for b in batches:
        r = decode_bench(native, b, PROMPT, STEPS, 128, greedy)
        graph = next(g for g in native.prepared.manifest.graphs if g.name == r["graph"])
        r["launches"] = len(graph.launches)
        if b in (min(batches), max(batches)):
            r["breakdown"] = profile_ops(native.backend, r["graph"])
            total = sum(v["ms"] for v in r["breakdown"].values())
            experts = sum(v["ms"] for k, v in r["breakdown"].items() if k in EXPERT_OPS)
            r["expert_share"] = experts / total if total and experts else 0.0
        if b == 1:
            r["achieved_Bps"] = need / (r["device_step_ms"] / 1e3)
            r["b1_roofline_pct"] = 100 * r["achieved_Bps"] / bw
        result["decode"].append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "breakdown"}), flush=True)
    native.close()
    return result


def run_peer(batches: tuple[int, ...]) -> dict:
    """bench/peer_qwen3.py in its own process (it needs torch; its CUDA context apart)."""
    out = Path("/tmp/peer_qwen3_8b.json")
    cmd = [sys.executable, str(ROOT / "bench" / "peer_qwen3.py"), "--geometry", "qwen3-8b",
           "--batch", *map(str, batches), "--new-tokens", "64", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    print(proc.stdout[-3000:], proc.stderr[-2000:], flush=True)
    return json.loads(out.read_text()) if out.exists() else {"error": proc.stderr[-2000:]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["qwen3-8b", "qwen3-30b-a3b", "both"], default="both")
    ap.add_argument("--batches", type=int, nargs="+")
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    from helios_serve.runtime.cuda.driver import call, require_driver

    cu = require_driver()
    dev = call("dev", cu.cuDeviceGet(0))
    major = call("a", cu.cuDeviceGetAttribute(
        cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = call("a", cu.cuDeviceGetAttribute(
        cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    target = f"sm_{major}{minor}"
    models = list(BATCHES) if args.model == "both" else [args.model]
    result = {"commit": git_commit(), "target": target, "models": {},
              "moe_tiles": os.environ.get("HELIOS_MOE_TILES", "")}
    for model in models:
        batches = tuple(args.batches) if args.batches else BATCHES[model]
        result["models"][model] = bench_model(model, target, batches, cu)
    if "qwen3-8b" in models and not args.skip_peer:
        result["peer_qwen3_8b"] = run_peer(tuple(args.batches or BATCHES["qwen3-8b"]))
    if args.json:
        write_json(args.json, result)
    for model, r in result["models"].items():
        print(f"\n{model} on {r['device']}: copy {r['copy_bw_Bps'] / 1e12:.2f} TB/s, "
              f"b1 reads {r['b1_bytes_per_step'] / 1e9:.2f} GB/step -> roofline "
              f"{r['b1_roofline_tokens_per_s']:.0f} tok/s")
        for d in r["decode"]:
            extra = f" experts {100 * d['expert_share']:.0f}%" if "expert_share" in d else ""
            roof = f" roofline {d['b1_roofline_pct']:.0f}%" if "b1_roofline_pct" in d else ""
            print(f"  batch {d['batch']:>3}: {d['tokens_per_s']:>9.1f} tok/s, device step "
                  f"{d['device_step_ms']:.3f} ms{roof}{extra}")
    for row in result.get("peer_qwen3_8b", {}).get("rows", []):
        print(f"  peer qwen3-8b batch {row['batch']:>3}: {row['tok_s']:.1f} tok/s")


if __name__ == "__main__":
    main()
