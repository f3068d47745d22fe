"""What the cuda backend checks against the free device memory before it allocates
anything (CudaBackend._device_asks + cache_sizing.check_fits), on CPU: no driver is
needed to assemble the asks from the manifest, only to read cuMemGetInfo (tests/gpu/
test_startup_memory.py runs the whole startup on the device)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from helios_contract import PreparedContract
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.testing import TINY_CAPACITIES, tiny_core
from helios_serve.config import format_bytes
from helios_serve.runtime.cache_sizing import (
    DEVICE_MEMORY,
    CacheSizing,
    CacheSizingError,
    MemoryAsk,
    check_fits,
)
from helios_serve.runtime.cuda_backend import STORED_DTYPE, CudaBackend
from helios_serve.runtime.tiers import choose_tiers

SCRATCH = 128  # global scratch bytes per program given to every kernel's sm_90 binary


@pytest.fixture(scope="module")
def core():
    caps = dataclasses.replace(TINY_CAPACITIES, prepared_snapshots=4, host_tier=True,
                               transfer_rows=4)
    core = tiny_core(caps=caps)
    for kernel in core.manifest.kernels:
        kernel.binaries.append(mpb.KernelBinary(target="sm_90", resource_id="kernels.sm_90",
                                                entry_name=kernel.id,
                                                global_scratch_bytes=SCRATCH))
    return core


def _asks(core, snapshots, cache):
    """CudaBackend.__init__'s split of the buffers, then its asks (no driver call)."""
    prepared = PreparedContract.from_contract(core.contract, core.manifest)
    manifest = core.manifest
    tiers = choose_tiers(prepared.serving.model.cache, list(prepared.graphs.values()),
                         {b.name: b for b in manifest.buffers},
                         prepared_snapshots=prepared.serving.prepared_snapshots,
                         snapshots=snapshots, host_cache_bytes=0)
    backend = object.__new__(CudaBackend)
    backend.target, backend._functions = "sm_90", {}
    backend._kernels = {k.id: k for k in manifest.kernels}
    rows = tiers.rows.rows
    planes = [b for b in manifest.buffers if b.role == mpb.BUFFER_ROLE_CACHE_PLANE
              and b.name not in rows]
    others = [b for b in manifest.buffers if b.role != mpb.BUFFER_ROLE_CACHE_PLANE
              or b.name in rows and b.name not in tiers.rows.host]
    backend._shapes = {b.name: (rows[b.name], *b.shape[1:]) if b.name in rows
                       else tuple(b.shape) for b in others}
    programs = [*manifest.graphs, *manifest.tuning.producers]
    asks = backend._device_asks(others, planes, programs, tiers.rows, cache,
                                tiers.snapshot_option)
    return asks, planes, others, programs, rows


def _nbytes(decl, rows=None) -> int:
    shape = [int(s) for s in decl.shape]
    if rows is not None:
        shape[0] = rows
    return math.prod(shape) * STORED_DTYPE[decl.dtype].itemsize


def test_the_model_scratch_snapshot_rows_and_a_fixed_cache_are_asked_in_order(core):
    asks, planes, others, programs, rows = _asks(core, 1000, CacheSizing(num_pages=50))
    model = sum(_nbytes(d) for d in others if d.name not in rows)
    # one global-scratch allocation of SCRATCH per program of every launch (capture)
    scratch = sum(SCRATCH * math.prod(int(x) for x in launch.grid)
                  for g in programs for launch in g.launches)
    snapshot = sum(_nbytes(d, 1000) for d in others if d.name in rows)
    page = sum(_nbytes(d) // int(d.shape[0]) for d in planes)
    assert snapshot > 0 and scratch > 0 and page > 0
    assert asks == [MemoryAsk("the core", "the model", model, "weights and other buffers"),
                    MemoryAsk("the core", "kernel scratch", scratch),
                    MemoryAsk("--snapshots 1000", "snapshot storage", snapshot, "1000 rows"),
                    MemoryAsk("--num-pages 50", "the KV cache", 50 * page, "50 pages")]
    total = model + scratch + snapshot + 50 * page
    check_fits(asks, memory=DEVICE_MEMORY, available=total)  # exactly fits
    with pytest.raises(CacheSizingError) as info:
        check_fits(asks, memory=DEVICE_MEMORY, available=total - 1)
    assert str(info.value) == (
        f"--num-pages 50: the KV cache (50 pages) needs {50 * page} bytes (50.0 KiB) but free "
        f"device memory has {50 * page - 1} bytes (50.0 KiB) available after {model} bytes "
        f"({format_bytes(model)}) for the model and {scratch} bytes ({format_bytes(scratch)}) "
        f"for kernel scratch and {snapshot} bytes ({format_bytes(snapshot)}) for snapshot "
        "storage")
    with pytest.raises(CacheSizingError) as info:
        check_fits(asks, memory=DEVICE_MEMORY, available=model + scratch + snapshot - 1)
    assert str(info.value).startswith(
        f"--snapshots 1000: snapshot storage (1000 rows) needs {snapshot} bytes")


def test_the_prepared_snapshot_rows_and_a_fraction_of_what_is_left(core):
    asks, *_ = _asks(core, None, CacheSizing())  # cuda default: 0.9 of what is left
    assert [(a.option, a.what, a.detail) for a in asks] == [
        ("the core", "the model", "weights and other buffers"),
        ("the core", "kernel scratch", ""),
        ("the core's prepared_snapshots 4", "snapshot storage", "4 rows")]
    asks, *_ = _asks(core, 0, CacheSizing(memory_bytes=2**20))
    assert asks[2].nbytes == 0 and asks[3].option == "--kv-cache-memory 1048576"


def test_a_kv_cache_memory_that_holds_no_page_fails_before_anything_is_allocated(core):
    with pytest.raises(CacheSizingError, match=r"^the KV cache budget \(--kv-cache-memory 10: "
                                               r"10 B\) holds no page; one page of every cache plane needs "
                                               r"1\.0 KiB$"):
        _asks(core, None, CacheSizing(memory_bytes=10))


def test_a_window_region_asks_its_pool_apart_from_the_kv_cache():
    """The sliding-window planes keep their manifest extent (their own pool): one ask of
    their own, and the paged KV cache's page counts the global layers' planes only."""
    from tests.serve.runtime.test_window_region import CAPS, SHAPES

    core = tiny_core(seed=4, shapes=SHAPES, caps=CAPS)
    for kernel in core.manifest.kernels:
        kernel.binaries.append(mpb.KernelBinary(target="sm_90", resource_id="kernels.sm_90",
                                                entry_name=kernel.id,
                                                global_scratch_bytes=SCRATCH))
    asks, planes, others, _, rows = _asks(core, None, CacheSizing(num_pages=50))
    window = [d for d in others if d.name in rows]
    assert sorted(d.name for d in window) == sorted(core.contract.model.cache.regions[1].planes)
    assert [d.name for d in planes] == ["L2.k_cache", "L2.v_cache"]
    assert asks[3] == MemoryAsk("the core", "sliding-window pages",
                                sum(_nbytes(d) for d in window), "36 pages")
    assert asks[4] == MemoryAsk("--num-pages 50", "the KV cache",
                                50 * sum(_nbytes(d) // int(d.shape[0]) for d in planes),
                                "50 pages")


def test_an_e4m3_cache_asks_a_quarter_of_the_bytes_per_page_and_row(core):
    """--kv-cache-dtype fp8 (helios_ignition.kv_cache): pages and snapshot rows are sized
    from the planes' stored bytes, one byte an element: a quarter of the f32 cache's, so a
    --kv-cache-memory budget holds four times the pages on cuda too."""
    from helios_ignition.capture.buffers import weight_resource_id
    from helios_ignition.kv_cache import apply_kv_fp8

    fp8 = dataclasses.replace(core, manifest=type(core.manifest)(), weights=dict(core.weights))
    fp8.manifest.CopyFrom(core.manifest)
    scales = apply_kv_fp8(fp8.manifest)
    fp8.weights.update({weight_resource_id(n): v for n, v in scales.items()})
    for kernel in fp8.manifest.kernels:  # the rewritten launches' new variants
        if not kernel.binaries:
            kernel.binaries.append(mpb.KernelBinary(target="sm_90", resource_id="k",
                                                    entry_name=kernel.id,
                                                    global_scratch_bytes=SCRATCH))
    plain, _, _, _, _ = _asks(core, 1000, CacheSizing(num_pages=50))
    coded, _, _, _, _ = _asks(fp8, 1000, CacheSizing(num_pages=50))
    assert coded[3].nbytes * 4 == plain[3].nbytes  # the KV cache: 50 pages
    assert coded[2].nbytes * 4 == plain[2].nbytes  # snapshot storage: 1000 rows
    assert coded[0].nbytes == plain[0].nbytes + sum(v.nbytes for v in scales.values())
    budget = CacheSizing(memory_bytes=2**20)
    page = plain[3].nbytes // 50
    assert budget._choose("cuda", page // 4, 32, 0).num_pages == \
        4 * budget._choose("cuda", page, 32, 0).num_pages


def test_a_bf16_cache_asks_half_the_bytes_per_page_and_row(core):
    """--kv-cache-dtype bf16 (helios_ignition.kv_cache.apply_kv_bf16): pages and snapshot
    rows of D_TYPE_BF16 planes take two bytes an element, half the f32 cache's, so a
    --kv-cache-memory budget (or fraction) holds twice the pages on cuda."""
    from helios_contract.schema import contract_pb2 as cpb
    from helios_ignition.kv_cache import apply_kv_bf16

    contract = cpb.ServingContract()
    contract.CopyFrom(core.contract)
    bf16 = dataclasses.replace(core, contract=contract, manifest=type(core.manifest)())
    bf16.manifest.CopyFrom(core.manifest)
    apply_kv_bf16(bf16.manifest, bf16.contract.model.graphs)
    for kernel in bf16.manifest.kernels:  # the rewritten launches' new variants
        if not kernel.binaries:
            kernel.binaries.append(mpb.KernelBinary(target="sm_90", resource_id="k",
                                                    entry_name=kernel.id,
                                                    global_scratch_bytes=SCRATCH))
    plain, _, _, _, _ = _asks(core, 1000, CacheSizing(num_pages=50))
    halved, _, _, _, _ = _asks(bf16, 1000, CacheSizing(num_pages=50))
    assert halved[3].nbytes * 2 == plain[3].nbytes  # the KV cache: 50 pages
    assert halved[2].nbytes * 2 == plain[2].nbytes  # snapshot storage: 1000 rows
    assert halved[0].nbytes == plain[0].nbytes  # the model: no side buffers
    budget = CacheSizing(memory_bytes=2**20)
    assert budget._choose("cuda", halved[3].nbytes // 50, 32, 0).num_pages == \
        2 * budget._choose("cuda", plain[3].nbytes // 50, 32, 0).num_pages
