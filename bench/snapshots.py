"""Exact-endpoint snapshots and the host tier, measured through helios-serve's HTTP API.

Two workloads against a real `helios-serve` child process on 127.0.0.1 (SmolLM2, greedy,
streamed; TTFT = request sent -> first generated token's chunk, timed at the client on one
kept-alive connection per server, as an OpenAI client sends), and two in one process over
the scheduler and NativeModel directly (no HTTP: `in-process`, snapshots on vs off in
multi-turn chat, and `in-process-pressure`, the pressure workload below with and without
the host tier, which also records the TRANSFER and PREFILL steps each revisit's TTFT
covers and their execute time; see their functions):

    multi-turn  one conversation of 10 turns on a ~1,000-token system prompt, each turn a
                new user question plus the previous answers (max_tokens 16), under three
                configurations, each on a fresh server:
                  off   --snapshots 0: complete pages only (prefix reuse at page granularity)
                  on    exact-endpoint snapshots (the core's prepared count)
                  host  snapshots + --host-cache-bytes
                per turn: prompt tokens, cached_tokens (usage), prefill tokens (the server's
                helios_prefill_tokens_total delta) and TTFT. Target: every turn >= 2 prefills
                exactly its new tokens (prompt - the previous turn's committed tokens) with
                snapshots on.
    pressure    C conversations, each with its own ~1,000-token system prompt, visited
                round-robin for R rounds on a server whose device cache (--num-pages) holds
                fewer pages than their working set: without a host tier every revisit
                recomputes what was evicted; with one, the evicted pages come back by copy.
                Per configuration: hit rate of revisits (cached / prompt tokens, rounds >= 2),
                TTFT of revisits (median), and TTFT of first visits (recompute). Target:
                revisit TTFT with the host tier <= 0.5 x without it.

The core is exported into bench/out/ when absent (the SmolLM2 recipe, f32 weights: the
NumPy kernels' fast path), unless --core /
--trust / --accept name one (the GPU step passes a core with sm_90 binaries and
--backend cuda). Server logs go to bench/out/snapshots.*.log.

Run: `uv run python bench/snapshots.py --json bench/results/snapshots_cpu.json` -> prints
a table and writes the JSON. Figures only; never asserted on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from _report import git_commit, write_json  # bench/ is this script's folder
from serve_cpu import SYSTEM_SENTENCES  # bench/ is this script's folder
from server import ServeProcess

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
OUT = BENCH / "out"
RECIPE = REPO / "recipes" / "smollm2_135m_instruct.py"
NAMESPACE = "helios.bench/snapshots"
MODEL = "smollm2-135m-instruct"

SENTENCES = SYSTEM_SENTENCES  # the policy text serve_cpu.py's chat workload uses
QUESTIONS = [
    "Summarize the policy above in one sentence.",
    "What does it say about security?",
    "And about meetings?",
    "Who approves travel?",
    "How fast must incidents be reported?",
    "What happens when a device is lost?",
    "How long does mentoring last?",
    "How is feedback given?",
    "When are holidays announced?",
    "Which rule is the strictest?",
]


def system_prompt(index: int, sentences: int) -> str:
    """A long system prompt, distinct per `index` (rotated sentences, a numbered title)."""
    body = [SENTENCES[(index + i) % len(SENTENCES)] for i in range(sentences)]
    return f"Policy book {index}. " + " ".join(body)


def ensure_core(args) -> tuple[Path, Path, str]:
    if args.core:
        if not (args.trust and args.accept):
            raise SystemExit("--core needs --trust and --accept")
        return Path(args.core), Path(args.trust), args.accept
    OUT.mkdir(parents=True, exist_ok=True)
    core, key = OUT / "snapshots.core", OUT / "snapshots-publisher.key"
    public = key.with_name(key.name + ".pub")
    if not (key.is_file() and public.is_file()):
        _cli("helios_tools.cli", "helios-tools", ["keygen", "--out", str(key)])
    if not core.is_file():
        print(f"exporting {core} ...", flush=True)
        partial = core.with_suffix(".partial")
        _cli("helios_ignition.cli", "ignition", ["export", str(RECIPE), "--checkpoint", "smollm2",
                                                 "--key", str(key), "--namespace", NAMESPACE,
                                                 "--out", str(partial), "--force",
                                                 "--weight-dtype", "f32"])
        partial.replace(core)
    return core, public, NAMESPACE


def _cli(module: str, name: str, argv: list[str]) -> None:
    code = f"import sys; from {module} import main; sys.argv[0] = {name!r}; main()"
    subprocess.run([sys.executable, "-c", code, *argv], check=True, capture_output=True)


class Server(ServeProcess):
    """helios-serve for one configuration (--max-active 1) and the client that times it:
    one `httpx.Client` for every turn, as an OpenAI client keeps its connection (a new
    client per request adds its ~20 ms TLS-context build to every TTFT)."""

    def __init__(self, core, trust, accept, backend: str, extra: list[str], log: Path):
        super().__init__(core, trust, accept, log=log, backend=backend,
                         options=["--max-active", "1", *extra])
        self.timed = httpx.Client(timeout=900, trust_env=False)

    def stop(self) -> None:
        super().stop()
        self.timed.close()


def turn(server: Server, messages: list[dict], max_tokens: int) -> dict:
    """One streamed greedy request; TTFT at the first generated token's chunk."""
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    prefill0 = server.metric("helios_prefill_tokens_total")
    text, usage, first = [], {}, None
    sent = time.perf_counter()
    with server.timed.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                piece = choice.get("delta", {}).get("content")
                if piece:
                    if first is None:
                        first = time.perf_counter()
                    text.append(piece)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"ttft_ms": 1e3 * ((first or time.perf_counter()) - sent),
            "prompt_tokens": usage.get("prompt_tokens", 0),
            "completion_tokens": usage.get("completion_tokens", 0),
            "cached_tokens": cached,
            "prefill_tokens": server.metric("helios_prefill_tokens_total") - prefill0,
            "reply": "".join(text)}


CONFIGS = {"off": ["--snapshots", "0"], "on": [], "host": None}  # host: set from args


def multi_turn(args, core, trust, accept) -> dict:
    out = {}
    for name, extra in CONFIGS.items():
        extra = ["--host-cache-bytes", args.host_cache] if extra is None else extra
        server = Server(core, trust, accept, args.backend, extra, OUT / f"snapshots.{name}.log")
        try:
            messages = [{"role": "system", "content": system_prompt(0, args.sentences)}]
            turns, committed = [], 0
            for q in QUESTIONS[:args.turns]:
                messages.append({"role": "user", "content": q})
                t = turn(server, messages, args.max_tokens)
                t["new_tokens"] = t["prompt_tokens"] - committed if committed else t["prompt_tokens"]
                committed = t["prompt_tokens"] + t["completion_tokens"] - 1
                messages.append({"role": "assistant", "content": t.pop("reply")})
                turns.append(t)
                print(f"  {name:<5} turn {len(turns):2d}: prompt {t['prompt_tokens']:5d} cached "
                      f"{t['cached_tokens']:5d} prefill {t['prefill_tokens']:5.0f} (new "
                      f"{t['new_tokens']:4d}) TTFT {t['ttft_ms']:8.1f} ms", flush=True)
            later = turns[1:]
            out[name] = {"args": extra, "turns": turns,
                         "continued_ttft_ms_median": statistics.median(t["ttft_ms"] for t in later),
                         "continued_prefill_tokens_median": statistics.median(
                             t["prefill_tokens"] for t in later),
                         "publications": server.metric("helios_snapshot_publications_total"),
                         "snapshot_hits": server.metric("helios_snapshot_hits_total")}
        finally:
            server.stop()
    return out


def in_process(args, core, trust, accept) -> dict:
    """Snapshots on vs off in ONE process, turn by turn interleaved (alternating which
    goes first), so a loaded host slows both alike: two NativeModels of the same core
    (CPU backend), the real scheduler, greedy, `max_tokens` per turn; each turn's prompt
    is the previous turn's prompt + output + the next question's tokens. TTFT = add ->
    first output token (no HTTP), wall clock and this process's CPU time (the work itself:
    on a host shared with other jobs the wall clock mostly measures them)."""
    from helios_serve.bootstrap import Bootstrap
    from helios_serve.runtime.native_model import NativeModel
    from helios_serve.testing.serial import Serial

    out: dict = {}
    with Bootstrap.load(core, [trust], accept) as boot:
        encode = boot.tokenizer.encode
        runs = {name: Serial(NativeModel.load(boot.prepared, boot.core.read_resource,
                                              args.backend, snapshots=snapshots),
                             logits=False)
                for name, snapshots in (("off", 0), ("on", None))}
        prompts = {name: list(encode(system_prompt(0, args.sentences)).ids) for name in runs}
        turns: dict[str, list[dict]] = {name: [] for name in runs}
        try:
            for i, q in enumerate(QUESTIONS[:args.turns]):
                order = list(runs) if i % 2 else list(reversed(runs))
                for name in order:
                    run, prompt = runs[name], prompts[name]
                    prompt += encode(" " + q).ids
                    computed = run.sched.stats().prompt_tokens_computed
                    run.add(i, prompt, args.max_tokens)
                    run.run()
                    turns[name].append({
                        "prompt_tokens": len(prompt), "reused_tokens": run.reused[i],
                        "prefill_tokens": run.sched.stats().prompt_tokens_computed - computed,
                        "ttft_ms": 1e3 * run.ttft_s(i), "ttft_cpu_ms": 1e3 * run.ttft_cpu_s(i)})
                    prompt += run.out[i]
                    t = turns[name][-1]
                    print(f"  {name:<3} turn {i + 1:2d}: prompt {t['prompt_tokens']:5d} reused "
                          f"{t['reused_tokens']:5d} prefill {t['prefill_tokens']:4d} TTFT "
                          f"{t['ttft_ms']:8.1f} ms (CPU {t['ttft_cpu_ms']:8.1f} ms)", flush=True)
        finally:
            for run in runs.values():
                run.model.close()
    for name, ts in turns.items():
        later = ts[1:]
        out[name] = {"turns": ts,
                     "continued_ttft_ms_median": statistics.median(t["ttft_ms"] for t in later),
                     "continued_ttft_cpu_ms_median": statistics.median(
                         t["ttft_cpu_ms"] for t in later),
                     "continued_prefill_tokens_median": statistics.median(
                         t["prefill_tokens"] for t in later)}
    out["continued_ttft_on_over_off"] = (out["on"]["continued_ttft_ms_median"]
                                         / out["off"]["continued_ttft_ms_median"])
    out["continued_ttft_cpu_on_over_off"] = (out["on"]["continued_ttft_cpu_ms_median"]
                                             / out["off"]["continued_ttft_cpu_ms_median"])
    return out


def in_process_pressure(args, core, trust, accept) -> dict:
    """The cache-pressure workload in ONE process, without HTTP: two NativeModels of the
    same core with `--pressure-pages` device pages each, one recomputing what was evicted
    ("recompute": no host tier) and one with the host tier ("host"), the real scheduler
    (Serial), greedy, `max_tokens` per turn. C conversations, each with its own system
    prompt, visited round-robin for R rounds; every turn runs on both models back to
    back (alternating which goes first), so a loaded host slows both alike. Each turn's
    prompt is the conversation's previous prompt + output + the next question's tokens.

    Per turn: TTFT (add -> first output token; wall clock and this process's CPU time),
    reused and prefilled tokens, and what the TTFT covered: the TRANSFER steps and their
    copies per route, and the PREFILL steps. The ratio of revisit TTFT medians (rounds
    >= 2) host / recompute is the cache's own figure, free of the HTTP first-token floor.
    """
    from helios_serve.bootstrap import Bootstrap
    from helios_serve.config import parse_bytes
    from helios_serve.engine.plan import StepKind
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.runtime.native_model import NativeModel
    from helios_serve.testing.serial import Serial

    configs = {"recompute": 0, "host": parse_bytes(args.host_cache)}
    out: dict = {}
    with Bootstrap.load(core, [trust], accept) as boot:
        encode = boot.tokenizer.encode
        runs = {name: Serial(NativeModel.load(
                    boot.prepared, boot.core.read_resource, args.backend,
                    cache=CacheSizing(num_pages=args.pressure_pages), host_cache_bytes=host),
                    logits=False)
                for name, host in configs.items()}
        prompts = {name: [list(encode(system_prompt(c + 1, args.sentences)).ids)
                          for c in range(args.conversations)] for name in runs}
        turns: dict[str, list[dict]] = {name: [] for name in runs}
        rid = 0
        try:
            for r in range(args.rounds):
                question = encode(" " + QUESTIONS[r % len(QUESTIONS)]).ids
                for c in range(args.conversations):
                    order = list(runs) if rid % 2 else list(reversed(runs))
                    for name in order:
                        run, prompt = runs[name], prompts[name][c]
                        prompt += question
                        stats = run.sched.stats()
                        run.add(rid, prompt, args.max_tokens)
                        run.run()
                        steps = run.steps_to_first_token(rid)
                        transfers = [p for p, _ in steps if p.kind is StepKind.TRANSFER]
                        after = run.sched.stats()
                        t = {"round": r, "conversation": c, "prompt_tokens": len(prompt),
                             "reused_tokens": run.reused[rid],
                             "prefill_tokens": (after.prompt_tokens_computed
                                                - stats.prompt_tokens_computed),
                             "ttft_ms": 1e3 * run.ttft_s(rid),
                             "ttft_cpu_ms": 1e3 * run.ttft_cpu_s(rid),
                             "transfer_steps": len(transfers),
                             "copies": {f"{p.route.source.value}->{p.route.destination.value}":
                                        sum(len(q.copies) for q in transfers
                                            if q.route == p.route) for p in transfers},
                             "prefill_steps": sum(p.kind is StepKind.PREFILL for p, _ in steps),
                             # execute (submit + wait) time of those steps, by kind
                             "transfer_ms": 1e3 * sum(t for p, t in steps
                                                      if p.kind is StepKind.TRANSFER),
                             "prefill_ms": 1e3 * sum(t for p, t in steps
                                                     if p.kind is StepKind.PREFILL),
                             "swap_ins": after.host_swap_ins - stats.host_swap_ins,
                             "swap_outs": after.host_swap_outs - stats.host_swap_outs,
                             "output": list(run.out[rid])}
                        turns[name].append(t)
                        prompt += run.out[rid]
                        print(f"  {name:<9} round {r} conv {c}: prompt {t['prompt_tokens']:5d} "
                              f"reused {t['reused_tokens']:5d} prefill {t['prefill_tokens']:5d} "
                              f"transfers {t['transfer_steps']} {t['copies']} "
                              f"({t['transfer_ms']:.1f} ms) TTFT {t['ttft_ms']:8.1f} ms (CPU "
                              f"{t['ttft_cpu_ms']:8.1f} ms)",
                              flush=True)
                    rid += 1
        finally:
            for run in runs.values():
                run.model.close()
    for name, ts in turns.items():
        first = [t for t in ts if t["round"] == 0]
        revisit = [t for t in ts if t["round"] > 0]
        out[name] = {
            "host_cache_bytes": configs[name], "num_pages": args.pressure_pages,
            "turns": ts,
            "first_visit_ttft_ms_median": statistics.median(t["ttft_ms"] for t in first),
            "revisit_ttft_ms_median": statistics.median(t["ttft_ms"] for t in revisit),
            "revisit_ttft_cpu_ms_median": statistics.median(t["ttft_cpu_ms"] for t in revisit),
            "revisit_hit_rate": (sum(t["reused_tokens"] for t in revisit)
                                 / max(sum(t["prompt_tokens"] for t in revisit), 1)),
            "revisit_transfer_steps_median": statistics.median(
                t["transfer_steps"] for t in revisit),
            "revisit_prefill_steps_median": statistics.median(
                t["prefill_steps"] for t in revisit),
            "revisit_transfer_ms_median": statistics.median(t["transfer_ms"] for t in revisit),
            "revisit_prefill_ms_median": statistics.median(t["prefill_ms"] for t in revisit),
        }
    r, h = out["recompute"], out["host"]
    out["revisit_ttft_host_over_recompute"] = h["revisit_ttft_ms_median"] / r["revisit_ttft_ms_median"]
    out["revisit_ttft_cpu_host_over_recompute"] = (h["revisit_ttft_cpu_ms_median"]
                                                   / r["revisit_ttft_cpu_ms_median"])
    out["same_outputs"] = all(a["output"] == b["output"]
                              for a, b in zip(r["turns"], h["turns"], strict=True))
    return out


def pressure(args, core, trust, accept) -> dict:
    out = {}
    for name, extra in (("recompute", []), ("host", ["--host-cache-bytes", args.host_cache])):
        extra = ["--num-pages", str(args.pressure_pages), *extra]
        server = Server(core, trust, accept, args.backend, extra, OUT / f"snapshots.p-{name}.log")
        try:
            convs = [[{"role": "system", "content": system_prompt(i + 1, args.sentences)}]
                     for i in range(args.conversations)]
            first, revisit = [], []
            for r in range(args.rounds):
                for c, messages in enumerate(convs):
                    messages.append({"role": "user", "content": QUESTIONS[r % len(QUESTIONS)]})
                    t = turn(server, messages, args.max_tokens)
                    messages.append({"role": "assistant", "content": t.pop("reply")})
                    (first if r == 0 else revisit).append(t)
                    print(f"  {name:<9} round {r} conv {c}: prompt {t['prompt_tokens']:5d} cached "
                          f"{t['cached_tokens']:5d} TTFT {t['ttft_ms']:8.1f} ms", flush=True)
            prompt = sum(t["prompt_tokens"] for t in revisit)
            out[name] = {
                "args": extra,
                "first_visit_ttft_ms_median": statistics.median(t["ttft_ms"] for t in first),
                "revisit_ttft_ms_median": statistics.median(t["ttft_ms"] for t in revisit),
                "revisit_hit_rate": sum(t["cached_tokens"] for t in revisit) / max(prompt, 1),
                "first": first, "revisit": revisit,
                "host_swap_ins": server.metric("helios_host_cache_swap_ins_total"),
                "host_swap_outs": server.metric("helios_host_cache_swap_outs_total"),
                "host_hits": server.metric("helios_host_cache_hits_total"),
                "page_evictions": server.metric("helios_cache_page_evictions_total"),
            }
        finally:
            server.stop()
    r, h = out["recompute"], out["host"]
    out["revisit_ttft_host_over_recompute"] = h["revisit_ttft_ms_median"] / r["revisit_ttft_ms_median"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--core")
    p.add_argument("--trust")
    p.add_argument("--accept")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--sentences", type=int, default=60, help="system prompt length "
                   "(60 sentences: about 1,000 SmolLM2 tokens)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--host-cache", default="1GiB")
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pressure-pages", type=int, default=160,
                   help="device pages in the pressure run (4 conversations need ~260)")
    p.add_argument("--workloads", nargs="+",
                   choices=("multi-turn", "in-process", "pressure", "in-process-pressure"),
                   default=["multi-turn", "pressure"],
                   help="the CPU run measures multi-turn only (a 1,000-token recompute takes "
                        "~1 min on a loaded 2-core host)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    core, trust, accept = ensure_core(args)
    t0 = time.time()
    mt = pr = ip = ipp = None
    if "in-process" in args.workloads:
        print("snapshots on vs off in one process (interleaved)", flush=True)
        ip = in_process(args, core, trust, accept)
    if "in-process-pressure" in args.workloads:
        print("cache pressure in one process: recompute vs host tier (interleaved)", flush=True)
        ipp = in_process_pressure(args, core, trust, accept)
    if "multi-turn" in args.workloads:
        print("multi-turn chat", flush=True)
        mt = multi_turn(args, core, trust, accept)
    if "pressure" in args.workloads:
        print("cache pressure", flush=True)
        pr = pressure(args, core, trust, accept)
    commit = git_commit(REPO)
    result = {
        "bench": "snapshots", "backend": args.backend, "model": MODEL, "commit": commit,
        "host": platform.node(), "python": platform.python_version(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "multi_turn": mt, "in_process": ip, "pressure": pr, "in_process_pressure": ipp,
        "wall_s": time.time() - t0,
        "load_average": list(os.getloadavg()),
        "targets": {
            "turn_n_prefills_only_new_tokens": mt and all(
                t["prefill_tokens"] == t["new_tokens"] for t in mt["on"]["turns"][1:]),
            "pressure_ttft_host_over_recompute_le_0_5":
                pr and pr["revisit_ttft_host_over_recompute"] <= 0.5,
            "in_process_pressure_ttft_host_over_recompute_le_0_5":
                ipp and ipp["revisit_ttft_host_over_recompute"] <= 0.5,
        },
    }
    _print(result)
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")


def _print(r: dict) -> None:
    mt = r["multi_turn"]
    if mt:
        _print_multi_turn(mt)
    if r["in_process"]:
        ip = r["in_process"]
        print("in one process, continued turns (2..N), median: " + ", ".join(
            f"{n} TTFT {ip[n]['continued_ttft_ms_median']:.1f} ms (CPU "
            f"{ip[n]['continued_ttft_cpu_ms_median']:.1f} ms) / prefill "
            f"{ip[n]['continued_prefill_tokens_median']:.0f} tokens" for n in ("off", "on"))
            + f"; on / off = {ip['continued_ttft_on_over_off']:.3f} (CPU "
            f"{ip['continued_ttft_cpu_on_over_off']:.3f})")
    if r["pressure"]:
        _print_pressure(r["pressure"])
    if r["in_process_pressure"]:
        _print_in_process_pressure(r["in_process_pressure"])
    print(f"targets: {r['targets']}")


def _print_multi_turn(mt: dict) -> None:
    print("\nturn | " + " | ".join(f"{n}: prefill/new, TTFT ms" for n in mt))
    for i in range(len(mt["on"]["turns"])):
        cells = []
        for n in mt:
            t = mt[n]["turns"][i]
            cells.append(f"{t['prefill_tokens']:5.0f}/{t['new_tokens']:<5d} {t['ttft_ms']:8.1f}")
        print(f"{i + 1:4d} | " + " | ".join(cells))
    print("continued turns (2..N), median: " + ", ".join(
        f"{n} TTFT {mt[n]['continued_ttft_ms_median']:.1f} ms / prefill "
        f"{mt[n]['continued_prefill_tokens_median']:.0f} tokens" for n in mt))


def _print_pressure(pr: dict) -> None:
    for n in ("recompute", "host"):
        x = pr[n]
        print(f"pressure {n:<9}: revisit hit rate {x['revisit_hit_rate']:.2f}, revisit TTFT "
              f"median {x['revisit_ttft_ms_median']:.1f} ms, first-visit {x['first_visit_ttft_ms_median']:.1f} ms")
    print(f"pressure: revisit TTFT host / recompute = {pr['revisit_ttft_host_over_recompute']:.3f}")


def _print_in_process_pressure(pr: dict) -> None:
    for n in ("recompute", "host"):
        x = pr[n]
        print(f"in-process pressure {n:<9}: revisit hit rate {x['revisit_hit_rate']:.2f}, "
              f"revisit TTFT median {x['revisit_ttft_ms_median']:.1f} ms (CPU "
              f"{x['revisit_ttft_cpu_ms_median']:.1f} ms), first-visit "
              f"{x['first_visit_ttft_ms_median']:.1f} ms, per revisit "
              f"{x['revisit_transfer_steps_median']:.0f} TRANSFER "
              f"({x['revisit_transfer_ms_median']:.1f} ms) + "
              f"{x['revisit_prefill_steps_median']:.0f} PREFILL steps "
              f"({x['revisit_prefill_ms_median']:.1f} ms)")
    print(f"in-process pressure: revisit TTFT host / recompute = "
          f"{pr['revisit_ttft_host_over_recompute']:.3f} (CPU time "
          f"{pr['revisit_ttft_cpu_host_over_recompute']:.3f}); same greedy outputs: "
          f"{pr['same_outputs']}")


if __name__ == "__main__":
    main()
