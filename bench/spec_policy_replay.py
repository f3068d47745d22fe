"""Replay the width policy against a step-cost table derived from the H200 (issue 13).

    python bench/spec_policy_replay.py --json bench/results/spec_policy_replay.json
    python bench/spec_policy_replay.py --stall-every 100 --stall-factor 20 --json OUT

A model for reasoning, not a measurement: the real `WidthPolicy` decides every step of
one batch of requests (64 by default) that generate up to 128 tokens (some end early at
EOS), a warm-up run and then --rounds timed runs with the same policy, as
bench/speculative_history.py runs it. Each draft is accepted with a fixed probability per
position (`ACCEPT`, chosen so that a W = 4 lane emits the mean accepted length the fixed
learned+history mode had in --source, an H200 run of bench/speculative_history.py). A
step's wall seconds come from that file too: decode at batch 1 and 64 from "off" (tokens/s
over the batch), W = 4 from learned+history (accepted length x batch / tokens/s), linear
in the batch between them, W = 2 / 3 and prefix-limit programs (P = 2B, as W = 2) linear
in W between decode and W = 4. A serial step (every speculative step, and a decode right
after one) also waits for the host's work since the previous completion, `HOST_GAP` at
batch 64 (the CPU figures of `spec_host_step_cpu.json` / `_records.json`: ~2.7 ms
`schedule` of 64 W = 4 lanes + ~1.5 ms `complete`), scaled with the batch; the pipelined
decode of "off" hides it.

Host stalls (--stall-every N, --stall-factor F): every N-th step of a run, the host is
held up for F x the decode step at that batch (admitting a round of requests, another
thread holding the GIL): the stall adds to the wall and to the cost the policy observes
for that step, whatever its program; the decode-only baseline stalls every N-th step too.

Three policies: `before` -- the rule of 815b6d7: every program measured as soon as it is a
candidate, and a step's cost observed from its issue (the host gap unseen); `mean` -- the
rule of 9f51a62: bounded exploration, a speculative step costs since the previous
completion (its host gap included), a program's cost the running mean of its steps
(0.8 old + 0.2 new, trusted after 2); `now` -- the same with the median of the last
COST_WINDOW steps, trusted after MIN_COST_SAMPLES (speculation/policy.py) and decode
measured again whenever stale. Prints tokens/s over decode-only per set and the
decisions of the timed rounds.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _report import git_commit, write_json  # noqa: E402
from helios_serve.speculation import StepCosts, WidthPolicy  # noqa: E402

SOURCE = ROOT / "bench/results/h200_2026-12-02/spec_history_short_9f51a62.json"
HOST_GAP = 0.004  # s at batch 64
WIDTHS = (1, 2, 3, 4)
BATCHES = (1, 2, 4, 8, 16, 32, 64)


def _accept_rate(length: float) -> float:
    """a with 1 + a + a^2 + a^3 = length (a W = 4 lane's mean emitted tokens)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 1 + mid + mid ** 2 + mid ** 3 < length else (lo, mid)
    return lo


def cost_table(rows: list[dict], name: str, sampling: str) -> dict:
    """(batch 1 and 64) decode and W = 4 wall seconds per step, accepted length."""
    def row(batch, mode):
        return next(r for r in rows if (r["set"], r["batch"], r["sampling"], r["mode"])
                    == (name, batch, sampling, mode))
    out = {}
    for batch in (1, 64):
        off, spec = row(batch, "off"), row(batch, "learned+history")
        out[batch] = (batch / off["tok_s"],
                      batch * spec["mean_accepted_length"] / spec["tok_s"])
    out["accepted_length"] = row(64, "learned+history")["mean_accepted_length"]
    return out


def step_seconds(table: dict, rows: int, width: int, packed: int) -> float:
    """Device-side wall of one step (host gap excluded), linear in batch and width."""
    f = (rows - 1) / 63
    decode = table[1][0] + f * (table[64][0] - table[1][0])
    if width == 0:
        return decode
    w4 = table[1][1] + f * (table[64][1] - table[1][1])
    w4 -= HOST_GAP * rows / 64  # the fixed mode's wall includes the serial host gap
    effective = 2 if packed else width
    return decode + (max(w4, decode) - decode) * (effective - 1) / 3


def run(policy, table, rng, batch, tokens, accept, before: bool, stall_every: int = 0,
        stall_factor: float = 0.0) -> tuple[int, float, list]:
    """One batch through the policy; returns (tokens, wall seconds, request lengths)."""
    lengths = [tokens if rng.random() < 0.8 else rng.randint(tokens // 4, tokens)
               for _ in range(batch)]
    left = dict(enumerate(lengths))
    emitted, wall, serial, steps = 0, 0.0, True, 0
    base = batch * 1_000  # request ids of this run
    while left:
        lanes = [(base + rid, min(4, n)) for rid, n in left.items()]
        choice = policy.choose(lanes)
        rows = len(lanes)
        device = step_seconds(table, rows, choice.width, choice.packed_rows)
        gap = HOST_GAP * rows / 64
        seconds = device + (gap if (choice.width or serial) else 0.0)
        steps += 1
        if stall_every and steps % stall_every == 0:  # the host held up
            seconds += stall_factor * step_seconds(table, rows, 0, 0)
        # the cost the policy sees: issue to completion, except that a speculative step
        # now costs since the previous completion (its host gap included)
        seen = seconds if (choice.width and not before) else seconds - (
            gap if (choice.width or serial) else 0.0)
        policy.observe_step(policy.program_key(rows, choice), seen)
        wall += seconds
        serial = choice.width > 0
        spare = (choice.packed_rows - rows) if choice.packed_rows else None
        for rid, ceiling in lanes:
            n = min(choice.width, ceiling) if choice.width else 1
            if spare is not None:  # the prefix program: spare rows to the first lanes
                n = min(n, 1 + max(min(spare, n - 1), 0))
                spare -= n - 1
            accepted = 0
            while accepted < n - 1 and rng.random() < accept:
                accepted += 1
            if n > 1:
                policy.observe_lane(rid, n - 1, accepted)
            out = min(accepted + 1, left[rid - base])
            emitted += out
            left[rid - base] -= out
            if left[rid - base] == 0:
                del left[rid - base]
                policy.forget(rid)
    return emitted, wall, lengths


def decode_only_seconds(table, lengths: list[int], stall_every: int = 0,
                        stall_factor: float = 0.0) -> float:
    """Pipelined decode of requests of `lengths` tokens, a stall every `stall_every`."""
    seconds, alive = 0.0, sorted(lengths)
    step = 0
    while alive:
        seconds += step_seconds(table, len(alive), 0, 0) * (
            1 + (stall_factor if stall_every and (step + 1) % stall_every == 0 else 0))
        step += 1
        alive = [n for n in alive if n > step]
    return seconds


class MeanCosts(StepCosts):
    """The cost rule of 9f51a62: the running mean of a program's steps (0.8 old + 0.2
    new), trusted after 2; a switch back to decode adds its host seconds to the latest
    step (the whole of it after one step, else 0.2 of it)."""

    def observe(self, key: tuple, seconds: float) -> None:
        n = self.samples.get(key, 0)
        old = self.cost.get(key, seconds)
        self.cost[key] = seconds if n == 0 else old + 0.2 * (seconds - old)
        self.samples[key] = n + 1
        self.when[key] = self.decisions

    def add_to_latest(self, key: tuple, seconds: float) -> None:
        if key in self.cost:
            self.cost[key] += seconds if self.samples[key] == 1 else 0.2 * seconds

    def measured(self, key: tuple) -> bool:
        return self.samples.get(key, 0) >= 2


POLICIES = ("before", "mean", "now")


def replay(table, name, sampling, batch, tokens, rounds, seed, stall_every=0,
           stall_factor=0.0) -> dict:
    accept = _accept_rate(table["accepted_length"])
    prefix = tuple((b, 2 * b, 4) for b in BATCHES if b >= 2)
    out = {}
    for label in POLICIES:
        before = label == "before"
        policy = WidthPolicy(WIDTHS, BATCHES, prefix, bounded_exploration=not before)
        if label != "now":
            policy.costs = MeanCosts()
        rng = random.Random(seed)
        stalls = dict(stall_every=stall_every, stall_factor=stall_factor)
        run(policy, table, rng, batch, tokens, accept, before, **stalls)  # warm-up
        decisions = dict(policy.decisions)
        measured = dict(policy.measurements)
        ratios = []
        for _ in range(rounds):
            emitted, wall, lengths = run(policy, table, rng, batch, tokens, accept, before,
                                         **stalls)
            # off: the same lengths, one token per request per pipelined decode step
            off = sum(lengths) / decode_only_seconds(table, lengths, **stalls)
            ratios.append((emitted / wall) / off)
        out[label] = {
            "over_decode_only": round(sorted(ratios)[len(ratios) // 2], 3),
            "timed_decisions": {k: v - decisions.get(k, 0) for k, v in policy.decisions.items()
                                if v - decisions.get(k, 0)},
            "timed_measurements": {k: v - measured.get(k, 0)
                                   for k, v in policy.measurements.items()
                                   if v - measured.get(k, 0)},
        }
    return {"set": name, "sampling": sampling, "batch": batch, "accept_per_draft":
            round(accept, 3), **out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--source", type=Path, default=SOURCE,
                    help="an H200 bench/speculative_history.py JSON (batches 1 and 64)")
    ap.add_argument("--stall-every", type=int, default=0,
                    help="a host stall every N-th step (0: none)")
    ap.add_argument("--stall-factor", type=float, default=20.0,
                    help="a stall's length in decode steps at that batch")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = json.loads(args.source.read_text())["rows"]
    results = []
    for name in ("editing", "extraction", "chat"):
        for sampling in ("greedy", "sampled_t0.8_p0.95"):
            table = cost_table(rows, name, sampling)
            results.append(replay(table, name, sampling, args.batch, args.tokens,
                                  args.rounds, args.seed, args.stall_every,
                                  args.stall_factor))
    print(f"{'set':11} {'sampling':20} " + " ".join(f"{p:>7}" for p in POLICIES)
          + "  timed decisions (now)")
    for r in results:
        print(f"{r['set']:11} {r['sampling']:20} "
              + " ".join(f"{r[p]['over_decode_only']:7.3f}" for p in POLICIES)
              + f"  {r['now']['timed_decisions']}")
    if args.json:
        source = args.source.resolve()
        write_json(args.json, {"commit": git_commit(), "source": str(source.relative_to(ROOT) if source.is_relative_to(
                                   ROOT) else source), "host_gap_s": HOST_GAP,
                               "batch": args.batch, "tokens": args.tokens,
                               "rounds": args.rounds, "stall_every": args.stall_every,
                               "stall_factor": args.stall_factor, "rows": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
