"""helios-serve on the CPU backend, measured from an HTTP client, and against the bare loop.

Starts the real server (`helios-serve CORE --trust PUB --accept NS --port 0`) as a child
process on 127.0.0.1, waits for /health, then measures with real streaming requests
(httpx, SSE, temperature 0, `return_token_ids` so every generated token arrives in its
own chunk and is timed on arrival at the client):

    levels     C closed-loop clients (C = 1, 4, 16), each sending fixed long-form prompts
               with max_tokens M: TTFT (send -> first token chunk) and ITL (gap between
               consecutive token chunks of one request), median and p90, and output
               tokens/s = completion tokens (from usage) / wall time of the level
    prefix     a ~512-token system prompt: cold = the first request with a new system
               prompt, warm = later requests sharing it (usage.prompt_tokens_details
               .cached_tokens reported beside each TTFT)
    ratio      single-stream decode tokens/s of the server (1 / median ITL) over the
               CPU backend's bare decode loop (`Driver(load_native(core, "cpu"))`,
               same prompt ids, same token count, batch 1, 1 / median decode-step time);
               server and bare rounds alternate one for one so host load hits both
               alike. Target >= 0.9.

The core is exported into bench/out/ when absent (recipe default weights, a local key),
unless --core/--trust/--accept name one. Server output goes to bench/out/
serve_cpu.server.log; the server is stopped (SIGINT, then SIGKILL) however the run ends.

Run: `cd /work/main && uv run python bench/serve_cpu.py [--quick]` -> prints a table and
writes bench/out/serve_cpu.json. Figures only; never asserted on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from _report import write_json  # bench/ is this script's folder
from server import ServeProcess  # bench/ is this script's folder

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
OUT = BENCH / "out"
CORE = OUT / "serve_cpu.core"
KEY = OUT / "serve_cpu-publisher.key"
NAMESPACE = "helios.bench/serve"
RECIPE = REPO / "recipes" / "smollm2_135m_instruct.py"
SERVER_LOG = OUT / "serve_cpu.server.log"
TARGET_RATIO = 0.9

PROMPTS = [
    "Write a long, detailed essay on the history of the printing press and its effects.",
    "Explain in depth how a modern CPU executes instructions, step by step.",
    "Describe the water cycle in great detail, covering every stage and its causes.",
    "Write a detailed travel guide to Paris, with sections on museums, food and parks.",
    "Explain photosynthesis thoroughly, as a long lesson for high school students.",
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Give a detailed, multi-paragraph overview of the causes of the First World War.",
    "Explain how the internet works, from cables and routers to web pages, in depth.",
    "Write a comprehensive beginner's guide to gardening vegetables at home.",
    "Describe the life cycle of a star in detail, from nebula to its final stage.",
    "Write a long essay comparing the Roman Republic and the Roman Empire.",
    "Explain in detail how vaccines train the immune system, with examples.",
    "Write a detailed guide to training for a first marathon over six months.",
    "Describe the history of jazz music at length, decade by decade.",
    "Explain the theory of plate tectonics thoroughly, with evidence and examples.",
    "Write a long, detailed description of a day in the life of a medieval farmer.",
]
PREFIX_QUESTIONS = [
    "Summarize the policy above in three sentences.",
    "Which rule above matters most for new employees, and why?",
    "List the topics the policy above covers.",
    "What does the policy above say about security?",
    "Write a short welcome note based on the policy above.",
    "What should a manager do first according to the policy above?",
    "Give one example of following the policy above.",
    "Which part of the policy above is the strictest?",
]
SYSTEM_SENTENCES = [
    "Every team member reviews the shared handbook at the start of each quarter.",
    "Requests for new equipment go through the operations desk with a short justification.",
    "Customer data is stored only in approved systems and never copied to personal devices.",
    "Meetings start on time, have a written agenda and end with a list of decisions.",
    "Code changes are reviewed by at least one colleague before they are merged.",
    "Travel is booked through the company portal and approved by the team lead.",
    "Incidents are reported within one hour to the on-call engineer and the security desk.",
    "Documentation is written in plain language and kept next to the code it describes.",
    "Holidays are announced two weeks ahead so that the team can plan coverage.",
    "Passwords are managed in the approved vault and rotated when a device is lost.",
    "New hires are paired with a mentor for their first three months.",
    "Feedback is given privately, specifically and soon after the event it concerns.",
]


def _tool(name: str) -> str:
    """A console script of this environment (beside the interpreter)."""
    return str(Path(sys.executable).parent / name)


def ensure_core(args) -> tuple[Path, Path, str, dict]:
    """The core to serve: --core/--trust/--accept, else bench/out/serve_cpu.core (exported
    once with the recipe's default weights). Returns (core, public key, namespace, record)."""
    if args.core:
        if not (args.trust and args.accept):
            raise SystemExit("--core needs --trust and --accept")
        return Path(args.core), Path(args.trust), args.accept, {"given": True}
    OUT.mkdir(parents=True, exist_ok=True)
    public = KEY.with_name(KEY.name + ".pub")
    if CORE.is_file() and public.is_file():
        return CORE, public, NAMESPACE, {"reused": True}
    if not (KEY.is_file() and public.is_file()):
        subprocess.run([_tool("helios-tools"), "keygen", "--out", str(KEY)], check=True)
    partial = CORE.with_suffix(".core.partial")
    cmd = [_tool("ignition"), "export", str(RECIPE), "--checkpoint", "smollm2",
           "--key", str(KEY), "--namespace", NAMESPACE, "--out", str(partial), "--force"]
    print(f"exporting {CORE} ...", flush=True)
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"export failed ({proc.returncode}):\n{proc.stderr}")
    partial.replace(CORE)
    return CORE, public, NAMESPACE, {"reused": False, "wall_s": time.perf_counter() - started,
                                     "summary": proc.stdout.strip()}


@dataclass
class Stream:
    """One streamed request as the client saw it. Times are perf_counter seconds."""

    sent_s: float
    arrivals_s: list[float] = field(default_factory=list)  # one per generated token
    prompt_token_ids: list[int] = field(default_factory=list)
    usage: dict = field(default_factory=dict)
    finish_reason: str | None = None

    @property
    def ttft_s(self) -> float:
        return self.arrivals_s[0] - self.sent_s

    @property
    def itls_s(self) -> list[float]:
        return list(np.diff(self.arrivals_s))


async def stream_chat(client: httpx.AsyncClient, url: str, model: str, messages: list[dict],
                      max_tokens: int) -> Stream:
    """POST one streaming chat completion; time each token's chunk on arrival.

    Raises:
        RuntimeError: a non-200 status or a terminal error event.
    """
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    s = Stream(sent_s=time.perf_counter())
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread()).decode()}")
        async for line in resp.aiter_lines():
            now_s = time.perf_counter()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"error event: {chunk['error']}")
            if "prompt_token_ids" in chunk:
                s.prompt_token_ids = chunk["prompt_token_ids"]
            if chunk.get("usage"):
                s.usage = chunk["usage"]
            for choice in chunk["choices"]:
                s.arrivals_s.extend(now_s for _ in choice.get("token_ids", ()))
                s.finish_reason = choice.get("finish_reason") or s.finish_reason
    if not s.arrivals_s:
        raise RuntimeError("the stream carried no tokens")
    return s


def _dist_ms(values_s: list[float]) -> dict:
    if not values_s:
        return {"median_ms": None, "p90_ms": None, "n": 0}
    v = np.asarray(values_s) * 1e3
    return {"median_ms": float(np.median(v)), "p90_ms": float(np.percentile(v, 90)),
            "n": int(v.size)}


def _cached(s: Stream) -> int:
    return int((s.usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


async def run_level(client, url, model, concurrency: int, requests_per_client: int,
                    max_tokens: int) -> dict:
    """C clients, each sending `requests_per_client` requests back to back."""

    async def one_client(c: int) -> list[Stream]:
        out = []
        for r in range(requests_per_client):
            # The tag keeps a prompt from repeating across levels (no reuse of its pages);
            # the chat template's default system prompt is still shared, as in real use.
            prompt = PROMPTS[(c * requests_per_client + r) % len(PROMPTS)]
            content = f"[{concurrency}-{c}-{r}] {prompt}"
            out.append(await stream_chat(client, url, model,
                                         [{"role": "user", "content": content}], max_tokens))
        return out

    started_s = time.perf_counter()
    streams = [s for group in await asyncio.gather(*(one_client(c) for c in range(concurrency)))
               for s in group]
    wall_s = time.perf_counter() - started_s
    completion_tokens = [s.usage["completion_tokens"] for s in streams]
    return {
        "concurrency": concurrency, "requests": len(streams), "wall_s": wall_s,
        "ttft": _dist_ms([s.ttft_s for s in streams]),
        "itl": _dist_ms([gap for s in streams for gap in s.itls_s]),
        "output_tokens": sum(completion_tokens),
        "output_tokens_per_s": sum(completion_tokens) / wall_s,
        "completion_tokens_min_max": [min(completion_tokens), max(completion_tokens)],
        "prompt_tokens_min_max": [min(s.usage["prompt_tokens"] for s in streams),
                                  max(s.usage["prompt_tokens"] for s in streams)],
        "finish_reasons": sorted({s.finish_reason or "?" for s in streams}),
        "cached_tokens_total": sum(_cached(s) for s in streams),
    }


def system_prompt(tokenizer, index: int, target_tokens: int) -> str:
    """A fresh system prompt of about `target_tokens` tokens; `index` leads the text so
    that no page of one prompt matches another's."""
    parts = [f"Policy record {index:04d}. Follow the company policy below."]
    i = 0
    while len(tokenizer.encode(" ".join(parts), add_special_tokens=False).ids) < target_tokens:
        parts.append(SYSTEM_SENTENCES[i % len(SYSTEM_SENTENCES)])
        i += 1
    return " ".join(parts)


async def run_prefix(client, url, model, tokenizer, rounds: int, warm: int,
                     system_tokens: int, max_tokens: int) -> dict:
    """Sequential requests: per round, one cold request with a new system prompt, then
    `warm` requests sharing it (different user questions)."""
    cold, hot = [], []
    for r in range(rounds):
        system = system_prompt(tokenizer, r, system_tokens)
        for q in range(warm + 1):
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": PREFIX_QUESTIONS[q % len(PREFIX_QUESTIONS)]}]
            s = await stream_chat(client, url, model, messages, max_tokens)
            (hot if q else cold).append(s)

    def side(streams: list[Stream]) -> dict:
        return {"ttft": _dist_ms([s.ttft_s for s in streams]),
                "cached_tokens": [_cached(s) for s in streams],
                "prompt_tokens": [s.usage["prompt_tokens"] for s in streams]}

    return {"system_prompt_tokens": system_tokens, "rounds": rounds,
            "warm_per_round": warm, "cold": side(cold), "warm": side(hot)}


class StepTimer:
    """Wraps NativeModel.execute; records decode step seconds."""

    def __init__(self, model):
        self.decode_s: list[float] = []
        self._execute = model.execute
        model.execute = self.execute

    def execute(self, plan):
        t = time.perf_counter()
        out = self._execute(plan)
        if plan.kind.value == "decode":
            self.decode_s.append(time.perf_counter() - t)
        return out


async def run_ratio(client, url, model, core, rounds: int, max_tokens: int) -> dict:
    """Alternate one server stream and one bare Driver run of the same prompt ids and
    token count, `rounds` times (after one unrecorded warm-up of the Driver)."""
    from helios_serve.runtime.driver import Driver
    from helios_serve.testing.native import load_native

    t = time.perf_counter()
    native = load_native(core, "cpu")
    load_s = time.perf_counter() - t
    driver = Driver(native)
    messages = [{"role": "user", "content": PROMPTS[0]}]
    itls_s: list[float] = []
    timer: StepTimer | None = None
    try:
        for _ in range(rounds):
            s = await stream_chat(client, url, model, messages, max_tokens)
            itls_s.extend(s.itls_s)
            new_tokens = len(s.arrivals_s)
            if timer is None:  # warm-up: first touches of the bare loop's buffers
                driver.generate([s.prompt_token_ids], max_new_tokens=min(new_tokens, 3))
                timer = StepTimer(native)
            driver.generate([s.prompt_token_ids], max_new_tokens=new_tokens)
    finally:
        native.close()
    server_tps = 1.0 / float(np.median(itls_s))
    bare_tps = 1.0 / float(np.median(timer.decode_s))
    return {"rounds": rounds, "prompt_tokens": len(s.prompt_token_ids),
            "new_tokens_per_round": new_tokens, "bare_model_load_s": load_s,
            "server_itl": _dist_ms(itls_s), "bare_decode_step": _dist_ms(timer.decode_s),
            "server_decode_tokens_per_s": server_tps, "bare_decode_tokens_per_s": bare_tps,
            "ratio": server_tps / bare_tps, "target_ratio": TARGET_RATIO}


async def measure(args, url: str, bootstrap) -> dict:
    model = bootstrap.served_id
    timeout = httpx.Timeout(600.0, connect=10.0)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        # Warm-up (not recorded): first touches of every graph the levels use.
        await asyncio.gather(*(stream_chat(client, url, model,
                                           [{"role": "user", "content": p}], 4)
                               for p in PROMPTS[:max(args.concurrency)]))
        levels = []
        for c in args.concurrency:
            print(f"concurrency {c} ...", flush=True)
            levels.append(await run_level(client, url, model, c, args.requests_per_client,
                                          args.max_tokens))
        print("prefix reuse ...", flush=True)
        prefix = await run_prefix(client, url, model, bootstrap.tokenizer, args.prefix_rounds,
                                  args.prefix_warm, args.system_tokens, args.prefix_max_tokens)
        print("server vs bare decode loop ...", flush=True)
        ratio = await run_ratio(client, url, model, bootstrap.core, args.ratio_rounds,
                                args.max_tokens)
    return {"levels": levels, "prefix": prefix, "ratio": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--core", help="serve this core instead of bench/out/serve_cpu.core")
    parser.add_argument("--trust", help="its publisher's public key (with --core)")
    parser.add_argument("--accept", help="its publisher namespace (with --core)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests-per-client", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--system-tokens", type=int, default=512)
    parser.add_argument("--prefix-rounds", type=int, default=3)
    parser.add_argument("--prefix-warm", type=int, default=4, help="warm requests per round")
    parser.add_argument("--prefix-max-tokens", type=int, default=8)
    parser.add_argument("--ratio-rounds", type=int, default=5)
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 1 request per client, 16 tokens, 1 prefix round "
                             "with 2 warm requests, 2 ratio rounds")
    parser.add_argument("--out", default=str(OUT / "serve_cpu.json"))
    args = parser.parse_args()
    if args.quick:
        args.requests_per_client, args.max_tokens = 1, 16
        args.prefix_rounds, args.prefix_warm, args.ratio_rounds = 1, 2, 2

    from helios_serve.bootstrap import Bootstrap

    core, trust, accept, export = ensure_core(args)
    bootstrap = Bootstrap.load(core, [trust], accept)
    load_before = os.getloadavg()[0]
    server = ServeProcess(core, trust, accept, log=SERVER_LOG,
                          options=["--max-active", str(max(args.concurrency))],
                          startup_timeout_s=args.startup_timeout)
    try:
        url, startup_s = server.url, server.startup_s
        print(f"serving at {url} (startup {startup_s:.1f} s)", flush=True)
        figures = asyncio.run(measure(args, url, bootstrap))
    finally:
        server.stop()
        bootstrap.close()
    result = {
        "model": f"{bootstrap.served_id} ({core.name}), helios-serve --backend cpu",
        "quick": args.quick, "max_tokens": args.max_tokens,
        "requests_per_client": args.requests_per_client, "server_startup_s": startup_s,
        "timing": "client-side perf_counter; one SSE chunk per token (return_token_ids)",
        **figures, "export": export,
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "python": platform.python_version(),
                 # Other processes on a shared host skew CPU figures: record how busy it was.
                 "loadavg_1m_before": load_before, "loadavg_1m_after": os.getloadavg()[0]},
    }
    _print(result)
    print(f"wrote {write_json(args.out, result, indent=2)}")


def _print(r: dict) -> None:
    h = r["host"]
    print(f"\n{r['model']}{' [quick: noise only]' if r['quick'] else ''}, max_tokens "
          f"{r['max_tokens']}, load avg {h['loadavg_1m_before']:.1f} -> "
          f"{h['loadavg_1m_after']:.1f} on {h['cpus']} CPUs")
    print(f"{'conc':>4}{'reqs':>6}{'out tok':>9}{'TTFT med':>10}{'TTFT p90':>10}"
          f"{'ITL med':>9}{'ITL p90':>9}{'out tok/s':>11}  (ms; finish)")
    for lv in r["levels"]:
        print(f"{lv['concurrency']:>4}{lv['requests']:>6}{lv['output_tokens']:>9}"
              f"{lv['ttft']['median_ms']:>10.1f}{lv['ttft']['p90_ms']:>10.1f}"
              f"{lv['itl']['median_ms']:>9.1f}{lv['itl']['p90_ms']:>9.1f}"
              f"{lv['output_tokens_per_s']:>11.1f}  {','.join(lv['finish_reasons'])}")
    p = r["prefix"]
    print(f"prefix reuse, {p['system_prompt_tokens']}-token system prompt "
          f"(prompt {min(p['cold']['prompt_tokens'])}-{max(p['warm']['prompt_tokens'])} tokens):")
    for name in ("cold", "warm"):
        side = p[name]
        print(f"  {name:<5} TTFT median {side['ttft']['median_ms']:.1f} ms, p90 "
              f"{side['ttft']['p90_ms']:.1f} ms (n={side['ttft']['n']}); cached_tokens "
              f"{side['cached_tokens']}")
    q = r["ratio"]
    if q["server_itl"]["median_ms"] is None:  # the stream ended at its first token (EOS)
        print(f"single-stream decode: no inter-token gaps in {q['rounds']} rounds "
              f"({q['new_tokens_per_round']} tokens per stream): no ratio")
        return
    flag = "" if q["ratio"] >= q["target_ratio"] else "  < target"
    print(f"single-stream decode ({q['prompt_tokens']}-token prompt, {q['new_tokens_per_round']} "
          f"tokens x {q['rounds']}): server {q['server_decode_tokens_per_s']:.1f} tok/s "
          f"(median ITL {q['server_itl']['median_ms']:.1f} ms), bare Driver "
          f"{q['bare_decode_tokens_per_s']:.1f} tok/s (median step "
          f"{q['bare_decode_step']['median_ms']:.1f} ms), ratio {q['ratio']:.2f} "
          f"(target >= {q['target_ratio']}){flag}")


if __name__ == "__main__":
    main()
