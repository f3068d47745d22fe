"""The Llama family forward pass, written once against the program builder.

Captured per graph variant: PREFILL (packed prompt tokens across rows, per prefill token
capacity) and DECODE (one pending token per row, per batch capacity). Buffers are shared
across variants; each variant uses the leading rows of the request inputs and scratch.

Layer math (HF Llama): h = rmsnorm(r); r += o_proj(attn(rope(qkv(h)))); h = rmsnorm(r);
r += down(silu(gate(h)) * up(h)). Q/K/V and gate/up projections are fused into one
`[out, in]` matrix each (fused QKV, fused gate_up), so a decode step reads each weight
once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from helios_contract.schema import contract_pb2 as cpb
from helios_contract.schema import manifest_pb2 as mpb
from helios_tools.kernels import grammar_mask_words

from ..capture import launch
from ..capture.builder import BufferTable, ProgramBuilder
from ..preparation import contract as decl
from ..recipe import Capacities


@dataclass(frozen=True)
class LlamaShapes:
    """Geometry the forward pass needs (read from the checkpoint)."""

    vocab: int
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    tied: bool

    @property
    def qkv_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @classmethod
    def from_geometry(cls, g) -> LlamaShapes:
        return cls(vocab=g.vocab_size, hidden=g.hidden_size, ffn=g.intermediate_size,
                   layers=g.num_layers, heads=g.num_heads, kv_heads=g.num_kv_heads,
                   head_dim=g.head_dim, rope_theta=float(g.rope_theta),
                   rms_eps=float(g.rms_eps), tied=bool(g.tie_word_embeddings))


INPUT_NAMES = {
    "tokens": "in.tokens", "positions": "in.positions", "token_row": "in.token_row",
    "slot": "in.slot", "query_length": "in.query_length",
    "sampling_decision": "in.sampling_decision", "seed": "in.seed",
    "temperature": "in.temperature", "top_p": "in.top_p", "top_k": "in.top_k",
    "min_p": "in.min_p", "presence": "in.presence", "frequency": "in.frequency",
    "repetition": "in.repetition", "grammar_mask": "in.grammar_mask",
    "use_mask": "in.use_mask", "histogram": "state.histogram",
}
PAGE_TABLE = "state.page_table"
PENDING = "state.pending_token"  # device-owned pending token, one i32 per slot
SAMPLED = "out.sampled"


def weight_layout(s: LlamaShapes) -> dict[str, tuple[int, ...]]:
    """Weight buffer name -> shape `[out, in]` (norms and rope table are vectors)."""
    shapes: dict[str, tuple[int, ...]] = {"embed": (s.vocab, s.hidden)}
    for i in range(s.layers):
        shapes[f"L{i}.attn_norm"] = (s.hidden,)
        shapes[f"L{i}.wqkv"] = (s.qkv_width, s.hidden)
        shapes[f"L{i}.wo"] = (s.hidden, s.heads * s.head_dim)
        shapes[f"L{i}.ffn_norm"] = (s.hidden,)
        shapes[f"L{i}.w_gate_up"] = (2 * s.ffn, s.hidden)
        shapes[f"L{i}.w_down"] = (s.hidden, s.ffn)
    shapes["final_norm"] = (s.hidden,)
    if not s.tied:
        shapes["lm_head"] = (s.vocab, s.hidden)
    shapes["rope_inv_freq"] = (s.head_dim // 2,)
    return shapes


def weight_resource_id(name: str) -> str:
    return f"weights/{name}"


def decode_splits(context_tokens: int) -> tuple[int, int]:
    """(splits NS, positions per split SPLIT) of split-context decode attention: splits of
    64 positions (one block of the GPU kernel), at most 64 per row (longer contexts get
    longer splits)."""
    split = max(64, -(-context_tokens // 64 // 64) * 64)
    return -(-context_tokens // split), split


def declare_buffers(s: LlamaShapes, caps: Capacities, weight_dtype: str) -> BufferTable:
    """The physical buffer table shared by every graph variant."""
    t = BufferTable()
    for name, shape in weight_layout(s).items():
        dtype = "f32" if len(shape) == 1 else weight_dtype  # norms and rope stay f32
        t.declare(name, dtype, shape, "weight", weight_resource_id(name))
    slots = max(caps.decode_batch)
    rows = max(slots, caps.prefill_rows)
    tokens = max(max(caps.prefill_tokens), slots)
    pages_per_request = caps.context_tokens // caps.page_tokens
    words = grammar_mask_words(s.vocab)
    n = INPUT_NAMES
    for key in ("tokens", "positions", "token_row"):
        t.declare(n[key], "i32", (tokens,), "input")
    for key in ("slot", "query_length", "sampling_decision", "top_k", "use_mask"):
        t.declare(n[key], "i32", (rows,), "input")
    for key in ("temperature", "top_p", "min_p", "presence", "frequency", "repetition"):
        t.declare(n[key], "f32", (rows,), "input")
    t.declare(n["seed"], "u32", (rows, 2), "input")
    t.declare(n["grammar_mask"], "i32", (rows, words), "input")
    t.declare(PAGE_TABLE, "i32", (slots, pages_per_request), "state")
    t.declare(n["histogram"], "i32", (slots, s.vocab), "state")
    t.declare(PENDING, "i32", (slots,), "state")
    for i in range(s.layers):
        for plane in ("k", "v"):
            t.declare(f"L{i}.{plane}_cache", "f32",
                      (caps.prepared_pages, caps.page_tokens, s.kv_heads, s.head_dim), "cache")
    for name, width in (("x", s.hidden), ("residual", s.hidden), ("h", s.hidden),
                        ("qkv", s.qkv_width), ("attn", s.heads * s.head_dim),
                        ("gate_up", 2 * s.ffn), ("act", s.ffn)):
        t.declare(f"scratch.{name}", "f32", (tokens, width), "scratch")
    ns, _ = decode_splits(pages_per_request * caps.page_tokens)
    t.declare("scratch.attn_ml", "f32", (slots, s.heads, ns, 2), "scratch")
    t.declare("scratch.attn_o", "f32", (slots, s.heads, ns, s.head_dim), "scratch")
    t.declare("scratch.last", "f32", (rows, s.hidden), "scratch")
    t.declare("scratch.logits", "f32", (rows, s.vocab), "scratch")
    t.declare(SAMPLED, "i32", (rows,), "output")
    return t


def _forward(b: ProgramBuilder, s: LlamaShapes, caps: Capacities, tokens: int, rows: int,
             decode: bool, device_pending: bool) -> None:
    """Record one variant: `tokens` packed tokens over `rows` submission rows.

    With `device_pending`, decode reads each row's fed token from the slot's pending-token
    state and every sampling row writes its sampled id back there (specification: "Host
    values and graph state"), so step N + 1 can be submitted before step N completes.
    """
    t = b.table
    T, R, D = tokens, rows, s.hidden
    H, KVH, HD = s.heads, s.kv_heads, s.head_dim
    QKV, F = s.qkv_width, s.ffn
    PT = caps.page_tokens
    MP = caps.context_tokens // PT
    pages = t.buffers["L0.k_cache"].shape[0]
    slots = t.buffers[PAGE_TABLE].shape[0]
    n = INPUT_NAMES

    def scratch(name: str, width: int, count: int = T):
        return t.view(f"scratch.{name}", (count, width))

    def inp(key: str, count: int, width: int | None = None):
        shape = (count,) if width is None else (count, width)
        return t.view(n[key], shape)

    toks, pos, trow = inp("tokens", T), inp("positions", T), inp("token_row", T)
    slot = inp("slot", R)
    page_table = t.view(PAGE_TABLE, (slots, MP))
    x, res, h = scratch("x", D), scratch("residual", D), scratch("h", D)
    qkv, attn = scratch("qkv", QKV), scratch("attn", H * HD)
    gate_up, act = scratch("gate_up", 2 * F), scratch("act", F)
    inv_freq = t.view("rope_inv_freq", (HD // 2,))
    scale = 1.0 / math.sqrt(HD)

    pending = t.view(PENDING, (slots,))
    if decode and device_pending:
        b.launch("slot_gather", pending, slot, toks, R, slots)
    b.launch("embedding", toks, t.view("embed", (s.vocab, D)), res, T, D)
    b.launch("rmsnorm", res, t.view("L0.attn_norm", (D,)), h, T, D, s.rms_eps)
    for i in range(s.layers):
        kc = t.view(f"L{i}.k_cache", (pages, PT, KVH, HD))
        vc = t.view(f"L{i}.v_cache", (pages, PT, KVH, HD))
        b.launch("linear", h, t.view(f"L{i}.wqkv", (QKV, D)), qkv, T, QKV, D)
        if launch.fuse_rope_kv_write():
            b.launch("rope_kv_write", qkv, pos, inv_freq, trow, slot, page_table, kc, vc,
                     T, R, MP, PT, H, KVH, HD)
        else:
            b.launch("rope", qkv, pos, inv_freq, T, H, KVH, HD)
            b.launch("kv_write", qkv, pos, trow, slot, page_table, kc, vc, T, R, MP, PT, H,
                     KVH, HD)
        if decode:  # split over the context, then merged (flash-decoding)
            ns, split = decode_splits(MP * PT)
            part_ml = t.view("scratch.attn_ml", (T, H, ns, 2))
            part_o = t.view("scratch.attn_o", (T, H, ns, HD))
            b.launch("attention_decode_split", qkv, pos, slot, page_table, kc, vc, part_ml,
                     part_o, T, MP, PT, H, KVH, HD, ns, split, scale)
            b.launch("attention_decode_merge", part_ml, part_o, slot, attn, T, H, HD, ns)
        else:
            b.launch("attention_prefill", qkv, pos, trow, slot, page_table, kc, vc, attn,
                     T, R, MP, PT, H, KVH, HD, scale)
        b.launch("linear", attn, t.view(f"L{i}.wo", (D, H * HD)), x, T, D, H * HD)
        b.launch("add_rmsnorm", x, res, t.view(f"L{i}.ffn_norm", (D,)), h, T, D, s.rms_eps)
        b.launch("linear", h, t.view(f"L{i}.w_gate_up", (2 * F, D)), gate_up, T, 2 * F, D)
        if decode and launch.fuse_swiglu_linear(T, D):  # SwiGLU applied as the GEMV loads
            b.launch("swiglu_linear", gate_up, t.view(f"L{i}.w_down", (D, F)), x, T, D, F)
        else:
            b.launch("silu_mul", gate_up, act, T, F)
            b.launch("linear", act, t.view(f"L{i}.w_down", (D, F)), x, T, D, F)
        next_norm = f"L{i + 1}.attn_norm" if i + 1 < s.layers else "final_norm"
        b.launch("add_rmsnorm", x, res, t.view(next_norm, (D,)), h, T, D, s.rms_eps)
    head = t.view("embed" if s.tied else "lm_head", (s.vocab, D))
    logits = t.view("scratch.logits", (R, s.vocab))
    if decode:
        b.launch("linear", h, head, logits, R, s.vocab, D)
    else:
        last = t.view("scratch.last", (R, D))
        b.launch("gather_last", h, inp("query_length", R), last, T, R, D)
        b.launch("linear", last, head, logits, R, s.vocab, D)
    words = grammar_mask_words(s.vocab)
    b.launch("sample", logits, slot, pos if decode else _last_positions(b, R),
             inp("sampling_decision", R), inp("seed", R, 2), inp("temperature", R),
             inp("top_p", R), inp("top_k", R), inp("min_p", R), inp("presence", R),
             inp("frequency", R), inp("repetition", R),
             t.view(n["histogram"], (slots, s.vocab)), inp("grammar_mask", R, words),
             inp("use_mask", R), t.view(SAMPLED, (R,)), R, s.vocab, words)
    if device_pending:
        b.launch("slot_scatter", t.view(SAMPLED, (R,)), slot, inp("sampling_decision", R),
                 pending, R, slots)


def _last_positions(b: ProgramBuilder, rows: int):
    """Per-row RNG positions for prefill: each row's last fed token.

    Decode rows key the sampler with the fed token's position; prefill rows with the
    position of their chunk's last token, bound as CONSUMED_ENDPOINT - 1 per submission
    row, so a request draws the same numbers whichever step samples it.
    """
    return b.table.view("in.sample_position", (rows,))


def capture(s: LlamaShapes, caps: Capacities, weight_dtype: str, *, device_pending: bool = True
            ) -> tuple[mpb.ExecutionManifest, list[cpb.GraphContract]]:
    """Capture every graph variant and declare their contracts.

    Args:
        device_pending: keep the pending token on the device (decode reads it from
            PENDING, sampling rows write it) rather than binding it from the host.

    Returns:
        The execution manifest (buffers, kernel variants, graph programs) and one
        GraphContract per variant, in the same order.
    """
    table = declare_buffers(s, caps, weight_dtype)
    rows = max(max(caps.decode_batch), caps.prefill_rows)
    table.declare("in.sample_position", "i32", (rows,), "input")
    kernels: dict[str, mpb.Kernel] = {}
    programs: list[mpb.GraphProgram] = []
    contracts: list[cpb.GraphContract] = []
    variants = [("decode", b, b) for b in caps.decode_batch]
    variants += [("prefill", t, caps.prefill_rows) for t in caps.prefill_tokens]
    for kind, tokens, nrows in variants:
        builder = ProgramBuilder(table, kernels)
        decode = kind == "decode"
        _forward(builder, s, caps, tokens, nrows, decode, device_pending)
        name = f"{kind}_b{tokens}" if decode else f"prefill_t{tokens}"
        op = cpb.OPERATION_DECODE if decode else cpb.OPERATION_PREFILL
        program = mpb.GraphProgram(name=name, operation=op, batch_capacity=nrows,
                                   token_capacity=tokens, launches=builder.launches,
                                   completion=mpb.CompletionLayout(buffer=SAMPLED, rows=nrows))
        contract = _graph_contract(name, op, nrows, tokens, s, table, device_pending)
        for b in contract.bindings:
            decl_ = table.buffers[b.destination]
            program.transports.add(destination=b.destination,
                                   nbytes=decl_.numel * (2 if decl_.dtype == "bf16" else 4))
        programs.append(program)
        contracts.append(contract)
    manifest = mpb.ExecutionManifest(abi="helios-numpy-1", buffers=table.to_proto(),
                                     kernels=list(kernels.values()), graphs=programs)
    return manifest, contracts


def _graph_contract(name: str, op: int, rows: int, tokens: int, s: LlamaShapes,
                    table: BufferTable, device_pending: bool) -> cpb.GraphContract:
    decode = op == cpb.OPERATION_DECODE
    slots = table.buffers[PAGE_TABLE].shape[0]
    g = cpb.GraphContract(name=name, operation=op, batch_capacity=rows, token_capacity=tokens,
                          state_rows_per_request=1,
                          completion_cursor=cpb.CompletionCursor(has_draft_cursor=False))
    g.bindings.extend(decl.shared_admission(INPUT_NAMES, prefill=not decode,
                                            device_pending=device_pending))
    g.bindings.extend(decl.sampling(INPUT_NAMES))
    if not decode:
        g.bindings.append(decl.binding("in.sample_position", cpb.VALUE_SOURCE_CONSUMED_ENDPOINT,
                                       cpb.INDEXING_SUBMISSION_ROW, offset=-1))
    pt_bindings, pt_access = decl.paged_text(PAGE_TABLE, table.buffers[PAGE_TABLE].shape[1] * 4,
                                             slots)
    g.bindings.extend(pt_bindings)
    g.state_accesses.extend(pt_access)
    g.state_accesses.extend(decl.state_transfer(INPUT_NAMES["histogram"], s.vocab * 4, slots))
    if device_pending:
        view, access = decl.device_pending_token(PENDING, generating=decode)
        g.pending_token.CopyFrom(view)
        g.state_accesses.append(access)
    return g


def rope_inv_freq(s: LlamaShapes, rope_scaling: dict | None) -> np.ndarray:
    """f32 [head_dim/2] inverse frequencies, with Llama-3 scaling when declared.

    Source: HF transformers `_compute_llama3_parameters` (rope_type "llama3").
    """
    inv = 1.0 / (s.rope_theta ** (np.arange(0, s.head_dim, 2, dtype=np.float64) / s.head_dim))
    if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) == "llama3":
        factor = float(rope_scaling["factor"])
        low = float(rope_scaling.get("low_freq_factor", 1.0))
        high = float(rope_scaling.get("high_freq_factor", 4.0))
        original = float(rope_scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        low_wavelen, high_wavelen = original / low, original / high
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (original / wavelen - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = np.where(is_mid, mid, scaled)
    return inv.astype(np.float32)
