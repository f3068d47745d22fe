"""Why copied drafts are rejected: history proposals against the model's own output.

    python bench/history_trace.py --tokens 256 --real --widths 4 8 16 \
        --json bench/results/history_trace_cpu.json
    # replay only, from the greedy text a run above recorded:
    python bench/history_trace.py --outputs bench/results/history_trace_cpu.json ...

Greedy text does not depend on speculation (docs/speculative.md, "Exactness"), so a
greedy DECODE run of each prompt (bench/speculative_history.py's editing and extraction
sets, batch 1) gives the text every speculative run emits. Over that text, cut at its
first EOS (where a server stops), this script replays the scheduler's step structure for
lanes of each width of --widths (pending token + up to W - 1 copied drafts, lane length
min(W, budget left)) with each history proposer of
`PROPOSERS` and counts, per step: the copied proposal offered, how many of its tokens
are accepted (the longest prefix equal to the text), and why it ended:

- no_match: no suffix of the sequence occurred before (nothing copied; learned drafts);
- wrong_occurrence: the proposal diverged, but another earlier occurrence of the same
  longest matched suffix (n = 4, 3, 2, 1) continues with the emitted tokens further;
- diverged: the proposal diverged and no occurrence of a matched suffix does better
  (the model writes something the sequence never had: the renamed identifier);
- short: all copied tokens accepted, but the source ended before W - 1 tokens;
- ceiling: all W - 1 copied tokens accepted (the lane's width cut it); `run_beyond`
  is how many more tokens the same copy would have kept matching.

A replayed step emits accepted + 1 tokens; learned drafts after an accepted copied run
are not modelled here (they are in the real runs, --real). With --real the script also
runs learned+history through the real Scheduler for the same prompts and records each
lane: the copied ids offered, offers, accepted drafts, and the accepted copied count;
its emitted text must equal the DECODE text (checked).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _report import write_json  # noqa: E402  bench/ is this script's folder


def _matched_sources(seq: list[int], sizes=(4, 3, 2, 1)):
    """(n, [follower positions of every earlier occurrence of the last n tokens]) for
    the longest n with an earlier occurrence."""
    for n in sizes:
        if len(seq) <= n:
            continue
        key = seq[-n:]
        starts = [e for e in range(n, len(seq)) if seq[e - n:e] == key]
        if starts:
            return n, starts
    return 0, []


def _lcp(a, b) -> int:
    k = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        k += 1
    return k


def replay(prompt: list[int], output: list[int], width: int, make) -> dict:
    """Replay lanes of width `width` over `output` (the greedy text after `prompt`, its
    first token from prefill) with the proposer `make()`; returns counts per step."""
    proposer = make()
    seq = list(prompt) + output[:1]
    pos = 1  # output tokens known (the first is the prefill's)
    steps, reasons, lengths = [], Counter(), Counter()
    offered = accepted_copied = emitted_total = 0
    while pos < len(output):
        budget = len(output) - pos + 1  # tokens still to emit incl. this step's pending
        n = min(width, budget)
        ids = tuple(proposer.propose(seq, n - 1)) if n > 1 else ()
        truth = output[pos:pos + n - 1]
        acc = _lcp(ids, truth)
        if not ids:
            reason = "no_match" if n > 1 else "width_one"
        elif acc < len(ids):
            _, starts = _matched_sources(seq)
            best = max((_lcp(seq[s:s + n - 1], truth) for s in starts), default=0)
            reason = "wrong_occurrence" if best > acc else "diverged"
        elif len(ids) < n - 1:
            reason = "short"
        else:
            reason = "ceiling"
        beyond = 0
        if reason == "ceiling":  # how far the same copy would have gone on matching
            n_, starts = _matched_sources(seq)
            for s in starts:
                if tuple(seq[s:s + len(ids)]) == ids:
                    k = len(ids)
                    while (pos + k < len(output) and s + k < len(seq)
                           and seq[s + k] == output[pos + k]):
                        k += 1
                    beyond = max(beyond, k - len(ids))
        emit = acc + 1
        if hasattr(proposer, "accept"):
            proposer.accept(acc)
        steps.append({"pos": pos, "offered": len(ids), "accepted": acc, "reason": reason,
                      "run_beyond": beyond})
        reasons[reason] += 1
        lengths[emit] += 1
        offered += len(ids)
        accepted_copied += acc
        emitted_total += emit
        seq.extend(output[pos:pos + emit])
        pos += emit
    return {"steps": len(steps), "emitted": emitted_total,
            "mean_accepted_length": round(emitted_total / max(len(steps), 1), 3),
            "copied_offered": offered, "copied_accepted": accepted_copied,
            "reasons": dict(reasons), "emitted_per_step": dict(sorted(lengths.items())),
            "trace": steps}


def proposers():
    """Replayed proposers: the one before this change (latest occurrence) and its parts."""
    from helios_serve.speculation.history import HistoryIndex

    return {"latest": lambda: HistoryIndex(cursor=False, candidates=1, resume=0),
            "cursor": lambda: HistoryIndex(candidates=1, resume=0),
            "ranked": lambda: HistoryIndex(cursor=False),
            "cursor+ranked": lambda: HistoryIndex(),
            "cursor+ranked+1gram": lambda: HistoryIndex((4, 3, 2, 1))}


def generate(model, prompts, tokens, mode, trace=None):
    """Greedy run of each prompt alone through the real Scheduler (bench/
    speculative_history.serve's loop); `trace` collects per-lane records."""
    from helios_serve.engine.plan import SamplingParams
    from helios_serve.scheduler import FinishReason, SchedRequest, Scheduler

    outputs = []
    for prompt in prompts:
        geometry = model.manifests
        if not mode["widths"]:
            geometry = replace(geometry, speculative_widths=(), prefix_programs=(),
                               copied_proposals=False)
        scheduler = Scheduler(geometry, frames=1, device_pending=model.device_pending,
                              history_drafting=mode["history"], width_policy=False)
        assert scheduler.add(SchedRequest(request_id=0, prompt_tokens=tuple(prompt),
                                          max_output_tokens=tokens,
                                          sampling=SamplingParams())) is None
        out, lanes = [], []
        while scheduler.has_work():
            plan = scheduler.schedule()
            sampled = model.execute(plan)
            if plan.kind.value == "speculative" and trace is not None:
                for row, lane in zip(plan.rows, sampled, strict=True):
                    ids = row.candidates.ids if row.candidates else ()
                    offers, acc, emitted = (int(v) for v in lane[1:4])
                    got = [int(t) for t in lane[6:6 + emitted]]
                    lanes.append({"pos": len(out), "copied": list(ids), "offers": offers,
                                  "accepted": acc, "copied_accepted": _lcp(ids, got[:-1]),
                                  "emitted": got})
            for result in scheduler.complete(plan, sampled):
                if result.token_id is None or not scheduler.is_live(result.request_id):
                    continue
                out.append(result.token_id)
                if result.output_tokens == tokens:
                    scheduler.finish(result.request_id, FinishReason.LENGTH)
        outputs.append(out)
        if trace is not None:
            trace.append(lanes)
    return outputs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=os.environ.get("HELIOS_SMOLLM2_GGUF"))
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--widths", type=int, nargs="+", default=[4],
                    help="lane widths replayed (the SmolLM2 speculative core serves 4)")
    ap.add_argument("--sets", nargs="+", default=["editing", "extraction"])
    ap.add_argument("--real", action="store_true", help="also trace real learned+history runs")
    ap.add_argument("--outputs", help="reuse a JSON written before (its greedy outputs)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import speculative as base
    import speculative_history as sh
    from helios_ignition.checkpoint import load_gguf, smollm2_gguf_path
    from helios_tools.frontend_assets import load_tokenizer

    ck = load_gguf(args.gguf or smollm2_gguf_path())
    tok = load_tokenizer(ck.tokenizer_json)
    sets = sh.prompt_sets(ck)
    previous = json.loads(Path(args.outputs).read_text()) if args.outputs else None
    model = None
    if previous is None or args.real:
        args.backend, args.target, args.decode_batch = "cpu", "sm_90", [1, 2, 4, 8, 16, 32]
        args.drafter = str(base.TRAINED)
        with tempfile.TemporaryDirectory() as d:
            model = base._load(args, base._smollm2_core(args, Path(d)))
    eos = set(ck.eos_token_ids)
    result = {"tokens": args.tokens, "widths": args.widths,
              "commit": os.environ.get("HELIOS_COMMIT", "unknown"),
              "command": "python bench/history_trace.py " + " ".join(argv or sys.argv[1:]),
              "outputs_from": args.outputs and (previous.get("outputs_from")
                                                or args.outputs) or "this run",
              "sets": {}}
    for name in args.sets:
        prompts = sets[name]
        if previous is not None:
            outputs = [p["output"] for p in previous["sets"][name]["prompts"]]
        else:
            t0 = time.perf_counter()
            outputs = generate(model, prompts, args.tokens, sh.MODES["off"])
            print(f"{name}: decode {time.perf_counter() - t0:.1f} s", flush=True)
        real = []
        if args.real:
            got = generate(model, prompts, args.tokens, sh.MODES["learned+history"], real)
            assert got == outputs, "greedy learned+history differs from decode"
        entry = {"prompts": []}
        for i, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
            # the answer ends at its first EOS (a server stops there; greedy text past
            # it is a made-up next turn with nothing to copy)
            answer = next((output[:j + 1] for j, t in enumerate(output) if t in eos), output)
            item = {"output": output, "answer_tokens": len(answer),
                    "text": tok.decode(answer), "replay": {}}
            for width in args.widths:
                for label, make in proposers().items():
                    key = label if width == args.widths[0] else f"{label}@w{width}"
                    item["replay"][key] = replay(prompt, answer, width, make)
                    if width != args.widths[0]:  # per-step traces of the first width only
                        del item["replay"][key]["trace"]
            if real:
                lanes = real[i]
                item["real"] = {
                    "lanes": len(lanes),
                    "mean_accepted_length": round(sum(len(x["emitted"]) for x in lanes)
                                                  / max(len(lanes), 1), 3),
                    "copied_offered": sum(min(len(x["copied"]), x["offers"] - 1)
                                          for x in lanes),
                    "copied_accepted": sum(x["copied_accepted"] for x in lanes),
                    "trace": lanes}
            entry["prompts"].append(item)
        result["sets"][name] = entry
    if model is not None:
        model.close()
    print(f"{'set':11} {'prompt':>6} {'proposer':14} {'steps':>5} {'acc.len':>7} "
          f"{'copied':>9}  reasons")
    for name, entry in result["sets"].items():
        for i, item in enumerate(entry["prompts"]):
            for label, r in item["replay"].items():
                print(f"{name:11} {i:6d} {label:14} {r['steps']:5d} "
                      f"{r['mean_accepted_length']:7.3f} "
                      f"{r['copied_accepted']:4d}/{r['copied_offered']:<4d}  {r['reasons']}")
            if "real" in item:
                r = item["real"]
                print(f"{name:11} {i:6d} {'real':14} {r['lanes']:5d} "
                      f"{r['mean_accepted_length']:7.3f} "
                      f"{r['copied_accepted']:4d}/{r['copied_offered']:<4d}")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
