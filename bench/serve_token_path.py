"""The per-token output path in isolation, in thread CPU time: what one streamed token
costs the model worker (output pipeline: detokenizer, parsers; inter-token latency
observation) and the HTTP loop (its SSE chunk), for the SmolLM2 core's real frontend.

    pipeline   OutputPipeline.feed of one token (a chat request without tools or stops)
    chunk      ChatShapes.output of one token's Output event (an SSE chunk's bytes)
    itl        one inter-token latency observation (the worker's per-token metric)

Run in two trees (before / after) for a per-token comparison free of the serving
machine's scheduling noise: `uv run python bench/serve_token_path.py --json OUT.json`
(bench/out/serve_cpu.core, exported by bench/serve_overhead.py when absent). Medians of
--repeats passes over --tokens tokens. Figures only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import serve_overhead  # noqa: E402  (the bench's core and text)
from _report import git_commit, write_json  # noqa: E402


def per_token_us(fn, items: list, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        t = time.thread_time()
        fn(items)
        runs.append((time.thread_time() - t) / len(items) * 1e6)
    return {"median_us": statistics.median(runs), "min_us": min(runs), "max_us": max(runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=str(BENCH / "out" / "serve_token_path.json"))
    args = ap.parse_args()
    from helios_serve.bootstrap import Bootstrap
    from helios_serve.events import Output
    from helios_serve.frontend.deltas import ContentDelta
    from helios_serve.http.responses import ChatShapes, ResponseContext
    from helios_serve.metrics import Metrics

    core, trust = serve_overhead.ensure_core()
    bootstrap = Bootstrap.load(core, [trust], serve_overhead.NAMESPACE)
    ids = serve_overhead.text_token_ids(bootstrap.tokenizer)
    tokens = (ids * (args.tokens // len(ids) + 1))[:args.tokens]
    prompt = ids[:128]

    def pipeline(items: list) -> None:
        p = bootstrap.frontend.output_pipeline(prompt_ids=prompt)
        for t in items:
            p.feed(t)

    ctx = ResponseContext(id="chatcmpl-0123456789abcdef0123456789abcdef", created=1764600000,
                          model="smollm2", prompts=(tuple(prompt),), first_choice=(0,),
                          choices=1, include_usage=True)
    texts = [bootstrap.tokenizer.decode([t]) for t in tokens]

    def chunk(items: list) -> None:
        shapes = ChatShapes(ctx, None)
        for text in items:
            shapes.output(Output((ContentDelta(text),), 0, (), 1), ())

    metrics = Metrics()
    values = [0.0015 + (i % 7) * 1e-4 for i in range(args.tokens)]
    try:  # the batched observation (after) or Histogram.observe per token (before)
        from helios_serve.metrics import HistogramBatch

        batch = HistogramBatch(metrics.inter_token_latency)

        def itl(items: list) -> None:
            for i, v in enumerate(items):
                batch.observe(v)
                if i % 32 == 31:  # one flush per step of 32 rows
                    batch.flush()
            batch.flush()
        itl_kind = "HistogramBatch, flushed every 32"
    except ImportError:
        def itl(items: list) -> None:
            for v in items:
                metrics.inter_token_latency.observe(v)
        itl_kind = "Histogram.observe"

    figures = {"pipeline": per_token_us(pipeline, tokens, args.repeats),
               "chunk": per_token_us(chunk, texts, args.repeats),
               "itl": {**per_token_us(itl, values, args.repeats), "kind": itl_kind}}
    for name, f in figures.items():
        print(f"{name:<9} {f['median_us']:7.2f} us/token (min {f['min_us']:.2f}, "
              f"max {f['max_us']:.2f})")
    commit = git_commit(BENCH.parent)
    out = write_json(args.json, {"commit": commit, "tokens": args.tokens,
                                 "repeats": args.repeats, "figures": figures,
                                 "loadavg_1m": os.getloadavg()[0]})
    print(f"wrote {out}")
    bootstrap.close()


if __name__ == "__main__":
    main()
