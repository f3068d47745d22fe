"""GPU benchmark: Llama-3.1-8B geometry decode, bf16 weights against FP8 W8A8 weights
(``ignition export --quantize fp8``: e4m3 codes with per-channel scales, activations
quantized per token inside the products), seeded random weights, one process, one card.

    python bench/gpu_fp8.py --json OUT.json                 # batches 1 8 64 256
    python bench/gpu_fp8.py --batches 1 8 --steps 20 --json OUT.json
    python bench/gpu_fp8.py --variant table FP8_FEW=table --json OUT.json  # + the old rule

Each format's core is built in memory (capture, AOT compile for the device's target,
weights), loaded on the cuda backend, timed with gpu_common.decode_bench (greedy, median
step through NativeModel, and the device time of back-to-back graph replays) at each
batch, then released before the next format loads. The FP8 core's embedding and LM head
stay bf16 (as the export keeps them), and its capture has the packed bf16 path off (as
the export does), so the bf16 core here is captured the default way (packed path on) —
the baseline a bf16 export serves with. Roofline: the weight bytes one decode step reads
over the measured device copy bandwidth. Writes JSON with the commit and the card, and
which FP8 tiles the capture used: ``HELIOS_FP8_TILES`` (a bench/gpu_fp8_sweep.py JSON:
its picks) or the committed ``launch._FP8_TILES`` table with ``fp8_default`` elsewhere.
``--variant NAME ATTR=VALUE ...`` (repeatable) adds the quantized core captured with
those ``capture.launch`` knobs set (an A/B of launch rules in the same process and lease).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_commit, write_json  # bench/ is this script's folder
from gpu_common import MemoryCore, build_core, copy_bandwidth, decode_bench, random_bf16_weights
from helios_contract import stored_nbytes
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.capture import launch
from helios_ignition.capture.buffers import weight_resource_id
from helios_ignition.capture.programs import capture
from helios_ignition.export import build_contract, resolve_recipe
from helios_ignition.families.llama import LlamaShapes
from helios_ignition.kernels_aot import compile_targets
from helios_ignition.quantize import apply_fp8, fp8_weights, packed_path_off
from helios_ignition.recipe import Capacities
from helios_serve.engine.plan import SamplingParams
from helios_serve.testing.native import load_native

ROOT = Path(__file__).resolve().parents[1]
BATCHES = (1, 8, 64, 256)


def fp8_core(recipe, ckpt, caps: Capacities, target: str, bf16: dict) -> tuple[MemoryCore, dict]:
    """The FP8 core of `recipe` over `bf16`'s plain weights (embedding, LM head, norms)
    and seeded random e4m3 codes (never NaN) with per-row scales for the products."""
    recipe = replace(recipe, capacities=caps)  # as gpu_common.build_core does
    shapes = LlamaShapes.from_geometry(ckpt.geometry)
    t0 = time.perf_counter()
    with packed_path_off():
        manifest, graphs = capture(shapes, caps, recipe.weight_dtype,
                                   chunked_sampling=recipe.chunked_sampling)
    names = fp8_weights(manifest)
    apply_fp8(manifest, names)
    t1 = time.perf_counter()
    blobs = compile_targets(manifest, (target,))
    t2 = time.perf_counter()
    rng = np.random.default_rng(1)
    pool_n = 1 << 26
    pool = (rng.integers(0, 0x7F, pool_n, dtype=np.uint8)
            | (rng.integers(0, 2, pool_n, dtype=np.uint8) << 7))  # finite codes only
    pool = np.concatenate([pool, pool])
    decls = {b.name: b for b in manifest.buffers}
    resources = dict(bf16)
    for name in names:
        rows, k = (int(s) for s in decls[name].shape)
        n = stored_nbytes(decls[name])
        off = int(hashlib.sha256(name.encode()).hexdigest(), 16) % pool_n

        def make(n=n, off=off):
            return pool[off:off + n].tobytes() if n <= pool_n else np.resize(pool, n).tobytes()

        resources[weight_resource_id(name)] = make
        scale = (0.02 / 448 * (1 + 0.1 * rng.random((rows, 1)))).astype(np.float32)
        resources[weight_resource_id(name + ".scale")] = scale.tobytes()
    contract = build_contract(recipe, ckpt, shapes, graphs, manifest)
    resources.update(blobs)
    info = {"capture_s": t1 - t0, "compile_s": t2 - t1, "kernels": len(manifest.kernels),
            "fp8_matrices": len(names)}
    return MemoryCore(contract, manifest, resources), info


def step_bytes(manifest: mpb.ExecutionManifest, tied: bool) -> int:
    """Weight bytes one decode step reads: every weight as stored (FP8 codes, scales, bf16
    or f32), an untied embedding's table excepted (decode reads its fed rows only)."""
    return sum(stored_nbytes(b) for b in manifest.buffers
               if b.role == mpb.BUFFER_ROLE_WEIGHT and (tied or b.name != "embed"))


def compare(quant: str, quant_core, extra: dict | None = None,
            batches: tuple[int, ...] = BATCHES, defaults: tuple[str, ...] | None = None
            ) -> None:
    """bf16 against the ``quant`` format ("fp8" or "int4") on the 8B geometry in one
    process: parse the command line, build each format's core (``quant_core(recipe, ckpt,
    caps, target, bf16) -> (MemoryCore, info)`` for the quantized one), time its decode,
    print the table and write the JSON (``extra``'s keys added to it); ``batches`` is the
    default of ``--batches``. `quant_core` may instead map several format names to their
    builders (bench/gpu_gguf.py); `defaults`: the formats run without ``--formats`` (all)."""
    quants = quant_core if isinstance(quant_core, dict) else {quant: quant_core}
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--batches", type=int, nargs="+", default=list(batches))
    ap.add_argument("--formats", nargs="+", choices=["bf16", *quants],
                    default=list(defaults or ["bf16", *quants]))
    ap.add_argument("--variant", nargs="+", action="append", default=[],
                    metavar=("NAME", "ATTR=VALUE"),
                    help="also time each quantized format's core captured with these "
                         "capture.launch attributes set (the capture knobs, e.g. "
                         "FP8_FEW=table or INT4_ROWS=v1), reported as format '<quant>:<NAME>'")
    ap.add_argument("--json")
    args = ap.parse_args()
    # format name -> (the quantized format whose builder makes it, capture.launch settings)
    variants: dict[str, tuple[str, dict[str, str]]] = {q: (q, {}) for q in quants}
    for name, *sets in args.variant:
        try:
            settings = dict(a.split("=", 1) for a in sets)
        except ValueError:
            ap.error(f"--variant {name}: each setting must be ATTR=VALUE, got {sets}")
        for attr in settings:
            if not hasattr(launch, attr):
                ap.error(f"--variant {name}: capture.launch has no attribute {attr!r}")
        for q in quants:
            variants[f"{q}:{name}"] = (q, settings)
    from types import SimpleNamespace

    from helios_ignition.checkpoint.synthetic import NAMED_GEOMETRIES
    from helios_serve.runtime.cuda.driver import call, require_driver

    cu = require_driver()
    dev = call("dev", cu.cuDeviceGet(0))
    major = call("a", cu.cuDeviceGetAttribute(
        cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = call("a", cu.cuDeviceGetAttribute(
        cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    target = f"sm_{major}{minor}"
    per_row = 128 if max(args.batches) <= 64 else 32
    caps = Capacities(decode_batch=tuple(args.batches), prefill_tokens=(256, 1024),
                      prefill_rows=8, context_tokens=2048, page_tokens=16,
                      prepared_pages=max(args.batches) * per_row)
    ckpt = SimpleNamespace(geometry=NAMED_GEOMETRIES["llama-3.1-8b"], tokenizer_json="{}",
                           chat_template="", eos_token_ids=(2,), special_tokens={},
                           source="synthetic:llama-3.1-8b:seed=0")
    recipe = resolve_recipe(ROOT / "recipes/llama.py", ckpt)
    shapes = LlamaShapes.from_geometry(ckpt.geometry)
    bf16 = random_bf16_weights(shapes, 0, ckpt.geometry.rope_scaling)
    result = {"commit": git_commit(), "geometry": "llama-3.1-8b", "target": target,
              "steps": args.steps, "prompt": args.prompt, "formats": {}, **(extra or {})}
    greedy = SamplingParams()
    formats = [f for fmt in args.formats
               for f in ([fmt] if fmt == "bf16" else [v for v, (q, _) in variants.items()
                                                     if q == fmt])]
    for fmt in formats:
        t0 = time.perf_counter()
        if fmt == "bf16":
            core, info = build_core(recipe, ckpt, caps, target, bf16)
        else:
            q, settings = variants[fmt]
            saved = {attr: getattr(launch, attr) for attr in settings}
            try:  # the knobs are read at capture, inside the builder
                for attr, value in settings.items():
                    setattr(launch, attr, value)
                core, info = quants[q](recipe, ckpt, caps, target, bf16)
            finally:
                for attr, value in saved.items():
                    setattr(launch, attr, value)
            if settings:
                info = {**info, "launch": settings}
        model = load_native(core, "cuda")
        try:
            backend = model.backend
            result["device"] = backend.device_name
            if "copy_bw_Bps" not in result:  # once, with the first model's context current
                result["copy_bw_Bps"] = copy_bandwidth(cu)
            bw = result["copy_bw_Bps"]
            nbytes = step_bytes(core.manifest, shapes.tied)
            entry = {"setup_s": time.perf_counter() - t0, **info,
                     "weight_bytes_per_step": nbytes, "roofline_step_ms": nbytes / bw * 1e3,
                     "decode": []}
            for b in args.batches:
                r = decode_bench(model, b, args.prompt, args.steps, 1024, greedy)
                r["roofline_pct"] = 100 * entry["roofline_step_ms"] / r["device_step_ms"]
                entry["decode"].append(r)
                print(json.dumps({"format": fmt, **r}), flush=True)
            result["formats"][fmt] = entry
        finally:
            model.close()
            del core
    base = result["formats"].get("bf16")
    for fmt in variants:
        if base and fmt in result["formats"]:
            result[f"{fmt}_over_bf16"] = [
                {"batch": a["batch"], "tokens_per_s": f["tokens_per_s"] / a["tokens_per_s"],
                 "device": a["device_step_ms"] / f["device_step_ms"]}
                for a, f in zip(base["decode"], result["formats"][fmt]["decode"], strict=True)]
    print(f"{'format':<12} {'batch':>5} {'tok/s':>10} {'step ms':>8} {'dev ms':>8} "
          f"{'roof %':>7} {'x bf16':>7}")
    for fmt, entry in result["formats"].items():
        for i, r in enumerate(entry["decode"]):
            x = r["tokens_per_s"] / base["decode"][i]["tokens_per_s"] if base else float("nan")
            print(f"{fmt:<12} {r['batch']:>5} {r['tokens_per_s']:>10.1f} {r['step_ms']:>8.3f} "
                  f"{r['device_step_ms']:>8.3f} {r['roofline_pct']:>7.1f} {x:>7.2f}")
    if args.json:
        write_json(args.json, result)


def main() -> None:
    compare("fp8", fp8_core,
            {"fp8_tiles": os.environ.get("HELIOS_FP8_TILES") or "launch._FP8_TILES"})


if __name__ == "__main__":
    main()
