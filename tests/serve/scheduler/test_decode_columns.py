"""A plain DECODE plan's RowColumns are exactly its rows' values, and packing from them
writes exactly what packing from the rows writes.

Scheduler._build_plain keeps a decode cohort's slot, generation and sampling columns
across steps (engine.plan.RowColumns); a seeded random workload (admissions, finishes,
cancellations, preemptions for pages, page-boundary growth, mixed steps, two frames with
decode planned ahead) drives one scheduler over two paced models of one core: one packs
every plan as issued (columns), the other the same plan without them (rows), and every
staging buffer, dirty range and completion record must agree after every step.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helios_ignition.recipe import Capacities
from helios_ignition.testing import tiny_core
from helios_serve.engine.plan import RowColumns, SamplingParams, StepKind, StepPlan
from helios_serve.runtime.packing import (
    COLUMN_ROW_VALUES,
    COLUMN_TOKEN_VALUES,
    ONE_TOKEN_VALUES,
    ROW_VALUES,
    _Step,
)
from helios_serve.scheduler import FinishReason, SchedRequest, Scheduler, lifecycle
from helios_serve.scheduler.request import CompletionError, RowResult
from helios_serve.scheduler.scheduler import COLUMN_ROWS
from helios_serve.testing.paced import paced_model

# 32 decode rows over 4-token pages: decode cohorts of 16+ rows (columns). TIGHT pages make
# growth past a page wait, then preempt; ROOMY ones keep cohorts for many steps.
CAPS = Capacities(decode_batch=(1, 4, 16, 32), prefill_tokens=(16, 64), prefill_rows=8,
                  context_tokens=64, page_tokens=4, prepared_pages=100)
TIGHT, ROOMY = 64, 100
MIXED = dataclasses.replace(CAPS, mixed_tokens=(24,))
SAMPLINGS = (SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9, seed=5),
             SamplingParams(temperature=1.1, top_k=7, seed=9, logprobs=2),
             SamplingParams(temperature=0.5, seed=3, logprobs=0))


def _expected_columns(plan: StepPlan) -> dict:
    rows = plan.rows
    return {
        "slots": [r.slot for r in rows],
        "generations": [r.generation for r in rows],
        "positions": [r.start_position for r in rows],
        "logprobs": [-1 if r.sampling.logprobs is None else r.sampling.logprobs
                     for r in rows],
    }


def _staging(model) -> dict[str, np.ndarray]:
    return {name: np.array(a) for name, a in model.backend.staging(0).items()} | {
        f"f1/{name}": np.array(a) for name, a in model.backend.staging(1).items()}


@pytest.mark.parametrize("caps", [CAPS, MIXED], ids=["decode", "mixed"])
@pytest.mark.parametrize("pages", [TIGHT, ROOMY], ids=["tight", "roomy"])
@pytest.mark.parametrize("seed", [0, 1])
def test_columns_pack_what_the_rows_pack_over_a_random_workload(caps, pages, seed):
    caps = dataclasses.replace(caps, prepared_pages=pages)
    core = tiny_core(caps=caps)
    tokens = range(3, 90)
    columns = paced_model(core, lambda graph: 0.0, tokens)
    rows = paced_model(core, lambda graph: 0.0, tokens)
    sched = Scheduler(columns.manifests, frames=columns.frames,
                      device_pending=columns.device_pending)
    rng = np.random.default_rng(seed)
    next_id = 0
    inflight: list = []
    seen = {"columns": 0, "kept": 0, "rows only": 0, "page growth": 0}
    previous_cohort = None
    previous_had_columns = False
    for i in range(800):
        # Arrivals in bursts (the first 50 of each 200 iterations): between them the
        # decode cohort stays the same for many steps (kept columns) until requests end.
        if i % 200 < 50 and rng.random() < 0.6:
            prompt = tuple(int(t) for t in rng.integers(3, 90, int(rng.integers(1, 9))))
            sched.add(SchedRequest(request_id=next_id, prompt_tokens=prompt,
                                   max_output_tokens=int(rng.integers(1, 40)),
                                   sampling=SAMPLINGS[int(rng.integers(len(SAMPLINGS)))]))
            next_id += 1
        if rng.random() < 0.03 and sched.live.running:
            victim = sched.live.running[int(rng.integers(len(sched.live.running)))]
            sched.cancel(victim.request_id)
        ahead = inflight and rng.random() < 0.5
        if (not inflight or ahead) and sched.can_schedule_ahead():
            plan = sched.schedule()
            if plan is not None:
                if plan.columns is not None:
                    seen["columns"] += 1
                    assert plan.kind is StepKind.DECODE
                    got = plan.columns
                    assert isinstance(got, RowColumns) and got.describes(plan)
                    assert {k: getattr(got, k).tolist() for k in _expected_columns(plan)} \
                        == _expected_columns(plan)
                    assert got.holders == tuple(r.sampling for r in plan.rows)
                    assert all(h is r.sampling for h, r in zip(got.holders, plan.rows, strict=True))
                    assert all(len(r.tokens) == 1 and r.sample and r.grammar_mask is None
                               and r.histogram_tokens is None for r in plan.rows)
                    step = _Step(plan, len(plan.rows), len(plan.rows))
                    assert step.columns is got
                    for source, values in COLUMN_ROW_VALUES.items():
                        assert values(got).tolist() == [int(v) for v in ROW_VALUES[source](
                            plan.rows)], source
                    for source, values in COLUMN_TOKEN_VALUES.items():
                        assert values(got).tolist() == [int(v) for v in ONE_TOKEN_VALUES[
                            source](plan.rows)], source
                    if previous_cohort is got.slots:
                        seen["kept"] += 1
                    # Kept only while no other kind of plan was issued between.
                    assert previous_cohort is not got.slots or previous_had_columns
                    previous_cohort = got.slots
                    seen["page growth"] += sum(
                        r.start_position % caps.page_tokens == 0 for r in plan.rows)
                else:
                    seen["rows only"] += 1
                previous_had_columns = plan.columns is not None
                stripped = dataclasses.replace(plan, columns=None)
                assert stripped == plan  # columns are not compared
                inflight.append((plan, columns.submit(plan), rows.submit(stripped)))
                for name, value in _staging(rows).items():
                    assert np.array_equal(_staging(columns)[name], value), name
                continue
        if not inflight:
            continue
        plan, ticket_a, ticket_b = inflight.pop(0)
        sampled = columns.wait(ticket_a)
        assert np.array_equal(np.asarray(sampled), np.asarray(rows.wait(ticket_b)))
        for r in sched.complete(plan, sampled):
            if r.token_id is not None and r.output_tokens >= \
                    sched.live.requests[r.request_id].request.max_output_tokens:
                sched.finish(r.request_id, FinishReason.LENGTH, publish=True)
    stats = sched.stats()
    assert seen["columns"] > 0 and seen["rows only"] > 100 and stats.admitted > 100
    assert (stats.mixed_steps > 0) == bool(caps.mixed_tokens)
    if pages == TIGHT:
        assert stats.preemptions > 0
    else:
        assert seen["kept"] > 3 and seen["page growth"] > 20


def _decode_of(sched: Scheduler, model, rows: int) -> StepPlan:
    """Run (frames=1) until the scheduler plans a DECODE of `rows` rows; return it."""
    while (plan := sched.schedule()).kind is not StepKind.DECODE or len(plan.rows) != rows:
        sched.complete(plan, model.wait(model.submit(plan)))
    return plan


def test_columns_apply_only_to_the_rows_they_were_built_from():
    """A plan rebuilt with other rows (the worker attaching grammar masks) keeps the
    object; packing then reads the rows."""
    core = tiny_core(caps=CAPS)
    model = paced_model(core, lambda graph: 0.0, range(3, 90))
    sched = Scheduler(model.manifests, frames=1, device_pending=model.device_pending)
    for i in range(COLUMN_ROWS):
        sched.add(SchedRequest(request_id=i, prompt_tokens=(5, 6, 7), max_output_tokens=8,
                               sampling=SAMPLINGS[1]))
    plan = _decode_of(sched, model, COLUMN_ROWS)
    assert plan.columns is not None
    masked = dataclasses.replace(plan, rows=tuple(
        dataclasses.replace(r, grammar_mask=np.zeros(1, np.int32)) for r in plan.rows))
    assert masked.columns is plan.columns and not masked.columns.describes(masked)
    assert _Step(masked, COLUMN_ROWS, COLUMN_ROWS).columns is None
    assert _Step(plan, COLUMN_ROWS, COLUMN_ROWS).columns is plan.columns


def test_plans_of_fewer_rows_carry_no_columns():
    model = paced_model(tiny_core(caps=CAPS), lambda graph: 0.0, range(3, 90))
    sched = Scheduler(model.manifests, frames=1, device_pending=model.device_pending)
    for i in range(COLUMN_ROWS - 1):
        sched.add(SchedRequest(request_id=i, prompt_tokens=(5, 6, 7), max_output_tokens=8))
    assert _decode_of(sched, model, COLUMN_ROWS - 1).columns is None


@pytest.mark.parametrize("array_rows", [1, 16])
def test_an_integer_record_is_checked_against_the_vocabulary_in_one_pass(monkeypatch,
                                                                          array_rows):
    """complete() tests an int array's ids at once, and row by row only when one is
    outside the vocabulary: the same first error, rows that sample nothing ignored."""
    monkeypatch.setattr(lifecycle, "ARRAY_CHECK_ROWS", array_rows)
    caps = dataclasses.replace(CAPS, prefill_tokens=(8,))
    model = paced_model(tiny_core(caps=caps), lambda graph: 0.0, range(3, 90))
    sched = Scheduler(model.manifests, frames=1, device_pending=model.device_pending)
    vocab = model.manifests.vocab_size
    sched.add(SchedRequest(request_id=0, prompt_tokens=(5,) * 12, max_output_tokens=4))
    sched.add(SchedRequest(request_id=1, prompt_tokens=(6, 7), max_output_tokens=4))
    plan = sched.schedule()
    assert [r.sample for r in plan.rows] == [False]  # a non-final chunk of the long prompt
    assert sched.complete(plan, np.array([-7], np.int32)) == [RowResult(0, None, 0)]
    plan = sched.schedule()
    assert [r.sample for r in plan.rows] == [True, True]
    for bad, row in (([5, vocab], 1), ([-1, 5], 0), ([vocab + 3, -2], 0)):
        with pytest.raises(CompletionError, match=f"row {row}: sampled id {bad[row]} outside"):
            sched.complete(plan, np.array(bad, np.int64))
    assert sched.complete(plan, np.array([vocab - 1, 0], np.int32)) == [
        RowResult(0, vocab - 1, 1), RowResult(1, 0, 1)]
