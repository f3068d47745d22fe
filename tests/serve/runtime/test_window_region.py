"""The sliding-window history region (the specification, "Attention histories and cache
policy") on a tiny Gemma 3 core: window 16 tokens on the local layers, 4-token pages.

The local layers' K/V live in the SLIDING_WINDOW region's own pool and page table; the
global layer's in the PAGED_KV region. Generation runs far past the window through the
real scheduler: the window pool's gauge moves by the exact count of pages behind the
window, the two regions are counted apart, and every step's logits equal an independent
dense NumPy forward over the whole history with the window as a mask (a full-KV
reference).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helios_contract import window_request_pages
from helios_contract.schema import contract_pb2 as cpb
from helios_ignition.capture.builder import CaptureError
from helios_ignition.families.gemma3 import Gemma3Shapes
from helios_ignition.recipe import Capacities
from helios_ignition.testing import tiny_core
from helios_serve.engine.plan import SamplingParams, StepKind
from helios_serve.runtime.driver import Driver
from helios_serve.scheduler import FinishReason, SchedRequest, Scheduler
from helios_serve.testing.native import load_native

W, PT = 16, 4
SHAPES = Gemma3Shapes(vocab=96, hidden=32, ffn=48, layers=4, heads=4, kv_heads=2,
                      head_dim=8, rope_theta=1e6, rope_local_theta=1e4, rms_eps=1e-6,
                      tied=True, windows=(W, W, 0, W), query_scale=8 ** -0.5)
CAPS = Capacities(decode_batch=(1, 2, 4), prefill_tokens=(8, 16), prefill_rows=4,
                  context_tokens=128, page_tokens=PT, prepared_pages=64)
GREEDY = SamplingParams()
PROMPT = [5, 17, 3, 88, 41, 9, 22, 10, 11, 12, 60, 61, 2, 7, 30, 31, 44, 45, 46, 1]  # 20


@pytest.fixture(scope="module")
def core():
    return tiny_core(seed=4, shapes=SHAPES, caps=CAPS)


def dense_forward(weights: dict[str, np.ndarray], s: Gemma3Shapes,
                  tokens: list[int]) -> np.ndarray:
    """Plain f64 Gemma 3 forward over `tokens` with contiguous K/V for every position and
    the window applied as a mask (the stored norms are the gains: tiny weights are stored
    values); returns logits ``[len(tokens), vocab]``."""
    w = {k.removeprefix("weights/"): v.astype(np.float64) for k, v in weights.items()}
    n, H, KVH, HD = len(tokens), s.heads, s.kv_heads, s.head_dim

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + s.rms_eps) * g

    def rope(x, inv):  # [n, heads, HD], half-split
        ang = np.arange(n)[:, None] * inv[None, :]
        cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
        a, b = x[..., :HD // 2], x[..., HD // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)

    r = w["embed"][tokens] * math.sqrt(s.hidden)
    q_pos, k_pos = np.arange(n)[:, None], np.arange(n)[None, :]
    for i in range(s.layers):
        window = s.windows[i]
        inv = w["rope_inv_freq_local" if window else "rope_inv_freq"]
        qkv = norm(r, w[f"L{i}.attn_norm"]) @ w[f"L{i}.wqkv"].T
        q = qkv[:, :H * HD].reshape(n, H, HD)
        k = qkv[:, H * HD:(H + KVH) * HD].reshape(n, KVH, HD)
        v = qkv[:, (H + KVH) * HD:].reshape(n, KVH, HD)
        q, k = rope(norm(q, w[f"L{i}.q_norm"]), inv), rope(norm(k, w[f"L{i}.k_norm"]), inv)
        visible = k_pos <= q_pos
        if window:
            visible &= k_pos > q_pos - window
        out = np.zeros((n, H, HD))
        for h in range(H):
            kv = h // (H // KVH)
            scores = np.where(visible, q[:, h] @ k[:, kv].T * s.query_scale, -np.inf)
            p = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, kv]
        r = r + norm(out.reshape(n, H * HD) @ w[f"L{i}.wo"].T, w[f"L{i}.post_attn_norm"])
        gu = norm(r, w[f"L{i}.ffn_norm"]) @ w[f"L{i}.w_gate_up"].T
        g, u = gu[:, :s.ffn], gu[:, s.ffn:]
        act = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3))) * u
        r = r + norm(act @ w[f"L{i}.w_down"].T, w[f"L{i}.post_ffn_norm"])
    return norm(r, w["final_norm"]) @ w["embed"].T


def test_the_core_declares_a_window_region_and_a_paged_region(core):
    cache = core.contract.model.cache
    kv, window = cache.regions
    assert (kv.name, kv.kind, list(kv.planes)) == (
        "kv", cpb.HISTORY_KIND_PAGED_KV, ["L2.k_cache", "L2.v_cache"])
    assert (window.name, window.kind, window.window_tokens, window.tokens_per_record) == (
        "window", cpb.HISTORY_KIND_SLIDING_WINDOW, W, 1)
    assert list(window.planes) == ["L0.k_cache", "L0.v_cache", "L1.k_cache", "L1.v_cache",
                                   "L3.k_cache", "L3.v_cache"]
    assert [(v.region, v.buffer, v.page_offset) for v in cache.page_table_views] == [
        ("kv", "state.page_table", 0), ("window", "state.window_page_table", 0)]
    extents = {b.name: b.shape[0] for b in core.manifest.buffers if b.name.endswith("_cache")}
    # 4 slots x one request's pages at the longest chunk: ceil((16 + 16 - 1) / 4) + 1 = 9
    assert window_request_pages(W, PT, 16) == 9
    assert extents == {**{p: 36 for p in window.planes}, **{p: 64 for p in kv.planes}}


def _run(model, sched, sampled_logits: list[np.ndarray], held: list[tuple[int, int, int]]):
    """Drive `sched` to completion one plan at a time; after each completion record the
    first row's logits and (num_computed, window pages used, pages used)."""
    while True:
        plan = sched.schedule()
        if plan is None:
            return
        out = model.execute(plan)
        if plan.rows[0].sample:  # a prompt's earlier chunks sample nothing
            sampled_logits.append(model.backend.buffers["scratch.logits"][0].copy())
        sched.complete(plan, [int(t) for t in out])
        seq = next(iter(sched.live.requests.values()), None)
        stats = sched.stats()
        if seq is not None and plan.kind is StepKind.DECODE:
            held.append((seq.num_computed, stats.window_pages_used, stats.pages_used))


def test_pages_behind_the_window_return_to_the_pool_and_logits_match(core):
    model = load_native(core, "cpu")
    g = model.manifests
    assert (g.window_tokens, g.window_pages, g.num_pages) == (W, 36, 64)
    sched = Scheduler(g, frames=1, device_pending=model.device_pending)
    steps = 60  # 20 prompt + 60 output tokens: five windows past the first
    assert sched.add(SchedRequest(1, tuple(PROMPT), max_output_tokens=steps,
                                  sampling=GREEDY)) is None
    logits, held = [], []
    _run(model, sched, logits, held)
    seq = PROMPT + [int(np.argmax(row)) for row in logits]
    ref = dense_forward(core.weights, SHAPES, seq[:-1])[len(PROMPT) - 1:]
    np.testing.assert_allclose(np.stack(logits), ref, rtol=0, atol=2e-4)
    # After the decode step that computed position c - 1 (num_computed c), the request
    # holds its pages up to position c - 1 in both regions; in the window region only
    # from the first page holding position c - W + 1 (the next query's window).
    assert len(held) == steps - 1
    for computed, window_used, used in held:
        top = math.ceil(computed / PT)
        assert used == top, computed
        assert window_used == top - max(0, computed - W + 1) // PT, computed
        assert window_used <= math.ceil(W / PT) + 1
    stats = sched.stats()
    computed = len(seq) - 1  # the last sampled token was never fed
    assert stats.window_pages_released == (computed - W + 1) // PT  # behind the window
    assert (stats.window_pages_used, stats.pages_used) == (
        math.ceil(computed / PT) - (computed - W + 1) // PT, math.ceil(computed / PT))
    sched.finish(1, FinishReason.LENGTH)  # the worker's output-limit decision
    stats = sched.stats()
    assert (stats.window_pages_used, stats.pages_used) == (0, 0)
    assert stats.idle


def poisoned_window_run(model, contract: cpb.ServingContract,
                        weights: dict[str, np.ndarray]) -> None:
    """Two requests through the scheduler, 50 tokens each, far past the window; after each
    completion every page of the window pool no request holds is overwritten with NaN (a
    kernel reading behind its window, or a freed page handed out before its last reader
    ran, turns logits NaN). Every sampled step's logits equal the masked dense forward."""
    g = model.manifests
    window_planes = list(contract.model.cache.regions[1].planes)
    sched = Scheduler(g, frames=1, device_pending=model.device_pending)
    prompts = {1: PROMPT, 2: PROMPT[5:] + PROMPT[:4]}
    for rid, prompt in prompts.items():
        assert sched.add(SchedRequest(rid, tuple(prompt), max_output_tokens=50,
                                      sampling=SamplingParams())) is None
    logits: dict[int, list[np.ndarray]] = {1: [], 2: []}
    released = 0
    while (plan := sched.schedule()) is not None:
        out = model.execute(plan)
        rows = model.backend.read_buffer("scratch.logits")[:len(plan.rows)]
        for r, row in zip(plan.rows, rows, strict=True):
            if r.sample:
                logits[r.request_id].append(row.copy())
        sched.complete(plan, [int(t) for t in out])
        stats = sched.stats()
        if stats.window_pages_released > released:  # poison what went back
            held = {p for s in sched.live.requests.values() for p in s.window_page_ids}
            free = sorted(set(range(g.window_pages)) - held)
            for plane in window_planes:
                array = model.backend.read_buffer(plane)
                array[free] = np.nan
                model.backend.write_state(plane, 0, array.reshape(-1))
            released = stats.window_pages_released
    assert released > 2 * len(prompts)  # both ran several windows past the first
    for rid, prompt in prompts.items():
        seq = prompt + [int(np.argmax(row)) for row in logits[rid]]
        ref = dense_forward(weights, SHAPES, seq[:-1])[len(prompt) - 1:]
        np.testing.assert_allclose(np.stack(logits[rid]), ref, rtol=0, atol=2e-3)


def test_freed_window_pages_are_reused_and_never_read(core):
    poisoned_window_run(load_native(core, "cpu"), core.contract, core.weights)


def test_two_requests_share_no_window_page_and_reuse_no_prefix(core):
    model = load_native(core, "cpu")
    sched = Scheduler(model.manifests, frames=1, device_pending=model.device_pending)
    for rid in (1, 2):  # the same prompt twice: without a window the second would reuse
        assert sched.add(SchedRequest(rid, tuple(PROMPT[:8]), max_output_tokens=4,
                                      sampling=GREEDY)) is None
    plan = sched.schedule()  # both prompts in one 16-token step
    assert [len(r.window_page_ids) for r in plan.rows] == [2, 2]
    assert not set(plan.rows[0].window_page_ids) & set(plan.rows[1].window_page_ids)
    assert not set(plan.rows[0].page_ids) & set(plan.rows[1].page_ids)
    sched.complete(plan, [int(t) for t in model.execute(plan)])
    assert sched.stats().prefix_hit_tokens == 0


def test_the_driver_generates_the_dense_reference_ids_past_the_window(core):
    model = load_native(core, "cpu")
    prompts = [PROMPT, PROMPT[7:] + PROMPT[:3]]
    out = Driver(model).generate(prompts, max_new_tokens=40)
    for prompt, ids in zip(prompts, out, strict=True):
        seq = prompt + ids
        ref = dense_forward(core.weights, SHAPES, seq[:-1])[len(prompt) - 1:]
        assert ids == [int(t) for t in np.argmax(ref, axis=1)]


def test_a_row_without_window_pages_is_refused(core):
    model = load_native(core, "cpu")
    sched = Scheduler(model.manifests, frames=1, device_pending=model.device_pending)
    assert sched.add(SchedRequest(1, tuple(PROMPT[:8]), max_output_tokens=2,
                                  sampling=GREEDY)) is None
    plan = sched.schedule()
    row = plan.rows[0]
    object.__setattr__(row, "window_page_ids", ())
    with pytest.raises(ValueError, match="sliding-window view needs its window pages"):
        model.execute(plan)


@pytest.mark.parametrize("caps", [
    Capacities(decode_batch=(1,), prefill_tokens=(8,), prefill_rows=1, context_tokens=64,
               page_tokens=4, prepared_pages=32, prepared_snapshots=4, transfer_rows=2),
    Capacities(decode_batch=(1,), prefill_tokens=(8,), prefill_rows=1, context_tokens=64,
               page_tokens=4, prepared_pages=32, host_tier=True, transfer_rows=2),
])
def test_export_refuses_snapshots_and_host_tier_with_a_window(caps):
    with pytest.raises(CaptureError, match="sliding-window layers exports without"):
        tiny_core(seed=4, shapes=SHAPES, caps=caps)


def test_export_refuses_two_windows():
    import dataclasses

    shapes = dataclasses.replace(SHAPES, windows=(W, 8, 0, W))
    with pytest.raises(CaptureError, match=r"local layers of windows \[8, 16\]"):
        tiny_core(seed=4, shapes=shapes, caps=CAPS)


def test_a_second_window_region_is_not_served(core):
    """One window pool per request: both backends refuse a second sliding-window region
    (lint-core --backend and startup read the same finding)."""
    from helios_contract import capability_findings
    from helios_tools.capabilities import BACKENDS

    serving = cpb.ServingContract()
    serving.CopyFrom(core.contract)
    serving.model.cache.regions.add(name="window2", kind=cpb.HISTORY_KIND_SLIDING_WINDOW,
                                    planes=["L9.k_cache"], tokens_per_record=1,
                                    window_tokens=8)
    for backend in ("cpu", "cuda"):
        findings = list(capability_findings(serving, core.manifest, BACKENDS[backend]))
        assert [(f.rule, f.path) for f in findings] == [
            ("runtime.window_regions", "model.cache.regions[2].kind")], backend
    assert not list(capability_findings(core.contract, core.manifest, BACKENDS["cpu"]))
