"""The Llama family forward pass, written once against the program builder.

Captured per graph variant: PREFILL (packed prompt tokens across rows, per prefill token
capacity), DECODE (one pending token per row, per batch capacity), in a core with a
learned drafter SPECULATIVE (per batch capacity and width: draft, verify, commit), and
with transfer rows one RESTORE program per storage route (rows copied between pages,
continuation rows and host-tier rows: snapshots, restores, the host tier).
Buffers are shared across variants; each variant uses the leading rows of the request
inputs and scratch.

Layer math (HF Llama): h = rmsnorm(r); r += o_proj(attn(rope(qkv(h)))); h = rmsnorm(r);
r += down(silu(gate(h)) * up(h)). Q/K/V and gate/up projections are fused into one
`[out, in]` matrix each (fused QKV, fused gate_up), so a decode step reads each weight
once.

Tensor parallelism (`LlamaShapes.ranks` = N > 1; Megatron-LM's split, arXiv:1909.08053
§3): the shapes are one rank's. Each rank holds its H/N query and KVH/N key/value heads
(its `wqkv` is the fused [q; k; v] of those heads: column-parallel), F/N of the FFN
(`w_gate_up` = [gate; up] of its columns), the matching columns of `wo` and `w_down`
(row-parallel: an `all_reduce_sum` follows each) and ceil(V/N) rows of the LM head
(vocabulary-parallel: `all_gather_columns` assembles the logits, so every rank samples
the same token from the same logits). Embeddings, norms and the RoPE table are replicated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from helios_contract import PROPOSAL_CONFIDENCE
from helios_contract.schema import contract_pb2 as cpb
from helios_contract.schema import manifest_pb2 as mpb
from helios_tools.kernels import grammar_mask_words
from helios_tools.kernels.sampling_chunks import CANDIDATES, CHUNK, NUCLEUS
from helios_tools.kernels.speculative import RECORD_FIELDS

from ..capture import launch
from ..capture.builder import BufferTable, ProgramBuilder
from ..checkpoint.drafter import DrafterGeometry
from ..preparation import contract as decl
from ..recipe import Capacities, SplitTuning
from . import draft


class TensorParallelError(ValueError):
    """The model cannot be split between the asked number of ranks."""


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
    # Tensor-parallel ranks these shapes are one rank's of (heads, kv_heads and ffn are
    # that rank's share; vocab and hidden are the model's).
    ranks: int = 1

    @property
    def qkv_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def head_rows(self) -> int:
        """LM-head rows of one rank: ceil(vocab / ranks) (the last rank's pad rows are
        zero and its pad logits dropped by the gather)."""
        return -(-self.vocab // self.ranks)

    def shard(self, ranks: int) -> LlamaShapes:
        """One rank's shapes under `ranks`-way tensor parallelism.

        Raises:
            TensorParallelError: `ranks` < 1, these shapes are already a rank's, or the
                query heads, key/value heads or FFN width do not divide by `ranks`
                (the message names the counts).
        """
        if ranks < 1:
            raise TensorParallelError(f"tensor parallel size must be >= 1, got {ranks}")
        if self.ranks != 1:
            raise TensorParallelError("these shapes are already one rank's")
        if ranks == 1:
            return self
        if self.heads % ranks or self.kv_heads % ranks:
            raise TensorParallelError(
                f"the model's {self.heads} query heads and "
                f"{self.kv_heads} key/value heads must both divide by {ranks}")
        if self.ffn % ranks:
            raise TensorParallelError(f"the model's FFN width {self.ffn} does not divide "
                                      f"by {ranks}")
        return replace(self, heads=self.heads // ranks, kv_heads=self.kv_heads // ranks,
                       ffn=self.ffn // ranks, ranks=ranks)

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
    "use_bias": "in.use_bias", "logit_bias": "state.logit_bias", "logprobs": "in.logprobs",
}
PAGE_TABLE = "state.page_table"
PENDING = "state.pending_token"  # device-owned pending token, one i32 per slot
SAMPLED = "out.sampled"
# Startup tuning of the decode split count (recipe.SplitTuning): the tuned buffer every
# decode-attention graph reads and the producer in the manifest's tuning catalog that
# writes it.
TUNED_SPLITS = "tuned.decode_splits"
SPLIT_PRODUCER = "tune.decode_splits"
LOGPROBS = "out.logprobs"  # f32 [rows, 1 + TOP_LOGPROBS]: sampled token, then the top ids
TOP_IDS = "out.top_ids"  # i32 [rows, TOP_LOGPROBS]


def weight_layout(s: LlamaShapes) -> dict[str, tuple[int, ...]]:
    """Weight buffer name -> one rank's shape `[out, in]` (norms and rope table are
    vectors). Under tensor parallelism every core has an `lm_head` (a tied head's rank
    shard is cut from the embedding)."""
    shapes: dict[str, tuple[int, ...]] = {"embed": (s.vocab, s.hidden)}
    for i in range(s.layers):
        shapes[f"L{i}.attn_norm"] = (s.hidden,)
        shapes[f"L{i}.wqkv"] = (s.qkv_width, s.hidden)
        shapes[f"L{i}.wo"] = (s.hidden, s.heads * s.head_dim)
        shapes[f"L{i}.ffn_norm"] = (s.hidden,)
        shapes[f"L{i}.w_gate_up"] = (2 * s.ffn, s.hidden)
        shapes[f"L{i}.w_down"] = (s.hidden, s.ffn)
    shapes["final_norm"] = (s.hidden,)
    if s.ranks > 1:
        shapes["lm_head"] = (s.head_rows, s.hidden)
    elif not s.tied:
        shapes["lm_head"] = (s.vocab, s.hidden)
    shapes["rope_inv_freq"] = (s.head_dim // 2,)
    return shapes


def weight_split(name: str) -> int | None:
    """The axis along which tensor-parallel ranks split weight buffer `name` (0: output
    rows, column-parallel; 1: input columns, row-parallel), or None when replicated."""
    kind = name.split(".", 1)[-1]
    return {"wqkv": 0, "w_gate_up": 0, "lm_head": 0, "wo": 1, "w_down": 1}.get(kind)


def weight_resource_id(name: str) -> str:
    return f"weights/{name}"


def rank_weight_resource_id(name: str, rank: int) -> str:
    """The resource of rank `rank`'s part of a weight split between ranks."""
    return f"weights/rank{rank}/{name}"


def head_buffer(s: LlamaShapes) -> str:
    """The LM head's weight buffer (a single-rank tied core reads the embedding)."""
    return "embed" if s.tied and s.ranks == 1 else "lm_head"


def decode_splits(context_tokens: int) -> tuple[int, int]:
    """(splits NS, positions per split SPLIT) of split-context decode attention: splits of
    64 positions (one tile of the GPU kernel), at most 128 per row (longer contexts get
    longer splits; up to 8,192 positions every split is one tile: 2.6-3.5x faster than
    two-tile splits on the H200, bench/results/h200_2026-12-02/attn_long_aad133f.json).
    The partition depends on the capacity only, never on the batch, so a row's result
    does not depend on the other rows. Cores exported before record their own NS and
    SPLIT (at most 64 splits)."""
    split = max(64, -(-context_tokens // 128 // 64) * 64)
    return -(-context_tokens // split), split


@dataclass(frozen=True)
class Speculation:
    """A drafter core's speculative capture (model-contract.md, "Complete speculative
    generation"): the head's geometry and the captured widths W. Each decode batch B gets
    one SPECULATIVE program per W with D = W - 1 draft tokens and P = B x W packed rows.

    `coupled`: sampled rows use coupled (drafter-invariant) verification
    (`draft_sample_coupled`, `spec_copy_drafts`, `spec_verify_coupled`: every emitted
    token is the target's own stream-0 draw, so seeded text equals decode's whatever
    the lane lengths); False records standard speculative sampling (`draft_sample`,
    `spec_copy_candidates`, `spec_verify` and the q buffer), as cores exported before
    coupling do (they keep loading and running unchanged)."""

    drafter: DrafterGeometry
    widths: tuple[int, ...]
    coupled: bool = True

    @property
    def max_width(self) -> int:
        return max(self.widths)

    @property
    def prefix_batches(self) -> bool:
        """Whether batches B >= 2 also get a SPECULATIVE_PREFIX_LIMIT program at the
        widest W with P = PREFIX_ROWS_PER_LANE x B (the device allocates the rows)."""
        return self.max_width > PREFIX_ROWS_PER_LANE


# Verification rows per lane of a prefix-limit program: P = 2 B rows shared by B lanes of
# ceiling W (a lane keeps its pending row; the other B rows go to the likeliest drafts).
PREFIX_ROWS_PER_LANE = 2

SPEC_NAMES = {"generation": "in.generation", "lane_start": "in.lane_start",
              "token_slot": "in.token_slot", "lane_ceiling": "in.lane_ceiling",
              "cand_ids": "in.cand_ids", "cand_count": "in.cand_count",
              "cand_generation": "in.cand_generation", "cand_endpoint": "in.cand_endpoint",
              "cand_masks": "state.cand_masks"}
RECORD = "out.record"
# PROPOSAL_CONFIDENCE (helios_contract): f32 [2, slots, D], model-contract.md, "Complete
# speculative generation"; rules speculative.confidence_buffer / _record check it.
TRANSFER_NAMES = {"source": "in.transfer_source", "destination": "in.transfer_destination"}
# Storage tiers of the RESTORE programs' routes, by the name used in graph names.
PAGES, CONTINUATION, HOST = "pages", "continuation", "host"
HOST_PREPARED_ROWS = 1  # host-tier planes are sized at load; the manifest holds one row


def paged_planes(s: LlamaShapes, spec: Speculation | None = None) -> list[str]:
    """Planes of every paged region, in region order (the target's K/V per layer, then
    the draft head's K/V and features): the page rows a transfer moves together."""
    planes = [f"L{i}.{p}_cache" for i in range(s.layers) for p in ("k", "v")]
    if spec is not None:
        planes += [draft.K_CACHE, draft.V_CACHE, draft.F_CACHE]
    return planes


def tier_plane(plane: str, tier: str) -> str:
    """The continuation or host-tier plane paired with paged `plane`."""
    return plane if tier == PAGES else f"{plane}.{tier}"


def transfer_routes(caps: Capacities) -> list[tuple[str, str]]:
    """(source, destination) tiers of the captured RESTORE programs."""
    if not caps.transfer_rows:
        return []
    routes = []
    if caps.prepared_snapshots:
        routes += [(PAGES, CONTINUATION), (CONTINUATION, PAGES)]
    if caps.host_tier:
        routes += [(PAGES, HOST), (HOST, PAGES)]
    if caps.prepared_snapshots and caps.host_tier:
        routes.append((CONTINUATION, HOST))
    return routes


def cache_contract(s: LlamaShapes, caps: Capacities,
                   spec: Speculation | None = None) -> cpb.CacheContract:
    """The CacheContract of a captured core: the paged K/V region (and the draft head's
    regions) on one page table, their host-tier planes, and continuation storage."""
    host = caps.host_tier and caps.transfer_rows > 0
    cache = cpb.CacheContract(page_tokens=caps.page_tokens)

    def region(name: str, kind: int, planes: list[str]) -> None:
        cache.regions.add(name=name, kind=kind, planes=planes, tokens_per_record=1,
                          host_planes=[tier_plane(p, HOST) for p in planes] if host else [])
        cache.page_table_views.add(region=name, buffer=PAGE_TABLE, page_offset=0)

    target = paged_planes(s)
    region("kv", cpb.HISTORY_KIND_PAGED_KV, target)
    if spec is not None:  # the head's histories share the target's page table
        region("draft_kv", cpb.HISTORY_KIND_PAGED_KV, [draft.K_CACHE, draft.V_CACHE])
        region("draft_features", cpb.HISTORY_KIND_PAGED_LATENT, [draft.F_CACHE])
    if caps.prepared_snapshots and caps.transfer_rows:
        cache.regions.add(name="continuation", kind=cpb.HISTORY_KIND_CONTINUATION,
                          planes=[tier_plane(p, CONTINUATION) for p in paged_planes(s, spec)],
                          tokens_per_record=1)
    return cache


def _layer_products(s: LlamaShapes) -> tuple[tuple[int, int], ...]:
    """(N, K) of each layer's products: QKV, O, gate/up, down."""
    return ((s.qkv_width, s.hidden), (s.hidden, s.heads * s.head_dim), (2 * s.ffn, s.hidden),
            (s.hidden, s.ffn))


def _packed_weights(dtype: str) -> bool:
    """Whether weights of `dtype` take the packed path: bf16 only (the terms are exact
    against bf16 weights; f32 weights keep the f32 linear)."""
    return dtype == "bf16"


def _declare_mma_scratch(t: BufferTable, s: LlamaShapes, weight_dtype: str,
                         tokens: int) -> None:
    """``scratch.xsplit`` (packed activation terms) and ``scratch.mma_partial`` (K-slice
    partial products), sized for every row count up to `tokens` at which capture records
    the packed path (``launch.mma_plan``); neither exists where it records none (small
    models, f32 weights, ``HELIOS_LINEAR_MMA=off``), so those cores are unchanged."""
    if not _packed_weights(weight_dtype):
        return
    width = partial = 0
    for T in range(1, tokens + 1):
        for N, K in _layer_products(s):
            S = launch.mma_plan(T, N, K)
            if S is not None:
                width = max(width, K)
                partial = max(partial, (S * T * N) if S > 1 else 0)
    if width:
        t.declare("scratch.xsplit", "f32", (tokens, width), "scratch")
    if partial:  # flat, one element over: every [S*T, N] view is a strict prefix (a view
        # of a whole buffer is handed out in the buffer's declared shape)
        t.declare("scratch.mma_partial", "f32", (partial + 1,), "scratch")


def _product(b: ProgramBuilder, lin: str, x, w, out, T: int, N: int, K: int,
             swiglu: bool = False) -> None:
    """``out = x @ w^T`` (`swiglu`: of ``silu_mul(x)``, ``x`` the ``[T, 2K]`` gate|up).

    Where ``launch.mma_plan`` picks the packed path (bf16 ``linear`` products of the 8B
    geometry at 8-256 rows): ``split_bf16`` (``swiglu_split_bf16``, which replaces
    ``silu_mul``) into ``scratch.xsplit``, ``linear_packed`` over S K slices into
    ``scratch.mma_partial`` and ``splitk_reduce`` into `out` (S = 1: straight into
    `out`). Otherwise ``silu_mul`` (if `swiglu`) and `lin`. Row-invariant products
    (``linear_invariant``) always take `lin`.
    """
    t = b.table
    S = (launch.mma_plan(T, N, K) if lin == "linear" and _packed_weights(w.buffer.dtype)
         and "scratch.xsplit" in t.buffers else None)
    if S is None:
        if swiglu:
            act = t.view("scratch.act", (T, K))
            b.launch("silu_mul", x, act, T, K)
            x = act
        b.launch(lin, x, w, out, T, N, K)
        return
    xs = t.view("scratch.xsplit", (T, K))
    b.launch("swiglu_split_bf16" if swiglu else "split_bf16", x, xs, T, K)
    if S == 1:
        b.launch("linear_packed", xs, w, out, T, N, K, 1)
        return
    part = t.view("scratch.mma_partial", (S * T, N))
    b.launch("linear_packed", xs, w, part, T, N, K, S)
    b.launch("splitk_reduce", part, out, T, N, S)


def declare_buffers(s: LlamaShapes, caps: Capacities, weight_dtype: str,
                    spec: Speculation | None = None) -> BufferTable:
    """The physical buffer table shared by every graph variant."""
    t = BufferTable()
    for name, shape in weight_layout(s).items():
        dtype = "f32" if len(shape) == 1 else weight_dtype  # norms and rope stay f32
        if s.ranks > 1 and weight_split(name) is not None:
            t.declare(name, dtype, shape, "weight", rank_weight_resource_ids=tuple(
                rank_weight_resource_id(name, r) for r in range(s.ranks)))
        else:
            t.declare(name, dtype, shape, "weight", weight_resource_id(name))
    slots = max(caps.decode_batch)
    rows = max(slots, caps.prefill_rows)
    packed = slots * spec.max_width if spec else slots  # decode rows or verify rows
    tokens = max(max(caps.prefill_tokens), packed)
    pages_per_request = caps.context_tokens // caps.page_tokens
    words = grammar_mask_words(s.vocab)
    n = INPUT_NAMES
    for key in ("tokens", "positions", "token_row"):
        t.declare(n[key], "i32", (tokens,), "input")
    for key in ("slot", "query_length", "sampling_decision", "top_k", "use_mask", "use_bias",
                "logprobs"):
        t.declare(n[key], "i32", (rows,), "input")
    for key in ("temperature", "top_p", "min_p", "presence", "frequency", "repetition"):
        t.declare(n[key], "f32", (rows,), "input")
    t.declare(n["seed"], "u32", (rows, 2), "input")
    t.declare(n["grammar_mask"], "i32", (rows, words), "input")
    t.declare(PAGE_TABLE, "i32", (slots, pages_per_request), "state")
    t.declare(n["histogram"], "i32", (slots, s.vocab), "state")
    t.declare(n["logit_bias"], "f32", (slots, s.vocab), "state")
    t.declare(PENDING, "i32", (slots,), "state")
    for i in range(s.layers):
        for plane in ("k", "v"):
            t.declare(f"L{i}.{plane}_cache", "f32",
                      (caps.prepared_pages, caps.page_tokens, s.kv_heads, s.head_dim), "cache")
    for name, width in (("x", s.hidden), ("residual", s.hidden), ("h", s.hidden),
                        ("qkv", s.qkv_width), ("attn", s.heads * s.head_dim),
                        ("gate_up", 2 * s.ffn), ("act", s.ffn)):
        t.declare(f"scratch.{name}", "f32", (tokens, width), "scratch")
    _declare_mma_scratch(t, s, weight_dtype, tokens)
    ns, _ = decode_splits(pages_per_request * caps.page_tokens)
    t.declare("scratch.attn_ml", "f32", (packed, s.heads, ns, 2), "scratch")
    t.declare("scratch.attn_o", "f32", (packed, s.heads, ns, s.head_dim), "scratch")
    if launch.fuse_decode_attention():  # split counters, zero between launches
        t.declare("scratch.attn_arrivals", "i32", (packed, s.kv_heads), "scratch")
    t.declare("scratch.last", "f32", (rows, s.hidden), "scratch")
    t.declare("scratch.logits", "f32", (max(rows, packed), s.vocab), "scratch")
    if s.ranks > 1:  # this rank's columns of the vocabulary-parallel head
        t.declare("scratch.logits_shard", "f32", (rows, s.head_rows), "scratch")
    t.declare(SAMPLED, "i32", (rows,), "output")
    if spec is not None:
        g, dmax = spec.drafter, max(spec.max_width - 1, 1)
        t.declare(SPEC_NAMES["generation"], "i32", (rows,), "input")
        t.declare(SPEC_NAMES["lane_start"], "i32", (rows,), "input")
        t.declare(SPEC_NAMES["token_slot"], "i32", (tokens,), "input")
        for key in ("lane_ceiling", "cand_count", "cand_generation", "cand_endpoint"):
            t.declare(SPEC_NAMES[key], "i32", (rows,), "input")
        t.declare(SPEC_NAMES["cand_ids"], "i32", (rows, dmax), "input")
        # per slot: uploaded only for constrained lanes (PHYSICAL_REQUEST_ROW)
        t.declare(SPEC_NAMES["cand_masks"], "i32", (slots, dmax, words), "state")
        for name in ("d_tok", "d_pos", "d_row", "d_slot", "query_length"):
            t.declare(f"spec.{name}", "i32", (rows,), "scratch")
        for name in ("positions", "token_row", "token_slot"):  # device-packed rows
            t.declare(f"spec.{name}", "i32", (tokens,), "scratch")
        if spec.prefix_batches:  # the framed record of the prefix-limit programs
            t.declare(PROPOSAL_CONFIDENCE, "f32", (2, slots, dmax), "output")
        t.declare("spec.drafts", "i32", (rows, dmax), "scratch")
        if not spec.coupled:  # standard sampling's draft distributions over target ids
            t.declare("spec.q", "f32", (rows, dmax, s.vocab), "scratch")
        t.declare("spec.tokens", "i32", (tokens,), "scratch")
        t.declare("spec.commit_row", "i32", (tokens,), "scratch")
        t.declare(RECORD, "i32", (rows, RECORD_FIELDS + spec.max_width), "output")
        draft.declare(t, g, weight_dtype, tokens, caps.prepared_pages, caps.page_tokens, ns,
                      weight_resource_id)
    t.declare(LOGPROBS, "f32", (rows, 1 + decl.TOP_LOGPROBS), "output")
    t.declare(TOP_IDS, "i32", (rows, decl.TOP_LOGPROBS), "output")
    if caps.transfer_rows:
        _declare_tiers(t, s, caps, spec)
    return t


def declare_chunked_sampling(t: BufferTable, s: LlamaShapes, rows: int,
                             nucleus: bool = True) -> None:
    """Scratch of the chunked sampler (``sample_chunks`` -> ``sample_merge``): per row, each
    chunk's maximum and arg-max, its top-k candidates, and the merged winners; with
    `nucleus` (``sample_chunks_nucleus`` -> ``sample_merge_nucleus``) also each chunk's
    softmax mass, and the staging row holds the NUCLEUS picks."""
    P = -(-s.vocab // CHUNK)
    t.declare("scratch.sample_chunk_max", "f32", (rows, P), "scratch")
    t.declare("scratch.sample_chunk_arg", "i32", (rows, P), "scratch")
    t.declare("scratch.sample_cand_key", "i32", (rows, P * CANDIDATES), "scratch")
    t.declare("scratch.sample_cand_id", "i32", (rows, P * CANDIDATES), "scratch")
    if nucleus:
        t.declare("scratch.sample_chunk_mass", "f32", (rows, P), "scratch")
        t.declare("scratch.sample_selected", "i32", (rows, 2 * max(CANDIDATES, NUCLEUS)),
                  "scratch")
    else:
        t.declare("scratch.sample_selected", "i32", (rows, 2 * CANDIDATES), "scratch")


def _sample(b: ProgramBuilder, s: LlamaShapes, R: int, logits, slot, positions, inp,
            chunked: bool, nucleus: bool) -> None:
    """Record the sampling step over `R` rows of `logits` into SAMPLED: ``sample_biased``,
    or with `chunked` its three-launch form (helios_tools.kernels.sampling_chunks: the
    vocabulary split over ``ceil(V / CHUNK)`` programs per row; same outputs), with
    `nucleus` the form that also resolves top-p rows with no top-k in the merge (cores
    exported before it record ``sample_chunks`` + ``sample_merge``; they keep loading)."""
    t = b.table
    n = INPUT_NAMES
    slots = t.buffers[PAGE_TABLE].shape[0]
    words = grammar_mask_words(s.vocab)
    sampled = t.view(SAMPLED, (R,))
    hist = t.view(n["histogram"], (slots, s.vocab))
    bias = t.view(n["logit_bias"], (slots, s.vocab))
    params = [inp("temperature", R), inp("top_p", R), inp("top_k", R), inp("min_p", R)]
    penalties = [inp("presence", R), inp("frequency", R), inp("repetition", R)]
    masks = [bias, inp("use_bias", R), inp("grammar_mask", R, words), inp("use_mask", R)]
    common = [logits, slot, positions, inp("sampling_decision", R), inp("seed", R, 2), *params,
              *penalties, hist, *masks, sampled, R, s.vocab, words]
    if not chunked:
        b.launch("sample_biased", *common)
        return
    P = -(-s.vocab // CHUNK)
    cmax = t.view("scratch.sample_chunk_max", (R, P))
    carg = t.view("scratch.sample_chunk_arg", (R, P))
    ckey = t.view("scratch.sample_cand_key", (R, P * CANDIDATES))
    cid = t.view("scratch.sample_cand_id", (R, P * CANDIDATES))
    row = [slot, positions, inp("sampling_decision", R), inp("seed", R, 2), *params, hist]
    if nucleus:
        mass = t.view("scratch.sample_chunk_mass", (R, P))
        width = 2 * max(CANDIDATES, NUCLEUS)
        b.launch("sample_chunks_nucleus", logits, slot, inp("temperature", R),
                 inp("top_p", R), inp("top_k", R), *penalties, hist, *masks, cmax, carg, mass,
                 ckey, cid, R, s.vocab, words, CHUNK, CANDIDATES)
        b.launch("sample_merge_nucleus", cmax, carg, mass, ckey, cid, *row,
                 t.view("scratch.sample_selected", (R, width)), sampled, R, s.vocab, P, CHUNK,
                 CANDIDATES, NUCLEUS)
    else:
        b.launch("sample_chunks", logits, slot, inp("temperature", R), inp("top_k", R),
                 *penalties, hist, *masks, cmax, carg, ckey, cid, R, s.vocab, words, CHUNK,
                 CANDIDATES)
        b.launch("sample_merge", cmax, carg, ckey, cid, *row,
                 t.view("scratch.sample_selected", (R, 2 * CANDIDATES)), sampled, R, s.vocab,
                 P, CANDIDATES)
    b.launch("sample_rest", *common)


def _declare_tiers(t: BufferTable, s: LlamaShapes, caps: Capacities,
                   spec: Speculation | None) -> None:
    """Continuation and host-tier planes (one per paged plane, same dtype and row shape)
    and the transfer programs' row inputs."""
    for plane in paged_planes(s, spec):
        decl = t.buffers[plane]
        if caps.prepared_snapshots:
            t.declare(tier_plane(plane, CONTINUATION), decl.dtype,
                      (caps.prepared_snapshots, *decl.shape[1:]), "cache")
        if caps.host_tier:
            t.declare(tier_plane(plane, HOST), decl.dtype,
                      (HOST_PREPARED_ROWS, *decl.shape[1:]), "cache")
    for name in TRANSFER_NAMES.values():
        t.declare(name, "i32", (caps.transfer_rows,), "input")


@dataclass(frozen=True)
class _Rows:
    """Where one pass's packed rows come from (views of the buffer table)."""

    tokens: object  # [T] i32 token ids
    positions: object  # [T] i32
    token_row: object  # [T] i32 submission row (< 0 padding)
    slot: object  # [R] i32 physical request rows
    attn_slot: object  # [T] i32 slot of each query row (decode-style attention)


def _layers(b: ProgramBuilder, s: LlamaShapes, caps: Capacities, rows: _Rows, T: int, R: int,
            *, decode_attention: bool, invariant: bool, tuned: bool = False,
            fold: bool = False) -> None:
    """Embedding, every layer and the final norm over `T` packed rows; the final-norm
    hidden states (the LM head's input) are left in `scratch.h`.

    Decode-style attention gives each row one query attending to its slot's cache up to
    its own position (decode rows, verification rows: the window's keys are written
    first, so it is causal within a lane); prefill attention is causal over a chunk.
    `invariant` records `linear_invariant` and no fused SwiGLU, so every row's result
    is independent of T (decode and verification agree bit for bit). `tuned` decode
    attention reads its split count from TUNED_SPLITS (captured at the maximum count).
    `fold` (``capture(fold_layers=True)``) records 7 launches per layer instead of 9: each
    RMS norm folded into the product that follows it (``rmsnorm_linear``: the QKV and
    gate/up products read the residual stream) and each residual add into the epilogue
    of the product before it (``linear_add`` / ``swiglu_linear_add`` add into
    ``scratch.residual``); the final norm stays one ``rmsnorm``. The composition is the
    same arithmetic as the unfolded sequence (the NumPy references are those sequences).
    """
    t = b.table
    D = s.hidden
    H, KVH, HD = s.heads, s.kv_heads, s.head_dim
    QKV, F = s.qkv_width, s.ffn
    PT = caps.page_tokens
    MP = caps.context_tokens // PT
    pages = t.buffers["L0.k_cache"].shape[0]
    slots = t.buffers[PAGE_TABLE].shape[0]
    lin = "linear_invariant" if invariant else "linear"

    def scratch(name: str, width: int, count: int = T):
        return t.view(f"scratch.{name}", (count, width))

    page_table = t.view(PAGE_TABLE, (slots, MP))
    x, res, h = scratch("x", D), scratch("residual", D), scratch("h", D)
    qkv, attn = scratch("qkv", QKV), scratch("attn", H * HD)
    gate_up, act = scratch("gate_up", 2 * F), scratch("act", F)
    inv_freq = t.view("rope_inv_freq", (HD // 2,))
    scale = 1.0 / math.sqrt(HD)
    pos, trow, slot = rows.positions, rows.token_row, rows.slot
    b.launch("embedding", rows.tokens, t.view("embed", (s.vocab, D)), res, T, D)
    if not fold:
        b.launch("rmsnorm", res, t.view("L0.attn_norm", (D,)), h, T, D, s.rms_eps)
    for i in range(s.layers):
        kc = t.view(f"L{i}.k_cache", (pages, PT, KVH, HD))
        vc = t.view(f"L{i}.v_cache", (pages, PT, KVH, HD))
        if fold:
            b.launch("rmsnorm_linear", res, t.view(f"L{i}.attn_norm", (D,)),
                     t.view(f"L{i}.wqkv", (QKV, D)), qkv, T, QKV, D, s.rms_eps)
        else:
            _product(b, lin, h, t.view(f"L{i}.wqkv", (QKV, D)), qkv, T, QKV, D)
        if launch.fuse_rope_kv_write():
            b.launch("rope_kv_write", qkv, pos, inv_freq, trow, slot, page_table, kc, vc,
                     T, R, MP, PT, H, KVH, HD)
        else:
            b.launch("rope", qkv, pos, inv_freq, T, H, KVH, HD)
            b.launch("kv_write", qkv, pos, trow, slot, page_table, kc, vc, T, R, MP, PT, H,
                     KVH, HD)
        if decode_attention:  # split over the context, then merged (flash-decoding)
            ns, split = decode_splits(MP * PT)
            part_ml = t.view("scratch.attn_ml", (T, H, ns, 2))
            part_o = t.view("scratch.attn_o", (T, H, ns, HD))
            if tuned:
                choice = t.view(TUNED_SPLITS, (1,))
                b.launch("attention_decode_split_tuned", qkv, pos, rows.attn_slot, page_table,
                         kc, vc, part_ml, part_o, choice, T, MP, PT, H, KVH, HD, ns, split,
                         scale)
                b.launch("attention_decode_merge_tuned", part_ml, part_o, rows.attn_slot,
                         choice, attn, T, H, HD, ns)
            elif launch.fuse_decode_attention():
                arrivals = t.view("scratch.attn_arrivals", (T, KVH))
                b.launch("attention_decode_fused", qkv, pos, rows.attn_slot, page_table, kc, vc,
                         part_ml, part_o, arrivals, attn, T, MP, PT, H, KVH, HD, ns, split,
                         scale)
            else:
                b.launch("attention_decode_split", qkv, pos, rows.attn_slot, page_table, kc,
                         vc, part_ml, part_o, T, MP, PT, H, KVH, HD, ns, split, scale)
                b.launch("attention_decode_merge", part_ml, part_o, rows.attn_slot, attn, T,
                         H, HD, ns)
        else:
            b.launch("attention_prefill", qkv, pos, trow, slot, page_table, kc, vc, attn,
                     T, R, MP, PT, H, KVH, HD, scale)
        if fold:
            _folded_mlp(b, s, i, res, attn, gate_up, act, T)
            continue
        _product(b, lin, attn, t.view(f"L{i}.wo", (D, H * HD)), x, T, D, H * HD)
        if s.ranks > 1:  # row-parallel: every rank holds a partial sum
            b.launch("all_reduce_sum", x, T, D)
        b.launch("add_rmsnorm", x, res, t.view(f"L{i}.ffn_norm", (D,)), h, T, D, s.rms_eps)
        _product(b, lin, h, t.view(f"L{i}.w_gate_up", (2 * F, D)), gate_up, T, 2 * F, D)
        if decode_attention and not invariant and launch.fuse_swiglu_linear(T, D, F):
            b.launch("swiglu_linear", gate_up, t.view(f"L{i}.w_down", (D, F)), x, T, D, F)
        else:
            _product(b, lin, gate_up, t.view(f"L{i}.w_down", (D, F)), x, T, D, F, swiglu=True)
        if s.ranks > 1:
            b.launch("all_reduce_sum", x, T, D)
        next_norm = f"L{i + 1}.attn_norm" if i + 1 < s.layers else "final_norm"
        b.launch("add_rmsnorm", x, res, t.view(next_norm, (D,)), h, T, D, s.rms_eps)
    if fold:
        b.launch("rmsnorm", res, t.view("final_norm", (D,)), h, T, D, s.rms_eps)


def _folded_mlp(b: ProgramBuilder, s: LlamaShapes, i: int, res, attn, gate_up, act,
                T: int) -> None:
    """Layer `i` after attention with folding: O projection added into the residual,
    gate/up from the normalized residual, down projection added into the residual."""
    t = b.table
    D, F, HO = s.hidden, s.ffn, s.heads * s.head_dim
    b.launch("linear_add", attn, t.view(f"L{i}.wo", (D, HO)), res, T, D, HO)
    b.launch("rmsnorm_linear", res, t.view(f"L{i}.ffn_norm", (D,)),
             t.view(f"L{i}.w_gate_up", (2 * F, D)), gate_up, T, 2 * F, D, s.rms_eps)
    if launch.fuse_swiglu_linear(T, D, F):
        b.launch("swiglu_linear_add", gate_up, t.view(f"L{i}.w_down", (D, F)), res, T, D, F)
    else:
        b.launch("silu_mul", gate_up, act, T, F)
        b.launch("linear_add", act, t.view(f"L{i}.w_down", (D, F)), res, T, D, F)


def _forward(b: ProgramBuilder, s: LlamaShapes, caps: Capacities, tokens: int, rows: int,
             decode: bool, device_pending: bool, spec: Speculation | None = None,
             tuned: bool = False, fold: bool = False) -> None:
    """Record one PREFILL or DECODE variant: `tokens` packed tokens over `rows` rows.

    With `device_pending`, decode reads each row's fed token from the slot's pending-token
    state and every sampling row writes its sampled id back there (specification: "Host
    values and graph state"), so step N + 1 can be submitted before step N completes.
    In a drafter core (`spec`), decode is row-invariant (its rows equal verification
    rows bit for bit) and prefill and decode also store their features and write the
    head's entries of their tokens (the draft context). `tuned`: decode attention reads the
    tuned split count. `fold`: decode layers fold norms and residual adds into their
    products (``_layers``; not in a drafter core, whose decode stays row-invariant).
    """
    t = b.table
    T, R = tokens, rows
    slots = t.buffers[PAGE_TABLE].shape[0]
    n = INPUT_NAMES

    def inp(key: str, count: int, width: int | None = None):
        shape = (count,) if width is None else (count, width)
        return t.view(n[key], shape)

    toks, pos, trow = inp("tokens", T), inp("positions", T), inp("token_row", T)
    slot = inp("slot", R)
    pending = t.view(PENDING, (slots,))
    if decode and device_pending:
        b.launch("slot_gather", pending, slot, toks, R, slots)
    _layers(b, s, caps, _Rows(toks, pos, trow, slot, slot), T, R, decode_attention=decode,
            invariant=decode and spec is not None, tuned=decode and tuned,
            fold=fold and decode and spec is None)
    h = t.view("scratch.h", (T, s.hidden))
    if spec is not None:
        _draft_context(b, s, caps, spec, toks, pos, trow, slot, T, R,
                       linear="linear_invariant" if decode else "linear")
    logits = t.view("scratch.logits", (R, s.vocab))
    if not decode:
        last = t.view("scratch.last", (R, s.hidden))
        b.launch("gather_last", h, inp("query_length", R), last, T, R, s.hidden)
        h = last
    head_op = "linear_invariant" if decode and spec is not None else "linear"
    if s.ranks > 1:  # vocabulary-parallel: this rank's rows, then every rank's columns
        shard = t.view("scratch.logits_shard", (R, s.head_rows))
        b.launch(head_op, h, t.view("lm_head", (s.head_rows, s.hidden)), shard, R,
                 s.head_rows, s.hidden)
        b.launch("all_gather_columns", shard, logits, R, s.head_rows, s.vocab)
    else:
        b.launch(head_op, h, t.view(head_buffer(s), (s.vocab, s.hidden)), logits, R, s.vocab,
                 s.hidden)
    sampled = t.view(SAMPLED, (R,))
    _sample(b, s, R, logits, slot, pos if decode else _last_positions(b, R), inp,
            "scratch.sample_chunk_max" in t.buffers, "scratch.sample_chunk_mass" in t.buffers)
    # Same step, same logits (unmodified by the sampler): rows that ask record logprobs.
    K = decl.TOP_LOGPROBS
    b.launch("token_logprobs", logits, slot, sampled, inp("logprobs", R),
             t.view(LOGPROBS, (R, 1 + K)), t.view(TOP_IDS, (R, K)), R, s.vocab, K)
    if device_pending:
        b.launch("slot_scatter", t.view(SAMPLED, (R,)), slot, inp("sampling_decision", R),
                 pending, R, slots)


def _draft_context(b: ProgramBuilder, s: LlamaShapes, caps: Capacities, spec: Speculation,
                   toks, pos, trow, slot, T: int, R: int, linear: str) -> None:
    """Store the target features of a prefill chunk's or decode step's `T` tokens and
    write the head's entries of those tokens, so a request decoded for a while (it asked
    for logprobs, or the width policy chose decode) finds its draft context when it
    speculates again. Decode rows use the row-invariant linear (a seeded request drafts
    the same tokens alone or in a batch); prefill chunks are not batch-sized."""
    t = b.table
    PT = caps.page_tokens
    MP = caps.context_tokens // PT
    slots = t.buffers[PAGE_TABLE].shape[0]
    page_table = t.view(PAGE_TABLE, (slots, MP))
    h = t.view("scratch.h", (T, s.hidden))
    draft.store_features(b, h, pos, trow, slot, page_table, T, R, MP, PT, s.hidden)
    draft.entries(b, spec.drafter, s.rms_eps, toks, pos, trow, slot, page_table,
                  t.view("rope_inv_freq", (s.head_dim // 2,)), T, R, MP, PT, linear=linear)


def _speculative(b: ProgramBuilder, s: LlamaShapes, caps: Capacities, spec: Speculation,
                 lanes: int, width: int, tuned: bool = False, packed: int | None = None
                 ) -> None:
    """Record one SPECULATIVE program: B = `lanes`, W = `width`, D = W - 1, P = `packed`
    (default B x W).

    Proposal (D draft steps; copied candidates, when fresh, replace the head's drafts
    position by position: `spec_copy_candidates`), target verification of each lane's
    n_b positions, accepted-state commit (helios_tools.kernels.speculative documents
    every step and the RNG streams). QUERY_LENGTH programs (`packed` None): the host
    packs positions, rows and slots of the P verification rows. SPECULATIVE_PREFIX_LIMIT
    programs (`packed` given): lanes draft up to their ceilings, the head's confidence in
    each draft (`spec_confidence`, into the framed proposal_confidence record the host
    reads on completion) feeds `spec_allocate`, which writes the lengths, and
    `spec_pack_rows` packs the rows on the device. The device fills the rows' tokens
    (pending, then drafts). `tuned`: verification attention reads the tuned split count,
    as decode does, so the two stay row-invariant.
    """
    t = b.table
    g = spec.drafter
    prefix = packed is not None
    B, D, P = lanes, width - 1, packed if prefix else lanes * width
    dmax = t.buffers["spec.drafts"].shape[1]
    slots = t.buffers[PAGE_TABLE].shape[0]
    PT = caps.page_tokens
    MP = caps.context_tokens // PT
    n = INPUT_NAMES
    page_table = t.view(PAGE_TABLE, (slots, MP))
    inv_freq = t.view("rope_inv_freq", (s.head_dim // 2,))
    ns, split = decode_splits(MP * PT)

    def inp(key: str, count: int, *widths: int):
        return t.view(n.get(key) or SPEC_NAMES[key], (count, *widths))

    def sp(name: str, count: int):
        return t.view(f"spec.{name}", (count,))

    slot, start = inp("slot", B), inp("lane_start", B)
    # Prefix-limit lanes draft up to their ceilings; their lengths are allocated below.
    qlen = inp("lane_ceiling", B) if prefix else inp("query_length", B)
    pending = t.view(PENDING, (slots,))
    candidates = [inp("cand_ids", B, dmax), inp("cand_count", B), inp("cand_generation", B),
                  inp("cand_endpoint", B), inp("generation", B), start, qlen]
    # Prefix-limit programs: the step's confidences, lane order, in the record's first
    # plane; the completion copy lands them in the plane of the step's frame.
    confidence = t.view(PROPOSAL_CONFIDENCE, (B, dmax)) if prefix else None
    drafts = t.view("spec.drafts", (B, dmax))
    q = None if spec.coupled else t.view("spec.q", (B, dmax, s.vocab))
    vocab_map = t.view("D.vocab_map", (g.draft_vocab,))
    sampling = [inp("seed", B, 2), inp("temperature", B), inp("top_p", B), inp("top_k", B),
                inp("min_p", B)]
    for k in range(1, D + 1):  # proposals: D draws of the head, no host round trip
        b.launch("spec_draft_inputs", pending, slot, start, qlen, drafts, sp("d_tok", B),
                 sp("d_pos", B), sp("d_row", B), sp("d_slot", B), B, slots, dmax, k)
        logits = draft.step(b, g, s.rms_eps, B, sp("d_row", B), sp("d_slot", B), slot,
                            sp("d_pos", B), sp("d_tok", B), page_table, inv_freq, MP, PT, ns,
                            split, first=k == 1)
        if q is None:  # coupled: the head races with the target's noise of that position
            b.launch("draft_sample_coupled", logits, sp("d_slot", B), sp("d_pos", B),
                     vocab_map, *sampling, drafts, B, g.draft_vocab, dmax, k)
            b.launch("spec_copy_drafts", *candidates, sp("d_slot", B), drafts, B, dmax, dmax,
                     s.vocab, k)
        else:
            b.launch("draft_sample", logits, sp("d_slot", B), sp("d_pos", B), vocab_map,
                     *sampling, drafts, q, B, g.draft_vocab, s.vocab, dmax, k)
            b.launch("spec_copy_candidates", *candidates, sp("d_slot", B), drafts, q, B, dmax,
                     dmax, s.vocab, k)
        if prefix:
            b.launch("spec_confidence", logits, sp("d_slot", B), drafts, vocab_map, confidence,
                     B, g.draft_vocab, dmax, k)
    if prefix:
        qlen = sp("query_length", B)
        b.launch("spec_allocate", inp("lane_ceiling", B), slot, confidence, qlen, B, P, dmax)
        pos, trow, tslot = sp("positions", P), sp("token_row", P), sp("token_slot", P)
        b.launch("spec_pack_rows", qlen, start, slot, pos, trow, tslot, B, P)
    else:
        pos, trow, tslot = inp("positions", P), inp("token_row", P), inp("token_slot", P)
    tokens = sp("tokens", P)
    b.launch("spec_pack_tokens", pending, slot, start, drafts, pos, trow, tokens, B, P, slots,
             dmax)
    _layers(b, s, caps, _Rows(tokens, pos, trow, slot, tslot), P, B, decode_attention=True,
            invariant=True, tuned=tuned)
    h = t.view("scratch.h", (P, s.hidden))
    logits = t.view("scratch.logits", (P, s.vocab))
    head = t.view(head_buffer(s), (s.vocab, s.hidden))
    b.launch("linear_invariant", h, head, logits, P, s.vocab, s.hidden)
    words = grammar_mask_words(s.vocab)
    if D > 0:  # constrained lanes: per-position masks of their copied candidates
        b.launch("spec_candidate_masks", logits, trow, pos, slot, start, qlen,
                 inp("use_mask", B), inp("cand_masks", slots, dmax, words), *candidates[1:5],
                 drafts, P, B, s.vocab, words, dmax, dmax)
    commit = sp("commit_row", P)
    record = t.view(RECORD, (B, RECORD_FIELDS + width))
    lane_rows = [logits, slot, inp("generation", B), start, qlen, inp("sampling_decision", B),
                 inp("seed", B, 2), inp("temperature", B), inp("top_p", B), inp("top_k", B),
                 inp("min_p", B), inp("presence", B), inp("frequency", B), inp("repetition", B),
                 t.view(n["histogram"], (slots, s.vocab)), inp("grammar_mask", B, words),
                 inp("use_mask", B), drafts]
    if q is None:
        b.launch("spec_verify_coupled", *lane_rows, trow, pending, commit, record, B, P,
                 s.vocab, words, dmax, width, DRAFT_LAG)
    else:
        b.launch("spec_verify", *lane_rows, q, vocab_map, trow, pending, commit, record, B, P,
                 s.vocab, g.draft_vocab, words, dmax, width, DRAFT_LAG)
    # Commit: features of every verified row (rows past the accepted ones lie beyond the
    # consumed endpoint, never read before they are rewritten), then the head's entries
    # of the accepted positions from those true features.
    draft.store_features(b, h, pos, trow, slot, page_table, P, B, MP, PT, s.hidden)
    draft.entries(b, g, s.rms_eps, tokens, pos, commit, slot, page_table, inv_freq, P, B, MP,
                  PT, linear="linear_invariant")


# The head's entries are committed up to the consumed endpoint: draft cursor lag 0.
DRAFT_LAG = 0


def _transfer(b: ProgramBuilder, s: LlamaShapes, spec: Speculation | None, source: str,
              destination: str, rows: int) -> None:
    """Record one RESTORE program: `rows` row copies from tier `source` to tier
    `destination`, one row_copy launch per paired plane."""
    t = b.table
    src_rows = t.view(TRANSFER_NAMES["source"], (rows,))
    dst_rows = t.view(TRANSFER_NAMES["destination"], (rows,))
    for plane in paged_planes(s, spec):
        src = t.buffers[tier_plane(plane, source)]
        dst = t.buffers[tier_plane(plane, destination)]
        b.launch("row_copy", t.view(src.name, src.shape), t.view(dst.name, dst.shape),
                 src_rows, dst_rows, rows, src.numel // src.shape[0])


def _transfer_contract(name: str, s: LlamaShapes, spec: Speculation | None, table: BufferTable,
                       source: str, destination: str, rows: int) -> cpb.GraphContract:
    planes = paged_planes(s, spec)
    row_bytes = [table.buffers[p].numel // table.buffers[p].shape[0] * 4 for p in planes]
    bindings, accesses = decl.row_transfer([tier_plane(p, source) for p in planes],
                                           [tier_plane(p, destination) for p in planes],
                                           row_bytes, TRANSFER_NAMES)
    g = cpb.GraphContract(name=name, operation=cpb.OPERATION_RESTORE, batch_capacity=rows,
                          state_rows_per_request=0)
    g.bindings.extend(bindings)
    g.state_accesses.extend(accesses)
    return g


def _last_positions(b: ProgramBuilder, rows: int):
    """Per-row RNG positions for prefill: each row's last fed token.

    Decode rows key the sampler with the fed token's position; prefill rows with the
    position of their chunk's last token, bound as CONSUMED_ENDPOINT - 1 per submission
    row, so a request draws the same numbers whichever step samples it.
    """
    return b.table.view("in.sample_position", (rows,))


def capture(s: LlamaShapes, caps: Capacities, weight_dtype: str, *, device_pending: bool = True,
            spec: Speculation | None = None, split_tuning: SplitTuning | None = None,
            fold_layers: bool = False, chunked_sampling: bool = True,
            nucleus_sampling: bool = True) -> tuple[mpb.ExecutionManifest, list[cpb.GraphContract]]:
    """Capture every graph variant and declare their contracts.

    Args:
        device_pending: keep the pending token on the device (decode reads it from
            PENDING, sampling rows write it) rather than binding it from the host.
        spec: a drafter core's speculation: adds the head's buffers, one SPECULATIVE
            program per (decode batch B, width W) and the draft context to prefill
            (speculative programs need the device-owned pending token).
        split_tuning: also capture the decode-split tuning producer (the manifest's tuning
            catalog); decode and speculative graphs then read the tuned split count.
        fold_layers: decode graphs record 7 launches per layer instead of 9 (RMS norms
            folded into the next product's prologue, residual adds into the previous
            product's epilogue; ``_layers``). Off by default: the manifest's launches
            record the choice, so cores exported either way keep serving unchanged.
        chunked_sampling: prefill and decode sample with ``sample_chunks`` +
            ``sample_merge`` + ``sample_rest`` instead of ``sample_biased`` (same outputs;
            ``_sample``); the default since the H200 run (bench/results/
            gpu_kern_llama8b_chunked.json). False records ``sample_biased``, as cores
            exported before it do (they keep loading).
        nucleus_sampling: with `chunked_sampling`, record ``sample_chunks_nucleus`` +
            ``sample_merge_nucleus`` (top-p rows with no top-k resolved in the merge when
            their nucleus lies inside the NUCLEUS most probable candidates; same outputs).
            False records ``sample_chunks`` + ``sample_merge``, as cores exported before
            it do (they keep loading).

    Returns:
        The execution manifest (buffers, kernel variants, graph programs) and one
        GraphContract per variant, in the same order.
    """
    if spec is not None and not device_pending:
        raise ValueError("speculative programs read the device-owned pending token")
    if spec is not None and s.ranks > 1:
        raise TensorParallelError("speculative programs are captured for one rank only "
                                  "(a recipe with a drafter cannot be split between ranks)")
    if fold_layers and s.ranks > 1:  # linear_add would add each rank's partial sum
        raise TensorParallelError("folded layers add the O and down products into the "
                                  "residual, which split ranks must all-reduce first")
    table = declare_buffers(s, caps, weight_dtype, spec)
    rows = max(max(caps.decode_batch), caps.prefill_rows)
    table.declare("in.sample_position", "i32", (rows,), "input")
    if chunked_sampling:
        declare_chunked_sampling(table, s, rows, nucleus_sampling)
    kernels: dict[str, mpb.Kernel] = {}
    tuned = split_tuning is not None
    producers = [_split_producer(table, kernels, s, caps, split_tuning)] if tuned else []
    programs: list[mpb.GraphProgram] = []
    contracts: list[cpb.GraphContract] = []
    variants = [("decode", b, b, 0) for b in caps.decode_batch]
    variants += [("prefill", t, caps.prefill_rows, 0) for t in caps.prefill_tokens]
    if spec is not None:
        variants += [("speculative", b * w, b, w) for b in caps.decode_batch for w in spec.widths]
        if spec.prefix_batches:
            variants += [("prefix", b * PREFIX_ROWS_PER_LANE, b, spec.max_width)
                         for b in caps.decode_batch if b >= 2]
    for kind, tokens, nrows, width in variants:
        builder = ProgramBuilder(table, kernels)
        if kind in ("speculative", "prefix"):
            assert spec is not None
            prefix = kind == "prefix"
            _speculative(builder, s, caps, spec, nrows, width, tuned,
                         packed=tokens if prefix else None)
            name = f"spec_b{nrows}_w{width}" + (f"_p{tokens}" if prefix else "")
            op, packed = cpb.OPERATION_SPECULATIVE, tokens
            completion = mpb.CompletionLayout(
                buffer=RECORD, rows=nrows,
                speculative=mpb.SpeculativeCompletion(token_width=width),
                confidence_buffer=PROPOSAL_CONFIDENCE if prefix else "")
        else:
            decode = kind == "decode"
            _forward(builder, s, caps, tokens, nrows, decode, device_pending, spec, tuned,
                     fold_layers)
            name = f"{kind}_b{tokens}" if decode else f"prefill_t{tokens}"
            op = cpb.OPERATION_DECODE if decode else cpb.OPERATION_PREFILL
            packed = tokens
            completion = mpb.CompletionLayout(
                buffer=SAMPLED, rows=nrows, logprobs_buffer=LOGPROBS, top_ids_buffer=TOP_IDS,
                top_logprobs=decl.TOP_LOGPROBS)
        program = mpb.GraphProgram(name=name, operation=op, batch_capacity=nrows,
                                   token_capacity=packed, launches=builder.launches,
                                   completion=completion)
        contract = _graph_contract(name, op, nrows, packed, s, table, device_pending, width,
                                   prefix=kind == "prefix")
        if tuned and op != cpb.OPERATION_PREFILL:  # its decode attention reads the choice
            program.tuning_producers.append(SPLIT_PRODUCER)
            contract.tuned_bindings.add(buffer=TUNED_SPLITS, producer_graph=SPLIT_PRODUCER)
        for b in contract.bindings:
            decl_ = table.buffers[b.destination]
            program.transports.add(destination=b.destination,
                                   nbytes=decl_.numel * (2 if decl_.dtype == "bf16" else 4))
        programs.append(program)
        contracts.append(contract)
    for source, destination in transfer_routes(caps):
        builder = ProgramBuilder(table, kernels)
        rows_ = caps.transfer_rows
        _transfer(builder, s, spec, source, destination, rows_)
        name = f"transfer_{source}_{destination}_r{rows_}"
        programs.append(mpb.GraphProgram(name=name, operation=cpb.OPERATION_RESTORE,
                                         batch_capacity=rows_, launches=builder.launches))
        contracts.append(_transfer_contract(name, s, spec, table, source, destination, rows_))
        for b in contracts[-1].bindings:
            programs[-1].transports.add(destination=b.destination,
                                        nbytes=table.buffers[b.destination].numel * 4)
    manifest = mpb.ExecutionManifest(abi="helios-numpy-1", buffers=table.to_proto(),
                                     kernels=list(kernels.values()), graphs=programs,
                                     tuning=mpb.TuningCatalog(producers=producers),
                                     rank_count=s.ranks if s.ranks > 1 else 0)
    return manifest, contracts


def split_candidates(ns: int, count: int) -> list[int]:
    """Split counts the producer times: ``ns, ns/2, ns/4, ns/8`` (ceil, distinct, first
    `count`)."""
    out: list[int] = []
    for shift in range(4):
        c = max(-(-ns // (1 << shift)), 1)
        if c not in out:
            out.append(c)
    return out[:count]


def _split_producer(table: BufferTable, kernels: dict[str, mpb.Kernel], s: LlamaShapes,
                    caps: Capacities, tuning: SplitTuning) -> mpb.GraphProgram:
    """Capture the decode-split tuning producer (helios_tools.kernels.tuning).

    Workload: the largest decode batch B, every row at the timing context, over the
    producer's own page table and K/V planes (one request's worth of pages, so its
    footprint does not depend on the physical cache chosen at load). One untimed sweep of
    the candidates, then a timed one (a mark before and after `repeats` split + merge
    launches of each candidate), then the selection into TUNED_SPLITS. Every buffer it
    writes besides TUNED_SPLITS is its own scratch or serving scratch: it runs before any
    request, and touches no request input, graph state or cache storage.
    """
    from helios_tools.kernels.tuning import CANDIDATE_STRIDE, MAX_CANDIDATES

    H, KVH, HD = s.heads, s.kv_heads, s.head_dim
    PT = caps.page_tokens
    MP = caps.context_tokens // PT
    B = max(caps.decode_batch)
    ns, split = decode_splits(MP * PT)
    timing = tuning.context_tokens or MP * PT
    mp_t = -(-timing // PT)
    cands = split_candidates(ns, tuning.candidates)
    table.declare(TUNED_SPLITS, "i32", (1,), "tuned")
    for name, dtype, shape in (
            ("tuning.positions", "i32", (B,)), ("tuning.slot", "i32", (B,)),
            ("tuning.page_table", "i32", (B, mp_t)),
            ("tuning.candidates", "i32", (MAX_CANDIDATES, CANDIDATE_STRIDE)),
            ("tuning.stamps", "u32", (2 * len(cands), 2)),
            ("tuning.k_cache", "f32", (mp_t, PT, KVH, HD)),
            ("tuning.v_cache", "f32", (mp_t, PT, KVH, HD))):
        table.declare(name, dtype, shape, "scratch")
    t = table
    b = ProgramBuilder(table, kernels)
    pos, slot = t.view("tuning.positions", (B,)), t.view("tuning.slot", (B,))
    pages = t.view("tuning.page_table", (B, mp_t))
    candidates = t.view("tuning.candidates", (MAX_CANDIDATES, CANDIDATE_STRIDE))
    stamps = t.view("tuning.stamps", (2 * len(cands), 2))
    kc = t.view("tuning.k_cache", (mp_t, PT, KVH, HD))
    vc = t.view("tuning.v_cache", (mp_t, PT, KVH, HD))
    qkv = t.view("scratch.qkv", (B, s.qkv_width))
    part_ml = t.view("scratch.attn_ml", (B, H, ns, 2))
    part_o = t.view("scratch.attn_o", (B, H, ns, HD))
    attn = t.view("scratch.attn", (B, H * HD))
    padded = cands + [0] * (MAX_CANDIDATES - len(cands))
    b.launch("split_tuning_setup", pos, slot, pages, candidates, B, mp_t, PT, len(cands),
             *padded)
    scale = 1.0 / math.sqrt(HD)
    for _sweep in range(2):  # the first sweep warms caches and clocks; the second counts
        for i in range(len(cands)):
            choice = t.view("tuning.candidates", (1,), offset=i * CANDIDATE_STRIDE)
            b.launch("timer_mark", stamps, 2 * i)
            for _ in range(tuning.repeats):
                b.launch("attention_decode_split_tuned", qkv, pos, slot, pages, kc, vc,
                         part_ml, part_o, choice, B, mp_t, PT, H, KVH, HD, ns, split, scale)
                b.launch("attention_decode_merge_tuned", part_ml, part_o, slot, choice, attn,
                         B, H, HD, ns)
            b.launch("timer_mark", stamps, 2 * i + 1)
    b.launch("split_tuning_select", stamps, candidates, t.view(TUNED_SPLITS, (1,)),
             len(cands))
    return mpb.GraphProgram(name=SPLIT_PRODUCER, operation=cpb.OPERATION_INITIALIZE,
                            batch_capacity=B, token_capacity=B, launches=b.launches)


def _graph_contract(name: str, op: int, rows: int, tokens: int, s: LlamaShapes,
                    table: BufferTable, device_pending: bool, width: int = 0,
                    prefix: bool = False) -> cpb.GraphContract:
    decode = op in (cpb.OPERATION_DECODE, cpb.OPERATION_SPECULATIVE)
    speculative = op == cpb.OPERATION_SPECULATIVE
    slots = table.buffers[PAGE_TABLE].shape[0]
    g = cpb.GraphContract(name=name, operation=op, batch_capacity=rows, token_capacity=tokens,
                          state_rows_per_request=1,
                          completion_cursor=cpb.CompletionCursor(has_draft_cursor=speculative,
                                                                 lag_tokens=DRAFT_LAG))
    if speculative:
        g.speculative.CopyFrom(cpb.SpeculativeDescriptor(
            batch_capacity=rows, draft_tokens=width - 1, token_capacity=width,
            packed_token_capacity=tokens,
            length_source=cpb.LENGTH_SOURCE_SPECULATIVE_PREFIX_LIMIT if prefix
            else cpb.LENGTH_SOURCE_QUERY_LENGTH, lane_limit=width,
            # prefix-limit programs report the head's confidence in each draft, framed
            produces_confidence=prefix, confidence_width=width - 1 if prefix else 0))
        g.bindings.extend(decl.speculative_prefix_lanes(INPUT_NAMES, SPEC_NAMES) if prefix
                          else decl.speculative_lanes(INPUT_NAMES, SPEC_NAMES))
        if width > 1:
            g.bindings.extend(decl.copied_proposals(SPEC_NAMES))
            masks = table.buffers[SPEC_NAMES["cand_masks"]]
            g.state_accesses.append(decl.candidate_masks_access(
                masks.name, masks.numel // masks.shape[0] * 4))
    else:
        g.bindings.extend(decl.shared_admission(INPUT_NAMES, prefill=not decode,
                                                device_pending=device_pending))
    g.bindings.extend(decl.sampling(INPUT_NAMES))
    if op == cpb.OPERATION_PREFILL:
        g.bindings.append(decl.binding("in.sample_position", cpb.VALUE_SOURCE_CONSUMED_ENDPOINT,
                                       cpb.INDEXING_SUBMISSION_ROW, offset=-1))
    pt_bindings, pt_access = decl.paged_text(PAGE_TABLE, table.buffers[PAGE_TABLE].shape[1] * 4,
                                             slots)
    g.bindings.extend(pt_bindings)
    g.state_accesses.extend(pt_access)
    g.state_accesses.extend(decl.state_transfer(INPUT_NAMES["histogram"], s.vocab * 4, slots,
                                                logit_bias=INPUT_NAMES["logit_bias"]))
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
