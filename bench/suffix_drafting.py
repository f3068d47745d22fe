"""Suffix drafting against the latest-occurrence copy: acceptance and speed on SmolLM2.

    OPENBLAS_NUM_THREADS=1 uv run python bench/suffix_drafting.py --tokens 128 --rounds 2 \
        --json bench/results/suffix_drafting_cpu.json
    # acceptance only, over the greedy text a run above (or history_trace.py) recorded:
    uv run python bench/suffix_drafting.py --outputs bench/results/suffix_drafting_cpu.json \
        --no-speed --json OUT

Two measurements on the editing and extraction prompt sets
(bench/prompts/speculative_sets.json), greedy, batch 1:

1. Acceptance (replay, no model): over each prompt's greedy answer (cut at its first
   EOS), the scheduler's step structure is replayed for lanes of each width of --widths
   with copied drafts only (bench/history_trace.replay: pending token + up to W - 1
   proposed tokens, lane length min(W, budget left), accepted = the longest prefix equal
   to the text, then accepted + 1 tokens emitted). Proposers: `copy` (the served
   default: speculation.HistoryIndex, copy cursor and ranked occurrences), `suffix`
   (speculation.SuffixIndex with its defaults), `suffix_arctic` (SuffixIndex with Arctic
   Inference's factor 1, offset 0). Reported: mean accepted length (tokens per step),
   copied drafts accepted / offered, and per draft position k the share of steps that
   offered a k-th draft in which it was accepted.
2. Speed (--speed, the default): the SmolLM2 speculative core with the committed trained
   head through the real scheduler (bench/speculative_history.serve: the model worker's
   loop) in modes off / learned+history / learned+suffix (fixed width policy: every
   lane as wide as it may be), rounds interleaved; tokens/s over the generation steps,
   the median of --rounds, and the ratio to off (median of per-round ratios). Greedy
   text is the same in every mode (checked: `identical_to_off`).

Greedy text does not depend on speculation (docs/speculative.md, "Exactness"), so the
off run's answers are the text every proposer is replayed against.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _report import git_commit, write_json  # noqa: E402  bench/ is this script's folder

SPEED_MODES = ("off", "learned+history", "learned+suffix")


def proposers():
    from helios_serve.speculation import HistoryIndex, SuffixIndex

    return {"copy": HistoryIndex, "suffix": SuffixIndex,
            "suffix_arctic": lambda: SuffixIndex(factor=1.0, offset=0.0)}


def acceptance(prompt: list[int], answer: list[int], width: int, make) -> dict:
    """bench/history_trace.replay of one proposer, summarized with per-position rates."""
    from history_trace import replay

    r = replay(prompt, answer, width, make)
    offered, accepted = Counter(), Counter()
    for step in r["trace"]:
        for k in range(step["offered"]):
            offered[k] += 1
            accepted[k] += int(k < step["accepted"])
    return {"steps": r["steps"], "emitted": r["emitted"],
            "mean_accepted_length": r["mean_accepted_length"],
            "copied_offered": r["copied_offered"], "copied_accepted": r["copied_accepted"],
            "offered_per_position": [offered[k] for k in range(width - 1)],
            "accepted_per_position": [accepted[k] for k in range(width - 1)]}


def speed(args, sets, ck) -> tuple[list[dict], dict[str, list[list[int]]]]:
    """Speed rows per set and mode, and the off mode's greedy outputs per set."""
    import speculative as base
    import speculative_history as sh
    from helios_serve.engine.plan import SamplingParams
    from helios_serve.testing.native import load_native

    args.backend, args.target, args.decode_batch = "cpu", "sm_90", [1, 2, 4, 8, 16, 32]
    args.drafter = str(base.TRAINED)
    with tempfile.TemporaryDirectory() as d:
        model = load_native(base._smollm2_core(args, Path(d)), "cpu", cpu_frames=1)
    rows, greedy = [], {}
    for name in args.sets:
        runs = {m: [] for m in SPEED_MODES}
        outputs = {}
        for _ in range(args.rounds):
            for mode in SPEED_MODES:
                result = [sh.serve(model, [p], args.tokens, SamplingParams(), sh.MODES[mode])
                          for p in sets[name]]
                outputs[mode] = [o for out, _, _ in result for o in out.values()]
                runs[mode].append(result)
        greedy[name] = outputs["off"]
        off = [sum(len(o) for out, _, _ in r for o in out.values())
               / sum(sec for _, sec, _ in r) for r in runs["off"]]
        for mode in SPEED_MODES:
            rates = [sum(len(o) for out, _, _ in r for o in out.values())
                     / sum(sec for _, sec, _ in r) for r in runs[mode]]
            stats = [st for _, _, st in runs[mode][-1]]
            lanes = sum(sum(st.spec_accepted_lengths) for st in stats)
            accepted = sum(st.spec_accepted_tokens for st in stats)
            row = {"set": name, "mode": mode, "requests": len(sets[name]),
                   "tokens": sum(len(o) for o in outputs[mode]),
                   "tok_s": round(statistics.median(rates), 2),
                   "tok_s_rounds": [round(x, 2) for x in rates],
                   "speedup_over_off": round(statistics.median(
                       a / b for a, b in zip(rates, off, strict=True)), 3),
                   "mean_accepted_length": round((accepted + lanes) / lanes, 3)
                   if lanes else None,
                   "copied_drafts": sum(st.spec_copied_draft_tokens for st in stats),
                   "copied_accepted": sum(st.spec_copied_accepted_tokens for st in stats),
                   "identical_to_off": outputs[mode] == outputs["off"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    model.close()
    return rows, greedy


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=os.environ.get("HELIOS_SMOLLM2_GGUF"))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--widths", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--sets", nargs="+", default=["editing", "extraction"])
    ap.add_argument("--speed", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--outputs", help="replay over the greedy outputs of this JSON (this "
                                      "script's or bench/history_trace.py's)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import speculative_history as sh
    from helios_ignition.checkpoint import load_gguf, smollm2_gguf_path

    ck = load_gguf(args.gguf or smollm2_gguf_path())
    sets = sh.prompt_sets(ck)
    load_before = os.getloadavg()  # the machine is shared: how busy it was
    commit = os.environ.get("HELIOS_COMMIT") or git_commit() or "unknown"  # what runs now
    rows, greedy = speed(args, sets, ck) if args.speed else ([], {})
    if args.outputs:
        previous = json.loads(Path(args.outputs).read_text())["sets"]
        greedy = {name: [p["output"] for p in previous[name]["prompts"]] for name in args.sets}
    if not greedy:
        ap.error("--no-speed needs --outputs (the greedy text to replay against)")
    eos = set(ck.eos_token_ids)
    result = {"model": "smollm2-135m-instruct", "backend": "cpu", "batch": 1,
              "tokens_per_request": args.tokens, "rounds": args.rounds,
              "widths": args.widths,
              "commit": commit,
              "machine": f"{platform.machine()}, {os.cpu_count()} cpus (shared)",
              "load_average_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
              "command": "python bench/suffix_drafting.py " + " ".join(argv or sys.argv[1:]),
              "outputs_from": args.outputs or "this run", "speed": rows, "sets": {}}
    totals: dict[str, dict[str, list[int]]] = {}
    for name in args.sets:
        entry = {"prompts": []}
        for prompt, output in zip(sets[name], greedy[name], strict=True):
            answer = next((output[:j + 1] for j, t in enumerate(output) if t in eos), output)
            item = {"output": output, "answer_tokens": len(answer), "replay": {}}
            for width in args.widths:
                for label, make in proposers().items():
                    r = item["replay"][f"{label}@w{width}"] = acceptance(prompt, answer,
                                                                         width, make)
                    t = totals.setdefault(name, {}).setdefault(f"{label}@w{width}", [0, 0])
                    t[0] += r["emitted"]
                    t[1] += r["steps"]
            entry["prompts"].append(item)
        result["sets"][name] = entry
    result["mean_accepted_length"] = {
        name: {key: round(e / max(s, 1), 3) for key, (e, s) in keys.items()}
        for name, keys in totals.items()}
    print(json.dumps(result["mean_accepted_length"], indent=1))
    for r in rows:
        print(f"{r['set']:11} {r['mode']:16} {r['tok_s']:7.2f} tok/s "
              f"{r['speedup_over_off']:5.2f}x off  acc.len {r['mean_accepted_length'] or 0:5.2f}"
              f"  copied {r['copied_accepted']}/{r['copied_drafts']}"
              f"  identical {r['identical_to_off']}")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
