"""Structured output with speculation: JSON-schema requests through copied candidates.

    python bench/structured_speculative.py --backend cpu --batches 1 --json OUT
    python bench/structured_speculative.py --backend cuda --batches 1 8 32 --json OUT

The SmolLM2 speculative core (bench/speculative.py's: the committed trained head, widths
1..4 plus the prefix-limit programs) is served in-process by the real server (worker,
llguidance grammars, HTTP on 127.0.0.1) in three modes, one server each:

- off: speculation off (--speculative-width 0): constrained requests decode one token
  per step under their grammar mask;
- history: --history-drafting, --speculative-policy fixed: constrained lanes verify the
  copied candidates their grammar accepts, under per-position grammar masks
  (docs/speculative.md, "Constrained lanes");
- adaptive: history with the width policy (one untimed round first).

Requests: extraction prompts that quote their input into a JSON schema
(response_format json_schema, greedy), `batch` at once (the prompts repeated). Tokens/s
is completion tokens over the wall time of the round (prefill included: a client's
view); copied drafts and acceptances come from the server's spec-decode metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _report import write_json  # noqa: E402  bench/ is this script's folder

TEXTS = [
    ("Extract every person and their role from this text as JSON. Text: At the meeting, "
     "Maria Lopez, the project manager, introduced Daniel Okafor, the lead engineer, and "
     "Sofia Marchetti, the data analyst. Daniel Okafor presented the schedule."),
    ("Extract every person and their role from this text as JSON. Text: The committee "
     "includes Henrik Larsen, the treasurer, Aiko Tanaka, the secretary, and Peter "
     "Novak, the chair. Aiko Tanaka took the minutes."),
    ("Extract every person and their role from this text as JSON. Text: Our support team: "
     "Grace Kim, the support lead, Omar Haddad, the support engineer, and Lena Fischer, "
     "the documentation writer. Grace Kim answers escalations."),
]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["people"],
          "properties": {"people": {"type": "array", "minItems": 1, "maxItems": 4, "items": {
              "type": "object", "additionalProperties": False, "required": ["name", "role"],
              "properties": {"name": {"type": "string"}, "role": {"type": "string"}}}}}}
MODES = {"off": dict(speculative_width=0),
         "history": dict(history_drafting=True, speculative_policy="fixed"),
         "adaptive": dict(history_drafting=True, speculative_policy="adaptive")}
METRICS = {"copied_drafts": 'helios_spec_decode_draft_tokens_total{source="copied"}',
           "copied_accepted": 'helios_spec_decode_accepted_tokens_total{source="copied"}',
           "learned_drafts": 'helios_spec_decode_draft_tokens_total{source="learned"}'}


def _server(core_path: Path, public: Path, backend: str, options: dict):
    from helios_serve.bootstrap import Bootstrap
    from helios_serve.clock import ObservationClock
    from helios_serve.config import ServeOptions, resolve
    from helios_serve.loading import check_options
    from helios_serve.runtime import NativeModel
    from helios_serve.server import Server

    bootstrap = Bootstrap.load(core_path, [public], "bench.spec")
    serve_options = ServeOptions(port=0, max_active=64, queue_capacity=128, **options)
    settings = resolve(serve_options, bootstrap.contract)
    check_options(bootstrap.prepared, serve_options)
    model = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, backend,
                             max_concurrency=settings.max_active,
                             speculative_width=options.get("speculative_width"))
    return bootstrap, Server.start(bootstrap, model, settings, ObservationClock())


def _metrics(server) -> dict[str, float]:
    import httpx

    text = httpx.get(server.url + "/metrics").text
    out = {}
    for key, prefix in METRICS.items():
        lines = [line for line in text.splitlines() if line.startswith(prefix)]
        out[key] = float(lines[0].split()[-1]) if lines else 0.0
    return out


def _round(server, batch: int, tokens: int):
    import httpx

    def ask(i):
        body = {"model": server.settings.served_name, "temperature": 0, "max_tokens": tokens,
                "messages": [{"role": "user", "content": TEXTS[i % len(TEXTS)]}],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "people", "schema": SCHEMA}},
                "return_token_ids": True}
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=3600)
        r.raise_for_status()
        return r.json()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(batch) as pool:
        answers = list(pool.map(ask, range(batch)))
    return answers, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--target", default="sm_90")
    ap.add_argument("--gguf", default=os.environ.get("HELIOS_SMOLLM2_GGUF"))
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--batches", type=int, nargs="+", default=[1])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import speculative as base

    args.decode_batch = sorted({1, 2, 4, 8, 16, 32, *args.batches})
    args.drafter = args.drafter or (str(base.TRAINED) if base.TRAINED.is_file()
                                    else "random:7:8192")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        base._smollm2_core(args, Path(d))
        core, public = Path(d) / "spec.core", Path(d) / "key.pem.pub"
        for mode in args.modes:
            bootstrap, server = _server(core, public, args.backend, MODES[mode])
            try:
                for batch in args.batches:
                    if mode == "adaptive":
                        _round(server, batch, args.tokens)  # untimed: the policy measures
                    before = _metrics(server)
                    answers, seconds = _round(server, batch, args.tokens)
                    after = _metrics(server)
                    tokens = sum(a["usage"]["completion_tokens"] for a in answers)
                    row = {"mode": mode, "batch": batch, "completion_tokens": tokens,
                           "seconds": round(seconds, 3), "tok_s": round(tokens / seconds, 2),
                           **{k: after[k] - before[k] for k in METRICS},
                           "valid_json": sum(_valid(a) for a in answers),
                           "ids": [a["choices"][0]["token_ids"] for a in answers]}
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "ids"}), flush=True)
            finally:
                server.stop()
                bootstrap.close()
    for r in rows:
        off = next((o for o in rows if o["mode"] == "off" and o["batch"] == r["batch"]), None)
        if off is not None:
            r["speedup_over_off"] = round(r["tok_s"] / off["tok_s"], 3)
            r["identical_to_off"] = r["ids"] == off["ids"]
    for r in rows:
        del r["ids"]
    result = {"model": "smollm2-135m-instruct", "drafter": args.drafter,
              "backend": args.backend, "max_tokens": args.tokens, "rows": rows,
              "commit": os.environ.get("HELIOS_COMMIT", "unknown")}
    print(f"{'mode':9} {'batch':>5} {'tok/s':>8} {'x off':>6} {'copied':>7} {'accepted':>8} "
          f"{'same':>5}")
    for r in rows:
        print(f"{r['mode']:9} {r['batch']:5d} {r['tok_s']:8.2f} "
              f"{r.get('speedup_over_off', 0):6.2f} {r['copied_drafts']:7.0f} "
              f"{r['copied_accepted']:8.0f} {str(r.get('identical_to_off', '')):>5}")
    if args.json:
        write_json(args.json, result)
    return 0


def _valid(answer) -> bool:
    try:
        json.loads(answer["choices"][0]["message"]["content"])
        return True
    except ValueError:
        return False


if __name__ == "__main__":
    sys.exit(main())
