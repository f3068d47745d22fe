"""Speculative generation benchmarks (issue "Speculative generation I").

    # SmolLM2 real weights, chat prompts, greedy and sampled (T 0.8, top_p 0.95):
    python bench/speculative.py --model smollm2 --backend cuda --gguf PATH --json OUT.json
    python bench/speculative.py --model smollm2 --backend cpu --batches 1 --json OUT.json
    # Llama-3.1-8B geometry, random weights: one W = 4 speculative step over one decode step
    python bench/speculative.py --model llama-3.1-8b --backend cuda --json OUT.json

SmolLM2: a speculative core is exported from recipes/smollm2_135m_instruct.py with the
drafter (--drafter: the committed trained head by default) and widths 1..4. For each
batch and sampling setting, --rounds groups of prompts (scripts/drafter_prompts.py,
`eval` split) each generate --tokens tokens, in one process and interleaved per round:
with the default core's decode (--baseline: recipes/smollm2_135m_instruct.py, no
drafter), with the drafter core's decode, and with speculative rounds of lane length
min(--width, tokens left). tokens/s counts generated tokens over the wall time of the
generation steps (prefill excluded); the table gives the median over rounds. The mean
accepted length is the mean tokens a lane emits per round (accepted drafts + 1). Outputs
are compared with the drafter core's decode (greedy: identical by construction).

8B: random weights make acceptance meaningless, so only the cost of one speculative
step of lanes of length 4 (3 drafts + 4 verified positions + commit) over one decode
step is timed, at batch 1 and 8, at a context of --context tokens: through
`NativeModel.execute` (host included: `ratio`), as the graph alone replayed back to back
(`device_ratio`, issue 32's "8B geometry width-4 step <= 1.15x a decode step at batch 1,
<= 1.3x at batch 8"), and per op (`*_ops_ms`, device ms per step). Decode and
verification rows of this drafter core both run the row-invariant linear
(kernels_triton/invariant.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from _report import git_commit, write_json  # bench/ is this script's folder

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "recipes" / "drafters" / "smollm2-135m-instruct-eagle.safetensors"
SAMPLINGS = {"greedy": (0.0, 1.0), "sampled_t0.8_p0.95": (0.8, 0.95)}


def _prompts(count: int, ck) -> list[list[int]]:
    from helios_tools.frontend_assets import load_tokenizer, render_chat

    spec = importlib.util.spec_from_file_location("drafter_prompts",
                                                  ROOT / "scripts" / "drafter_prompts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tok = load_tokenizer(ck.tokenizer_json)
    return [tok.encode(render_chat(ck.chat_template, m, add_generation_prompt=True),
                       add_special_tokens=False).ids
            for m in module.chat_prompts("eval", count, seed=3)]


def _smollm2_core(args, folder: Path):
    from helios_ignition.export import export_core
    from helios_tools.core import generate_key, load_public_key, open_core, write_key_pair

    key = folder / "key.pem"
    write_key_pair(generate_key(), key)
    recipe = folder / "spec_recipe.py"
    recipe.write_text(
        "from dataclasses import replace\nimport importlib.util\n"
        f"s = importlib.util.spec_from_file_location('b', "
        f"{str(ROOT / 'recipes/smollm2_135m_instruct.py')!r})\n"
        "b = importlib.util.module_from_spec(s); s.loader.exec_module(b)\n"
        "from helios_ignition.recipe import DrafterDecl\n"
        f"RECIPE = replace(b.RECIPE, drafter=DrafterDecl({args.drafter!r}, widths=(1, 2, 3, 4)),\n"
        "                 capacities=replace(b.RECIPE.capacities, mixed_tokens=()))\n"
        + (f"RECIPE = replace(RECIPE, capacities=replace(RECIPE.capacities, "
           f"decode_batch={tuple(args.decode_batch)!r}))\n"
           if getattr(args, "decode_batch", None) else ""))
    out = folder / "spec.core"
    targets = (args.target,) if args.backend == "cuda" else ()
    export_core(recipe, checkpoint=args.gguf or "smollm2", key_path=key, namespace="bench.spec",
                out=out, targets=targets, weight_dtype="bf16")
    return open_core(out, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])


def bench_smollm2(args) -> dict:
    """Interleaved rounds in one process: per round the default core's decode, the
    drafter core's decode and speculative rounds on the same prompts; medians over
    rounds of tokens/s (the machine is shared: a median resists other processes'
    bursts better than a total)."""
    from helios_ignition.checkpoint import load_gguf, smollm2_gguf_path
    from helios_serve.engine.plan import SamplingParams

    ck = load_gguf(args.gguf or smollm2_gguf_path())
    prompts = _prompts(max(args.batches) * args.rounds, ck)
    with tempfile.TemporaryDirectory() as d:
        model = _load(args, _smollm2_core(args, Path(d)))
        default = _load(args, _default_core(args, Path(d))) if args.baseline else None
    rows = []
    for batch in args.batches:
        for label, (temperature, top_p) in SAMPLINGS.items():
            rates: dict[str, list[float]] = {"default": [], "decode": [], "speculative": [],
                                             "speculative_suffix": []}
            lanes = emitted = same = same_suffix = 0
            for r in range(args.rounds):
                group = prompts[r * batch:(r + 1) * batch]
                params = [SamplingParams(temperature=temperature, top_p=top_p, seed=7 + i)
                          for i in range(len(group))]
                tokens = len(group) * (args.tokens - 1)  # the first token is prefill's
                if default is not None:
                    seconds, _ = _timed(default, group, params, lambda drv, g, p:
                                        drv.generate(g, args.tokens, p))
                    rates["default"].append(tokens / seconds)
                seconds, want = _timed(model, group, params, lambda drv, g, p:
                                       drv.generate(g, args.tokens, p))
                rates["decode"].append(tokens / seconds)
                seconds, (got, records) = _timed(model, group, params, lambda drv, g, p:
                                                 drv.generate_speculative(g, args.tokens,
                                                                          args.width, p))
                rates["speculative"].append(tokens / seconds)
                if args.history == "suffix":  # learned drafts, copied ones where proposed
                    seconds, (copied, _) = _timed(model, group, params, lambda drv, g, p:
                                                  drv.generate_speculative(
                                                      g, args.tokens, args.width, p,
                                                      propose=_suffix_proposer(args.width)))
                    rates["speculative_suffix"].append(tokens / seconds)
                    same_suffix += sum(a == b for a, b in zip(copied, want, strict=True))
                lanes += sum(len(rec) for rec in records)
                emitted += sum(int(rec[:, 3].sum()) for rec in records)
                same += sum(a == b for a, b in zip(got, want, strict=True))
            med = {k: float(np.median(v)) for k, v in rates.items() if v}
            row = {"batch": batch, "sampling": label, "rounds": args.rounds,
                   "tokens_per_round": batch * (args.tokens - 1),
                   "drafter_core_decode_tok_s": round(med["decode"], 2),
                   "speculative_tok_s": round(med["speculative"], 2),
                   "speedup_over_drafter_core_decode": round(med["speculative"] / med["decode"],
                                                             3),
                   "mean_accepted_length": round(emitted / max(lanes, 1), 3),
                   "identical_outputs": f"{same}/{args.rounds * batch}",
                   "per_round_tok_s": {k: [round(x, 2) for x in v] for k, v in rates.items()}}
            if "default" in med:
                row["default_core"] = args.baseline_dtype
                row["default_core_decode_tok_s"] = round(med["default"], 2)
                row["speedup_over_default_core"] = round(med["speculative"] / med["default"], 3)
            if "speculative_suffix" in med:
                row["speculative_suffix_tok_s"] = round(med["speculative_suffix"], 2)
                row["suffix_identical_outputs"] = f"{same_suffix}/{args.rounds * batch}"
                if "default" in med:
                    row["suffix_speedup_over_default_core"] = round(
                        med["speculative_suffix"] / med["default"], 3)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "per_round_tok_s"}),
                  flush=True)
    model.close()
    if default is not None:
        default.close()
    return {"model": "smollm2-135m-instruct", "drafter": args.drafter, "width": args.width,
            "backend": args.backend, "tokens_per_request": args.tokens, "rows": rows}


def _suffix_proposer(width: int):
    """History drafting with suffix drafting (`--history-proposer suffix`) for one lane:
    up to width - 1 copied candidates from its sequence so far."""
    from helios_serve.speculation.suffix import SuffixIndex

    index = SuffixIndex()

    def propose(tokens: list[int]) -> tuple[int, ...]:
        index.extend(tokens)
        return index.propose(tokens, width - 1)

    return propose


def _load(args, core):
    from helios_serve.testing.native import load_native

    return load_native(core, args.backend)


def _timed(model, group, params, run):
    """Seconds of `run` minus the same prefills timed alone, and its result."""
    from helios_serve.runtime.driver import Driver

    t_prefill = _prefill_time(Driver(model), group, params)
    t0 = time.perf_counter()
    result = run(Driver(model), group, params)
    return time.perf_counter() - t0 - t_prefill, result


def _default_core(args, folder: Path):
    """The core without a drafter (recipes/smollm2_135m_instruct.py: the embedded
    default, plain linears) in --baseline-dtype (gguf: the demo's core, GGUF blocks
    through ggml graphs; a drafter core cannot be gguf, the export refuses it)."""
    from helios_ignition.export import export_core
    from helios_tools.core import generate_key, load_public_key, open_core, write_key_pair

    key = folder / "default-key.pem"
    write_key_pair(generate_key(), key)
    out = folder / "default.core"
    export_core(ROOT / "recipes/smollm2_135m_instruct.py", checkpoint=args.gguf or "smollm2",
                key_path=key, namespace="bench.spec", out=out, weight_dtype=args.baseline_dtype,
                targets=(args.target,) if args.backend == "cuda" else ())
    return open_core(out, [load_public_key(Path(str(key) + ".pub"))])


def _prefill_time(driver, group, params) -> float:
    """Prefill is not part of generation speed: time the same prefills alone once."""
    from helios_serve.runtime.driver import _Lane

    t0 = time.perf_counter()
    for i, prompt in enumerate(group):
        driver.prefill(_Lane(i, list(prompt), params[i]))
    return time.perf_counter() - t0


def bench_8b(args) -> dict:
    from helios_ignition.capture.buffers import Speculation
    from helios_ignition.capture.programs import capture
    from helios_ignition.checkpoint import random_checkpoint
    from helios_ignition.checkpoint.drafter import DrafterGeometry, random_drafter
    from helios_ignition.export import build_contract
    from helios_ignition.families.llama import LlamaShapes
    from helios_ignition.kernels_aot import compile_targets
    from helios_ignition.recipe import Capacities
    from helios_ignition.weights import to_bf16_bits
    from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
    from helios_serve.testing.native import load_native

    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_common import MemoryCore, profile_ops, random_bf16_weights

    recipe_mod = importlib.util.spec_from_file_location("r", ROOT / "recipes" / "llama.py")
    module = importlib.util.module_from_spec(recipe_mod)
    recipe_mod.loader.exec_module(module)
    ck = random_checkpoint("llama-3.1-8b", 1)
    shapes = LlamaShapes.from_geometry(ck.geometry)
    caps = Capacities(decode_batch=(1, 8), prefill_tokens=(16,), prefill_rows=1,
                      context_tokens=4096, page_tokens=16, prepared_pages=2 * 256 + 16)
    draft = DrafterGeometry.for_target(ck.geometry, 32768)
    spec = Speculation(draft, (1, 4))
    manifest, graphs = capture(shapes, caps, "bf16", spec=spec)
    blobs = compile_targets(manifest, (args.target,))
    recipe = replace(module.make_recipe(ck), capacities=caps)
    contract = build_contract(recipe, ck, shapes, graphs, manifest, spec)
    resources = dict(random_bf16_weights(shapes, 1, ck.geometry.rope_scaling))
    head = random_drafter(ck.geometry, draft.draft_vocab, 3)
    for name, array in head.items():
        rid = f"weights/D.{name}"
        if name == "vocab_map":
            resources[rid] = array.astype(np.int32).tobytes()
        elif array.ndim > 1:
            resources[rid] = to_bf16_bits(array).tobytes()
        else:
            resources[rid] = array.astype(np.float32).tobytes()
    lm = (np.random.default_rng(4).standard_normal((draft.draft_vocab, draft.hidden)) * 0.02)
    resources["weights/D.lm_head"] = to_bf16_bits(lm.astype(np.float32)).tobytes()
    resources.update(blobs)
    model = load_native(MemoryCore(contract, manifest, resources), "cuda")
    g = model.manifests
    per = g.num_pages // g.slots
    rows_out = []
    for batch in (1, 8):
        def plan(kind, n, batch=batch):
            rows = tuple(RowPlan(request_id=i, slot=i, generation=1, tokens=(5,),
                                 start_position=args.context, page_ids=tuple(
                                     range(i * per, i * per + -(-(args.context + n) // 16))),
                                 sample=True, sampling=SamplingParams(),
                                 query_length=n if kind is StepKind.SPECULATIVE else 0)
                         for i in range(batch))
            return StepPlan(kind, rows)

        times, device, ops = {}, {}, {}
        for kind, n in ((StepKind.DECODE, 1), (StepKind.SPECULATIVE, 4)):
            p = plan(kind, n)
            for _ in range(5):
                model.execute(p)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                model.execute(p)
            times[kind.value] = (time.perf_counter() - t0) / args.steps
            # the graph alone, replayed back to back (no host work between steps), and
            # its device ms per op (one throwaway graph per op: gpu_common.profile_ops)
            name = model.select_graph(p)
            model.backend.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                model.backend.launch_only(name)
            model.backend.synchronize()
            device[kind.value] = (time.perf_counter() - t0) / args.steps
            ops[kind.value] = {op: round(ms, 4) for op, ms in sorted(
                profile_ops(model.backend, name).items(), key=lambda kv: -kv[1])}
        row = {"batch": batch, "context": args.context,
               "decode_step_ms": round(times["decode"] * 1e3, 3),
               "speculative_w4_step_ms": round(times["speculative"] * 1e3, 3),
               "ratio": round(times["speculative"] / times["decode"], 3),
               "decode_device_ms": round(device["decode"] * 1e3, 3),
               "speculative_w4_device_ms": round(device["speculative"] * 1e3, 3),
               "device_ratio": round(device["speculative"] / device["decode"], 3),
               "decode_ops_ms": ops["decode"], "speculative_w4_ops_ms": ops["speculative"]}
        rows_out.append(row)
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_ops_ms")}),
              flush=True)
    model.close()
    from helios_ignition.capture import launch

    return {"model": "llama-3.1-8b geometry, random bf16 weights", "draft_vocab": 32768,
            "invariant_linear": launch.INVARIANT_LINEAR, "rows": rows_out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("smollm2", "llama-3.1-8b"), default="smollm2")
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--target", default="sm_90")
    ap.add_argument("--gguf", default=os.environ.get("HELIOS_SMOLLM2_GGUF"))
    ap.add_argument("--drafter", default=str(TRAINED) if TRAINED.is_file() else "random:7:8192")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--rounds", type=int, default=2, help="prompt groups per batch size")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--steps", type=int, default=50, help="timed steps (8B)")
    ap.add_argument("--context", type=int, default=1024, help="lane position (8B)")
    ap.add_argument("--baseline", action="store_true",
                    help="also time decode on the core without a drafter, same rounds (smollm2)")
    ap.add_argument("--baseline-dtype", choices=("bf16", "gguf"), default="bf16",
                    help="weight dtype of the --baseline core (gguf: the demo's)")
    ap.add_argument("--history", choices=("none", "suffix"), default="none",
                    help="also time speculative rounds with suffix-drafted copied "
                         "candidates (history drafting, --history-proposer suffix)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    result = bench_smollm2(args) if args.model == "smollm2" else bench_8b(args)
    result["commit"] = os.environ.get("HELIOS_COMMIT") or git_commit()
    result["cpu_threads"] = os.environ.get("HELIOS_CPU_THREADS")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
