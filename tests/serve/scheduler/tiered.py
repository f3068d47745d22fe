"""A simulated tiered KV store and a worker loop for scheduler tests (paged KV alone:
test_simulated_kv; snapshots and the host tier: the others).

`TieredModel` executes plans the way the captured programs do: a generation row reads
every earlier position of its request through the row's page table (each must have been
written), writes its tokens into their pages, and samples `next_token(history)`, a
function of the whole history it read; a TRANSFER plan copies whole rows between the
page, continuation and host tiers. A wrong restore, a page reused before a copy read it,
or a snapshot published from the wrong page therefore changes the output, which tests
compare with each request run alone (`reference`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from helios_serve.engine.plan import ModelGeometry, StepKind, StepPlan, Tier
from helios_serve.scheduler import FinishReason, SchedRequest, Scheduler, TransferCost
from helios_serve.testing.scripted import ALL_ROUTES

from .conftest import TINY

# The scheduler tests' geometry (conftest.TINY) with snapshot rows and copy programs.
TIERED = replace(TINY, snapshot_rows=4, host_rows=0, transfer_rows=4, routes=ALL_ROUTES,
                 page_bytes=64)

# Copies far cheaper than prefill: preemption keeps a request's state.
CHEAP_COPIES = TransferCost(transfer_step_s=1e-6, page_copy_s=1e-6, prefill_tokens_per_s=1.0)


def next_token(history: list[int]) -> int:
    """The fake model: a position-sensitive function of the full history (never 0 = EOS)."""
    acc = 17
    for t in history:
        acc = (acc * 31 + t) % 1_000_003
    return acc % 997 + 1


def reference(prompt: tuple[int, ...], max_output: int) -> list[int]:
    history = list(prompt)
    out = []
    for _ in range(max_output):
        out.append(next_token(history))
        history.append(out[-1])
    return out


class Fault(RuntimeError):
    pass


class TieredModel:
    """kv[tier][row][offset]: the token whose KV the row holds at that offset. Every plan
    must fit the geometry's capacities (rows, tokens, one slot per row, pages covering
    exactly the positions a row writes)."""

    def __init__(self, g: ModelGeometry) -> None:
        self.g = g
        pt = g.page_tokens
        self.kv: dict[Tier, list[list[int | None]]] = {
            Tier.PAGES: [[None] * pt for _ in range(g.num_pages)],
            Tier.CONTINUATION: [[None] * pt for _ in range(g.snapshot_rows)],
            Tier.HOST: [[None] * pt for _ in range(g.host_rows)],
        }
        self.prefilled: list[tuple[int, int, int]] = []  # (request, start, tokens) per row

    def execute(self, plan: StepPlan) -> list[int]:
        g = self.g
        if plan.kind is StepKind.TRANSFER:
            assert plan.route in g.routes and 0 < len(plan.copies) <= g.transfer_rows
            src, dst = self.kv[plan.route.source], self.kv[plan.route.destination]
            rows = [list(src[c.source]) for c in plan.copies]
            for c, row in zip(plan.copies, rows, strict=True):
                dst[c.destination] = row
            return []
        if plan.kind is StepKind.DECODE:
            assert len(plan.rows) <= g.decode_capacities[-1]
            assert all(len(r.tokens) == 1 for r in plan.rows)
        else:
            assert plan.token_count <= g.prefill_token_capacities[-1]
            assert len(plan.rows) <= g.prefill_row_capacity
        assert len({r.slot for r in plan.rows}) == len(plan.rows)
        pages = self.kv[Tier.PAGES]
        sampled = []
        for row in plan.rows:
            end = row.start_position + len(row.tokens)
            assert len(row.page_ids) == -(-end // g.page_tokens) <= g.max_pages_per_request
            if plan.kind is StepKind.PREFILL:
                self.prefilled.append((row.request_id, row.start_position, len(row.tokens)))
            history = [pages[row.page_ids[p // g.page_tokens]][p % g.page_tokens]
                       for p in range(row.start_position)]
            assert None not in history, f"request {row.request_id} reads unwritten KV"
            for i, t in enumerate(row.tokens):
                p = row.start_position + i
                pages[row.page_ids[p // g.page_tokens]][p % g.page_tokens] = t
            sampled.append(next_token(history + list(row.tokens)) if row.sample else -1)
        return sampled


@dataclass
class Loop:
    """The worker's loop over a TieredModel: requests finish at their output limit
    (publishing a snapshot) unless `stop_at` ends them earlier without publishing."""

    sched: Scheduler
    model: TieredModel
    limits: dict[int, int] = field(default_factory=dict)
    stop_at: dict[int, int] = field(default_factory=dict)
    outputs: dict[int, list[int]] = field(default_factory=dict)
    reused: dict[int, int] = field(default_factory=dict)
    failed: list[int] = field(default_factory=list)
    plans: list[StepPlan] = field(default_factory=list)
    fail_plans: set[int] = field(default_factory=set)  # indices into plans that fail
    fail_routes: set = field(default_factory=set)  # the next TRANSFER on each route fails

    def add(self, request_id: int, prompt, max_output: int, **kw) -> None:
        request = SchedRequest(request_id, tuple(prompt), max_output, **kw)
        assert self.sched.add(request) is None
        self.limits[request_id] = max_output
        self.outputs[request_id] = []

    def step(self) -> StepPlan | None:
        plan = self.sched.schedule()
        if plan is None:
            return None
        index = len(self.plans)
        self.plans.append(plan)
        if plan.route in self.fail_routes:
            self.fail_routes.discard(plan.route)
            self.fail_plans.add(index)
        if index in self.fail_plans:
            for summary in self.sched.fail(plan):
                self.failed.append(summary.request_id)
            return plan
        for r in self.sched.complete(plan, self.model.execute(plan)):
            if r.token_id is None:
                continue
            out = self.outputs[r.request_id]
            out.append(r.token_id)
            if len(out) == self.stop_at.get(r.request_id):
                s = self.sched.finish(r.request_id, FinishReason.STOP, publish=False)
                self.reused[r.request_id] = s.reused_prompt_tokens
            elif len(out) == self.limits[r.request_id]:
                s = self.sched.finish(r.request_id, FinishReason.LENGTH, publish=True)
                self.reused[r.request_id] = s.reused_prompt_tokens
        return plan

    def run(self, max_steps: int = 500) -> None:
        for _ in range(max_steps):
            if self.step() is None and not self.sched.has_work():
                return
        raise AssertionError("scheduler did not drain")

    def prefilled_tokens(self, request_id: int) -> int:
        return sum(n for rid, _, n in self.model.prefilled if rid == request_id)


def make_loop(cost: TransferCost | None = None, write_back: bool = True, **changes) -> Loop:
    g = replace(TIERED, **changes)
    return Loop(Scheduler(g, transfer_cost=cost, write_back=write_back), TieredModel(g))


def assert_quiescent(loop: Loop) -> None:
    """Drained: no request, page or row is held by anything but the caches."""
    s = loop.sched
    stats = s.stats()
    assert stats.idle, stats
    assert s.cache.quiescent()
    p = s.pages
    assert p.free_pages + p.evictable_pages == p.num_pages
    c = s.cache
    for pool in (c.continuation, c.host):
        assert pool.free_rows + pool.idle_rows == pool.rows
