"""Helios replicas on Ray Serve (`helios-serve-ray`): 1 vs 2 replicas, affinity on and off,
on a multi-turn chat workload, measured from an HTTP client.

Each configuration starts the real command (`helios-serve-ray CORE ... --port 0`, its own
local Ray cluster, CPU replicas) and runs the same workload:

    C conversations at once, each T turns in order: a streamed chat request (temperature 0,
    max_tokens M, `return_token_ids` so each token is timed on arrival), then the answer
    and the next user message appended. Reported per configuration:
      reused fraction  sum(cached_tokens) / sum(prompt_tokens) over turns 2..T (the share
                       of a later turn's prompt served from a replica's prefix cache)
      stayed           turns 2..T answered by the replica that answered the turn before
                       (the ingress's x-helios-replica header)
      TTFT             send -> first token chunk, turn 1 and turns 2..T (median, p90)
      tokens/s         completion tokens / wall time of the workload

Configurations: `1 replica` (affinity on), `2 replicas, affinity off` (power of two
choices on load only), `2 replicas, affinity on`. On a CPU machine the replicas share the
host's cores, so 2 replicas add no compute: the comparison that means something here is
affinity on vs off (reuse and TTFT of later turns). On a GPU machine N replicas on one
card are not meaningful either (they split one device's memory and compute); the
multi-GPU comparison (one replica per card, `--replica-gpus 1 -- --backend cuda`) waits
for a multi-GPU machine.

The core is bench/out/serve_cpu.core (exported once by serve_cpu.ensure_core) unless
--core/--trust/--accept name one. Run:
`uv run python bench/serve_replicas.py [--quick]` -> prints a table and writes
bench/out/serve_replicas.json (commit, machine, load). Figures only; never asserted on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from _report import git_commit, write_json  # bench/ is this script's folder
from serve_cpu import OUT, PROMPTS, _dist_ms, ensure_core  # bench/ is this script's folder

FOLLOW_UPS = ["Go on.", "Say more about the second point.", "Summarize what you said so far.",
              "Give one concrete example.", "What is the most surprising part?",
              "Explain that to a child.", "What would an expert add?"]
CONFIGS = [("1 replica", 1, True), ("2 replicas, affinity off", 2, False),
           ("2 replicas, affinity on", 2, True)]


async def turn(client: httpx.AsyncClient, url: str, messages: list[dict], max_tokens: int
               ) -> dict:  # fmt: skip
    """One streamed turn: {"ttft_s", "tokens", "text", "usage", "replica"}.

    Raises:
        RuntimeError: a non-200 status or a terminal error event.
    """
    body = {"model": "smollm2", "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}
    sent = time.perf_counter()
    out = {"ttft_s": None, "tokens": 0, "text": "", "usage": {}, "replica": None}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread()).decode()}")
        out["replica"] = resp.headers.get("x-helios-replica")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"error event: {chunk['error']}")
            if chunk.get("usage"):
                out["usage"] = chunk["usage"]
            for choice in chunk["choices"]:
                if choice.get("token_ids") and out["ttft_s"] is None:
                    out["ttft_s"] = time.perf_counter() - sent
                out["tokens"] += len(choice.get("token_ids", ()))
                out["text"] += (choice.get("delta") or {}).get("content") or ""
    return out


async def conversation(client, url: str, index: int, turns: int, max_tokens: int) -> list[dict]:
    messages = [{"role": "user", "content": PROMPTS[index % len(PROMPTS)]}]
    done = []
    for t in range(turns):
        r = await turn(client, url, messages, max_tokens)
        done.append(r)
        messages += [{"role": "assistant", "content": r["text"]},
                     {"role": "user", "content": FOLLOW_UPS[(index + t) % len(FOLLOW_UPS)]}]
    return done


async def workload(url: str, conversations: int, turns: int, max_tokens: int) -> dict:
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        started = time.perf_counter()
        runs = await asyncio.gather(*(conversation(client, url, i, turns, max_tokens)
                                      for i in range(conversations)))  # fmt: skip
        wall_s = time.perf_counter() - started
    later = [r for run in runs for r in run[1:]]
    prompt = sum(r["usage"].get("prompt_tokens", 0) for r in later)
    cached = sum((r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                 for r in later)
    stayed = sum(a["replica"] == b["replica"] for run in runs for a, b in zip(run, run[1:], strict=False))
    tokens = sum(r["tokens"] for run in runs for r in run)
    return {
        "reused_fraction": cached / prompt if prompt else 0.0,
        "reused_tokens": cached, "later_prompt_tokens": prompt,
        "stayed": f"{stayed}/{len(later)}",
        "ttft_first_turn": _dist_ms([run[0]["ttft_s"] for run in runs]),
        "ttft_later_turns": _dist_ms([r["ttft_s"] for r in later]),
        "completion_tokens": tokens, "wall_s": wall_s, "tokens_per_s": tokens / wall_s,
        "replicas_used": sorted({r["replica"] for run in runs for r in run}),
    }


def start(core: Path, trust: Path, accept: str, replicas: int, affinity: bool, log) -> tuple:
    """`helios-serve-ray` with `replicas` CPU replicas; returns (process, url)."""
    cmd = [str(Path(sys.executable).parent / "helios-serve-ray"), str(core), "--trust",
           str(trust), "--accept", accept, "--replicas", str(replicas), "--replica-cpus", "0",
           "--port", "0", "--affinity" if affinity else "--no-affinity"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                            env={**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"})
    line = proc.stdout.readline()
    if not line.startswith("Helios is serving"):
        proc.kill()
        raise SystemExit(f"helios-serve-ray did not start (see {log.name}): {line!r}")
    return proc, line.split(" at ")[1].split()[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--core")
    p.add_argument("--trust")
    p.add_argument("--accept")
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--quick", action="store_true", help="2 conversations of 3 turns")
    p.add_argument("--out", default=str(OUT / "serve_replicas.json"))
    args = p.parse_args()
    if args.quick:
        args.conversations, args.turns = 2, 3
    core, trust, accept, export = ensure_core(args)
    OUT.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    results = []
    with open(OUT / "serve_replicas.server.log", "w") as log:
        for name, replicas, affinity in CONFIGS:
            started = time.perf_counter()
            proc, url = start(core, trust, accept, replicas, affinity, log)
            startup_s = time.perf_counter() - started
            try:
                figures = asyncio.run(workload(url, args.conversations, args.turns,
                                               args.max_tokens))  # fmt: skip
            finally:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
            results.append({"config": name, "replicas": replicas, "affinity": affinity,
                            "startup_s": startup_s, **figures})
            print(f"{name}: done", flush=True)
    result = {
        "commit": git_commit(), "quick": args.quick, "conversations": args.conversations,
        "turns": args.turns, "max_tokens": args.max_tokens, "export": export,
        "timing": "client-side perf_counter; one SSE chunk per token (return_token_ids)",
        "note": "CPU replicas share this host's cores: 2 replicas add no compute here; "
                "N replicas on one GPU are not meaningful either",
        "configs": results,
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "python": platform.python_version(), "node": platform.node(),
                 "loadavg_1m_before": load_before, "loadavg_1m_after": os.getloadavg()[0]},
    }
    print(f"\n{'config':<26}{'reused':>8}{'stayed':>8}{'TTFT1 med':>11}{'TTFTn med':>11}"
          f"{'TTFTn p90':>11}{'tok/s':>8}  (ms)")
    for r in results:
        print(f"{r['config']:<26}{r['reused_fraction']:>8.2f}{r['stayed']:>8}"
              f"{r['ttft_first_turn']['median_ms']:>11.1f}"
              f"{r['ttft_later_turns']['median_ms']:>11.1f}"
              f"{r['ttft_later_turns']['p90_ms']:>11.1f}{r['tokens_per_s']:>8.1f}")
    print(f"wrote {write_json(args.out, result, indent=2)}")


if __name__ == "__main__":
    main()
