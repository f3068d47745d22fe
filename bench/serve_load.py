"""Served throughput through HTTP: a load generator for OpenAI-compatible chat completions.

Sends streaming chat requests whose rendered prompts are exactly --input-tokens tokens of
random text (seeded: random ordinary-vocabulary ids decoded to text, then trimmed until
the chat-templated prompt tokenizes to the target length with the core's own tokenizer
and template) and asks for --output-tokens tokens with `ignore_eos` (vLLM's field), at
each concurrency C (1, 16, 64, 256 by default): C requests are always in flight until
the level's requests are done (closed loop, `--rounds` x C requests, at least
--min-requests). Clients are `openai.AsyncOpenAI` streams spread over several processes
so the client side is not the bottleneck.

Per level (vLLM's benchmark_serving definitions):
    output tok/s   completion tokens (usage) / wall time of the level
    requests/s     completed requests / wall time
    TTFT           send -> first content chunk, p50 / p99 (ms)
    TPOT           (last chunk - first content chunk) / (completion tokens - 1), p50 / p99
    ITL            gaps between consecutive content chunks, p50 / p99 (a chunk may carry
                   several tokens when the server coalesces a backlog: tokens/chunk shown)

Beside each level (issue 17, "the serving path keeps up with the device"): the NativeModel
loop of the same core and backend at batch C (`native_loop`, run in a child process before
the server starts, skipped with --url or --no-native), and two ratios to it:
    served/native  output tok/s / the loop's tok/s
    decode/native  C / TPOT p50 / the loop's tok/s (the rate while every stream decodes)
Each level is preceded by one unrecorded round (C requests of 8 tokens: every graph the
level uses has run once; --no-warmup skips it), and each client process sends one
1-token request per stream it will run before the level's timed start (its connections
open, the openai streaming path run once: a new process's first request paid ~100 ms).

Either serve a core (`--core C --trust PUB --accept NS [--backend cuda] [--max-active M]`:
`helios-serve` as a child process on 127.0.0.1, stopped at the end) or load an already
running server (`--url URL --core C --trust PUB --accept NS`: the core gives the tokenizer
and template). When the server rejects `ignore_eos` (HTTP 400 naming it), the run goes on
without it and records `ignore_eos: false`: outputs may then end early at EOS, and
the tokens actually generated are what is counted.

Run: `uv run python bench/serve_load.py --core X.core --trust X.pub --accept NS
      --workload 128/128 1024/1024 --concurrency 1 16 64 256 --json bench/out/serve_load.json`
-> prints a table per workload and writes JSON. Figures only; never asserted on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
from _report import git_commit, write_json  # bench/ is this script's folder
from server import ServeProcess  # bench/ is this script's folder

REPO = Path(__file__).resolve().parent.parent
# Idle pooled connections are dropped before uvicorn closes them (timeout_keep_alive 5 s):
# reusing one the server is closing fails with a ReadError under load.
KEEPALIVE_S = 2.0


# -- prompts ----------------------------------------------------------------------------------


class PromptMaker:
    """Chat prompts whose templated form is exactly `tokens` tokens long (the server's
    tokenizer and chat template, read from the core)."""

    def __init__(self, bootstrap, seed: int):
        from helios_tools.frontend_assets import render_chat

        self._render = lambda content: render_chat(
            bootstrap.chat_template, [{"role": "user", "content": content}],
            add_generation_prompt=True, **bootstrap.template_variables)
        self._tok = bootstrap.tokenizer
        vocab = self._tok.get_vocab()
        # Ordinary ids only: no special or filler tokens (their text re-tokenizes apart).
        self._ids = sorted(i for t, i in vocab.items() if not (t.startswith("<") and
                                                                 t.endswith(">")))
        self._rng = random.Random(seed)
        self.overhead = self._count("")

    def _count(self, content: str) -> int:
        return len(self._tok.encode(self._render(content), add_special_tokens=False).ids)

    def make(self, tokens: int) -> str:
        """Content of a user message whose rendered prompt has `tokens` tokens.

        Raises:
            ValueError: no such content found (target shorter than the template).
        """
        if tokens <= self.overhead:
            raise ValueError(f"--input-tokens {tokens} <= the chat template's {self.overhead}")
        for _ in range(20):
            ids = [self._rng.choice(self._ids) for _ in range(tokens)]
            text = self._tok.decode(ids, skip_special_tokens=True)
            # Re-encoding decoded random ids merges some; trim by ids until it fits.
            ids = self._tok.encode(text, add_special_tokens=False).ids
            n = tokens - self.overhead
            for _ in range(40):
                content = self._tok.decode(ids[:n], skip_special_tokens=True)
                got = self._count(content)
                if got == tokens:
                    return content
                n += tokens - got
                if n <= 0 or n > len(ids):
                    break
        raise ValueError(f"could not build a prompt of exactly {tokens} tokens")


# -- clients ----------------------------------------------------------------------------------


async def _client_main(url: str, model: str, prompts: list[str], concurrency: int,
                       max_tokens: int, ignore_eos: bool, start_at: float) -> list[dict]:
    import httpx
    import openai

    client = openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="bench", max_retries=0,
        http_client=httpx.AsyncClient(timeout=3600.0, trust_env=False,
                                      limits=httpx.Limits(max_connections=concurrency + 4,
                                                          keepalive_expiry=KEEPALIVE_S)))
    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    records: list[dict] = []
    extra = {"ignore_eos": True} if ignore_eos else None

    async def one(prompt: str) -> dict:
        rec = {"sent": time.time(), "first": None, "end": None, "gaps": [], "chunks": 0,
               "completion_tokens": 0, "prompt_tokens": 0, "error": None, "retries": 0}
        try:
            for attempt in range(3):
                try:
                    stream = await client.chat.completions.create(
                        model=model, messages=[{"role": "user", "content": prompt}],
                        max_tokens=max_tokens, temperature=0, stream=True,
                        stream_options={"include_usage": True}, extra_body=extra)
                    break
                except openai.APIConnectionError:  # before any response byte: resend
                    if attempt == 2:
                        raise
                    rec["retries"] += 1
            last = None
            async for chunk in stream:
                now = time.time()
                if chunk.usage is not None:
                    rec["completion_tokens"] = chunk.usage.completion_tokens
                    rec["prompt_tokens"] = chunk.usage.prompt_tokens
                if chunk.choices and chunk.choices[0].delta.content:
                    rec["chunks"] += 1
                    if rec["first"] is None:
                        rec["first"] = now
                    else:
                        rec["gaps"].append(now - last)
                    last = now
            rec["end"] = last or time.time()
        except Exception as exc:  # recorded per request; the level goes on
            rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
            rec["end"] = time.time()
        return rec

    async def worker() -> None:
        while not queue.empty():
            records.append(await one(queue.get_nowait()))

    # This process's own client opens its connections and runs the openai streaming
    # path once (its first request pays lazy imports and a new connection, ~100 ms)
    # before the timed start: a level's client processes are new, so the unrecorded
    # warm-up round of run_level's caller cannot do it for them.
    async def warm() -> None:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=1,
            temperature=0, stream=True, stream_options={"include_usage": True})
        async for _ in stream:
            pass

    await asyncio.gather(*(warm() for _ in range(concurrency)))
    await asyncio.sleep(max(0.0, start_at - time.time()))
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()
    return records


def _client_proc(args: tuple, out: mp.Queue) -> None:
    out.put(asyncio.run(_client_main(*args)))


def run_level(url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int,
              ignore_eos: bool, procs: int) -> dict:
    """`concurrency` streams in flight over `procs` client processes until `prompts` are
    done; returns the level's figures."""
    procs = max(1, min(procs, concurrency))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 2.0 + 0.3 * procs  # every process started and connected
    workers = []
    for k in range(procs):
        share = concurrency // procs + (k < concurrency % procs)
        mine = prompts[k::procs]
        p = ctx.Process(target=_client_proc,
                        args=((url, model, mine, share, max_tokens, ignore_eos, start_at), out))
        p.start()
        workers.append(p)
    records = [r for _ in workers for r in out.get()]
    for p in workers:
        p.join()
    ok = [r for r in records if r["error"] is None and r["first"] is not None]
    wall = max(r["end"] for r in records) - start_at
    tokens = sum(r["completion_tokens"] for r in ok)
    chunks = sum(r["chunks"] for r in ok)

    def pct(values: list[float], scale: float = 1e3) -> dict:
        if not values:
            return {"p50": None, "p99": None, "mean": None}
        v = np.asarray(values) * scale
        return {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)),
                "mean": float(v.mean())}

    tpot = [(r["end"] - r["first"]) / (r["completion_tokens"] - 1)
            for r in ok if r["completion_tokens"] > 1]
    return {
        "concurrency": concurrency, "requests": len(records), "completed": len(ok),
        "errors": sorted({r["error"] for r in records if r["error"]})[:5],
        "wall_s": wall, "output_tokens": tokens, "output_tokens_per_s": tokens / wall,
        "requests_per_s": len(ok) / wall,
        "prompt_tokens_mean": float(np.mean([r["prompt_tokens"] for r in ok])) if ok else None,
        "completion_tokens_min_max": ([min(r["completion_tokens"] for r in ok),
                                       max(r["completion_tokens"] for r in ok)] if ok else None),
        "ttft_ms": pct([r["first"] - r["sent"] for r in ok]),
        "tpot_ms": pct(tpot),
        "itl_ms": pct([g for r in ok for g in r["gaps"]]),
        "tokens_per_chunk": tokens / chunks if chunks else None,
        "connection_retries": sum(r["retries"] for r in records),
        "client_processes": procs,
    }


# -- the NativeModel loop --------------------------------------------------------------------


def native_loop(core, trust, accept, backend: str, workloads: list[tuple[int, int]],
                concurrency: list[int], steps: int, seed: int = 0) -> list[dict]:
    """The device-speed reference of each (workload, concurrency): NativeModel.submit/wait
    at batch C with step N + 1 submitted before waiting for step N when the backend has
    two frames (cuda; the loop bench/gpu_models.py times), on the same core and backend,
    greedy.

    Each row is prefilled with random ordinary ids up to n_in + (n_out - steps) // 2, then
    `steps` decode steps run, so the mean context (n_in + n_out / 2) is a served request's.
    tokens/s = C * steps / wall of the decode steps after 3 warm-up steps. Beside it the
    request-shaped figure a served request's wall compares with (its TTFT holds the
    prefill): prefill_ms = wall of the level's prefills (C rows, one after another) and
    request_tokens_per_s = C * (steps + 1) / wall from the first prefill's submit to the
    last token (the prefill samples each row's first token; warm-up steps included).
    One unrecorded row (prefill and 3 decode steps) first places the programs' graphs and
    touches the weights, so the first level's prefill is not a cold one.
    """
    from helios_serve.bootstrap import Bootstrap
    from helios_serve.engine.plan import (
        PENDING_PLACEHOLDER,
        RowPlan,
        SamplingParams,
        StepKind,
        StepPlan,
    )
    from helios_serve.runtime.native_model import NativeModel

    rng = random.Random(seed)
    out = []
    with Bootstrap.load(core, [trust], accept) as boot:
        model = NativeModel.load(boot.prepared, boot.core.read_resource, backend,
                                 max_concurrency=max(concurrency))
        g = model.manifests
        chunk = max(g.prefill_token_capacities)
        per = min(g.max_pages_per_request, g.num_pages // g.slots)
        greedy = SamplingParams()
        vocab = [i for t, i in boot.tokenizer.get_vocab().items()
                 if not (t.startswith("<") and t.endswith(">")) and i < g.vocab_size]

        def pages(slot: int, length: int) -> tuple[int, ...]:
            n = -(-length // g.page_tokens)
            if n > per:
                raise SystemExit(f"native loop: {length} tokens need {n} KV pages per row; "
                                 f"{g.num_pages} pages over {g.slots} rows give {per}")
            return tuple(range(slot * per, slot * per + n))

        try:
            warm_ids = [rng.choice(vocab) for _ in range(min(chunk, workloads[0][0]))]
            model.execute(StepPlan(StepKind.PREFILL, (RowPlan(
                request_id=0, slot=0, generation=1, tokens=tuple(warm_ids), start_position=0,
                page_ids=pages(0, len(warm_ids)), sample=True, sampling=greedy,
                histogram_tokens=tuple(warm_ids)),)))
            for i in range(3):
                pos = len(warm_ids) + i
                model.execute(StepPlan(StepKind.DECODE, (RowPlan(
                    request_id=0, slot=0, generation=1, tokens=(PENDING_PLACEHOLDER,),
                    start_position=pos, page_ids=pages(0, pos + 1), sample=True,
                    sampling=greedy),)))
            for n_in, n_out in workloads:
                run = min(steps, n_out)
                context = n_in + (n_out - run) // 2
                for c in concurrency:
                    generation = len(out) + 2  # a fresh generation per level: new rows
                    submitted = time.perf_counter()
                    for slot in range(c):
                        ids = [rng.choice(vocab) for _ in range(context)]
                        for start in range(0, context, chunk):
                            piece = tuple(ids[start:start + chunk])
                            end = start + len(piece)
                            row = RowPlan(request_id=slot, slot=slot, generation=generation,
                                          tokens=piece, start_position=start,
                                          page_ids=pages(slot, end), sample=end == context,
                                          sampling=greedy,
                                          histogram_tokens=tuple(ids) if start == 0 else None)
                            model.execute(StepPlan(StepKind.PREFILL, (row,)))

                    def plan(i: int, c=c, context=context, generation=generation) -> StepPlan:
                        pos = context + i
                        return StepPlan(StepKind.DECODE, tuple(
                            RowPlan(request_id=s, slot=s, generation=generation,
                                    tokens=(PENDING_PLACEHOLDER,), start_position=pos,
                                    page_ids=pages(s, pos + 1), sample=True, sampling=greedy)
                            for s in range(c)))

                    warm, inflight = 3, []
                    prefilled = time.perf_counter()
                    for i in range(run):
                        if i == warm:
                            started = time.perf_counter()
                        if len(inflight) == model.frames:  # cuda: 2 frames; cpu: 1
                            model.wait(inflight.pop(0))
                        inflight.append(model.submit(plan(i)))
                    for ticket in inflight:
                        model.wait(ticket)
                    ended = time.perf_counter()
                    wall = ended - started
                    out.append({"input_tokens": n_in, "output_tokens": n_out, "concurrency": c,
                                "context_start": context, "steps": run - warm,
                                "tokens_per_s": c * (run - warm) / wall,
                                "step_ms": wall / (run - warm) * 1e3,
                                "prefill_ms": (prefilled - submitted) * 1e3,
                                "request_tokens_per_s": c * (run + 1) / (ended - submitted)})
                    print(f"native loop {n_in}/{n_out} C={c}: {out[-1]['tokens_per_s']:.0f} "
                          f"tok/s ({out[-1]['step_ms']:.3f} ms/step); with the prefill "
                          f"({out[-1]['prefill_ms']:.0f} ms) "
                          f"{out[-1]['request_tokens_per_s']:.1f} tok/s", flush=True)
        finally:
            model.close()
    return out


def ratios(level: dict, native: dict | None) -> dict:
    """The level against the NativeModel loop at the same concurrency (issue 17: served
    tokens/s >= 0.9x the loop): served/native = output tok/s over the loop's tok/s (TTFT,
    request gaps and ramps included); decode/native = C / TPOT p50 over it (the rate while
    every stream decodes); served/native request = output tok/s over the loop's
    request_tokens_per_s (both walls hold the prefill and every token: like for like
    where the served requests are the loop's prompt and output lengths)."""
    if native is None:
        return {"native_tokens_per_s": None, "served_over_native": None,
                "decode_over_native": None, "served_over_native_request": None}
    tpot = level["tpot_ms"]["p50"]
    decode = level["concurrency"] * 1e3 / tpot if tpot else None
    request = native.get("request_tokens_per_s")
    return {"native_tokens_per_s": native["tokens_per_s"],
            "served_over_native": level["output_tokens_per_s"] / native["tokens_per_s"],
            "decode_over_native": decode / native["tokens_per_s"] if decode else None,
            "native_request_tokens_per_s": request,
            "served_over_native_request": (level["output_tokens_per_s"] / request
                                           if request else None)}


def native_in_child(args, workloads: list[tuple[int, int]]) -> list[dict]:
    """`native_loop` in a child process, so its device memory is free before the server
    starts."""
    argv = [sys.executable, __file__, "--native-child", "--core", str(args.core), "--trust",
            str(args.trust), "--accept", args.accept, "--backend", args.backend,
            "--native-steps", str(args.native_steps), "--seed", str(args.seed),
            "--workload", *[f"{i}/{o}" for i, o in workloads],
            "--concurrency", *[str(c) for c in args.concurrency]]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    sys.stdout.write("".join(line + "\n" for line in proc.stdout.splitlines()
                             if line.startswith("native loop")))
    if proc.returncode:
        raise SystemExit(f"the NativeModel loop failed ({proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


# -- the server -------------------------------------------------------------------------------


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # 127.0.0.1 only
        return r.read()


def start_server(args, log_path: Path) -> ServeProcess:
    """`helios-serve` for the run: --max-active as given, the queue sized for the highest
    concurrency."""
    options = ["--max-active", str(args.max_active)] if args.max_active else []
    options += ["--queue-capacity", str(max(args.concurrency) + 8),
                "--stream-interval", str(args.stream_interval)]
    if args.engine_process:
        options.append("--engine-process")
    return ServeProcess(args.core, args.trust, args.accept, log=log_path, backend=args.backend,
                        options=options, startup_timeout_s=args.startup_timeout)


def probe_ignore_eos(url: str, model: str) -> tuple[bool, str]:
    """Whether the server accepts `ignore_eos` (one 2-token request)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 2, "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        _get_req = urllib.request.urlopen(req, timeout=600)
        _get_req.read()
        return True, "accepted"
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        if exc.code == 400 and "ignore_eos" in text:
            return False, f"rejected: {text[:200]}"
        raise SystemExit(f"probe request failed: HTTP {exc.code} {text[:300]}") from None


def metrics_snapshot(url: str) -> dict:
    """Selected counters of /metrics (preemptions, prefix hits, launches, decode rows and
    their padding)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict = {}
    for family in text_string_to_metric_families(_get(url + "/metrics").decode()):
        if any(k in family.name for k in ("preemption", "graph_launch", "generation_tokens",
                                           "prompt_tokens", "requests_finished", "mixed_lanes",
                                           "decode_rows", "decode_padded_rows")):
            for s in family.samples:
                label = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[s.name + (f"{{{label}}}" if label else "")] = s.value
    return out


def padding_fraction(before: dict, after: dict) -> float | None:
    """Padded rows over all captured rows of the DECODE steps between two snapshots
    (None when none ran or the server predates the counters)."""
    keys = ("helios_decode_rows_total", "helios_decode_padded_rows_total")
    if not all(k in before and k in after for k in keys):
        return None
    rows, padded = (after[k] - before[k] for k in keys)
    return padded / (rows + padded) if rows + padded else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--core", required=True)
    ap.add_argument("--trust", required=True)
    ap.add_argument("--accept", required=True)
    ap.add_argument("--url", help="an already running server (else one is started)")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--max-active", type=int)
    ap.add_argument("--workload", nargs="+", default=["128/128", "1024/1024"],
                    help="INPUT/OUTPUT token counts")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--rounds", type=int, default=2, help="requests per client slot")
    ap.add_argument("--min-requests", type=int, default=4)
    ap.add_argument("--client-procs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 4)))
    ap.add_argument("--no-ignore-eos", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--startup-timeout", type=float, default=900.0)
    ap.add_argument("--profile", metavar="DIR",
                    help="py-spy the served process during each level into DIR/*.folded "
                         "and print its busiest frames per thread (needs py-spy, ptrace)")
    ap.add_argument("--stream-interval", type=int, default=1,
                    help="helios-serve --stream-interval (tokens per SSE delivery)")
    ap.add_argument("--engine-process", action="store_true",
                    help="helios-serve --engine-process (the model worker in its own process)")
    ap.add_argument("--no-native", dest="native", action="store_false",
                    help="skip the NativeModel loop (it runs before the server starts; "
                         "skipped with --url)")
    ap.add_argument("--native-steps", type=int, default=256,
                    help="decode steps of the NativeModel loop per level")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="skip the unrecorded round (C requests of 8 tokens) before a level")
    ap.add_argument("--native-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", default=str(REPO / "bench" / "out" / "serve_load.json"))
    args = ap.parse_args()
    workloads = [tuple(int(x) for x in spec.split("/")) for spec in args.workload]
    if args.native_child:
        print(json.dumps(native_loop(args.core, args.trust, args.accept, args.backend,
                                     workloads, args.concurrency, args.native_steps,
                                     args.seed)))
        return
    native = native_in_child(args, workloads) if args.native and not args.url else []

    from helios_serve.bootstrap import Bootstrap

    bootstrap = Bootstrap.load(args.core, [args.trust], args.accept)
    model = bootstrap.contract.served_id
    prompts = PromptMaker(bootstrap, args.seed)
    served = None if args.url else start_server(args, Path(args.json).with_suffix(".server.log"))
    url = args.url or served.url
    result: dict = {"core": str(args.core), "served_id": model, "backend": args.backend,
                    "max_active": args.max_active, "stream_interval": args.stream_interval,
                    "engine_process": args.engine_process,
                    "url_given": bool(args.url),
                    "server_startup_s": served.startup_s if served else None,
                    "template_tokens": prompts.overhead, "native_loop": native,
                    "workloads": [], "commit": git_commit(REPO),
                    "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                             "python": platform.python_version()}}
    try:
        ignore_eos, note = (False, "disabled by --no-ignore-eos") if args.no_ignore_eos \
            else probe_ignore_eos(url, model)
        result["ignore_eos"], result["ignore_eos_probe"] = ignore_eos, note
        for spec in args.workload:
            n_in, n_out = (int(x) for x in spec.split("/"))
            print(f"\n{spec} (input/output tokens), ignore_eos {ignore_eos}", flush=True)
            print(f"{'conc':>5}{'reqs':>6}{'out tok/s':>11}{'req/s':>8}{'TTFT p50':>10}"
                  f"{'p99':>9}{'TPOT p50':>10}{'p99':>8}{'ITL p50':>9}{'p99':>8}{'tok/chunk':>10}"
                  "  (ms)", flush=True)
            levels: list = []
            result["workloads"].append({"input_tokens": n_in, "output_tokens": n_out,
                                        "levels": levels})
            for c in args.concurrency:
                count = max(args.min_requests, args.rounds * c)
                batch = [prompts.make(n_in) for _ in range(count)]
                if args.warmup:  # every graph of the level used once, connections opened
                    run_level(url, model, [prompts.make(n_in) for _ in range(c)], c, 8,
                              ignore_eos, args.client_procs)
                spy = None
                if args.profile and served is not None:
                    from serve_overhead import Profiler  # bench/ is this script's folder

                    Path(args.profile).mkdir(parents=True, exist_ok=True)
                    try:
                        spy = Profiler(served.proc.pid,
                                       Path(args.profile) / f"serve_{n_in}_{n_out}_c{c}.folded")
                    except SystemExit as exc:  # no py-spy: the figures still count
                        print(f"no profile: {exc}", flush=True)
                        args.profile = None
                before = metrics_snapshot(url)
                try:
                    level = run_level(url, model, batch, c, n_out, ignore_eos,
                                      args.client_procs)
                finally:
                    if spy is not None:
                        level_profile = spy.stop()
                if spy is not None:
                    level["profile"] = level_profile
                level["metrics_after"] = metrics_snapshot(url)
                level["decode_padding_fraction"] = padding_fraction(before,
                                                                    level["metrics_after"])
                ref = next((n for n in native if n["concurrency"] == c
                            and (n["input_tokens"], n["output_tokens"]) == (n_in, n_out)), None)
                level.update(ratios(level, ref))
                levels.append(level)
                write_json(args.json, result)  # each level kept if a later one is cut off
                t, p, i = level["ttft_ms"], level["tpot_ms"], level["itl_ms"]

                def f(v, w=9):
                    return f"{v:>{w}.1f}" if v is not None else f"{'-':>{w}}"

                print(f"{c:>5}{level['completed']:>6}{level['output_tokens_per_s']:>11.1f}"
                      f"{level['requests_per_s']:>8.2f}{f(t['p50'], 10)}{f(t['p99'])}"
                      f"{f(p['p50'], 10)}{f(p['p99'], 8)}{f(i['p50'])}{f(i['p99'], 8)}"
                      f"{f(level['tokens_per_chunk'], 10)}"
                      + (f"   served/native {level['served_over_native']:.2f}, decode/native "
                         f"{level['decode_over_native']:.2f}" if ref else "")
                      + (f"  errors: {level['errors']}" if level["errors"] else "")
                      + (f"  decode padding {level['decode_padding_fraction']:.3f}"
                         if level["decode_padding_fraction"] is not None else ""), flush=True)
    finally:
        if served is not None:
            served.stop()
        bootstrap.close()
    result["host"]["loadavg_1m"] = os.getloadavg()[0]
    print(f"wrote {write_json(args.json, result)}")


if __name__ == "__main__":
    main()
