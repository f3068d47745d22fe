"""Mixed generation programs on and off: inter-token latency of running streams while long
prompts arrive (issue 27, item 2: with 1k prompts arriving into 64 running streams,
ITL p99 <= 2x ITL p50).

One core is captured with MIXED programs (`--mixed-tokens`: the token capacities, among
which the scheduler picks each mixed step's budget: docs/mixed.md, "Token budget") and
loaded once; the same workload runs twice through the real scheduler and
NativeModel, as the model worker drives them (a plan submitted ahead whenever the
scheduler allows it, the oldest completed otherwise; no HTTP):

    on    the scheduler plans MIXED steps (decode lanes first, prefill chunks fill the
          budget) whenever decode lanes and prefill work meet
    off   the geometry without mixed capacities: PREFILL and DECODE steps alternate, a
          prompt chunk of up to the largest prefill capacity per PREFILL step

Workload: `--streams` requests with `--stream-prompt`-token prompts decode throughout;
after every `--every` tokens of stream 0, `--group` requests with `--prompt-tokens`-token
prompts (seeded random ids) arrive together, asking for `--arrival-output` tokens each;
`--arrivals` such groups. Greedy sampling. A group of one into more running streams gets
the smallest budget with room; a group at least as large as the running streams (a
burst) the largest. Measured per mode, from the host's completion times:

    ITL        gaps between consecutive tokens of each running stream, p50 / p99 / max
               (ms), over the stretch from the first arrival to the last arrival's end
    TTFT       arrival -> first token of each long prompt, p50 / max (ms)
    steps      plans issued by kind, and MIXED steps by the token budget chosen
               (`mixed_budgets`); stream tokens/s over the stretch

Run (GPU, the issue's figure):
    uv run python bench/serve_mixed.py --backend cuda --model llama-3.1-8b --streams 64 \
        --prompt-tokens 1024 --json bench/results/serve_mixed_llama8b.json
CPU (SmolLM2, small):
    uv run python bench/serve_mixed.py --backend cpu --model smollm2 --streams 8 \
        --prompt-tokens 256 --mixed-tokens 64 --arrivals 3 --every 8 --json OUT.json
Two budgets, steady arrivals then bursts (GPU; docs/mixed.md, "Measuring"):
    uv run python bench/serve_mixed.py --backend cuda --model llama-3.1-8b --streams 64 \
        --prompt-tokens 1024 --mixed-tokens 512 2048 --json OUT.json
    uv run python bench/serve_mixed.py --backend cuda --model llama-3.1-8b --streams 8 \
        --prompt-tokens 1024 --mixed-tokens 512 2048 --group 16 --arrivals 2 --json OUT.json

Writes JSON with the commit, machine and device. Figures only; never asserted on.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_commit, write_json  # noqa: E402  (bench/ is this script's folder)
from helios_ignition.capture.buffers import weight_resource_id  # noqa: E402
from helios_ignition.capture.programs import capture  # noqa: E402
from helios_ignition.checkpoint import load_checkpoint  # noqa: E402
from helios_ignition.export import build_contract, resolve_recipe  # noqa: E402
from helios_ignition.families.llama import LlamaShapes  # noqa: E402
from helios_ignition.recipe import Capacities  # noqa: E402
from helios_ignition.weights import iter_weight_buffers  # noqa: E402
from helios_serve.engine.plan import StepKind  # noqa: E402
from helios_serve.runtime.packing import SharedPacking  # noqa: E402
from helios_serve.scheduler import FinishReason, SchedRequest, Scheduler  # noqa: E402
from helios_serve.testing.native import load_native  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class MemoryCore:
    """What NativeModel.load reads from a verified core, held in memory."""

    contract: object
    manifest: object
    resources: dict

    def read_resource(self, rid: str) -> bytes:
        value = self.resources[rid]
        return value() if callable(value) else value


def build(args) -> MemoryCore:
    """The model captured with MIXED programs, for `args.backend`."""
    streams = args.streams + args.arrivals * args.group
    batches = tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256)
                    if b < streams) + (streams,)
    pages = args.streams * -(-(args.stream_prompt + stream_output(args)) // 16) \
        + args.arrivals * args.group * -(-(args.prompt_tokens + args.arrival_output) // 16) \
        + streams
    caps = Capacities(decode_batch=tuple(sorted(set(batches))), prefill_tokens=(256, 1024),
                      prefill_rows=8, context_tokens=2048, page_tokens=16,
                      prepared_pages=pages, mixed_tokens=tuple(args.mixed_tokens))
    if args.model == "smollm2":
        from helios_ignition.checkpoint import smollm2_gguf_path

        ckpt = load_checkpoint(str(smollm2_gguf_path()))
        recipe = resolve_recipe(ROOT / "recipes/smollm2_135m_instruct.py", ckpt)
        shapes = LlamaShapes.from_geometry(ckpt.geometry)
        dtype = "bf16" if args.backend == "cuda" else "f32"
        weights = {weight_resource_id(n): a.tobytes()
                   for n, a in iter_weight_buffers(ckpt, shapes, dtype)}
    else:
        from types import SimpleNamespace

        from gpu_common import random_bf16_weights
        from helios_ignition.checkpoint.synthetic import NAMED_GEOMETRIES

        ckpt = SimpleNamespace(geometry=NAMED_GEOMETRIES["llama-3.1-8b"], tokenizer_json="{}",
                               chat_template="", eos_token_ids=(2,), special_tokens={},
                               source="synthetic:llama-3.1-8b:seed=0")
        recipe = resolve_recipe(ROOT / "recipes/llama.py", ckpt)
        shapes = LlamaShapes.from_geometry(ckpt.geometry)
        dtype = "bf16"
        weights = random_bf16_weights(shapes, 0, ckpt.geometry.rope_scaling)
    recipe = dataclasses.replace(recipe, capacities=caps, weight_dtype=dtype)
    manifest, graphs = capture(shapes, caps, dtype)
    resources = dict(weights)
    if args.backend == "cuda":
        from helios_ignition.kernels_aot import compile_targets  # Triton: GPU machine only

        resources.update(compile_targets(manifest, (device_target(),)))
    return MemoryCore(build_contract(recipe, ckpt, shapes, graphs, manifest), manifest,
                      resources)


def stream_output(args) -> int:
    """Output tokens each running stream asks for: past the last arrival's end."""
    return args.every * (args.arrivals + 2) + args.arrival_output + 64


def device_target() -> str:
    """sm_XY of device 0."""
    from helios_serve.runtime.cuda.driver import call, require_driver

    cu = require_driver()
    dev = call("dev", cu.cuDeviceGet(0))
    attr = cu.CUdevice_attribute
    major = call("a", cu.cuDeviceGetAttribute(
        attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = call("a", cu.cuDeviceGetAttribute(
        attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    return f"sm_{major}{minor}"


def run(model, geometry, args, vocab: int) -> dict:
    """One workload (module docstring) on `geometry`; the figures of one mode."""
    rng = np.random.default_rng(args.seed)
    # A fresh scheduler restarts slot generations: fresh packing uploads page tables anew.
    model.packing = SharedPacking(list(model.prepared.graphs.values()),
                                  [model.backend.staging(f) for f in range(model.frames)],
                                  model.prepared.page_table_views)
    sched = Scheduler(geometry, frames=model.frames, device_pending=model.device_pending)
    long_output = stream_output(args)
    for rid in range(args.streams):
        prompt = tuple(int(t) for t in rng.integers(10, vocab - 10, args.stream_prompt))
        assert sched.add(SchedRequest(rid, prompt, long_output)) is None
    arrivals = [tuple(int(t) for t in rng.integers(10, vocab - 10, args.prompt_tokens))
                for _ in range(args.arrivals * args.group)]
    limits = dict.fromkeys(range(args.streams), long_output)
    counts = dict.fromkeys(range(args.streams), 0)
    stamps: dict[int, list[float]] = {rid: [] for rid in range(args.streams)}
    arrived: dict[int, float] = {}
    first: dict[int, float] = {}
    done: dict[int, float] = {}
    kinds = dict.fromkeys([k.value for k in StepKind], 0)
    budgets: dict[str, int] = {}  # MIXED steps by StepPlan.token_budget
    inflight: deque = deque()
    next_arrival, t0 = 0, time.perf_counter()
    while len(done) < len(arrivals):
        if next_arrival < args.arrivals and counts[0] >= args.every * (next_arrival + 1):
            for i in range(next_arrival * args.group, (next_arrival + 1) * args.group):
                rid = args.streams + i
                assert sched.add(SchedRequest(rid, arrivals[i], args.arrival_output)) is None
                limits[rid], counts[rid] = args.arrival_output, 0
                arrived[rid] = time.perf_counter()
            next_arrival += 1
        submitted = False
        if sched.can_schedule_ahead():
            plan = sched.schedule()
            if plan is not None:
                inflight.append((plan, model.submit(plan)))
                kinds[plan.kind.value] += 1
                if plan.kind is StepKind.MIXED:
                    key = str(plan.token_budget)
                    budgets[key] = budgets.get(key, 0) + 1
                submitted = True
        if inflight and not (submitted and sched.can_schedule_ahead()):
            plan, ticket = inflight.popleft()
            sampled = model.wait(ticket)
            now = time.perf_counter()
            for r in sched.complete(plan, sampled):
                if r.token_id is None:
                    continue
                rid = r.request_id
                counts[rid] = r.output_tokens
                if rid in stamps:
                    stamps[rid].append(now)
                elif rid not in first:
                    first[rid] = now
                if r.output_tokens == limits[rid]:
                    sched.finish(rid, FinishReason.LENGTH)
                    if rid >= args.streams:
                        done[rid] = now
        if time.perf_counter() - t0 > args.timeout_s:
            raise SystemExit(f"timed out after {args.timeout_s} s")
    start, end = min(arrived.values()), max(done.values())
    gaps = [b - a for times in stamps.values() for a, b in zip(times, times[1:], strict=False)
            if a >= start and b <= end]
    tokens = sum(1 for times in stamps.values() for t in times if start <= t <= end)
    ttft = [first[rid] - arrived[rid] for rid in arrived]
    while inflight:  # the streams still decode: their last steps are not measured
        model.wait(inflight.popleft()[1])
    if not gaps:
        raise SystemExit("no running stream's token gap lies inside the measured stretch: "
                         "raise --arrival-output or --prompt-tokens")
    ms = np.asarray(gaps) * 1e3
    return {"itl_ms": {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)),
                       "max": float(ms.max()), "count": len(gaps)},
            "itl_p99_over_p50": float(np.percentile(ms, 99) / np.percentile(ms, 50)),
            "ttft_ms": {"p50": float(np.percentile(ttft, 50) * 1e3),
                        "max": float(max(ttft) * 1e3)},
            "stream_tokens_per_s": tokens / (end - start), "stretch_s": end - start,
            "steps": kinds, "mixed_budgets": dict(sorted(budgets.items(), key=lambda kv: int(kv[0])))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--model", choices=["smollm2", "llama-3.1-8b"], default="smollm2")
    ap.add_argument("--streams", type=int, default=64, help="running streams")
    ap.add_argument("--stream-prompt", type=int, default=32, help="their prompt tokens")
    ap.add_argument("--prompt-tokens", type=int, default=1024, help="each arrival's prompt")
    ap.add_argument("--arrival-output", type=int, default=4, help="each arrival's output")
    ap.add_argument("--arrivals", type=int, default=8, help="arrival groups")
    ap.add_argument("--group", type=int, default=1, help="requests arriving together")
    ap.add_argument("--every", type=int, default=16,
                    help="stream 0's tokens between arrivals")
    ap.add_argument("--mixed-tokens", type=int, nargs="+", default=[512],
                    help="MIXED token capacities (each mixed step's budget is one of them)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-s", type=float, default=500.0, help="per mode")
    ap.add_argument("--json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    core = build(args)
    model = load_native(core, args.backend)
    load_s = time.perf_counter() - t0
    vocab = model.manifests.vocab_size
    result = {"commit": git_commit(), "args": vars(args), "load_s": load_s,
              "device": getattr(model.backend, "device_name", platform.processor() or "cpu"),
              "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                       "python": platform.python_version(), "loadavg_1m": os.getloadavg()[0]},
              "mixed_capacities": [list(c) for c in model.manifests.mixed_capacities]}
    off = dataclasses.replace(model.manifests, mixed_capacities=())
    for mode, geometry in (("off", off), ("on", model.manifests)):
        result[mode] = run(model, geometry, args, vocab)
        r = result[mode]
        print(f"mixed {mode:3}: ITL p50 {r['itl_ms']['p50']:7.2f} ms  p99 "
              f"{r['itl_ms']['p99']:7.2f} ms  max {r['itl_ms']['max']:7.2f} ms  "
              f"p99/p50 {r['itl_p99_over_p50']:5.2f}  TTFT p50 {r['ttft_ms']['p50']:8.1f} ms  "
              f"stream tok/s {r['stream_tokens_per_s']:8.1f}  steps {r['steps']}  "
              f"mixed budgets {r['mixed_budgets']}", flush=True)
    model.close()
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
