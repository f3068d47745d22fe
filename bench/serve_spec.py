"""The width policy through HTTP (issue 32, item 5): helios-serve with the SmolLM2
speculative core, speculation off against on, in one run.

    python bench/serve_spec.py --backend cuda --gguf SMOL.gguf --json OUT.json
    python bench/serve_spec.py --backend cpu --concurrency 1 2 --tokens 16 --sets editing \
        --samplings greedy --json OUT.json          # a smoke run on the CPU backend

One core (the recipe recipes/smollm2_135m_instruct_speculative.py -- the committed
trained head, SPECULATIVE widths 1..4 and the prefix-limit programs -- with decode
batches up to the largest concurrency, exported here; or --core/--trust/--accept) is
served twice, one server after the other on 127.0.0.1 (a child helios-serve, bench/
server.py): `off` (--speculative-width 0) and `on` (--speculative-width 4
--speculative-policy adaptive --history-drafting [--history-proposer P]). Each server
runs every (prompt set, sampling, concurrency C) level: chat (scripts/drafter_prompts.py,
eval split), editing and extraction (bench/prompts/speculative_sets.json); greedy, and
sampled T 0.8 / top_p 0.95 with a seed per request (coupled verification: the same
seeds give the decode text); C in 1, 8, 32, 64, 128, 256.

A level: one untimed round of C requests of --warmup-tokens tokens (every program the
level uses has run, and the width policy has measured its options at this capacity),
then max(C, --min-requests) requests of at most --tokens tokens each (ending at EOS,
as served requests do), C always in flight (closed loop; request i asks prompt i of the
set, cycled, with seed 1000 + i). Non-streaming chat completions from one asyncio
client (httpx): output tokens/s = completion tokens (usage) / the level's wall time.
From /metrics before and after the level: drafts offered and accepted per source, the
mean accepted length (helios_spec_decode_accepted_length: tokens per lane round with
drafts) and acceptance per draft position. `speedup` is on over off at the same level;
`same_text` counts requests whose text is identical to the off run's (greedy: all of
them by construction; sampled: the seeded draws). `--modes off on plain` also serves the
embedded default's recipe (no drafter: its decode runs `linear`, not the row-invariant
kernel) at the same levels: `speedup_vs_plain`.

JSON: commit, card (nvidia-smi's name, else the CPU), backend, options, and a row per
level and mode. Figures only; never asserted on.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_commit, write_json  # noqa: E402  bench/ is this script's folder
from server import ServeProcess  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SAMPLINGS = {"greedy": dict(temperature=0.0), "sampled": dict(temperature=0.8, top_p=0.95)}
LEVELS = (1, 8, 32, 64, 128, 256)
SETS = ("chat", "editing", "extraction")
NS = "bench.serve-spec"


def prompt_sets(chat_count: int) -> dict[str, list[list[dict]]]:
    """Message lists per set: the editing and extraction prompts, `chat_count` chat ones."""
    sets = json.loads((ROOT / "bench/prompts/speculative_sets.json").read_text())["sets"]
    out = {name: [[{"role": "user", "content": p}] for p in prompts]
           for name, prompts in sets.items()}
    spec = importlib.util.spec_from_file_location("drafter_prompts",
                                                  ROOT / "scripts/drafter_prompts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out["chat"] = module.chat_prompts("eval", chat_count, seed=3)
    return out


def card() -> str:
    """The GPU's name (nvidia-smi), else the CPU's."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        if out.strip():
            return out.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return f"cpu: {platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def export(args, folder: Path, plain: bool = False) -> tuple[Path, Path]:
    """The speculative SmolLM2 core (`plain`: the embedded default's recipe, no drafter)
    with decode batches up to max(--concurrency), signed with folder/key.pem."""
    from helios_ignition.export import export_core
    from helios_tools.core import generate_key, write_key_pair

    top = 1 << (max(args.concurrency) - 1).bit_length()
    batches = [1 << i for i in range(top.bit_length())]  # 1, 2, 4, ... up to top
    key = folder / "key.pem"
    if not key.is_file():
        write_key_pair(generate_key(), key)
    name = "serve_plain" if plain else "serve_spec"
    recipe = folder / f"{name}_recipe.py"
    base = ROOT / ("recipes/smollm2_135m_instruct.py" if plain
                   else "recipes/smollm2_135m_instruct_speculative.py")
    # the speculative recipe's drafter path is relative to its own folder: made absolute
    drafter = ("" if plain else
               "drafter = replace(b.RECIPE.drafter, checkpoint=str(__import__('pathlib').Path("
               f"{str(base.parent)!r}) / b.RECIPE.drafter.checkpoint))\n"
               "RECIPE = replace(RECIPE, drafter=drafter)\n")
    recipe.write_text(
        "from dataclasses import replace\nimport importlib.util\n"
        f"s = importlib.util.spec_from_file_location('b', {str(base)!r})\n"
        "b = importlib.util.module_from_spec(s); s.loader.exec_module(b)\n"
        "RECIPE = replace(b.RECIPE, capacities=replace("
        f"b.RECIPE.capacities, decode_batch={tuple(batches)!r}))\n" + drafter)
    out = folder / f"{name}.core"
    export_core(recipe, checkpoint=args.gguf or "smollm2", key_path=key, namespace=NS, out=out,
                targets=(args.target,) if args.backend == "cuda" else ())
    return out, Path(str(key) + ".pub")


def _core(args, folder: Path, plain: bool) -> tuple[Path, Path]:
    """The core of `folder` exported before (--export-dir), else a fresh export."""
    core = folder / ("serve_plain.core" if plain else "serve_spec.core")
    if core.is_file():
        print(f"reusing {core}", flush=True)
        return core, folder / "key.pem.pub"
    t0 = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    core, trust = export(args, folder, plain)
    print(f"exported {core} in {time.perf_counter() - t0:.1f} s", flush=True)
    return core, trust


def spec_counters(text: str) -> dict:
    """The spec-decode samples of a /metrics text: per-source drafts and accepts, the
    accepted-length histogram's sum and count, per-position drafts and accepts."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict = {"draft": {}, "accepted": {}, "pos_draft": {}, "pos_accepted": {},
                 "length_sum": 0.0, "length_count": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            lab = s.labels
            if s.name == "helios_spec_decode_draft_tokens_total":
                out["draft"][lab["source"]] = s.value
            elif s.name == "helios_spec_decode_accepted_tokens_total":
                out["accepted"][lab["source"]] = s.value
            elif s.name == "helios_spec_decode_draft_per_position_total":
                out["pos_draft"][f"{lab['source']}:{lab['position']}"] = s.value
            elif s.name == "helios_spec_decode_accepted_per_position_total":
                out["pos_accepted"][f"{lab['source']}:{lab['position']}"] = s.value
            elif s.name == "helios_spec_decode_accepted_length_sum":
                out["length_sum"] = s.value
            elif s.name == "helios_spec_decode_accepted_length_count":
                out["length_count"] = s.value
    return out


def acceptance(before: dict, after: dict) -> dict:
    """What one level added to the spec-decode counters."""
    def delta(key):
        return {k: after[key].get(k, 0.0) - before[key].get(k, 0.0) for k in after[key]}

    draft, acc = delta("draft"), delta("accepted")
    pos_d, pos_a = delta("pos_draft"), delta("pos_accepted")
    lanes = after["length_count"] - before["length_count"]
    return {
        "drafts": {k: int(v) for k, v in draft.items()},
        "accepted": {k: int(acc.get(k, 0)) for k in draft},
        "acceptance": {k: round(acc.get(k, 0) / v, 4) for k, v in draft.items() if v},
        "lanes_with_drafts": int(lanes),
        "mean_accepted_length": round((after["length_sum"] - before["length_sum"]) / lanes, 4)
        if lanes else None,
        "acceptance_per_position": {k: round(pos_a.get(k, 0) / v, 4)
                                    for k, v in sorted(pos_d.items()) if v},
    }


async def _level(url: str, model: str, prompts: list, concurrency: int, count: int,
                 max_tokens: int, sampling: dict) -> tuple[float, list[tuple[int, str]]]:
    """`count` chat completions with `concurrency` in flight: (wall s, [(completion
    tokens, text)] in request order)."""
    results: list = [None] * count
    queue = list(range(count))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=600.0, limits=limits, trust_env=False) as client:
        async def worker():
            while queue:
                i = queue.pop(0)
                body = {"model": model, "messages": prompts[i % len(prompts)],
                        "max_tokens": max_tokens, "seed": 1000 + i, **sampling}
                r = await client.post(url + "/v1/chat/completions", json=body)
                if r.status_code != 200:
                    raise SystemExit(f"request {i}: HTTP {r.status_code} {r.text[:300]}")
                data = r.json()
                results[i] = (data["usage"]["completion_tokens"],
                              data["choices"][0]["message"]["content"] or "")

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0, results


def run_mode(args, mode: str, core: Path, trust: Path, accept: str, sets: dict,
             log: Path) -> list[dict]:
    """Serve `core` in `mode` and run every level; KV pages are the backend's default
    (cuda: a fraction of the memory left after loading; cpu: the core's prepared count,
    enough for a smoke run's few requests)."""
    options = ["--max-active", str(max(args.concurrency))]
    if mode == "off":
        options += ["--speculative-width", "0"]
    elif mode == "on":
        options += ["--speculative-width", str(args.width), "--speculative-policy", "adaptive",
                    "--history-drafting", "--history-proposer", args.history_proposer]
    rows = []
    with ServeProcess(core, trust, accept, log=log, backend=args.backend,
                      options=options) as server:
        model = server.client.get(server.url + "/v1/models").json()["data"][0]["id"]
        print(f"{mode}: serving at {server.url} ({server.startup_s:.1f} s to start)",
              flush=True)
        for name in args.sets:
            for label in args.samplings:
                for c in args.concurrency:
                    count = max(c, args.min_requests)
                    asyncio.run(_level(server.url, model, sets[name], c, c, args.warmup_tokens,
                                       SAMPLINGS[label]))
                    before = spec_counters(server.metrics_text())
                    wall, results = asyncio.run(_level(server.url, model, sets[name], c, count,
                                                       args.tokens, SAMPLINGS[label]))
                    after = spec_counters(server.metrics_text())
                    tokens = sum(n for n, _ in results)
                    row = {"mode": mode, "set": name, "sampling": label, "concurrency": c,
                           "requests": count, "completion_tokens": tokens,
                           "wall_s": round(wall, 4), "tok_s": round(tokens / wall, 2),
                           "text_sha": [hashlib.sha256(t.encode()).hexdigest()[:16]
                                        for _, t in results]}
                    if mode == "on":
                        row.update(acceptance(before, after))
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items()
                                      if k not in ("text_sha", "acceptance_per_position")}),
                          flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--target", default="sm_90")
    ap.add_argument("--gguf", default=os.environ.get("HELIOS_SMOLLM2_GGUF"))
    ap.add_argument("--core", help="a speculative core (else one is exported here)")
    ap.add_argument("--trust")
    ap.add_argument("--export-dir", help="export the core here, or reuse the one exported "
                    "there before (its decode batches must cover --concurrency)")
    ap.add_argument("--accept", default=NS)
    ap.add_argument("--concurrency", type=int, nargs="+", default=list(LEVELS))
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--samplings", nargs="+", default=list(SAMPLINGS), choices=list(SAMPLINGS))
    ap.add_argument("--tokens", type=int, default=128, help="max_tokens of a timed request")
    ap.add_argument("--warmup-tokens", type=int, default=16)
    ap.add_argument("--min-requests", type=int, default=8,
                    help="timed requests per level at least (C when larger)")
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--history-proposer", choices=("copy", "suffix"), default="copy")
    ap.add_argument("--modes", nargs="+", default=["off", "on"], choices=("off", "on", "plain"),
                    help="plain: also serve the embedded default's recipe (no drafter), "
                         "the decode a core without speculation runs")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.core and not args.trust:
        ap.error("--core needs --trust")
    sets = prompt_sets(chat_count=32)
    out_dir = Path(args.json).parent if args.json else Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory() as d:
        folder = Path(args.export_dir) if args.export_dir else Path(d)
        if args.core:
            core, trust = Path(args.core), Path(args.trust)
        else:
            core, trust = _core(args, folder, plain=False)
        rows = []
        for mode in args.modes:
            c, tr = _core(args, folder, plain=True) if mode == "plain" else (core, trust)
            rows += run_mode(args, mode, c, tr, args.accept, sets,
                             out_dir / f"serve_spec_{mode}.log")
    by = {m: {(r["set"], r["sampling"], r["concurrency"]): r for r in rows if r["mode"] == m}
          for m in ("off", "plain")}
    for r in rows:
        key = (r["set"], r["sampling"], r["concurrency"])
        base = by["off"].get(key)
        if r["mode"] != "off" and base:
            r["same_text"] = sum(a == b for a, b in zip(r["text_sha"], base["text_sha"],
                                                        strict=True))
            if r["mode"] == "on":
                r["speedup"] = round(r["tok_s"] / base["tok_s"], 3)
        if r["mode"] == "on" and key in by["plain"]:
            r["speedup_vs_plain"] = round(r["tok_s"] / by["plain"][key]["tok_s"], 3)
    print(f"{'set':11} {'sampling':8} {'C':>4} {'plain tok/s':>11} {'off tok/s':>10} "
          f"{'on tok/s':>10} {'speedup':>8} {'mean acc len':>12} {'same text':>9}")
    for r in rows:
        if r["mode"] == "on" and "speedup" in r:
            key = (r["set"], r["sampling"], r["concurrency"])
            plain = by["plain"].get(key, {}).get("tok_s", float("nan"))
            print(f"{r['set']:11} {r['sampling']:8} {r['concurrency']:4d} {plain:11.1f} "
                  f"{by['off'][key]['tok_s']:10.1f} {r['tok_s']:10.1f} {r['speedup']:8.3f} "
                  f"{r['mean_accepted_length'] or 0:12.3f} {r['same_text']:>4}/{r['requests']}")
    speedups = [r["speedup"] for r in rows if "speedup" in r]
    result = {"commit": git_commit(), "card": card(), "backend": args.backend,
              "options": {k: v for k, v in vars(args).items() if k not in ("json",)},
              "load_average_1m": round(os.getloadavg()[0], 2), "rows": rows,
              "min_speedup": min(speedups) if speedups else None,
              "median_speedup": statistics.median(speedups) if speedups else None}
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
