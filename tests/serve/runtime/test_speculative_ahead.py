"""Decode planned ahead on a speculative core (scheduler._build_decode's ahead rule), end
to end on the tiny drafter core's real programs (CPU backend, two execution frames, the
worker's loop): whatever the width policy picks -- plain decode, speculation, or a mix --
greedy and seeded sampled requests emit exactly the tokens of a serial plain-decode run,
also when a stop ends a request inside a step planned ahead of its token (the ahead row's
result is discarded, its slot and pages released when its frame completes), and no row is
planned ahead while a request that needs feedback is live."""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import pytest
from helios_ignition.testing import tiny_core
from helios_serve.engine.plan import PENDING_PLACEHOLDER, SamplingParams, StepKind
from helios_serve.scheduler import FinishReason, SchedRequest, Scheduler
from helios_serve.speculation import WidthPolicy
from helios_serve.speculation.policy import Choice
from helios_serve.testing.native import load_native

PROMPTS = [list(range(3, 9)), [5, 7, 9], [20, 21, 22, 23], [1, 2], [9, 8, 7, 6, 5]]
LIMIT = 20


class ScriptedPolicy(WidthPolicy):
    """The width policy's decisions from a script of widths (0 = plain decode), one per
    committed decision (a choice the scheduler leaves uncommitted is decided again)."""

    def __init__(self, geometry, script) -> None:
        super().__init__(geometry.speculative_widths, geometry.decode_capacities)
        self.script = script
        self.committed = 0

    def decide(self, lanes, copied=None):
        return Choice(self.script[self.committed % len(self.script)], 0, "scripted")

    def commit(self, choice):
        self.committed += 1
        return super().commit(choice)


@pytest.fixture(scope="module")
def model():
    model = load_native(tiny_core(1, speculative_widths=(1, 2, 3, 4), draft_copy=3.0,
                                  draft_vocab=96), "cpu", cpu_frames=2)
    assert model.frames == 2 and model.device_pending
    yield model
    model.close()


def _requests(sampled: bool, feedback: int | None = None):
    return [SchedRequest(request_id=i, prompt_tokens=tuple(p), max_output_tokens=LIMIT,
                         sampling=(SamplingParams(seed=40 + i, temperature=0.8, top_p=0.95)
                                   if sampled else SamplingParams()),
                         needs_feedback=i == feedback)
            for i, p in enumerate(PROMPTS)]


def _run(model, requests, script=None, stops=None, frames=2):
    """The worker's loop (worker.ModelWorker._step) over `model`: the next plan submitted
    before waiting while `can_schedule_ahead()`; a request ends at its stop token
    (`stops`: request id -> token, the output cut after it) or at LIMIT. `script`: the
    width policy's widths; None = speculation off (plain decode).

    Returns (outputs, counters): rows planned ahead, ahead rows discarded after a stop,
    the most plans in flight and the rows planned ahead while a feedback request was
    live, plan kinds, kinds of the steps a stop ended a request in."""
    geometry = model.manifests
    if script is None:
        geometry = replace(geometry, speculative_widths=(), prefix_programs=(),
                           copied_proposals=False)
    s = Scheduler(geometry, frames=frames, device_pending=model.device_pending,
                  width_policy=ScriptedPolicy(geometry, script) if script else False)
    for r in requests:
        assert s.add(r) is None
    feedback = {r.request_id for r in requests if r.needs_feedback}
    out = {r.request_id: [] for r in requests}
    done: set[int] = set()
    count = {"ahead": 0, "discarded": 0, "feedback_inflight": 0, "feedback_ahead": 0,
             "kinds": set(), "stopped_in": set()}
    inflight = deque()
    while s.has_work() or inflight:
        submitted = False
        if s.can_schedule_ahead():
            plan = s.schedule()
            if plan is not None:
                count["ahead"] += sum(r.tokens == (PENDING_PLACEHOLDER,) for r in plan.rows)
                count["kinds"].add(plan.kind)
                inflight.append((plan, model.submit(plan)))
                if feedback - done:
                    count["feedback_inflight"] = max(count["feedback_inflight"],
                                                     len(inflight))
                    count["feedback_ahead"] += sum(r.tokens == (PENDING_PLACEHOLDER,)
                                                   for r in plan.rows)
                submitted = True
        if not inflight or (submitted and s.can_schedule_ahead()):
            continue
        plan, ticket = inflight.popleft()
        completion = model.wait_step(ticket)
        for result in s.complete(plan, completion.sampled, confidence=completion.confidence):
            rid = result.request_id
            if result.token_id is None or rid in done:
                continue
            out[rid].append(result.token_id)
            if stops and result.token_id == stops.get(rid):
                s.finish(rid, FinishReason.STOP, output_tokens=result.output_tokens)
                done.add(rid)
                count["stopped_in"].add(plan.kind)
                count["discarded"] += sum(r.request_id == rid for p, _ in inflight
                                          for r in p.rows)
            elif result.output_tokens == LIMIT:
                s.finish(rid, FinishReason.LENGTH, publish=True)
                done.add(rid)
    stats = s.stats()
    assert (stats.running, stats.slots_free, stats.outstanding_frames) == (
        0, stats.slots_total, 0)
    assert stats.pages_used == 0, stats
    return out, count


SCRIPTS = {"decode": (0,), "speculation": (4,), "mixed": (0, 0, 0, 4, 2, 0, 3)}


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded_sampled"])
@pytest.mark.parametrize("script", list(SCRIPTS))
def test_outputs_equal_serial_decode_whatever_the_policy_picks(model, sampled, script):
    serial, _ = _run(model, _requests(sampled), frames=1)
    assert all(len(o) == LIMIT for o in serial.values())
    out, count = _run(model, _requests(sampled), SCRIPTS[script])
    assert out == serial
    if script == "speculation":
        assert count["ahead"] == 0
        assert StepKind.SPECULATIVE in count["kinds"]
    else:  # decode rows went ahead of their tokens on the speculative core
        assert count["ahead"] > 0
    if script == "mixed":
        assert {StepKind.DECODE, StepKind.SPECULATIVE} <= count["kinds"]


@pytest.mark.parametrize("script", ["decode", "mixed"])
def test_a_stop_inside_an_ahead_step_discards_the_ahead_row(model, script):
    serial, _ = _run(model, _requests(True), frames=1)
    # each request stops at its output's 5th token + i (a token it emits: the stop rule
    # cuts there in both runs)
    stops = {rid: tokens[4 + rid] for rid, tokens in serial.items()}
    want = {rid: tokens[:tokens.index(stops[rid]) + 1] for rid, tokens in serial.items()}
    reference, _ = _run(model, _requests(True), stops=stops, frames=1)
    assert reference == want
    out, count = _run(model, _requests(True), SCRIPTS[script], stops=stops)
    assert out == want
    if script == "decode":  # rows planned ahead of a stop token were dropped
        assert count["stopped_in"] == {StepKind.DECODE} and count["discarded"] == 4
    else:  # stops inside decode steps and inside speculative runs (the rest discarded)
        assert count["stopped_in"] == {StepKind.DECODE, StepKind.SPECULATIVE}


def test_no_row_is_planned_ahead_while_a_feedback_request_is_live(model):
    serial, _ = _run(model, _requests(False, feedback=1), frames=1)
    out, count = _run(model, _requests(False, feedback=1), SCRIPTS["decode"])
    assert out == serial
    assert count["feedback_inflight"] == 1  # one plan in flight while it was live
    assert count["feedback_ahead"] == 0
    assert count["ahead"] > 0  # once it ended, decode went ahead again
