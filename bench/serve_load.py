"""Served throughput through HTTP: a load generator for OpenAI-compatible chat completions.

Sends streaming chat requests whose rendered prompts are exactly INPUT tokens of random
text (`--workload INPUT/OUTPUT`; seeded: random ordinary-vocabulary ids decoded to text,
then trimmed until the chat-templated prompt tokenizes to the target length with the
core's own tokenizer and template) and asks for OUTPUT tokens with `ignore_eos` (vLLM's
field), at each concurrency C (1, 16, 64, 256 by default): C requests are always in
flight until the level's requests are done (closed loop, `--rounds` x C requests, at
least --min-requests). Clients are `openai.AsyncOpenAI` streams spread over several
processes so the client side is not the bottleneck.

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

Prefix-heavy runs (issue 27 item 6: many users sharing one long system prompt):
`--shared-prefix TOKENS` opens every request of a level with the same system message,
whose rendered turn (template markers included) is exactly TOKENS tokens and whose tokens
are checked to be a prefix of every prompt's, then a user message of its own filling the
rest of the input tokens (`--workload 2304/256 --shared-prefix 2048`: 2,048 shared + 256
of its own, template included). Each level draws a new shared turn, so its first request
finds it in no cache; the warm-up round uses unshared turns. `--prefix-baseline` runs each
level again with a system turn of each request's own (same lengths) and reports
shared/unshared: output tok/s, req/s, TTFT p50, TPOT p50. A TOKENS that leaves no room for
a user message, or a level of one request, is refused (one line, exit 2).

Prefix reuse per level (every run, shared or not; JSON `prefix_reuse` and the table):
    hit%       /metrics: helios_prefix_cache_hit_tokens over helios_prompt_tokens between
               a snapshot taken once every client process has sent its warm-up requests
               and one taken once the counters settle after the level (reused prompt
               tokens: complete pages and exact-endpoint snapshots; a preempted request's
               readmission counts again)
    cached%    usage.prompt_tokens_details.cached_tokens (OpenAI's field; Helios fills it
               with the request's reused prompt tokens) over usage.prompt_tokens
    max%       with --shared-prefix: the most a request can reuse, of its input tokens:
               floor(common prefix / page_tokens) complete pages (the hash chain), or the
               whole system turn where the core declares a prefix boundary after system
               messages and snapshot rows (an exact-endpoint snapshot there; only requests
               admitted after its capture use it: requests arriving together get the pages).
               JSON `expected` adds first_miss_fraction: the level's first request
               computing the prefix and every other reusing the most it can.

Either serve a core (`--core C --trust PUB --accept NS [--backend cuda] [--max-active M]`:
`helios-serve` as a child process on 127.0.0.1, stopped at the end) or load an already
running server (`--url URL --core C --trust PUB --accept NS`: the core gives the tokenizer
and template). When the server rejects `ignore_eos` (HTTP 400 naming it), the run goes on
without it and records `ignore_eos: false`: outputs may then end early at EOS, and
the tokens actually generated are what is counted.

Run: `uv run python bench/serve_load.py --core X.core --trust X.pub --accept NS
      --workload 128/128 1024/1024 --concurrency 1 16 64 256 --json bench/out/serve_load.json`
-> prints a table per workload and writes JSON. Figures only; never asserted on.
Prefix-heavy (GPU: bench/gpu_device.sh prefix-8b): `... --workload 2304/256 --shared-prefix
2048 --concurrency 64 --rounds 2 --prefix-baseline`. On the CPU (SmolLM2) the same run at
small settings (`--workload 320/16 --shared-prefix 256 --concurrency 4 --rounds 1
--prefix-baseline --no-native`) is a smoke check of the hit rate only: its timings claim
nothing.
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
from typing import NoReturn

import numpy as np
from _report import git_commit, write_json  # bench/ is this script's folder
from server import ServeProcess  # bench/ is this script's folder

REPO = Path(__file__).resolve().parent.parent
# Idle pooled connections are dropped before uvicorn closes them (timeout_keep_alive 5 s):
# reusing one the server is closing fails with a ReadError under load.
KEEPALIVE_S = 2.0


# -- prompts ----------------------------------------------------------------------------------


class PromptMaker:
    """Chat conversations whose templated form is exactly `tokens` tokens long (the server's
    tokenizer and chat template, read from the core), optionally behind a system message.

    Text is random ordinary-vocabulary ids (seeded) decoded, then trimmed by ids until the
    rendered prompt tokenizes to the target length.
    """

    def __init__(self, bootstrap, seed: int):
        from helios_tools.frontend_assets import render_chat

        self._render = lambda messages, generation: render_chat(
            bootstrap.chat_template, messages, add_generation_prompt=generation,
            **bootstrap.template_variables)
        self._tok = bootstrap.tokenizer
        vocab = self._tok.get_vocab()
        # Ordinary ids only: no special or filler tokens (their text re-tokenizes apart).
        self._ids = sorted(i for t, i in vocab.items() if not (t.startswith("<") and
                                                                 t.endswith(">")))
        self._rng = random.Random(seed)
        self._turns: dict[str, list[int]] = {}  # system content -> its system turn's ids
        self.overhead = self._count("")

    def _encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def _count(self, content: str, system: str | None = None) -> int:
        return len(self.prompt_ids(conversation(content, system)))

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """Token ids of `messages` rendered with the generation prompt (what the server
        tokenizes)."""
        return self._encode(self._render(messages, True))

    def system_turn(self, content: str) -> list[int]:
        """Token ids of the system message `content` rendered alone (its turn, no
        generation prompt): the part of a conversation it opens that does not depend on
        what follows (checked by `make`)."""
        if content not in self._turns:
            self._turns[content] = self._encode(self._render(
                [{"role": "system", "content": content}], False))
        return self._turns[content]

    def _fit(self, tokens: int, overhead: int, count) -> str | None:
        """Random text whose `count(text)` is exactly `tokens`, or None (20 draws)."""
        for _ in range(20):
            ids = [self._rng.choice(self._ids) for _ in range(tokens)]
            text = self._tok.decode(ids, skip_special_tokens=True)
            # Re-encoding decoded random ids merges some; trim by ids until it fits.
            ids = self._encode(text)
            n = tokens - overhead
            for _ in range(40):
                content = self._tok.decode(ids[:n], skip_special_tokens=True)
                got = count(content)
                if got == tokens:
                    return content
                n += tokens - got
                if n <= 0 or n > len(ids):
                    break
        return None

    def system(self, tokens: int) -> str:
        """Content of a system message whose rendered turn (template markers included) is
        exactly `tokens` tokens.

        Raises:
            ValueError: `tokens` <= the empty system turn's length, or no such content
                found.
        """
        overhead = len(self.system_turn(""))
        if tokens <= overhead:
            raise ValueError(f"a {tokens}-token system turn: the template's empty system "
                             f"turn alone is {overhead} tokens")
        content = self._fit(tokens, overhead, lambda c: len(self.system_turn(c)))
        if content is None:
            raise ValueError(f"could not build a system turn of exactly {tokens} tokens")
        return content

    def make(self, tokens: int, system: str | None = None) -> str:
        """Content of a user message whose rendered prompt (behind the system message
        `system`, when given) has `tokens` tokens; with `system`, the prompt's ids start
        with `system_turn(system)`.

        Raises:
            ValueError: no such content found (target not longer than the template and
                the system turn), or the system turn does not tokenize apart from the
                user turn.
        """
        overhead = self._count("", system)
        if tokens <= overhead:
            part = f" and a {len(self.system_turn(system))}-token system turn" \
                if system is not None else ""
            raise ValueError(f"{tokens} input tokens <= the {overhead} tokens of the chat "
                             f"template{part} with an empty user message")
        content = self._fit(tokens, overhead, lambda c: self._count(c, system))
        if content is None:
            raise ValueError(f"could not build a prompt of exactly {tokens} tokens")
        if system is not None:
            turn = self.system_turn(system)
            if self.prompt_ids(conversation(content, system))[:len(turn)] != turn:
                raise ValueError("the system turn's tokens are not a prefix of the prompt's")
        return content


def conversation(user: str, system: str | None = None) -> list[dict]:
    """Chat messages: the system message (when given), then the user message."""
    head = [{"role": "system", "content": system}] if system is not None else []
    return head + [{"role": "user", "content": user}]


# -- clients ----------------------------------------------------------------------------------


async def _client_main(url: str, model: str, prompts: list[list[dict]], concurrency: int,
                       max_tokens: int, ignore_eos: bool, start_at: float,
                       ready: mp.Queue) -> list[dict]:
    import httpx
    import openai

    client = openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="bench", max_retries=0,
        http_client=httpx.AsyncClient(timeout=3600.0, trust_env=False,
                                      limits=httpx.Limits(max_connections=concurrency + 4,
                                                          keepalive_expiry=KEEPALIVE_S)))
    queue: asyncio.Queue[list[dict]] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    records: list[dict] = []
    extra = {"ignore_eos": True} if ignore_eos else None

    async def one(messages: list[dict]) -> dict:
        rec = {"sent": time.time(), "first": None, "end": None, "gaps": [], "chunks": 0,
               "completion_tokens": 0, "prompt_tokens": 0, "cached_tokens": None,
               "error": None, "retries": 0}
        try:
            for attempt in range(3):
                try:
                    stream = await client.chat.completions.create(
                        model=model, messages=messages, max_tokens=max_tokens,
                        temperature=0, stream=True, stream_options={"include_usage": True},
                        extra_body=extra)
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
                    details = chunk.usage.prompt_tokens_details  # None where not reported
                    if details is not None and details.cached_tokens is not None:
                        rec["cached_tokens"] = details.cached_tokens
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

    try:
        await asyncio.gather(*(warm() for _ in range(concurrency)))
    finally:  # the caller's metrics snapshot waits for every process's warm-up
        ready.put(None)
    await asyncio.sleep(max(0.0, start_at - time.time()))
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()
    return records


def _client_proc(args: tuple, out: mp.Queue, ready: mp.Queue) -> None:
    out.put(asyncio.run(_client_main(*args, ready)))


def run_level(url: str, model: str, prompts: list[list[dict]], concurrency: int,
              max_tokens: int, ignore_eos: bool, procs: int) -> dict:
    """`concurrency` streams in flight over `procs` client processes until `prompts` (chat
    messages) are done; returns the level's figures, with /metrics' selection once every
    client process has sent its warm-up requests (`metrics_before`: the warm-ups are not the
    level's) and once the level's counters have settled (`metrics_after`)."""
    procs = max(1, min(procs, concurrency))
    ctx = mp.get_context("spawn")
    out, ready = ctx.Queue(), ctx.Queue()
    start_at = time.time() + 2.0 + 0.3 * procs  # every process started and connected
    workers = []
    for k in range(procs):
        share = concurrency // procs + (k < concurrency % procs)
        mine = prompts[k::procs]
        p = ctx.Process(target=_client_proc,
                        args=((url, model, mine, share, max_tokens, ignore_eos, start_at), out,
                              ready))
        p.start()
        workers.append(p)
    for _ in workers:
        ready.get()
    before = metrics_snapshot(url)
    # A process whose warm-up outlasted start_at has begun the level: the snapshot may
    # then hold some of its requests (recorded, not hidden).
    before_late = time.time() > start_at
    records = [r for _ in workers for r in out.get()]
    for p in workers:
        p.join()
    after = settled_metrics(url)
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
    prompt = sum(r["prompt_tokens"] for r in ok)
    reported = [r["cached_tokens"] for r in ok if r["cached_tokens"] is not None]
    cached = sum(reported) if reported else None
    return {
        "concurrency": concurrency, "requests": len(records), "completed": len(ok),
        "errors": sorted({r["error"] for r in records if r["error"]})[:5],
        "wall_s": wall, "output_tokens": tokens, "output_tokens_per_s": tokens / wall,
        "requests_per_s": len(ok) / wall,
        "prompt_tokens_mean": float(np.mean([r["prompt_tokens"] for r in ok])) if ok else None,
        "prompt_tokens": prompt,
        # usage.prompt_tokens_details.cached_tokens (OpenAI's field): None where the server
        # left it out of every response.
        "cached_tokens": cached,
        "cached_fraction": cached / prompt if cached is not None and prompt else None,
        "requests_cached": (sum(1 for r in ok if r["cached_tokens"]) if cached is not None
                            else None),
        # Each completed request's, in send order: who missed, who reused what.
        "cached_tokens_by_send": ([r["cached_tokens"]
                                   for r in sorted(ok, key=lambda r: r["sent"])]
                                  if cached is not None else None),
        "completion_tokens_min_max": ([min(r["completion_tokens"] for r in ok),
                                       max(r["completion_tokens"] for r in ok)] if ok else None),
        "ttft_ms": pct([r["first"] - r["sent"] for r in ok]),
        "tpot_ms": pct(tpot),
        "itl_ms": pct([g for r in ok for g in r["gaps"]]),
        "tokens_per_chunk": tokens / chunks if chunks else None,
        "connection_retries": sum(r["retries"] for r in records),
        "client_processes": procs,
        "metrics_before": before, "metrics_before_late": before_late, "metrics_after": after,
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
    """Selected counters of /metrics (preemptions, prefix-cache queries and hit tokens,
    prompt and prefill tokens, pages published and evicted, snapshot hits, launches,
    decode rows and their padding)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict = {}
    for family in text_string_to_metric_families(_get(url + "/metrics").decode()):
        if any(k in family.name for k in ("preemption", "graph_launch", "generation_tokens",
                                           "prompt_tokens", "requests_finished", "mixed_lanes",
                                           "decode_rows", "decode_padded_rows", "prefix_cache",
                                           "prefill_tokens", "cache_page", "snapshot_hits")):
            for s in family.samples:
                if s.name.endswith("_created"):  # creation times, not counts
                    continue
                label = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[s.name + (f"{{{label}}}" if label else "")] = s.value
    return out


def settled_metrics(url: str, period_s: float = 0.1, limit_s: float = 5.0) -> dict:
    """`metrics_snapshot` once two in a row agree: the server publishes its cache counters
    (prefix hits among them) from the model worker every 20 ms while busy and at once when
    it goes idle, which can come just after the level's last response reached its client.
    After `limit_s` the last snapshot is returned."""
    snap = metrics_snapshot(url)
    deadline = time.time() + limit_s
    while time.time() < deadline:
        time.sleep(period_s)
        again = metrics_snapshot(url)
        if again == snap:
            break
        snap = again
    return snap


def prefix_reuse(before: dict, after: dict) -> dict:
    """The prefix cache between two snapshots: prompt tokens of admitted requests
    (helios_prompt_tokens), those served from the cache instead of computed
    (helios_prefix_cache_hit_tokens: complete pages and exact-endpoint snapshots; a
    preempted request's readmission counts again), lookups, and hit_rate = reused / prompt
    (None when no prompt was admitted or the server lacks the counters)."""
    names = {"prompt_tokens": "helios_prompt_tokens_total",
             "reused_prompt_tokens": "helios_prefix_cache_hit_tokens_total",
             "prefix_queries": "helios_prefix_cache_queries_total"}
    out: dict = {k: (after[n] - before[n] if n in before and n in after else None)
                 for k, n in names.items()}
    prompt, reused = out["prompt_tokens"], out["reused_prompt_tokens"]
    out["hit_rate"] = reused / prompt if prompt and reused is not None else None
    return out


def common_prefix(prompts: list[list[int]]) -> int:
    """Leading token ids every prompt of `prompts` (token id lists, two at least) has in
    common."""
    first, n = prompts[0], min(len(p) for p in prompts)
    for i in range(n):
        if any(p[i] != first[i] for p in prompts):
            return i
    return n


def expected_reuse(bootstrap, common_tokens: int, system_tokens: int | None,
                   input_tokens: int, requests: int) -> dict:
    """What a level's prompts can reuse at most, per request, from the cache.

    Args:
        common_tokens: leading tokens all the level's prompts share (`common_prefix`: a
            shared system turn, then the user turn's opening markers).
        system_tokens: the shared system turn's length, or None (no shared turn).
        input_tokens: each prompt's length.
        requests: the level's requests.

    Complete pages are shared through the hash chain: floor(common / page_tokens) pages.
    A core that declares a prefix boundary after system messages and prepares snapshot
    rows also publishes an exact-endpoint snapshot at the system turn's end (the
    specification, "Attention histories and cache policy"): a request admitted once that
    snapshot is captured (a copy queued when the turn's prefill completes) restores the
    whole turn, unless the server runs with --snapshots 0; requests admitted together
    before it get the pages only. Fractions are of the input tokens: `max_hit_fraction`
    when every request reuses the most it can, `first_miss_fraction` when the level's
    first request computes it and the other `requests - 1` reuse it.
    """
    from helios_serve.frontend.syntax import FrontendMessageRole

    page = bootstrap.contract.model.cache.page_tokens
    aligned = common_tokens // page * page
    snapshot = system_tokens is not None and bootstrap.contract.prepared_snapshots > 0 and any(
        r.role == FrontendMessageRole.SYSTEM
        for r in bootstrap.frontend.syntax.prefix_boundary_rules)
    reusable = max(aligned, system_tokens if snapshot else 0)
    return {"system_turn_tokens": system_tokens, "common_prefix_tokens": common_tokens,
            "page_tokens": page, "page_aligned_tokens": aligned,
            "page_aligned_fraction": aligned / input_tokens,
            "system_turn_snapshot": snapshot, "reusable_tokens": reusable,
            "max_hit_fraction": reusable / input_tokens,
            "first_miss_fraction": reusable * (requests - 1) / (requests * input_tokens)}


def padding_fraction(before: dict, after: dict) -> float | None:
    """Padded rows over all captured rows of the DECODE steps between two snapshots
    (None when none ran or the server predates the counters)."""
    keys = ("helios_decode_rows_total", "helios_decode_padded_rows_total")
    if not all(k in before and k in after for k in keys):
        return None
    rows, padded = (after[k] - before[k] for k in keys)
    return padded / (rows + padded) if rows + padded else None


def timed_level(args, url: str, model: str, served, batch: list[list[dict]], c: int,
                n_in: int, n_out: int, ignore_eos: bool, sharing: str | None) -> dict:
    """One recorded run of a level (profiled when asked), with its decode padding and
    prefix reuse between the snapshots `run_level` took."""
    spy = None
    if args.profile and served is not None:
        from serve_overhead import Profiler  # bench/ is this script's folder

        Path(args.profile).mkdir(parents=True, exist_ok=True)
        name = f"serve_{n_in}_{n_out}_c{c}" + (f"_{sharing}" if sharing else "")
        try:
            spy = Profiler(served.proc.pid, Path(args.profile) / f"{name}.folded")
        except SystemExit as exc:  # no py-spy: the figures still count
            print(f"no profile: {exc}", flush=True)
            args.profile = None
    try:
        level = run_level(url, model, batch, c, n_out, ignore_eos, args.client_procs)
    finally:
        if spy is not None:
            level_profile = spy.stop()
    if spy is not None:
        level["profile"] = level_profile
    before = level.pop("metrics_before")
    level["decode_padding_fraction"] = padding_fraction(before, level["metrics_after"])
    level["prefix_reuse"] = prefix_reuse(before, level["metrics_after"])
    return level


def shared_over_unshared(shared: dict, unshared: dict) -> dict:
    """A level's shared run over its unshared run (same lengths, same concurrency)."""

    def over(a, b):
        return a / b if a is not None and b else None

    return {"concurrency": shared["concurrency"],
            "output_tokens_per_s": over(shared["output_tokens_per_s"],
                                        unshared["output_tokens_per_s"]),
            "requests_per_s": over(shared["requests_per_s"], unshared["requests_per_s"]),
            "ttft_p50": over(shared["ttft_ms"]["p50"], unshared["ttft_ms"]["p50"]),
            "tpot_p50": over(shared["tpot_ms"]["p50"], unshared["tpot_ms"]["p50"]),
            "hit_rate_shared": shared["prefix_reuse"]["hit_rate"],
            "hit_rate_unshared": unshared["prefix_reuse"]["hit_rate"]}


def _fmt(value, spec: str, width: int = 0) -> str:
    return f"{value:>{width}{spec}}" if value is not None else f"{'-':>{width}}"


def print_header(prefix: bool) -> None:
    print((f"{'run':>9}" if prefix else "")
          + f"{'conc':>5}{'reqs':>6}{'out tok/s':>11}{'req/s':>8}{'TTFT p50':>10}"
          f"{'p99':>9}{'TPOT p50':>10}{'p99':>8}{'ITL p50':>9}{'p99':>8}{'tok/chunk':>10}"
          f"{'hit%':>7}{'cached%':>8}" + (f"{'max%':>7}" if prefix else "") + "  (ms)",
          flush=True)


def print_row(level: dict, sharing: str | None, native: bool) -> None:
    """One table row: the level's figures; hit% is /metrics' reused / prompt tokens,
    cached% usage's cached_tokens / prompt_tokens, max% what the shared prefix allows."""
    t, p, i = level["ttft_ms"], level["tpot_ms"], level["itl_ms"]
    reuse = level["prefix_reuse"]
    hit, cached = reuse["hit_rate"], level["cached_fraction"]
    row = ((f"{sharing:>9}" if sharing else "")
           + f"{level['concurrency']:>5}{level['completed']:>6}"
           f"{level['output_tokens_per_s']:>11.1f}{level['requests_per_s']:>8.2f}"
           f"{_fmt(t['p50'], '.1f', 10)}{_fmt(t['p99'], '.1f', 9)}"
           f"{_fmt(p['p50'], '.1f', 10)}{_fmt(p['p99'], '.1f', 8)}"
           f"{_fmt(i['p50'], '.1f', 9)}{_fmt(i['p99'], '.1f', 8)}"
           f"{_fmt(level['tokens_per_chunk'], '.1f', 10)}"
           f"{_fmt(hit * 100 if hit is not None else None, '.1f', 7)}"
           f"{_fmt(cached * 100 if cached is not None else None, '.1f', 8)}")
    if sharing:
        row += _fmt(reuse["expected"]["max_hit_fraction"] * 100, ".1f", 7)
    if native:
        row += (f"   served/native {level['served_over_native']:.2f}, decode/native "
                f"{level['decode_over_native']:.2f}")
    if level["errors"]:
        row += f"  errors: {level['errors']}"
    if level["decode_padding_fraction"] is not None:
        row += f"  decode padding {level['decode_padding_fraction']:.3f}"
    print(row, flush=True)


def refuse(message: str) -> NoReturn:
    """One line on stderr, exit status 2 (a usage error: nothing was started)."""
    print(f"serve_load: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


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
    ap.add_argument("--shared-prefix", type=int, metavar="TOKENS",
                    help="every request of a level opens with the same system message whose "
                         "rendered turn is TOKENS tokens (a new one per level); the user "
                         "message fills the rest of the workload's input tokens")
    ap.add_argument("--prefix-baseline", action="store_true",
                    help="with --shared-prefix: run each level again with a system message "
                         "of its own per request (same lengths) and report shared/unshared")
    ap.add_argument("--native-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", default=str(REPO / "bench" / "out" / "serve_load.json"))
    args = ap.parse_args()
    workloads = [tuple(int(x) for x in spec.split("/")) for spec in args.workload]
    if args.native_child:
        print(json.dumps(native_loop(args.core, args.trust, args.accept, args.backend,
                                     workloads, args.concurrency, args.native_steps,
                                     args.seed)))
        return
    if args.shared_prefix is not None and args.shared_prefix < 1:
        refuse(f"--shared-prefix {args.shared_prefix}: must be a positive token count")
    if args.prefix_baseline and args.shared_prefix is None:
        refuse("--prefix-baseline compares against --shared-prefix TOKENS: give both")
    if args.shared_prefix is not None and min(
            max(args.min_requests, args.rounds * c) for c in args.concurrency) < 2:
        refuse("--shared-prefix needs 2 requests per level at least (--rounds, "
               "--min-requests): one request shares its prefix with nobody")

    from helios_serve.bootstrap import Bootstrap

    bootstrap = Bootstrap.load(args.core, [args.trust], args.accept)
    model = bootstrap.contract.served_id
    prompts = PromptMaker(bootstrap, args.seed)
    if args.shared_prefix is not None:  # refused before anything starts
        try:
            system = prompts.system(args.shared_prefix)
        except ValueError as exc:
            refuse(f"--shared-prefix {args.shared_prefix}: {exc}")
        for spec, (n_in, _) in zip(args.workload, workloads, strict=True):
            try:
                prompts.make(n_in, system)
            except ValueError as exc:
                refuse(f"--shared-prefix {args.shared_prefix} leaves no room for a user "
                       f"message in --workload {spec}: {exc}")
    native = native_in_child(args, workloads) if args.native and not args.url else []
    served = None if args.url else start_server(args, Path(args.json).with_suffix(".server.log"))
    url = args.url or served.url
    result: dict = {"core": str(args.core), "served_id": model, "backend": args.backend,
                    "max_active": args.max_active, "stream_interval": args.stream_interval,
                    "engine_process": args.engine_process,
                    "url_given": bool(args.url),
                    "server_startup_s": served.startup_s if served else None,
                    "template_tokens": prompts.overhead, "native_loop": native,
                    "shared_prefix": args.shared_prefix,
                    "prefix_baseline": args.prefix_baseline,
                    "workloads": [], "commit": git_commit(REPO),
                    "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                             "python": platform.python_version()}}
    prefix = args.shared_prefix

    def unshared(tokens: int) -> list[dict]:
        """A `tokens`-token conversation behind a `prefix`-token system turn of its own."""
        own = prompts.system(prefix)
        return conversation(prompts.make(tokens, own), own)

    try:
        ignore_eos, note = (False, "disabled by --no-ignore-eos") if args.no_ignore_eos \
            else probe_ignore_eos(url, model)
        result["ignore_eos"], result["ignore_eos_probe"] = ignore_eos, note
        for spec in args.workload:
            n_in, n_out = (int(x) for x in spec.split("/"))
            print(f"\n{spec} (input/output tokens), ignore_eos {ignore_eos}"
                  + (f", {prefix}-token shared system turn" if prefix else ""), flush=True)
            print_header(prefix is not None)
            levels: list = []
            workload = {"input_tokens": n_in, "output_tokens": n_out, "levels": levels}
            if args.prefix_baseline:
                workload["shared_over_unshared"] = []
            result["workloads"].append(workload)
            for c in args.concurrency:
                count = max(args.min_requests, args.rounds * c)
                if prefix is None:
                    runs = [(None, [conversation(prompts.make(n_in)) for _ in range(count)])]
                    warm = [conversation(prompts.make(n_in)) for _ in range(c)]
                else:
                    # A new shared system turn per level: the level's first request finds
                    # it in no cache (nor does the warm-up round, whose turns are unshared).
                    shared = prompts.system(prefix)
                    runs = [("shared", [conversation(prompts.make(n_in, shared), shared)
                                        for _ in range(count)])]
                    if args.prefix_baseline:
                        runs.append(("unshared", [unshared(n_in) for _ in range(count)]))
                    warm = [unshared(n_in) for _ in range(c)]
                if args.warmup:  # every graph of the level used once, connections opened
                    run_level(url, model, warm, c, 8, ignore_eos, args.client_procs)
                by_sharing = {}
                for sharing, batch in runs:
                    level = timed_level(args, url, model, served, batch, c, n_in, n_out,
                                        ignore_eos, sharing)
                    if sharing is not None:
                        level["sharing"] = sharing
                        level["prefix_reuse"]["expected"] = expected_reuse(
                            bootstrap, common_prefix([prompts.prompt_ids(m) for m in batch]),
                            prefix if sharing == "shared" else None, n_in, count)
                    ref = next((n for n in native if n["concurrency"] == c and
                                (n["input_tokens"], n["output_tokens"]) == (n_in, n_out)),
                               None)
                    level.update(ratios(level, ref))
                    levels.append(level)
                    by_sharing[sharing] = level
                    write_json(args.json, result)  # each level kept if a later one is cut off
                    print_row(level, sharing, ref is not None)
                if args.prefix_baseline:
                    ratio = shared_over_unshared(by_sharing["shared"], by_sharing["unshared"])
                    workload["shared_over_unshared"].append(ratio)
                    write_json(args.json, result)
                    print(f"{'':>14}shared/unshared: out tok/s x"
                          f"{_fmt(ratio['output_tokens_per_s'], '.2f')}, req/s x"
                          f"{_fmt(ratio['requests_per_s'], '.2f')}, TTFT p50 x"
                          f"{_fmt(ratio['ttft_p50'], '.2f')}, TPOT p50 x"
                          f"{_fmt(ratio['tpot_p50'], '.2f')}", flush=True)
    finally:
        if served is not None:
            served.stop()
        bootstrap.close()
    result["host"]["loadavg_1m"] = os.getloadavg()[0]
    print(f"wrote {write_json(args.json, result)}")


if __name__ == "__main__":
    main()
