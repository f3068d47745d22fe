"""Snapshots and the host tier on the CPU backend: the captured RESTORE programs move the
real KV bytes, and logits after a restore equal logits computed without a snapshot
(checked against helios_ignition.testing.dense_forward, an independent plain NumPy
forward with a contiguous cache)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helios_ignition.testing import TINY_CAPACITIES, TINY_SHAPES, dense_forward, tiny_core
from helios_serve.engine.plan import Route, RowCopy, StepKind, StepPlan, Tier
from helios_serve.runtime.errors import RuntimeLoadError
from helios_serve.scheduler import TransferCost
from helios_serve.testing.native import load_native
from helios_serve.testing.serial import Serial

CAPS = replace(TINY_CAPACITIES, prepared_snapshots=4, host_tier=True, transfer_rows=4)
PAGE_ROW_BYTES = 4 * 2 * 8 * 4  # page_tokens x kv_heads x head_dim x f32, one plane
HOST_ROW_BYTES = PAGE_ROW_BYTES * 2 * TINY_SHAPES.layers  # k and v of every layer
CHEAP = TransferCost(transfer_step_s=1e-9, page_copy_s=1e-9, prefill_tokens_per_s=1.0)


@pytest.fixture(scope="module")
def core():
    return tiny_core(seed=3, caps=CAPS)


def _dense(core, tokens) -> np.ndarray:
    return dense_forward(core.weights, TINY_SHAPES, list(tokens))


RESTORE = Route(Tier.CONTINUATION, Tier.PAGES)
CAPTURE = Route(Tier.PAGES, Tier.CONTINUATION)
PAGES_OUT = Route(Tier.PAGES, Tier.HOST)
HOST_IN = Route(Tier.HOST, Tier.PAGES)


def test_logits_after_a_restore_equal_logits_without_a_snapshot(core):
    prompt = [5, 9, 11, 3, 7, 21, 40, 2, 17]  # 9 tokens
    run = Serial(load_native(core, "cpu"), CHEAP)
    run.add(1, prompt, 3)  # 12 tokens; committed 11: two pages and a 3-token tail
    run.run()
    assert run.sched.stats().snapshot_publications == 1 and run.copies(CAPTURE) == 1
    follow = prompt + run.out[1] + [44, 45, 46]
    run.add(2, follow, 4)
    run.run()
    assert run.reused[2] == 11 and run.copies(RESTORE) == 1
    fresh = Serial(load_native(core, "cpu", snapshots=0), CHEAP)
    fresh.add(2, follow, 4)
    fresh.run()
    assert fresh.reused[2] == 0
    assert run.out[2] == fresh.out[2]
    want = _dense(core, follow + run.out[2][:3])
    for k in range(4):  # the restored request's every sampling step
        np.testing.assert_allclose(run.logits[2][k], want[len(follow) - 1 + k], atol=2e-5,
                                   rtol=0)
        np.testing.assert_allclose(run.logits[2][k], fresh.logits[2][k], atol=2e-5, rtol=0)


def test_host_tier_pages_come_back_with_their_bytes(core):
    model = load_native(core, "cpu", host_cache_bytes=64 * HOST_ROW_BYTES)
    run = Serial(model, CHEAP)
    assert model.manifests.host_rows == 64
    shared = [3, 1, 4, 1, 5, 9, 2, 6, 5]
    run.add(1, shared, 2)
    run.run()
    # Fill the device cache with other prompts until request 1's pages have all moved out.
    follow = shared + run.out[1] + [70, 71]
    rid = 10
    while run.sched.cache.match(follow).device.page_ids:
        run.add(rid, [60 + rid % 30, 61, 62, 63, 64, 65, 66, 67], 2)
        run.run()
        rid += 1
    swapped = run.sched.stats().host_swap_ins
    run.add(2, follow, 3)
    run.run()
    assert run.reused[2] == 10  # both pages and the 2-token tail, from the host tier
    assert run.sched.stats().host_swap_ins - swapped == 3
    want = _dense(core, follow + run.out[2][:2])
    for k in range(3):
        np.testing.assert_allclose(run.logits[2][k], want[len(follow) - 1 + k], atol=2e-5,
                                   rtol=0)


@pytest.mark.parametrize("route", [CAPTURE, RESTORE, PAGES_OUT, HOST_IN,
                                   Route(Tier.CONTINUATION, Tier.HOST)], ids=str)
def test_each_route_copies_whole_rows_of_every_plane(core, route):
    model = load_native(core, "cpu", host_cache_bytes=4 * HOST_ROW_BYTES)
    buffers = model.backend.buffers
    suffix = {Tier.PAGES: "", Tier.CONTINUATION: ".continuation", Tier.HOST: ".host"}
    planes = [f"L{i}.{p}_cache" for i in range(TINY_SHAPES.layers) for p in "kv"]
    rng = np.random.default_rng(0)
    for plane in planes:
        for tier in suffix.values():
            buffers[plane + tier][...] = rng.standard_normal(buffers[plane + tier].shape)
    before = {p + t: buffers[p + t].copy() for p in planes for t in suffix.values()}
    copies = (RowCopy(2, 1), RowCopy(0, 3))
    model.execute(StepPlan(StepKind.TRANSFER, (), copies=copies, route=route))
    for plane in planes:
        src, dst = plane + suffix[route.source], plane + suffix[route.destination]
        want = before[dst].copy()
        for c in copies:
            want[c.destination] = before[src][c.source]
        np.testing.assert_array_equal(buffers[dst], want)
        np.testing.assert_array_equal(buffers[src], before[src])


def test_capacities_the_core_does_not_declare_fail_startup():
    plain = tiny_core(seed=3)
    with pytest.raises(RuntimeLoadError, match="--host-cache-bytes 4096: this core declares no "
                                               "host tier"):
        load_native(plain, "cpu", host_cache_bytes=4096)
    with pytest.raises(RuntimeLoadError, match="--snapshots 4: this core declares no "
                                               "continuation storage"):
        load_native(plain, "cpu", snapshots=4)
    full = tiny_core(seed=3, caps=CAPS)
    with pytest.raises(RuntimeLoadError, match="holds no host-tier row"):
        load_native(full, "cpu", host_cache_bytes=HOST_ROW_BYTES - 1)
    with pytest.raises(RuntimeLoadError, match="--snapshots must be >= 0"):
        load_native(full, "cpu", snapshots=-1)
    geometry = load_native(plain, "cpu").manifests
    assert (geometry.snapshot_rows, geometry.host_rows, geometry.routes) == (0, 0, ())
