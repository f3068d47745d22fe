"""What helios-serve's two backends execute, as data (``helios_contract.RuntimeCapabilities``).

The tables live here, not in helios-serve, because ``helios-tools lint-core --backend``
checks a core against them and helios-tools cannot import helios-serve (dependency
direction contract <- tools <- {ignition, serve}); helios-serve's ``NativeModel.load``
checks the same tables. Importing this module needs neither cuda-python nor a GPU.

Each entry is a promise kept by serve's code and held by its tests:
``tests/serve/runtime/test_capabilities.py`` packs every declared binding pair with shared
packing and loads every declared dtype on the CPU backend. Turn a capability on in the
commit that implements it (docs/contract-rules.md).
"""

from __future__ import annotations

from helios_contract.capabilities import RuntimeCapabilities
from helios_contract.schema import contract_pb2 as pb
from helios_contract.schema import frontend_pb2 as fpb
from helios_contract.schema import manifest_pb2 as mpb

from helios_tools.kernels.collective import COLLECTIVE_OPS
from helios_tools.kernels.fp8 import FP8_FORMS
from helios_tools.kernels.int4 import INT4_FORMS
from helios_tools.kernels.int8 import INT4_MIN_FORMS, INT8_FORMS
from helios_tools.kernels.kv_bf16 import KV_BF16_FORMS
from helios_tools.kernels.kv_fp8 import KV_FP8_FORMS
from helios_tools.kernels.linear_splitk import ROUNDED_PRODUCERS
from helios_tools.kernels.registry import REFERENCE_OPS, kernel_params

__all__ = ["BACKENDS", "CPU", "CUDA", "PACKED_BINDINGS"]

_PER_ROW = (
    pb.VALUE_SOURCE_SLOT, pb.VALUE_SOURCE_GENERATION, pb.VALUE_SOURCE_QUERY_LENGTH,
    pb.VALUE_SOURCE_SAMPLING_DECISION, pb.VALUE_SOURCE_PENDING_TOKEN,
    pb.VALUE_SOURCE_CONSUMED_ENDPOINT, pb.VALUE_SOURCE_TEMPERATURE, pb.VALUE_SOURCE_TOP_P,
    pb.VALUE_SOURCE_TOP_K, pb.VALUE_SOURCE_MIN_P, pb.VALUE_SOURCE_PRESENCE_PENALTY,
    pb.VALUE_SOURCE_FREQUENCY_PENALTY, pb.VALUE_SOURCE_REPETITION_PENALTY,
    pb.VALUE_SOURCE_GRAMMAR_MASK_ENABLED, pb.VALUE_SOURCE_LOGIT_BIAS_ENABLED,
    pb.VALUE_SOURCE_LOGPROBS, pb.VALUE_SOURCE_SEED_BITS, pb.VALUE_SOURCE_GRAMMAR_MASK,
    pb.VALUE_SOURCE_CONSTANT,
    # Lane ceilings of device allocation (RowPlan.query_length of a prefix-limit step).
    pb.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT,
    # Copied proposals of history drafting (RowPlan.candidates).
    pb.VALUE_SOURCE_CANDIDATE_IDS, pb.VALUE_SOURCE_CANDIDATE_COUNT,
    pb.VALUE_SOURCE_CANDIDATE_GENERATION, pb.VALUE_SOURCE_CANDIDATE_CONSUMED_ENDPOINT,
)
_PER_TOKEN = (
    pb.VALUE_SOURCE_PROMPT_TOKENS, pb.VALUE_SOURCE_PENDING_TOKEN,
    pb.VALUE_SOURCE_PROMPT_POSITIONS, pb.VALUE_SOURCE_MIXED_PREFILL_ROW,
    pb.VALUE_SOURCE_SLOT,
    # SCORED_PREFILL programs: each packed token's target (RowPlan.score_targets).
    pb.VALUE_SOURCE_SCORED_TARGET_TOKENS,
)

# (source, indexing) pairs helios_serve.runtime.packing.SharedPacking supplies.
PACKED_BINDINGS = frozenset(
    {(s, pb.INDEXING_SUBMISSION_ROW) for s in _PER_ROW}
    | {(s, pb.INDEXING_ACTIVE_ROW) for s in _PER_ROW}
    | {(s, pb.INDEXING_PACKED_TOKEN) for s in _PER_TOKEN}
    | {(pb.VALUE_SOURCE_PAGE_TABLE, pb.INDEXING_PHYSICAL_REQUEST_ROW),
       (pb.VALUE_SOURCE_PROMPT_HISTOGRAM, pb.INDEXING_PHYSICAL_REQUEST_ROW),
       (pb.VALUE_SOURCE_LOGIT_BIAS, pb.INDEXING_PHYSICAL_REQUEST_ROW),
       # The per-position grammar masks of constrained lanes' copied candidates
       # (CopiedCandidates.grammar_masks), per slot: uploaded for those lanes only.
       (pb.VALUE_SOURCE_CANDIDATE_GRAMMAR_MASKS, pb.INDEXING_PHYSICAL_REQUEST_ROW),
       (pb.VALUE_SOURCE_LIVE_ROW_COUNT, pb.INDEXING_SCALAR),
       # RESTORE programs (TRANSFER steps): per row copy, the row read and the row written.
       (pb.VALUE_SOURCE_RESTORE_SOURCE, pb.INDEXING_SUBMISSION_ROW),
       (pb.VALUE_SOURCE_SNAPSHOT_DESTINATION, pb.INDEXING_SUBMISSION_ROW),
       (pb.VALUE_SOURCE_CONSTANT, pb.INDEXING_SCALAR),
       # Image prefill programs: the layout's whole-tensor outputs (windows, window
       # count) and each packed token's feature row (RowPlan.images).
       (pb.VALUE_SOURCE_IMAGE_TENSOR, pb.INDEXING_SCALAR),
       (pb.VALUE_SOURCE_IMAGE_FEATURE_INDEX, pb.INDEXING_PACKED_TOKEN)}
)

# What both backends share: the scheduler, packing and frontend are the same code.
_SERVING = dict(
    # The scheduler plans PREFILL, DECODE and SPECULATIVE steps, SCORED_PREFILL steps for
    # requests asking for prompt log probabilities, MIXED steps (decode lanes and prefill
    # chunks under one token budget), and TRANSFER steps that run RESTORE programs
    # (engine/plan.py StepKind; scheduler/transfers.py).
    operations=frozenset({pb.OPERATION_PREFILL, pb.OPERATION_SCORED_PREFILL,
                          pb.OPERATION_DECODE, pb.OPERATION_SPECULATIVE,
                          pb.OPERATION_MIXED, pb.OPERATION_RESTORE}),
    required_operations=frozenset({pb.OPERATION_PREFILL, pb.OPERATION_DECODE}),
    bindings=PACKED_BINDINGS,
    # Paged histories, one record per token, all in the request's one page list (the
    # drafter's key/value and feature histories share the target's page table).
    # Continuation storage holds exact-endpoint snapshot rows (scheduler/cache.py).
    # One sliding-window region: its own page pool and page list, pages released behind
    # the window as the request advances (scheduler/allocation.py, WindowPages).
    history_kinds=frozenset({pb.HISTORY_KIND_PAGED_KV, pb.HISTORY_KIND_PAGED_LATENT,
                             pb.HISTORY_KIND_SLIDING_WINDOW, pb.HISTORY_KIND_CONTINUATION}),
    tokens_per_record=frozenset({1}),
    # Host-tier planes: host memory (pinned and device-mapped on cuda), runtime/tiers.py.
    host_tier=True,
    state_accesses=frozenset({pb.ACCESS_READ, pb.ACCESS_WRITE, pb.ACCESS_READ_WRITE}),
    state_rows_per_request=1,  # persistent state rows are request slots
    # The scheduler validates SPECULATIVE draft cursors (ModelGeometry.draft_cursor_lag).
    cursor_operations=frozenset({pb.OPERATION_SPECULATIVE}),
    # Programs producing the framed proposal_confidence record: the backend's completion
    # lands it in the frame's plane; the scheduler validates and reads it per lane.
    speculative_confidence=True,
    tuning=True,  # NativeModel.load runs the producers before exposing the graphs
    dtypes=frozenset({mpb.D_TYPE_F32, mpb.D_TYPE_BF16, mpb.D_TYPE_I32, mpb.D_TYPE_U32}),
    # Images: tiled preparation and the tile-grid layout (helios_serve.frontend.images;
    # the vision kernels: helios_tools/kernels/vision.py, kernels_triton/vision.py).
    image_preparations=frozenset({fpb.IMAGE_PREPARATION_NONE,
                                  fpb.IMAGE_PREPARATION_TILED_GLOBAL}),
    image_layouts=frozenset({fpb.IMAGE_LAYOUT_NONE, fpb.IMAGE_LAYOUT_TILE_GRID_SPAN}),
)

# NumPy reference kernels (helios_tools.kernels) over host buffers.
# Tensor-parallel ranks: RankPeers::Threads / ::Processes (helios_serve.runtime.ranks) run
# the collectives; any rank count.
# Quantized weights: GGUF blocks through ggml (helios_serve.runtime.ggml_lib builds each
# launch of these ops over a quantized weight as a ggml graph; docs/cpu-kernels.md).
CPU_STORAGE_TYPES = frozenset({
    mpb.STORAGE_TYPE_GGUF_Q4_0, mpb.STORAGE_TYPE_GGUF_Q4_1, mpb.STORAGE_TYPE_GGUF_Q5_0,
    mpb.STORAGE_TYPE_GGUF_Q8_0, mpb.STORAGE_TYPE_GGUF_Q4_K, mpb.STORAGE_TYPE_GGUF_Q6_K})
# FP8 e4m3 weights: the W8A8 ops of helios_tools.kernels.fp8, whose NumPy references read
# the codes and scales (the products' FP8 forms, FP8_FORMS; both backends).
FP8_STORAGE_OPS = frozenset(FP8_FORMS.values())
# Where each FP8 product's codes and scales are among its arguments (KERNEL_PARAMS order).
FP8_STORAGE_ARGS = {op: (names.index("weight"), names.index("weight_scale"))
                    for op in FP8_STORAGE_OPS
                    for names in [[p.name for p in kernel_params(op)]]}
# INT4 (W4A16) weights: the ops of helios_tools.kernels.int4 (INT4_FORMS), which read the
# codes, their group scales and zero points.
INT4_STORAGE_OPS = frozenset(INT4_FORMS.values())
INT4_STORAGE_ARGS = {op: (names.index("weight"), names.index("weight_scale"),
                          names.index("weight_zero"))
                     for op in INT4_STORAGE_OPS
                     for names in [[p.name for p in kernel_params(op)]]}
# Repacked GGUF weights (helios_tools.kernels.int8): INT4_MIN (codes, scales, minimums)
# and INT8 (codes, scales) products.
INT4_MIN_STORAGE_OPS = frozenset(INT4_MIN_FORMS.values())
INT8_STORAGE_OPS = frozenset(INT8_FORMS.values())
REPACKED_STORAGE_ARGS = {op: tuple(names.index(p) for p in
                                   ("weight", "weight_scale", "weight_min") if p in names)
                         for op in INT4_MIN_STORAGE_OPS | INT8_STORAGE_OPS
                         for names in [[p.name for p in kernel_params(op)]]}
# The element-wise code types both backends execute, each with its forms.
CODE_STORAGE_FORMS = {mpb.STORAGE_TYPE_FP8_E4M3: FP8_STORAGE_OPS,
                      mpb.STORAGE_TYPE_INT4: INT4_STORAGE_OPS,
                      mpb.STORAGE_TYPE_INT4_MIN: INT4_MIN_STORAGE_OPS,
                      mpb.STORAGE_TYPE_INT8: INT8_STORAGE_OPS}
CODE_STORAGE_ARGS = {**FP8_STORAGE_ARGS, **INT4_STORAGE_ARGS, **REPACKED_STORAGE_ARGS}
CODE_STORAGE_OPS = frozenset().union(*CODE_STORAGE_FORMS.values())
GGUF_STORAGE_OPS = frozenset({"linear", "linear_add", "rmsnorm_linear", "swiglu_linear",
                              "swiglu_linear_add", "embedding"})
CPU_STORAGE_FORMS = {**{t: GGUF_STORAGE_OPS for t in CPU_STORAGE_TYPES}, **CODE_STORAGE_FORMS}
CPU_STORAGE_TYPES = CPU_STORAGE_TYPES | frozenset(CODE_STORAGE_FORMS)
CPU_STORAGE_OPS = GGUF_STORAGE_OPS | CODE_STORAGE_OPS
# e4m3 KV cache planes: the *_fp8kv forms (helios_tools.kernels.kv_fp8; both backends: the
# NumPy references on cpu, kernels_triton/kv_fp8.py on cuda), each plane's own scales.
KV_FP8_OPS = frozenset(KV_FP8_FORMS.values())
KV_CACHE_KINDS = dict(
    cache_storage_forms={mpb.STORAGE_TYPE_FP8_E4M3: KV_FP8_OPS},
    cache_storage_args={op: tuple((names.index(plane), names.index(scale))
                                  for plane, scale in (("k_cache", "k_scale"),
                                                       ("v_cache", "v_scale"))
                                  if plane in names)
                        for op in KV_FP8_OPS
                        for names in [[p.name for p in kernel_params(op)]]},
    # bf16 KV cache planes (D_TYPE_BF16 elements): the *_bf16kv forms
    # (helios_tools.kernels.kv_bf16; the NumPy references over uint16 planes on cpu, the
    # f32 ops' Triton bodies over bf16 pointers on cuda).
    cache_dtype_forms={mpb.D_TYPE_BF16: frozenset(KV_BF16_FORMS.values())})
CPU = RuntimeCapabilities(backend="cpu",
                          reference_ops=frozenset(REFERENCE_OPS) | frozenset(COLLECTIVE_OPS),
                          max_ranks=None, storage_types=CPU_STORAGE_TYPES,
                          storage_ops=CPU_STORAGE_OPS, storage_forms=CPU_STORAGE_FORMS,
                          storage_args=CODE_STORAGE_ARGS, **KV_CACHE_KINDS, **_SERVING)
# AOT cubins through the driver API; a binary per GPU target is checked at load (and by
# `lint-core --require-target`), not here.
# Triton compiles every kernel assuming 16-byte aligned buffer arguments.
# One rank: collectives through NCCL inside the captured graph are not written yet
# (issue 16; docs/tensor-parallel.md).
# Quantized weights: FP8 e4m3 through the ``*_fp8`` Triton kernels
# (helios_ignition/kernels_triton/fp8.py); the codes are uploaded as stored. INT4 through
# the W4A16 kernels (kernels_triton/int4.py), codes, scales and zero points as stored;
# INT4_MIN and INT8 (repacked GGUF blocks) through the same kernels' minimum and 8-bit
# variants. GGUF blocks as such are not executed: a cuda export repacks them.
# The packed bf16 products' one-term kernels (XSPLIT=0, kernels_triton/mma.py) skip the lo
# terms of their input: the reference's value only over a rounded producer's hi | 0
# (bf16 activations; the cpu backend runs the references, which add whatever lo holds).
ONE_TERM = dict(one_term_inputs={op: ("XSPLIT", 0)
                                 for op in ("linear_packed", "linear_packed_rows")},
                rounded_outputs={op: [p.name for p in kernel_params(op)].index("out")
                                 for op in ROUNDED_PRODUCERS})
CUDA = RuntimeCapabilities(backend="cuda", reference_ops=None, argument_alignment_bytes=16,
                           max_ranks=1, storage_types=frozenset(CODE_STORAGE_FORMS),
                           storage_ops=CODE_STORAGE_OPS, storage_forms=CODE_STORAGE_FORMS,
                           storage_args=CODE_STORAGE_ARGS, **KV_CACHE_KINDS, **ONE_TERM,
                           **_SERVING)

BACKENDS = {"cpu": CPU, "cuda": CUDA}
