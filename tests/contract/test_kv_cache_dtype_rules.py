"""Stored KV cache planes under the rules startup and ``lint-core`` share, on the tiny core
exported with each kind (tests/kv_cache_kinds.py: every plane and tier plane e4m3, with
``Buffer.storage`` on an f32 plane, or bf16, the plane's dtype and no storage): sized by
the kind's element bytes, and the one capability rule (``runtime.storage``) holding every
launch over a stored plane to the kind's forms and those forms to the kind's planes.
Then what one kind alone has: e4m3's storage and scales under the structural rule
(``buffer.storage``; tier planes stored as their plane: ``cache.tier_row_shape``), and
bf16's dtype on the tier planes and in the RESTORE programs' rows.

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
from helios_ignition.testing import tiny_core
from helios_tools.capabilities import CPU, CUDA

from tests.kv_cache_kinds import BF16, FP8, KINDS, TIER_CAPS, each_kind, with_kv_cache

# L0.k_cache and its tier planes (a change to the plane made to all three keeps the tier
# rule holding)
TIERED = ("L0.k_cache", "L0.k_cache.continuation", "L0.k_cache.host")


@pytest.fixture(scope="module")
def cores():
    """The tiny core with its KV cache stored as each kind (tests copy before changing)."""
    return {kind: with_kv_cache(tiny_core(seed=1, caps=TIER_CAPS), kind) for kind in KINDS}


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


@each_kind
def test_the_stored_core_is_clean_and_sized_by_its_element_bytes(cores, kind):
    serving, manifest = _copy(cores[kind])
    assert list(contract_findings(serving, manifest)) == []
    for caps in (CPU, CUDA):
        assert _runtime(manifest, serving, caps) == []
    for name in TIERED:
        plane = _buffer(manifest, name)
        assert (plane.dtype, plane.HasField("storage")) == kind.declared
    plane = _buffer(manifest, "L0.k_cache")
    # pages x tokens x kv heads x head dim x bytes
    assert stored_nbytes(plane) == 32 * 4 * 2 * 8 * kind.element_bytes
    assert stored_nbytes(plane, leading=1) == 4 * 2 * 8 * kind.element_bytes


@each_kind
def test_an_f32_reader_of_a_stored_plane_fails_naming_the_op(cores, kind):
    """A launch of the f32 op over stored elements (its kernel's reference op changed)."""
    serving, manifest = _copy(cores[kind])
    g, j, launch = _launch_of(manifest, kind.forms["attention_prefill"])
    next(k for k in manifest.kernels if k.id == launch.kernel).reference_op = \
        "attention_prefill"
    for caps in (CPU, CUDA):
        first = _runtime(manifest, serving, caps)[0]
        assert (first.value, first.error) == ("L0.k_cache", LaunchError)
        assert first.path == f"manifest.graphs[{g}].launches[{j}].args[5].buffer.buffer"
        assert "reference op 'attention_prefill' reads cache plane 'L0.k_cache' as f32 " \
            f"elements; it is stored as {kind.type_name}" in first.detail


@each_kind
def test_a_stored_reader_of_an_f32_plane_fails(cores, kind):
    serving, manifest = _copy(cores[kind])
    for name in TIERED:
        plane = _buffer(manifest, name)
        plane.dtype = mpb.D_TYPE_F32
        plane.ClearField("storage")
    for caps in (CPU, CUDA):
        first = _runtime(manifest, serving, caps)[0]
        assert (first.value, first.error) == ("L0.k_cache", LaunchError)
        assert f"reads {kind.elements}; cache plane 'L0.k_cache' holds f32 elements" in \
            first.detail


@each_kind
def test_a_backend_without_the_kind_refuses_it_in_one_finding(cores, kind):
    serving, manifest = _copy(cores[kind])
    bare = dataclasses.replace(CUDA, **kind.bare)
    (finding,) = _runtime(manifest, serving, bare)
    plane = [b.name for b in manifest.buffers].index("L0.k_cache")
    assert (finding.value, finding.path) == (kind.type_name,
                                             f"manifest.buffers[{plane}].{kind.field}")
    assert finding.detail.startswith(f"not executed by the cuda backend: {kind.type_name} "
                                     "cache planes")


@each_kind
def test_planes_with_a_reader_without_a_form_keep_f32(kind):
    """The drafter's feature plane (read by the paged row ops) is no candidate and stays
    f32; in the tiny core every plane is one."""
    core = tiny_core(seed=1, caps=TIER_CAPS)
    assert kind.planes(core.manifest) == ["L0.k_cache", "L0.v_cache", "L1.k_cache",
                                          "L1.v_cache"]
    spec = tiny_core(seed=1, speculative_widths=(2,))
    chosen = kind.planes(spec.manifest)
    assert "D.f_cache" not in chosen and {"L0.k_cache", "D.k_cache"} <= set(chosen)
    with_kv_cache(spec, kind)
    feature = _buffer(spec.manifest, "D.f_cache")
    assert (feature.dtype, feature.HasField("storage")) == (mpb.D_TYPE_F32, False)
    serving, manifest = _copy(spec)
    assert list(contract_findings(serving, manifest)) == []
    assert _runtime(manifest, serving, CPU) == []


# e4m3 alone: the storage and its per-head scales.


def _storages(m):
    """L0.k_cache's storage and its tier planes' (changed alike: the tier rule holds)."""
    return [_buffer(m, n).storage for n in TIERED]


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
def test_plane_storage_rejected_by_startup_and_lint_alike(cores, mutate, rule, cls, suffix):
    serving, manifest = _copy(cores[FP8])
    mutate(manifest)
    findings = list(contract_findings(serving, manifest))
    with pytest.raises(ContractError) as info:
        PreparedContract.from_contract(serving, manifest)
    error = info.value
    assert (type(error), error.rule) == (cls, rule)
    assert error.path.endswith(suffix)
    assert (findings[0].error, findings[0].path, findings[0].rule) == (cls, error.path, rule)


def test_scales_shape_message_names_the_heads(cores):
    serving, manifest = _copy(cores[FP8])
    _scales_wrong_shape(manifest)
    with pytest.raises(ExtentError, match=r"must have shape \[2\] \(one per kv head\)"):
        PreparedContract.from_contract(serving, manifest)


def test_a_launch_must_read_its_planes_own_scales(cores):
    serving, manifest = _copy(cores[FP8])
    g, j, launch = _launch_of(manifest, "attention_prefill_fp8kv")
    launch.args[7].buffer.buffer = "L0.v_cache.scale"  # k_scale of L0.k_cache
    (finding,) = _runtime(manifest, serving, CUDA)
    assert (finding.path, finding.value) == (
        f"manifest.graphs[{g}].launches[{j}].args[7].buffer.buffer", "L0.v_cache.scale")
    assert "must read cache plane 'L0.k_cache''s own scales 'L0.k_cache.scale'" in \
        finding.detail


# bf16 alone: the dtype is the plane's own, so its tier planes and RESTORE rows carry it.


def test_restore_programs_address_the_planes_in_bf16_rows(cores):
    """The RESTORE programs' state views (captured over f32 planes) name bf16 rows."""
    views = [a.view for g in cores[BF16].contract.model.graphs for a in g.state_accesses
             if a.view.buffer.startswith("L0.k_cache")]
    assert views and {(v.byte_offset, v.row_stride, v.byte_extent) for v in views} == \
        {(0, 4 * 2 * 8 * 2, 4 * 2 * 8 * 2)}


def test_a_tier_plane_of_another_dtype_is_refused(cores):
    serving, manifest = _copy(cores[BF16])
    _buffer(manifest, "L0.k_cache.host").dtype = mpb.D_TYPE_F32
    with pytest.raises(ContractError) as info:
        PreparedContract.from_contract(serving, manifest)
    assert (type(info.value), info.value.rule) == (ExtentError, "cache.tier_row_shape")
    assert "must match 'L0.k_cache' (D_TYPE_BF16[4, 2, 8])" in str(info.value)


def test_a_bf16_plane_with_storage_is_refused(cores):
    serving, manifest = _copy(cores[BF16])
    for name in TIERED:
        _buffer(manifest, name).storage.CopyFrom(mpb.TensorStorage(
            type=mpb.STORAGE_TYPE_FP8_E4M3, block_elements=8, block_bytes=8))
    findings = list(contract_findings(serving, manifest))
    with pytest.raises(ContractError) as info:
        PreparedContract.from_contract(serving, manifest)
    assert (type(info.value), info.value.rule) == (BufferRoleError, "buffer.storage")
    assert "cache planes of D_TYPE_F32 elements" in str(info.value)
    assert findings[0].rule == "buffer.storage"


def test_an_e4m3_reader_of_a_bf16_plane_fails(cores):
    serving, manifest = _copy(cores[BF16])
    g, j, launch = _launch_of(manifest, "attention_prefill_bf16kv")
    next(k for k in manifest.kernels if k.id == launch.kernel).reference_op = \
        "attention_prefill_fp8kv"
    first = _runtime(manifest, serving, CPU)[0]
    assert first.value == "L0.k_cache"
    assert "reads cache plane 'L0.k_cache' as e4m3 codes; it is stored as D_TYPE_BF16" in \
        first.detail
