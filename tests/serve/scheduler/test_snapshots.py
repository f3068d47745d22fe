"""Exact-endpoint snapshots in the scheduler: reuse counts, fences and failures, eviction.

Geometry: 4-token pages (tiered.TIERED); a request's end publishes a snapshot of every
committed token (prompt + output, but the last sampled token, whose KV is never
computed), so a follow-up whose prompt extends it prefills only the tokens after that
endpoint.
"""

from __future__ import annotations

from helios_serve.engine.plan import Route, StepKind, Tier
from helios_serve.scheduler import FinishReason

from .tiered import assert_quiescent, make_loop, reference

CAPTURE = Route(Tier.PAGES, Tier.CONTINUATION)
RESTORE = Route(Tier.CONTINUATION, Tier.PAGES)


def _transfers(loop, route):
    return [p for p in loop.plans if p.kind is StepKind.TRANSFER and p.route == route]


def test_turn_two_prefills_only_the_tokens_after_the_endpoint():
    loop = make_loop()
    prompt = tuple(range(1, 10))  # 9 tokens
    loop.add(1, prompt, 3)
    loop.run()
    turn1 = prompt + tuple(loop.outputs[1])  # 12 tokens; committed: 11
    assert loop.sched.stats().snapshot_publications == 1
    assert len(_transfers(loop, CAPTURE)) == 1
    turn2 = turn1 + (500, 501, 502, 503, 504)
    loop.add(2, turn2, 4)
    loop.run()
    assert loop.reused[2] == 11  # 2 complete pages + the 3-token tail
    assert loop.prefilled_tokens(2) == len(turn2) - 11  # the last output token + 5 new
    assert loop.outputs[2] == reference(turn2, 4)
    restore = _transfers(loop, RESTORE)
    assert len(restore) == 1 and len(restore[0].copies) == 1
    assert loop.sched.stats().snapshot_hits == 1
    assert_quiescent(loop)


def test_without_snapshots_only_complete_pages_are_reused():
    loop = make_loop(snapshot_rows=0)
    prompt = tuple(range(1, 10))
    loop.add(1, prompt, 3)
    loop.run()
    turn2 = prompt + tuple(loop.outputs[1]) + (500, 501)
    loop.add(2, turn2, 2)
    loop.run()
    assert loop.reused[2] == 8
    assert loop.prefilled_tokens(2) == len(turn2) - 8
    assert not [p for p in loop.plans if p.kind is StepKind.TRANSFER]
    assert loop.sched.stats().snapshot_publications == 0


def test_prompt_turn_endpoints_publish_inside_the_prompt():
    loop = make_loop()
    system = tuple(range(1, 7))  # a 6-token "system turn": its end is a publishable endpoint
    loop.add(1, system + (90, 91, 92, 93), 1, publish_endpoints=(6,))
    loop.run()
    stats = loop.sched.stats()
    assert stats.snapshot_publications == 2  # the turn end (tail 2) and the request's end
    other = system + (70, 71, 72)
    loop.add(2, other, 2)
    loop.run()
    assert loop.reused[2] == 6
    assert loop.outputs[2] == reference(other, 2)
    assert_quiescent(loop)


def test_an_identical_prompt_reuses_all_but_one_token_at_most():
    loop = make_loop()
    prompt = tuple(range(1, 11))  # 10 tokens: tail of 2 after two pages
    loop.add(1, prompt, 1, publish_endpoints=(9,))
    loop.run()
    loop.add(2, prompt, 3)
    loop.run()
    assert loop.reused[2] == 9
    assert loop.prefilled_tokens(2) == 1
    assert loop.outputs[2] == reference(prompt, 3)


def test_a_matched_stop_publishes_no_snapshot_and_keeps_earlier_pages():
    loop = make_loop()
    prompt = tuple(range(1, 10))
    loop.add(1, prompt, 8)
    loop.stop_at[1] = 4  # a host stop at the 4th token
    loop.run()
    stats = loop.sched.stats()
    assert stats.snapshot_publications == 0
    assert stats.pages_cached == 3  # 12 committed tokens: the three pages published before
    follow = prompt + tuple(loop.outputs[1]) + (600,)
    loop.add(2, follow, 1)
    loop.run()
    assert loop.reused[2] == 12
    assert_quiescent(loop)


def test_a_failed_generation_step_publishes_nothing():
    loop = make_loop()
    loop.add(1, tuple(range(1, 10)), 3)
    loop.fail_plans = {2}  # the second decode step
    loop.run()
    assert loop.failed == [1]
    stats = loop.sched.stats()
    assert stats.snapshot_publications == 0
    assert stats.finished[FinishReason.ERROR] == 1
    assert not _transfers(loop, CAPTURE)
    assert_quiescent(loop)


def test_a_failed_capture_publishes_nothing_and_frees_its_row():
    loop = make_loop()
    prompt = tuple(range(1, 10))
    loop.add(1, prompt, 3)
    loop.fail_plans = {3}  # prefill, decode, decode, then the capture
    loop.run()
    assert loop.plans[3].kind is StepKind.TRANSFER and loop.plans[3].route == CAPTURE
    assert loop.failed == []  # the request had finished; nothing else fails
    assert loop.sched.stats().snapshot_publications == 0
    assert loop.sched.cache.continuation.free_rows == 4
    follow = prompt + tuple(loop.outputs[1]) + (7,)
    loop.add(2, follow, 1)
    loop.run()
    assert loop.reused[2] == 8  # complete pages only
    assert_quiescent(loop)


def test_a_failed_restore_fails_only_the_restoring_request():
    loop = make_loop()
    prompt = tuple(range(1, 10))
    loop.add(1, prompt, 3)
    loop.run()
    follow = prompt + tuple(loop.outputs[1]) + (7, 8)
    loop.fail_plans = {len(loop.plans)}  # the restore
    loop.add(2, follow, 2)
    loop.add(3, (300, 301, 302, 303), 2)
    loop.run()
    assert loop.failed == [2]
    assert loop.outputs[3] == reference((300, 301, 302, 303), 2)
    stats = loop.sched.stats()
    assert stats.snapshot_publications == 2  # request 1, then request 3 (not request 2)
    assert_quiescent(loop)


def test_cancel_during_a_restore_keeps_the_row_until_its_fence():
    loop = make_loop()
    sched = loop.sched
    prompt = tuple(range(1, 10))
    loop.add(1, prompt, 3)
    loop.run()
    follow = prompt + tuple(loop.outputs[1]) + (7, 8)
    loop.add(2, follow, 2)
    restore = sched.schedule()
    assert restore.kind is StepKind.TRANSFER and restore.route == RESTORE
    key = next(iter(sched.cache.continuation.resident_keys()))
    assert sched.cache.continuation.readers(key) == 1
    sched.cancel(2)
    # The restore's fence has not come: its row stays pinned, the request's pages held.
    assert sched.cache.continuation.readers(key) == 1
    assert sched.stats().pages_used > 0
    sched.complete(restore, loop.model.execute(restore))
    assert sched.cache.continuation.readers(key) == 0
    loop.run()  # the prefill built with the restore completes, then everything drains
    assert loop.outputs[2] == []
    assert_quiescent(loop)


def test_snapshot_eviction_is_lru_over_unreferenced_snapshots():
    loop = make_loop(snapshot_rows=2)
    prompts = {i: (10 * i + 1, 10 * i + 2, 10 * i + 3, 10 * i + 4, 10 * i + 5) for i in (1, 2, 3)}
    for i in (1, 2):
        loop.add(i, prompts[i], 2)  # committed 6 tokens: tail 2
        loop.run()
    cont = loop.sched.cache.continuation
    first, second = cont.lru_order()
    # Touch request 1's snapshot: a follow-up restores it.
    loop.add(4, prompts[1] + tuple(loop.outputs[1]) + (99,), 1)
    loop.run()
    assert loop.reused[4] == 6
    # Request 4's own end (8 committed tokens) is a page boundary: no new row. Publishing
    # request 3 evicts the least recently used snapshot: request 2's.
    loop.add(3, prompts[3], 2)
    loop.run()
    stats = loop.sched.stats()
    assert stats.snapshot_evictions == 1
    assert second not in cont.resident_keys() and first in cont.resident_keys()
    loop.add(5, prompts[2] + tuple(loop.outputs[2]) + (99,), 1)
    loop.run()
    assert loop.reused[5] == 4  # request 2's tail is gone: its complete page only




def test_a_fork_restores_its_parents_snapshot_instead_of_recomputing_the_tail():
    """n > 1: choice 1 forks from choice 0. Choice 0 publishes all but the prompt's last
    token (its partial page to a continuation row); choice 1 waits for that capture's
    fence, restores it into its own page and prefills exactly one token."""
    loop = make_loop()
    prompt = tuple(range(1, 11))  # 10 tokens: 2 pages + a 2-token tail; endpoint 9
    loop.add(1, prompt, 3)
    loop.add(2, prompt, 3, fork_of=1)
    loop.run()
    assert loop.reused[2] == 9
    assert loop.prefilled_tokens(1) == 10 and loop.prefilled_tokens(2) == 1
    assert loop.outputs[1] == loop.outputs[2] == reference(prompt, 3)
    restores = _transfers(loop, RESTORE)
    assert len(restores) == 1 and loop.sched.stats().snapshot_hits == 1
    capture = _transfers(loop, CAPTURE)[0]
    assert loop.plans.index(capture) < loop.plans.index(restores[0])
    assert_quiescent(loop)


def test_a_fork_without_snapshots_recomputes_the_partial_page():
    loop = make_loop(snapshot_rows=0)
    prompt = tuple(range(1, 11))
    loop.add(1, prompt, 3)
    loop.add(2, prompt, 3, fork_of=1)
    loop.run()
    assert loop.reused[2] == 8 and loop.prefilled_tokens(2) == 2
    assert loop.outputs[2] == reference(prompt, 3)
    assert_quiescent(loop)


def test_a_fork_whose_capture_fails_recomputes_the_partial_page():
    loop = make_loop()
    loop.fail_routes.add(CAPTURE)
    prompt = tuple(range(1, 11))
    loop.add(1, prompt, 3)
    loop.add(2, prompt, 3, fork_of=1)
    loop.run()
    assert loop.reused[2] == 8 and loop.prefilled_tokens(2) == 2
    assert loop.outputs[2] == reference(prompt, 3) and loop.failed == []
    assert_quiescent(loop)
