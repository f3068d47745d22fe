"""Two execution frames on the real tiny model (NativeModel, cpu backend, cpu_frames=2)
driven by the real scheduler: decode submitted ahead with the device-owned pending token
must produce exactly the tokens of one frame, and of a dense greedy reference, through
cancellation with an ahead row in flight, prefix reuse and preemption."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from helios_ignition.testing import TINY_SHAPES, dense_forward, tiny_core
from helios_serve.engine.plan import PENDING_PLACEHOLDER, SamplingParams, StepKind
from helios_serve.runtime.cache_sizing import CacheSizing
from helios_serve.scheduler import FinishReason, SchedRequest, Scheduler
from helios_serve.testing.native import load_native


@pytest.fixture(scope="module")
def core():
    return tiny_core(seed=3)


def greedy(core, prompt, n: int, eos: int) -> list[int]:
    seq, out = list(prompt), []
    while len(out) < n:
        t = int(np.argmax(dense_forward(core.weights, TINY_SHAPES, seq)[-1]))
        out.append(t)
        seq.append(t)
        if t == eos:
            break
    return out


class Loop:
    """The worker's loop over NativeModel: submit ahead while the scheduler allows."""

    def __init__(self, core, frames: int, num_pages: int | None = None) -> None:
        cache = CacheSizing(num_pages=num_pages)
        self.model = load_native(core, "cpu", cpu_frames=frames, cache=cache)
        self.eos = self.model.manifests.eos_token_ids[0]
        self.sched = Scheduler(self.model.manifests, frames=frames,
                               device_pending=self.model.device_pending)
        self.inflight: deque = deque()
        self.outputs: dict[int, list[int]] = {}
        self.limits: dict[int, int] = {}
        self.done: dict[int, FinishReason] = {}
        self.placeholders = 0
        self.max_outstanding = 0

    def add(self, rid: int, prompt, limit: int, sampling: SamplingParams | None = None):
        req = SchedRequest(rid, tuple(prompt), limit, sampling or SamplingParams())
        assert self.sched.add(req) is None
        self.outputs[rid], self.limits[rid] = [], limit

    def submit(self) -> bool:
        if not self.sched.can_schedule_ahead():
            return False
        plan = self.sched.schedule()
        if plan is None:
            return False
        self.placeholders += sum(r.tokens == (PENDING_PLACEHOLDER,) for r in plan.rows)
        self.inflight.append((plan, self.model.submit(plan)))
        self.max_outstanding = max(self.max_outstanding, self.model.outstanding)
        return True

    def complete(self) -> None:
        plan, ticket = self.inflight.popleft()
        for r in self.sched.complete(plan, self.model.wait(ticket)):
            if r.token_id is None:
                continue
            out = self.outputs[r.request_id]
            out.append(r.token_id)
            if r.token_id == self.eos:
                self.sched.finish(r.request_id, FinishReason.STOP)
                self.done[r.request_id] = FinishReason.STOP
            elif len(out) == self.limits[r.request_id]:
                self.sched.finish(r.request_id, FinishReason.LENGTH)
                self.done[r.request_id] = FinishReason.LENGTH

    def step(self) -> bool:
        if self.submit():
            return True
        if self.inflight:
            self.complete()
            return True
        return False

    def drain(self) -> None:
        for _ in range(5000):
            if not self.step():
                break
        assert not self.sched.has_work()
        s = self.sched.stats()
        assert (s.pages_used, s.slots_free) == (0, self.sched.geometry.slots)


PROMPTS = {
    1: [5, 17, 3, 88, 41],
    2: [9, 8, 7],
    3: [40, 41, 42, 43, 44, 45, 46],
    4: [1, 2, 3, 4, 5, 6, 7, 8, 9],
}


@pytest.mark.parametrize("num_pages", [None, 9])
def test_two_frames_equal_one_frame_and_dense_greedy(core, num_pages):
    runs = {}
    for frames in (1, 2):
        loop = Loop(core, frames, num_pages)
        for rid, p in PROMPTS.items():
            loop.add(rid, p, 12 + rid)
        loop.drain()
        runs[frames] = (loop.outputs, loop.max_outstanding, loop.placeholders,
                        loop.sched.stats().preemptions)
    (one, one_out, one_ph, _), (two, two_out, two_ph, pre) = runs[1], runs[2]
    assert (one_out, one_ph, two_out) == (1, 0, 2) and two_ph > 0
    if num_pages:
        assert pre > 0
    assert two == one
    for rid, p in PROMPTS.items():
        assert two[rid] == greedy(core, p, 12 + rid, 95)


def test_penalties_read_the_histogram_in_order_when_running_ahead(core):
    sampling = SamplingParams(repetition_penalty=1.7, presence_penalty=0.4,
                              frequency_penalty=0.3)
    runs = {}
    for frames in (1, 2):
        loop = Loop(core, frames, num_pages=10)
        for rid, p in PROMPTS.items():
            loop.add(rid, p, 14, sampling)
        loop.drain()
        runs[frames] = loop.outputs
        assert loop.max_outstanding == frames
    assert runs[1] == runs[2]


def test_cancel_with_an_ahead_row_then_prefix_reuse_of_its_sequence(core):
    loop = Loop(core, 2)
    loop.add(1, PROMPTS[4], 20)
    while len(loop.outputs[1]) < 6 or len(loop.inflight) < 2:
        assert loop.step()
    assert [p.kind for p, _ in loop.inflight] == [StepKind.DECODE, StepKind.DECODE]
    assert loop.inflight[-1][0].rows[0].tokens == (PENDING_PLACEHOLDER,)
    loop.sched.cancel(1)
    loop.drain()
    got = loop.outputs[1]
    ref = greedy(core, PROMPTS[4], 20, 95)
    assert got == ref[: len(got)] and len(got) >= 6
    # a follow-up whose prompt is the cancelled sequence so far: published pages reused
    follow = list(PROMPTS[4]) + got
    loop.add(2, follow, 8)
    loop.add(3, list(PROMPTS[4]) + got[:3], 8)
    loop.drain()
    assert loop.sched.stats().prefix_hit_tokens > 0
    assert loop.outputs[2] == greedy(core, follow, 8, 95)
    assert loop.outputs[3] == greedy(core, list(PROMPTS[4]) + got[:3], 8, 95)
