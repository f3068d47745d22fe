"""The bf16 KV cache (``ignition export --kv-cache-dtype bf16``, helios_ignition.kv_cache)
on the cpu backend, on the tiny cores: planes held as uint16 bit patterns, the layer-0
keys and values stored exactly as ``encode_bf16`` of the f32 core's, twice the pages for
the same ``--kv-cache-memory`` (two bytes an element against four), generation through
the decode, prefill and TRANSFER programs and the sliding-window forms, and the one
``runtime.storage`` rule refusing a backend without bf16 cache planes at startup as lint
does.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helios_contract import PreparedContract, capability_findings
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.kv_cache import apply_kv_bf16
from helios_ignition.recipe import Capacities
from helios_ignition.testing import TINY_CAPACITIES, tiny_core
from helios_serve.engine.plan import Route, RowCopy, StepKind, StepPlan, Tier
from helios_serve.runtime.cache_sizing import CacheSizing
from helios_serve.runtime.driver import Driver
from helios_serve.runtime.errors import UnsupportedContract
from helios_serve.scheduler import TransferCost
from helios_serve.testing.native import load_native
from helios_serve.testing.serial import Serial
from helios_tools.capabilities import CPU, CUDA
from helios_tools.kernels.kv_bf16 import encode_bf16

CAPS = dataclasses.replace(TINY_CAPACITIES, prepared_snapshots=8, host_tier=True,
                           transfer_rows=4)
PROMPT = [5, 17, 3, 88, 41, 9, 22, 10, 11, 12, 60]


def _bf16(core):
    apply_kv_bf16(core.manifest, core.contract.model.graphs)
    return core


def _cores(caps: Capacities = TINY_CAPACITIES):
    """(the f32 tiny core, the same core with its KV cache stored as bf16)."""
    return tiny_core(seed=3, caps=caps), _bf16(tiny_core(seed=3, caps=caps))


def test_planes_are_held_as_uint16_and_read_back_widened():
    _, bf16 = _cores(CAPS)
    model = load_native(bf16, "cpu")
    try:
        planes = [b.name for b in bf16.manifest.buffers
                  if b.role == mpb.BUFFER_ROLE_CACHE_PLANE]
        assert len(planes) == 2 * 2 * 3  # 2 layers x K/V x (pages, continuation, host)
        for name in planes:
            assert model.backend.buffers[name].dtype == np.uint16, name
        assert model.backend.read_buffer("L0.k_cache").dtype == np.float32
    finally:
        model.close()


def test_layer0_planes_are_the_f32_cache_rounded():
    """Layer 0's keys and values depend on the embeddings alone, so after the same prefill
    the bf16 planes hold exactly ``encode_bf16`` of the f32 core's planes at every written
    position (and zeros elsewhere)."""
    plain, bf16 = _cores()
    pages = {}
    for name, core in (("f32", plain), ("bf16", bf16)):
        model = load_native(core, "cpu")
        try:
            Driver(model).generate([PROMPT], 1)
            pages[name] = [model.backend.buffers[p].copy() for p in ("L0.k_cache", "L0.v_cache")]
        finally:
            model.close()
    for f32, bits in zip(pages["f32"], pages["bf16"], strict=True):
        assert bits.dtype == np.uint16 and f32.dtype == np.float32
        written = np.abs(f32).reshape(f32.shape[0], f32.shape[1], -1).max(-1) > 0
        assert written.sum() == len(PROMPT)
        np.testing.assert_array_equal(bits, encode_bf16(f32))


def test_bf16_cache_generates_close_to_the_f32_cache():
    """Greedy generation on the bf16 core (prefill chunks, decode) stays close to the f32
    core: the tiny model's first greedy tokens agree."""
    plain, bf16 = _cores(CAPS)
    out = {}
    for name, core in (("f32", plain), ("bf16", bf16)):
        model = load_native(core, "cpu")
        try:
            out[name] = Driver(model).generate([PROMPT, PROMPT[:4]], 6)
        finally:
            model.close()
    assert [g[:3] for g in out["bf16"]] == [g[:3] for g in out["f32"]]


def test_a_bf16_cache_holds_twice_the_pages_of_f32():
    """The page count is sized from the planes' stored bytes: two bytes an element against
    f32's four, for the same --kv-cache-memory."""
    plain, bf16 = _cores()
    budget = 1 << 20
    pages = {}
    for name, core in (("f32", plain), ("bf16", bf16)):
        model = load_native(core, "cpu", cache=CacheSizing(memory_bytes=budget))
        try:
            pages[name] = model.backend.num_pages
            held = model.backend.buffers["L0.k_cache"].nbytes
        finally:
            model.close()
        assert held == pages[name] * 4 * 2 * 8 * (4 if name == "f32" else 2)
    page_f32 = 2 * 2 * 4 * 2 * 8 * 4  # layers x K/V x page tokens x kv heads x head dim x 4
    assert pages == {"f32": budget // page_f32, "bf16": budget // (page_f32 // 2)}


def test_a_backend_without_bf16_planes_fails_startup_and_lint_by_one_rule(monkeypatch):
    """Both backends execute bf16 planes; a table without them (a backend that could not)
    refuses the core in one finding naming the dtype, at lint and at startup."""
    from helios_serve.runtime import native_model

    _, bf16 = _cores()
    prepared = PreparedContract.from_contract(bf16.contract, bf16.manifest)
    for caps in (CPU, CUDA):
        assert [f for f in capability_findings(prepared.serving, prepared.manifest, caps)
                if f.rule == "runtime.storage"] == []
    bare = dataclasses.replace(CPU, cache_dtype_forms={})
    (finding,) = [f for f in capability_findings(prepared.serving, prepared.manifest, bare)
                  if f.rule == "runtime.storage"]
    assert finding.value == "D_TYPE_BF16"
    assert finding.detail.startswith("not executed by the cpu backend: D_TYPE_BF16 cache "
                                     "planes")
    monkeypatch.setitem(native_model.CAPABILITIES, "cpu", bare)
    with pytest.raises(UnsupportedContract) as info:
        load_native(bf16, "cpu")
    assert info.value.rule == "runtime.storage"
    assert str(info.value) == f"unsupported contract: {finding}"


def test_speculative_generation_over_a_bf16_cache_equals_greedy_decode():
    """The drafter's K/V planes are bf16 too (its feature plane stays f32); verification
    rows read the bf16 cache through the same split attention as decode, so speculative
    greedy generation on the bf16 core equals its plain greedy decode token for token."""
    core = _bf16(tiny_core(seed=1, speculative_widths=(1, 3), draft_copy=1.0))
    bf16 = {b.name for b in core.manifest.buffers if b.dtype == mpb.D_TYPE_BF16}
    assert {"D.k_cache", "D.v_cache"} <= bf16 and "D.f_cache" not in bf16
    model = load_native(core, "cpu")
    try:
        spec, _ = Driver(model).generate_speculative([PROMPT[:6]], 12, 3)
        plain = Driver(model).generate([PROMPT[:6]], 12)
    finally:
        model.close()
    assert spec == plain


def test_sliding_window_forms_generate_close_to_the_f32_cache():
    """A tiny gemma3 core (sliding-window region, its own pool) with bf16 planes: the
    windowed prefill and decode forms run, and greedy generation (past the 16-token
    window) stays close to the same core's with an f32 cache."""
    from helios_ignition.families.gemma3 import Gemma3Shapes

    shapes = Gemma3Shapes(vocab=96, hidden=32, ffn=48, layers=4, heads=4, kv_heads=2,
                          head_dim=8, rope_theta=1e6, rope_local_theta=1e4, rms_eps=1e-6,
                          tied=True, windows=(16, 16, 0, 16), query_scale=8 ** -0.5)
    caps = Capacities(decode_batch=(1, 2, 4), prefill_tokens=(8, 16), prefill_rows=4,
                      context_tokens=128, page_tokens=4, prepared_pages=64)
    plain = tiny_core(seed=4, shapes=shapes, caps=caps)
    bf16 = _bf16(tiny_core(seed=4, shapes=shapes, caps=caps))
    ops = {k.reference_op for k in bf16.manifest.kernels}
    assert {"attention_prefill_window_bf16kv", "attention_decode_window_bf16kv"} <= ops
    prompt = [(7 * i + 3) % 90 for i in range(30)]
    got = {}
    for name, core in (("f32", plain), ("bf16", bf16)):
        model = load_native(core, "cpu")
        try:
            got[name] = Driver(model).generate([prompt, prompt[:9]], 10)
        finally:
            model.close()
    assert [g[:3] for g in got["bf16"]] == [g[:3] for g in got["f32"]]


CHEAP = TransferCost(transfer_step_s=1e-9, page_copy_s=1e-9, prefill_tokens_per_s=1.0)


def test_a_restored_snapshot_of_bf16_rows_continues_as_a_fresh_prefill():
    """A snapshot (PAGES -> CONTINUATION copy of bf16 rows) restored for a follow-up
    request (CONTINUATION -> PAGES) gives the tokens and, within f32 rounding, the logits
    of prefilling the whole follow-up prompt without a snapshot."""
    core = _bf16(tiny_core(seed=3, caps=dataclasses.replace(CAPS, prepared_snapshots=4)))
    prompt = [5, 9, 11, 3, 7, 21, 40, 2, 17]
    run = Serial(load_native(core, "cpu"), CHEAP)
    run.add(1, prompt, 3)
    run.run()
    assert run.copies(Route(Tier.PAGES, Tier.CONTINUATION)) == 1
    follow = prompt + run.out[1] + [44, 45, 46]
    run.add(2, follow, 4)
    run.run()
    assert run.reused[2] == 11 and run.copies(Route(Tier.CONTINUATION, Tier.PAGES)) == 1
    fresh = Serial(load_native(core, "cpu", snapshots=0), CHEAP)
    fresh.add(2, follow, 4)
    fresh.run()
    assert fresh.reused[2] == 0 and run.out[2] == fresh.out[2]
    for k in range(4):
        np.testing.assert_allclose(run.logits[2][k], fresh.logits[2][k], atol=2e-5, rtol=0)


@pytest.mark.parametrize("route", [Route(Tier.PAGES, Tier.CONTINUATION),
                                   Route(Tier.CONTINUATION, Tier.PAGES),
                                   Route(Tier.PAGES, Tier.HOST), Route(Tier.HOST, Tier.PAGES)],
                         ids=str)
def test_each_route_copies_whole_bf16_rows_of_every_plane(route):
    core = _bf16(tiny_core(seed=3, caps=dataclasses.replace(CAPS, prepared_snapshots=4)))
    row = 4 * 2 * 8 * 2  # page tokens x kv heads x head dim x 2 bytes, one plane
    model = load_native(core, "cpu", host_cache_bytes=4 * row * 2 * 2)
    try:
        buffers = model.backend.buffers
        suffix = {Tier.PAGES: "", Tier.CONTINUATION: ".continuation", Tier.HOST: ".host"}
        planes = [f"L{i}.{p}_cache" for i in range(2) for p in "kv"]
        rng = np.random.default_rng(0)
        for name in (p + t for p in planes for t in suffix.values()):
            assert buffers[name].dtype == np.uint16, name
            buffers[name][...] = rng.integers(0, 1 << 16, buffers[name].shape)
        before = {name: array.copy() for name, array in buffers.items()}
        copies = (RowCopy(2, 1), RowCopy(0, 3))
        model.execute(StepPlan(StepKind.TRANSFER, (), copies=copies, route=route))
        for plane in planes:
            src, dst = plane + suffix[route.source], plane + suffix[route.destination]
            want = before[dst].copy()
            for c in copies:
                want[c.destination] = before[src][c.source]
            np.testing.assert_array_equal(buffers[dst], want)
            np.testing.assert_array_equal(buffers[src], before[src])
    finally:
        model.close()
