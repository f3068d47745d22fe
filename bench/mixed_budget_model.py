"""A MODEL of the MIXED token-budget rule, not a measurement: the real Scheduler plans every
step over the 8B serving-bench geometry, a cost model gives each plan a duration, and a
simulated clock advances (no model, no GPU, no HTTP).

Why: the budget rule (docs/mixed.md "Token budget"; scheduler/capacity.py
`mixed_budget`) gained its drain condition (DRAIN_STEPS = 8) after one H100 run
(bench/results/h100_2026-12-06k/README.md), and no GPU time was left to measure it. This
script compares the rule's variants under one cost model so the next GPU run knows what
to look for. Every figure it writes is MODELED.

Geometry (recipes/llama_serving_bench.py for the 8B): 256 request slots, decode
capacities (1, 2, 4, ..., 64, 96, ..., 256), prefill token capacities (16, 128, 1024) x 8
rows, MIXED variants mixed_b{2..256}_t{512, 2048}, 16-token pages, a 4,096-token context,
and the page count of a card: 28,615 (H100 80GB: the run's startup line) or 32,768 (the
H200 recipe's prepared pages).

Loop: plan (`Scheduler.schedule`), clock += modeled cost of the plan, complete at once
with greedy ids (`Scheduler.complete`): every sampled token is stamped with the clock
after its step; a request finishes at its output limit (ignore_eos). One plan at a time:
the served path's decode-ahead frame and host costs are not modeled (the served ITL p50
equalled the native loop's step: h100_2026-12-06k/README.md section 4).

Cost model (seconds per step; constants below, each with its source):

    DECODE  A + B * padded_rows + C * sum over rows of (position + 1)
    PREFILL A + P * padded_tokens
    MIXED   A + B * lanes + C * sum over lanes of (position + 1) + P * (T - lanes)

    A  4.5 ms: the weight read of one step (14.96 GiB of bf16 weights at ~3.5 TB/s).
    B  (10.42 - 4.5) ms / 255: the products' growth per row (10.42 ms at 256 rows with
       bf16 activations, README section 5).
    C  33.35 ms / (256 x 780) / 2: decode attention per lane and context token (33.35 ms
       at 256 rows of ~780 positions with an f32 cache, README section 5), halved for the
       bf16 cache the 8B serving-bench core has (half the bytes; assumes the attention
       stays bandwidth-bound at the same fraction of copy speed).
    P  (55.0 - 4.5) ms / 1024: a prompt token's products and its attention over its own
       chunk (TTFT of 1,024 tokens in one chunk, bf16 activations, README section 5);
       attention over earlier chunks is folded in (not added).
    padded_rows / padded_tokens / T: the captured capacity the runtime runs
       (NativeModel.select_graph): the smallest decode batch holding the rows, the
       smallest prefill capacity holding the tokens, the smallest MIXED variant holding
       the rows and packed tokens; a captured program computes its whole capacity.
    MIXED lanes' attention costs as decode attention (the lane programs); the rest of
    the variant's packed tokens (prompt chunks and padding) cost P each.

    Two sensitivities run beside it on the H100 (`COSTS`; neither is fitted): C at the
    f32 cache's rate (the bf16 cache read no faster), and MIXED lanes' attention at 4x
    decode's (dab75f2's lane programs, one per lane and query head).

Rules compared (patched in this process only, `applied`; the product code is not
changed): the W rule alone (no drain condition: `mixed_budget` called with nothing
owed), drain 4 / 8 / 16 (capacity.DRAIN_STEPS; 8 is the shipped rule), always the
largest (2,048), always 512 (the geometry with only the t512 variants: one capacity), and
no MIXED steps at all (PREFILL and DECODE alternate; for reference).

Workloads:
    burst        C clients send INPUT-token prompts at t = 0 asking for OUTPUT tokens; a
                 finished request's client sends the next until ROUNDS x C requests
                 (bench/serve_load.py's closed loop; ROUNDS 1 = its `--rounds 1`)
    arrivals     bench/serve_mixed.py's scenario: 64 streams (32-token prompts) decode;
                 after every 16 tokens of stream 0 one 1,024-token prompt arrives (4 output
                 tokens), 8 arrivals; figures over the stretch from the first arrival to
                 the last one's end

Figures per (workload, rule, card): output tok/s (output tokens / simulated time; for
arrivals the streams' tokens over the stretch), TTFT p50/p99 (send -> first token; with
ROUNDS > 1 also of the requests sent after the t = 0 burst: `ttft_later_*`), ITL
p50/p99 (gaps between one request's consecutive tokens; for arrivals the streams'), TPOT
p50, steps by kind, MIXED steps by budget (StepPlan.token_budget), preemptions, and the
sanity checks against the measured H100 points (`sanity`).

Run: uv run python bench/mixed_budget_model.py --json bench/results/mixed_budget_model.json
(~2 minutes on the 2-core dev machine; --quick: the C64 burst and arrivals only).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_commit, write_json  # noqa: E402  (bench/ is this script's folder)
from helios_serve.engine.plan import ModelGeometry, StepKind, StepPlan  # noqa: E402
from helios_serve.scheduler import (  # noqa: E402
    FinishReason,
    RowResults,
    SchedRequest,
    Scheduler,
    capacity,
    smallest_capacity,
)

# The module whose `mixed_budget` name Scheduler._build_mixed calls (imported by name
# there, so a rule is patched on this module, not on capacity).
SCHEDULER_MODULE = importlib.import_module("helios_serve.scheduler.scheduler")

MODELED = ("MODELED, not measured: the real Scheduler's plans timed by a cost model fitted "
           "roughly to the H100 run at dab75f2 (bench/results/h100_2026-12-06k/README.md)")

# -- cost model (module docstring) ------------------------------------------------------
# README = bench/results/h100_2026-12-06k/README.md
# README section 2: "weights: 35 s for 14.96 GiB" (16.1 GB), read once a step at ~3.5 TB/s
A_WEIGHTS_S = 4.5e-3
# README section 5: "products 10.42 ms (22.8 %...)" of the 256-row step, bf16 activations
PRODUCTS_256_S = 10.42e-3
B_ROW_S = (PRODUCTS_256_S - A_WEIGHTS_S) / 255
# README section 5: "attention 33.35 ms (73.0 %)" at 256 rows x ~780 positions, f32 cache;
# "A bf16 cache halves the bytes": halved (the served core's cache is bf16)
ATTENTION_F32_S, ATTENTION_ROWS, ATTENTION_POSITIONS = 33.35e-3, 256, 780
C_CONTEXT_S = ATTENTION_F32_S / (ATTENTION_ROWS * ATTENTION_POSITIONS) / 2
# README section 5: "TTFT 1,024 tokens, one chunk ... bf16 ... 55.0 ms"
TTFT_1024_S = 55.0e-3
P_TOKEN_S = (TTFT_1024_S - A_WEIGHTS_S) / 1024
# Llama-3.1-8B: 32 query heads share 8 kv heads (a group of 4).
GQA_GROUP = 4


@dataclass(frozen=True)
class Cost:
    """One cost model's terms (module docstring): seconds per step, per padded row, per
    lane and context token, per packed prompt token; `lane_attention` multiplies the
    MIXED lanes' attention (1: as decode attention)."""

    name: str
    a_s: float = A_WEIGHTS_S
    b_s: float = B_ROW_S
    c_s: float = C_CONTEXT_S
    p_s: float = P_TOKEN_S
    lane_attention: float = 1.0


# The model the figures use, then two sensitivities (H100 only), neither fitted:
# - attention at the f32 cache's rate: the bf16 cache read no faster (the native loop's
#   23.08 ms step is 0.72x the base model and 1.18x this one);
# - MIXED lanes' attention 4x decode's: dab75f2's lane programs ran one program per lane
#   and query head (h100_2026-12-06k/README.md, "the first form"), so each kv head's
#   keys and values were read once per query head of its group.
COSTS = (Cost("base"), Cost("attention f32 rate", c_s=2 * C_CONTEXT_S),
         Cost("lanes x4", lane_attention=GQA_GROUP))

# -- the measured points the model is checked against (README) -------------------------
# Section 4: the native loop "23.08 ms a step at 64 rows of 1-2k positions": its rows
# decode positions 1,472..2,496 after a 1,472-token prefill (1,024 prompt tokens plus the
# 448 output tokens it does not decode).
NATIVE_STEP_S, NATIVE_ROWS, NATIVE_POSITIONS = 23.08e-3, 64, (1472, 2496)
# Section 4: "prefill took 7,260 ms for 64 rows of 1,472 tokens ... 113 ms a row".
NATIVE_PREFILL_ROW_S, NATIVE_PREFILL_TOKENS = 7.260 / 64, 1472
# Section 3, served at dab75f2 (the W rule alone), H100: (tok/s, TTFT p50, p99, TPOT p50,
# ITL p50, p99 in ms) and the /metrics counts of section 3 where given.
SERVED = {
    "1024/1024 C64": {"out_tok_s": 1966.8, "ttft_p50_ms": 1784, "ttft_p99_ms": 7738,
                      "tpot_p50_ms": 29.1, "itl_p50_ms": 22.7, "itl_p99_ms": 138.2,
                      "mixed_steps": 134},
    "1024/1024 C256": {"out_tok_s": 884.7, "ttft_p50_ms": 13039, "ttft_p99_ms": 190229,
                       "tpot_p50_ms": 249.9, "itl_p50_ms": 75.3, "itl_p99_ms": 814.8,
                       "mixed_steps": 679, "decode_steps": 1117, "preemptions": 5},
    "128/128 C256": {"out_tok_s": 4236.2, "ttft_p50_ms": 1721, "ttft_p99_ms": 4925,
                     "tpot_p50_ms": 42.4, "itl_p50_ms": 24.3, "itl_p99_ms": 136.2},
}

# -- geometry (recipes/llama_serving_bench.py for llama-3.1-8b) ---------------------------
DECODE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 224, 256)
MIXED_TOKENS = (512, 2048)
CARDS = {"H100": 28_615, "H200": 32_768}  # pages: the H100 run's startup line; the recipe
VOCAB = 128_256
SAMPLED_ID = 7  # the greedy id every sampling row returns (never EOS: ignore_eos anyway)


def geometry(pages: int, mixed_tokens: tuple[int, ...] = MIXED_TOKENS) -> ModelGeometry:
    """The 8B serving-bench core's ModelGeometry with `pages` 16-token pages and one MIXED
    variant per decode batch 2 <= B <= T for each T of `mixed_tokens` (empty: none)."""
    return ModelGeometry(
        page_tokens=16, num_pages=pages, slots=256, max_pages_per_request=4096 // 16,
        decode_capacities=DECODE_BUCKETS, prefill_token_capacities=(16, 128, 1024),
        prefill_row_capacity=8, context_tokens=4096, vocab_size=VOCAB,
        mask_words=-(-VOCAB // 32), eos_token_ids=(128_001, 128_009),
        mixed_capacities=tuple(sorted((b, t) for t in mixed_tokens
                                      for b in DECODE_BUCKETS if 2 <= b <= t)))


def step_cost_s(plan: StepPlan, g: ModelGeometry, cost: Cost) -> tuple[float, int]:
    """Modeled duration of one plan under `cost` (module docstring) and, for a MIXED plan,
    the token capacity of the variant that runs it (0 otherwise).

    Raises:
        ValueError: a plan no captured capacity holds (the scheduler's bug), or a kind
            this geometry never plans (SPECULATIVE, TRANSFER).
    """
    if plan.kind is StepKind.DECODE:
        rows = plan.row_count
        padded = smallest_capacity(g.decode_capacities, rows)
        columns = plan.columns
        if columns is not None and "rows" not in plan.__dict__:
            context = int(columns.positions.sum()) + rows  # positions are 0-based
        else:
            context = sum(r.start_position + 1 for r in plan.rows)
        if padded is None:
            raise ValueError(f"no decode capacity holds {rows} rows")
        return cost.a_s + cost.b_s * padded + cost.c_s * context, 0
    if plan.kind is StepKind.PREFILL:
        padded = smallest_capacity(g.prefill_token_capacities, plan.token_count)
        if padded is None:
            raise ValueError(f"no prefill capacity holds {plan.token_count} tokens")
        return cost.a_s + cost.p_s * padded, 0
    if plan.kind is StepKind.MIXED:
        rows, need = len(plan.rows), plan.token_count
        variant = min((t for b, t in g.mixed_capacities if t >= need and b >= rows),
                      default=None)
        if variant is None:
            raise ValueError(f"no MIXED variant holds {rows} rows of {need} tokens")
        lanes = plan.rows[:plan.lanes]
        context = sum(r.start_position + 1 for r in lanes)
        return (cost.a_s + cost.b_s * len(lanes)
                + cost.c_s * cost.lane_attention * context
                + cost.p_s * (variant - len(lanes))), variant
    raise ValueError(f"the model has no cost for a {plan.kind.value} step")


# -- rules ------------------------------------------------------------------------------

Budget = Callable[[tuple[tuple[int, int], ...], int, int, int], tuple[int, int]]


def _w_alone(widest, owing: int, lanes: int, owed: int) -> tuple[int, int]:
    # Nothing owed: the drain condition always holds, so only W >= L and room decide.
    return capacity.mixed_budget(widest, owing, lanes, 0)


def _largest(widest, owing: int, lanes: int, owed: int) -> tuple[int, int]:
    return widest[-1]


@dataclass(frozen=True)
class Rule:
    """One budget rule: DRAIN_STEPS (None: the module's 8), the budget function patched
    into the scheduler (None: capacity.mixed_budget), and the MIXED token capacities the
    geometry captures (empty: no MIXED steps)."""

    name: str
    drain: int | None = None
    budget: Budget | None = None
    mixed_tokens: tuple[int, ...] = MIXED_TOKENS


RULES = (
    Rule("W alone", budget=_w_alone),
    Rule("drain 4", drain=4),
    Rule("drain 8", drain=8),
    Rule("drain 16", drain=16),
    Rule("always 2048", budget=_largest),
    Rule("always 512", mixed_tokens=(512,)),
    Rule("no mixed", mixed_tokens=()),
)


@contextlib.contextmanager
def applied(rule: Rule) -> Iterator[None]:
    """Patch capacity.DRAIN_STEPS and the scheduler module's `mixed_budget` for `rule`,
    restoring both on exit (this process only)."""
    saved = capacity.DRAIN_STEPS, SCHEDULER_MODULE.mixed_budget
    try:
        if rule.drain is not None:
            capacity.DRAIN_STEPS = rule.drain
        if rule.budget is not None:
            SCHEDULER_MODULE.mixed_budget = rule.budget
        yield
    finally:
        capacity.DRAIN_STEPS, SCHEDULER_MODULE.mixed_budget = saved


# -- the simulated loop -------------------------------------------------------------------


class Sim:
    """The scheduler, a simulated clock (seconds) and per-request token stamps."""

    def __init__(self, g: ModelGeometry, cost: Cost) -> None:
        self.g, self.cost = g, cost
        self.sched = Scheduler(g, frames=1)
        self.clock = 0.0
        self.limits: dict[int, int] = {}
        self.sent: dict[int, float] = {}
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.counts: dict[int, int] = {}
        self.gaps: dict[int, list[float]] = {}
        self.done: dict[int, float] = {}
        self.kinds = dict.fromkeys([k.value for k in StepKind], 0)
        self.budgets: dict[int, int] = {}
        self.variants: dict[int, int] = {}
        self.mixed_lanes = 0
        self.mixed_s = 0.0  # modeled time in MIXED steps
        self.rng = np.random.default_rng(0)

    def send(self, rid: int, prompt_tokens: int, output_tokens: int) -> None:
        """Queue request `rid` now: seeded random prompt ids (no shared prefix)."""
        prompt = tuple(self.rng.integers(10, VOCAB - 10, prompt_tokens).tolist())
        error = self.sched.add(SchedRequest(rid, prompt, output_tokens))
        if error is not None:
            raise ValueError(f"request {rid} refused: {error.detail}")
        self.limits[rid], self.sent[rid], self.counts[rid] = output_tokens, self.clock, 0
        self.gaps[rid] = []

    def step(self) -> list[int] | None:
        """Plan, time and complete one step; the requests that finished in it, or None
        when nothing can run."""
        plan = self.sched.schedule()
        if plan is None:
            return None
        cost, variant = step_cost_s(plan, self.g, self.cost)
        self.clock += cost
        now = self.clock
        self.kinds[plan.kind.value] += 1
        if plan.kind is StepKind.MIXED:
            self.budgets[plan.token_budget] = self.budgets.get(plan.token_budget, 0) + 1
            self.variants[variant] = self.variants.get(variant, 0) + 1
            self.mixed_lanes += plan.lanes
            self.mixed_s += cost
        n = plan.row_count
        results = self.sched.complete(plan, np.full(n, SAMPLED_ID, np.int64))
        if isinstance(results, RowResults):
            produced = zip(results.request_ids, results.output_tokens, strict=True)
        else:
            produced = ((r.request_id, r.output_tokens) for r in results
                        if r.token_id is not None)
        finished = []
        for rid, out in produced:
            if rid in self.last:
                self.gaps[rid].append(now - self.last[rid])
            else:
                self.first[rid] = now
            self.last[rid] = now
            self.counts[rid] = out
            if out == self.limits[rid]:
                self.sched.finish(rid, FinishReason.LENGTH)
                self.done[rid] = now
                finished.append(rid)
        return finished

    def stalled(self) -> RuntimeError:
        return RuntimeError(f"the scheduler planned nothing at {self.clock:.3f} s with "
                            f"{len(self.sent) - len(self.done)} requests unfinished")

    def figures(self, rids, out_tokens: int, seconds: float,
                gaps: list[float] | None = None) -> dict:
        """Output tok/s, TTFT, ITL and TPOT (ms) over `rids`, steps and budgets."""
        ttft = np.array([self.first[r] - self.sent[r] for r in rids]) * 1e3
        itl = np.array(gaps if gaps is not None
                       else [x for r in rids for x in self.gaps[r]]) * 1e3
        tpot = np.array([(self.last[r] - self.first[r]) / (self.counts[r] - 1)
                         for r in rids if self.counts[r] > 1]) * 1e3
        stats = self.sched.stats()

        def pct(a: np.ndarray, q: float) -> float | None:
            return round(float(np.percentile(a, q)), 2) if len(a) else None

        return {"out_tok_s": round(out_tokens / seconds, 1), "seconds": round(seconds, 3),
                "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
                "itl_p50_ms": pct(itl, 50), "itl_p99_ms": pct(itl, 99),
                "itl_p99_over_p50": (round(pct(itl, 99) / pct(itl, 50), 2)
                                     if len(itl) else None),
                "tpot_p50_ms": pct(tpot, 50), "steps": dict(self.kinds),
                "mixed_budgets": {str(k): v for k, v in sorted(self.budgets.items())},
                "mixed_variants": {str(k): v for k, v in sorted(self.variants.items())},
                "mixed_lanes": self.mixed_lanes,
                "mixed_ms_mean": (round(self.mixed_s / self.kinds["mixed"] * 1e3, 2)
                                  if self.kinds["mixed"] else None),
                "preemptions": stats.preemptions}


@dataclass(frozen=True)
class Burst:
    """C clients, closed loop: ROUNDS x C requests of INPUT -> OUTPUT tokens."""

    input_tokens: int
    output_tokens: int
    clients: int
    rounds: int = 1

    @property
    def name(self) -> str:
        rounds = "" if self.rounds == 1 else f" x{self.rounds}"
        return f"{self.input_tokens}/{self.output_tokens} C{self.clients}{rounds}"

    def run(self, g: ModelGeometry, cost: Cost) -> dict:
        sim = Sim(g, cost)
        total = self.clients * self.rounds
        for rid in range(self.clients):
            sim.send(rid, self.input_tokens, self.output_tokens)
        sent = self.clients
        while len(sim.done) < total:
            finished = sim.step()
            if finished is None:
                raise sim.stalled()
            for _ in finished:
                if sent < total:
                    sim.send(sent, self.input_tokens, self.output_tokens)
                    sent += 1
        rids = range(total)
        result = sim.figures(rids, sum(sim.counts[r] for r in rids), sim.clock)
        if self.rounds > 1:
            # The requests sent as others finished (not in the t = 0 burst): the steady
            # loop's TTFT, which the level's p50 straddles.
            later = np.array([sim.first[r] - sim.sent[r] for r in rids[self.clients:]]) * 1e3
            result["ttft_later_p50_ms"] = round(float(np.percentile(later, 50)), 2)
            result["ttft_later_p99_ms"] = round(float(np.percentile(later, 99)), 2)
        return result


@dataclass(frozen=True)
class Arrivals:
    """bench/serve_mixed.py's scenario (module docstring), its default sizes."""

    streams: int = 64
    stream_prompt: int = 32
    prompt_tokens: int = 1024
    arrival_output: int = 4
    arrivals: int = 8
    every: int = 16

    @property
    def name(self) -> str:
        return f"arrivals 1k into {self.streams}"

    def run(self, g: ModelGeometry, cost: Cost) -> dict:
        sim = Sim(g, cost)
        # serve_mixed.stream_output: the streams decode past the last arrival's end.
        stream_output = self.every * (self.arrivals + 2) + self.arrival_output + 64
        for rid in range(self.streams):
            sim.send(rid, self.stream_prompt, stream_output)
        arrived = 0
        late = range(self.streams, self.streams + self.arrivals)
        while not all(r in sim.done for r in late):
            if arrived < self.arrivals and sim.counts[0] >= self.every * (arrived + 1):
                sim.send(self.streams + arrived, self.prompt_tokens, self.arrival_output)
                arrived += 1
            if sim.step() is None:
                raise sim.stalled()
        start, end = sim.sent[self.streams], max(sim.done[r] for r in late)
        # The streams' gaps inside the stretch (their stamps rebuilt from the gaps).
        gaps, tokens = [], 0
        for rid in range(self.streams):
            t = sim.first[rid]
            for gap in sim.gaps[rid]:
                if t >= start and t + gap <= end:
                    gaps.append(gap)
                t += gap
                tokens += start <= t <= end
        result = sim.figures(late, tokens, end - start, gaps)
        result["ttft_note"] = "TTFT of the arrivals; ITL and tok/s of the streams"
        return result


WORKLOADS = (Burst(1024, 1024, 64), Burst(1024, 1024, 64, rounds=2),
             Burst(1024, 1024, 256), Burst(1024, 1024, 256, rounds=2),
             Burst(128, 128, 256), Arrivals())
QUICK = (Burst(1024, 1024, 64), Arrivals())


def sanity(results: dict, cost: Cost) -> dict:
    """The model against the measured H100 points (README sections 3 and 4): modeled,
    measured and modeled / measured; nothing is fitted to them. `results` is one cost
    model's (workload -> rule -> card)."""
    lo, hi = NATIVE_POSITIONS
    g = geometry(CARDS["H100"])
    rows = NATIVE_ROWS
    native = cost.a_s + cost.b_s * rows + cost.c_s * rows * ((lo + hi) / 2 + 1)
    chunk = g.prefill_token_capacities[-1]
    prefill_row = -(-NATIVE_PREFILL_TOKENS // chunk) * (cost.a_s + cost.p_s * chunk)
    out = {"native_step_64_rows_ms": _versus(native * 1e3, NATIVE_STEP_S * 1e3),
           "native_prefill_row_ms": _versus(prefill_row * 1e3, NATIVE_PREFILL_ROW_S * 1e3)}
    for workload, measured in SERVED.items():
        modeled = results.get(workload, {}).get("W alone", {}).get("H100")
        if modeled is None:
            continue
        out[f"served {workload} (W alone, H100)"] = {
            key: _versus(modeled["steps"][key.removesuffix("_steps")]
                         if key.endswith("_steps") else modeled[key], value)
            for key, value in measured.items()}
    return out


def _versus(modeled: float, measured: float) -> dict:
    return {"modeled": round(modeled, 2), "measured": measured,
            "ratio": round(modeled / measured, 3) if measured else None}


# README section 3 (1024/1024 at C256, dab75f2): the level's wall time and /metrics step
# counts; with the ITL p50 taken as its DECODE step, the mean MIXED step they imply.
C256_WALL_S, C256_MIXED, C256_DECODE = 296.302, 679, 1117
C256_IMPLIED_MIXED_MS = (C256_WALL_S - C256_DECODE * 75.3e-3) / C256_MIXED * 1e3


def table(results: dict, cost: str) -> None:
    """Print one cost model's figures, a row per (workload, rule, card)."""
    print(f"\n{cost} (MODELED): workload / rule / card: out tok/s, TTFT p50/p99 ms, "
          f"ITL p50/p99 ms, MIXED steps by budget, mean MIXED step ms, preemptions")
    for workload, by_rule in results.items():
        for rule, by_card in by_rule.items():
            for card, r in by_card.items():
                print(f"{workload:20} {rule:11} {card}  {r['out_tok_s']:7.0f}"
                      f"  {r['ttft_p50_ms']:8.0f} {r['ttft_p99_ms']:8.0f}"
                      f"  {r['itl_p50_ms']:6.1f} {r['itl_p99_ms']:6.1f}"
                      f"  {str(r['mixed_budgets']):26} {r['mixed_ms_mean'] or 0:6.1f}"
                      f"  {r['preemptions']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the C64 burst and arrivals only")
    ap.add_argument("--cards", nargs="+", choices=sorted(CARDS), default=sorted(CARDS))
    ap.add_argument("--rules", nargs="+", choices=[r.name for r in RULES],
                    default=[r.name for r in RULES])
    ap.add_argument("--json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rules = [r for r in RULES if r.name in args.rules]
    results: dict[str, dict[str, dict[str, dict[str, dict]]]] = {}
    for cost in COSTS:
        # The base model on every card asked for; the sensitivities on the H100 (the
        # card of the measured points) only.
        cards = args.cards if cost is COSTS[0] else [c for c in args.cards if c == "H100"]
        for workload in QUICK if args.quick else WORKLOADS:
            by_rule = results.setdefault(cost.name, {}).setdefault(workload.name, {})
            for rule in rules:
                for card in cards:
                    with applied(rule):
                        r = workload.run(geometry(CARDS[card], rule.mixed_tokens), cost)
                    by_rule.setdefault(rule.name, {})[card] = r
        table(results[cost.name], cost.name)
    checks = {cost.name: sanity(results[cost.name], cost) for cost in COSTS}
    print(f"\nmeasured C256 1024/1024 at dab75f2 implies a mean MIXED step of "
          f"{C256_IMPLIED_MIXED_MS:.0f} ms (README section 3: wall, steps, ITL p50)")
    for cost, by_check in checks.items():
        for name, value in by_check.items():
            print(f"sanity [{cost}] {name}: {value}")
    report = {
        "modeled": True, "note": MODELED, "commit": git_commit(),
        "host": {"machine": platform.machine(), "python": platform.python_version()},
        "run_s": round(time.perf_counter() - t0, 1),
        "cost_model": {"decode": "A + B*padded_rows + C*sum(position+1)",
                       "prefill": "A + P*padded_tokens",
                       "mixed": "A + B*lanes + lane_attention*C*sum(lane position+1) "
                                "+ P*(T - lanes)",
                       "models": [{"name": c.name, "A_ms": c.a_s * 1e3, "B_us": c.b_s * 1e6,
                                   "C_ns": c.c_s * 1e9, "P_us": c.p_s * 1e6,
                                   "lane_attention": c.lane_attention} for c in COSTS]},
        "cards_pages": CARDS, "shipped_drain_steps": capacity.DRAIN_STEPS,
        "rules": [dataclasses.asdict(r) | {"budget": r.budget.__name__ if r.budget else None}
                  for r in rules],
        "results": results, "sanity": checks,
        "measured_c256_implied_mixed_step_ms": round(C256_IMPLIED_MIXED_MS, 1)}
    if args.json:
        write_json(args.json, report)


if __name__ == "__main__":
    main()
