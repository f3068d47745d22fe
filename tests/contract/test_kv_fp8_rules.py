"""e4m3 KV cache planes (``Buffer.storage`` on a cache plane): the structural rule
(``buffer.storage``; tier planes stored as their plane: ``cache.tier_row_shape``) and the
one capability rule (``runtime.storage``) startup and ``lint-core`` share, on the tiny
core exported with ``apply_kv_fp8`` (every plane and tier plane e4m3).

Each failing structural case goes through both consumers: ``from_contract`` raises exactly
the first of ``contract_findings``.
"""

from __future__ import annotations

import dataclasses

import pytest
from helios_contract import (
    BufferRoleError,
    ContractError,
    ExtentError,
    LaunchError,
    MissingFieldError,
    PreparedContract,
    UnknownIdentifierError,
    capability_findings,
    contract_findings,
    stored_nbytes,
)
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.kv_cache import apply_kv_fp8, fp8_planes
from helios_ignition.testing import TINY_CAPACITIES, tiny_core
from helios_tools.capabilities import CPU, CUDA

CAPS = dataclasses.replace(TINY_CAPACITIES, prepared_snapshots=8, host_tier=True,
                           transfer_rows=4)


@pytest.fixture(scope="module")
def fp8_core():
    core = tiny_core(seed=1, caps=CAPS)
    apply_kv_fp8(core.manifest)
    return core


def _copy(core):
    manifest = mpb.ExecutionManifest()
    manifest.CopyFrom(core.manifest)
    return core.contract, manifest


def _buffer(manifest, name):
    return next(b for b in manifest.buffers if b.name == name)


def test_the_e4m3_core_is_clean_and_sized_a_byte_an_element(fp8_core):
    serving, manifest = _copy(fp8_core)
    assert list(contract_findings(serving, manifest)) == []
    plane = _buffer(manifest, "L0.k_cache")
    assert stored_nbytes(plane) == 32 * 4 * 2 * 8  # pages x tokens x kv heads x head dim
    assert stored_nbytes(plane, leading=1) == 4 * 2 * 8


def _storages(m):
    """L0.k_cache's storage and its tier planes' (changed alike: the tier rule holds)."""
    return [_buffer(m, n).storage for n in ("L0.k_cache", "L0.k_cache.continuation",
                                            "L0.k_cache.host")]


def _wrong_type(m):
    for st in _storages(m):
        st.type = mpb.STORAGE_TYPE_INT4


def _block_not_a_head(m):
    for st in _storages(m):
        st.block_elements = 4


def _zero_points(m):
    for st in _storages(m):
        st.zero_points.CopyFrom(mpb.SideBuffer(buffer="L0.k_cache.scale",
                                               dtype=mpb.D_TYPE_F32))


def _no_scales(m):
    for st in _storages(m):
        st.ClearField("scales")


def _scales_undeclared(m):
    for st in _storages(m):
        st.scales.buffer = "nowhere"


def _scales_not_a_weight(m):
    for st in _storages(m):
        st.scales.buffer = "L0.v_cache"


def _scales_wrong_shape(m):
    _buffer(m, "L0.k_cache.scale").shape[:] = [3]


def _tier_stored_otherwise(m):
    _buffer(m, "L0.k_cache.host").ClearField("storage")


FAILING = [
    ("wrong-type", _wrong_type, "buffer.storage", BufferRoleError, ".storage.type"),
    ("block-not-a-head", _block_not_a_head, "buffer.storage", ExtentError,
     ".storage.block_bytes"),
    ("zero-points", _zero_points, "buffer.storage", BufferRoleError, ".storage.zero_points"),
    ("no-scales", _no_scales, "buffer.storage", MissingFieldError, ".storage.scales.buffer"),
    ("scales-undeclared", _scales_undeclared, "buffer.storage", UnknownIdentifierError,
     ".storage.scales.buffer"),
    ("scales-not-a-weight", _scales_not_a_weight, "buffer.storage", BufferRoleError,
     ".storage.scales.buffer"),
    ("scales-wrong-shape", _scales_wrong_shape, "buffer.storage", ExtentError,
     ".storage.scales.buffer"),
    ("tier-stored-otherwise", _tier_stored_otherwise, "cache.tier_row_shape", ExtentError,
     ".storage"),
]


@pytest.mark.parametrize(("mutate", "rule", "cls", "suffix"), [c[1:] for c in FAILING],
                         ids=[c[0] for c in FAILING])
def test_plane_storage_rejected_by_startup_and_lint_alike(fp8_core, mutate, rule, cls,
                                                          suffix):
    serving, manifest = _copy(fp8_core)
    mutate(manifest)
    findings = list(contract_findings(serving, manifest))
    with pytest.raises(ContractError) as info:
        PreparedContract.from_contract(serving, manifest)
    error = info.value
    assert (type(error), error.rule) == (cls, rule)
    assert error.path.endswith(suffix)
    assert (findings[0].error, findings[0].path, findings[0].rule) == (cls, error.path, rule)


def test_scales_shape_message_names_the_heads(fp8_core):
    serving, manifest = _copy(fp8_core)
    _scales_wrong_shape(manifest)
    with pytest.raises(ExtentError, match=r"must have shape \[2\] \(one per kv head\)"):
        PreparedContract.from_contract(serving, manifest)


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


def test_an_f32_reader_of_an_e4m3_plane_fails_naming_the_op(fp8_core):
    """A launch of the f32 op over e4m3 codes (its kernel id's reference op changed)."""
    serving, manifest = _copy(fp8_core)
    g, j, launch = _launch_of(manifest, "attention_prefill_fp8kv")
    kernel = next(k for k in manifest.kernels if k.id == launch.kernel)
    kernel.reference_op = "attention_prefill"
    for caps in (CPU, CUDA):
        findings = _runtime(manifest, serving, caps)
        assert findings and findings[0].value == "L0.k_cache"
        assert findings[0].path == f"manifest.graphs[{g}].launches[{j}].args[5].buffer.buffer"
        assert "reference op 'attention_prefill' reads cache plane 'L0.k_cache' as f32 " \
            "elements; it is stored as STORAGE_TYPE_FP8_E4M3" in findings[0].detail
        assert findings[0].error is LaunchError


def test_an_e4m3_reader_of_an_f32_plane_fails(fp8_core):
    serving, manifest = _copy(fp8_core)
    for name in ("L0.k_cache", "L0.k_cache.continuation", "L0.k_cache.host"):
        _buffer(manifest, name).ClearField("storage")
    (first, *_) = _runtime(manifest, serving, CPU)
    assert first.value == "L0.k_cache"
    assert "reads e4m3 codes; cache plane 'L0.k_cache' holds f32 elements" in first.detail


def test_a_launch_must_read_its_planes_own_scales(fp8_core):
    serving, manifest = _copy(fp8_core)
    g, j, launch = _launch_of(manifest, "attention_prefill_fp8kv")
    launch.args[7].buffer.buffer = "L0.v_cache.scale"  # k_scale of L0.k_cache
    (finding,) = _runtime(manifest, serving, CUDA)
    assert (finding.path, finding.value) == (
        f"manifest.graphs[{g}].launches[{j}].args[7].buffer.buffer", "L0.v_cache.scale")
    assert "must read cache plane 'L0.k_cache''s own scales 'L0.k_cache.scale'" in \
        finding.detail


def test_planes_with_a_reader_without_a_form_keep_f32(fp8_core):
    """The drafter's feature plane (read by paged_row ops) is no e4m3 candidate; in the
    tiny core every plane is."""
    core = tiny_core(seed=1, caps=CAPS)
    assert fp8_planes(core.manifest) == ["L0.k_cache", "L0.v_cache", "L1.k_cache",
                                         "L1.v_cache"]
    spec = tiny_core(seed=1, speculative_widths=(2,))
    chosen = fp8_planes(spec.manifest)
    assert "D.f_cache" not in chosen and "L0.k_cache" in chosen
