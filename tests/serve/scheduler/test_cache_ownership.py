"""Model check: page, snapshot and host-row ownership against a simulated store.

Hypothesis drives random multi-turn workloads (follow-ups extend earlier conversations,
identical prompts repeat, prompt-turn endpoints are marked) through the scheduler with
up to two outstanding plans, with or without idle-time write-back to the host tier, random execution failures (generation and TRANSFER steps;
a failed step leaves garbage where it wrote), cancellations and host stops, over tiny
caches so that pages, continuation rows and host rows are evicted constantly. The
simulated store (tiered.TieredModel) holds what each page and row really contains.

After every operation:
- every published device page, every host-tier page and every resident snapshot holds
  exactly the tokens its key names (nothing is reused while a copy or a write is still
  due, nothing is published from a failed step);
- free + evictable + used == num_pages, and each row pool's states add up to its rows;
- every request that ends normally produced exactly what it produces run alone;
and once drained, nothing is referenced, written or read: nothing leaked. Every release,
unpin, commit and abort checks the state it leaves (PageAllocator, RowPool raise
ValueError otherwise): nothing is freed twice.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from helios_serve.engine.plan import StepKind, Tier
from helios_serve.scheduler import (
    ROOT_HASH,
    FinishReason,
    SchedRequest,
    Scheduler,
    chain_hashes,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .tiered import CHEAP_COPIES, TIERED, TieredModel, reference

GARBAGE = -7  # what a failed step leaves where it wrote


class Harness:
    def __init__(self, g, frames: int, write_back: bool = True) -> None:
        self.g = g
        self.sched = Scheduler(g, frames=frames, transfer_cost=CHEAP_COPIES,
                               write_back=write_back)
        self.model = TieredModel(g)
        self.outstanding: deque = deque()  # (plan, sampled or None when it fails)
        self.requests: dict[int, SchedRequest] = {}
        self.outputs: dict[int, list[int]] = {}
        self.limits: dict[int, int] = {}
        self.stops: dict[int, int] = {}
        self.ended: dict[int, str] = {}
        self.page_tokens: dict[bytes, tuple[int, ...]] = {}
        self.next_id = 1

    # -- operations -------------------------------------------------------------------------

    def add(self, prompt: tuple[int, ...], limit: int, stop: int | None,
            endpoints: tuple[int, ...]) -> None:
        rid = self.next_id
        self.next_id += 1
        request = SchedRequest(rid, prompt, limit, publish_endpoints=endpoints)
        if self.sched.add(request) is not None:
            return  # over capacity: rejected, never queued
        self.requests[rid] = request
        self.outputs[rid] = []
        self.limits[rid] = limit
        if stop is not None:
            self.stops[rid] = stop
        self._learn(prompt)

    def submit(self, fail: bool) -> bool:
        if not self.sched.can_schedule_ahead():
            return False
        plan = self.sched.schedule()
        if plan is None:
            return False
        if fail:
            self._garbage(plan)
            self.outstanding.append((plan, None))
        else:
            self.outstanding.append((plan, self.model.execute(plan)))
        return True

    def complete(self) -> bool:
        if not self.outstanding:
            return False
        plan, sampled = self.outstanding.popleft()
        if sampled is None:
            for summary in self.sched.fail(plan):
                self.ended[summary.request_id] = "failed"
            return True
        for r in self.sched.complete(plan, sampled):
            if r.token_id is None:
                continue
            out = self.outputs[r.request_id]
            out.append(r.token_id)
            self._learn(self.requests[r.request_id].prompt_tokens + tuple(out))
            if len(out) == self.stops.get(r.request_id):
                self.sched.finish(r.request_id, FinishReason.STOP, publish=False)
                self.ended[r.request_id] = "stop"
            elif len(out) == self.limits[r.request_id]:
                self.sched.finish(r.request_id, FinishReason.LENGTH, publish=True)
                self.ended[r.request_id] = "length"
        return True

    def cancel(self, index: int) -> None:
        live = [rid for rid in self.requests if rid not in self.ended]
        if live:
            rid = live[index % len(live)]
            self.sched.cancel(rid)
            self.ended[rid] = "cancelled"

    def drain(self) -> None:
        for _ in range(2000):
            if not self.complete() and not self.submit(fail=False):
                if not self.sched.has_work():
                    return
        raise AssertionError("did not drain")

    # -- the simulated store ----------------------------------------------------------------

    def _garbage(self, plan) -> None:
        """A failed step: it may have written some of its destinations."""
        kv = self.model.kv
        pt = self.g.page_tokens
        if plan.kind is StepKind.TRANSFER:
            for c in plan.copies:
                kv[plan.route.destination][c.destination] = [GARBAGE] * pt
            return
        for row in plan.rows:
            for i in range(row.lane_length):
                p = row.start_position + i
                kv[Tier.PAGES][row.page_ids[p // pt]][p % pt] = GARBAGE

    def _learn(self, tokens: tuple[int, ...]) -> None:
        pt = self.g.page_tokens
        for i, h in enumerate(chain_hashes(tokens, pt, len(tokens) // pt)):
            self.page_tokens[h] = tuple(tokens[i * pt:(i + 1) * pt])

    def check(self) -> None:
        s, kv = self.sched, self.model.kv
        p = s.pages
        assert p.free_pages + p.evictable_pages + p.used_pages == p.num_pages
        for page in range(p.num_pages):
            h = p._hash_of.get(page)  # noqa: SLF001 - the model check reads the index
            if h is not None:
                assert tuple(kv[Tier.PAGES][page]) == self.page_tokens[h], "published page"
        c = s.cache
        for pool, tier in ((c.continuation, Tier.CONTINUATION), (c.host, Tier.HOST)):
            assert pool.free_rows + pool.writing_rows + pool.resident_rows == pool.rows
            for key in pool.resident_keys():
                row = kv[tier][pool.lookup(key)]
                if tier is Tier.HOST and key[0] == "page":
                    assert tuple(row) == self.page_tokens[key[1]], "host page"
                    continue
                chain, tail = key[1] if tier is Tier.HOST else key
                assert tuple(row[:len(tail)]) == tail, "snapshot payload"
                assert chain in self.page_tokens or chain == ROOT_HASH
        for rid, out in self.outputs.items():
            want = reference(self.requests[rid].prompt_tokens, self.limits[rid])
            assert out == want[:len(out)], f"request {rid} diverged"


@st.composite
def workloads(draw):
    g = replace(TIERED, num_pages=draw(st.integers(5, 12)),
                snapshot_rows=draw(st.integers(0, 3)), host_rows=draw(st.integers(0, 6)),
                transfer_rows=draw(st.integers(1, 3)), slots=draw(st.integers(1, 3)))
    frames = draw(st.integers(1, 2))
    write_back = draw(st.booleans())  # idle-time copies to the host tier, or at eviction only
    ops = draw(st.lists(st.tuples(
        st.sampled_from(["add"] * 3 + ["submit"] * 5 + ["complete"] * 5 + ["cancel", "drain"]),
        st.integers(0, 10**6)), min_size=10, max_size=100))
    return g, frames, write_back, ops


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.data())
def test_ownership_against_the_simulated_store(workload, data):
    g, frames, write_back, ops = workload
    h = Harness(g, frames, write_back)
    for op, x in ops:
        if op == "add":
            done = [rid for rid, how in h.ended.items() if how in ("length", "stop")]
            kind = x % 4
            if kind == 0 or not done:
                prompt = tuple(data.draw(st.lists(st.integers(1, 9), min_size=1, max_size=9)))
            else:
                rid = done[x % len(done)]
                prompt = h.requests[rid].prompt_tokens
                if kind >= 2:  # a follow-up turn: the conversation, its output, new tokens
                    prompt = (prompt + tuple(h.outputs[rid]) + tuple(data.draw(
                        st.lists(st.integers(1, 9), min_size=1, max_size=5))))[:20]
            limit = 1 + x % 6
            stop = (1 + x % limit) if x % 7 == 0 else None
            cut = [e for e in range(1, len(prompt) + 1) if (e * 7 + x) % 5 == 0][:2]
            h.add(prompt, limit, stop, tuple(cut))
        elif op == "submit":
            h.submit(fail=x % 9 == 0)
        elif op == "complete":
            h.complete()
        elif op == "drain":
            h.drain()
        else:
            h.cancel(x)
        h.check()
    h.drain()
    h.check()
    stats = h.sched.stats()
    assert stats.idle, stats
    assert h.sched.cache.quiescent()
    for rid, how in h.ended.items():
        if how == "length":
            want = reference(h.requests[rid].prompt_tokens, h.limits[rid])
            assert h.outputs[rid] == want
