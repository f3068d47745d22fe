"""The e4m3 KV cache (``ignition export --kv-cache-dtype fp8``, helios_ignition.kv_cache)
on the cpu backend, on the tiny core: planes held as uint8 codes, the layer-0 keys and
values stored exactly as ``quantize_kv`` of the f32 core's, four times the pages for the
same ``--kv-cache-memory`` (one byte an element against four), generation through the
decode, prefill and TRANSFER programs, and the one ``runtime.storage`` rule refusing a
backend without e4m3 cache planes at startup as lint does.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helios_contract import PreparedContract, capability_findings
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.capture.buffers import weight_resource_id
from helios_ignition.kv_cache import apply_kv_fp8
from helios_ignition.recipe import Capacities
from helios_ignition.testing import TINY_CAPACITIES, tiny_core
from helios_serve.runtime.cache_sizing import CacheSizing
from helios_serve.runtime.driver import Driver
from helios_serve.runtime.errors import UnsupportedContract
from helios_serve.testing.native import load_native
from helios_tools.capabilities import CPU, CUDA
from helios_tools.kernels.kv_fp8 import quantize_kv

CAPS = dataclasses.replace(TINY_CAPACITIES, prepared_snapshots=8, host_tier=True,
                           transfer_rows=4)
PROMPT = [5, 17, 3, 88, 41, 9, 22, 10, 11, 12, 60]


def _cores(caps: Capacities = TINY_CAPACITIES):
    """(the f32 tiny core, the same core with its KV cache stored as e4m3)."""
    plain, fp8 = tiny_core(seed=3, caps=caps), tiny_core(seed=3, caps=caps)
    scales = apply_kv_fp8(fp8.manifest)
    fp8.weights.update({weight_resource_id(n): v for n, v in scales.items()})
    return plain, fp8


def test_every_plane_and_tier_plane_is_e4m3_with_per_head_scales():
    _, fp8 = _cores(CAPS)
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


def test_layer0_codes_are_the_f32_cache_quantized():
    """Layer 0's keys and values depend on the embeddings alone, so after the same prefill
    the e4m3 planes hold exactly ``quantize_kv`` of the f32 core's planes (scale 1.0) at
    every written position."""
    plain, fp8 = _cores()
    pages = {}
    for name, core in (("f32", plain), ("fp8", fp8)):
        model = load_native(core, "cpu")
        try:
            Driver(model).generate([PROMPT], 1)
            backend = model.backend
            pages[name] = (backend.read_buffer("L0.k_cache"), backend.read_buffer("L0.v_cache"))
        finally:
            model.close()
    for f32, codes in zip(pages["f32"], pages["fp8"], strict=True):
        assert codes.dtype == np.uint8 and f32.dtype == np.float32
        written = np.abs(f32).reshape(f32.shape[0], f32.shape[1], -1).max(-1) > 0
        assert written.sum() == len(PROMPT)
        np.testing.assert_array_equal(codes[written],
                                      quantize_kv(f32[written], np.ones(2, np.float32)))


def test_e4m3_cache_generates_through_decode_prefill_and_transfers():
    """Greedy generation on the e4m3 core runs every program kind (prefill chunks,
    decode, RESTORE copies of e4m3 rows) and stays close to the f32 core: the tiny
    model's first greedy tokens agree."""
    plain, fp8 = _cores(CAPS)
    out = {}
    for name, core in (("f32", plain), ("fp8", fp8)):
        model = load_native(core, "cpu")
        try:
            out[name] = Driver(model).generate([PROMPT, PROMPT[:4]], 6)
        finally:
            model.close()
    assert [g[:3] for g in out["fp8"]] == [g[:3] for g in out["f32"]]


def test_an_e4m3_cache_holds_four_times_the_pages_of_f32():
    """The page count is sized from the planes' stored bytes: one byte an element against
    f32's four, for the same --kv-cache-memory."""
    plain, fp8 = _cores()
    budget = 1 << 20
    pages = {}
    for name, core in (("f32", plain), ("fp8", fp8)):
        model = load_native(core, "cpu", cache=CacheSizing(memory_bytes=budget))
        try:
            pages[name] = model.backend.num_pages
        finally:
            model.close()
    page_f32 = 2 * 2 * 4 * 2 * 8 * 4  # layers x K/V x page tokens x kv heads x head dim x 4
    assert pages == {"f32": budget // page_f32, "fp8": budget // (page_f32 // 4)}


def test_a_backend_without_e4m3_planes_fails_startup_and_lint_by_one_rule(monkeypatch):
    """Both backends execute the e4m3 planes; a table without them (a backend that could
    not) refuses the core in one finding naming the type, at lint and at startup."""
    from helios_serve.runtime import native_model

    _, fp8 = _cores()
    prepared = PreparedContract.from_contract(fp8.contract, fp8.manifest)
    for caps in (CPU, CUDA):
        assert [f for f in capability_findings(prepared.serving, prepared.manifest, caps)
                if f.rule == "runtime.storage"] == []
    bare = dataclasses.replace(CPU, cache_storage_forms={}, cache_storage_args={})
    (finding,) = [f for f in capability_findings(prepared.serving, prepared.manifest, bare)
                  if f.rule == "runtime.storage"]
    assert finding.value == "STORAGE_TYPE_FP8_E4M3"
    assert finding.detail.startswith("not executed by the cpu backend: STORAGE_TYPE_FP8_E4M3 "
                                     "cache planes")
    monkeypatch.setitem(native_model.CAPABILITIES, "cpu", bare)
    with pytest.raises(UnsupportedContract) as info:
        load_native(fp8, "cpu")
    assert info.value.rule == "runtime.storage"
    assert str(info.value) == f"unsupported contract: {finding}"


def test_speculative_generation_over_an_e4m3_cache_equals_greedy_decode():
    """The drafter's K/V planes are e4m3 too (its feature plane stays f32); verification
    rows read the e4m3 cache through the same split attention as decode, so speculative
    greedy generation on the e4m3 core equals its plain greedy decode token for token."""
    core = tiny_core(seed=1, speculative_widths=(1, 3), draft_copy=1.0)
    scales = apply_kv_fp8(core.manifest)
    core.weights.update({weight_resource_id(n): v for n, v in scales.items()})
    stored = {b.name for b in core.manifest.buffers if b.HasField("storage")}
    assert {"D.k_cache", "D.v_cache"} <= stored and "D.f_cache" not in stored
    model = load_native(core, "cpu")
    try:
        spec, _ = Driver(model).generate_speculative([PROMPT[:6]], 12, 3)
        plain = Driver(model).generate([PROMPT[:6]], 12)
    finally:
        model.close()
    assert spec == plain


def _gemma3_tiny():
    from helios_ignition.families.gemma3 import Gemma3Shapes

    shapes = Gemma3Shapes(vocab=96, hidden=32, ffn=48, layers=4, heads=4, kv_heads=2,
                          head_dim=8, rope_theta=1e6, rope_local_theta=1e4, rms_eps=1e-6,
                          tied=True, windows=(16, 16, 0, 16), query_scale=8 ** -0.5)
    caps = Capacities(decode_batch=(1, 2, 4), prefill_tokens=(8, 16), prefill_rows=4,
                      context_tokens=128, page_tokens=4, prepared_pages=64)
    return tiny_core(seed=4, shapes=shapes, caps=caps)


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
