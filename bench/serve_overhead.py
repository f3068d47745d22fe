"""Does the serving path keep up with the device? Served tokens/s over the NativeModel loop.

The device is emulated (helios_serve.testing.paced.PacedBackend): each graph launch takes
the step time the H200 measured for that variant (bench/results/gpu_final_smollm2.json,
decode "step_ms" by batch, linear between measured batches; prefill at the 1024-token
chunk's tokens/s, at least one batch-1 decode step), so what this measures is the host:
the real NativeModel (graph selection, shared packing) of the real SmolLM2 core, the real
scheduler, worker, output pipeline (detokenizer) and HTTP server, with every step's
device time spent in `wait` as on the GPU.

    bare     NativeModel.submit/wait decode loop at batch C, step N + 1 submitted before
             waiting for step N (the loop bench/gpu_models.py times on the H200):
             tokens/s = C * steps / wall
    served   the server (a child process: Bootstrap.load -> NativeModel over the paced
             device -> Server.run) driven by C streaming `openai` clients, each sending
             --requests requests back to back (--prompt-tokens prompt of plain text,
             --max-tokens output, greedy; the paced tokens never hit EOS, so every request
             ends at its length limit), client c starting c / C of a request's duration
             after the first so that requests end staggered, not in lockstep:
             steady tokens/s = completion tokens prorated over each request's decode
             interval inside the window where every client is mid-stream; overall
             tokens/s = all completion tokens / wall (ramp-up and -down included);
             device_busy = emulated device seconds launched / wall (1.0 = never idle);
             server CPU = the child's user + system CPU seconds / wall
    ratio    served steady / bare (target >= 0.9 at C = 1, 8, 32; issue 17)

--ttft measures the chat path's first-token floor instead (`ttft_floor`): bench/snapshots.py's
multi-turn chat on the same paced server, a kept-alive client against a new client per
request, the server's own submission -> first token time, and the scheduler + NativeModel
in process (no HTTP).

--profile samples the server with py-spy during each measured level and prints, per
thread, the busiest frames (inclusive and self); the folded stacks stay in bench/out/.
With --profile-gil only the thread holding the GIL is sampled: the level then records
each thread's GIL-held microseconds per served token (`gil_us_per_token`), the figure
that bounds one server process (both threads share one GIL).

Every level records the server's CPU per served token by thread (worker, HTTP loop,
preparation, other), tokens per device launch, the worker's CPU per launch and the
loop's CPU per SSE event. On a starved host the client reads slowly and fewer requests
are live, so the per-step cost spreads over fewer tokens: `--clients-per-slot 2` (C
slots, 2C clients: C requests wait in the server's queue) keeps C rows in every step,
`--client raw` reads bytes instead of parsing every chunk with the openai package, and a
larger `--scale` leaves the host time to spare, so CPU per token is compared at the same
batch (bench/serve_overhead_summary.py takes the medians of repeated runs).

Run: `uv run python bench/serve_overhead.py [--quick] [--json bench/out/serve_overhead.json]`
(exports bench/out/serve_cpu.core once when absent, or takes --core/--trust/--accept).
Needs no GPU: on the GPU machine it measures that host's CPU (bench/gpu_device.sh
serve-smollm2). Figures only; never asserted on. On a shared 2-core host the client
process competes with the server for CPU: its CPU seconds are recorded beside each level,
and wall-clock ratios there say more about the other tenants than about the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from _report import git_commit, write_json  # bench/ is this script's folder

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
OUT = BENCH / "out"
CORE = OUT / "serve_cpu.core"
KEY = OUT / "serve_cpu-publisher.key"
NAMESPACE = "helios.bench/serve"
RECIPE = REPO / "recipes" / "smollm2_135m_instruct.py"
DEVICE_JSON = BENCH / "results" / "gpu_final_smollm2.json"
TARGET_RATIO = 0.9
# Idle pooled connections are dropped before uvicorn closes them (timeout_keep_alive 5 s):
# reusing one the server is closing fails with a ReadError under load.
KEEPALIVE_S = 2.0
PROFILE_HZ = 500  # py-spy samples per second
FIRST_CONTENT = re.compile(rb'"delta":\{"content":"[^"]')  # a non-empty content delta

TEXT = (
    "The printing press changed how knowledge moved through Europe. Before it, books were "
    "copied by hand, slowly and at great cost, and few people could read them. Within fifty "
    "years of the first presses, millions of volumes were in circulation, and cities "
    "competed to attract printers. Scholars could compare the same edition of a text, "
    "errors stopped multiplying with every copy, and new ideas in science, religion and "
    "politics reached readers far from where they were written. "
)


# -- the emulated device -------------------------------------------------------------------


def device_step_table(path: Path, scale: float) -> dict:
    """Measured H200 step times: decode ms by batch, prefill tokens/s (JSON of gpu_models)."""
    d = json.loads(path.read_text())
    decode = {int(e["batch"]): float(e["step_ms"]) * scale for e in d["decode"]}
    prefill = float(d["prefill"]["chunk1024"]["tokens_per_s"]) / scale
    return {"source": str(path.relative_to(REPO)), "scale": scale, "decode_ms": decode,
            "prefill_tokens_per_s": prefill, "device": d.get("device")}


def step_seconds(contract, table: dict):
    """graph name -> emulated device seconds of one step of that variant."""
    from helios_contract.schema import contract_pb2 as cpb

    batches = sorted(table["decode_ms"])
    ms = [table["decode_ms"][b] for b in batches]
    floor_s = ms[0] / 1e3
    by_name = {}
    for g in contract.model.graphs:
        if g.operation == cpb.OPERATION_DECODE:
            by_name[g.name] = float(np.interp(g.batch_capacity, batches, ms)) / 1e3
        else:
            by_name[g.name] = max(floor_s, g.token_capacity / table["prefill_tokens_per_s"])
    return by_name.__getitem__, by_name


def text_token_ids(tokenizer) -> list[int]:
    return tokenizer.encode(TEXT * 4, add_special_tokens=False).ids


def prompt_text(tokenizer, index: int, tokens: int) -> str:
    """A user message of `tokens` tokens; `index` leads it (no shared prefix pages)."""
    ids = tokenizer.encode(f"Request {index}: summarize this. " + TEXT * (1 + tokens // 60),
                           add_special_tokens=False).ids
    return tokenizer.decode(ids[:tokens])


# -- the server child --------------------------------------------------------------------------


def serve_child(args) -> None:
    """Child process: serve the core over the paced device; answer 'stats' lines on stdin
    with one JSON line (emulated device seconds, steps) on stdout."""
    from helios_serve.bootstrap import Bootstrap
    from helios_serve.clock import ObservationClock
    from helios_serve.config import ServeOptions, resolve
    from helios_serve.server import Server
    from helios_serve.testing.paced import (
        PacedEngineModel,
        backend_stats,
        paced_model,
        thread_cpu_s,
    )

    bootstrap = Bootstrap.load(args.core, [args.trust], args.accept)
    options = ServeOptions(port=0, max_active=args.max_active,
                           queue_capacity=args.max_active * 4,
                           stream_interval=args.stream_interval,
                           engine_process=args.engine_process == "on")
    settings = resolve(options, bootstrap.contract)
    step_s, by_name = step_seconds(bootstrap.contract, device_step_table(DEVICE_JSON, args.scale))
    clock = ObservationClock()
    token_ids = text_token_ids(bootstrap.tokenizer)
    if options.engine_process:  # the paced model in the engine process; its stats there
        from helios_serve.engine_client import EngineClient
        from helios_serve.wire import EngineSpec

        # A directory of its own: bench/out/ need not exist (--core given elsewhere, as on
        # the GPU machine), and a short path keeps under AF_UNIX's 107 bytes.
        stats_dir = tempfile.mkdtemp(prefix="helios-paced-")
        stats_path = os.path.join(stats_dir, "stats.sock")
        try:
            engine = EngineClient.spawn(EngineSpec(
                str(args.core), [str(args.trust)], args.accept, options, None,
                clock.origin_ns, model_factory=PacedEngineModel(by_name, token_ids,
                                                                stats_path)))
            stats_sock = socket.socket(socket.AF_UNIX)
            stats_sock.connect(stats_path)  # bound by the engine before it reported ready
        finally:
            shutil.rmtree(stats_dir, ignore_errors=True)
        server = Server(bootstrap, None, settings, clock, engine=engine)
        engine_pid = engine.pid
        engine_stats = stats_sock.makefile("rw")

        def stats() -> dict:
            engine_stats.write("stats\n")
            engine_stats.flush()
            out = json.loads(engine_stats.readline())
            for role, cpu in thread_cpu_s().items():  # http_loop, prepare, other here
                out["thread_cpu_s"][role] = out["thread_cpu_s"].get(role, 0.0) + cpu
            return out
    else:
        model = paced_model(bootstrap.core, step_s, token_ids,
                            max_concurrency=settings.max_active)
        server = Server(bootstrap, model, settings, clock)
        engine_pid = 0

        def stats() -> dict:
            return backend_stats(model.backend)

    def answer() -> None:
        for line in sys.stdin:
            if line.strip() == "stats":
                print(json.dumps(stats()), flush=True)

    threading.Thread(target=answer, daemon=True).start()
    print(f"serving at {server.url} engine {engine_pid}", flush=True)
    server.run()


class Child:
    """The server child process and its stats channel."""

    def __init__(self, core: Path, trust: Path, accept: str, max_active: int, scale: float,
                 stream_interval: int = 1, engine_process: str = "off"):
        argv = [sys.executable, __file__, "--child", "--core", str(core), "--trust", str(trust),
                "--accept", accept, "--max-active", str(max_active), "--scale", str(scale),
                "--stream-interval", str(stream_interval), "--engine-process", engine_process]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)
        line = self.proc.stdout.readline()
        if not line.startswith("serving at "):
            self.proc.kill()
            raise SystemExit(f"the server child failed to start: {line!r}")
        self.url = line.split()[2]
        self.engine_pid = int(line.split()[-1])  # 0: one process

    def stats(self) -> dict:
        self.proc.stdin.write("stats\n")
        return json.loads(self.proc.stdout.readline())

    def cpu_s(self) -> float:
        """The server's CPU seconds: this child's, plus its engine process's."""
        total = 0.0
        for pid in (self.proc.pid, self.engine_pid):
            if pid:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(2)  # SIGINT: the server drains, then exits
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def py_spy() -> str:
    """The py-spy binary: beside this interpreter, on PATH, or in a `bin/` beside an import
    path (pip --target installs, as on the GPU machine)."""
    candidates = [Path(sys.executable).parent / "py-spy"]
    found = shutil.which("py-spy")
    if found:
        candidates.append(Path(found))
    candidates += [Path(p) / "bin" / "py-spy" for p in sys.path if p]
    for c in candidates:
        if c.is_file():
            return str(c)
    raise SystemExit("py-spy not found (dev dependency; on the GPU machine: bench/gpu_wheels.txt)")


class Profiler:
    """py-spy sampling the server child (all threads, without pausing it) into a folded-
    stacks file; `stop` prints the heaviest frames of each thread."""

    def __init__(self, pid: int, path: Path, gil: bool = False):
        self.path = path
        self.proc = subprocess.Popen([py_spy(), "record", "--pid", str(pid), "--rate", str(PROFILE_HZ),
                                      "--threads", "--format", "raw", *(["--gil"] if gil else []),
                                      "-o", str(path)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attach before the level starts

    def stop(self, top: int = 25) -> dict:
        """Stop sampling; print and return the per-thread summary ({} when py-spy failed)."""
        self.proc.send_signal(2)
        self.proc.wait(30)
        if not self.path.is_file():
            print(f"py-spy wrote no profile (exit {self.proc.returncode}; ptrace allowed?)")
            return {}
        return summarize_profile(self.path, top)


# Runner.run: uvloop's loop waits in native code under asyncio's runner frame.
IDLE_LEAVES = ("PacedBackend.wait", "EpollSelector.select", "Runner.run (", "Condition.wait", "_worker (",
               "serve_child.<locals>.answer", "Event.wait")


def summarize_profile(path: Path, top: int = 20) -> dict:
    """Per thread: busy samples (leaf not a wait) and the heaviest frames by inclusive and
    by self samples. Returns the same as a dict (recorded in the JSON)."""
    threads: dict[str, dict] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        name = frames[0].split(": ", 1)[-1]
        t = threads.setdefault(name, {"samples": 0, "busy": 0, "incl": {}, "self": {}})
        n = int(count)
        t["samples"] += n
        if any(frames[-1].startswith(w) for w in IDLE_LEAVES):
            continue
        t["busy"] += n
        t["self"][frames[-1]] = t["self"].get(frames[-1], 0) + n
        for f in set(frames[1:]):
            t["incl"][f] = t["incl"].get(f, 0) + n
    out = {}
    print(f"profile {path} (busy = samples whose leaf is not a wait)")
    for name, t in sorted(threads.items(), key=lambda kv: -kv[1]["busy"]):
        if not t["busy"]:
            continue
        busy = t["busy"]
        incl = sorted(t["incl"].items(), key=lambda kv: -kv[1])
        incl = [(f, n) for f, n in incl if "threading.py" not in f and "asyncio/" not in f][:top]
        selfs = sorted(t["self"].items(), key=lambda kv: -kv[1])[:top]
        print(f"  {name}: {busy} busy of {t['samples']} samples")
        for f, n in incl:
            print(f"    incl {n / busy:6.1%}  {f}")
        for f, n in selfs[:10]:
            print(f"    self {n / busy:6.1%}  {f}")
        out[name] = {"busy": busy, "samples": t["samples"],
                     "inclusive": {f: n / busy for f, n in incl},
                     "self": {f: n / busy for f, n in selfs}}
    return out


# -- measurements -------------------------------------------------------------------------------


def bare_loop(core, step_s, token_ids, batch: int, steps: int) -> dict:
    """NativeModel decode loop over the paced device, one step submitted ahead."""
    from helios_serve.engine.plan import (
        PENDING_PLACEHOLDER,
        RowPlan,
        SamplingParams,
        StepKind,
        StepPlan,
    )
    from helios_serve.testing.paced import paced_model

    model = paced_model(core, step_s, token_ids, max_concurrency=batch)
    pages = model.manifests.max_pages_per_request

    def plan(position: int) -> StepPlan:
        return StepPlan(StepKind.DECODE, tuple(
            RowPlan(request_id=s, slot=s, generation=1, tokens=(PENDING_PLACEHOLDER,),
                    start_position=position, page_ids=tuple(range(s * pages,
                                                                  s * pages + position // 16 + 1)),
                    sample=True, sampling=SamplingParams()) for s in range(batch)))

    host_s = []
    started = time.perf_counter()
    pending = model.submit(plan(140))
    for i in range(1, steps):
        t = time.perf_counter()
        ahead = model.submit(plan(140 + i))
        host_s.append(time.perf_counter() - t)
        model.wait(pending)
        pending = ahead
    model.wait(pending)
    wall = time.perf_counter() - started
    model.close()
    return {"batch": batch, "steps": steps, "tokens_per_s": batch * steps / wall,
            "step_ms": wall / steps * 1e3, "submit_us_median": float(np.median(host_s)) * 1e6}


async def served_level(child: Child, model: str, prompts: list[str], concurrency: int,
                       requests: int, max_tokens: int, request_s: float,
                       raw_client: bool = False) -> dict:
    """C clients, each sending `requests` streaming requests back to back, client c
    starting c / C of one request's duration (`request_s`) after the first, so requests
    end at staggered times as in steady serving, not in lockstep. Device and CPU figures
    cover the same wall-clock window.

    steady tokens/s: the tokens of every request prorated over its decode interval (first
    content chunk to last chunk) inside [start + request_s, end - request_s], where every
    client is mid-stream; overall tokens/s: all completion tokens over the whole wall.
    """
    import httpx
    import openai

    http = httpx.AsyncClient(timeout=600.0, trust_env=False,
                             limits=httpx.Limits(max_connections=concurrency + 8,
                                                 keepalive_expiry=KEEPALIVE_S))
    client = openai.AsyncOpenAI(base_url=f"{child.url}/v1", api_key="bench", max_retries=0,
                                http_client=http)
    spans: list[tuple[float, float, int, int]] = []  # first chunk, last chunk, tokens, chunks

    retries = 0

    async def one(index: int) -> None:
        if raw_client:
            await one_raw(index)
            return
        nonlocal retries
        for attempt in range(3):
            try:
                stream = await client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": prompts[index]}],
                    max_tokens=max_tokens, temperature=0, stream=True,
                    stream_options={"include_usage": True})
                break
            except openai.APIConnectionError:  # before any byte of the response: resend
                if attempt == 2:
                    raise
                retries += 1
        tokens = n = 0
        first = last = 0.0
        async for chunk in stream:
            n += 1
            last = time.perf_counter()
            if chunk.choices and chunk.choices[0].delta.content and not first:
                first = last
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        spans.append((first or last, last, tokens, n))

    async def one_raw(index: int) -> None:
        """The same request read as bytes: SSE events counted, the first non-empty content
        delta found by a byte pattern, the usage chunk alone parsed (a fraction of the
        openai client's CPU per chunk, so that a starved host still reads at the served
        rate)."""
        nonlocal retries
        body = {"model": model, "messages": [{"role": "user", "content": prompts[index]}],
                "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        for attempt in range(3):
            try:
                async with http.stream("POST", f"{child.url}/v1/chat/completions",
                                       json=body) as response:
                    n, first, last, tail = 0, 0.0, 0.0, b""
                    async for data in response.aiter_raw():
                        last = time.perf_counter()
                        n += data.count(b"data: ")
                        if not first and FIRST_CONTENT.search(data):
                            first = last
                        tail = (tail + data)[-4096:]
                break
            except httpx.TransportError:
                if attempt == 2 or n:
                    raise
                retries += 1
        usage = [e for e in tail.split(b"\n\n") if b'"usage":{' in e][-1]
        tokens = json.loads(usage[len(b"data: "):])["usage"]["completion_tokens"]
        spans.append((first or last, last, tokens, n))

    async def client_loop(c: int) -> None:
        await asyncio.sleep(c * request_s / concurrency)
        for r in range(requests):
            await one(c * requests + r)

    before, cpu0, client0 = child.stats(), child.cpu_s(), sum(os.times()[:2])
    started = time.perf_counter()
    await asyncio.gather(*(client_loop(c) for c in range(concurrency)))
    ended = time.perf_counter()
    after, cpu1, client1 = child.stats(), child.cpu_s(), sum(os.times()[:2])
    await client.close()
    wall = ended - started
    tokens = sum(t for _, _, t, _ in spans)
    threads = {role: (cpu - before["thread_cpu_s"].get(role, 0.0)) / tokens * 1e6
               for role, cpu in after["thread_cpu_s"].items()}
    lo, hi = started + request_s, ended - request_s
    steady = None
    if hi > lo:
        inside = sum(t * max(0.0, min(b, hi) - max(a, lo)) / (b - a)
                     for a, b, t, _ in spans if b > a)
        steady = inside / (hi - lo)
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "steady_window_s": max(0.0, hi - lo), "steady_tokens_per_s": steady,
            "sse_chunks_per_request": float(np.mean([n for *_, n in spans])),
            "connection_retries": retries,
            "device_busy": (after["device_busy_s"] - before["device_busy_s"]) / wall,
            "launches": after["launches"] - before["launches"],
            "queued_launches": after["queued"] - before["queued"],
            "idle_s_before_graph": {k: v - before["idle_s"].get(k, 0.0)
                                    for k, v in after["idle_s"].items()},
            "server_cpu_per_wall": (cpu1 - cpu0) / wall,
            "server_cpu_us_per_token": (cpu1 - cpu0) / tokens * 1e6,
            "thread_cpu_us_per_token": threads,
            # Occupancy-free views (a starved client keeps fewer requests live, and the
            # per-step cost then spreads over fewer tokens): tokens per device launch, the
            # worker's CPU per launch, the loop's CPU per SSE event read.
            "tokens_per_launch": tokens / max(1, after["launches"] - before["launches"]),
            "worker_cpu_us_per_launch": threads.get("worker", 0.0) * tokens
            / max(1, after["launches"] - before["launches"]),
            "loop_cpu_us_per_sse_event": threads.get("http_loop", 0.0) * tokens
            / max(1, sum(n for *_, n in spans)),
            "client_cpu_per_wall": (client1 - client0) / wall}


def served_and_ratio(args, core_path: Path, trust: Path, accept: str, served_id: str,
                     prompts: list[str], c: int, bare: dict, interval: int,
                     engine: str = "off") -> dict:
    """One served level (a fresh server child with --stream-interval `interval`, the model
    worker in an engine process when `engine` is "on") against the NativeModel loop's
    figures `bare`."""
    child = Child(core_path, trust, accept, c, args.scale, interval, engine)
    spy = None
    try:  # one unrecorded round first: every graph the level uses, connections opened
        asyncio.run(served_level(child, served_id, prompts[:c], c, 1, 8, 0.0))
        if args.profile:
            spy = Profiler(child.proc.pid, OUT / f"serve_overhead_c{c}_i{interval}.folded",
                           gil=args.profile_gil)
        request_s = args.max_tokens * bare["step_ms"] / 1e3
        clients = c * args.clients_per_slot
        served = asyncio.run(served_level(child, served_id, prompts[c:], clients, args.requests,
                                          args.max_tokens, request_s,
                                          raw_client=args.client == "raw"))
    except Exception as exc:  # recorded; the other levels still run
        print(f"C={c:>3}  failed: {type(exc).__name__}: {exc}", flush=True)
        return {"concurrency": c, "stream_interval": interval, "engine_process": engine,
                "bare": bare, "error": f"{type(exc).__name__}: {exc}"[:300]}
    finally:
        profile = spy.stop() if spy is not None else None
        child.stop()
    steady = served["steady_tokens_per_s"]
    if profile:
        served["profile"] = profile
        if args.profile_gil:  # samples of the GIL-holding thread only: GIL seconds per token
            served["gil_us_per_token"] = {name: t["samples"] / PROFILE_HZ / served["tokens"] * 1e6
                                          for name, t in profile.items()}
    level = {"concurrency": c, "clients": clients, "stream_interval": interval,
             "engine_process": engine, "bare": bare, "served": served,
             "ratio": steady / bare["tokens_per_s"] if steady else None,
             "overall_ratio": served["tokens_per_s"] / bare["tokens_per_s"]}
    shown = f"{level['ratio']:.2f}" if steady else "n/a"
    print(f"C={c:>3} i={interval} engine={engine:<3}  bare {bare['tokens_per_s']:>7.0f} tok/s   "
          f"served steady "
          f"{steady or 0:>7.0f} overall {served['tokens_per_s']:>7.0f} tok/s   ratio "
          f"{shown} (overall {level['overall_ratio']:.2f})   device busy "
          f"{served['device_busy']:.2f}   server CPU {served['server_cpu_per_wall']:.2f} "
          f"({served['server_cpu_us_per_token']:.0f} us/token: worker "
          f"{served['thread_cpu_us_per_token'].get('worker', 0):.0f}, loop "
          f"{served['thread_cpu_us_per_token'].get('http_loop', 0):.0f})   client CPU "
          f"{served['client_cpu_per_wall']:.2f}   SSE chunks/request "
          f"{served['sse_chunks_per_request']:.0f}   tokens/launch "
          f"{served['tokens_per_launch']:.1f}   worker/launch "
          f"{served['worker_cpu_us_per_launch']:.0f} us   loop/event "
          f"{served['loop_cpu_us_per_sse_event']:.0f} us", flush=True)
    return level


def measure(args, core_path: Path, trust: Path, accept: str) -> dict:
    from helios_serve.bootstrap import Bootstrap

    bootstrap = Bootstrap.load(core_path, [trust], accept)
    table = device_step_table(DEVICE_JSON, args.scale)
    step_s, by_name = step_seconds(bootstrap.contract, table)
    token_ids = text_token_ids(bootstrap.tokenizer)
    served_id = bootstrap.contract.served_id
    levels = []
    for c in args.concurrency:
        bare = bare_loop(bootstrap.core, step_s, token_ids, c, args.bare_steps)
        prompts = [prompt_text(bootstrap.tokenizer, c * 10_000 + i, args.prompt_tokens)
                   for i in range(c + c * args.clients_per_slot * args.requests)]
        modes = ["off", "on"] if args.engine_process == "both" else [args.engine_process]
        for _ in range(args.repeats):  # both modes alternated: a shared host drifts
            for interval in args.stream_intervals:
                for engine in modes:
                    levels.append(served_and_ratio(args, core_path, trust, accept, served_id,
                                                   prompts, c, bare, interval, engine))
    bootstrap.close()
    return {"device": table, "step_ms_by_graph": {k: v * 1e3 for k, v in by_name.items()},
            "levels": levels}


# -- TTFT: the chat path's first-token floor ------------------------------------------------


def chat_turns(sentences: int, turns: int) -> tuple[str, list[str]]:
    """bench/snapshots.py's conversation: its ~1,000-token system prompt and questions."""
    from snapshots import QUESTIONS, system_prompt  # bench/ is this script's folder

    return system_prompt(0, sentences), [QUESTIONS[i % len(QUESTIONS)] for i in range(turns)]


def _stream_turn(client, url: str, model: str, messages: list[dict],
                 max_tokens: int) -> tuple[float, str]:
    """One streamed greedy chat request: (perf_counter at the first content chunk, text)."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}
    first, text = None, []
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices") or []:
                piece = choice.get("delta", {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
    return first or time.perf_counter(), "".join(text)


def _server_ttft(client, url: str) -> tuple[float, float]:
    """(sum, count) of the server's helios_time_to_first_token_seconds histogram."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    for family in text_string_to_metric_families(client.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name in ("helios_time_to_first_token_seconds_sum",
                               "helios_time_to_first_token_seconds_count"):
                found[sample.name.rsplit("_", 1)[1]] = sample.value
    return found.get("sum", 0.0), found.get("count", 0.0)


def ttft_floor(args, core_path: Path, trust: Path, accept: str) -> dict:
    """Where a chat turn's first token goes, on the paced device (H200 step times).

    bench/snapshots.py's multi-turn chat (a ~1,000-token system prompt, turn N's prompt =
    turn N - 1's prompt + its answer + a question; max_tokens 16, greedy, streamed; prefix
    pages reused, so each turn prefills ~20-40 tokens) against the server child (max-active
    1), alternating two clients turn by turn:
        kept_alive   one httpx.Client for every turn (an OpenAI client keeps its
                     connection)
        new_client   httpx.stream() per turn: a new client (its TLS context) and
                     connection inside the timed request (bench/snapshots.py until 0431f90)
    then the same prompts (token ids as the server tokenized them: the chat template over
    the same messages) through the scheduler + NativeModel of the same paced device in this
    process (testing.serial.Serial: no HTTP, no preparation): TTFT = add -> first token.
    The server's own TTFT (its helios_time_to_first_token_seconds: submission to the
    worker -> first token) splits the HTTP figure into the worker's part and the rest
    (HTTP parsing, preparation: template + tokenizer, delivery).
    """
    import httpx
    from helios_serve.bootstrap import Bootstrap
    from helios_serve.testing.paced import paced_model
    from helios_serve.testing.serial import Serial
    from helios_tools.frontend_assets import render_chat

    bootstrap = Bootstrap.load(core_path, [trust], accept)
    tok = bootstrap.tokenizer
    system, questions = chat_turns(args.ttft_sentences, 2 * args.ttft_turns)
    child = Child(core_path, trust, accept, 1, args.scale)
    model = bootstrap.contract.served_id
    kept = httpx.Client(timeout=600.0, trust_env=False)
    turns, prompts = [], []
    try:
        messages = [{"role": "system", "content": system}]
        for i, q in enumerate(questions):
            messages.append({"role": "user", "content": q})
            mode = "kept_alive" if i % 2 else "new_client"
            m0 = _server_ttft(kept, child.url)
            sent = time.perf_counter()
            if mode == "kept_alive":
                first, reply = _stream_turn(kept, child.url, model, messages, args.ttft_tokens)
            else:
                with httpx.Client(timeout=600.0, trust_env=False) as fresh:
                    first, reply = _stream_turn(fresh, child.url, model, messages,
                                                args.ttft_tokens)
            ttft_s = first - sent
            m1 = _server_ttft(kept, child.url)
            server_s = (m1[0] - m0[0]) / max(1, m1[1] - m0[1])
            prompt = render_chat(bootstrap.chat_template, messages, add_generation_prompt=True,
                                 **bootstrap.template_variables)
            prompts.append(tok.encode(prompt, add_special_tokens=False).ids)
            turns.append({"turn": i + 1, "mode": mode, "prompt_tokens": len(prompts[-1]),
                          "ttft_ms": ttft_s * 1e3, "server_ttft_ms": server_s * 1e3})
            messages.append({"role": "assistant", "content": reply})
    finally:
        kept.close()
        child.stop()
    step_s, _ = step_seconds(bootstrap.contract, device_step_table(DEVICE_JSON, args.scale))
    run = Serial(paced_model(bootstrap.core, step_s, text_token_ids(tok), max_concurrency=1),
                 logits=False)
    for t, prompt in zip(turns, prompts, strict=True):
        run.add(t["turn"], prompt, args.ttft_tokens)
        run.run()
        t["in_process_ttft_ms"] = run.ttft_s(t["turn"]) * 1e3
    run.model.close()
    bootstrap.close()
    later = [t for t in turns if t["turn"] > 2]

    def median(mode: str | None, key: str) -> float:
        return float(np.median([t[key] for t in later if mode is None or t["mode"] == mode]))

    out = {"turns": turns, "system_sentences": args.ttft_sentences,
           "max_tokens": args.ttft_tokens,
           "median_ms": {"new_client": median("new_client", "ttft_ms"),
                         "kept_alive": median("kept_alive", "ttft_ms"),
                         "server_ttft": median("kept_alive", "server_ttft_ms"),
                         "in_process": median(None, "in_process_ttft_ms")}}
    m = out["median_ms"]
    print(f"TTFT (turns 3..N, median): new client {m['new_client']:.1f} ms, kept-alive "
          f"{m['kept_alive']:.1f} ms (server submission -> first token {m['server_ttft']:.1f} "
          f"ms), in process {m['in_process']:.1f} ms", flush=True)
    return out


def ensure_core() -> tuple[Path, Path]:
    """bench/out/serve_cpu.core (SmolLM2, the recipe's default weights), exported in this
    process when absent, with its publisher key."""
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--bare-steps", type=int, default=400)
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply the measured device step times (a slower device)")
    ap.add_argument("--quick", action="store_true", help="1 request per client, 64 tokens")
    ap.add_argument("--profile", action="store_true",
                    help="py-spy the server during each level (bench/out/*.folded)")
    ap.add_argument("--profile-gil", action="store_true",
                    help="with --profile: sample only the thread holding the GIL (py-spy --gil)")
    ap.add_argument("--client", choices=["openai", "raw"], default="openai",
                    help="streaming client: the openai package (parses every chunk) or raw "
                         "httpx bytes (counts events, parses the usage chunk only)")
    ap.add_argument("--clients-per-slot", type=int, default=1,
                    help="streaming clients per model slot (--max-active stays C): with 2, C "
                         "requests wait in the server's queue, so every step runs C rows "
                         "however slowly a starved client reads (CPU per token at full batch)")
    ap.add_argument("--label", default="", help="recorded in the JSON (e.g. before/after)")
    ap.add_argument("--json", default=str(OUT / "serve_overhead.json"))
    ap.add_argument("--core", help="a SmolLM2 core to serve (default: bench/out/serve_cpu.core, "
                    "exported when absent); its kernels are not run")
    ap.add_argument("--trust", help="its publisher's public key (with --core)")
    ap.add_argument("--accept", help="its publisher namespace (with --core)")
    ap.add_argument("--ttft", action="store_true",
                    help="measure the chat TTFT floor (ttft_floor) instead of throughput")
    ap.add_argument("--ttft-turns", type=int, default=10, help="turns per client mode")
    ap.add_argument("--ttft-sentences", type=int, default=60,
                    help="system prompt sentences (60: ~944 SmolLM2 tokens)")
    ap.add_argument("--ttft-tokens", type=int, default=16, help="max_tokens per turn")
    ap.add_argument("--stream-intervals", type=int, nargs="+", default=[1],
                    help="serve each level once per helios-serve --stream-interval given")
    ap.add_argument("--stream-interval", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--engine-process", choices=["off", "on", "both"], default="off",
                    help="serve with helios-serve --engine-process (on), without (off), or "
                         "each level both ways, alternated (both)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="measured runs of every level (and mode); medians in the summary")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--max-active", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        serve_child(args)
        return
    if args.quick:
        args.requests, args.max_tokens, args.bare_steps = 3, 64, 100
    if args.core:
        if not (args.trust and args.accept):
            raise SystemExit("--core needs --trust and --accept")
        core, trust, accept = Path(args.core), Path(args.trust), args.accept
    else:
        (core, trust), accept = ensure_core(), NAMESPACE
    load_before = os.getloadavg()[0]
    figures = ({"ttft": ttft_floor(args, core, trust, accept)} if args.ttft
               else measure(args, core, trust, accept))
    commit = git_commit(REPO)
    result = {"label": args.label, "commit": commit, "quick": args.quick, "client": args.client,
              "requests_per_client": args.requests, "prompt_tokens": args.prompt_tokens,
              "max_tokens": args.max_tokens, "target_ratio": TARGET_RATIO, **figures,
              "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                       "python": platform.python_version(),
                       "loadavg_1m_before": load_before, "loadavg_1m_after": os.getloadavg()[0]}}
    print(f"wrote {write_json(args.json, result)}")


if __name__ == "__main__":
    main()
