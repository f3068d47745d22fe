"""A realistic, valid contract and execution manifest for a tiny Llama-like model.

Shared fixture module: other test packages build on it (``from tests.contract.example
import example_contract, example_manifest``). Every function returns fresh messages, so
callers may mutate them.

Geometry (one 2-layer Llama block stack, fp32 weights, bf16 paged KV cache):

    vocab 320 (sampled = input = histogram width; 10 mask words), hidden 64, 2 layers,
    4 query heads / 2 KV heads of head_dim 16, FFN 128, page_tokens 16, context 256
    (16 pages per request), 64 prepared pages, 4 request slots.

Graphs: ``prefill_b1_t64`` (PREFILL, 1 row x 64 packed tokens) and ``decode_b4`` (DECODE,
4 rows). ``add_speculative`` adds a SPECULATIVE program (B=4, D=3, W=4, P=16) and
``add_tuning`` a startup tuning producer with its tuned buffer.
"""

from __future__ import annotations

from helios_contract import (
    AssistantBoundaries,
    Buffer,
    BufferView,
    CacheContract,
    CompletionCursor,
    CompletionLayout,
    DeploymentBody,
    ExecutableResource,
    ExecutionManifest,
    FrontendContract,
    GraphContract,
    GraphProgram,
    HistoryRegion,
    InputVocabulary,
    Kernel,
    KernelBinary,
    KernelParam,
    Launch,
    ModelContract,
    PageTableView,
    PrefixBoundaryRule,
    ReasoningSyntax,
    SamplingDefaults,
    ServingContract,
    ServingDefaults,
    SpeculativeDescriptor,
    StateAccess,
    StateView,
    TemplateTokens,
    ToolSyntax,
    Transport,
    TunedBinding,
    ValueBinding,
    VisionContract,
    Vocabulary,
    buffer_nbytes,
)
from helios_contract.schema import contract_pb2 as c
from helios_contract.schema import core_pb2 as core
from helios_contract.schema import frontend_pb2 as f
from helios_contract.schema import manifest_pb2 as m

VOCAB = 320
HIDDEN = 64
LAYERS = 2
KV_HEADS = 2
HEAD_DIM = 16
FFN = 128
PAGE_TOKENS = 16
CONTEXT = 256
PAGES_PER_REQUEST = CONTEXT // PAGE_TOKENS  # 16
PREPARED_PAGES = 64
SLOTS = 4
PREFILL_TOKENS = 64
EOS_ID = 2

PREFILL = "prefill_b1_t64"
DECODE = "decode_b4"
SPECULATIVE = "speculative_b4_w4"
TUNING_PRODUCER = "tune_decode_splits"
TUNED_BUFFER = "tuned.decode_splits"

# --- the contract ----------------------------------------------------------------------------


def _row_view(buffer: str, row_bytes: int) -> StateView:
    """One row per physical request slot, each ``row_bytes`` wide."""
    return StateView(buffer=buffer, byte_offset=0, row_stride=row_bytes, byte_extent=row_bytes)


def _whole(buffer: str, nbytes: int) -> StateView:
    return StateView(buffer=buffer, byte_offset=0, row_stride=0, byte_extent=nbytes)


KV_PLANE_BYTES = PREPARED_PAGES * LAYERS * PAGE_TOKENS * KV_HEADS * HEAD_DIM * 2  # bf16


def _sampling_bindings() -> list[ValueBinding]:
    """Admission sampling inputs shared by every sampling graph (per physical request row)."""
    row = c.INDEXING_PHYSICAL_REQUEST_ROW
    return [
        ValueBinding(destination="in.seed", source=c.VALUE_SOURCE_SEED_BITS, indexing=row),
        ValueBinding(destination="in.temperature", source=c.VALUE_SOURCE_TEMPERATURE, indexing=row),
        ValueBinding(destination="in.top_p", source=c.VALUE_SOURCE_TOP_P, indexing=row),
        ValueBinding(destination="in.top_k", source=c.VALUE_SOURCE_TOP_K, indexing=row),
        ValueBinding(destination="in.eos_ids", source=c.VALUE_SOURCE_EOS_IDS, indexing=row,
                     padding=-1),
        ValueBinding(destination="in.output_limit", source=c.VALUE_SOURCE_OUTPUT_LIMIT,
                     indexing=row),
        ValueBinding(destination="in.grammar_mask", source=c.VALUE_SOURCE_GRAMMAR_MASK,
                     indexing=c.INDEXING_ACTIVE_ROW),
    ]


def _prefill_graph() -> GraphContract:
    pending = _row_view("state.pending", 4)
    return GraphContract(
        name=PREFILL,
        operation=c.OPERATION_PREFILL,
        batch_capacity=1,
        token_capacity=PREFILL_TOKENS,
        state_rows_per_request=1,
        bindings=[
            ValueBinding(destination="in.tokens", source=c.VALUE_SOURCE_PROMPT_TOKENS,
                         indexing=c.INDEXING_PACKED_TOKEN, padding=0),
            ValueBinding(destination="in.positions", source=c.VALUE_SOURCE_PROMPT_POSITIONS,
                         indexing=c.INDEXING_PACKED_TOKEN, padding=0),
            ValueBinding(destination="in.slots", source=c.VALUE_SOURCE_SLOT,
                         indexing=c.INDEXING_SUBMISSION_ROW, padding=0),
            ValueBinding(destination="in.query_lengths", source=c.VALUE_SOURCE_QUERY_LENGTH,
                         indexing=c.INDEXING_SUBMISSION_ROW, padding=0),
            ValueBinding(destination="in.live_rows", source=c.VALUE_SOURCE_LIVE_ROW_COUNT,
                         indexing=c.INDEXING_SCALAR),
            ValueBinding(destination="in.sample_rows", source=c.VALUE_SOURCE_SAMPLING_DECISION,
                         indexing=c.INDEXING_SUBMISSION_ROW, padding=0),
            ValueBinding(destination="page_table", source=c.VALUE_SOURCE_PAGE_TABLE,
                         indexing=c.INDEXING_PHYSICAL_REQUEST_ROW, padding=0),
            ValueBinding(destination="state.histogram", source=c.VALUE_SOURCE_PROMPT_HISTOGRAM,
                         indexing=c.INDEXING_PHYSICAL_REQUEST_ROW),
            *_sampling_bindings(),
        ],
        state_accesses=[
            StateAccess(view=pending, access=c.ACCESS_WRITE),
            StateAccess(view=_whole("kv.k", KV_PLANE_BYTES), access=c.ACCESS_READ_WRITE),
            StateAccess(view=_whole("kv.v", KV_PLANE_BYTES), access=c.ACCESS_READ_WRITE),
        ],
        pending_token=pending,
        completion_cursor=CompletionCursor(has_draft_cursor=False),
        resource_dependencies=["weights", "kernels.sm_90"],
    )


def _decode_graph() -> GraphContract:
    pending = _row_view("state.pending", 4)
    return GraphContract(
        name=DECODE,
        operation=c.OPERATION_DECODE,
        batch_capacity=SLOTS,
        token_capacity=SLOTS,
        state_rows_per_request=1,
        bindings=[
            ValueBinding(destination="in.slots", source=c.VALUE_SOURCE_SLOT,
                         indexing=c.INDEXING_SUBMISSION_ROW, padding=0),
            ValueBinding(destination="in.generation", source=c.VALUE_SOURCE_GENERATION,
                         indexing=c.INDEXING_SUBMISSION_ROW, padding=-1),
            ValueBinding(destination="in.live_rows", source=c.VALUE_SOURCE_LIVE_ROW_COUNT,
                         indexing=c.INDEXING_SCALAR),
            ValueBinding(destination="in.consumed", source=c.VALUE_SOURCE_CONSUMED_ENDPOINT,
                         indexing=c.INDEXING_SUBMISSION_ROW, padding=0),
            ValueBinding(destination="page_table", source=c.VALUE_SOURCE_PAGE_TABLE,
                         indexing=c.INDEXING_PHYSICAL_REQUEST_ROW, padding=0),
            *_sampling_bindings(),
        ],
        state_accesses=[
            StateAccess(view=pending, access=c.ACCESS_READ_WRITE),
            StateAccess(view=_row_view("state.histogram", VOCAB * 4), access=c.ACCESS_READ_WRITE),
            StateAccess(view=_whole("kv.k", KV_PLANE_BYTES), access=c.ACCESS_READ_WRITE),
            StateAccess(view=_whole("kv.v", KV_PLANE_BYTES), access=c.ACCESS_READ_WRITE),
        ],
        pending_token=pending,
        completion_cursor=CompletionCursor(has_draft_cursor=False),
        resource_dependencies=["weights", "kernels.sm_90"],
    )


def _frontend() -> FrontendContract:
    """ChatML template, JSON-in-tags tools and think-tag reasoning (SmolLM/Qwen style)."""
    end = "<|im_end|>"
    return FrontendContract(
        tool_parser=f.TOOL_PARSER_JSON_IN_TAGS,
        reasoning_parser=f.REASONING_PARSER_THINK_TAGS,
        image_preparation=f.IMAGE_PREPARATION_NONE,
        image_layout=f.IMAGE_LAYOUT_NONE,
        tool_syntax=ToolSyntax(call_open="<tool_call>", call_close="</tool_call>",
                               wrapping_newline="\n", tag_separator="\n",
                               json_name_key="name", json_arguments_key="arguments"),
        reasoning_syntax=ReasoningSyntax(open="<think>", close="</think>",
                                         terminal_markers=["<tool_call>"],
                                         answer_separator="\n\n"),
        assistant_boundaries=AssistantBoundaries(message_end_markers=[end],
                                                 assistant_header="<|im_start|>assistant\n"),
        prefix_boundary_rules=[
            PrefixBoundaryRule(role=f.FRONTEND_MESSAGE_ROLE_SYSTEM, end_marker=end + "\n"),
            PrefixBoundaryRule(role=f.FRONTEND_MESSAGE_ROLE_USER, end_marker=end + "\n"),
            PrefixBoundaryRule(role=f.FRONTEND_MESSAGE_ROLE_TOOL, end_marker=end + "\n"),
            PrefixBoundaryRule(role=f.FRONTEND_MESSAGE_ROLE_ASSISTANT, end_marker=end + "\n",
                               rerendered_by_later_messages=True),
        ],
    )


def example_contract() -> ServingContract:
    """A valid version 3 ``ServingContract`` for the tiny model (prefill + decode)."""
    return ServingContract(
        served_id="tiny-llama",
        aliases=["tiny", "tiny-llama-instruct"],
        cache_identity="tiny-llama/kv-bf16-p16/1",
        context_tokens=CONTEXT,
        prefill_chunk_tokens=PREFILL_TOKENS,
        prepared_pages=PREPARED_PAGES,
        prepared_snapshots=8,
        selected_concurrency=SLOTS,
        defaults=ServingDefaults(
            sampling=SamplingDefaults(temperature=0.2, top_p=0.9, top_k=0, min_p=0.0,
                                      presence_penalty=0.0, frequency_penalty=0.0,
                                      repetition_penalty=1.0, max_output_tokens=128),
            max_active=SLOTS, queue_capacity=16, frontend_workers=2, event_capacity=64,
        ),
        eos_token_ids=[EOS_ID],
        template_tokens=TemplateTokens(bos_token="<|im_start|>", eos_token="<|im_end|>",
                                       pad_token="<|im_end|>",
                                       control_tokens=["<|im_start|>", "<|im_end|>"]),
        model=ModelContract(
            version=3,
            vocabulary=Vocabulary(sampled_tokens=VOCAB, histogram_width=VOCAB,
                                  mask_words=VOCAB // 32),
            input_vocabulary=InputVocabulary(input_tokens=VOCAB),
            vision=VisionContract(),
            cache=CacheContract(
                page_tokens=PAGE_TOKENS,
                regions=[HistoryRegion(name="attention", kind=c.HISTORY_KIND_PAGED_KV,
                                       planes=["kv.k", "kv.v"], tokens_per_record=1)],
                page_table_views=[PageTableView(region="attention", buffer="page_table",
                                                page_offset=0)],
            ),
            graphs=[_prefill_graph(), _decode_graph()],
            frontend=_frontend(),
        ),
    )


# --- the execution manifest ------------------------------------------------------------------


def _buffers() -> list[Buffer]:
    w, i32, f32 = m.BUFFER_ROLE_WEIGHT, m.D_TYPE_I32, m.D_TYPE_F32
    req = m.BUFFER_ROLE_REQUEST_INPUT
    out = [
        Buffer(name="token_embd", dtype=f32, shape=[VOCAB, HIDDEN], role=w,
               weight_resource_id="weights"),
        Buffer(name="output_norm", dtype=f32, shape=[HIDDEN], role=w, weight_resource_id="weights"),
    ]
    for layer in range(LAYERS):
        for name, shape in (("attn_norm", [HIDDEN]),
                            ("attn_qkv", [(4 + 2 * KV_HEADS) * HEAD_DIM, HIDDEN]),
                            ("attn_output", [HIDDEN, HIDDEN]), ("ffn_norm", [HIDDEN]),
                            ("ffn_gate_up", [2 * FFN, HIDDEN]), ("ffn_down", [HIDDEN, FFN])):
            out.append(Buffer(name=f"blk.{layer}.{name}", dtype=f32, shape=shape, role=w,
                              weight_resource_id="weights"))
    kv_shape = [PREPARED_PAGES, LAYERS, PAGE_TOKENS, KV_HEADS, HEAD_DIM]
    out += [
        Buffer(name="kv.k", dtype=m.D_TYPE_BF16, shape=kv_shape, role=m.BUFFER_ROLE_CACHE_PLANE),
        Buffer(name="kv.v", dtype=m.D_TYPE_BF16, shape=kv_shape, role=m.BUFFER_ROLE_CACHE_PLANE),
        Buffer(name="page_table", dtype=i32, shape=[SLOTS, PAGES_PER_REQUEST],
               role=m.BUFFER_ROLE_PERSISTENT_STATE),
        Buffer(name="state.pending", dtype=i32, shape=[SLOTS],
               role=m.BUFFER_ROLE_PERSISTENT_STATE),
        Buffer(name="state.histogram", dtype=i32, shape=[SLOTS, VOCAB],
               role=m.BUFFER_ROLE_PERSISTENT_STATE),
        Buffer(name="in.tokens", dtype=i32, shape=[PREFILL_TOKENS], role=req),
        Buffer(name="in.positions", dtype=i32, shape=[PREFILL_TOKENS], role=req),
        Buffer(name="in.slots", dtype=i32, shape=[SLOTS], role=req),
        Buffer(name="in.generation", dtype=i32, shape=[SLOTS], role=req),
        Buffer(name="in.query_lengths", dtype=i32, shape=[SLOTS], role=req),
        Buffer(name="in.live_rows", dtype=i32, shape=[], role=req),
        Buffer(name="in.sample_rows", dtype=i32, shape=[SLOTS], role=req),
        Buffer(name="in.consumed", dtype=i32, shape=[SLOTS], role=req),
        Buffer(name="in.seed", dtype=m.D_TYPE_U32, shape=[SLOTS, 2], role=req),
        Buffer(name="in.temperature", dtype=f32, shape=[SLOTS], role=req),
        Buffer(name="in.top_p", dtype=f32, shape=[SLOTS], role=req),
        Buffer(name="in.top_k", dtype=i32, shape=[SLOTS], role=req),
        Buffer(name="in.eos_ids", dtype=i32, shape=[SLOTS, 4], role=req),
        Buffer(name="in.output_limit", dtype=i32, shape=[SLOTS], role=req),
        Buffer(name="in.grammar_mask", dtype=m.D_TYPE_U32, shape=[SLOTS, VOCAB // 32], role=req),
        Buffer(name="out.sampled", dtype=i32, shape=[SLOTS], role=m.BUFFER_ROLE_OUTPUT),
        Buffer(name="scratch.hidden", dtype=f32, shape=[PREFILL_TOKENS, HIDDEN],
               role=m.BUFFER_ROLE_SCRATCH),
        Buffer(name="scratch.logits", dtype=f32, shape=[SLOTS, VOCAB], role=m.BUFFER_ROLE_SCRATCH),
    ]
    return out


def _kernels() -> list[Kernel]:
    buf, i32 = m.PARAM_KIND_BUFFER, m.PARAM_KIND_I32

    def kernel(kid: str, op: str, params: list[tuple[str, int]], **constants: int) -> Kernel:
        return Kernel(
            id=kid, reference_op=op, constants=constants,
            params=[KernelParam(name=n, kind=k) for n, k in params],
            binaries=[KernelBinary(target="sm_90", resource_id="kernels.sm_90", entry_name=kid,
                                   shared_bytes=0, num_warps=4)],
        )

    return [
        kernel("embedding_h64", "embedding",
               [("tokens", buf), ("table", buf), ("out", buf), ("n_tokens", i32)], HIDDEN=HIDDEN),
        kernel("rms_norm_h64", "rms_norm", [("x", buf), ("w", buf), ("out", buf), ("rows", i32)],
               HIDDEN=HIDDEN),
        kernel("sample_v320", "sample",
               [("logits", buf), ("seed", buf), ("temperature", buf), ("top_p", buf),
                ("top_k", buf), ("out", buf), ("rows", i32)], VOCAB=VOCAB),
    ]


def _view(buffer: str, *shape: int) -> m.Argument:
    return m.Argument(buffer=BufferView(buffer=buffer, byte_offset=0, shape=list(shape)))


def _program(graph: GraphContract, launches: list[Launch]) -> GraphProgram:
    return GraphProgram(
        name=graph.name, operation=graph.operation, batch_capacity=graph.batch_capacity,
        token_capacity=graph.token_capacity, launches=launches,
        transports=[Transport(destination=b.destination, nbytes=_transport_nbytes(b.destination))
                    for b in graph.bindings],
        completion=CompletionLayout(buffer="out.sampled", rows=graph.batch_capacity),
    )


def _transport_nbytes(name: str) -> int:
    return buffer_nbytes(next(b for b in _buffers() if b.name == name))


def _launches(tokens: int, rows: int) -> list[Launch]:
    return [
        Launch(kernel="embedding_h64", grid=[tokens, 1, 1], block=[128, 1, 1],
               args=[_view("in.tokens", tokens), _view("token_embd", VOCAB, HIDDEN),
                     _view("scratch.hidden", tokens, HIDDEN), m.Argument(int_value=tokens)]),
        Launch(kernel="rms_norm_h64", grid=[tokens, 1, 1], block=[64, 1, 1],
               args=[_view("scratch.hidden", tokens, HIDDEN), _view("output_norm", HIDDEN),
                     _view("scratch.hidden", tokens, HIDDEN), m.Argument(int_value=tokens)]),
        Launch(kernel="sample_v320", grid=[rows, 1, 1], block=[128, 1, 1],
               args=[_view("scratch.logits", rows, VOCAB), _view("in.seed", rows, 2),
                     _view("in.temperature", rows), _view("in.top_p", rows),
                     _view("in.top_k", rows), _view("out.sampled", rows),
                     m.Argument(int_value=rows)]),
    ]


def example_manifest() -> ExecutionManifest:
    """The execution manifest matching ``example_contract`` (prefill + decode programs)."""
    graphs = {g.name: g for g in (_prefill_graph(), _decode_graph())}
    return ExecutionManifest(
        abi="helios-exec-1",
        buffers=_buffers(),
        kernels=_kernels(),
        graphs=[_program(graphs[PREFILL], _launches(PREFILL_TOKENS, 1)),
                _program(graphs[DECODE], _launches(SLOTS, SLOTS))],
        tuning=m.TuningCatalog(),
        targets=["sm_90"],
    )


# --- variants --------------------------------------------------------------------------------


def speculative_graph(*, confidence: bool = False) -> GraphContract:
    """A complete SPECULATIVE program: B=4 rows, D=3 draws, W=4 per lane, P=16 packed.

    With ``confidence``, it produces proposal confidence (confidence_width = D) and binds
    SPECULATIVE_PREFIX_LIMIT ceilings; otherwise it binds exact QUERY_LENGTH lengths.
    """
    graph = _decode_graph()
    graph.name = SPECULATIVE
    graph.operation = c.OPERATION_SPECULATIVE
    graph.token_capacity = SLOTS * 4
    graph.completion_cursor.CopyFrom(CompletionCursor(has_draft_cursor=True, lag_tokens=1))
    source = (c.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT if confidence
              else c.VALUE_SOURCE_QUERY_LENGTH)
    graph.bindings.add(destination="in.query_lengths", source=source,
                       indexing=c.INDEXING_SUBMISSION_ROW, padding=0)
    graph.speculative.CopyFrom(SpeculativeDescriptor(
        batch_capacity=SLOTS, draft_tokens=3, token_capacity=4, packed_token_capacity=SLOTS * 4,
        lane_limit=4, produces_confidence=confidence, confidence_width=3 if confidence else 0,
        length_source=(c.LENGTH_SOURCE_SPECULATIVE_PREFIX_LIMIT if confidence
                       else c.LENGTH_SOURCE_QUERY_LENGTH),
    ))
    return graph


def add_speculative(serving: ServingContract, manifest: ExecutionManifest, *,
                    confidence: bool = False) -> GraphContract:
    """Add ``speculative_graph`` to both messages (and W=4 to speculative_widths)."""
    graph = serving.model.graphs.add()
    graph.CopyFrom(speculative_graph(confidence=confidence))
    serving.speculative_widths.append(4)
    program = _program(graph, _launches(SLOTS * 4, SLOTS))
    # The single terminal completion: one int32 lane record [6 + W] per row.
    manifest.buffers.append(Buffer(name="out.record", dtype=m.D_TYPE_I32, shape=[SLOTS, 6 + 8],
                                   role=m.BUFFER_ROLE_OUTPUT))
    program.completion.CopyFrom(CompletionLayout(
        buffer="out.record", rows=SLOTS, speculative=m.SpeculativeCompletion(token_width=4),
        confidence_buffer="proposal_confidence" if confidence else ""))
    manifest.graphs.append(program)
    if confidence:
        # Framed confidence storage: F32 [2 frames, request slots, draft capacity].
        manifest.buffers.append(Buffer(name="proposal_confidence", dtype=m.D_TYPE_F32,
                                       shape=[2, SLOTS, 8], role=m.BUFFER_ROLE_OUTPUT))
    return graph


def add_tuning(serving: ServingContract, manifest: ExecutionManifest) -> TunedBinding:
    """Give ``decode_b4`` a tuned buffer populated by a startup tuning producer."""
    manifest.buffers.append(Buffer(name=TUNED_BUFFER, dtype=m.D_TYPE_I32, shape=[SLOTS],
                                   role=m.BUFFER_ROLE_TUNED))
    manifest.tuning.producers.append(GraphProgram(
        name=TUNING_PRODUCER, operation=c.OPERATION_INITIALIZE, batch_capacity=1,
        launches=[Launch(kernel="rms_norm_h64", grid=[1, 1, 1], block=[64, 1, 1],
                         args=[_view("scratch.hidden", 1, HIDDEN), _view("output_norm", HIDDEN),
                               _view(TUNED_BUFFER, SLOTS), m.Argument(int_value=1)])],
    ))
    program = next(p for p in manifest.graphs if p.name == DECODE)
    program.tuning_producers.append(TUNING_PRODUCER)
    graph = next(g for g in serving.model.graphs if g.name == DECODE)
    return graph.tuned_bindings.add(buffer=TUNED_BUFFER, producer_graph=TUNING_PRODUCER)


def add_images(serving: ServingContract, manifest: ExecutionManifest | None = None) -> None:
    """Make the model accept images: 4 extra input ids (feature sentinel 320, span start 321,
    span end 322, row separator 323), patch-grid preparation and a single-span layout, and
    an image-tensor binding on the prefill graph."""
    model = serving.model
    model.input_vocabulary.input_tokens = VOCAB + 4
    model.input_vocabulary.image_sentinel_ids.append(VOCAB)
    model.vision.CopyFrom(VisionContract(feature_slots=64, features_per_window=16,
                                         patches_per_feature=4, patch_capacities=[256, 1024]))
    front = model.frontend
    front.image_preparation = f.IMAGE_PREPARATION_PATCH_GRID
    front.image_layout = f.IMAGE_LAYOUT_SINGLE_SPAN
    front.image_token_layout.CopyFrom(f.ImageTokenLayout(
        feature_token_id=VOCAB, span_start_token_id=VOCAB + 1, span_end_token_id=VOCAB + 2,
        row_separator_token_id=VOCAB + 3, patches_per_feature=4, atomic_spans=True))
    prefill = next(g for g in model.graphs if g.name == PREFILL)
    prefill.bindings.add(destination="in.image_features", source=c.VALUE_SOURCE_IMAGE_TENSOR,
                         indexing=c.INDEXING_PACKED_TOKEN, image_output="features")
    if manifest is not None:
        manifest.buffers.append(Buffer(name="in.image_features", dtype=m.D_TYPE_F32,
                                       shape=[PREFILL_TOKENS, HIDDEN],
                                       role=m.BUFFER_ROLE_REQUEST_INPUT))
        program = next(p for p in manifest.graphs if p.name == PREFILL)
        program.transports.add(destination="in.image_features",
                               nbytes=PREFILL_TOKENS * HIDDEN * 4)


def add_tiled_images(serving: ServingContract, manifest: ExecutionManifest | None = None
                     ) -> None:  # fmt: skip
    """`add_images` with tiled preparation and the tile-grid layout: 64-pixel tiles of
    16-pixel patches (16 patches a window, 4 merged per feature: 4 features a window),
    images resized to 128 pixels (up to 2 x 2 tiles + the global view = 5 windows), tile
    tokens 324..327 and global token 328 (input ids up to 329)."""
    add_images(serving, manifest)
    model = serving.model
    model.input_vocabulary.input_tokens = VOCAB + 9
    model.vision.CopyFrom(VisionContract(feature_slots=40, features_per_window=4,
                                         patches_per_feature=4, patch_capacities=[16, 80]))
    front = model.frontend
    front.image_preparation = f.IMAGE_PREPARATION_TILED_GLOBAL
    front.image_layout = f.IMAGE_LAYOUT_TILE_GRID_SPAN
    layout = front.image_token_layout
    layout.tile_token_ids.extend([VOCAB + 4, VOCAB + 5, VOCAB + 6, VOCAB + 7])
    layout.tile_grid_columns = 2
    layout.global_token_id = VOCAB + 8
    layout.grid_end_token_ids.extend([VOCAB + 3, VOCAB + 3])
    layout.template_placeholder = "<image>"
    front.image_tiling.CopyFrom(f.ImageTiling(
        tile_pixels=64, patch_pixels=16, resize_longest_edge=128,
        resample=f.IMAGE_RESAMPLE_LANCZOS, rescale=1 / 255, mean=[0.5] * 3, std=[0.5] * 3))


def example_deployment_body() -> DeploymentBody:
    """``DeploymentBody`` carrying the example contract, manifest and two resources."""
    chunk = 4 << 20
    return DeploymentBody(
        publisher_namespace="example.org/helios-tests",
        contract=example_contract(),
        manifest=example_manifest(),
        resources=[
            ExecutableResource(resource_id="weights", kind=core.RESOURCE_KIND_WEIGHTS,
                               stored_nbytes=5_000_000, decoded_nbytes=9_000_000,
                               chunk_nbytes=chunk, chunk_sha256=[b"\x11" * 32, b"\x22" * 32]),
            ExecutableResource(resource_id="kernels.sm_90",
                               kind=core.RESOURCE_KIND_KERNEL_BINARY, stored_nbytes=1000,
                               decoded_nbytes=4000, chunk_nbytes=chunk,
                               chunk_sha256=[b"\x33" * 32]),
        ],
    )
