"""NativeModel on the CPU backend: capture -> shared packing -> reference kernels.

The tiny model's paged, packed, chunked execution is checked against an independent
dense forward pass (helios_ignition.testing.dense_forward).
"""

from __future__ import annotations

import numpy as np
import pytest
from helios_contract import PreparedContract
from helios_ignition.testing import TINY_SHAPES, dense_forward, tiny_core
from helios_serve.engine.plan import PromptImage, RowPlan, SamplingParams, StepKind, StepPlan
from helios_serve.runtime import NativeModel, UnknownBackend
from helios_serve.testing.native import load_native

GREEDY = SamplingParams()
PT = 4


def row(rid, slot, tokens, start, pages, *, sample=True, hist=None, gen=1, sampling=GREEDY):
    return RowPlan(request_id=rid, slot=slot, generation=gen, tokens=tuple(tokens),
                   start_position=start, page_ids=tuple(pages), sample=sample,
                   sampling=sampling, histogram_tokens=None if hist is None else tuple(hist))


@pytest.fixture
def core():
    return tiny_core(seed=3)


@pytest.fixture
def model(core):
    return load_native(core, "cpu")


def logits(model, n):
    return model.backend.buffers["scratch.logits"][:n].copy()


def test_geometry_from_contract_and_manifest(model):
    g = model.manifests
    assert (g.page_tokens, g.num_pages, g.slots, g.max_pages_per_request) == (4, 32, 4, 16)
    assert g.decode_capacities == (1, 2, 4)
    assert g.prefill_token_capacities == (8, 16)
    assert (g.prefill_row_capacity, g.context_tokens, g.vocab_size) == (4, 64, 96)
    assert (g.mask_words, g.eos_token_ids) == (3, (95,))


def test_chunked_prefill_then_decode_matches_dense(core, model):
    prompt = [5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14, 26]
    pages = [7, 3, 12, 30]  # deliberately non-contiguous page ids
    first = model.execute(StepPlan(StepKind.PREFILL, (
        row(1, 2, prompt[:8], 0, pages[:2], sample=False, hist=prompt),)))
    assert model.select_graph(StepPlan(StepKind.PREFILL, (
        row(1, 2, prompt[:8], 0, pages[:2]),))) == "prefill_t8"
    assert first.shape == (1,)
    out = model.execute(StepPlan(StepKind.PREFILL, (row(1, 2, prompt[8:], 8, pages[:3]),)))
    seq = list(prompt)
    ref = dense_forward(core.weights, TINY_SHAPES, seq)
    np.testing.assert_allclose(logits(model, 1)[0], ref[-1], atol=2e-4, rtol=1e-4)
    assert int(out[0]) == int(np.argmax(ref[-1]))
    for _ in range(6):  # crosses into the fourth page at position 12..17
        seq.append(int(out[0]))
        n = len(seq)
        out = model.execute(StepPlan(StepKind.DECODE, (
            row(1, 2, [seq[-1]], n - 1, pages[:(n + PT - 1) // PT]),)))
        ref = dense_forward(core.weights, TINY_SHAPES, seq)
        np.testing.assert_allclose(logits(model, 1)[0], ref[-1], atol=2e-4, rtol=1e-4)
        assert int(out[0]) == int(np.argmax(ref[-1]))


def test_packed_prefill_and_padded_decode_batch_match_dense(core, model):
    prompts = {0: [1, 2, 3, 4, 5], 1: [9, 8, 7], 3: [40, 41, 42, 43, 44, 45, 46]}
    pages = {0: [0, 1], 1: [5], 3: [9, 2]}
    rows = tuple(row(10 + s, s, p, 0, pages[s], hist=p) for s, p in prompts.items())
    out = model.execute(StepPlan(StepKind.PREFILL, rows))  # 15 tokens -> prefill_t16
    got = logits(model, 3)
    seqs = {}
    for i, (s, p) in enumerate(prompts.items()):
        ref = dense_forward(core.weights, TINY_SHAPES, p)[-1]
        np.testing.assert_allclose(got[i], ref, atol=2e-4, rtol=1e-4)
        seqs[s] = p + [int(out[i])]
    # Decode the three rows in the 4-row variant (one padding row).
    rows = tuple(row(10 + s, s, [q[-1]], len(q) - 1, pages[s] + ([20 + s] if len(q) > 8 else []))
                 for s, q in seqs.items())
    plan = StepPlan(StepKind.DECODE, rows)
    assert model.select_graph(plan) == "decode_b4"
    out = model.execute(plan)
    got = logits(model, 3)
    for i, q in enumerate(seqs.values()):
        ref = dense_forward(core.weights, TINY_SHAPES, q)[-1]
        np.testing.assert_allclose(got[i], ref, atol=2e-4, rtol=1e-4)
        assert int(out[i]) == int(np.argmax(ref))


def test_histogram_initialized_once_and_counts_sampled_tokens(model):
    prompt = [4, 4, 7, 90]
    out = model.execute(StepPlan(StepKind.PREFILL, (row(1, 1, prompt, 0, [6], hist=prompt),)))
    expected = np.bincount(prompt + [int(out[0])], minlength=96)
    np.testing.assert_array_equal(model.backend.buffers["state.histogram"][1], expected)
    # A non-sampling chunk leaves the histogram alone.
    model.execute(StepPlan(StepKind.PREFILL, (row(2, 0, [1, 2], 0, [8], sample=False,
                                                   hist=[1, 2]),)))
    np.testing.assert_array_equal(model.backend.buffers["state.histogram"][0],
                                  np.bincount([1, 2], minlength=96))


def test_padding_rows_write_no_cache(model):
    k0 = model.backend.buffers["L0.k_cache"]
    k0[...] = 7.0  # poison
    model.execute(StepPlan(StepKind.DECODE, (row(1, 0, [3], 0, [11]),)))  # decode_b1
    model.execute(StepPlan(StepKind.DECODE, (row(1, 0, [3], 0, [11]), row(2, 1, [5], 0, [12]),
                                             row(3, 2, [6], 0, [13]))))  # decode_b4, 1 pad
    touched = {int(p) for p in np.argwhere(k0 != 7.0)[:, 0]}
    assert touched == {11, 12, 13}


def test_page_table_uploads_only_new_entries(model):
    first = model.packing.pack("decode_b1", StepPlan(StepKind.DECODE, (
        row(1, 1, [3], 4, [6, 2]),)), 1, 1)
    assert [(d.destination, d.row, d.start, d.end) for d in first] == [
        ("state.page_table", 1, 0, 2)]
    again = model.packing.pack("decode_b1", StepPlan(StepKind.DECODE, (
        row(1, 1, [3], 5, [6, 2]),)), 1, 1)
    assert again == []
    grown = model.packing.pack("decode_b1", StepPlan(StepKind.DECODE, (
        row(1, 1, [3], 8, [6, 2, 9]),)), 1, 1)
    assert [(d.row, d.start, d.end) for d in grown] == [(1, 2, 3)]
    reassigned = model.packing.pack("decode_b1", StepPlan(StepKind.DECODE, (
        row(5, 1, [3], 0, [4], gen=2, hist=[3]),)), 1, 1)
    assert [(d.destination, d.row, d.start, d.end) for d in reassigned] == [
        ("state.histogram", 1, 0, 96), ("state.page_table", 1, 0, 1)]  # binding order
    np.testing.assert_array_equal(model.backend.buffers["state.page_table"][1, :3], [4, 2, 9])


def test_seeded_sampling_is_batch_independent(model):
    hot = SamplingParams(temperature=1.5, top_p=0.95, seed=1234)
    model.write_pending_tokens([0, 1, 2], [7, 50, 8])
    alone = model.execute(StepPlan(StepKind.DECODE, (row(1, 0, [7], 0, [1], sampling=hot),)))
    other = SamplingParams(temperature=1.0, seed=99)
    model.write_pending_tokens([0, 1, 2], [7, 50, 8])
    batch = model.execute(StepPlan(StepKind.DECODE, (
        row(2, 1, [50], 0, [2], sampling=other), row(1, 0, [7], 0, [1], sampling=hot),
        row(3, 2, [8], 0, [3], sampling=other))))
    assert int(batch[1]) == int(alone[0])


def test_select_graph_rejects_plans_outside_capacity(model):
    too_many = tuple(row(i, i % 4, [1], 0, [i]) for i in range(5))
    with pytest.raises(ValueError, match="no captured decode variant holds 5"):
        model.select_graph(StepPlan(StepKind.DECODE, too_many))
    with pytest.raises(ValueError, match="no captured prefill variant holds 17"):
        model.select_graph(StepPlan(StepKind.PREFILL, (row(1, 0, range(17), 0, range(5)),)))


def test_select_graph_rejects_a_scored_plan_with_images(model):
    image = PromptImage(0, 3, (1,), b"", 1, 2, bytes(32))
    scored = RowPlan(1, 0, 1, (5, 6, 7), 0, (0,), True, GREEDY, score_targets=(6, 7, -1))
    imaged = RowPlan(2, 1, 1, (8, 9, 10), 0, (1,), True, GREEDY, images=(image,))
    with pytest.raises(ValueError, match="^a scored prefill plan carries images; no captured "
                                         "variant scores image rows$"):
        model.select_graph(StepPlan(StepKind.PREFILL, (scored, imaged)))


def test_unknown_backend_lists_known(core):
    prepared = PreparedContract.from_contract(core.contract, core.manifest)
    with pytest.raises(UnknownBackend, match="unknown backend 'tpu'; known backends: cpu, cuda"):
        NativeModel.load(prepared, core.read_resource, "tpu")


def test_load_needs_the_manifest(core):
    from helios_serve.runtime import RuntimeLoadError

    with pytest.raises(RuntimeLoadError, match="validated against its execution manifest"):
        NativeModel.load(PreparedContract.from_contract(core.contract), core.read_resource)


def test_weight_resource_of_wrong_size_fails_load(core):
    core.weights["weights/L0.wo"] = core.weights["weights/L0.wo"][:-1]
    with pytest.raises(RuntimeError, match="weight L0.wo: resource weights/L0.wo holds 3968 "
                                            "bytes, the buffer needs 4096"):
        load_native(core, "cpu")


def test_captured_contract_passes_prepared_contract_validation(core):
    from helios_contract import PreparedContract

    prepared = PreparedContract.from_contract(core.contract, core.manifest)
    assert prepared.decode_capacities == (1, 2, 4)
    assert prepared.prefill_capacities == ((4, 8), (4, 16))
    assert prepared.cache_planes == ("L0.k_cache", "L0.v_cache", "L1.k_cache", "L1.v_cache")


# -- pending tokens and execution frames ---------------------------------------------------


def _prefill(model, slot, prompt, pages, rid=1):
    return int(model.execute(StepPlan(StepKind.PREFILL, (
        row(rid, slot, prompt, 0, pages, hist=prompt),)))[0])


def test_decode_feeds_the_device_owned_pending_token_not_the_plans(core, model):
    assert model.device_pending
    assert "in.tokens" not in {b.destination for g in core.contract.model.graphs
                               if g.operation == 6 for b in g.bindings}  # OPERATION_DECODE
    prompt = [5, 17, 3, 88, 41]
    first = _prefill(model, 2, prompt, [7, 3])
    assert int(model.backend.buffers["state.pending_token"][2]) == first
    out = model.execute(StepPlan(StepKind.DECODE, (row(1, 2, [-12345], 5, [7, 3]),)))
    ref = dense_forward(core.weights, TINY_SHAPES, prompt + [first])[-1]
    np.testing.assert_allclose(logits(model, 1)[0], ref, atol=2e-4, rtol=1e-4)
    assert int(model.backend.buffers["state.pending_token"][2]) == int(out[0])


def test_write_pending_tokens_teacher_forces_the_next_decode(core, model):
    prompt = [5, 17, 3, 88, 41]
    first = _prefill(model, 1, prompt, [4, 9])
    forced = (first + 1) % 96
    model.write_pending_tokens([1], [forced])
    model.execute(StepPlan(StepKind.DECODE, (row(1, 1, [forced], 5, [4, 9]),)))
    ref = dense_forward(core.weights, TINY_SHAPES, prompt + [forced])[-1]
    np.testing.assert_allclose(logits(model, 1)[0], ref, atol=2e-4, rtol=1e-4)
    with pytest.raises(ValueError, match=r"slot 4 outside \[0, 4\)"):
        model.write_pending_tokens([4], [1])


def test_two_frames_decode_ahead_equals_one_step_at_a_time(core):
    prompts = {0: [1, 2, 3, 4, 5], 3: [40, 41, 42]}
    pages = {0: [0, 1, 2, 3], 3: [9, 10, 11, 12]}

    def run(ahead: bool) -> dict[int, list[int]]:
        model = load_native(core, "cpu", cpu_frames=2)
        out = {s: [_prefill(model, s, p, pages[s][:2], rid=s)] for s, p in prompts.items()}
        length = {s: len(p) for s, p in prompts.items()}

        def plan():
            return StepPlan(StepKind.DECODE, tuple(
                row(s, s, [-1], length[s], pages[s]) for s in prompts))

        tickets = []
        for _ in range(6):
            tickets.append(model.submit(plan()))
            for s in prompts:
                length[s] += 1
            if not ahead or len(tickets) == 2:
                got = model.wait(tickets.pop(0))
                for i, s in enumerate(prompts):
                    out[s].append(int(got[i]))
        for t in tickets:
            got = model.wait(t)
            for i, s in enumerate(prompts):
                out[s].append(int(got[i]))
        assert model.outstanding == 0
        return out

    ahead, serial = run(True), run(False)
    assert ahead == serial
    for s, p in prompts.items():  # greedy continuation of the dense reference
        seq = list(p)
        for tok in serial[s]:
            assert tok == int(np.argmax(dense_forward(core.weights, TINY_SHAPES, seq)[-1]))
            seq.append(tok)


def test_frames_are_bounded_and_complete_in_order(core):
    model = load_native(core, "cpu", cpu_frames=2)
    plan = StepPlan(StepKind.DECODE, (row(1, 0, [3], 0, [11]),))
    a = model.submit(plan)
    b = model.submit(plan)
    assert (a.frame, b.frame, model.outstanding) == (0, 1, 2)
    with pytest.raises(RuntimeError, match="all 2 execution frames are in flight"):
        model.submit(plan)
    with pytest.raises(RuntimeError, match="steps complete in submission order"):
        model.wait(b)
    with pytest.raises(RuntimeError, match="only with no step in flight"):
        model.write_pending_tokens([0], [1])
    model.wait(a)
    model.wait(b)
    assert model.outstanding == 0


def test_host_owned_pending_token_is_fed_from_the_plan():
    core = tiny_core(seed=3, device_pending=False)
    model = load_native(core, "cpu")
    assert not model.device_pending
    with pytest.raises(RuntimeError, match="pending token is host-owned"):
        model.write_pending_tokens([0], [1])
    prompt = [5, 17, 3]
    _prefill(model, 0, prompt, [1])
    model.execute(StepPlan(StepKind.DECODE, (row(1, 0, [60], 3, [1]),)))
    ref = dense_forward(core.weights, TINY_SHAPES, prompt + [60])[-1]
    np.testing.assert_allclose(logits(model, 1)[0], ref, atol=2e-4, rtol=1e-4)


def test_cpu_backend_defaults_to_one_frame_and_rejects_three(core, model):
    assert model.frames == 1
    plan = StepPlan(StepKind.DECODE, (row(1, 0, [3], 0, [11]),))
    model.submit(plan)
    with pytest.raises(RuntimeError, match="all 1 execution frames are in flight"):
        model.submit(plan)
    with pytest.raises(ValueError, match="1 or 2 execution frames, not 3"):
        load_native(core, "cpu", cpu_frames=3)


# -- logprobs and logit bias -----------------------------------------------------------------


def _log_softmax(z):
    z = np.asarray(z, np.float64)
    return z - (z.max() + np.log(np.exp(z - z.max()).sum()))


def test_geometry_reports_logprobs_width_and_logit_bias(model):
    assert model.manifests.top_logprobs == 20 and model.top_logprobs == 20
    assert model.manifests.logit_bias


def test_logprobs_describe_the_raw_logits_in_the_same_step(core, model):
    """The record holds log_softmax of the unprocessed logits (the dense reference's),
    whatever bias, penalty and temperature the sampler applied; a row that did not ask
    and a step where no row asked read no logprobs."""
    prompt = [5, 17, 3, 88, 41]
    asks = SamplingParams(temperature=0.9, seed=7, repetition_penalty=1.5, logprobs=4,
                          logit_bias=((3, 2.5), (60, -100.0)))
    rows = (row(1, 0, prompt, 0, [1, 2], hist=prompt, sampling=asks),
            row(2, 1, prompt, 0, [3, 4], hist=prompt))
    done = model.wait_step(model.submit(StepPlan(StepKind.PREFILL, rows)))
    ref = _log_softmax(dense_forward(core.weights, TINY_SHAPES, prompt)[-1])
    tok = int(done.sampled[0])
    assert tok != 60  # banned by its -100 bias
    lp = done.token_logprob(0, 4)
    assert lp.token_id == tok
    np.testing.assert_allclose(lp.logprob, ref[tok], atol=2e-4)
    want = np.argsort(-ref, kind="stable")[:4]
    assert [i for i, _ in lp.top] == want.tolist()
    np.testing.assert_allclose([v for _, v in lp.top], ref[want], atol=2e-4)
    quiet = model.wait_step(model.submit(StepPlan(StepKind.PREFILL, (
        row(3, 2, prompt, 0, [5, 6], hist=prompt),))))
    assert quiet.logprobs is None and quiet.top_ids is None
    with pytest.raises(ValueError, match="holds no logprobs"):
        quiet.token_logprob(0, 0)


def test_logit_bias_row_is_written_at_placement_and_gated_per_row(core, model):
    prompt = [5, 17, 3, 88, 41]
    greedy = int(np.argmax(dense_forward(core.weights, TINY_SHAPES, prompt)[-1]))
    forced = (greedy + 7) % 96
    biased = SamplingParams(logit_bias=((forced, 100.0), (greedy, -100.0)))
    out = model.execute(StepPlan(StepKind.PREFILL, (
        row(1, 1, prompt, 0, [1, 2], hist=prompt, sampling=biased),)))
    assert int(out[0]) == forced
    bias = model.backend.buffers["state.logit_bias"]
    want = np.zeros(96, np.float32)
    want[[forced, greedy]] = [100.0, -100.0]
    np.testing.assert_array_equal(bias[1], want)
    # A later request placed in slot 1 without a bias leaves the stale row unread.
    out = model.execute(StepPlan(StepKind.PREFILL, (
        row(2, 1, prompt, 0, [1, 2], gen=2, hist=prompt),)))
    assert int(out[0]) == greedy
    np.testing.assert_array_equal(bias[1], want)
    # The bias row is written only on the placing step, never re-packed after it.
    dirty = model.packing.pack("decode_b1", StepPlan(StepKind.DECODE, (
        row(1, 1, [3], 5, [1, 2], gen=2, sampling=biased),)), 1, 1)
    assert [d.destination for d in dirty] == []
