"""The model worker's host time per decode step at full batch, output work included.

`bench/packing.py` times the scheduling path alone (schedule + submit + wait + complete);
a served step also runs the post-step output work of every row: validation and the
observation stamp, EOS / output-limit decisions, each choice's output pipeline
(detokenizer, parsers), its events and their delivery. This drives the real
`ModelWorker._step` on this thread over the SmolLM2 serving-bench core (the real graph
selection and packing) on a device that takes no time (`testing.paced`), with R requests
decoding at once (R rows in every decode step), until every row has decoded --steps
tokens, and reports per steady decode step (wall-clock medians; the thread's CPU over
the whole run per token):

    schedule    Scheduler.schedule (the worker's _step calls it)
    submit      ModelWorker._submit: grammar masks, NativeModel.submit (packing, launch)
    complete    ModelWorker._complete_oldest: wait, Scheduler.complete, _validate
    output      ModelWorker._flush_outputs: pipelines, events, delivery
    step        one whole _step

Events go to a sink whose mailbox drops them (no HTTP loop: its per-chunk cost is
bench/serve_overhead.py's). Requests are plain chat requests as the server prepares them
for this core (no stops, no tools; the core's parsers are the recipe's).

Run: `uv run python bench/serve_worker_step.py [--rows 1 64 256] [--json OUT]` (exports
bench/out/serve_bench256.core from recipes/llama_serving_bench.py once when absent, or
takes --core/--trust/--accept). Works over an older tree too (PYTHONPATH to its
packages): the APIs it drives are the worker's. Figures only.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from _report import git_commit, write_json  # bench/ is this script's folder

BENCH = Path(__file__).resolve().parent
OUT = BENCH / "out"
CORE = OUT / "serve_bench256.core"
KEY = OUT / "serve_bench256-publisher.key"
NAMESPACE = "helios.bench/serve"
RECIPE = BENCH.parent / "recipes" / "llama_serving_bench.py"
PARTS = ("schedule", "submit", "complete", "output")


def ensure_core() -> tuple[Path, Path]:
    from helios_ignition.export import export_core
    from helios_tools.core.signing import generate_key, write_key_pair

    public = KEY.with_name(KEY.name + ".pub")
    if CORE.is_file() and public.is_file():
        return CORE, public
    OUT.mkdir(parents=True, exist_ok=True)
    if not (KEY.is_file() and public.is_file()):
        write_key_pair(generate_key(), KEY)
    partial = CORE.with_suffix(".core.partial")
    print(f"exporting {CORE} ...", flush=True)
    export_core(RECIPE, checkpoint="smollm2", key_path=KEY, namespace=NAMESPACE, out=partial)
    partial.replace(CORE)
    return CORE, public


class _Discard:
    """A mailbox that drops what the worker delivers (`deliver` posts one batch)."""

    def post(self, batch: list) -> None:
        pass


def measure(bootstrap, rows: int, steps: int, prompt_tokens: int) -> dict:
    from helios_serve.clock import ObservationClock
    from helios_serve.engine.plan import SamplingParams, StepKind
    from helios_serve.events import GenerationRequest, SinkBase
    from helios_serve.frontend.prepare import OutputRecipe, PipelineArgs, PreparedRequest
    from helios_serve.frontend.stops import StopSpec
    from helios_serve.metrics import Metrics
    from helios_serve.testing.paced import paced_model
    from helios_serve.worker import ModelWorker

    sys.path.insert(0, str(BENCH))
    import serve_overhead  # the bench's text: paced completions walk through its ids

    tok = bootstrap.tokenizer
    text_ids = serve_overhead.text_token_ids(tok)
    model = paced_model(bootstrap.core, lambda graph: 0.0, text_ids, max_concurrency=rows)
    worker = ModelWorker(model, ObservationClock(), Metrics(), max_active=rows,
                         queue_capacity=rows)
    box = _Discard()
    limit = steps + 8
    for i in range(rows):
        prompt = tuple(tok.encode(f"Request {i}: " + serve_overhead.TEXT * 3,
                                  add_special_tokens=False).ids[:prompt_tokens])
        prepared = PreparedRequest(
            prompt_text="", prompt_token_ids=prompt, sampling=SamplingParams(),
            max_output_tokens=limit, limit_field=None, prompt_field="prompt",
            stops=StopSpec(),
            output=OutputRecipe(bootstrap.frontend, PipelineArgs(prompt, StopSpec()), None))
        sink = SinkBase(1)
        sink._mailbox = box
        worker._admit(GenerationRequest.build(i + 1, prepared, sink, enqueue_ns=None))

    times: dict[str, float] = {}
    clock = time.perf_counter

    def timed(name: str, fn):
        def run(*a, **kw):
            t0 = clock()
            try:
                return fn(*a, **kw)
            finally:
                times[name] = times.get(name, 0.0) + clock() - t0
        return run

    worker.scheduler.schedule = timed("schedule", worker.scheduler.schedule)
    worker._submit = timed("submit", worker._submit)
    worker._complete_oldest = timed("complete", worker._complete_oldest)
    worker._flush_outputs = timed("output", worker._flush_outputs)
    decode_rows: list[int] = []
    submit = model.submit

    def watched(plan):
        # StepPlan.row_count where the tree has it: reading rows would build unbuilt ones
        decode_rows.append((plan.row_count if hasattr(plan, "row_count") else len(plan.rows))
                           if plan.kind is StepKind.DECODE else 0)
        return submit(plan)

    model.submit = watched
    samples: dict[str, list[float]] = {p: [] for p in (*PARTS, "step")}
    generated = worker.metrics.generation_tokens
    cpu0, tokens0, full = None, 0.0, 0
    while worker._requests:
        times.clear()
        launched = len(decode_rows)
        t0 = clock()
        worker._step()
        wall = clock() - t0
        steady = len(decode_rows) > launched and decode_rows[-1] == rows
        if steady and cpu0 is None:  # every row decoding: the measured window starts
            cpu0, tokens0 = time.thread_time(), generated._value.get()
        if steady and cpu0 is not None:
            full += 1
            for p in PARTS:
                samples[p].append(times.get(p, 0.0))
            samples["step"].append(wall)
        if cpu0 is not None and full >= steps:
            break
    cpu = time.thread_time() - cpu0 if cpu0 is not None else 0.0
    tokens = generated._value.get() - tokens0
    model.close()
    out = {p: statistics.median(v) * 1e6 for p, v in samples.items() if v}
    low = {p: statistics.quantiles(v, n=10)[0] * 1e6 for p, v in samples.items() if len(v) > 10}
    return {"rows": rows, "steady_steps": full, "median_us": out, "p10_us": low,
            "cpu_us_per_token": cpu / max(1.0, tokens) * 1e6,
            "cpu_us_per_step": cpu / max(1, full) * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--steps", type=int, default=200, help="steady decode steps measured")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--core")
    ap.add_argument("--trust")
    ap.add_argument("--accept")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", default=str(OUT / "serve_worker_step.json"))
    args = ap.parse_args()
    from helios_serve.bootstrap import Bootstrap

    if args.core:
        if not (args.trust and args.accept):
            raise SystemExit("--core needs --trust and --accept")
        core, trust, accept = Path(args.core), Path(args.trust), args.accept
    else:
        (core, trust), accept = ensure_core(), NAMESPACE
    bootstrap = Bootstrap.load(core, [trust], accept)
    load = os.getloadavg()[0]
    levels = []
    print(f"{'rows':>5} " + " ".join(f"{p:>9}" for p in (*PARTS, "step"))
          + "   (median us per steady decode step)  CPU us/token")
    for rows in args.rows:
        r = measure(bootstrap, rows, args.steps, args.prompt_tokens)
        levels.append(r)
        m = r["median_us"]
        print(f"{rows:>5} " + " ".join(f"{m.get(p, 0.0):>9.1f}" for p in (*PARTS, "step"))
              + f"   {r['cpu_us_per_token']:.2f}", flush=True)
    bootstrap.close()
    out = write_json(args.json, {
        "label": args.label, "commit": git_commit(BENCH.parent), "core": str(core),
        "levels": levels,
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "python": platform.python_version(), "loadavg_1m_before": load,
                 "loadavg_1m_after": os.getloadavg()[0]}})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
