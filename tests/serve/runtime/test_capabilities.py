"""The capability tables (helios_tools.capabilities) are promises serve's code keeps.

Every (source, indexing) pair the tables declare is packed by shared packing; every dtype
they declare loads on the CPU backend; every frontend selector value has a parser; every
reference op of the CPU table runs. A capability cannot be declared without its
implementation, and the tables never lag behind the code either (the packing test also
fails when packing supplies a pair the table leaves out).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helios_contract.schema import contract_pb2 as c
from helios_contract.schema import frontend_pb2 as fpb
from helios_contract.schema import manifest_pb2 as mpb
from helios_serve.engine.plan import (
    CopiedCandidates,
    PromptImage,
    Route,
    RowCopy,
    RowPlan,
    SamplingParams,
    StepKind,
    StepPlan,
    Tier,
)
from helios_serve.frontend.pipeline import REASONING_PARSERS, TOOL_PARSERS
from helios_serve.frontend.syntax import ReasoningParser, ToolParser
from helios_serve.runtime import packing
from helios_serve.runtime.cpu_backend import CpuBackend
from helios_serve.runtime.packing import SharedPacking
from helios_tools.capabilities import CPU, CUDA, PACKED_BINDINGS
from helios_tools.kernels.collective import COLLECTIVE_OPS
from helios_tools.kernels.registry import REFERENCE_OPS

SENTINEL = -7
SLOTS, WORDS = 4, 3


def _rows(kind: StepKind) -> tuple[RowPlan, ...]:
    sampling = SamplingParams(temperature=0.5, top_p=0.9, top_k=5, seed=(3 << 32) | 9,
                              logit_bias=((1, 2.0),), logprobs=2)
    mask = np.full(WORDS, 5, np.int32)
    tokens = {StepKind.PREFILL: ((11, 12, 13), (21, 22)), StepKind.DECODE: ((11,), (21,))}[kind]
    copied = CopiedCandidates((4, 5), 4, 9, grammar_masks=np.full((2, WORDS), 6, np.int32))
    return tuple(RowPlan(request_id=i, slot=2 * i + 1, generation=4, tokens=t,
                         start_position=8, page_ids=(6, 7, 9), sample=True, sampling=sampling,
                         histogram_tokens=(1, 1, 2), grammar_mask=mask, candidates=copied)
                 for i, t in enumerate(tokens))


def _destination(indexing: int, source: int) -> np.ndarray:
    if source == c.VALUE_SOURCE_CANDIDATE_GRAMMAR_MASKS:  # [slots, D, mask words]
        return np.full((SLOTS, 3, WORDS), SENTINEL, np.int32)
    if indexing == c.INDEXING_PHYSICAL_REQUEST_ROW:
        return np.full((SLOTS, 8), SENTINEL, np.int32)
    if indexing == c.INDEXING_SCALAR:
        return np.full((), SENTINEL, np.int32)
    if source == c.VALUE_SOURCE_SEED_BITS:
        return np.full((SLOTS, 2), SENTINEL, np.int64)
    if source == c.VALUE_SOURCE_GRAMMAR_MASK:
        return np.full((SLOTS, WORDS), SENTINEL, np.int32)
    if source == c.VALUE_SOURCE_CANDIDATE_IDS:
        return np.full((SLOTS, 3), SENTINEL, np.int32)
    return np.full(8, SENTINEL, np.float32)


# What RESTORE programs bind: packed from a TRANSFER plan's row copies.
COPY_BINDINGS = frozenset((s, c.INDEXING_SUBMISSION_ROW) for s in packing.COPY_VALUES)
# What image prefill programs bind: packed from the rows' images (test below).
IMAGE_BINDINGS = frozenset({(c.VALUE_SOURCE_IMAGE_TENSOR, c.INDEXING_SCALAR),
                            (c.VALUE_SOURCE_IMAGE_FEATURE_INDEX, c.INDEXING_PACKED_TOKEN)})
GENERATION_BINDINGS = sorted(PACKED_BINDINGS - COPY_BINDINGS - IMAGE_BINDINGS)


def _plan(kind: StepKind) -> StepPlan:
    if kind is StepKind.TRANSFER:
        return StepPlan(kind, (), copies=(RowCopy(3, 1), RowCopy(5, 2)),
                        route=Route(Tier.HOST, Tier.PAGES))
    return StepPlan(kind, _rows(kind))


@pytest.mark.parametrize(("source", "indexing", "kind"),
                         [(s, i, k) for s, i in GENERATION_BINDINGS
                          for k in (StepKind.PREFILL, StepKind.DECODE)]
                         + [(s, i, StepKind.TRANSFER) for s, i in sorted(COPY_BINDINGS)],
                         ids=[f"{c.ValueSource.Name(s)}-{c.Indexing.Name(i)}-{k.name}"
                              for s, i in GENERATION_BINDINGS for k in (StepKind.PREFILL, StepKind.DECODE)]
                         + [f"{c.ValueSource.Name(s)}-{c.Indexing.Name(i)}-TRANSFER"
                            for s, i in sorted(COPY_BINDINGS)])
def test_every_declared_binding_is_packed(source, indexing, kind):
    binding = c.ValueBinding(destination="dst", source=source, indexing=indexing,
                             constant_value=3 if source == c.VALUE_SOURCE_CONSTANT else 0)
    graph = c.GraphContract(name="g", bindings=[binding])
    dest = _destination(indexing, source)
    pack = SharedPacking([graph], [{"dst": dest}])
    pack.pack("g", _plan(kind), rows=SLOTS, tokens=8)
    assert (dest != SENTINEL).any(), "nothing was written"
    if kind is StepKind.TRANSFER:
        want = [3, 5] if source == c.VALUE_SOURCE_RESTORE_SOURCE else [1, 2]
        assert dest[:2].tolist() == want


def test_candidate_masks_are_packed_per_lane_and_required_for_constrained_lanes():
    import dataclasses

    binding = c.ValueBinding(destination="dst", source=c.VALUE_SOURCE_CANDIDATE_GRAMMAR_MASKS,
                             indexing=c.INDEXING_PHYSICAL_REQUEST_ROW)
    dest = np.full((SLOTS, 3, WORDS), SENTINEL, np.int32)
    pack = SharedPacking([c.GraphContract(name="g", bindings=[binding])], [{"dst": dest}])
    rows = _rows(StepKind.DECODE)  # slots 1 and 3, two candidates each
    dirty = pack.pack("g", StepPlan(StepKind.SPECULATIVE, rows), rows=SLOTS, tokens=8)
    assert (dest[[1, 3], :2] == 6).all() and (dest[[1, 3], 2] == SENTINEL).all()
    assert (dest[[0, 2]] == SENTINEL).all()  # other slots are neither written nor uploaded
    assert [(d.row, d.start, d.end) for d in dirty] == [(1, 0, 2 * WORDS), (3, 0, 2 * WORDS)]
    unmasked = dataclasses.replace(rows[1].candidates, grammar_masks=None)
    bad = (rows[0], dataclasses.replace(rows[1], candidates=unmasked))
    with pytest.raises(ValueError, match="row 1: a constrained lane's copied candidates"):
        pack.pack("g", StepPlan(StepKind.SPECULATIVE, bad), rows=SLOTS, tokens=8)
    free = (dataclasses.replace(bad[1], grammar_mask=None),)  # an unconstrained lane: no masks
    pack.pack("g", StepPlan(StepKind.SPECULATIVE, free), rows=SLOTS, tokens=8)


def test_the_restore_bindings_are_declared():
    assert {c.VALUE_SOURCE_RESTORE_SOURCE, c.VALUE_SOURCE_SNAPSHOT_DESTINATION} == {
        s for s, _ in COPY_BINDINGS}
    assert COPY_BINDINGS <= PACKED_BINDINGS


def test_packing_supplies_nothing_the_table_leaves_out():
    """The pairs packing's value tables implement are exactly the declared ones."""
    per_row = set(packing.ROW_VALUES) | set(packing.SAMPLING_VALUES) | {
        c.VALUE_SOURCE_GRAMMAR_MASK, c.VALUE_SOURCE_CANDIDATE_IDS, c.VALUE_SOURCE_CONSTANT}
    implemented = (
        {(s, i) for s in per_row for i in (c.INDEXING_SUBMISSION_ROW, c.INDEXING_ACTIVE_ROW)}
        | {(s, c.INDEXING_PACKED_TOKEN) for s in packing.TOKEN_VALUES}
        | {(s, c.INDEXING_SUBMISSION_ROW) for s in packing.COPY_VALUES}
        | {(c.VALUE_SOURCE_PAGE_TABLE, c.INDEXING_PHYSICAL_REQUEST_ROW),
           (c.VALUE_SOURCE_PROMPT_HISTOGRAM, c.INDEXING_PHYSICAL_REQUEST_ROW),
           (c.VALUE_SOURCE_LOGIT_BIAS, c.INDEXING_PHYSICAL_REQUEST_ROW),
           (c.VALUE_SOURCE_CANDIDATE_GRAMMAR_MASKS, c.INDEXING_PHYSICAL_REQUEST_ROW),
           (c.VALUE_SOURCE_LIVE_ROW_COUNT, c.INDEXING_SCALAR),
           (c.VALUE_SOURCE_CONSTANT, c.INDEXING_SCALAR)}
        | {(s, c.INDEXING_SCALAR if s == c.VALUE_SOURCE_IMAGE_TENSOR else
            c.INDEXING_PACKED_TOKEN) for s in packing.IMAGE_SOURCES}
    )
    assert implemented == PACKED_BINDINGS


def test_image_inputs_are_packed_from_the_rows_images():
    """Windows fill from window 0 in row order, the count is their total, and each
    packed token of a feature position gets its feature row (the image's features in
    window order, images in row order); other tokens get the padding."""
    def image(start, positions, fill, windows):
        pixels = np.full((windows, 3, 2, 2), fill, np.float32)
        return PromptImage(start, positions[-1] + 2, positions, pixels.tobytes(), windows, 2,
                           bytes(32))

    a = image(9, (10, 11), 1.0, 1)  # row 0: tokens at positions 8..10 (chunk ends mid-way)
    b = image(0, (1, 2, 3, 4), 2.0, 2)  # row 1: tokens at positions 0..4
    rows = _rows(StepKind.PREFILL)
    rows = (replace(rows[0], images=(a,)),
            replace(rows[1], tokens=(21, 22, 23, 24, 25), start_position=0, images=(b,)))
    bindings = [c.ValueBinding(destination="w", source=c.VALUE_SOURCE_IMAGE_TENSOR,
                               indexing=c.INDEXING_SCALAR, image_output="windows"),
                c.ValueBinding(destination="n", source=c.VALUE_SOURCE_IMAGE_TENSOR,
                               indexing=c.INDEXING_SCALAR, image_output="window_count"),
                c.ValueBinding(destination="i", source=c.VALUE_SOURCE_IMAGE_FEATURE_INDEX,
                               indexing=c.INDEXING_PACKED_TOKEN, padding=-1)]
    dest = {"w": np.zeros((4, 3, 2, 2), np.float32), "n": np.zeros(1, np.int32),
            "i": np.full(10, SENTINEL, np.int32)}
    SharedPacking([c.GraphContract(name="g", bindings=bindings)], [dest]).pack(
        "g", StepPlan(StepKind.PREFILL, rows), rows=SLOTS, tokens=10)
    assert dest["w"][:, 0, 0, 0].tolist() == [1.0, 2.0, 2.0, 0.0] and dest["n"][0] == 3
    # row 0 packs positions 8, 9, 10 (feature 0 of a at 10), row 1 positions 0..4
    assert dest["i"].tolist() == [-1, -1, 0, -1, 2, 3, 4, 5, -1, -1]


@pytest.mark.parametrize("dtype", sorted(CPU.dtypes), ids=mpb.DType.Name)
def test_every_declared_dtype_loads_on_the_cpu_backend(dtype):
    manifest = mpb.ExecutionManifest(buffers=[
        mpb.Buffer(name="w", dtype=dtype, shape=[2, 3], role=mpb.BUFFER_ROLE_WEIGHT,
                   weight_resource_id="w"),
        mpb.Buffer(name="s", dtype=dtype, shape=[4], role=mpb.BUFFER_ROLE_SCRATCH)])
    size = {mpb.D_TYPE_BF16: 2}.get(dtype, 4)
    backend = CpuBackend(manifest, lambda rid: bytes(6 * size))
    assert backend.buffers["w"].shape == (2, 3) and backend.buffers["s"].shape == (4,)


def test_the_cuda_table_declares_what_the_cuda_backend_allocates():
    from helios_serve.runtime.cuda_backend import STORED_DTYPE  # imports no driver call

    assert set(STORED_DTYPE) == CUDA.dtypes


def test_both_backends_share_the_scheduler_packing_and_frontend():
    differ = {f for f in CPU.__dataclass_fields__ if getattr(CPU, f) != getattr(CUDA, f)}
    assert differ == {"backend", "reference_ops", "argument_alignment_bytes", "max_ranks",
                      "storage_types", "storage_ops", "storage_forms", "one_term_inputs",
                      "rounded_outputs"}
    # one-term packed products (XSPLIT=0) skip lo terms on cuda only: the cpu backend runs
    # the references, so only cuda needs their inputs rounded (runtime.one_term_input)
    assert CUDA.one_term_inputs == {"linear_packed": ("XSPLIT", 0),
                                    "linear_packed_rows": ("XSPLIT", 0)}
    assert CUDA.rounded_outputs == {"round_bf16": 1, "swiglu_round_bf16": 1}
    assert not CPU.one_term_inputs
    # quantized weights: GGUF blocks on cpu only; FP8, INT4 and the repacked GGUF forms
    # (INT4_MIN, INT8) on both through the same ops
    fp8, int4 = mpb.STORAGE_TYPE_FP8_E4M3, mpb.STORAGE_TYPE_INT4
    int4_min, int8 = mpb.STORAGE_TYPE_INT4_MIN, mpb.STORAGE_TYPE_INT8
    assert CUDA.storage_types == {fp8, int4, int4_min, int8} <= CPU.storage_types
    assert CPU.forms(fp8) == CUDA.forms(fp8) == {
        "linear_fp8", "linear_add_fp8", "rmsnorm_linear_fp8", "swiglu_linear_fp8",
        "swiglu_linear_add_fp8"}
    assert CPU.forms(int4) == CUDA.forms(int4) == {
        "linear_int4", "linear_add_int4", "rmsnorm_linear_int4", "swiglu_linear_int4",
        "swiglu_linear_add_int4"}
    assert CPU.forms(int4_min) == CUDA.forms(int4_min) == {f"{op}_min" for op in CUDA.forms(int4)}
    assert CPU.forms(int8) == CUDA.forms(int8) == {
        op.replace("_int4", "_int8") for op in CUDA.forms(int4)} | {"embedding_int8"}
    assert CUDA.storage_ops == (CUDA.forms(fp8) | CUDA.forms(int4) | CUDA.forms(int4_min)
                                | CUDA.forms(int8))
    assert CPU.storage_args == CUDA.storage_args
    assert CPU.reference_ops == frozenset(REFERENCE_OPS) | frozenset(COLLECTIVE_OPS)
    assert CUDA.reference_ops is None


def test_every_frontend_selector_has_an_implementation():
    """So a contract that passes the selector rules always finds its parser (lint-core
    needs no parser table)."""
    assert set(TOOL_PARSERS) == {ToolParser(v) for v in fpb.ToolParser.values()} - {
        ToolParser.UNSPECIFIED}
    assert set(REASONING_PARSERS) == {ReasoningParser(v) for v in fpb.ReasoningParser.values()
                                      } - {ReasoningParser.UNSPECIFIED}


def test_speculative_programs_need_a_width_one_program():
    from helios_ignition.testing import tiny_core
    from helios_serve.runtime import UnsupportedContract
    from helios_serve.testing.native import load_native

    load_native(tiny_core(1, speculative_widths=(1, 2)), "cpu").close()
    with pytest.raises(UnsupportedContract) as info:
        load_native(tiny_core(1, speculative_widths=(2,)), "cpu")
    assert info.value.rule == "runtime.speculative_width_one"
    assert str(info.value) == (
        "unsupported contract: runtime.speculative_width_one: speculative_widths = [2]: "
        "needed by the cpu backend: a width-one SPECULATIVE program for lanes that cannot "
        "speculate")


def test_cuda_buffer_arguments_are_16_byte_aligned():
    """Triton kernels assume aligned pointers: a view 4 bytes into a buffer is valid for the
    cpu backend (element-aligned) and rejected for cuda, at load and by lint alike."""
    from helios_contract import PreparedContract, capability_findings
    from helios_ignition.testing import tiny_core

    core = tiny_core(1)
    launch = next(la for p in core.manifest.graphs for la in p.launches
                  if la.args and la.args[0].WhichOneof("value") == "buffer"
                  and la.args[0].buffer.shape and la.args[0].buffer.shape[0] > 1)
    view = launch.args[0].buffer
    view.shape[0] -= 1  # one element less, so the shifted view stays inside its buffer
    view.byte_offset = 4
    prepared = PreparedContract.from_contract(core.contract, core.manifest)
    assert list(capability_findings(prepared.serving, prepared.manifest, CPU)) == []
    (finding,) = capability_findings(prepared.serving, prepared.manifest, CUDA)
    assert (finding.rule, finding.value) == ("runtime.alignment", "4")
    assert finding.path.endswith(".args[0].buffer.byte_offset")
