"""bf16 KV cache planes (``D_TYPE_BF16`` on a cache plane: the plane's element type, no
storage) under the rules startup and ``lint-core`` share, on the tiny core exported with
``apply_kv_bf16`` (every plane and tier plane bf16): sized two bytes an element, tier
planes of the plane's dtype (``cache.tier_row_shape``), and the one capability rule
(``runtime.storage``) holding every launch over a bf16 plane to the ``*_bf16kv`` forms
and those forms to bf16 planes.
"""

from __future__ import annotations

import dataclasses

import pytest
from helios_contract import (
    BufferRoleError,
    ContractError,
    ExtentError,
    LaunchError,
    PreparedContract,
    capability_findings,
    contract_findings,
    stored_nbytes,
)
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.kv_cache import apply_kv_bf16, bf16_planes
from helios_ignition.testing import TINY_CAPACITIES, tiny_core
from helios_tools.capabilities import CPU, CUDA

CAPS = dataclasses.replace(TINY_CAPACITIES, prepared_snapshots=8, host_tier=True,
                           transfer_rows=4)


@pytest.fixture(scope="module")
def bf16_core():
    core = tiny_core(seed=1, caps=CAPS)
    apply_kv_bf16(core.manifest, core.contract.model.graphs)
    return core


def _copy(core):
    manifest = mpb.ExecutionManifest()
    manifest.CopyFrom(core.manifest)
    return core.contract, manifest


def _buffer(manifest, name):
    return next(b for b in manifest.buffers if b.name == name)


def _runtime(manifest, serving, caps):
    return [f for f in capability_findings(serving, manifest, caps)
            if f.rule == "runtime.storage"]


def _launch_of(manifest, op):
    kernels = {k.id: k.reference_op for k in manifest.kernels}
    for g, graph in enumerate(manifest.graphs):
        for j, launch in enumerate(graph.launches):
            if kernels[launch.kernel] == op:
                return g, j, launch
    raise AssertionError(op)


def test_the_bf16_core_is_clean_and_sized_two_bytes_an_element(bf16_core):
    serving, manifest = _copy(bf16_core)
    assert list(contract_findings(serving, manifest)) == []
    for caps in (CPU, CUDA):
        assert _runtime(manifest, serving, caps) == []
    for name in ("L0.k_cache", "L0.k_cache.continuation", "L0.k_cache.host"):
        plane = _buffer(manifest, name)
        assert (plane.dtype, plane.HasField("storage")) == (mpb.D_TYPE_BF16, False)
    plane = _buffer(manifest, "L0.k_cache")
    assert stored_nbytes(plane) == 32 * 4 * 2 * 8 * 2  # pages x tokens x heads x dim x 2
    assert stored_nbytes(plane, leading=1) == 4 * 2 * 8 * 2


def test_restore_programs_address_the_planes_in_bf16_rows(bf16_core):
    """The RESTORE programs' state views (captured over f32 planes) name bf16 rows."""
    views = [a.view for g in bf16_core.contract.model.graphs for a in g.state_accesses
             if a.view.buffer.startswith("L0.k_cache")]
    assert views and {(v.byte_offset, v.row_stride, v.byte_extent) for v in views} == \
        {(0, 4 * 2 * 8 * 2, 4 * 2 * 8 * 2)}


def test_a_tier_plane_of_another_dtype_is_refused(bf16_core):
    serving, manifest = _copy(bf16_core)
    _buffer(manifest, "L0.k_cache.host").dtype = mpb.D_TYPE_F32
    with pytest.raises(ContractError) as info:
        PreparedContract.from_contract(serving, manifest)
    assert (type(info.value), info.value.rule) == (ExtentError, "cache.tier_row_shape")
    assert "must match 'L0.k_cache' (D_TYPE_BF16[4, 2, 8])" in str(info.value)


def test_a_bf16_plane_with_storage_is_refused(bf16_core):
    serving, manifest = _copy(bf16_core)
    for name in ("L0.k_cache", "L0.k_cache.continuation", "L0.k_cache.host"):
        _buffer(manifest, name).storage.CopyFrom(mpb.TensorStorage(
            type=mpb.STORAGE_TYPE_FP8_E4M3, block_elements=8, block_bytes=8))
    findings = list(contract_findings(serving, manifest))
    with pytest.raises(ContractError) as info:
        PreparedContract.from_contract(serving, manifest)
    assert (type(info.value), info.value.rule) == (BufferRoleError, "buffer.storage")
    assert "cache planes of D_TYPE_F32 elements" in str(info.value)
    assert findings[0].rule == "buffer.storage"


def test_an_f32_reader_of_a_bf16_plane_fails_naming_the_op(bf16_core):
    """A launch of the f32 op over bf16 elements (its kernel's reference op changed)."""
    serving, manifest = _copy(bf16_core)
    g, j, launch = _launch_of(manifest, "attention_prefill_bf16kv")
    next(k for k in manifest.kernels if k.id == launch.kernel).reference_op = \
        "attention_prefill"
    for caps in (CPU, CUDA):
        first = _runtime(manifest, serving, caps)[0]
        assert (first.value, first.error) == ("L0.k_cache", LaunchError)
        assert first.path == f"manifest.graphs[{g}].launches[{j}].args[5].buffer.buffer"
        assert "reference op 'attention_prefill' reads cache plane 'L0.k_cache' as f32 " \
            "elements; it is stored as D_TYPE_BF16" in first.detail


def test_a_bf16_reader_of_an_f32_plane_fails(bf16_core):
    serving, manifest = _copy(bf16_core)
    for name in ("L0.k_cache", "L0.k_cache.continuation", "L0.k_cache.host"):
        _buffer(manifest, name).dtype = mpb.D_TYPE_F32
    first = _runtime(manifest, serving, CUDA)[0]
    assert (first.value, first.error) == ("L0.k_cache", LaunchError)
    assert "reads bf16 elements; cache plane 'L0.k_cache' holds f32 elements" in first.detail


def test_an_e4m3_reader_of_a_bf16_plane_fails(bf16_core):
    serving, manifest = _copy(bf16_core)
    g, j, launch = _launch_of(manifest, "attention_prefill_bf16kv")
    next(k for k in manifest.kernels if k.id == launch.kernel).reference_op = \
        "attention_prefill_fp8kv"
    first = _runtime(manifest, serving, CPU)[0]
    assert first.value == "L0.k_cache"
    assert "reads cache plane 'L0.k_cache' as e4m3 codes; it is stored as D_TYPE_BF16" in \
        first.detail


def test_a_backend_without_bf16_planes_refuses_them_in_one_finding(bf16_core):
    serving, manifest = _copy(bf16_core)
    bare = dataclasses.replace(CUDA, cache_dtype_forms={})
    (finding,) = _runtime(manifest, serving, bare)
    assert (finding.value, finding.path) == ("D_TYPE_BF16", "manifest.buffers[" + str(
        [b.name for b in manifest.buffers].index("L0.k_cache")) + "].dtype")
    assert finding.detail.startswith("not executed by the cuda backend: D_TYPE_BF16 cache "
                                     "planes")


def test_planes_with_a_reader_without_a_form_keep_f32():
    """The drafter's feature plane (read by the paged row ops) stays f32."""
    spec = tiny_core(seed=1, speculative_widths=(2,))
    chosen = bf16_planes(spec.manifest)
    assert "D.f_cache" not in chosen and {"L0.k_cache", "D.k_cache"} <= set(chosen)
    apply_kv_bf16(spec.manifest, spec.contract.model.graphs)
    assert _buffer(spec.manifest, "D.f_cache").dtype == mpb.D_TYPE_F32
    serving, manifest = _copy(spec)
    assert list(contract_findings(serving, manifest)) == []
    assert _runtime(manifest, serving, CPU) == []
