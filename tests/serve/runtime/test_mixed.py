"""MIXED programs on the CPU backend: decode lanes and prefill chunks in one packed step.

A mixed step computes what a DECODE step of its lanes and a PREFILL step of its chunks
compute (the same packed attention, norms and products over the same rows); running
streams keep a token every step while a long prompt is prefilled across steps.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from helios_contract import PreparedContract
from helios_contract.errors import BindingError, PendingTokenError
from helios_contract.schema import contract_pb2 as cpb
from helios_ignition.capture.buffers import PENDING
from helios_ignition.recipe import RecipeError, load_recipe_module, validate_recipe
from helios_ignition.testing import TINY_CAPACITIES, tiny_core
from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
from helios_serve.runtime import NativeModel, UnsupportedContract
from helios_serve.scheduler import FinishReason, SchedRequest, Scheduler
from helios_serve.testing.native import load_native
from helios_tools.lint import lint_capabilities, lint_contract

REPO = Path(__file__).resolve().parents[3]
GREEDY = SamplingParams(logprobs=5)
MIXED_CAPS = dataclasses.replace(TINY_CAPACITIES, mixed_tokens=(8, 16))


def row(rid, slot, tokens, start, pages, *, sample=True, hist=None, sampling=GREEDY):
    return RowPlan(request_id=rid, slot=slot, generation=1, tokens=tuple(tokens),
                   start_position=start, page_ids=tuple(pages), sample=sample,
                   sampling=sampling, histogram_tokens=None if hist is None else tuple(hist))


@pytest.fixture(scope="module")
def core():
    return tiny_core(seed=3, caps=MIXED_CAPS)


def test_export_captures_one_mixed_program_per_batch_and_token_capacity(core):
    mixed = [(g.name, g.batch_capacity, g.token_capacity) for g in core.contract.model.graphs
             if g.operation == cpb.OPERATION_MIXED]
    assert mixed == [("mixed_b2_t8", 2, 8), ("mixed_b2_t16", 2, 16), ("mixed_b4_t8", 4, 8),
                     ("mixed_b4_t16", 4, 16)]
    model = load_native(core)
    assert model.manifests.mixed_capacities == ((2, 8), (2, 16), (4, 8), (4, 16))


def _start(model, prompt):
    """Request 1 prefilled in slot 0 (pages 1, 2); its first sampled token."""
    done = model.wait_step(model.submit(StepPlan(StepKind.PREFILL, (
        row(1, 0, prompt, 0, [1, 2], hist=prompt),))))
    return int(done.sampled[0])


def test_mixed_step_equals_a_decode_step_and_a_prefill_step(core):
    prompt, other = [5, 17, 3, 88, 41], [9, 12, 60, 2, 33, 70, 11]
    apart, together = load_native(core), load_native(core)
    first = _start(apart, prompt)
    assert _start(together, prompt) == first
    lane = row(1, 0, [first], len(prompt), [1, 2])
    chunk = row(2, 1, other, 0, [3, 4], hist=other)
    decode = apart.wait_step(apart.submit(StepPlan(StepKind.DECODE, (lane,))))
    prefill = apart.wait_step(apart.submit(StepPlan(StepKind.PREFILL, (chunk,))))
    plan = StepPlan(StepKind.MIXED, (lane, chunk), lanes=1)
    assert together.select_graph(plan) == "mixed_b2_t8"
    mixed = together.wait_step(together.submit(plan))
    assert mixed.sampled.tolist() == [int(decode.sampled[0]), int(prefill.sampled[0])]
    for i, alone in ((0, decode), (1, prefill)):
        got, want = mixed.token_logprob(i, 5), alone.token_logprob(0, 5)
        assert got.token_id == want.token_id
        assert [t for t, _ in got.top] == [t for t, _ in want.top]
        # f32 products over 2 rows vs 1 (BLAS picks its kernel by row count): equal to
        # rounding, as a DECODE row's logits are across batch capacities.
        np.testing.assert_allclose(got.logprob, want.logprob, rtol=0, atol=1e-5)
        np.testing.assert_allclose([v for _, v in got.top], [v for _, v in want.top],
                                   rtol=0, atol=1e-5)
    # The same KV rows written and the same device pending tokens for the next decode.
    for name, buf in apart.backend.buffers.items():
        if name.endswith("_cache"):
            np.testing.assert_allclose(together.backend.buffers[name][1:5], buf[1:5],
                                       rtol=0, atol=1e-5)
    np.testing.assert_array_equal(together.backend.buffers[PENDING][:2],
                                  apart.backend.buffers[PENDING][:2])


def test_a_mixed_plan_outside_every_variant_is_rejected(core):
    model = load_native(core)
    rows = tuple(row(i, i, [1, 2, 3, 4, 5], 0, [i + 1]) for i in range(4))
    with pytest.raises(ValueError, match="^no captured mixed variant holds 4 rows of 20 "
                                         "tokens$"):
        model.select_graph(StepPlan(StepKind.MIXED, rows, lanes=0))


def _serve(core, requests, *, steps=400):
    """Scheduler + NativeModel, one step at a time: greedy outputs per request and the
    plans issued (kind, lanes, token budget, row request ids)."""
    model = load_native(core)
    sched = Scheduler(model.manifests, frames=1, device_pending=model.device_pending)
    outputs = {rid: [] for rid, _, _, _ in requests}
    plans, pending = [], sorted(requests, key=lambda r: r[3])
    for step in range(steps):
        while pending and pending[0][3] <= step:
            rid, prompt, limit, _ = pending.pop(0)
            assert sched.add(SchedRequest(rid, tuple(prompt), limit)) is None
        plan = sched.schedule()
        if plan is None:
            if not pending and not sched.has_work():
                return outputs, plans, sched
            continue
        plans.append((plan.kind, plan.lanes, plan.token_budget,
                      [r.request_id for r in plan.rows]))
        for r in sched.complete(plan, model.execute(plan)):
            if r.token_id is not None:
                outputs[r.request_id].append(r.token_id)
                if r.output_tokens == dict((q[0], q[2]) for q in requests)[r.request_id]:
                    sched.finish(r.request_id, FinishReason.LENGTH)
    raise AssertionError("did not drain")


REQUESTS = [(1, [5, 17, 3, 88, 41], 12, 0), (2, [9, 12, 60, 2], 12, 0),
            (3, list(range(20, 50)), 4, 3)]  # a 30-token prompt arrives at step 3
# One running stream, then two prompts at once (a burst), the second a step later.
BURST = [(1, [5, 17, 3, 88, 41], 12, 0), (2, list(range(20, 38)), 4, 2),
         (3, list(range(40, 58)), 4, 2)]


def test_running_streams_get_a_token_every_step_while_a_long_prompt_prefills(core):
    outputs, plans, sched = _serve(core, REQUESTS)
    plain, plain_plans, _ = _serve(tiny_core(seed=3), REQUESTS)
    assert outputs == plain  # greedy identity with alternating PREFILL and DECODE steps
    # Request 3's 30 prompt tokens go in mixed steps of the small budget (one prompt owing
    # tokens, two lanes): 2 lanes + 6 tokens, five times; requests 1 and 2 get a token in
    # each of those steps.
    mixed = [p for p in plans if p[0] is StepKind.MIXED]
    assert mixed == [(StepKind.MIXED, 2, 8, [1, 2, 3])] * 5
    assert sched.stats().mixed_steps == 5
    assert sched.stats().prompt_tokens_computed == 5 + 4 + 30
    # Without mixed programs, the prefill steps of request 3 are steps without lanes.
    assert [p[0] for p in plain_plans].count(StepKind.PREFILL) >= 3


def test_greedy_identity_with_both_budgets(core):
    """A burst takes the large budget, then the small one once the lanes outnumber the
    prompts owing tokens; the output equals the core's without mixed programs."""
    outputs, plans, _ = _serve(core, BURST)
    plain, _, _ = _serve(tiny_core(seed=3), BURST)
    assert outputs == plain
    mixed = [p for p in plans if p[0] is StepKind.MIXED]
    assert mixed == [(StepKind.MIXED, 1, 16, [1, 2]), (StepKind.MIXED, 1, 16, [1, 2, 3]),
                     (StepKind.MIXED, 2, 8, [1, 2, 3])]


def test_a_recipe_cannot_mix_with_a_drafter():
    recipe = load_recipe_module(REPO / "recipes" / "smollm2_135m_instruct_speculative.py").RECIPE
    mixed = dataclasses.replace(recipe, capacities=dataclasses.replace(
        recipe.capacities, mixed_tokens=(256,)))
    with pytest.raises(RecipeError, match="capacities.mixed_tokens with a drafter: mixed "
                                          "programs are not captured in a drafter core"):
        validate_recipe(mixed)
    with pytest.raises(RecipeError, match=r"must be ascending and at least 2.*got \(64, 16\)"):
        validate_recipe(dataclasses.replace(recipe, drafter=None, capacities=dataclasses.replace(
            recipe.capacities, mixed_tokens=(64, 16))))


def _without(core, source):
    def drop(g):
        keep = [b for b in g.bindings if b.source != source]
        del g.bindings[:]
        g.bindings.extend(keep)
    return _mixed_graphs(core, drop)


def test_a_mixed_graph_without_its_rows_fails_validation_with_one_rule(core):
    contract = _without(core, cpb.VALUE_SOURCE_MIXED_PREFILL_ROW)
    with pytest.raises(BindingError) as info:
        PreparedContract.from_contract(contract, core.manifest)
    assert info.value.rule == "mixed.bindings"
    assert "VALUE_SOURCE_MIXED_PREFILL_ROW per packed token" in str(info.value)


def _mixed_graphs(core, change):
    contract = type(core.contract)()
    contract.CopyFrom(core.contract)
    for g in contract.model.graphs:
        if g.operation == cpb.OPERATION_MIXED:
            change(g)
    return contract


def test_lint_lists_what_startup_raises_first(core):
    contract = _without(core, cpb.VALUE_SOURCE_QUERY_LENGTH)
    found = [f for f in lint_contract(contract, core.manifest) if f.rule == "mixed.bindings"]
    assert len(found) == 4  # one per MIXED graph
    assert found[0].path == "model.graphs[5].bindings"
    assert "VALUE_SOURCE_QUERY_LENGTH per row" in str(found[0])
    broken = _mixed_graphs(core, lambda g: g.ClearField("pending_token"))
    found = [f for f in lint_capabilities(broken, core.manifest, ["cpu", "cuda"])
             if f.rule == "runtime.mixed_pending_token"]
    assert [f.path for f in found] == [f"model.graphs[{i}].pending_token" for i in (5, 6, 7, 8)]
    assert "not executed by the cpu and cuda backends" in str(found[0])


def test_a_mixed_graph_must_write_its_pending_token_view(core):
    def widen(g):
        g.pending_token.row_stride = 8  # no access covers it any more
    with pytest.raises(PendingTokenError) as info:
        PreparedContract.from_contract(_mixed_graphs(core, widen), core.manifest)
    assert info.value.rule == "graph.pending_token"
    assert "a MIXED graph writes the pending tokens it samples" in str(info.value)


def test_a_mixed_graph_off_the_decode_pending_view_fails_startup(core):
    contract = _mixed_graphs(core, lambda g: g.ClearField("pending_token"))
    prepared = PreparedContract.from_contract(contract, core.manifest)  # a valid contract
    with pytest.raises(UnsupportedContract) as info:
        NativeModel.load(prepared, core.read_resource, "cpu")
    assert info.value.rule == "runtime.mixed_pending_token"
    assert str(info.value) == (
        "unsupported contract: runtime.mixed_pending_token: model.graphs[5].pending_token = "
        "host: not executed by the "
        "cpu backend: a MIXED graph whose pending-token view differs from the decode graphs' "
        "(the next decode reads the tokens a mixed step samples there)")


def test_a_seeded_lane_draws_what_its_decode_step_draws(core):
    """Seeded sampling keys its draw by the row's seed and the fed token's position, which
    a mixed lane and a decode row share (CONSUMED_ENDPOINT - 1 = the pending position)."""
    hot = SamplingParams(temperature=1.5, top_p=0.95, seed=1234)
    prompt, other = [5, 17, 3, 88, 41], [9, 12, 60, 2, 33, 70, 11]
    draws = []
    for mixed in (False, True):
        model = load_native(core)
        first = int(model.execute(StepPlan(StepKind.PREFILL, (
            row(1, 0, prompt, 0, [1, 2], hist=prompt, sampling=hot),)))[0])
        lane = row(1, 0, [first], len(prompt), [1, 2], sampling=hot)
        chunk = row(2, 1, other, 0, [3, 4], hist=other, sampling=hot)
        if mixed:
            out = model.execute(StepPlan(StepKind.MIXED, (lane, chunk), lanes=1))
        else:
            out = model.execute(StepPlan(StepKind.DECODE, (lane,)))
        draws.append((first, int(out[0])))
    assert draws[0] == draws[1]
