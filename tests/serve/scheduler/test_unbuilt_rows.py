"""The steady decode step without RowPlans or RowResults is the per-row step, exactly.

A plain DECODE plan of COLUMN_ROWS or more rows carries every row value as RowColumns and
leaves its RowPlans unbuilt (StepPlan.rows builds them when read); packing, NativeModel
.submit and Lifecycle.complete read the columns and complete returns RowResults. A seeded
random workload (bursts of admissions, cancellations, finishes at the output limit and at
stops, preemptions under tight pages, page growth, mixed steps on a mixed core, two frames
with decode planned ahead) drives two schedulers in lockstep, each over its own paced
model of one core: one with the columns, one planning every row as a RowPlan
(`column_rows` above every decode capacity). After every call they must agree: the plans
(rows built only after the step completed, to check nothing needed them), every staging
buffer and the dirty ranges a device uploads (the reference packs page tables row by
row), the sampled records, the results, every request's state and the statistics.

The per-row reference also tests readiness, issues rows and completes them request by
request, where the columns' scheduler does each over the running cohort's state rows
(scheduler/sequence.py, SlotState) at once (per row only the page-boundary rows in
schedule, the retiring and publishing rows in complete); a richer workload adds
prompt-turn endpoints (the state row's endpoint watch) and requests that need feedback
(no decode ahead while one is live). Every request's state row must hold what its
Sequence says (tokens known, the last token, retiring, the watch) and be its slot's row
exactly while it runs. It fails when readiness admits one more token ahead, a completed
position or the step index is off by one, or a page to publish is not visited (tried).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helios_ignition.recipe import Capacities
from helios_ignition.testing import tiny_core
from helios_serve.engine.plan import SamplingParams, StepKind, StepPlan
from helios_serve.scheduler import (
    CompletionError,
    FinishReason,
    RowResult,
    RowResults,
    SchedRequest,
    Scheduler,
)
from helios_serve.scheduler.scheduler import COLUMN_ROWS
from helios_serve.scheduler.sequence import (
    BUDGET,
    FEEDBACK,
    FIELDS,
    KNOWN,
    LAST_TOKEN,
    MARKS,
    PROMPT,
    RETIRING,
    WATCH,
    Sequence,
)
from helios_serve.testing.paced import paced_model

CAPS = Capacities(decode_batch=(1, 4, 16, 32), prefill_tokens=(16, 64), prefill_rows=8,
                  context_tokens=64, page_tokens=4, prepared_pages=100)
TIGHT, ROOMY = 64, 100
MIXED = dataclasses.replace(CAPS, mixed_tokens=(24,))
SAMPLINGS = (SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9, seed=5),
             SamplingParams(temperature=1.1, top_k=7, seed=9, logprobs=2),
             SamplingParams(temperature=0.5, seed=3, logprobs=0))
# Sequence fields that are caches or shared objects, not request state.
_NOT_STATE = {"_page_prefix", "request", "history", "_t"}
# Sequence's properties over its state row.
_ROW_PROPERTIES = ("num_scheduled", "num_computed", "inflight_rows", "inflight_samples",
                   "num_published", "prefill_tokens", "last_row_decode", "last_step",
                   "needs_histogram", "endpoints_done", "fork_endpoint", "cancelled",
                   "failed", "finish_reason", "retiring")


def _unbuilt(plan: StepPlan) -> bool:
    return "rows" not in plan.__dict__


def _request(seq: Sequence) -> dict:
    """A request's state by value: its attributes, its properties and its state row."""
    state = {k: v for k, v in vars(seq).items() if k not in _NOT_STATE}
    state.update({k: getattr(seq, k) for k in _ROW_PROPERTIES})
    state["row"] = tuple(seq._t[seq._b:seq._b + FIELDS])
    return state


def _rows_hold(sched: Scheduler) -> None:
    """Every live request's state row says what its Sequence says, and is its slot's row
    exactly while it holds one; every slot holder is running; a free slot's row is
    zero."""
    table = sched.alloc.state.values
    held = {s.slot for s in sched.live.running}
    assert held == {s.slot for s in sched.live.requests.values() if s.slot is not None}
    for slot, row in enumerate(sched.alloc.state.grid.tolist()):
        assert slot in held or not any(row), slot  # a free slot's row is zero
    for seq in sched.live.requests.values():
        if seq.slot is None:
            assert seq._t is not table and seq._b == 0
        else:
            assert seq._t is table and seq._b == seq.slot * FIELDS
        row = seq._t[seq._b:seq._b + FIELDS]
        request = seq.request
        assert (row[KNOWN], row[LAST_TOKEN]) == (len(seq.tokens), seq.tokens[-1])
        assert (row[PROMPT], row[BUDGET], row[MARKS], row[FEEDBACK]) == (
            len(request.prompt_tokens), len(request.prompt_tokens) + request.max_output_tokens,
            len(request.publish_endpoints), request.needs_feedback)
        assert row[RETIRING] == (seq.cancelled or seq.failed or seq.finish_reason is not None)
        assert row[WATCH] == (seq.retiring or seq.endpoints_done < row[MARKS]
                              or bool(seq.fork_endpoint))


def _state(sched: Scheduler) -> dict:
    live = sched.live
    _rows_hold(sched)
    return {
        "requests": {i: _request(s) for i, s in live.requests.items()},
        "running": [s.request_id for s in live.running],
        "waiting": [s.request_id for s in live.waiting],
        "stats": sched.stats(),
    }


def _staging(model) -> dict[str, np.ndarray]:
    return {f"{frame}/{name}": np.array(a) for frame in range(model.frames)
            for name, a in model.backend.staging(frame).items()}


def _pair(caps):
    core = tiny_core(caps=caps)
    models, scheds = [], []
    for column_rows in (None, 10**9):
        model = paced_model(core, lambda graph: 0.0, range(3, 90))
        model.dirty = []  # the dirty ranges of each launch (what a device uploads)
        launch = model.backend.launch

        def recorded(graph, frame, dirty=(), model=model, launch=launch):
            model.dirty.append(list(dirty))
            return launch(graph, frame, dirty)

        model.backend.launch = recorded
        models.append(model)
        scheds.append(Scheduler(model.manifests, frames=model.frames,
                                device_pending=model.device_pending, column_rows=column_rows))
    return models, scheds


@pytest.mark.parametrize("caps", [CAPS, MIXED], ids=["decode", "mixed"])
@pytest.mark.parametrize("pages", [TIGHT, ROOMY], ids=["tight", "roomy"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unbuilt_rows_plan_pack_and_complete_as_the_rows_do(caps, pages, seed):
    _lockstep(caps, pages, seed, rich=False)


@pytest.mark.parametrize("caps", [CAPS, MIXED], ids=["decode", "mixed"])
@pytest.mark.parametrize("pages", [TIGHT, ROOMY], ids=["tight", "roomy"])
@pytest.mark.parametrize("seed", [3, 4])
def test_state_rows_advance_as_the_per_request_path_with_endpoints_and_feedback(
        caps, pages, seed):
    """Requests marking prompt-turn ends (the state row's endpoint watch) and requests
    that need feedback (no decode planned ahead while one is live) among the rest."""
    _lockstep(caps, pages, seed, rich=True)


def _lockstep(caps, pages: int, seed: int, rich: bool) -> None:
    (fast_model, rows_model), (fast, rows) = _pair(dataclasses.replace(caps,
                                                                       prepared_pages=pages))
    rng = np.random.default_rng(seed)
    next_id = 0
    inflight: list = []
    seen = {"unbuilt": 0, "results": 0, "stops": 0, "skipped rows": 0, "endpoints": 0,
            "feedback": 0}
    for i in range(900):
        if i % 180 < 50 and rng.random() < 0.8:
            prompt = tuple(int(t) for t in rng.integers(3, 90, int(rng.integers(1, 9))))
            limit = int(rng.integers(1, 40))
            extra = {}
            if rich and rng.random() < 0.3:  # prompt-turn ends inside the prompt
                extra["publish_endpoints"] = tuple(sorted({int(p) for p in rng.integers(
                    1, len(prompt) + 1, int(rng.integers(1, 3)))}))
            if rich and rng.random() < 0.1:
                extra["needs_feedback"] = True
            for sched in (fast, rows):
                sched.add(SchedRequest(request_id=next_id, prompt_tokens=prompt,
                                       max_output_tokens=limit,
                                       sampling=SAMPLINGS[next_id % len(SAMPLINGS)], **extra))
            next_id += 1
        if rng.random() < 0.03 and fast.live.running:
            victim = fast.live.running[int(rng.integers(len(fast.live.running)))].request_id
            assert fast.cancel(victim) == rows.cancel(victim)
        ahead = inflight and rng.random() < 0.5
        if (not inflight or ahead) and fast.can_schedule_ahead():
            assert rows.can_schedule_ahead()
            plan, reference = fast.schedule(), rows.schedule()
            assert (plan is None) == (reference is None)
            if plan is not None:
                unbuilt = _unbuilt(plan)
                seen["unbuilt"] += unbuilt
                assert unbuilt == (plan.kind is StepKind.DECODE
                                   and len(reference.rows) >= COLUMN_ROWS)
                if not unbuilt:
                    assert plan == reference
                tickets = (fast_model.submit(plan), rows_model.submit(reference))
                assert _unbuilt(plan) == unbuilt  # packing read the columns alone
                fast_staging, rows_staging = _staging(fast_model), _staging(rows_model)
                for name, value in rows_staging.items():
                    assert np.array_equal(fast_staging[name], value), name
                assert fast_model.dirty[-1] == rows_model.dirty[-1]
                inflight.append((plan, reference, tickets))
                assert _state(fast) == _state(rows)
                continue
        if not inflight:
            continue
        plan, reference, (ticket, reference_ticket) = inflight.pop(0)
        sampled = fast_model.wait(ticket)
        assert np.array_equal(sampled, rows_model.wait(reference_ticket))
        unbuilt = _unbuilt(plan)
        results = fast.complete(plan, sampled)
        expected = rows.complete(reference, sampled)
        assert _unbuilt(plan) == unbuilt  # completion read the columns alone
        assert isinstance(results, RowResults) == unbuilt
        assert plan == reference  # builds the rows: the per-row path's, field by field
        assert list(results) == expected and len(results) == len(expected)
        if unbuilt:
            seqs = plan.columns.sequences
            seen["endpoints"] += sum(s.request.publish_endpoints != () for s in seqs)
            seen["feedback"] += sum(s.request.needs_feedback for s in seqs)
            seen["results"] += 1
            seen["skipped rows"] += len(plan.rows) - len(results)
            assert list(results.columns()) == [
                (r.request_id, r.token_id, r.output_tokens) for r in expected]
        for r in expected:
            seq = rows.live.requests[r.request_id]
            stop = rng.random() < 0.01
            if r.output_tokens >= seq.request.max_output_tokens or stop:
                reason = FinishReason.STOP if stop else FinishReason.LENGTH
                seen["stops"] += stop
                assert fast.finish(r.request_id, reason, publish=not stop) == rows.finish(
                    r.request_id, reason, publish=not stop)
        assert _state(fast) == _state(rows)
    stats = fast.stats()
    if rich:
        assert seen["endpoints"] > 0 and seen["feedback"] > 0, seen
    assert seen["unbuilt"] == seen["results"] > 0 and seen["stops"] > 5
    assert stats.admitted > 100
    assert (stats.mixed_steps > 0) == bool(caps.mixed_tokens)
    if pages == TIGHT:
        assert stats.preemptions > 0
    elif not caps.mixed_tokens and not rich:  # long cohorts: steps of requests finished ahead
        # (a live request that needs feedback stops decode ahead: `rich` has them)
        assert seen["unbuilt"] > 50 and seen["skipped rows"] > 0


def _steady(sched: Scheduler, model, rows: int) -> StepPlan:
    """Run (frames=1) until the scheduler plans a DECODE of `rows` rows; return it."""
    while (plan := sched.schedule()).kind is not StepKind.DECODE or plan.row_count != rows:
        sched.complete(plan, model.wait(model.submit(plan)))
    return plan


def test_an_unbuilt_plan_builds_its_rows_once_when_read():
    model = paced_model(tiny_core(caps=CAPS), lambda graph: 0.0, range(3, 90))
    sched = Scheduler(model.manifests, frames=1, device_pending=model.device_pending)
    for i in range(COLUMN_ROWS):
        sched.add(SchedRequest(request_id=i, prompt_tokens=(5, 6, 7), max_output_tokens=8))
    plan = _steady(sched, model, COLUMN_ROWS)
    assert _unbuilt(plan) and plan.columns.describes(plan)
    rows = plan.rows
    assert plan.rows is rows and plan.columns.rows is rows and plan.columns.describes(plan)
    assert [r.request_id for r in rows] == list(range(COLUMN_ROWS))
    running = sched.live.running
    assert [r.start_position for r in rows] == [s.num_scheduled - 1 for s in running]
    assert [r.tokens for r in rows] == [(s.tokens[s.num_scheduled - 1],) for s in running]
    assert [r.page_ids for r in rows] == [tuple(s.page_ids) for s in running]
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        plan.nothing  # noqa: B018
    with pytest.raises(ValueError, match="a plan without rows needs columns"):
        StepPlan(StepKind.DECODE, None)


def test_an_unbuilt_plan_rejects_a_bad_record_before_any_change():
    """Lifecycle.complete over the columns: the per-row path's errors, the same first row,
    and nothing changed (the plan then completes)."""
    model = paced_model(tiny_core(caps=CAPS), lambda graph: 0.0, range(3, 90))
    sched = Scheduler(model.manifests, frames=1, device_pending=model.device_pending)
    for i in range(COLUMN_ROWS):
        sched.add(SchedRequest(request_id=i, prompt_tokens=(5, 6, 7), max_output_tokens=8))
    plan = _steady(sched, model, COLUMN_ROWS)
    sampled = model.wait(model.submit(plan))
    vocab = model.manifests.vocab_size
    before = {i: _request(s) for i, s in sched.live.requests.items()}
    bad = sampled.copy()
    bad[3], bad[9] = vocab, -1
    for record, message in (
            (bad, f"row 3: sampled id {vocab} outside"),
            (sampled[:-1], f"{COLUMN_ROWS - 1} sampled ids for {COLUMN_ROWS} rows"),
            ([int(t) for t in bad], f"row 3: sampled id {vocab} outside")):
        with pytest.raises(CompletionError, match=message):
            sched.complete(plan, record)
        assert {i: _request(s) for i, s in sched.live.requests.items()} == before
    assert _unbuilt(plan)  # the failed checks built no row
    results = sched.complete(plan, sampled)
    assert isinstance(results, RowResults)
    running = sched.live.running
    assert [s.tokens[-1] for s in running] == sampled.tolist()
    expected = [RowResult(s.request_id, int(t), s.num_output_tokens)
                for s, t in zip(running, sampled, strict=True)]
    assert results == expected and expected == results and len(results) == COLUMN_ROWS
    assert results[2] == expected[2] and list(results.columns())[2] == (
        expected[2].request_id, expected[2].token_id, expected[2].output_tokens)


def test_a_stale_generation_fails_an_unbuilt_plan_at_its_row():
    model = paced_model(tiny_core(caps=CAPS), lambda graph: 0.0, range(3, 90))
    sched = Scheduler(model.manifests, frames=1, device_pending=model.device_pending)
    for i in range(COLUMN_ROWS):
        sched.add(SchedRequest(request_id=i, prompt_tokens=(5, 6, 7), max_output_tokens=8))
    plan = _steady(sched, model, COLUMN_ROWS)
    sampled = model.wait(model.submit(plan))
    slot = int(plan.columns.slots[5])
    sched.alloc.generations[slot] += 1
    with pytest.raises(CompletionError, match=f"row 5: stale generation of slot {slot}"):
        sched.complete(plan, sampled)


def test_a_slot_holder_change_since_the_plan_makes_completion_test_each_row():
    """With no allocation or release since the plan was built its requests are live in
    its slots (RowColumns.holders_at); after one, every row is tested again (here a
    request moved off its slot behind the scheduler's back: its row fails)."""
    model = paced_model(tiny_core(caps=CAPS), lambda graph: 0.0, range(3, 90))
    sched = Scheduler(model.manifests, frames=1, device_pending=model.device_pending)
    for i in range(COLUMN_ROWS):
        sched.add(SchedRequest(request_id=i, prompt_tokens=(5, 6, 7), max_output_tokens=8))
    plan = _steady(sched, model, COLUMN_ROWS)
    assert plan.columns.holders_at == sched.alloc.changes == COLUMN_ROWS
    sampled = model.wait(model.submit(plan))
    seq = plan.columns.sequences[6]
    seq.slot, sched.alloc.changes = COLUMN_ROWS + 1, sched.alloc.changes + 1
    with pytest.raises(CompletionError, match="row 6: request 6 not in flight"):
        sched.complete(plan, sampled)
    seq.slot = int(plan.columns.slots[6])
    assert len(sched.complete(plan, sampled)) == COLUMN_ROWS


def test_an_unbuilt_plan_completes_a_list_record_as_an_array_one():
    """A record of Python ints (a caller without NumPy) advances the state rows exactly as
    the device's integer array does."""
    models, scheds = [], []
    for _ in range(2):
        model = paced_model(tiny_core(caps=CAPS), lambda graph: 0.0, range(3, 90))
        sched = Scheduler(model.manifests, frames=1, device_pending=model.device_pending)
        for i in range(COLUMN_ROWS):
            sched.add(SchedRequest(request_id=i, prompt_tokens=(5, 6, 7), max_output_tokens=8))
        models.append(model)
        scheds.append(sched)
    plans = [_steady(s, m, COLUMN_ROWS) for s, m in zip(scheds, models, strict=True)]
    sampled = [m.wait(m.submit(p)) for m, p in zip(models, plans, strict=True)]
    assert np.array_equal(sampled[0], sampled[1])
    results = (scheds[0].complete(plans[0], sampled[0]),
               scheds[1].complete(plans[1], [int(t) for t in sampled[1]]))
    assert list(results[0].columns()) == list(results[1].columns())
    assert _state(scheds[0]) == _state(scheds[1])
