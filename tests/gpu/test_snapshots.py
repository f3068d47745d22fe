"""Snapshots and the host tier on the cuda backend (SmolLM2 bf16 core for this GPU).

- every RESTORE program (route) copies whole rows of every plane, device planes and the
  pinned, device-mapped host-tier planes alike, and nothing else;
- logits after a restore equal logits computed without a snapshot (cuda vs cuda with
  snapshots off; and the greedy tokens equal the CPU backend's);
- pages evicted to the host tier come back by copy with their bytes (logits again);
- no allocation, module load or capture while serving any of it.

Run: `python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_snapshots.py` on the
GPU machine (bench/gpu_device.sh snap).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helios_serve.engine.plan import Route, RowCopy, StepKind, StepPlan, Tier

pytestmark = pytest.mark.gpu
HOST_ROWS = 256
PROMPT = list(range(300, 350))  # 50 tokens: three pages of 16 and a tail of 2


def _row_bytes(core) -> int:
    """Bytes of one host-tier row: one page-shaped row of every paged plane."""
    from helios_contract.tiers import storage_tiers

    buffers = {b.name: b for b in core.manifest.buffers}
    return sum(int(np.prod(buffers[p].shape[1:])) * 4
               for p in storage_tiers(core.contract.model.cache).pages)


def _open(core_path):
    from helios_tools.core import load_public_key, open_core

    path, key = core_path
    return open_core(path, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])


@pytest.fixture(scope="module")
def cuda(core_path):
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.testing.native import load_native

    core = _open(core_path)
    # 4 snapshot rows: the fillers of the host-tier test push request 1's snapshot out of
    # continuation storage into the host tier (LRU), so it comes back by copy too.
    model = load_native(core, "cuda", cache=CacheSizing(num_pages=96), snapshots=4,
                        host_cache_bytes=HOST_ROWS * _row_bytes(core))
    yield model
    model.close()


def _planes(model, tier: Tier) -> list[str]:
    suffix = {Tier.PAGES: "", Tier.CONTINUATION: ".continuation", Tier.HOST: ".host"}[tier]
    layers = sum(1 for b in model.prepared.manifest.buffers if b.name.endswith(".k_cache"))
    return [f"L{i}.{p}_cache{suffix}" for i in range(layers) for p in "kv"]


@pytest.mark.parametrize("route", [
    Route(Tier.PAGES, Tier.CONTINUATION), Route(Tier.CONTINUATION, Tier.PAGES),
    Route(Tier.PAGES, Tier.HOST), Route(Tier.HOST, Tier.PAGES),
    Route(Tier.CONTINUATION, Tier.HOST)], ids=str)
def test_each_route_copies_whole_rows(cuda, route):
    b = cuda.backend
    rng = np.random.default_rng(7)
    src_planes, dst_planes = _planes(cuda, route.source)[:4], _planes(cuda, route.destination)[:4]
    before = {}
    for name in set(src_planes + dst_planes):
        values = rng.standard_normal(b.read_buffer(name).shape).astype(np.float32)
        b.write_buffer(name, values)
        before[name] = values
    copies = (RowCopy(2, 1), RowCopy(0, 3), RowCopy(3, 0))  # rows < 4: the snapshot rows
    counters = dict(b.counters)
    cuda.execute(StepPlan(StepKind.TRANSFER, (), copies=copies, route=route))
    for src, dst in zip(src_planes, dst_planes, strict=True):
        want = before[dst].copy()
        for c in copies:
            want[c.destination] = before[src][c.source]
        np.testing.assert_array_equal(b.read_buffer(dst), want)
        np.testing.assert_array_equal(b.read_buffer(src), before[src])
    for key in ("device_allocations", "host_allocations", "graph_captures", "module_loads"):
        assert b.counters.get(key) == counters.get(key), key


def _turn_two(model, follow_tokens=(500, 501, 502)):
    from helios_serve.testing.serial import Serial

    run = Serial(model)
    run.add(1, PROMPT, 4)
    run.run()
    follow = PROMPT + run.out[1] + list(follow_tokens)
    run.add(2, follow, 6)
    run.run()
    return run, follow


def test_logits_after_a_restore_equal_logits_without_a_snapshot(cuda, core_path):
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.testing.native import load_native
    from helios_serve.testing.serial import Serial

    run, follow = _turn_two(cuda)
    assert run.reused[2] == 53 and run.copies(Route(Tier.CONTINUATION, Tier.PAGES)) == 1
    core = _open(core_path)
    fresh_model = load_native(core, "cuda", cache=CacheSizing(num_pages=96), snapshots=0)
    try:
        fresh = Serial(fresh_model)
        fresh.add(2, follow, 6)
        fresh.run()
    finally:
        fresh_model.close()
    assert fresh.reused[2] == 0
    got, want = np.stack(run.logits[2]), np.stack(fresh.logits[2])
    assert run.out[2][:4] == fresh.out[2][:4]
    print("restored vs fresh max |logit diff|:", float(np.abs(got - want).max()))
    np.testing.assert_allclose(got[0], want[0], atol=5e-2, rtol=0)
    cpu = load_native(core, "cpu")
    try:
        cpu_run, _ = _turn_two(cpu)
    finally:
        cpu.close()
    assert cpu_run.reused[2] == 53
    assert cpu_run.out[2][0] == run.out[2][0]  # bf16 weights, f32 vs cuda accumulation order


def test_evicted_pages_come_back_from_the_host_tier(cuda):
    from helios_serve.testing.serial import Serial

    run = Serial(cuda)
    shared = list(range(600, 650))
    run.add(1, shared, 4)
    run.run()
    follow = shared + run.out[1] + [7, 8]
    want = Serial(cuda)
    rid = 10
    while run.sched.cache.match(follow).device.page_ids:  # push its pages to the host tier
        run.add(rid, list(range(1000 + 60 * rid, 1000 + 60 * rid + 60)), 2)
        run.run()
        rid += 1
    swapped = run.sched.stats().host_swap_ins
    run.add(2, follow, 4)
    run.run()
    assert run.reused[2] == 53 and run.sched.stats().host_swap_ins - swapped == 4
    want.add(2, follow, 4)  # a second scheduler over the same device: no cache to reuse
    want.run()
    assert want.reused[2] == 0
    assert run.out[2] == want.out[2]
    np.testing.assert_allclose(np.stack(run.logits[2])[0], np.stack(want.logits[2])[0],
                               atol=5e-2, rtol=0)
