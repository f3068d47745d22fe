"""The host-memory tier in the scheduler: evicted pages and snapshots move there and come
back by copy; preemption swaps through it when copying beats recomputing."""

from __future__ import annotations

from helios_serve.engine.plan import Route, StepKind, Tier
from helios_serve.scheduler import TransferCost

from .tiered import CHEAP_COPIES, assert_quiescent, make_loop, reference

PAGES_OUT = Route(Tier.PAGES, Tier.HOST)
HOST_IN = Route(Tier.HOST, Tier.PAGES)
SNAPSHOT_OUT = Route(Tier.CONTINUATION, Tier.HOST)
COSTLY = TransferCost(transfer_step_s=1.0, page_copy_s=1.0, prefill_tokens_per_s=1e9)


def _copied(loop, route) -> int:
    return sum(len(p.copies) for p in loop.plans
               if p.kind is StepKind.TRANSFER and p.route == route)


def _evict_everything(loop, first_id: int, count: int) -> None:
    for i in range(count):
        rid = first_id + i
        loop.add(rid, tuple(range(100 * rid, 100 * rid + 7)), 1)  # 8 tokens: two pages
        loop.run()


def test_evicted_pages_round_trip_through_the_host_tier():
    loop = make_loop(CHEAP_COPIES, num_pages=5, host_rows=8)
    prompt = tuple(range(1, 10))
    loop.add(1, prompt, 3)  # 12 tokens: 2 complete pages + a snapshot of 3 tokens
    loop.run()
    _evict_everything(loop, 10, 5)
    stats = loop.sched.stats()
    assert stats.host_swap_outs >= 2 and stats.page_evictions >= 2
    follow = prompt + tuple(loop.outputs[1]) + (7, 8)
    loop.add(2, follow, 3)
    loop.run()
    assert loop.reused[2] == 11  # both pages and the tail come back from the host tier
    assert loop.outputs[2] == reference(follow, 3)
    stats = loop.sched.stats()
    # Six snapshots for four continuation rows: request 1's moved to the host tier too.
    assert stats.snapshot_evictions == 2
    assert stats.host_hits == stats.host_swap_ins == _copied(loop, HOST_IN) == 3
    assert_quiescent(loop)


def test_without_a_host_tier_evicted_pages_are_recomputed():
    loop = make_loop(CHEAP_COPIES, num_pages=5)
    prompt = tuple(range(1, 10))
    loop.add(1, prompt, 3)
    loop.run()
    _evict_everything(loop, 10, 5)
    follow = prompt + tuple(loop.outputs[1]) + (7, 8)
    loop.add(2, follow, 3)
    loop.run()
    assert loop.reused[2] == 0
    assert loop.outputs[2] == reference(follow, 3)
    assert loop.sched.stats().host_swap_outs == 0


def test_snapshots_evicted_from_continuation_rows_restore_from_the_host_tier():
    loop = make_loop(CHEAP_COPIES, snapshot_rows=1, host_rows=8)
    a, b = (1, 2, 3, 4, 5), (11, 12, 13, 14, 15)
    loop.add(1, a, 2)  # committed 6: tail 2
    loop.run()
    loop.add(2, b, 2)  # takes the only continuation row: request 1's snapshot moves out
    loop.run()
    stats = loop.sched.stats()
    assert stats.snapshot_evictions == 1 and _copied(loop, SNAPSHOT_OUT) == 1
    follow = a + tuple(loop.outputs[1]) + (9,)
    loop.add(3, follow, 2)
    loop.run()
    assert loop.reused[3] == 6
    assert loop.outputs[3] == reference(follow, 2)
    assert loop.sched.stats().host_hits == 1
    assert_quiescent(loop)


def test_a_full_host_tier_evicts_its_least_recently_used_row():
    loop = make_loop(CHEAP_COPIES, num_pages=4, host_rows=2, snapshot_rows=0)
    loop.add(1, tuple(range(1, 9)), 1)  # two complete pages
    loop.run()
    _evict_everything(loop, 10, 5)
    stats = loop.sched.stats()
    assert stats.host_rows_used == 2
    assert stats.host_evictions == stats.host_swap_outs - 2 > 0


def test_copies_dearer_than_prefill_never_use_the_host_tier():
    loop = make_loop(COSTLY, num_pages=4, host_rows=8)
    loop.add(1, tuple(range(1, 10)), 3)
    loop.run()
    _evict_everything(loop, 10, 5)
    assert not loop.sched.swap_pages
    assert loop.sched.stats().host_swap_outs == 0


def test_preemption_swaps_the_victims_pages_through_the_host_tier():
    loop = make_loop(CHEAP_COPIES, num_pages=4, slots=2, host_rows=8)
    loop.add(1, tuple(range(1, 7)), 6)  # 12 tokens: 3 pages each, 4 pages in all
    loop.add(2, tuple(range(50, 56)), 6)
    loop.run()
    stats = loop.sched.stats()
    assert stats.preemptions >= 1
    assert stats.host_swap_ins >= 1  # the victim's pages came back by copy
    assert loop.outputs[1] == reference(tuple(range(1, 7)), 6)
    assert loop.outputs[2] == reference(tuple(range(50, 56)), 6)
    assert_quiescent(loop)


def _one_page_evicted(loop, fail_swap_out: bool) -> int:
    """Request 1 leaves two cached pages; request 10 takes the free page and evicts the
    least recently released cached one (request 1's second page). Returns the index of
    the plan that copies it to the host tier."""
    loop.add(1, tuple(range(1, 9)), 1)  # 8 prompt tokens: two complete pages
    loop.run()
    start = len(loop.plans)
    if fail_swap_out:
        loop.fail_plans = {start}
    loop.add(10, tuple(range(1000, 1007)), 1)  # 7 + 1 tokens: two pages
    loop.run()
    assert loop.plans[start].route == PAGES_OUT and len(loop.plans[start].copies) == 1
    return start


def test_a_failed_swap_out_publishes_nothing():
    loop = make_loop(CHEAP_COPIES, num_pages=3, host_rows=8, snapshot_rows=0)
    _one_page_evicted(loop, fail_swap_out=True)
    stats = loop.sched.stats()
    assert loop.failed == [] and stats.host_rows_used == 0 and stats.host_swap_outs == 0
    follow = tuple(range(1, 9)) + (5,)
    loop.add(2, follow, 1)
    loop.run()
    assert loop.reused[2] == 4  # the first page only: the second was not kept
    assert_quiescent(loop)


def test_a_failed_swap_in_fails_only_that_request():
    loop = make_loop(CHEAP_COPIES, num_pages=3, host_rows=8, snapshot_rows=0)
    _one_page_evicted(loop, fail_swap_out=False)
    assert loop.sched.stats().host_rows_used == 1
    loop.fail_routes = {HOST_IN}
    loop.add(2, tuple(range(1, 9)) + (5,), 1)
    loop.run()
    assert loop.failed == [2]
    assert loop.sched.stats().host_swap_ins == 0
    loop.add(3, tuple(range(1, 9)) + (6,), 1)  # the host row was kept: a retry uses it
    loop.run()
    assert loop.reused[3] == 8 and loop.sched.stats().host_swap_ins == 1
    assert loop.outputs[3] == reference(tuple(range(1, 9)) + (6,), 1)
    assert_quiescent(loop)
