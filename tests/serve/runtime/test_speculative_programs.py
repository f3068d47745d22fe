"""SPECULATIVE programs of the tiny model end to end on the CPU backend: greedy output
identical to decode by construction; seeded sampled output identical to decode's too
(coupled verification: every emitted token is the target's own draw) at every width,
width policy, batch and under preemption; the sampled token distribution equal to the
target's (chi-square, fixed seeds) with coupled verification and with the standard
speculative sampling of cores exported before it (which must keep running)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helios_ignition.testing import tiny_core
from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native

PROMPTS = [list(range(3, 9)), [5, 7, 9], [20, 21, 22, 23], [1, 2]]
ALPHA = 1e-3  # significance level of the distribution tests


def _tiny_spec_model(coupled: bool = True):
    # draft_copy: the head often proposes what the tiny target says (accept paths run)
    return load_native(tiny_core(1, speculative_widths=(1, 2, 3, 4), draft_copy=3.0,
                                 draft_vocab=96, coupled_verification=coupled), "cpu")


@pytest.fixture(scope="module")
def model():
    return _tiny_spec_model()


@pytest.fixture(scope="module")
def standard_model():
    """A core as exported before coupled verification (draft_sample / spec_verify /
    spec_copy_candidates with the q buffer): it must still load and run."""
    return _tiny_spec_model(coupled=False)


def test_new_cores_record_coupled_verification_and_old_ones_keep_their_ops():
    coupled = tiny_core(1, speculative_widths=(1, 4)).manifest
    standard = tiny_core(1, speculative_widths=(1, 4), coupled_verification=False).manifest
    new = {"draft_sample_coupled", "spec_copy_drafts", "spec_verify_coupled"}
    old = {"draft_sample", "spec_copy_candidates", "spec_verify"}
    for manifest, want, absent in ((coupled, new, old), (standard, old, new)):
        recorded = {k.reference_op for k in manifest.kernels}
        assert want <= recorded and not absent & recorded
    assert "spec.q" not in {b.name for b in coupled.buffers}
    assert "spec.q" in {b.name for b in standard.buffers}


@pytest.fixture(scope="module")
def scheduled_model():
    """A model the real Scheduler drives (its slot generations are the scheduler's, which
    the Driver's would collide with in shared packing's page-table upload cache)."""
    return _tiny_spec_model()


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_greedy_speculative_output_equals_decode(model, width):
    decoded = Driver(model).generate(PROMPTS, 20)
    for batch in (PROMPTS[:1], PROMPTS):
        out, records = Driver(model).generate_speculative(batch, 20, width)
        assert out == decoded[:len(batch)]
    if width > 1:
        accepted = sum(int(r[:, 2].sum()) for r in records)
        assert accepted >= 5, "the test must exercise accepted drafts"


def test_greedy_identity_holds_for_cores_exported_before_coupling(standard_model):
    decoded = Driver(standard_model).generate(PROMPTS, 20)
    out, records = Driver(standard_model).generate_speculative(PROMPTS, 20, 4)
    assert out == decoded and sum(int(r[:, 2].sum()) for r in records) >= 5


SEEDED = dict(temperature=0.8, top_p=0.95)


def test_seeded_sampled_speculative_tokens_are_the_decode_programs_tokens(model):
    """Driver level: the same (seed, position) draws whatever the lane width, alone or
    in a batch, and the accept path runs (sampled drafts match the target's draws)."""
    params = [SamplingParams(seed=70 + i, **SEEDED) for i in range(len(PROMPTS))]
    decoded = Driver(model).generate(PROMPTS, 24, params)
    for width in (1, 2, 3, 4):
        out, records = Driver(model).generate_speculative(PROMPTS, 24, width, params)
        assert out == decoded, width
        alone, _ = Driver(model).generate_speculative(PROMPTS[2:3], 24, width, params[2:3])
        assert alone[0] == decoded[2], width
        if width > 1:
            assert sum(int(r[:, 2].sum()) for r in records) >= 5, "no sampled draft accepted"


def test_a_lane_never_emits_more_than_its_length(model):
    _, records = Driver(model).generate_speculative(PROMPTS, 20, 4)
    for record in records:
        assert np.all(record[:, 3] <= record[:, 1]) and np.all(record[:, 3] == record[:, 2] + 1)


def _p_value(groups: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """Pearson chi-square p-value over independent groups of (counts, probabilities),
    bins with expectation < 5 merged within a group, via the Wilson-Hilferty normal
    approximation of the chi-square tail."""
    stat, k = 0.0, 0
    for counts, probs in groups:
        expected = probs * counts.sum()
        keep = expected >= 5
        obs = np.append(counts[keep], counts[~keep].sum())
        exp = np.append(expected[keep], expected[~keep].sum())
        if exp[-1] < 1e-9:
            obs, exp = obs[:-1], exp[:-1]
        stat += float(((obs - exp) ** 2 / exp).sum())
        k += len(obs) - 1
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def _target_probs(model, prefix: list[int], fed: int, temperature: float) -> np.ndarray:
    """The decode program's next-token distribution after `prefix` + `fed`."""
    driver = Driver(model, collect_logits=True)
    logits = driver.teacher_force(prefix, [fed, 0])[1]
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    return p / p.sum()


@pytest.mark.parametrize("which", ["coupled", "standard"])
def test_sampled_speculative_tokens_follow_the_target_distribution(which, model,
                                                                   standard_model):
    """First and second emitted tokens against the decode program's distribution,
    chi-square at significance ALPHA, for coupled verification and for the standard
    speculative sampling of cores exported before it."""
    model = model if which == "coupled" else standard_model
    prompt, pending, temperature = [5, 7, 9, 11], 13, 0.6
    lanes, rounds = 4, 300  # 1,200 samples of the first token of 4-wide rounds
    first, second = [], []
    g = model.manifests
    per_slot = g.num_pages // g.slots
    for r in range(rounds):
        prefill, rows = [], []
        for lane in range(lanes):
            sampling = SamplingParams(temperature=temperature, seed=1000 + r * lanes + lane)
            pages = tuple(range(lane * per_slot, lane * per_slot + 3))
            prefill.append(RowPlan(request_id=lane, slot=lane, generation=r + 1,
                                   tokens=tuple(prompt), start_position=0, page_ids=pages[:1],
                                   sample=True, sampling=sampling,
                                   histogram_tokens=tuple(prompt)))
            rows.append(RowPlan(request_id=lane, slot=lane, generation=r + 1,
                                tokens=(pending,), start_position=len(prompt),
                                page_ids=pages, sample=True, sampling=sampling, query_length=4))
        model.execute(StepPlan(StepKind.PREFILL, tuple(prefill)))
        model.write_pending_tokens(list(range(lanes)), [pending] * lanes)
        record = model.execute(StepPlan(StepKind.SPECULATIVE, tuple(rows)))
        for lane in record:
            first.append(int(lane[6]))
            if lane[3] >= 2:
                second.append((int(lane[6]), int(lane[7])))
    p1 = _target_probs(model, prompt, pending, temperature)
    assert _p_value([(np.bincount(first, minlength=len(p1)), p1)]) > ALPHA
    # The second token of rounds whose first draft was accepted: p(. | prompt, x, a) for
    # each accepted first token a with at least 10 such rounds (pooled chi-square).
    groups = []
    for a in sorted({t for t, _ in second}):
        follow = [b for t, b in second if t == a]
        if len(follow) >= 10:
            p2 = _target_probs(model, prompt + [pending], a, temperature)
            groups.append((np.bincount(follow, minlength=len(p2)), p2))
    assert sum(int(c.sum()) for c, _ in groups) >= 60, "too few accepted first drafts"
    assert _p_value(groups) > ALPHA


def test_decode_rows_write_the_draft_context_prefill_would(model):
    """A request that decoded (it asked for logprobs, or the width policy chose decode)
    speculates later from the same draft context a prefill of its tokens writes: the
    target feature and the head's K/V entry of every decoded position."""
    from helios_serve.runtime.driver import _Lane

    prompt = PROMPTS[0]
    out = Driver(model).generate([prompt], 6)[0]
    Driver(model).prefill(_Lane(1, prompt + out[:5], SamplingParams()))
    g = model.manifests
    per_slot = min(g.max_pages_per_request, g.num_pages // g.slots)
    positions = np.arange(len(prompt) + 5)
    pages = positions // g.page_tokens
    buffers = model.backend.buffers
    for plane in ("D.f_cache", "D.k_cache", "D.v_cache"):
        decoded = buffers[plane][pages, positions % g.page_tokens]
        prefilled = buffers[plane][per_slot + pages, positions % g.page_tokens]
        assert np.abs(decoded[len(prompt):]).max() > 0
        np.testing.assert_allclose(decoded, prefilled, rtol=1e-4, atol=1e-5, err_msg=plane)


def _serve(model, requests, num_pages=None, widths=None, policy=False):
    """The real scheduler over the real programs (no worker): each request's output
    tokens, the scheduler's stats at the end and the speculative steps that left a
    running request out. `widths`: the served speculative widths (() = plain decode;
    default the core's); `policy`: the adaptive width policy."""
    from dataclasses import replace

    from helios_serve.scheduler import FinishReason, Scheduler

    geometry = model.manifests
    if num_pages is not None:
        geometry = replace(geometry, num_pages=num_pages)
    if widths is not None:
        geometry = replace(geometry, speculative_widths=tuple(widths))
    scheduler = Scheduler(geometry, frames=1, device_pending=model.device_pending,
                          width_policy=policy)
    for request in requests:
        assert scheduler.add(request) is None
    limits = {r.request_id: r.max_output_tokens for r in requests}
    out: dict[int, list[int]] = {r.request_id: [] for r in requests}
    waits = 0  # speculative steps that left a running request out (no pages for its lane)
    kinds = set()
    while scheduler.has_work():
        running = scheduler.stats().running
        plan = scheduler.schedule()
        assert plan is not None
        kinds.add(plan.kind)
        if plan.kind is StepKind.SPECULATIVE and len(plan.rows) < running:
            waits += 1
        for result in scheduler.complete(plan, model.execute(plan)):
            if result.token_id is None or not scheduler.is_live(result.request_id):
                continue
            out[result.request_id].append(result.token_id)
            if result.output_tokens == limits[result.request_id]:
                scheduler.finish(result.request_id, FinishReason.LENGTH)
    if widths == ():
        assert StepKind.SPECULATIVE not in kinds
    elif widths is None or max(widths) > 1:
        assert StepKind.SPECULATIVE in kinds, kinds
    return out, scheduler.stats(), waits


def _seeded(i, prompt, seed, max_tokens=24):
    from helios_serve.scheduler import SchedRequest

    return SchedRequest(request_id=i, prompt_tokens=tuple(prompt), max_output_tokens=max_tokens,
                        sampling=SamplingParams(seed=seed, **SEEDED))


def test_a_seeded_request_samples_the_decode_text_at_any_width_policy_batch_or_preemption(
        scheduled_model):
    """Coupled verification: a seeded sampled request (T 0.8, top_p 0.95) emits exactly
    the token ids a plain DECODE run of the same seed emits -- served widths W = 1..4,
    the fixed and the adaptive width policy, alone and in a batch of 4, a shorter
    max_tokens (a prefix of the same text), and under page pressure that preempts."""
    batch = [_seeded(i, p, 50 + i) for i, p in enumerate(PROMPTS)]
    decoded = {r.request_id: _serve(scheduled_model, [r], widths=())[0][r.request_id]
               for r in batch}
    together, _, _ = _serve(scheduled_model, batch, widths=())
    assert together == decoded
    for top in (1, 2, 3, 4):
        widths = tuple(range(1, top + 1))
        for policy in (False, True):
            out, stats, _ = _serve(scheduled_model, batch, widths=widths, policy=policy)
            assert out == decoded, (widths, policy)
            alone = _seeded(9, PROMPTS[1], 51)
            out, _, _ = _serve(scheduled_model, [alone], widths=widths, policy=policy)
            assert out[9] == decoded[1], (widths, policy)
    shorter = [_seeded(i, p, 50 + i, max_tokens=7) for i, p in enumerate(PROMPTS)]
    out, _, _ = _serve(scheduled_model, shorter, policy=True)
    assert out == {i: text[:7] for i, text in decoded.items()}
    squeezed, stats, _ = _serve(scheduled_model, batch, num_pages=14)
    assert stats.preemptions > 0, "the test must preempt"
    assert squeezed == decoded


def test_a_seeded_request_samples_the_same_text_under_page_pressure_without_preemption(
        scheduled_model):
    """Lanes without their pages wait (they are not shortened): 26 pages of 4 tokens."""
    batch = [_seeded(i, p, 50 + i) for i, p in enumerate(PROMPTS)]
    alone = {r.request_id: _serve(scheduled_model, [r])[0][r.request_id] for r in batch}
    squeezed, stats, waits = _serve(scheduled_model, batch, num_pages=26)
    assert waits > 0 and stats.preemptions == 0, "the test must run under page pressure"
    assert squeezed == alone


def _oracle(decoded, prompts, count=3):
    """Copied candidates that are the decode programs' own continuation."""
    def propose(seq):
        for prompt, out in zip(prompts, decoded, strict=True):
            full = list(prompt) + out
            if full[:len(seq)] == seq:
                return full[len(seq):len(seq) + count]
        return ()
    return propose


def test_copied_candidates_are_verified_with_greedy_identity(model):
    decoded = Driver(model).generate(PROMPTS, 20)
    out, records = Driver(model).generate_speculative(PROMPTS, 20, 4,
                                                      propose=_oracle(decoded, PROMPTS))
    assert out == decoded
    # The decode programs' own continuation: every copied draft is accepted.
    for record in records:
        assert (record[:, 2] == record[:, 1] - 1).all()
    wrong = lambda seq: [(t + 1) % 60 for t in seq[-3:]]  # noqa: E731
    out, records = Driver(model).generate_speculative(PROMPTS, 20, 4, propose=wrong)
    assert out == decoded


def test_stale_copied_candidates_are_ignored_by_the_program(model):
    """Candidates proposed for another slot generation or another consumed endpoint leave
    the lane exactly as without candidates; fresh ones are applied."""
    from helios_serve.engine.plan import CopiedCandidates
    from helios_serve.runtime.driver import _Lane

    prompt = PROMPTS[0]
    decoded = Driver(model).generate([prompt], 8)[0]
    truth = tuple(decoded[1:4])  # what follows the pending token decoded[0]

    def lane_record(candidates):
        driver = Driver(model)
        driver._generation = 5
        first = driver.prefill(_Lane(0, list(prompt), SamplingParams()))
        assert first == decoded[0]
        row = RowPlan(request_id=0, slot=0, generation=5, tokens=(first,),
                      start_position=len(prompt), page_ids=driver._pages(0, len(prompt) + 4),
                      sample=True, sampling=SamplingParams(), query_length=4,
                      candidates=candidates)
        return model.execute(StepPlan(StepKind.SPECULATIVE, (row,)))[0]

    plain = lane_record(None)
    endpoint = len(prompt) + 1
    fresh = lane_record(CopiedCandidates(truth, 5, endpoint))
    assert fresh[2] == 3 and list(fresh[6:10]) == decoded[1:5]
    for stale in (CopiedCandidates(truth, 4, endpoint), CopiedCandidates(truth, 5, endpoint - 1),
                  CopiedCandidates(truth, 5, endpoint + 1)):
        np.testing.assert_array_equal(lane_record(stale), plain)


def test_prefix_limit_programs_allocate_within_p_with_greedy_identity(model):
    decoded = Driver(model).generate(PROMPTS, 20)
    for propose in (None, _oracle(decoded, PROMPTS)):
        out, records = Driver(model).generate_speculative(PROMPTS, 20, 4, packed_rows=8,
                                                          propose=propose)
        assert out == decoded
        for record in records:
            offers = record[:, 1]
            assert offers.sum() <= 8 and (offers >= 1).all() and (offers <= 4).all()
            assert (record[:, 3] == record[:, 2] + 1).all()
        assert any(r[:, 1].max() > 2 for r in records), "the allocation must vary lengths"


def _words(allowed: np.ndarray) -> np.ndarray:
    """int32 [mask_words] bitmask of a boolean [V] allowed-token vector."""
    V = allowed.size
    bits = np.zeros(((V + 31) // 32) * 32, bool)
    bits[:V] = allowed
    return np.packbits(bits.reshape(-1, 32)[:, ::-1], axis=1).view(">u4").astype(
        np.uint32).view(np.int32).reshape(-1)


def _constrained_decode(model, prompt, masks, sampling=None):
    """The width-one path of a constrained request: decode steps under GRAMMAR_MASK
    masks[i] for the token after the i-th fed one. Returns (pending token, [t1, ...])."""
    from helios_serve.runtime.driver import _Lane

    sampling = sampling or SamplingParams()
    driver = Driver(model)
    driver._generation = 5
    lane = _Lane(0, list(prompt), sampling)
    first = driver.prefill(lane)
    fed, out = first, []
    for mask in masks:
        row = RowPlan(request_id=0, slot=0, generation=5, tokens=(fed,),
                      start_position=len(lane.tokens),
                      page_ids=driver._pages(0, len(lane.tokens) + 1), sample=True,
                      sampling=sampling, grammar_mask=mask)
        new = int(driver._run(StepPlan(StepKind.DECODE, (row,)))[0])
        lane.tokens.append(fed)
        fed = new
        out.append(new)
    return first, out


def _masked_lane(model, prompt, mask0, candidates, sampling=None, packed=0, n=4):
    """One constrained SPECULATIVE lane (n positions) after a fresh prefill of `prompt`."""
    from helios_serve.runtime.driver import _Lane

    sampling = sampling or SamplingParams()
    driver = Driver(model)
    driver._generation = 5
    first = driver.prefill(_Lane(0, list(prompt), sampling))
    row = RowPlan(request_id=0, slot=0, generation=5, tokens=(first,),
                  start_position=len(prompt), page_ids=driver._pages(0, len(prompt) + n),
                  sample=True, sampling=sampling, query_length=n, grammar_mask=mask0,
                  candidates=candidates)
    return model.execute(StepPlan(StepKind.SPECULATIVE, (row,), packed))[0]


def test_constrained_lanes_verify_copied_candidates_under_their_grammar_masks(model):
    """Per-position masks (CANDIDATE_GRAMMAR_MASKS) in the captured program: a lane whose
    candidates are the masked decode's own tokens accepts them all and emits exactly the
    width-one constrained tokens; a candidate its position's mask forbids is never
    committed (the row emits the masked argmax); stale masks are ignored (the lane
    verifies its pending position only); learned drafts past the copied run are never
    verified."""
    from helios_serve.engine.plan import CopiedCandidates

    V = model.manifests.vocab_size
    rng = np.random.default_rng(11)
    allowed = rng.random((5, V)) < 0.4
    masks = [_words(a) for a in allowed]
    prompt = PROMPTS[0]
    first, truth = _constrained_decode(model, prompt, masks)
    plain = Driver(model).generate([prompt], 6)[0]
    assert truth != plain[1:], "the masks must change the output"
    endpoint = len(prompt) + 1
    assert (2, 4, 4) in model.manifests.prefix_programs
    for packed in (0, 4):  # QUERY_LENGTH, then the prefix-limit program spec_b2_w4_p4
        fresh = CopiedCandidates(tuple(truth[:3]), 5, endpoint, grammar_masks=np.stack(masks[1:4]))
        lane = _masked_lane(model, prompt, masks[0], fresh, packed=packed)
        offers = int(lane[1])  # 4 rows for one lane: the whole ceiling
        assert offers == 4 and int(lane[2]) == 3 and list(lane[6:10]) == truth[:4]
    fresh = CopiedCandidates(tuple(truth[:3]), 5, endpoint, grammar_masks=np.stack(masks[1:4]))
    lane = _masked_lane(model, prompt, masks[0], fresh)
    assert lane[1:4].tolist() == [4, 3, 4] and list(lane[6:10]) == truth[:4]
    # Candidate 1 is forbidden at its position (mask 0 of the candidates = row 1's).
    bad = int(np.flatnonzero(~allowed[1])[0])
    wrong = CopiedCandidates((truth[0], bad, truth[2]), 5, endpoint,
                             grammar_masks=np.stack(masks[1:4]))
    lane = _masked_lane(model, prompt, masks[0], wrong)
    assert lane[2] == 1 and list(lane[6:8]) == truth[:2] and bad not in lane[6:].tolist()
    # One copied candidate: the learned drafts behind it are cut, never verified.
    one = CopiedCandidates(tuple(truth[:1]), 5, endpoint, grammar_masks=np.stack(masks[1:2]))
    lane = _masked_lane(model, prompt, masks[0], one)
    assert lane[1:4].tolist() == [4, 1, 2] and list(lane[6:8]) == truth[:2]
    for stale in (CopiedCandidates(tuple(truth[:3]), 4, endpoint, np.stack(masks[1:4])),
                  CopiedCandidates(tuple(truth[:3]), 5, endpoint + 1, np.stack(masks[1:4]))):
        lane = _masked_lane(model, prompt, masks[0], stale)
        assert lane[1:4].tolist() == [4, 0, 1] and list(lane[6:7]) == truth[:1]


def test_sampled_constrained_lanes_emit_only_tokens_their_masks_allow(model):
    """Sampled lanes with copied candidates, some forbidden: every emitted token lies in
    its position's mask (row 0: GRAMMAR_MASK, row j: candidate mask j - 1)."""
    from helios_serve.engine.plan import CopiedCandidates

    V = model.manifests.vocab_size
    rng = np.random.default_rng(5)
    prompt = PROMPTS[1]
    endpoint = len(prompt) + 1
    checked = 0
    for trial in range(40):
        allowed = rng.random((4, V)) < 0.5
        ids = tuple(int(rng.integers(V)) for _ in range(3))
        copied = CopiedCandidates(ids, 5, endpoint,
                                  grammar_masks=np.stack([_words(a) for a in allowed[1:]]))
        sampling = SamplingParams(temperature=1.0, seed=100 + trial)
        lane = _masked_lane(model, prompt, _words(allowed[0]), copied, sampling)
        emitted = [int(t) for t in lane[6:6 + int(lane[3])]]
        for j, token in enumerate(emitted):
            assert allowed[j, token], f"trial {trial}: token {token} at row {j}"
            checked += 1
    assert checked > 40  # some lanes accepted copied candidates


def test_prefix_limit_programs_report_framed_proposal_confidence():
    """proposal_confidence (the specification: contiguous FP32 [2, request_slots,
    draft_capacity], plane = completion frame, rows in lane order): two prefix-limit steps
    in flight in frames 0 and 1 each read back their own confidences, probabilities of
    the drafts the lanes made, which reproduce the device's allocation exactly (the NumPy
    spec_allocate over the host-visible values gives the lanes' offers)."""
    from helios_serve.runtime.driver import _Lane
    from helios_tools.kernels import spec_allocate

    model = load_native(tiny_core(1, speculative_widths=(1, 2, 4), draft_copy=3.0,
                                  draft_vocab=96), "cpu", cpu_frames=2)
    g = model.manifests
    assert (2, 4, 4) in g.prefix_programs
    driver = Driver(model)
    driver._generation = 9
    plans = []
    for pair in ((0, 1), (2, 3)):
        rows = []
        for slot in pair:
            prompt = PROMPTS[slot]
            first = driver.prefill(_Lane(slot, list(prompt), SamplingParams()))
            rows.append(RowPlan(request_id=slot, slot=slot, generation=9, tokens=(first,),
                                start_position=len(prompt),
                                page_ids=driver._pages(slot, len(prompt) + 4), sample=True,
                                sampling=SamplingParams(), query_length=4 - slot % 2))
        plans.append(StepPlan(StepKind.SPECULATIVE, tuple(rows), 4))
    tickets = [model.submit(plan) for plan in plans]  # both frames in flight
    assert [t.frame for t in tickets] == [0, 1]
    done = [model.wait_step(t) for t in tickets]
    staged = model.backend.staging(0)["proposal_confidence"]
    assert staged is model.backend.staging(1)["proposal_confidence"]  # one framed array
    assert staged.shape == (2, g.slots, 3) and staged.dtype == np.float32
    for frame, (plan, completion) in enumerate(zip(plans, done, strict=True)):
        conf = completion.confidence
        assert conf.shape == (2, 3)
        np.testing.assert_array_equal(conf, staged[frame, :2])
        ceilings = np.asarray([r.lane_length for r in plan.rows], np.int32)
        for lane, n in enumerate(ceilings):
            drafted = conf[lane, :n - 1]
            assert np.isfinite(drafted).all() and (0 <= drafted).all() and (drafted <= 1).all()
        lengths = np.zeros(2, np.int32)
        spec_allocate(ceilings, np.asarray([r.slot for r in plan.rows], np.int32),
                      np.where(np.arange(3) < ceilings[:, None] - 1, conf, 0).astype(np.float32),
                      lengths, 2, 4, 3)
        np.testing.assert_array_equal(completion.sampled[:, 1], lengths)
    assert not np.array_equal(done[0].confidence, done[1].confidence)
