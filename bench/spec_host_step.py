"""Host time of planning a step on a speculative core: `Scheduler.schedule` and
`Scheduler.complete` at batch 1 / 8 / 64, speculation off vs learned + history drafting
+ the adaptive width policy deciding for plain decode or for speculation (issue 13 item 3,
issue 17).

The tiny drafter core (draft_copy 1.0: the head often proposes the target's token;
decode capacities 1 / 8 / 64) runs for real on the CPU backend, one plan at a time
(schedule, submit, wait, complete): B requests of a repetitive prompt (history drafting
finds copies) generate --tokens tokens each. Per step, the wall time of `schedule()`
(admission, the width policy's decision and every lane's copied proposals, the plan) and
of `complete()` is recorded (`REGIMES`: the policy's costs are scripted, so both versions
decide alike), and the thread CPU time of `schedule()` (`time.thread_time`, ~6 us a
reading here: it counts no time the process waited for a core, which dominates wall
medians of millisecond work on a loaded 2-core host); the table gives the medians (and lower deciles) over the
generation steps with all B requests in them.

`--before PATH`: also measure the serving code under PATH (a `git archive` of an older
commit's packages/helios-serve/src), each version in its own child process, versions
alternated per round; the JSON then holds both and the ratio after / before.

    uv run python bench/spec_host_step.py --before /tmp/main_src --rounds 3 \
        --json bench/results/spec_host_step_cpu.json

Times are wall-clock medians (`time.perf_counter`) on a shared host: the JSON records the
load average. Figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# Width-policy regimes: the policy's step costs are scripted (program key -> seconds, its
# own measurements switched off) so that every version makes the same decisions whatever
# the wall clock does: "decode" -- plain decode wins every decision (the H200's sampled
# steady state: the policy picks DECODE for ~95 % of steps), so each step pays for the
# decision and every lane's copied proposal but plans a decode; "speculation" -- W = 4
# wins, every step plans SPECULATIVE lanes with copied candidates.
REGIMES = {"decode": {"decode": 1.0, "speculative": 10.0, "prefix": 10.0},
           "speculation": {"decode": 10.0, "speculative": 1.0, "prefix": 10.0}}
MODES = ("off", "policy->decode", "policy->speculation")


def _scripted_policy(g, regime: str):
    from helios_serve.speculation import WidthPolicy
    from helios_serve.speculation.policy import MIN_COST_SAMPLES

    policy = WidthPolicy(g.speculative_widths, g.decode_capacities, g.prefix_programs)
    seconds = REGIMES[regime]
    for b in g.decode_capacities:
        keys = [("decode", b)] + [("speculative", b, w) for w in policy.widths]
        keys += [("prefix", b, p) for pb, p, _ in g.prefix_programs if pb == b]
        for key in keys:
            # W = 4 a little cheaper than narrower widths: the widest wins when speculating
            cost = seconds[key[0]] * (1 + (0.05 * (4 - key[2]) if key[0] == "speculative"
                                           else 0))
            for _ in range(MIN_COST_SAMPLES):
                policy.observe_step(key, cost)
    policy.observe_step = lambda key, seconds: None  # scripted: no measurements
    return policy


def measure(batches, tokens: int) -> list[dict]:
    """One run of every (batch, mode) in this process."""
    from dataclasses import replace

    from helios_ignition.recipe import Capacities
    from helios_ignition.testing import tiny_core
    from helios_serve.engine.plan import SamplingParams, StepKind
    from helios_serve.scheduler import FinishReason, SchedRequest, Scheduler
    from helios_serve.testing.native import load_native

    caps = Capacities(decode_batch=(1, 8, 64), prefill_tokens=(256,), prefill_rows=8,
                      context_tokens=512, page_tokens=16, prepared_pages=64 * 32)
    model = load_native(tiny_core(caps=caps, speculative_widths=(1, 2, 3, 4), draft_copy=1.0),
                        "cpu")
    rows = []
    prompt = tuple([5, 6, 7, 8, 9, 10, 11, 12] * 6)
    for batch in batches:
        for mode in MODES:
            spec = mode != "off"
            g = model.manifests
            if not spec:
                g = replace(g, speculative_widths=(), prefix_programs=(),
                            copied_proposals=False)
            s = Scheduler(g, frames=1, device_pending=model.device_pending,
                          history_drafting=spec,
                          width_policy=_scripted_policy(g, mode.split(">")[1]) if spec
                          else False)
            for i in range(batch):
                s.add(SchedRequest(request_id=i, prompt_tokens=prompt, max_output_tokens=tokens,
                                   sampling=SamplingParams()))
            sched, cpu, comp, kinds = [], [], [], {}
            while s.has_work():
                c0 = time.thread_time()
                t0 = time.perf_counter()
                plan = s.schedule()
                t1 = time.perf_counter()
                c1 = time.thread_time()
                completion = model.wait_step(model.submit(plan))
                t2 = time.perf_counter()
                results = s.complete(plan, completion.sampled, confidence=completion.confidence)
                t3 = time.perf_counter()
                for r in results:
                    if r.token_id is not None and s.is_live(r.request_id) \
                            and r.output_tokens >= tokens:
                        s.finish(r.request_id, FinishReason.LENGTH)
                if plan.kind is not StepKind.PREFILL and len(plan.rows) == batch:
                    kinds[plan.kind.value] = kinds.get(plan.kind.value, 0) + 1
                    sched.append(t1 - t0)
                    cpu.append(c1 - c0)
                    comp.append(t3 - t2)
            deciles = statistics.quantiles(sched, n=10) if len(sched) > 1 else sched
            rows.append({"batch": batch, "mode": mode, "steps": len(sched), "kinds": kinds,
                         "schedule_us": round(statistics.median(sched) * 1e6, 1),
                         "schedule_us_p10": round(deciles[0] * 1e6, 1),
                         "schedule_cpu_us": round(statistics.median(cpu) * 1e6, 1),
                         "complete_us": round(statistics.median(comp) * 1e6, 1),
                         "policy": s.stats().spec_policy_decisions})
    model.close()
    return rows


def _child(src: str | None, batches, tokens: int) -> list[dict]:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, __file__, "--child", "--tokens", str(tokens),
                          "--batches", *map(str, batches)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", help="serving sources of the version to compare against")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.batches, args.tokens)))
        return 0
    versions = {"after": None} | ({"before": args.before} if args.before else {})
    runs: dict[str, list[list[dict]]] = {v: [] for v in versions}
    for _ in range(args.rounds):  # versions alternated per round
        for version, src in versions.items():
            runs[version].append(_child(src, args.batches, args.tokens))
    rows = []
    for version, results in runs.items():
        for i, first in enumerate(results[0]):
            per_round = [r[i] for r in results]
            rows.append({**first, "version": version,
                         "schedule_us": round(statistics.median(
                             r["schedule_us"] for r in per_round), 1),
                         "schedule_us_rounds": [r["schedule_us"] for r in per_round],
                         "schedule_cpu_us": round(statistics.median(
                             r["schedule_cpu_us"] for r in per_round), 1),
                         "schedule_cpu_us_rounds": [r["schedule_cpu_us"] for r in per_round],
                         "complete_us": round(statistics.median(
                             r["complete_us"] for r in per_round), 1)})
    before = {(r["batch"], r["mode"]): r for r in rows if r["version"] == "before"}
    for r in rows:
        b = before.get((r["batch"], r["mode"]))
        if r["version"] == "after" and b:
            r["schedule_after_over_before"] = round(r["schedule_us"] / b["schedule_us"], 3)
            r["schedule_cpu_after_over_before"] = round(
                r["schedule_cpu_us"] / b["schedule_cpu_us"], 3)
    print(f"{'version':7} {'batch':>5} {'mode':19} {'steps':>5} {'schedule us':>11} "
          f"{'p10':>7} {'cpu us':>8} {'complete us':>11} {'x before':>8} {'cpu x':>6}  "
          "kinds / policy")
    for r in rows:
        print(f"{r['version']:7} {r['batch']:5d} {r['mode']:19} {r['steps']:5d} "
              f"{r['schedule_us']:11.1f} {r['schedule_us_p10']:7.1f} "
              f"{r['schedule_cpu_us']:8.1f} {r['complete_us']:11.1f} "
              f"{r.get('schedule_after_over_before', 0):8.3f} "
              f"{r.get('schedule_cpu_after_over_before', 0):6.3f}  {r['kinds']} {r['policy']}")
    if args.json:
        result = {"bench": "spec_host_step", "backend": "cpu", "model": "tiny drafter core",
                  "tokens_per_request": args.tokens, "rounds": args.rounds, "rows": rows,
                  "load_average": os.getloadavg(),
                  "commit": os.environ.get("HELIOS_COMMIT", "unknown")}
        from _report import write_json  # bench/ is this script's folder

        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
