"""The host-memory tier in the scheduler: evicted pages and snapshots move there (at their
eviction, or written back ahead of it while idle) and come back by copy; preemption swaps
through it when copying beats recomputing. Tests of the eviction-time path turn idle-time
write-back off (`write_back=False`)."""

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
    loop = make_loop(CHEAP_COPIES, write_back=False, snapshot_rows=1, host_rows=8)
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
    loop = make_loop(CHEAP_COPIES, False, num_pages=3, host_rows=8, snapshot_rows=0)
    _one_page_evicted(loop, fail_swap_out=True)
    stats = loop.sched.stats()
    assert loop.failed == [] and stats.host_rows_used == 0 and stats.host_swap_outs == 0
    follow = tuple(range(1, 9)) + (5,)
    loop.add(2, follow, 1)
    loop.run()
    assert loop.reused[2] == 4  # the first page only: the second was not kept
    assert_quiescent(loop)


def test_a_failed_swap_in_fails_only_that_request():
    loop = make_loop(CHEAP_COPIES, False, num_pages=3, host_rows=8, snapshot_rows=0)
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


# -- idle-time write-back ---------------------------------------------------------------------


def _transfers_between(loop, start: int, end: int) -> list:
    return [p for p in loop.plans[start:end] if p.kind is StepKind.TRANSFER]


def test_idle_write_back_makes_a_revisit_one_swap_in_step():
    loop = make_loop(CHEAP_COPIES, num_pages=5, host_rows=16, snapshot_rows=8)
    prompt = tuple(range(1, 10))
    loop.add(1, prompt, 3)  # committed 11: 2 complete pages + a snapshot of 3 tokens
    loop.run()
    cache = loop.sched.cache
    # Idle after it: both pages and the snapshot are copied to free host rows.
    assert _copied(loop, PAGES_OUT) == 2 and _copied(loop, SNAPSHOT_OUT) == 1
    assert cache.write_backs == 3 and loop.sched.stats().host_rows_used == 3
    _evict_everything(loop, 10, 5)
    stats = loop.sched.stats()
    assert stats.page_evictions >= 2 and stats.host_evictions == 0
    assert stats.host_swap_outs == cache.write_backs  # evictions copied nothing more
    follow = prompt + tuple(loop.outputs[1]) + (7, 8)
    start = len(loop.plans)
    loop.add(2, follow, 3)
    loop.run()
    assert loop.reused[2] == 11
    assert loop.outputs[2] == reference(follow, 3)
    first_prefill = next(i for i in range(start, len(loop.plans))
                         if loop.plans[i].kind is StepKind.PREFILL)
    # The snapshot is still in its continuation row too, but its pages come from the host
    # tier: its row joins their step, so the revisit needs ONE transfer before prefill.
    (swap_in,) = _transfers_between(loop, start, first_prefill)
    assert swap_in.route == HOST_IN and len(swap_in.copies) == 3
    assert_quiescent(loop)


def test_write_back_waits_for_idle_and_never_evicts_a_host_row():
    loop = make_loop(CHEAP_COPIES, num_pages=8, host_rows=2, snapshot_rows=0)
    loop.add(1, tuple(range(1, 9)), 5)  # 8 + 5 tokens: 3 complete pages by its end
    loop.run()
    last_generation = max(i for i, p in enumerate(loop.plans) if p.kind is not StepKind.TRANSFER)
    written = [i for i, p in enumerate(loop.plans) if p.route == PAGES_OUT]
    assert written and min(written) > last_generation  # nothing while it was live
    stats = loop.sched.stats()
    assert stats.host_rows_used == 2 and loop.sched.cache.write_backs == 2  # 2 rows, 3 pages
    loop.add(2, tuple(range(50, 59)), 1)  # 2 more pages published: no free host row
    loop.run()
    stats = loop.sched.stats()
    assert loop.sched.cache.write_backs == 2 and stats.host_evictions == 0
    assert not loop.sched.has_work()  # a backlog with no free row is no work
    assert_quiescent(loop)


def test_a_failed_write_back_leaves_the_copy_to_the_eviction():
    loop = make_loop(CHEAP_COPIES, num_pages=3, host_rows=8, snapshot_rows=0)
    loop.fail_routes = {PAGES_OUT}  # the idle write-back of request 1's two pages fails
    start = _one_page_evicted_after_write_back(loop)
    # The failed write-back kept nothing; request 10's admission evicts request 1's second
    # page and copies it out then (request 10's own page is written back after it).
    assert loop.failed == [] and loop.sched.cache.write_backs == 1
    assert loop.plans[start].route == PAGES_OUT and len(loop.plans[start].copies) == 1
    follow = tuple(range(1, 9)) + (5,)
    loop.add(2, follow, 1)
    loop.run()
    assert loop.reused[2] == 8  # one page still on the device, one copied back from host
    assert loop.outputs[2] == reference(follow, 1)
    assert_quiescent(loop)


def _one_page_evicted_after_write_back(loop) -> int:
    """Like `_one_page_evicted`, with write-back on: request 1's idle write-back runs
    first (and fails where the test says so); returns the index of the first transfer of
    request 10's admission."""
    loop.add(1, tuple(range(1, 9)), 1)
    loop.run()
    start = len(loop.plans)
    loop.add(10, tuple(range(1000, 1007)), 1)
    loop.run()
    return start
