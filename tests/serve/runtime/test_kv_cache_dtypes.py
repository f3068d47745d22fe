"""The stored KV caches (``ignition export --kv-cache-dtype fp8`` / ``bf16``,
helios_ignition.kv_cache) on the cpu backend, on the tiny cores, each check written once
for both kinds (tests/kv_cache_kinds.py): planes held as uint8 e4m3 codes / uint16 bf16
bit patterns, the layer-0 keys and values stored exactly as the f32 core's (``quantize_kv``
at scale 1.0 / ``encode_bf16``), four / twice the pages for the same ``--kv-cache-memory``
(one / two bytes an element against four), generation through the decode, prefill and
TRANSFER programs and the sliding-window forms, TRANSFER copies of whole stored rows, and
the one ``runtime.storage`` rule refusing a backend without the kind's planes at startup
as lint does. Then what only e4m3 has: per-head scale weights and their calibration.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helios_contract import PreparedContract, capability_findings
from helios_contract.schema import manifest_pb2 as mpb
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

from tests.kv_cache_kinds import FP8, TIER_CAPS, each_kind, with_kv_cache

PROMPT = [5, 17, 3, 88, 41, 9, 22, 10, 11, 12, 60]


def _cores(kind, caps: Capacities = TINY_CAPACITIES):
    """(the f32 tiny core, the same core with its KV cache stored as `kind`)."""
    return tiny_core(seed=3, caps=caps), with_kv_cache(tiny_core(seed=3, caps=caps), kind)


def _generate(cores: dict, prompts: list[list[int]], steps: int) -> dict:
    """Greedy ids of `prompts` on each named core (cpu backend)."""
    out = {}
    for name, core in cores.items():
        model = load_native(core, "cpu")
        try:
            out[name] = Driver(model).generate(prompts, steps)
        finally:
            model.close()
    return out


def _gemma3_tiny():
    """A tiny gemma3 core (f32 cache): a sliding-window region with its own page pool."""
    from helios_ignition.families.gemma3 import Gemma3Shapes

    shapes = Gemma3Shapes(vocab=96, hidden=32, ffn=48, layers=4, heads=4, kv_heads=2,
                          head_dim=8, rope_theta=1e6, rope_local_theta=1e4, rms_eps=1e-6,
                          tied=True, windows=(16, 16, 0, 16), query_scale=8 ** -0.5)
    caps = Capacities(decode_batch=(1, 2, 4), prefill_tokens=(8, 16), prefill_rows=4,
                      context_tokens=128, page_tokens=4, prepared_pages=64)
    return tiny_core(seed=4, shapes=shapes, caps=caps)


@each_kind
def test_planes_are_held_as_stored_elements(kind):
    """Every plane and tier plane is held in the kind's stored elements; ``read_buffer``
    widens bf16 (as cuda's does) and gives e4m3 codes as held."""
    _, stored = _cores(kind, TIER_CAPS)
    model = load_native(stored, "cpu")
    try:
        planes = [b.name for b in stored.manifest.buffers
                  if b.role == mpb.BUFFER_ROLE_CACHE_PLANE]
        assert len(planes) == 2 * 2 * 3  # 2 layers x K/V x (pages, continuation, host)
        for name in planes:
            assert model.backend.buffers[name].dtype == kind.held, name
        assert model.backend.read_buffer("L0.k_cache").dtype == kind.read
    finally:
        model.close()


@each_kind
def test_layer0_planes_are_the_f32_cache_stored(kind):
    """Layer 0's keys and values depend on the embeddings alone, so after the same prefill
    the stored planes hold exactly the f32 core's planes as the kind stores them (e4m3 at
    scale 1.0, bf16 rounded) at every written position, and zeros elsewhere."""
    plain, stored = _cores(kind)
    pages = {}
    for name, core in (("f32", plain), ("stored", stored)):
        model = load_native(core, "cpu")
        try:
            Driver(model).generate([PROMPT], 1)
            pages[name] = [model.backend.buffers[p].copy() for p in ("L0.k_cache", "L0.v_cache")]
        finally:
            model.close()
    for f32, held in zip(pages["f32"], pages["stored"], strict=True):
        assert held.dtype == kind.held and f32.dtype == np.float32
        written = np.abs(f32).reshape(f32.shape[0], f32.shape[1], -1).max(-1) > 0
        assert written.sum() == len(PROMPT)
        np.testing.assert_array_equal(held, kind.store(f32))


@each_kind
def test_stored_cache_generates_through_decode_prefill_and_transfers(kind):
    """Greedy generation on the stored core runs every program kind (prefill chunks,
    decode, RESTORE copies of stored rows) and stays close to the f32 core: the tiny
    model's first greedy tokens agree."""
    plain, stored = _cores(kind, TIER_CAPS)
    out = _generate({"f32": plain, "stored": stored}, [PROMPT, PROMPT[:4]], 6)
    assert [g[:3] for g in out["stored"]] == [g[:3] for g in out["f32"]]


@each_kind
def test_a_stored_cache_holds_more_pages_by_its_element_bytes(kind):
    """The page count is sized from the planes' stored bytes: one (e4m3) or two (bf16)
    bytes an element against f32's four, for the same --kv-cache-memory."""
    plain, stored = _cores(kind)
    budget = 1 << 20
    pages = {}
    for name, core, element_bytes in (("f32", plain, 4), ("stored", stored,
                                                          kind.element_bytes)):
        model = load_native(core, "cpu", cache=CacheSizing(memory_bytes=budget))
        try:
            pages[name] = model.backend.num_pages
            held = model.backend.buffers["L0.k_cache"].nbytes
        finally:
            model.close()
        assert held == pages[name] * 4 * 2 * 8 * element_bytes
    page_elements = 2 * 2 * 4 * 2 * 8  # layers x K/V x page tokens x kv heads x head dim
    assert pages == {"f32": budget // (page_elements * 4),
                     "stored": budget // (page_elements * kind.element_bytes)}


@each_kind
def test_a_backend_without_the_planes_fails_startup_and_lint_by_one_rule(kind, monkeypatch):
    """Both backends execute the stored planes; a table without them (a backend that
    could not) refuses the core in one finding naming the type, at lint and at startup."""
    from helios_serve.runtime import native_model

    _, stored = _cores(kind)
    prepared = PreparedContract.from_contract(stored.contract, stored.manifest)
    for caps in (CPU, CUDA):
        assert [f for f in capability_findings(prepared.serving, prepared.manifest, caps)
                if f.rule == "runtime.storage"] == []
    bare = dataclasses.replace(CPU, **kind.bare)
    (finding,) = [f for f in capability_findings(prepared.serving, prepared.manifest, bare)
                  if f.rule == "runtime.storage"]
    assert finding.value == kind.type_name
    assert finding.detail.startswith(f"not executed by the cpu backend: {kind.type_name} "
                                     "cache planes")
    monkeypatch.setitem(native_model.CAPABILITIES, "cpu", bare)
    with pytest.raises(UnsupportedContract) as info:
        load_native(stored, "cpu")
    assert info.value.rule == "runtime.storage"
    assert str(info.value) == f"unsupported contract: {finding}"


@each_kind
def test_speculative_generation_over_a_stored_cache_equals_greedy_decode(kind):
    """The drafter's K/V planes are stored too (its feature plane stays f32); verification
    rows read the stored cache through the same split attention as decode, so speculative
    greedy generation on the stored core equals its plain greedy decode token for token."""
    core = with_kv_cache(tiny_core(seed=1, speculative_widths=(1, 3), draft_copy=1.0), kind)
    stored = {b.name for b in core.manifest.buffers if kind.stores(b)}
    assert {"D.k_cache", "D.v_cache"} <= stored and "D.f_cache" not in stored
    model = load_native(core, "cpu")
    try:
        spec, _ = Driver(model).generate_speculative([PROMPT[:6]], 12, 3)
        plain = Driver(model).generate([PROMPT[:6]], 12)
    finally:
        model.close()
    assert spec == plain


@each_kind
def test_sliding_window_forms_generate_close_to_the_f32_cache(kind):
    """A tiny gemma3 core (sliding-window region, its own pool) with stored planes: the
    windowed prefill and decode forms run, and greedy generation (past the 16-token
    window) stays close to the same core's with an f32 cache."""
    plain, stored = _gemma3_tiny(), with_kv_cache(_gemma3_tiny(), kind)
    ops = {k.reference_op for k in stored.manifest.kernels}
    assert {kind.forms["attention_prefill_window"], kind.forms["attention_decode_window"]} <= ops
    prompt = [(7 * i + 3) % 90 for i in range(30)]
    got = _generate({"f32": plain, "stored": stored}, [prompt, prompt[:9]], 10)
    assert [g[:3] for g in got["stored"]] == [g[:3] for g in got["f32"]]


CHEAP = TransferCost(transfer_step_s=1e-9, page_copy_s=1e-9, prefill_tokens_per_s=1.0)


@each_kind
def test_a_restored_snapshot_of_stored_rows_continues_as_a_fresh_prefill(kind):
    """A snapshot (PAGES -> CONTINUATION copy of stored rows) restored for a follow-up
    request (CONTINUATION -> PAGES) gives the tokens and, within f32 rounding, the logits
    of prefilling the whole follow-up prompt without a snapshot."""
    core = with_kv_cache(
        tiny_core(seed=3, caps=dataclasses.replace(TIER_CAPS, prepared_snapshots=4)), kind)
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


@each_kind
@pytest.mark.parametrize("route", [Route(Tier.PAGES, Tier.CONTINUATION),
                                   Route(Tier.CONTINUATION, Tier.PAGES),
                                   Route(Tier.PAGES, Tier.HOST), Route(Tier.HOST, Tier.PAGES)],
                         ids=str)
def test_each_route_copies_whole_stored_rows_of_every_plane(route, kind):
    core = with_kv_cache(
        tiny_core(seed=3, caps=dataclasses.replace(TIER_CAPS, prepared_snapshots=4)), kind)
    row = 4 * 2 * 8 * kind.element_bytes  # page tokens x kv heads x head dim x bytes, a plane
    model = load_native(core, "cpu", host_cache_bytes=4 * row * 2 * 2)
    try:
        buffers = model.backend.buffers
        suffix = {Tier.PAGES: "", Tier.CONTINUATION: ".continuation", Tier.HOST: ".host"}
        planes = [f"L{i}.{p}_cache" for i in range(2) for p in "kv"]
        rng = np.random.default_rng(0)
        for name in (p + t for p in planes for t in suffix.values()):
            assert buffers[name].dtype == kind.held, name
            buffers[name][...] = rng.integers(0, 1 << 8 * kind.element_bytes,
                                              buffers[name].shape)
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


# What only e4m3 has: per-head scale weights, and their calibration at export.


def test_every_plane_and_tier_plane_is_e4m3_with_per_head_scales():
    _, fp8 = _cores(FP8, TIER_CAPS)
    planes = [b for b in fp8.manifest.buffers if b.role == mpb.BUFFER_ROLE_CACHE_PLANE]
    assert len(planes) == 2 * 2 * 3  # 2 layers x K/V x (pages, continuation, host)
    for b in planes:
        layer_plane = b.name.split(".")[0] + "." + b.name.split(".")[1]
        assert b.storage.type == mpb.STORAGE_TYPE_FP8_E4M3
        assert (b.storage.block_elements, b.storage.block_bytes) == (8, 8)
        assert b.storage.scales.buffer == layer_plane + ".scale"
    ops = {k.reference_op for k in fp8.manifest.kernels}
    assert {"rope_kv_write_fp8kv", "attention_prefill_fp8kv", "row_copy_fp8kv"} <= ops
    assert not ops & {"rope_kv_write", "attention_prefill", "row_copy",
                      "attention_decode_split", "attention_decode_split_tuned"}
    scale = next(b for b in fp8.manifest.buffers if b.name == "L0.k_cache.scale")
    assert (list(scale.shape), scale.role) == ([2], mpb.BUFFER_ROLE_WEIGHT)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_calibrated_scales_are_the_prefills_per_head_amax(family):
    """``calibrate_kv_scales`` runs the captured prefill with the NumPy references: its
    scales are exactly ``amax x 1.25 / 448`` per head of the planes the cpu backend holds
    after prefilling the same tokens on the f32 core (gemma3: the sliding-window region's
    planes through their own page table too)."""
    from helios_ignition.kv_cache import calibrate_kv_scales, fp8_planes

    plain = tiny_core(seed=3) if family == "llama" else _gemma3_tiny()
    weights = {b.name: plain.weights[b.weight_resource_id] for b in plain.manifest.buffers
               if b.role == mpb.BUFFER_ROLE_WEIGHT}
    planes = fp8_planes(plain.manifest)
    scales = calibrate_kv_scales(plain.manifest, list(plain.contract.model.graphs), weights,
                                 PROMPT, planes)
    model = load_native(plain, "cpu")
    try:
        Driver(model).generate([PROMPT], 1)
        for plane in planes:
            x = np.abs(model.backend.read_buffer(plane))
            amax = x.reshape(-1, 2, 8).max(axis=(0, 2)).astype(np.float64)
            np.testing.assert_array_equal(scales[plane + ".scale"],
                                          (amax * 1.25 / 448).astype(np.float32))
    finally:
        model.close()
