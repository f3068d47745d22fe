"""Randomized workloads against a simulated paged KV store.

The fake model executes each plan row the way a paged-attention graph would:
it reads every earlier position of the request through the row's page table,
writes the row's tokens into their pages, and samples a token that is a
function of the whole history it read. Wrong page sharing, eviction of a live
page, a bad preemption/readmission or a missed chunk therefore changes the
output, which is compared with each request run alone.
"""

from __future__ import annotations

from dataclasses import replace

from helios_serve.engine.plan import StepPlan
from helios_serve.scheduler import FinishReason, SchedRequest, Scheduler
from hypothesis import given, settings
from hypothesis import strategies as st

from .tiered import TIERED, reference
from .tiered import TieredModel as PagedModel

# Paged KV only: no continuation rows, host tier or transfer programs.
TINY = replace(TIERED, snapshot_rows=0, host_rows=0, transfer_rows=0, routes=())


def check_allocator(sched: Scheduler) -> None:
    p = sched.pages
    assert p.free_pages + p.evictable_pages + p.used_pages == p.num_pages
    refs = [0] * p.num_pages
    for seq in sched.live.running:
        for page in seq.page_ids:
            refs[page] += 1
    assert refs == [p.refcount(i) for i in range(p.num_pages)]


request_st = st.tuples(
    st.integers(0, 2),  # which shared prefix
    st.lists(st.integers(1, 50), min_size=1, max_size=14),  # own suffix
    st.integers(1, 12),  # max output
    st.integers(0, 12),  # arrival step
    st.one_of(st.none(), st.integers(0, 30)),  # cancel at step
)


@settings(max_examples=150, deadline=None)
@given(
    requests=st.lists(request_st, min_size=2, max_size=12),
    num_pages=st.sampled_from([8, 9, 10, 12, 16]),
    schedule_ahead=st.booleans(),
)
def test_random_workloads_match_isolated_runs(requests, num_pages, schedule_ahead):
    g = replace(TINY, num_pages=num_pages)
    sched = Scheduler(g)
    model = PagedModel(g)
    prefixes = [(), (7, 8, 9, 10, 11, 12), (7, 8, 9, 10, 20, 21, 22, 23, 24)]
    pending = {}
    for rid, (pre, suffix, max_out, arrive, cancel_at) in enumerate(requests):
        prompt = prefixes[pre] + tuple(suffix)
        pending[rid] = (prompt, max_out, arrive, cancel_at)
    outputs: dict[int, list[int]] = {}
    finished: dict[int, FinishReason] = {}
    inflight: list[StepPlan] = []
    step = 0
    while len(finished) < len(requests):
        assert step < 2000
        for rid, (prompt, max_out, arrive, cancel_at) in pending.items():
            if arrive == step:
                if sched.add(SchedRequest(rid, prompt, max_out)) is None:
                    outputs[rid] = []
                else:
                    finished[rid] = FinishReason.ERROR  # rejected
            if cancel_at == step and rid in outputs and rid not in finished:
                sched.cancel(rid)
                finished[rid] = FinishReason.CANCELLED
        plan = sched.schedule()
        if plan is not None:
            inflight.append(plan)
            if schedule_ahead and sched.can_schedule_ahead():
                ahead = sched.schedule()
                if ahead is not None:
                    inflight.append(ahead)
        for plan in inflight:
            results = sched.complete(plan, model.execute(plan))
            for r in results:
                assert r.request_id not in finished
                if r.token_id is None:
                    continue
                outputs[r.request_id].append(r.token_id)
                if len(outputs[r.request_id]) == pending[r.request_id][1]:
                    sched.finish(r.request_id, FinishReason.LENGTH)
                    finished[r.request_id] = FinishReason.LENGTH
        inflight.clear()
        check_allocator(sched)
        step += 1
    for rid, out in outputs.items():
        prompt, max_out, _, _ = pending[rid]
        expect = reference(prompt, max_out)
        if finished[rid] is FinishReason.LENGTH:
            assert out == expect
        else:
            assert out == expect[: len(out)]
    s = sched.stats()
    assert s.idle
    assert s.pages_free + s.pages_evictable == num_pages
