"""Soak: steady mixed traffic against helios-serve, reporting the server's RSS over time.

    uv run python bench/soak.py                    # 30 minutes against `helios-serve --demo`
    uv run python bench/soak.py --duration-s 300   # a shorter run
    uv run python bench/soak.py --url http://127.0.0.1:8000 --pid 1234   # a running server
    # bench/results/soak_cpu_tiny.json: the tiny core of tests/tiny_model.py (context 256)
    # served by helios-serve, 4 clients, prompts cut to 150 characters:
    uv run python bench/soak.py --url http://127.0.0.1:8766 --pid PID --concurrency 4 \
        --max-prompt-chars 150 --label "tiny core" --out bench/results/soak_cpu_tiny.json

Traffic (bounded: `--concurrency` clients, each one request at a time): chat requests,
half streaming and half not, prompts of 1 to 40 repetitions of a sentence (about 10 to
400 tokens), max_tokens 8 to 48, a fixed seed per request, every fifth request dropped by
its client after the first few stream events (a cancellation). RSS (VmRSS of the server
process) is sampled every `--sample-s` seconds. The summary compares the RSS at the end
of the warm-up (the first fifth of the run) with the final RSS and fits a slope over the
samples after warm-up (MiB per hour). Writes bench/results/soak_<backend>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from _report import git_commit, write_json  # bench/ is this script's folder

SENTENCE = "The quick brown fox jumps over the lazy dog near the quiet river bank. "


def rss_mib(pid: int) -> float:
    """Resident set size of a process (MiB), from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def start_demo(port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "helios-serve"), "--demo", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:  # "Helios is serving NAME at URL ..."
        if line.startswith("Helios is serving"):
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc
    raise RuntimeError(f"helios-serve --demo exited with {proc.wait()}")


class Traffic:
    def __init__(self, url: str, model: str, seed: int, max_prompt_chars: int | None) -> None:
        self.url = url
        self.max_prompt_chars = max_prompt_chars
        self.model = model
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.done = 0
        self.cancelled = 0
        self.errors: dict[str, int] = {}
        self.error_messages: dict[str, str] = {}  # first message of each kind
        self.completion_tokens = 0

    def one(self, client: httpx.Client) -> None:
        with self.lock:
            reps = self.rng.randint(1, 40)
            max_tokens = self.rng.randint(8, 48)
            stream = self.rng.random() < 0.5
            drop = self.rng.random() < 0.2
            seed = self.rng.randrange(2**31)
        body = {
            "model": self.model,
            "messages": [{"role": "user",
                          "content": (SENTENCE * reps)[:self.max_prompt_chars] + "Summarize."}],
            "max_tokens": max_tokens, "seed": seed, "temperature": 0.7, "stream": stream,
        }  # fmt: skip
        try:
            if stream:
                with client.stream("POST", self.url + "/v1/chat/completions", json=body) as r:
                    if r.status_code != 200:
                        r.read()
                        self._error(str(r.status_code), r.text[:300])
                        return
                    for i, line in enumerate(r.iter_lines()):
                        if drop and i >= 6:
                            with self.lock:
                                self.cancelled += 1
                            return
                        if line.startswith("data: {") and '"error"' in line:
                            self._error("stream_error", line[:300])
                            return
            else:
                r = client.post(self.url + "/v1/chat/completions", json=body)
                if r.status_code != 200:
                    self._error(str(r.status_code), r.text[:300])
                    return
                with self.lock:
                    self.completion_tokens += r.json()["usage"]["completion_tokens"]
            with self.lock:
                self.done += 1
        except httpx.HTTPError as exc:
            self._error(type(exc).__name__, str(exc)[:300])

    def _error(self, kind: str, message: str) -> None:
        with self.lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1
            self.error_messages.setdefault(kind, message)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=1800.0)
    ap.add_argument("--sample-s", type=float, default=30.0)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--url", help="a running server (default: start helios-serve --demo)")
    ap.add_argument("--pid", type=int, help="the running server's pid (with --url)")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--backend", default="cpu", help="label of the results file")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-s", type=float, default=300.0, help="per request")
    ap.add_argument("--max-prompt-chars", type=int,
                    help="cut each prompt to this many characters (a small-context core)")
    ap.add_argument("--label", default="", help="recorded in the results (which core)")
    args = ap.parse_args()

    proc = None
    if args.url:
        if args.pid is None:
            ap.error("--url needs --pid (the server process whose RSS is sampled)")
        url, pid = args.url.rstrip("/"), args.pid
    else:
        server_log = Path(f"/tmp/helios-soak-{args.port}.log")
        proc = start_demo(args.port, server_log)
        print(f"server log: {server_log}")
        url, pid = f"http://127.0.0.1:{args.port}", proc.pid
    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    traffic = Traffic(url, model, args.seed, args.max_prompt_chars)
    stop = threading.Event()
    end = time.monotonic() + args.duration_s

    def client_loop() -> None:
        with httpx.Client(timeout=args.timeout_s) as client:
            while not stop.is_set() and time.monotonic() < end:
                traffic.one(client)

    threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(args.concurrency)]
    start = time.monotonic()
    for t in threads:
        t.start()
    samples = []
    print(f"{'t_s':>7} {'rss_mib':>8} {'done':>6} {'cancelled':>9} {'errors':>6}")
    try:
        while True:
            now = time.monotonic() - start
            with traffic.lock:
                row = {"t_s": round(now, 1), "rss_mib": round(rss_mib(pid), 1),
                       "load_1m": round(os.getloadavg()[0], 2),
                       "done": traffic.done, "cancelled": traffic.cancelled,
                       "errors": sum(traffic.errors.values())}  # fmt: skip
            samples.append(row)
            print(f"{row['t_s']:>7} {row['rss_mib']:>8} {row['done']:>6} {row['cancelled']:>9} "
                  f"{row['errors']:>6}", flush=True)
            if now >= args.duration_s:
                break
            time.sleep(min(args.sample_s, max(0.0, args.duration_s - now)))
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)

    warm = [s for s in samples if s["t_s"] >= args.duration_s / 5]
    xs = [s["t_s"] for s in warm]
    ys = [s["rss_mib"] for s in warm]
    slope = 0.0
    if len(xs) >= 2:
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / max(
            sum((x - mx) ** 2 for x in xs), 1e-9)
    summary = {
        "core": args.label or model,
        "duration_s": args.duration_s,
        "max_prompt_chars": args.max_prompt_chars,
        "concurrency": args.concurrency,
        "requests_done": traffic.done,
        "requests_cancelled": traffic.cancelled,
        "errors": traffic.errors,
        "error_messages": traffic.error_messages,
        "rss_start_mib": samples[0]["rss_mib"],
        "rss_after_warmup_mib": ys[0] if ys else None,
        "rss_max_mib": max(s["rss_mib"] for s in samples),
        "rss_final_mib": samples[-1]["rss_mib"],
        "growth_after_warmup_mib": round(ys[-1] - ys[0], 1) if ys else None,
        "slope_after_warmup_mib_per_h": round(slope * 3600, 1),
    }
    print(json.dumps(summary, indent=2))
    out = args.out or Path(__file__).parent / "results" / f"soak_{args.backend}.json"
    commit = git_commit()
    write_json(out, {"script": "bench/soak.py", "commit": commit,
                     "env": {"MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX")},
                     "summary": summary, "samples": samples})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
