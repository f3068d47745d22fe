"""Adversarial tests of two execution frames (the specification: completion feedback).

The scheduler is driven against an emulated device that owns a paged cache and a
per-slot pending token: each sampled id is a hash of the request's whole sequence as
read back through the row's page table, so a wrong page table, a garbage page
published to the prefix cache, a slot reassigned under an in-flight frame or a
pending token fed from the wrong place changes the outputs. Every run is compared
with a serial reference (one token at a time, no cache).
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
from helios_serve.engine.plan import PENDING_PLACEHOLDER, StepKind, StepPlan
from helios_serve.scheduler import FinishReason, RowResult, SchedRequest, Scheduler
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import TINY

EOS = TINY.eos_token_ids[0]
TOKENS = 24  # sampled ids are in [0, TOKENS); 0 (EOS) about one in 24


def next_token(seq) -> int:
    """The emulated model: a function of the whole sequence."""
    digest = hashlib.blake2b(np.asarray(seq, dtype="<i8").tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % TOKENS


def reference(prompt, max_output: int) -> list[int]:
    """Serial generation: one token at a time until EOS or the output limit."""
    seq, out = list(prompt), []
    while len(out) < max_output:
        t = next_token(seq)
        out.append(t)
        seq.append(t)
        if t == EOS:
            break
    return out


class Device:
    """Paged cache and device-owned pending token per slot; steps complete in order."""

    def __init__(self, geometry, device_pending: bool) -> None:
        self.g = geometry
        self.device_pending = device_pending
        self.pages = np.full((geometry.num_pages, geometry.page_tokens), -1, np.int64)
        self.pending = np.full(geometry.slots, -1, np.int64)

    def run(self, plan: StepPlan) -> list[int]:
        pt = self.g.page_tokens
        out = []
        for row in plan.rows:
            tokens = row.tokens
            end = row.start_position + len(tokens)
            assert len(row.page_ids) * pt >= end
            if plan.kind is StepKind.DECODE and self.device_pending:
                fed = int(self.pending[row.slot])
                assert tokens[0] in (PENDING_PLACEHOLDER, fed), (tokens, fed)
                tokens = (fed,)
            assert PENDING_PLACEHOLDER not in tokens
            for i, t in enumerate(tokens):
                p = row.start_position + i
                self.pages[row.page_ids[p // pt], p % pt] = t
            if not row.sample:
                out.append(-1)
                continue
            seq = [int(self.pages[row.page_ids[p // pt], p % pt]) for p in range(end)]
            assert min(seq) >= 0, "read a position never written"
            t = next_token(seq)
            self.pending[row.slot] = t
            out.append(t)
        return out


@dataclass
class Driver:
    """The worker's loop with up to `frames` plans in flight, checking invariants."""

    sched: Scheduler
    device: Device
    prompts: dict[int, tuple[int, ...]] = field(default_factory=dict)
    limits: dict[int, int] = field(default_factory=dict)
    feedback: dict[int, bool] = field(default_factory=dict)
    outputs: dict[int, list[int]] = field(default_factory=dict)
    reasons: dict[int, FinishReason] = field(default_factory=dict)
    inflight: deque = field(default_factory=deque)  # (plan, sampled)
    failed_plans: int = 0

    @classmethod
    def make(cls, frames: int = 2, device_pending: bool = True, **geometry) -> Driver:
        g = replace(TINY, **geometry)
        return cls(Scheduler(g, frames=frames, device_pending=device_pending),
                   Device(g, device_pending))

    def add(self, rid: int, prompt, max_output: int, needs_feedback: bool = False) -> None:
        req = SchedRequest(rid, tuple(prompt), max_output, needs_feedback=needs_feedback)
        assert self.sched.add(req) is None
        self.prompts[rid], self.limits[rid] = tuple(prompt), max_output
        self.feedback[rid] = needs_feedback
        self.outputs[rid] = []

    def schedule(self) -> StepPlan | None:
        assert self.sched.can_schedule_ahead()
        plan = self.sched.schedule()
        if plan is None:
            return None
        self.check_issue(plan)
        self.inflight.append((plan, self.device.run(plan)))
        self.check_published()
        assert len(self.inflight) == self.sched.outstanding_frames <= self.sched.frames
        if any(self.feedback[r] for r in self.live()):
            assert len(self.inflight) == 1, "feedback request live with two frames out"
        return plan

    def live(self) -> list[int]:
        return [r for r in self.prompts if r not in self.reasons]

    def check_issue(self, plan: StepPlan) -> None:
        slots = [r.slot for r in plan.rows]
        assert len(set(slots)) == len(slots)
        for older, _ in self.inflight:
            for a in older.rows:
                for b in plan.rows:
                    if a.slot == b.slot:  # same slot in two frames: same request only
                        assert (a.request_id, a.generation) == (b.request_id, b.generation)
                    if a.request_id == b.request_id and a.sample and b.sample:
                        # a second sampling row only for a decode fed from the device
                        assert self.sched.device_pending
                        assert (older.kind, plan.kind) == (StepKind.DECODE, StepKind.DECODE)
        for r in plan.rows:
            assert r.request_id not in self.reasons, "row planned for a finished request"
        # pages of rows in flight are never shared between two running requests
        # unless published (read-only prefix pages)
        owners: dict[int, int] = {}
        for p, _ in list(self.inflight) + [(plan, None)]:
            for r in p.rows:
                pt = self.sched.geometry.page_tokens
                first_written = r.start_position // pt
                for page in r.page_ids[first_written:]:
                    assert owners.setdefault(page, r.request_id) == r.request_id, (
                        f"page {page} written by two requests in flight")

    def check_published(self) -> None:
        """Published pages hold exactly the tokens their owners know, and no frame in
        flight writes a published page."""
        pt = self.sched.geometry.page_tokens
        alloc = self.sched.pages
        for seq in self.sched.live.running:
            for i in range(seq.num_published):
                page = seq.page_ids[i]
                if alloc.is_published(page):
                    want = seq.tokens[i * pt:(i + 1) * pt]
                    assert list(self.device.pages[page]) == want, "garbage page published"
        for plan, _ in self.inflight:
            for r in plan.rows:
                end = r.start_position + len(r.tokens)
                for p in range(r.start_position, end):
                    page = r.page_ids[p // pt]
                    assert not alloc.is_published(page), "in-flight write to a published page"

    def complete(self) -> list[RowResult]:
        plan, sampled = self.inflight.popleft()
        results = self.sched.complete(plan, sampled)
        self.check_published()
        for r in results:
            if r.token_id is None:
                continue
            out = self.outputs[r.request_id]
            out.append(r.token_id)
            assert r.output_tokens == len(out)
            assert len(out) <= self.limits[r.request_id], "output limit overrun"
            if r.token_id == EOS:
                self.finish(r.request_id, FinishReason.STOP)
            elif len(out) == self.limits[r.request_id]:
                self.finish(r.request_id, FinishReason.LENGTH)
        return results

    def fail(self) -> None:
        plan, _ = self.inflight.popleft()
        self.failed_plans += 1
        for summary in self.sched.fail(plan):
            assert summary.reason is FinishReason.ERROR
            assert summary.request_id not in self.reasons
            self.reasons[summary.request_id] = FinishReason.ERROR

    def finish(self, rid: int, reason: FinishReason) -> None:
        summary = self.sched.finish(rid, reason)
        assert summary.reason is reason
        assert list(summary.output_tokens) == self.outputs[rid]
        self.reasons[rid] = reason

    def cancel(self, rid: int) -> None:
        if rid in self.reasons:
            return
        summary = self.sched.cancel(rid)
        assert summary is not None and summary.reason is FinishReason.CANCELLED
        self.reasons[rid] = FinishReason.CANCELLED

    def step(self) -> bool:
        """Submit ahead when allowed, else complete the oldest; False when idle."""
        if self.sched.can_schedule_ahead() and self.schedule() is not None:
            return True
        if self.inflight:
            self.complete()
            return True
        return False

    def drain(self, max_steps: int = 2000) -> None:
        for _ in range(max_steps):
            if not self.step():
                break
        else:
            raise AssertionError("did not drain")
        assert not self.sched.has_work(), "work left with nothing schedulable"
        self.check_idle()

    def check_idle(self) -> None:
        s = self.sched.stats()
        assert (s.running, s.waiting, s.outstanding_frames) == (0, 0, 0)
        assert s.slots_free == self.sched.geometry.slots
        assert s.pages_used == 0
        assert s.pages_free + s.pages_evictable == self.sched.geometry.num_pages

    def check_outputs(self) -> None:
        for rid, prompt in self.prompts.items():
            ref = reference(prompt, self.limits[rid])
            got = self.outputs[rid]
            reason = self.reasons.get(rid)
            if reason in (FinishReason.CANCELLED, FinishReason.ERROR):
                assert got == ref[: len(got)], rid
            else:
                assert got == ref, (rid, got, ref)
                want = FinishReason.STOP if ref[-1] == EOS else FinishReason.LENGTH
                assert reason is want


def prompt_without_eos(seed: int, n: int) -> tuple[int, ...]:
    return tuple(1 + (seed * 7 + i * 13) % (TOKENS - 1) for i in range(n))


# -- targeted cases ----------------------------------------------------------------


def find_prompt(predicate, n: int = 5, limit: int = 4000) -> tuple[int, ...]:
    """A prompt (no EOS in it) whose serial reference satisfies `predicate`."""
    for seed in range(limit):
        p = prompt_without_eos(seed, n)
        if predicate(p):
            return p
    raise AssertionError("no prompt found")


@pytest.mark.parametrize("max_output", [1, 2, 3, 4, 5])
def test_output_limit_is_exact_for_short_limits(max_output):
    d = Driver.make()
    prompt = find_prompt(lambda p: EOS not in reference(p, 8))
    d.add(1, prompt, max_output)
    d.drain()
    assert d.outputs[1] == reference(prompt, 8)[:max_output]
    assert d.reasons[1] is FinishReason.LENGTH
    d.check_outputs()


def test_eos_as_first_token_and_as_first_decode_token():
    d = Driver.make()
    first = find_prompt(lambda p: reference(p, 4)[0] == EOS)
    second = find_prompt(lambda p: reference(p, 4)[:2][-1:] == [EOS] and len(reference(p, 4)) == 2)
    third = find_prompt(lambda p: len(reference(p, 8)) == 3)  # EOS as the second decode token
    d.add(1, first, 8)
    d.add(2, second, 8)
    d.add(3, third, 8)
    d.drain()
    assert d.outputs[1] == [EOS] and d.outputs[2][-1] == EOS and len(d.outputs[2]) == 2
    assert len(d.outputs[3]) == 3 and d.outputs[3][-1] == EOS
    d.check_outputs()


def test_prefix_reuse_after_a_request_ended_with_an_ahead_row_in_flight():
    """Request 1 ends by EOS while its ahead row (which opened a fresh page) is in flight;
    request 2's prompt is request 1's prompt + output: only known tokens may be reused."""
    # prompt 6 tokens; EOS as the 3rd output -> positions 6, 7 fed; the ahead row feeds
    # position 8 (the EOS) and opens page 2.
    prompt = find_prompt(lambda p: len(reference(p, 16)) == 3, n=6)
    d = Driver.make()
    d.add(1, prompt, 16)
    d.drain()
    out = d.outputs[1]
    assert out == reference(prompt, 16) and out[-1] == EOS
    # a follow-up whose prompt is the whole first sequence plus more tokens
    follow = prompt + tuple(out) + (5, 6, 7, 9, 11)
    d.add(2, follow, 6)
    d.add(3, prompt + tuple(out[:-1]) + (3,) * 6, 6)
    d.drain()
    d.check_outputs()
    s = d.sched.stats()
    assert s.prefix_hit_tokens > 0


def test_cancel_while_the_ahead_row_is_in_flight_releases_only_after_completion():
    d = Driver.make()
    prompt = find_prompt(lambda p: EOS not in reference(p, 12), n=7)  # 7 tokens: page 1 open
    d.add(1, prompt, 12)
    d.schedule()
    d.complete()  # prefill: token 0 known
    p1 = d.schedule()  # decode at position 7
    p2 = d.schedule()  # ahead, position 8 opens page 2
    assert p1.kind is p2.kind is StepKind.DECODE
    assert p2.rows[0].tokens == (PENDING_PLACEHOLDER,) and p2.rows[0].page_ids == (0, 1, 2)
    d.cancel(1)
    s = d.sched.stats()
    assert (s.pages_used, s.slots_free) == (3, 3)
    # a newcomer may not take slot 0 while p1/p2 still use it
    d.add(2, prompt_without_eos(99, 5), 3)
    assert d.sched.can_schedule_ahead() is False
    assert d.complete() == []
    assert d.sched.stats().pages_used == 3
    plan = d.schedule()  # the newcomer's prefill, ahead of p2's completion
    assert [(r.request_id, r.slot) for r in plan.rows] == [(2, 1)]
    assert d.complete() == []  # p2 discarded, slot 0 and pages released now
    assert d.sched.stats().slots_free == 3
    d.drain()
    assert d.outputs[1] == reference(prompt, 12)[:1]
    d.check_outputs()


def test_fail_with_the_ahead_frame_in_flight_discards_it_and_keeps_serving():
    d = Driver.make()
    a = find_prompt(lambda p: EOS not in reference(p, 10), n=5)
    b = find_prompt(lambda p: EOS not in reference(p, 10) and p != a, n=6)
    d.add(1, a, 10)
    d.schedule()
    d.complete()
    d.schedule()  # decode of 1
    d.add(2, b, 10)
    d.schedule()  # prefill of 2, ahead
    d.fail()  # the decode of 1 failed: 1 ends with ERROR, 2 is untouched
    assert d.reasons == {1: FinishReason.ERROR}
    d.drain()
    assert d.outputs[2] == reference(b, 10)
    assert d.outputs[1] == reference(a, 10)[:1]
    d.check_outputs()


def test_fail_of_the_ahead_frame_after_the_first_completed():
    d = Driver.make()
    a = find_prompt(lambda p: EOS not in reference(p, 10), n=5)
    d.add(1, a, 10)
    d.schedule()
    d.complete()
    d.schedule()
    d.schedule()  # ahead
    d.complete()
    assert d.outputs[1] == reference(a, 10)[:2]
    d.fail()
    assert d.reasons == {1: FinishReason.ERROR}
    d.drain()
    assert d.outputs[1] == reference(a, 10)[:2]


def test_feedback_request_arriving_with_two_frames_out_waits_for_both():
    d = Driver.make()
    a = find_prompt(lambda p: EOS not in reference(p, 12), n=5)
    d.add(1, a, 12)
    d.schedule()
    d.complete()
    d.schedule()
    d.schedule()
    assert d.sched.outstanding_frames == 2
    d.add(2, prompt_without_eos(3, 6), 4, needs_feedback=True)
    assert not d.sched.can_schedule_ahead()
    d.complete()
    assert not d.sched.can_schedule_ahead()  # one outstanding and feedback is live
    d.complete()
    d.drain()
    d.check_outputs()


def test_page_pressure_with_frames_outstanding_preempts_and_recomputes():
    # 6 pages of 4 tokens; three requests of 8 prompt tokens + up to 8 outputs.
    d = Driver.make(num_pages=6)
    prompts = [find_prompt(lambda p, s=s: EOS not in reference(p, 8) and p[0] == s, n=8)
               for s in (1, 2, 3)]
    for i, p in enumerate(prompts):
        d.add(i + 1, p, 8)
    d.drain()
    assert d.sched.stats().preemptions > 0
    d.check_outputs()


@pytest.mark.parametrize("frames,device_pending", [(1, True), (2, False), (2, True)])
def test_many_requests_match_the_serial_reference(frames, device_pending):
    d = Driver.make(frames, device_pending, num_pages=12)
    for i in range(12):
        d.add(i, prompt_without_eos(i, 3 + i % 9), 1 + (i * 5) % 9,
              needs_feedback=(i % 5 == 4))
    d.drain()
    d.check_outputs()


# -- randomized ----------------------------------------------------------------------

OPS = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 40), st.integers(1, 12), st.integers(1, 10),
              st.booleans(), st.integers(0, 4)),
    st.tuples(st.just("step")),
    st.tuples(st.just("step")),
    st.tuples(st.just("step")),
    st.tuples(st.just("complete")),
    st.tuples(st.just("cancel"), st.integers(0, 30)),
    st.tuples(st.just("fail")),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, max_size=80), pages=st.sampled_from([5, 6, 8, 16]),
       frames=st.sampled_from([(2, True), (2, True), (2, False), (1, True)]),
       shape=st.sampled_from([{}, {"decode_capacities": (1,)}, {"decode_capacities": (1, 2)},
                              {"prefill_token_capacities": (4, 8), "prefill_row_capacity": 1},
                              {"prefill_token_capacities": (5,), "prefill_row_capacity": 2,
                               "decode_capacities": (2, 3)}]))
def test_random_schedules_keep_invariants_and_serial_outputs(ops, pages, frames, shape):
    d = Driver.make(*frames, num_pages=pages, **shape)
    rid = 0
    for op in ops:
        kind = op[0]
        if kind == "add":
            _, seed, n, max_out, feedback, share = op
            # share > 0: reuse a previous request's prompt (+ its output) as a prefix
            prompt = prompt_without_eos(seed, n)
            if share and d.prompts:
                prev = sorted(d.prompts)[seed % len(d.prompts)]
                base = d.prompts[prev] + tuple(d.outputs[prev])
                prompt = (base + prompt)[: len(base) + (n if share > 2 else 0) or 1]
            total = len(prompt) + max_out
            if total > TINY.context_tokens or -(-total // 4) > pages:
                continue
            d.add(rid, prompt, max_out, needs_feedback=feedback and seed % 3 == 0)
            rid += 1
        elif kind == "step":
            d.step()
        elif kind == "complete":
            if d.inflight:
                d.complete()
        elif kind == "cancel":
            if rid:
                d.cancel(op[1] % rid)
        elif kind == "fail":
            if d.inflight:
                d.fail()
        running = [s for s in d.sched.live.running if not s.retiring]
        slots = [s.slot for s in running]
        assert len(set(slots)) == len(slots)
    d.drain()
    d.check_outputs()
