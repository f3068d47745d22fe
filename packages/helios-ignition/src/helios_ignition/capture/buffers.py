"""Buffers every family's programs share: request inputs, graph state, paged cache
planes, sampling outputs, the speculative and transfer buffers, and the cache contract.

`declare_buffers` builds the one physical buffer table every graph variant of a core
uses; each variant uses the leading rows of the request inputs and scratch. The family
adds its weights (`Family.weight_layout`) and its trunk's scratch
(`Family.declare_scratch`); the names here are what the programs and the graph
contracts bind.
"""

from __future__ import annotations

from dataclasses import dataclass

from helios_contract import PROPOSAL_CONFIDENCE, window_request_pages
from helios_contract.schema import contract_pb2 as cpb
from helios_tools.kernels import grammar_mask_words
from helios_tools.kernels.speculative import RECORD_FIELDS

from ..checkpoint.drafter import DrafterGeometry
from ..families import draft
from ..preparation import contract as decl
from ..recipe import Capacities
from . import launch
from .builder import BufferTable, CaptureError
from .family import Family

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
# The sliding-window region of the local layers (a family with `windows`): its own page
# pool (the local layers' planes lead with it) and page table.
WINDOW_REGION = "window"
WINDOW_PAGE_TABLE = "state.window_page_table"
PENDING = "state.pending_token"  # device-owned pending token, one i32 per slot
SAMPLED = "out.sampled"
# Startup tuning of the decode split count (recipe.SplitTuning): the tuned buffer every
# decode-attention graph reads and the producer in the manifest's tuning catalog that
# writes it.
TUNED_SPLITS = "tuned.decode_splits"
SPLIT_PRODUCER = "tune.decode_splits"
LOGPROBS = "out.logprobs"  # f32 [rows, 1 + TOP_LOGPROBS]: sampled token, then the top ids
TOP_IDS = "out.top_ids"  # i32 [rows, TOP_LOGPROBS]
# SCORED_PREFILL programs (Capacities.scored_tokens): each packed token's target id (the
# next prompt token, -1 for none), the logits of every packed token, and the per-token
# scores record (CompletionLayout.scores_buffer / score_ids_buffer).
SCORE_TARGETS = "in.score_targets"  # i32 [scored tokens]
SCORED_LOGITS = "scratch.scored_logits"  # f32 [scored tokens, vocab]
SCORED_SHARD = "scratch.scored_logits_shard"  # f32 [scored tokens, head rows] (ranks > 1)
SCORES = "out.scores"  # f32 [scored tokens, 1 + TOP_LOGPROBS]: target, then the top ids
SCORE_IDS = "out.score_ids"  # i32 [scored tokens, TOP_LOGPROBS]


def weight_resource_id(name: str) -> str:
    return f"weights/{name}"


def rank_weight_resource_id(name: str, rank: int) -> str:
    """The resource of rank `rank`'s part of a weight split between ranks."""
    return f"weights/rank{rank}/{name}"



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
    """A drafter core's speculative capture (the specification, "Complete speculative
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
# PROPOSAL_CONFIDENCE (helios_contract): f32 [2, slots, D], the specification, "Complete
# speculative generation"; rules speculative.confidence_buffer / _record check it.
TRANSFER_NAMES = {"source": "in.transfer_source", "destination": "in.transfer_destination"}
# Storage tiers of the RESTORE programs' routes, by the name used in graph names.
PAGES, CONTINUATION, HOST = "pages", "continuation", "host"
HOST_PREPARED_ROWS = 1  # host-tier planes are sized at load; the manifest holds one row


def layer_windows(s: Family) -> tuple[int, ...]:
    """Per layer: its sliding window in tokens, 0 for a layer over the whole context (a
    family declaring no `windows`, such as Llama: every layer 0)."""
    windows = tuple(getattr(s, "windows", ()))  # only sliding-window families declare it
    return windows or (0,) * s.layers


def window_tokens(s: Family) -> int:
    """The window of the family's local layers, 0 when it has none.

    Raises:
        CaptureError: local layers of different windows (one sliding-window region per
            core: its pool holds one window per request).
    """
    windows = {w for w in layer_windows(s) if w}
    if len(windows) > 1:
        raise CaptureError(f"local layers of windows {sorted(windows)}: a core declares one "
                           "sliding-window region")
    return windows.pop() if windows else 0


def window_pages(s: Family, caps: Capacities) -> int:
    """Pages of the sliding-window region's pool: every slot holding the most one
    request ever holds there (`window_request_pages` at the longest captured chunk), so
    the window region never limits admission before the paged region does."""
    chunk = max((*caps.prefill_tokens, *caps.scored_tokens, max(caps.decode_batch)))
    per_request = window_request_pages(window_tokens(s), caps.page_tokens, chunk)
    return max(caps.decode_batch) * per_request


def window_planes(s: Family) -> list[str]:
    """Planes of the sliding-window region: the local layers' K/V, in layer order."""
    return [f"L{i}.{p}_cache" for i, w in enumerate(layer_windows(s)) if w
            for p in ("k", "v")]


def paged_planes(s: Family, spec: Speculation | None = None) -> list[str]:
    """Planes of every paged region, in region order (the target's K/V per layer over the
    whole context, then the draft head's K/V and features): the page rows a transfer
    moves together. A local layer's planes are the sliding-window region's."""
    planes = [f"L{i}.{p}_cache" for i, w in enumerate(layer_windows(s)) if not w
              for p in ("k", "v")]
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


def cache_contract(s: Family, caps: Capacities,
                   spec: Speculation | None = None) -> cpb.CacheContract:
    """The CacheContract of a captured core: the paged K/V region (and the draft head's
    regions) on one page table, their host-tier planes, and continuation storage; the
    local layers' sliding-window region on its own page table."""
    host = caps.host_tier and caps.transfer_rows > 0
    cache = cpb.CacheContract(page_tokens=caps.page_tokens)

    def region(name: str, kind: int, planes: list[str]) -> None:
        cache.regions.add(name=name, kind=kind, planes=planes, tokens_per_record=1,
                          host_planes=[tier_plane(p, HOST) for p in planes] if host else [])
        cache.page_table_views.add(region=name, buffer=PAGE_TABLE, page_offset=0)

    target = paged_planes(s)
    if target:
        region("kv", cpb.HISTORY_KIND_PAGED_KV, target)
    window = window_tokens(s)
    if window:  # the local layers: their own pool and page table, pages freed behind
        cache.regions.add(name=WINDOW_REGION, kind=cpb.HISTORY_KIND_SLIDING_WINDOW,
                          planes=window_planes(s), tokens_per_record=1, window_tokens=window)
        cache.page_table_views.add(region=WINDOW_REGION, buffer=WINDOW_PAGE_TABLE,
                                   page_offset=0)
    if spec is not None:  # the head's histories share the target's page table
        region("draft_kv", cpb.HISTORY_KIND_PAGED_KV, [draft.K_CACHE, draft.V_CACHE])
        region("draft_features", cpb.HISTORY_KIND_PAGED_LATENT, [draft.F_CACHE])
    if caps.prepared_snapshots and caps.transfer_rows:
        cache.regions.add(name="continuation", kind=cpb.HISTORY_KIND_CONTINUATION,
                          planes=[tier_plane(p, CONTINUATION) for p in paged_planes(s, spec)],
                          tokens_per_record=1)
    return cache



def declare_buffers(s: Family, caps: Capacities, weight_dtype: str,
                    spec: Speculation | None = None) -> BufferTable:
    """The physical buffer table shared by every graph variant of family `s`."""
    window = window_tokens(s)
    if window and (spec is not None or caps.transfer_rows or caps.prepared_snapshots
                   or caps.host_tier):
        # The window region's pages are private and released behind the window: nothing
        # cached, snapshotted or drafted from could restore the local layers' last tokens.
        raise CaptureError("a family with sliding-window layers exports without speculative "
                           "programs, snapshots, host tier or transfer programs (its window "
                           "pages are released behind the window)")
    t = BufferTable()
    for name, shape in s.weight_layout().items():
        dtype = "f32" if len(shape) == 1 else weight_dtype  # norms and rope stay f32
        if s.ranks > 1 and s.weight_split(name) is not None:
            t.declare(name, dtype, shape, "weight", rank_weight_resource_ids=tuple(
                rank_weight_resource_id(name, r) for r in range(s.ranks)))
        else:
            t.declare(name, dtype, shape, "weight", weight_resource_id(name))
    slots = max(caps.decode_batch)
    rows = max(slots, caps.prefill_rows)
    packed = slots * spec.max_width if spec else slots  # decode rows or verify rows
    tokens = max(max(caps.prefill_tokens), packed, max(caps.mixed_tokens, default=0))
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
    if window:
        t.declare(WINDOW_PAGE_TABLE, "i32", (slots, pages_per_request), "state")
    t.declare(n["histogram"], "i32", (slots, s.vocab), "state")
    t.declare(n["logit_bias"], "f32", (slots, s.vocab), "state")
    t.declare(PENDING, "i32", (slots,), "state")
    local_pages = window_pages(s, caps) if window else 0
    for i, w in enumerate(layer_windows(s)):
        for plane in ("k", "v"):
            t.declare(f"L{i}.{plane}_cache", "f32",
                      (local_pages if w else caps.prepared_pages, caps.page_tokens,
                       s.kv_heads, s.head_dim), "cache")
    s.declare_scratch(t, tokens, weight_dtype)
    ns, _ = decode_splits(pages_per_request * caps.page_tokens)
    t.declare("scratch.attn_ml", "f32", (packed, s.heads, ns, 2), "scratch")
    t.declare("scratch.attn_o", "f32", (packed, s.heads, ns, s.head_dim), "scratch")
    if launch.fuse_decode_attention():  # split counters, zero between launches
        t.declare("scratch.attn_arrivals", "i32", (packed, s.kv_heads), "scratch")
    t.declare("scratch.last", "f32", (rows, s.hidden), "scratch")
    t.declare("scratch.logits", "f32", (max(rows, packed), s.vocab), "scratch")
    if s.ranks > 1:  # this rank's columns of the vocabulary-parallel head
        t.declare("scratch.logits_shard", "f32", (max(rows, packed), s.head_rows), "scratch")
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
    if caps.scored_tokens:
        scored = max(caps.scored_tokens)
        t.declare(SCORE_TARGETS, "i32", (scored,), "input")
        t.declare(SCORED_LOGITS, "f32", (scored, s.vocab), "scratch")
        if s.ranks > 1:  # this rank's columns of the vocabulary-parallel head
            t.declare(SCORED_SHARD, "f32", (scored, s.head_rows), "scratch")
        t.declare(SCORES, "f32", (scored, 1 + decl.TOP_LOGPROBS), "output")
        t.declare(SCORE_IDS, "i32", (scored, decl.TOP_LOGPROBS), "output")
    if caps.transfer_rows:
        declare_tiers(t, s, caps, spec)
    return t



def declare_tiers(t: BufferTable, s: Family, caps: Capacities,
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


