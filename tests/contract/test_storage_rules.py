"""Quantized tensor storage (manifest ``Buffer.storage``): the structural rule
(helios_contract._rules_manifest, ``buffer.storage``) and the one capability rule
(``runtime.storage``) that startup and ``lint-core --backend`` share.

Each failing structural case goes through both consumers: ``from_contract`` raises exactly
the first of ``contract_findings``.
"""

from __future__ import annotations

import pytest
from helios_contract import (
    BufferRoleError,
    ContractError,
    ExtentError,
    MissingFieldError,
    PreparedContract,
    RuntimeCapabilities,
    UnknownIdentifierError,
    UnspecifiedSelectorError,
    buffer_nbytes,
    capability_findings,
    contract_findings,
    stored_nbytes,
)
from helios_contract.schema import manifest_pb2 as mpb

from tests.contract.example import HIDDEN, VOCAB, example_contract, example_manifest


def _buffer(manifest, name):
    return next(b for b in manifest.buffers if b.name == name)


def _q4_1(manifest, name="token_embd"):
    b = _buffer(manifest, name)
    b.storage.CopyFrom(mpb.TensorStorage(type=mpb.STORAGE_TYPE_GGUF_Q4_1, block_elements=32,
                                         block_bytes=20))
    return b


def test_gguf_storage_is_valid_and_sized_by_its_blocks():
    serving, manifest = example_contract(), example_manifest()
    b = _q4_1(manifest)
    assert list(contract_findings(serving, manifest)) == []
    assert stored_nbytes(b) == VOCAB * (HIDDEN // 32) * 20
    assert buffer_nbytes(b) == VOCAB * HIDDEN * 4  # what views address: f32 elements
    assert stored_nbytes(_buffer(manifest, "output_norm")) == HIDDEN * 4


def _wrong_geometry(m):
    _q4_1(m).storage.block_bytes = 18


def _not_weight(m):
    b = _buffer(m, "scratch.logits")
    b.storage.type = mpb.STORAGE_TYPE_GGUF_Q8_0


def _bf16_elements(m):
    _q4_1(m).dtype = mpb.D_TYPE_BF16


def _partial_block(m):
    _q4_1(m).shape[-1] = HIDDEN + 16


def _no_type(m):
    _buffer(m, "token_embd").storage.block_elements = 32


def _int4_without_scales(m):
    _buffer(m, "token_embd").storage.CopyFrom(
        mpb.TensorStorage(type=mpb.STORAGE_TYPE_INT4, block_elements=128, block_bytes=64))


def _int4_wrong_bytes(m):
    _buffer(m, "token_embd").storage.CopyFrom(
        mpb.TensorStorage(type=mpb.STORAGE_TYPE_INT4, block_elements=128, block_bytes=128,
                          scales=mpb.SideBuffer(buffer="scales", dtype=mpb.D_TYPE_F32)))


def _fp8(m, scale_shape=(VOCAB, 1), scale_dtype=mpb.D_TYPE_F32, declare=True):
    """token_embd as FP8 e4m3 codes, one block per row, scales in `token_embd.scale`."""
    b = _buffer(m, "token_embd")
    b.storage.CopyFrom(mpb.TensorStorage(
        type=mpb.STORAGE_TYPE_FP8_E4M3, block_elements=HIDDEN, block_bytes=HIDDEN,
        scales=mpb.SideBuffer(buffer="token_embd.scale", dtype=mpb.D_TYPE_F32)))
    if declare:
        m.buffers.add(name="token_embd.scale", dtype=scale_dtype, shape=list(scale_shape),
                      role=mpb.BUFFER_ROLE_WEIGHT, weight_resource_id="weights/token_embd.scale")
    return b


def _fp8_scales_undeclared(m):
    _fp8(m, declare=False)


def _fp8_scales_wrong_shape(m):
    _fp8(m, scale_shape=(VOCAB, 2))


def _fp8_scales_bf16(m):
    _fp8(m, scale_dtype=mpb.D_TYPE_BF16)


def _fp8_zero_points(m):
    _fp8(m).storage.zero_points.CopyFrom(mpb.SideBuffer(buffer="token_embd.scale",
                                                         dtype=mpb.D_TYPE_F32))


def _fp8_wrong_bytes(m):
    _fp8(m).storage.block_bytes = HIDDEN // 2


def _coded(m, storage_type, group=32, third=None, declare=("token_embd.scale",)):
    """token_embd as element-wise codes of `storage_type` in groups of `group` (bits from
    the type), its scales in `token_embd.scale` and `third` ("zero_points" or "mins") in
    `token_embd.side`; `declare`: the side buffers declared ([VOCAB, HIDDEN / group])."""
    bits = 8 if storage_type == mpb.STORAGE_TYPE_INT8 else 4
    b = _buffer(m, "token_embd")
    b.storage.CopyFrom(mpb.TensorStorage(
        type=storage_type, block_elements=group, block_bytes=group * bits // 8,
        scales=mpb.SideBuffer(buffer="token_embd.scale", dtype=mpb.D_TYPE_F32)))
    if third:
        getattr(b.storage, third).CopyFrom(mpb.SideBuffer(buffer="token_embd.side",
                                                          dtype=mpb.D_TYPE_F32))
    for name in declare:
        m.buffers.add(name=name, dtype=mpb.D_TYPE_F32, shape=[VOCAB, HIDDEN // group],
                      role=mpb.BUFFER_ROLE_WEIGHT, weight_resource_id=f"weights/{name}")
    return b


def _int4_min_without_mins(m):
    _coded(m, mpb.STORAGE_TYPE_INT4_MIN)


def _int4_min_mins_undeclared(m):
    _coded(m, mpb.STORAGE_TYPE_INT4_MIN, third="mins")


def _int4_min_zero_points(m):
    _coded(m, mpb.STORAGE_TYPE_INT4_MIN, third="zero_points",
           declare=("token_embd.scale", "token_embd.side"))


def _int4_mins(m):
    _coded(m, mpb.STORAGE_TYPE_INT4, third="mins", declare=("token_embd.scale",
                                                            "token_embd.side"))


def _int8_mins(m):
    _coded(m, mpb.STORAGE_TYPE_INT8, third="mins", declare=("token_embd.scale",
                                                            "token_embd.side"))


def _int8_wrong_bytes(m):
    _coded(m, mpb.STORAGE_TYPE_INT8).storage.block_bytes = 16


FAILING = [
    ("int4-min-without-mins", _int4_min_without_mins, MissingFieldError,
     ".storage.mins.buffer"),
    ("int4-min-mins-undeclared", _int4_min_mins_undeclared, UnknownIdentifierError,
     ".storage.mins.buffer"),
    ("int4-min-zero-points", _int4_min_zero_points, BufferRoleError, ".storage.zero_points"),
    ("int4-mins", _int4_mins, BufferRoleError, ".storage.mins"),
    ("int8-mins", _int8_mins, BufferRoleError, ".storage.mins"),
    ("int8-wrong-bytes", _int8_wrong_bytes, ExtentError, ".storage.block_bytes"),
    ("fp8-scales-undeclared", _fp8_scales_undeclared, UnknownIdentifierError,
     ".storage.scales.buffer"),
    ("fp8-scales-wrong-shape", _fp8_scales_wrong_shape, ExtentError, ".storage.scales.buffer"),
    ("fp8-scales-bf16", _fp8_scales_bf16, BufferRoleError, ".storage.scales.buffer"),
    ("fp8-zero-points", _fp8_zero_points, BufferRoleError, ".storage.zero_points"),
    ("fp8-wrong-bytes", _fp8_wrong_bytes, ExtentError, ".storage.block_bytes"),
    ("wrong-geometry", _wrong_geometry, ExtentError, ".storage.block_bytes"),
    ("not-a-weight", _not_weight, BufferRoleError, ".storage"),
    ("bf16-elements", _bf16_elements, BufferRoleError, ".storage"),
    ("partial-block", _partial_block, ExtentError, ".shape"),
    ("int4-without-scales", _int4_without_scales, MissingFieldError, ".storage.scales.buffer"),
    ("int4-wrong-bytes", _int4_wrong_bytes, ExtentError, ".storage.block_bytes"),
]


@pytest.mark.parametrize(("mutate", "cls", "suffix"), [c[1:] for c in FAILING],
                         ids=[c[0] for c in FAILING])
def test_storage_rejected_by_startup_and_lint_alike(mutate, cls, suffix):
    serving, manifest = example_contract(), example_manifest()
    mutate(manifest)
    findings = list(contract_findings(serving, manifest))
    with pytest.raises(ContractError) as info:
        PreparedContract.from_contract(serving, manifest)
    error = info.value
    assert type(error) is cls
    assert error.rule == "buffer.storage"
    assert error.path.startswith("manifest.buffers[") and error.path.endswith(suffix)
    assert (findings[0].error, findings[0].path, findings[0].rule) == (cls, error.path,
                                                                      error.rule)


def test_storage_without_a_type_is_an_unspecified_selector():
    serving, manifest = example_contract(), example_manifest()
    _no_type(manifest)
    with pytest.raises(UnspecifiedSelectorError) as info:
        PreparedContract.from_contract(serving, manifest)
    assert info.value.path == "manifest.buffers[0].storage.type"


def test_wrong_geometry_message_names_the_block():
    serving, manifest = example_contract(), example_manifest()
    _wrong_geometry(manifest)
    with pytest.raises(ExtentError, match=r"GGUF_Q4_1 blocks are 32 elements in 20 bytes"):
        PreparedContract.from_contract(serving, manifest)


def _prepared(mutate=None):
    serving, manifest = example_contract(), example_manifest()
    if mutate:
        mutate(manifest)
    return PreparedContract.from_contract(serving, manifest)


def _table(**fields) -> RuntimeCapabilities:
    """A table that executes everything the example needs, plus `fields`."""
    from helios_tools.capabilities import CPU

    return RuntimeCapabilities(**{**CPU.__dict__, "reference_ops": None, "storage_forms": {},
                                  **fields})


def _storage_findings(prepared, caps):
    return [f for f in capability_findings(prepared.serving, prepared.manifest, caps)
            if f.rule == "runtime.storage"]


def test_plain_cores_need_no_storage_capability():
    assert _storage_findings(_prepared(), _table(storage_types=frozenset())) == []


def test_a_storage_type_the_backend_lacks_fails_with_its_name():
    prepared = _prepared(_q4_1)
    caps = _table(storage_types=frozenset({mpb.STORAGE_TYPE_GGUF_Q8_0}),
                  storage_ops=frozenset({"embedding"}))
    (finding,) = _storage_findings(prepared, caps)
    assert (finding.path, finding.value) == ("manifest.buffers[0].storage.type",
                                             "STORAGE_TYPE_GGUF_Q4_1")
    assert "it executes STORAGE_TYPE_GGUF_Q8_0" in finding.detail
    assert "buffer 'token_embd' stored as STORAGE_TYPE_GGUF_Q4_1" in finding.detail


def test_lint_names_the_tensor_and_type_the_cuda_backend_does_not_execute():
    """A GGUF block type on cuda (which executes only element-wise code types): one line
    naming the tensor and its type."""
    from helios_tools.capabilities import CUDA

    finding = _storage_findings(_prepared(_q4_1), CUDA)[0]
    assert finding.path == "manifest.buffers[0].storage.type"
    line = str(finding)
    assert "\n" not in line
    assert "buffer 'token_embd' stored as STORAGE_TYPE_GGUF_Q4_1 (it executes " \
           "STORAGE_TYPE_FP8_E4M3, STORAGE_TYPE_INT4, STORAGE_TYPE_INT4_MIN, " \
           "STORAGE_TYPE_INT8)" in line


def test_an_op_without_a_quantized_form_fails_naming_the_op():
    """token_embd (now Q4_1) is read by the example's embedding launches (prefill and
    decode): one finding per (op, buffer), at the first launch."""
    prepared = _prepared(_q4_1)
    caps = _table(storage_types=frozenset({mpb.STORAGE_TYPE_GGUF_Q4_1}),
                  storage_ops=frozenset({"linear"}))
    (finding,) = _storage_findings(prepared, caps)
    assert finding.value == "token_embd"
    assert finding.path == "manifest.graphs[0].launches[0].args[1].buffer.buffer"
    assert "reference op 'embedding' over quantized weights" in finding.detail
    ok = _table(storage_types=frozenset({mpb.STORAGE_TYPE_GGUF_Q4_1}),
                storage_ops=frozenset({"embedding"}))
    assert _storage_findings(prepared, ok) == []


def test_cuda_executes_no_gguf_blocks():
    from helios_tools.capabilities import CUDA

    rules = [f.rule for f in _storage_findings(_prepared(_q4_1), CUDA)]
    assert rules and set(rules) == {"runtime.storage"}


def test_fp8_storage_is_valid_and_sized_by_its_codes():
    serving, manifest = example_contract(), example_manifest()
    b = _fp8(manifest)
    assert list(contract_findings(serving, manifest)) == []
    assert stored_nbytes(b) == VOCAB * HIDDEN  # one byte an element


def test_fp8_weights_need_the_fp8_form_of_each_reader_on_both_backends():
    """The example's embedding reads token_embd: no FP8 form, so both backends refuse it by
    the one rule, naming the op (the cpu's GGUF embedding form is no FP8 form); the
    storage type itself both execute."""
    from helios_tools.capabilities import CPU, CUDA

    for caps in (CPU, CUDA):
        (finding,) = _storage_findings(_prepared(_fp8), caps)
        assert finding.value == "token_embd"
        assert "reference op 'embedding' over quantized weights" in finding.detail
        assert "it has a STORAGE_TYPE_FP8_E4M3 form of linear_add_fp8, linear_fp8" in \
            finding.detail


def test_repacked_storage_is_valid_and_sized_by_its_codes():
    """INT4_MIN (4-bit codes, scales and minimums) and INT8 (one byte a code, scales): the
    forms a GGUF core for a GPU target stores its blocks in."""
    for storage_type, third, nbytes in ((mpb.STORAGE_TYPE_INT4_MIN, "mins", HIDDEN // 2),
                                        (mpb.STORAGE_TYPE_INT8, None, HIDDEN)):
        serving, manifest = example_contract(), example_manifest()
        b = _coded(manifest, storage_type, third=third,
                   declare=("token_embd.scale",) + (("token_embd.side",) if third else ()))
        assert list(contract_findings(serving, manifest)) == []
        assert stored_nbytes(b) == VOCAB * nbytes


def test_both_backends_execute_the_repacked_types_each_with_its_forms():
    """The one rule: INT4_MIN and INT8 are storage types of both tables; the example's
    plain embedding launch (INT4_MIN has no embedding form; INT8's is embedding_int8, which
    the export writes instead) fails naming the op and the forms."""
    from helios_tools.capabilities import CPU, CUDA

    for storage_type, third, forms in (
            (mpb.STORAGE_TYPE_INT4_MIN, "mins", "linear_add_int4_min, linear_int4_min"),
            (mpb.STORAGE_TYPE_INT8, None, "embedding_int8, linear_add_int8, linear_int8")):
        for caps in (CPU, CUDA):
            assert storage_type in caps.storage_types
            prepared = _prepared(lambda m, t=storage_type, s=third: _coded(
                m, t, third=s, declare=("token_embd.scale",) + (("token_embd.side",)
                                                                 if s else ())))
            (finding,) = _storage_findings(prepared, caps)
            assert finding.value == "token_embd"
            name = mpb.StorageType.Name(storage_type)
            assert f"reference op 'embedding' over quantized weights (it has a {name} form " \
                   f"of {forms}" in finding.detail
