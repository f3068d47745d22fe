"""A tiny but complete sample core: contract, manifest and resources of a 2-graph text model.

Used by tests, the golden-vector script, the benchmark and as a worked example of what an
exporter writes. Every byte is deterministic (seeded), so the signed payload of a sample
core depends only on the signing key.
"""

from __future__ import annotations

import json
import os

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helios_contract.schema import contract_pb2 as pb
from helios_contract.schema import core_pb2
from helios_contract.schema import frontend_pb2 as fpb
from helios_contract.schema import manifest_pb2 as mpb

from helios_tools.core.writer import CoreWriter, LogicalCoreWriter

__all__ = ["SAMPLE_BACKENDS", "SAMPLE_NAMESPACE", "sample_contract", "sample_manifest",
           "sample_resources", "write_sample_core"]

SAMPLE_NAMESPACE = "helios.example/tiny-llama"
# The sample shows the core format, not a servable model: its "greedy_sample" kernel is no
# NumPy reference op, so `lint-core` reports it for the cpu backend (runtime.reference_op).
# Format tests lint it against the backend it fits.
SAMPLE_BACKENDS = ("cuda",)
_VOCAB = 256
_HIDDEN = 16
_SLOTS = 4  # decode batch capacity = request slots
_PREFILL_TOKENS = 32
_CONTEXT_TOKENS = 128
_PAGE_TOKENS = 16
_PAGES = 64
_TARGET = "sm_90"


def _state_view(buffer: str, offset: int, stride: int, extent: int) -> pb.StateView:
    return pb.StateView(buffer=buffer, byte_offset=offset, row_stride=stride, byte_extent=extent)


def sample_contract() -> pb.ServingContract:
    """The ServingContract of the sample model (contract version 3)."""
    weights = ["weights/embed", "weights/norm"]
    kernels = [f"kernels/embedding.{_TARGET}", f"kernels/lm_head_sample.{_TARGET}"]
    lengths = _state_view("lengths", 0, 4, 4)  # one int32 per request slot
    prefill = pb.GraphContract(
        name="prefill_t32", operation=pb.OPERATION_PREFILL,
        batch_capacity=1, token_capacity=_PREFILL_TOKENS, state_rows_per_request=1,
        bindings=[
            pb.ValueBinding(destination="prompt_tokens", source=pb.VALUE_SOURCE_PROMPT_TOKENS,
                            indexing=pb.INDEXING_PACKED_TOKEN),
            pb.ValueBinding(destination="prompt_positions",
                            source=pb.VALUE_SOURCE_PROMPT_POSITIONS,
                            indexing=pb.INDEXING_PACKED_TOKEN),
            pb.ValueBinding(destination="prefill_slot", source=pb.VALUE_SOURCE_SLOT,
                            indexing=pb.INDEXING_SUBMISSION_ROW),
            pb.ValueBinding(destination="page_table", source=pb.VALUE_SOURCE_PAGE_TABLE,
                            indexing=pb.INDEXING_PHYSICAL_REQUEST_ROW),
        ],
        state_accesses=[pb.StateAccess(view=lengths, access=pb.ACCESS_WRITE)],
        completion_cursor=pb.CompletionCursor(has_draft_cursor=False),
        resource_dependencies=weights + kernels,
    )
    decode = pb.GraphContract(
        name="decode_b4", operation=pb.OPERATION_DECODE,
        batch_capacity=_SLOTS, token_capacity=_SLOTS, state_rows_per_request=1,
        bindings=[
            pb.ValueBinding(destination="decode_tokens", source=pb.VALUE_SOURCE_PENDING_TOKEN,
                            indexing=pb.INDEXING_SUBMISSION_ROW),
            pb.ValueBinding(destination="decode_slots", source=pb.VALUE_SOURCE_SLOT,
                            indexing=pb.INDEXING_SUBMISSION_ROW),
            pb.ValueBinding(destination="temperature", source=pb.VALUE_SOURCE_TEMPERATURE,
                            indexing=pb.INDEXING_SUBMISSION_ROW),
            pb.ValueBinding(destination="page_table", source=pb.VALUE_SOURCE_PAGE_TABLE,
                            indexing=pb.INDEXING_PHYSICAL_REQUEST_ROW),
        ],
        state_accesses=[pb.StateAccess(view=lengths, access=pb.ACCESS_READ_WRITE)],
        completion_cursor=pb.CompletionCursor(has_draft_cursor=False),
        resource_dependencies=weights + kernels,
    )
    frontend = fpb.FrontendContract(
        tool_parser=fpb.TOOL_PARSER_NONE, reasoning_parser=fpb.REASONING_PARSER_NONE,
        image_preparation=fpb.IMAGE_PREPARATION_NONE, image_layout=fpb.IMAGE_LAYOUT_NONE)
    model = pb.ModelContract(
        version=3,
        vocabulary=pb.Vocabulary(sampled_tokens=_VOCAB, histogram_width=_VOCAB,
                                 mask_words=_VOCAB // 32),
        input_vocabulary=pb.InputVocabulary(input_tokens=_VOCAB),
        vision=pb.VisionContract(),
        cache=pb.CacheContract(
            page_tokens=_PAGE_TOKENS,
            regions=[pb.HistoryRegion(name="kv", kind=pb.HISTORY_KIND_PAGED_KV,
                                      planes=["k_cache", "v_cache"], tokens_per_record=1)],
            page_table_views=[pb.PageTableView(region="kv", buffer="page_table")]),
        graphs=[prefill, decode],
        frontend=frontend,
    )
    return pb.ServingContract(
        served_id="tiny-llama", aliases=["tiny"], cache_identity="tiny-llama/kv-f32-p16/v1",
        context_tokens=_CONTEXT_TOKENS, prefill_chunk_tokens=_PREFILL_TOKENS,
        prepared_pages=_PAGES, prepared_snapshots=4, selected_concurrency=_SLOTS,
        defaults=pb.ServingDefaults(
            sampling=pb.SamplingDefaults(temperature=0.7, top_p=0.9, top_k=40, min_p=0.0,
                                         presence_penalty=0.0, frequency_penalty=0.0,
                                         repetition_penalty=1.0, max_output_tokens=64),
            max_active=_SLOTS, queue_capacity=16, frontend_workers=2, event_capacity=256),
        eos_token_ids=[2],
        template_tokens=pb.TemplateTokens(bos_token="<s>", eos_token="</s>",
                                          control_tokens=["<|user|>", "<|assistant|>"]),
        model=model,
    )


def _buffer(name: str, dtype: int, shape: list[int], role: int,
            resource: str = "") -> mpb.Buffer:
    return mpb.Buffer(name=name, dtype=dtype, shape=shape, role=role, weight_resource_id=resource)


def _kernel(kid: str, op: str, params: list[tuple[str, int]]) -> mpb.Kernel:
    return mpb.Kernel(
        id=kid, reference_op=op,
        params=[mpb.KernelParam(name=n, kind=k) for n, k in params],
        binaries=[mpb.KernelBinary(target=_TARGET, resource_id=f"kernels/{kid}.{_TARGET}",
                                   entry_name=f"{kid}_kernel", num_warps=4)])


def _launch(kernel: str, grid: int, args: list[str | int]) -> mpb.Launch:
    return mpb.Launch(kernel=kernel, grid=[grid, 1, 1], block=[128, 1, 1], args=[
        mpb.Argument(buffer=mpb.BufferView(buffer=a)) if isinstance(a, str)
        else mpb.Argument(int_value=a) for a in args])


def sample_manifest() -> mpb.ExecutionManifest:
    """The ExecutionManifest of the sample model: 2 graphs, 2 kernels, 1 target."""
    W, C, S, R, OUT, X = (mpb.BUFFER_ROLE_WEIGHT, mpb.BUFFER_ROLE_CACHE_PLANE,
                          mpb.BUFFER_ROLE_PERSISTENT_STATE, mpb.BUFFER_ROLE_REQUEST_INPUT,
                          mpb.BUFFER_ROLE_OUTPUT, mpb.BUFFER_ROLE_SCRATCH)
    f32, i32 = mpb.D_TYPE_F32, mpb.D_TYPE_I32
    pages_per_request = _CONTEXT_TOKENS // _PAGE_TOKENS
    buffers = [
        _buffer("embed", f32, [_VOCAB, _HIDDEN], W, "weights/embed"),
        _buffer("norm", f32, [_HIDDEN], W, "weights/norm"),
        _buffer("k_cache", f32, [_PAGES, _PAGE_TOKENS, _HIDDEN], C),
        _buffer("v_cache", f32, [_PAGES, _PAGE_TOKENS, _HIDDEN], C),
        _buffer("page_table", i32, [_SLOTS, pages_per_request], S),
        _buffer("lengths", i32, [_SLOTS, 1], S),
        _buffer("prompt_tokens", i32, [_PREFILL_TOKENS], R),
        _buffer("prompt_positions", i32, [_PREFILL_TOKENS], R),
        _buffer("prefill_slot", i32, [1], R),
        _buffer("decode_tokens", i32, [_SLOTS], R),
        _buffer("decode_slots", i32, [_SLOTS], R),
        _buffer("temperature", f32, [_SLOTS], R),
        _buffer("hidden", f32, [_PREFILL_TOKENS, _HIDDEN], X),
        _buffer("sampled", i32, [_SLOTS], OUT),
    ]
    buf, i32p = mpb.PARAM_KIND_BUFFER, mpb.PARAM_KIND_I32
    kernels = [
        _kernel("embedding", "embedding", [("ids", buf), ("table", buf), ("out", buf),
                                           ("rows", i32p)]),
        _kernel("lm_head_sample", "greedy_sample", [("hidden", buf), ("table", buf),
                                                    ("out", buf), ("rows", i32p)]),
    ]
    table_nbytes = _SLOTS * pages_per_request * 4
    prefill = mpb.GraphProgram(
        name="prefill_t32", operation=pb.OPERATION_PREFILL, batch_capacity=1,
        token_capacity=_PREFILL_TOKENS,
        launches=[_launch("embedding", _PREFILL_TOKENS,
                          ["prompt_tokens", "embed", "hidden", _PREFILL_TOKENS]),
                  _launch("lm_head_sample", 1, ["hidden", "embed", "sampled", 1])],
        transports=[mpb.Transport(destination="prompt_tokens", nbytes=_PREFILL_TOKENS * 4),
                    mpb.Transport(destination="prompt_positions", nbytes=_PREFILL_TOKENS * 4),
                    mpb.Transport(destination="prefill_slot", nbytes=4),
                    mpb.Transport(destination="page_table", nbytes=table_nbytes)],
        completion=mpb.CompletionLayout(buffer="sampled", rows=1))
    decode = mpb.GraphProgram(
        name="decode_b4", operation=pb.OPERATION_DECODE, batch_capacity=_SLOTS,
        token_capacity=_SLOTS,
        launches=[_launch("embedding", _SLOTS, ["decode_tokens", "embed", "hidden", _SLOTS]),
                  _launch("lm_head_sample", _SLOTS, ["hidden", "embed", "sampled", _SLOTS])],
        transports=[mpb.Transport(destination="decode_tokens", nbytes=_SLOTS * 4),
                    mpb.Transport(destination="decode_slots", nbytes=_SLOTS * 4),
                    mpb.Transport(destination="temperature", nbytes=_SLOTS * 4),
                    mpb.Transport(destination="page_table", nbytes=table_nbytes)],
        completion=mpb.CompletionLayout(buffer="sampled", rows=_SLOTS))
    return mpb.ExecutionManifest(abi="helios-exec-1", buffers=buffers, kernels=kernels,
                                 graphs=[prefill, decode], targets=[_TARGET])


def sample_resources() -> list[tuple[str, int, bytes]]:
    """(resource id, ResourceKind, decoded bytes) of the sample core, deterministic."""
    rng = np.random.default_rng(20261129)
    embed = rng.standard_normal((_VOCAB, _HIDDEN), dtype=np.float32)
    norm = np.ones(_HIDDEN, dtype=np.float32)
    tokenizer = json.dumps({"version": "1.0", "model": {
        "type": "WordLevel", "vocab": {f"t{i}": i for i in range(_VOCAB)}, "unk_token": "t0"}},
        sort_keys=True).encode()
    template = (b"{% for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>{% endfor %}"
                b"{% if add_generation_prompt %}<|assistant|>{% endif %}")

    def cubin(name: str) -> bytes:  # stand-in binary: an ELF magic then seeded bytes
        return b"\x7fELF" + np.random.default_rng(len(name)).bytes(3000)

    K = core_pb2
    return [
        ("weights/embed", K.RESOURCE_KIND_WEIGHTS, embed.tobytes()),
        ("weights/norm", K.RESOURCE_KIND_WEIGHTS, norm.tobytes()),
        (f"kernels/embedding.{_TARGET}", K.RESOURCE_KIND_KERNEL_BINARY, cubin("embedding")),
        (f"kernels/lm_head_sample.{_TARGET}", K.RESOURCE_KIND_KERNEL_BINARY,
         cubin("lm_head_sample")),
        ("tokenizer/tokenizer.json", K.RESOURCE_KIND_TOKENIZER, tokenizer),
        ("chat_template/template.jinja", K.RESOURCE_KIND_CHAT_TEMPLATE, template),
    ]


def write_sample_core(path: str | os.PathLike[str], key: Ed25519PrivateKey, *,
                      namespace: str = SAMPLE_NAMESPACE, protected_version: int | None = None,
                      resource_key: bytes | None = None) -> None:
    """Write the sample as a payload core, or a logical-resource core when
    ``protected_version`` is 6 or 4 (4 needs ``resource_key``)."""
    if protected_version is None:
        writer: CoreWriter = CoreWriter(path, key, None, namespace)
    else:
        writer = LogicalCoreWriter(path, key, None, namespace, version=protected_version,
                                   resource_key=resource_key)
    with writer:
        for rid, kind, data in sample_resources():
            writer.add_resource(rid, kind, data)
        writer.finish(sample_contract(), sample_manifest())
