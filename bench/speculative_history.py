"""History drafting and the width policy (issue "Speculative generation II").

    python bench/speculative_history.py --backend cpu --batches 1 --tokens 128 --rounds 3 \
        --json OUT
    python bench/speculative_history.py --backend cuda --batches 1 8 32 64 --json OUT

The SmolLM2 speculative core (bench/speculative.py's: the committed trained head, widths
1..4, plus the prefix-limit programs) serves the three prompt sets through the real
scheduler (no HTTP): (a) editing -- return a ~300-token code block with one identifier
renamed; (b) extraction and summarization that quote the input (both in
bench/prompts/speculative_sets.json); (c) open chat (scripts/drafter_prompts.py, eval
split). Modes, same core, same process:

- off: speculation off (the scheduler plans DECODE steps only, --speculative-width 0);
- learned: the head's drafts, every lane as wide as it may be (--speculative-policy fixed);
- learned+history_latest: plus copied candidates from the proposer before the copy
  cursor (latest occurrence of the longest n-gram; speculation/history.py), fixed;
- learned+history: plus copied candidates (--history-drafting: copy cursor, ranked
  occurrences), fixed;
- learned+suffix: plus suffix drafting's candidates (--history-proposer suffix:
  speculation/suffix.py), fixed (only when --modes names it, as adaptive+suffix);
- adaptive: learned+history with the width policy (--speculative-policy adaptive),
  after one untimed run of the same requests (a server's policy keeps its measurements);
  adaptive+suffix: the same with suffix drafting.

Every prompt of a set runs, in groups of `batch` requests one after another (batch 1:
each prompt alone; the set repeated to fill a larger batch). A request generates up to
--tokens tokens and ends at its first EOS, as a served one does (greedy text, and seeded
sampled text under coupled verification, is the same in every mode, so every mode
generates the same tokens). tokens/s counts generated tokens over the wall time of the
generation steps (DECODE and SPECULATIVE; prefill excluded), the median of --rounds runs
interleaved by mode (the ratio to off: the median of the per-round ratios); the mean
accepted length is emitted tokens per speculative lane with drafts. Adaptive rows also
give `policy_timed` / `measured_timed` (the policy's decisions, and those made to measure
a program, in the timed rounds alone) and `exploration_loss_share_timed` (its estimate of
the time those measurements lost, over all step time in those rounds) and
`policy_cost_ms` (its cost per program and batch capacity at the end); every row
gives `step_ms`: per program, [steps, mean wall ms since the previous completion] in the
timed rounds -- what each program cost the batch, host work included, against what the
policy believed.

Every mode runs the model worker's loop (worker.ModelWorker._step): the model's execution
frames (`frames` in the JSON: cuda 2; cpu --cpu-frames, 1 by default as a CPU server),
the next plan submitted before waiting whenever `scheduler.can_schedule_ahead()`, plans
completed in submission order; the scheduler alone decides what overlaps. A generation
step's time is the wall time from the previous completion to its completion (host work
included: schedule, packing, complete, the EOS decisions). Before that loop (results up
to spec_history_0def058.json) every mode ran one frame and `model.execute` per plan:
"off" was a serial decode, not what a server with speculation off runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _report import git_commit, write_json  # noqa: E402  bench/ is this script's folder

SAMPLINGS = {"greedy": (0.0, 1.0), "sampled_t0.8_p0.95": (0.8, 0.95)}
MODES = {"off": dict(widths=False, history=False, policy=False),
         "learned": dict(widths=True, history=False, policy=False),
         "learned+history_latest": dict(widths=True, history="latest", policy=False),
         "learned+history": dict(widths=True, history=True, policy=False),
         "learned+suffix": dict(widths=True, history="suffix", policy=False),
         "adaptive": dict(widths=True, history=True, policy=True),
         "adaptive+suffix": dict(widths=True, history="suffix", policy=True)}


def _latest_occurrence():
    """The proposer before the copy cursor: latest occurrence of the longest n-gram."""
    from helios_serve.speculation import HistoryIndex

    return HistoryIndex(cursor=False, candidates=1, resume=0)


def _encode(ck, messages_list):
    from helios_tools.frontend_assets import load_tokenizer, render_chat

    tok = load_tokenizer(ck.tokenizer_json)
    return [tok.encode(render_chat(ck.chat_template, m, add_generation_prompt=True),
                       add_special_tokens=False).ids for m in messages_list]


def prompt_sets(ck) -> dict[str, list[list[int]]]:
    sets = json.loads((ROOT / "bench/prompts/speculative_sets.json").read_text())["sets"]
    out = {name: _encode(ck, [[{"role": "user", "content": p}] for p in prompts])
           for name, prompts in sets.items()}
    spec = importlib.util.spec_from_file_location("drafter_prompts",
                                                  ROOT / "scripts" / "drafter_prompts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out["chat"] = _encode(ck, module.chat_prompts("eval", 4, seed=3))
    return out


def serve(model, prompts, tokens, sampling, mode, policy=None, walls=None):
    """Run the requests through a Scheduler over `model` in the worker's loop (module
    docstring); returns (outputs, generation seconds, scheduler stats). `policy`: a
    WidthPolicy carried over from earlier runs (a server's policy lives as long as the
    server). `walls`: program label -> [steps, seconds], added to (`_program`)."""
    from collections import deque

    from helios_serve.engine.plan import StepKind
    from helios_serve.scheduler import FinishReason, SchedRequest, Scheduler
    from helios_serve.speculation import HistoryIndex, SuffixIndex

    geometry = model.manifests
    if not mode["widths"]:
        geometry = replace(geometry, speculative_widths=(), prefix_programs=(),
                           copied_proposals=False)
    scheduler = Scheduler(geometry, frames=model.frames, device_pending=model.device_pending,
                          history_drafting=bool(mode["history"]),
                          history_index={"latest": _latest_occurrence,
                                         "suffix": SuffixIndex}.get(mode["history"],
                                                                    HistoryIndex),
                          width_policy=(policy or True) if mode["policy"] else False)
    eos = set(geometry.eos_token_ids)
    for i, prompt in enumerate(prompts):
        assert scheduler.add(SchedRequest(request_id=i, prompt_tokens=tuple(prompt),
                                          max_output_tokens=tokens,
                                          sampling=replace(sampling, seed=11 + i))) is None
    out = {i: [] for i in range(len(prompts))}
    seconds = 0.0
    inflight = deque()  # (plan, ticket), submission order
    mark = time.perf_counter()
    while scheduler.has_work() or inflight:
        submitted = False
        if scheduler.can_schedule_ahead():
            plan = scheduler.schedule()
            if plan is not None:
                inflight.append((plan, model.submit(plan)))
                submitted = True
        if not inflight or (submitted and scheduler.can_schedule_ahead()):
            continue  # the next plan goes ahead of the oldest one's completion
        plan, ticket = inflight.popleft()
        completion = model.wait_step(ticket)
        results = scheduler.complete(plan, completion.sampled,
                                     confidence=completion.confidence)
        for result in results:
            if result.token_id is None or not scheduler.is_live(result.request_id):
                continue
            out[result.request_id].append(result.token_id)
            if result.token_id in eos:  # the answer ends here, as a server's does
                scheduler.finish(result.request_id, FinishReason.STOP,
                                 output_tokens=result.output_tokens, publish=True)
            elif result.output_tokens == tokens:
                scheduler.finish(result.request_id, FinishReason.LENGTH, publish=True)
        now = time.perf_counter()
        if plan.kind in (StepKind.DECODE, StepKind.SPECULATIVE):
            seconds += now - mark  # since the previous completion: host work included
            if walls is not None:
                wall = walls.setdefault(_program(geometry, plan), [0, 0.0])
                wall[0] += 1
                wall[1] += now - mark
        mark = now
    return out, seconds, scheduler.stats()


def _program(geometry, plan) -> str:
    """The width policy's label of a step's program at its batch capacity, e.g.
    "decode_b64", "w4_b64", "prefix_w4_p128_b64" (WidthPolicy.program_key's terms)."""
    from helios_serve.engine.plan import StepKind

    rows = len(plan.rows)
    bucket = next((b for b in geometry.decode_capacities if b >= rows),
                  geometry.decode_capacities[-1])
    if plan.kind is StepKind.DECODE:
        return f"decode_b{bucket}"
    width = max(r.lane_length for r in plan.rows)
    width = next((w for w in geometry.speculative_widths if w >= width), width)
    if plan.packed_rows:
        return f"prefix_w{width}_p{plan.packed_rows}_b{bucket}"
    return f"w{width}_b{bucket}"


def _policy_costs(policy) -> dict[str, float]:
    """The policy's cost per program (ms), labelled as `_program`."""
    out = {}
    for key, cost in sorted(policy.costs.cost.items(), key=str):
        kind, bucket, *rest = key
        label = {"decode": "decode", "speculative": f"w{rest[0] if rest else ''}",
                 "prefix": f"prefix_p{rest[0] if rest else ''}"}[kind]
        out[f"{label}_b{bucket}"] = round(cost * 1e3, 3)
    return out


def _delta(now: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--target", default="sm_90")
    ap.add_argument("--gguf", default=os.environ.get("HELIOS_SMOLLM2_GGUF"))
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--batches", type=int, nargs="+", default=[1])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--sets", nargs="+", default=["editing", "extraction", "chat"])
    ap.add_argument("--samplings", nargs="+", default=list(SAMPLINGS), choices=list(SAMPLINGS))
    # the suffix modes run when asked (--modes ... learned+suffix adaptive+suffix): the
    # default run stays the one bench/gpu_device.sh budgets for
    ap.add_argument("--modes", nargs="+", default=[m for m in MODES if "suffix" not in m],
                    choices=list(MODES))
    ap.add_argument("--rounds", type=int, default=1,
                    help="timed runs of every mode, interleaved; tok/s is their median")
    ap.add_argument("--cpu-frames", type=int, default=1, choices=(1, 2),
                    help="execution frames of the cpu backend (a CPU server runs 1; 2 "
                         "exercises the cuda backend's two-frame order, with no overlap)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import speculative as base
    from helios_ignition.checkpoint import load_gguf, smollm2_gguf_path
    from helios_serve.engine.plan import SamplingParams

    # decode programs (and speculative ones) for every batch asked, beyond the recipe's 32
    args.decode_batch = sorted({1, 2, 4, 8, 16, 32, *args.batches})
    args.drafter = args.drafter or (str(base.TRAINED) if base.TRAINED.is_file()
                                    else "random:7:8192")
    ck = load_gguf(args.gguf or smollm2_gguf_path())
    sets = prompt_sets(ck)
    with tempfile.TemporaryDirectory() as d:
        from helios_serve.testing.native import load_native

        core = base._smollm2_core(args, Path(d))
        model = (load_native(core, "cpu", cpu_frames=args.cpu_frames)
                 if args.backend == "cpu" else base._load(args, core))
    rows = []
    for name in args.sets:
        for batch in args.batches:
            # every prompt of the set runs: groups of `batch` requests one after another
            # (batch 1 = each prompt alone), the set repeated to fill larger batches
            total = max(batch, len(sets[name]))
            total += -total % batch
            requests = [sets[name][i % len(sets[name])] for i in range(total)]
            groups = [requests[k:k + batch] for k in range(0, total, batch)]
            for label in args.samplings:
                temperature, top_p = SAMPLINGS[label]
                sampling = SamplingParams(temperature=temperature, top_p=top_p)
                outputs, runs, policy = {}, {m: [] for m in args.modes}, None
                walls = {m: {} for m in args.modes}  # timed rounds: program -> [n, s]
                if any(MODES[m]["policy"] for m in args.modes):
                    # warm: one untimed run measures the programs (a server's policy
                    # lives as long as the server and keeps its measurements)
                    from helios_serve.speculation import WidthPolicy

                    g = model.manifests
                    policy = WidthPolicy(g.speculative_widths, g.decode_capacities,
                                         g.prefix_programs)
                    for group in groups:
                        serve(model, group, args.tokens, sampling, MODES["adaptive"], policy)
                before = (dict(policy.decisions), dict(policy.measurements),
                          policy.spent, policy.exploration_loss) if policy else None
                for _ in range(args.rounds):  # modes interleaved per round
                    for mode in args.modes:
                        result = [serve(model, group, args.tokens, sampling, MODES[mode],
                                        policy if MODES[mode]["policy"] else None,
                                        walls[mode])
                                  for group in groups]
                        outputs[mode] = [o for out, _, _ in result for o in out.values()]
                        runs[mode].append(result)
                for mode in args.modes:
                    rates = [sum(len(o) for out, _, _ in r for o in out.values())
                             / sum(sec for _, sec, _ in r) for r in runs[mode]]
                    stats = [st for _, _, st in runs[mode][-1]]
                    lanes = sum(sum(st.spec_accepted_lengths) for st in stats)
                    accepted = sum(st.spec_accepted_tokens for st in stats)
                    copied = sum(st.spec_copied_draft_tokens for st in stats)
                    row = {"set": name, "batch": batch, "sampling": label, "mode": mode,
                           "requests": total,
                           "tokens": sum(len(o) for o in outputs[mode]),
                           "tok_s": round(statistics.median(rates), 2),
                           "tok_s_rounds": [round(x, 2) for x in rates],
                           "mean_accepted_length": round((accepted + lanes) / lanes, 3)
                           if lanes else None,
                           "copied_drafts": copied,
                           "copied_accepted": sum(st.spec_copied_accepted_tokens
                                                  for st in stats),
                           "learned_drafts": sum(st.spec_draft_tokens for st in stats)
                           - copied,
                           "policy": dict(policy.decisions) if MODES[mode]["policy"]
                           else {}}
                    # mean wall per step (ms, since the previous completion: host included)
                    # and steps per program, timed rounds
                    row["step_ms"] = {k: [n, round(sec / n * 1e3, 3)]
                                      for k, (n, sec) in sorted(walls[mode].items())}
                    if MODES[mode]["policy"]:  # the timed rounds alone (warm-up excluded)
                        row["policy_cost_ms"] = _policy_costs(policy)
                        row["policy_timed"] = _delta(policy.decisions, before[0])
                        row["measured_timed"] = _delta(policy.measurements, before[1])
                        row["exploration_loss_share_timed"] = round(
                            (policy.exploration_loss - before[3])
                            / max(policy.spent - before[2], 1e-12), 4)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                off = next((r for r in rows[::-1] if r["mode"] == "off" and r["set"] == name
                            and r["batch"] == batch and r["sampling"] == label), None)
                for r in rows:
                    if (r["set"], r["batch"], r["sampling"]) != (name, batch, label):
                        continue
                    if off:  # median of the per-round ratios (rounds are interleaved)
                        r["speedup_over_off"] = round(statistics.median(
                            a / b for a, b in zip(r["tok_s_rounds"], off["tok_s_rounds"],
                                                  strict=True)), 3)
                    if "off" in outputs:  # greedy: by construction; seeded sampled:
                        # coupled verification emits the decode draws (docs/speculative.md)
                        r["identical_to_off"] = outputs[r["mode"]] == outputs["off"]
    frames = model.frames
    model.close()
    result = {"model": "smollm2-135m-instruct", "drafter": args.drafter,
              "backend": args.backend, "tokens_per_request": args.tokens,
              "rounds": args.rounds, "frames": frames, "rows": rows,
              "commit": os.environ.get("HELIOS_COMMIT") or git_commit() or "unknown"}
    print(f"{'set':11} {'batch':>5} {'sampling':20} {'mode':22} {'tok/s':>8} {'x off':>6} "
          f"{'acc.len':>7} {'copied':>11}")
    for r in rows:
        print(f"{r['set']:11} {r['batch']:5d} {r['sampling']:20} {r['mode']:22} "
              f"{r['tok_s']:8.2f} {r.get('speedup_over_off', 0):6.2f} "
              f"{r['mean_accepted_length'] or 0:7.2f} "
              f"{r['copied_accepted']:5d}/{r['copied_drafts']:<5d}")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
