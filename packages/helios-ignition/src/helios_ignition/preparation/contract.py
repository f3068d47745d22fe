"""Reusable contract declarations recipes compose (specification: Ownership and bootstrap).

Each function returns the value bindings or state accesses of one shared component,
given the buffer names a family chose. A recipe may bind different buffer names to the
same value source; it cannot install scheduling or state-update code. Components:

- shared admission: request identity and lane geometry (slots, rows, lengths, tokens,
  positions) for prefill (packed tokens) and decode (one pending token per row);
- sampling: admission sampling parameters, seed bits, prompt histogram, grammar mask;
- state transfer: the persistent per-slot state each graph reads or writes;
- paged text: page tables of the paged KV history;
- row transfer: RESTORE programs copying rows between storage tiers (snapshots,
  restores, the host tier).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from helios_contract.schema import contract_pb2 as cpb
from helios_contract.schema import frontend_pb2 as fpb
from tokenizers import Tokenizer

V = cpb  # enum access: V.VALUE_SOURCE_SLOT, V.INDEXING_ACTIVE_ROW, ...


def binding(destination: str, source: int, indexing: int, *, padding: int = 0,
            offset: int = 0, constant: int = 0) -> cpb.ValueBinding:
    """One ValueBinding (specification: Host values and graph state)."""
    return cpb.ValueBinding(destination=destination, source=source, indexing=indexing,
                            padding=padding, offset=offset, constant_value=constant)


def shared_admission(names: Mapping[str, str], *, prefill: bool,
                     device_pending: bool = False) -> list[cpb.ValueBinding]:
    """Lane geometry and token inputs.

    Prefill packs prompt tokens (PACKED_TOKEN) with their row and position; decode feeds
    the pending token of each submission row: bound from the host, or (device_pending)
    read by the graph from the pending-token state view, with no host binding. Padding
    tokens carry row -1 and padding rows slot -1, which kernels treat as inactive.

    Args:
        names: buffer names for keys tokens, positions, token_row, slot, query_length.
    """
    tokens_source = V.VALUE_SOURCE_PROMPT_TOKENS if prefill else V.VALUE_SOURCE_PENDING_TOKEN
    tokens_indexing = V.INDEXING_PACKED_TOKEN if prefill else V.INDEXING_SUBMISSION_ROW
    tokens = [] if device_pending and not prefill else [
        binding(names["tokens"], tokens_source, tokens_indexing)]
    return tokens + [
        binding(names["positions"], V.VALUE_SOURCE_PROMPT_POSITIONS, V.INDEXING_PACKED_TOKEN),
        binding(names["token_row"], V.VALUE_SOURCE_MIXED_PREFILL_ROW, V.INDEXING_PACKED_TOKEN,
                padding=-1),
        binding(names["slot"], V.VALUE_SOURCE_SLOT, V.INDEXING_SUBMISSION_ROW, padding=-1),
        binding(names["query_length"], V.VALUE_SOURCE_QUERY_LENGTH, V.INDEXING_SUBMISSION_ROW),
    ]


def scored_targets(destination: str) -> cpb.ValueBinding:
    """A SCORED_PREFILL program's targets: per packed token, the prompt token after it
    (VALUE_SOURCE_SCORED_TARGET_TOKENS), -1 where it has none (a prompt's last token,
    rows that score nothing, padding)."""
    return binding(destination, V.VALUE_SOURCE_SCORED_TARGET_TOKENS, V.INDEXING_PACKED_TOKEN,
                   padding=-1)


def speculative_lanes(names: Mapping[str, str], spec_names: Mapping[str, str]
                      ) -> list[cpb.ValueBinding]:
    """Lane geometry of a SPECULATIVE program with the QUERY_LENGTH length source.

    Per lane (submission row): slot, generation (echoed in the completion record), the
    host-selected length n_b (target positions, pending token included) and the lane's
    start (its pending token's position: CONSUMED_ENDPOINT - 1 of a row feeding the
    pending token). Per packed verification row (PACKED_TOKEN, following each lane's
    n_b): position, lane and slot. The tokens themselves come from the device (pending
    token, then drafts).

    Args:
        names: buffer names for keys positions, token_row, slot, query_length.
        spec_names: buffer names for keys generation, lane_start, token_slot.
    """
    return [
        binding(names["slot"], V.VALUE_SOURCE_SLOT, V.INDEXING_SUBMISSION_ROW, padding=-1),
        binding(spec_names["generation"], V.VALUE_SOURCE_GENERATION, V.INDEXING_SUBMISSION_ROW,
                padding=-1),
        binding(names["query_length"], V.VALUE_SOURCE_QUERY_LENGTH, V.INDEXING_SUBMISSION_ROW),
        binding(spec_names["lane_start"], V.VALUE_SOURCE_CONSUMED_ENDPOINT,
                V.INDEXING_SUBMISSION_ROW, offset=-1),
        binding(names["positions"], V.VALUE_SOURCE_PROMPT_POSITIONS, V.INDEXING_PACKED_TOKEN),
        binding(names["token_row"], V.VALUE_SOURCE_MIXED_PREFILL_ROW, V.INDEXING_PACKED_TOKEN,
                padding=-1),
        binding(spec_names["token_slot"], V.VALUE_SOURCE_SLOT, V.INDEXING_PACKED_TOKEN,
                padding=-1),
    ]


def speculative_prefix_lanes(names: Mapping[str, str], spec_names: Mapping[str, str]
                             ) -> list[cpb.ValueBinding]:
    """Lane geometry of a SPECULATIVE program with the SPECULATIVE_PREFIX_LIMIT length
    source: per lane its slot, generation, start and immutable ceiling (positions it may
    verify, pending token included; cache pages cover all of it). The program allocates
    the actual lengths within P and packs the verification rows itself.

    Args:
        names: buffer names for key slot.
        spec_names: buffer names for keys generation, lane_start, lane_ceiling.
    """
    return [
        binding(names["slot"], V.VALUE_SOURCE_SLOT, V.INDEXING_SUBMISSION_ROW, padding=-1),
        binding(spec_names["generation"], V.VALUE_SOURCE_GENERATION, V.INDEXING_SUBMISSION_ROW,
                padding=-1),
        binding(spec_names["lane_ceiling"], V.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT,
                V.INDEXING_SUBMISSION_ROW),
        binding(spec_names["lane_start"], V.VALUE_SOURCE_CONSUMED_ENDPOINT,
                V.INDEXING_SUBMISSION_ROW, offset=-1),
    ]


def copied_proposals(spec_names: Mapping[str, str]) -> list[cpb.ValueBinding]:
    """Copied proposals of history drafting (specification: value sources, "Copied
    proposals"): per lane the candidate ids ([rows, D], padding -1), their count (0: no
    candidates), and the slot generation and consumed endpoint they were proposed for
    (the program ignores candidates whose generation or endpoint is stale).

    Args:
        spec_names: buffer names for keys cand_ids, cand_count, cand_generation,
            cand_endpoint.
    """
    return [
        binding(spec_names["cand_ids"], V.VALUE_SOURCE_CANDIDATE_IDS, V.INDEXING_SUBMISSION_ROW,
                padding=-1),
        binding(spec_names["cand_count"], V.VALUE_SOURCE_CANDIDATE_COUNT,
                V.INDEXING_SUBMISSION_ROW),
        binding(spec_names["cand_generation"], V.VALUE_SOURCE_CANDIDATE_GENERATION,
                V.INDEXING_SUBMISSION_ROW, padding=-1),
        # offset -1: compared with the lane start (the pending token's position)
        binding(spec_names["cand_endpoint"], V.VALUE_SOURCE_CANDIDATE_CONSUMED_ENDPOINT,
                V.INDEXING_SUBMISSION_ROW, padding=-1, offset=-1),
        # [slots, D, mask words], per physical request row: mask i = the tokens a
        # constrained lane's grammar allows after its candidates 0..i (applied where
        # GRAMMAR_MASK_ENABLED is set; only those lanes' slots are uploaded).
        binding(spec_names["cand_masks"], V.VALUE_SOURCE_CANDIDATE_GRAMMAR_MASKS,
                V.INDEXING_PHYSICAL_REQUEST_ROW),
    ]


def candidate_masks_access(buffer: str, row_bytes: int) -> cpb.StateAccess:
    """The read of the per-slot candidate grammar masks (copied_proposals' binding)."""
    return cpb.StateAccess(view=cpb.StateView(buffer=buffer, byte_offset=0,
                                              row_stride=row_bytes, byte_extent=row_bytes),
                           access=V.ACCESS_READ)


SAMPLING_SOURCES = {
    "sampling_decision": V.VALUE_SOURCE_SAMPLING_DECISION,
    "seed": V.VALUE_SOURCE_SEED_BITS,
    "temperature": V.VALUE_SOURCE_TEMPERATURE,
    "top_p": V.VALUE_SOURCE_TOP_P,
    "top_k": V.VALUE_SOURCE_TOP_K,
    "min_p": V.VALUE_SOURCE_MIN_P,
    "presence": V.VALUE_SOURCE_PRESENCE_PENALTY,
    "frequency": V.VALUE_SOURCE_FREQUENCY_PENALTY,
    "repetition": V.VALUE_SOURCE_REPETITION_PENALTY,
    "grammar_mask": V.VALUE_SOURCE_GRAMMAR_MASK,
    "use_mask": V.VALUE_SOURCE_GRAMMAR_MASK_ENABLED,
    "use_bias": V.VALUE_SOURCE_LOGIT_BIAS_ENABLED,
}

# Top alternatives a completion record holds per row: OpenAI's `top_logprobs` maximum.
TOP_LOGPROBS = 20


def sampling(names: Mapping[str, str]) -> list[cpb.ValueBinding]:
    """Admission sampling inputs per submission row, plus the per-slot histogram and logit
    bias, plus the logprobs request of each row.

    The histogram and the logit bias are persistent per physical request row: shared
    packing initializes a slot's rows once, on the step that places a request in the
    slot (the bias row only for a request with a bias: LOGIT_BIAS_ENABLED gates its use),
    and the captured sampler counts each sampled token.

    Args:
        names: buffer names for the keys of SAMPLING_SOURCES plus ``histogram``,
            ``logit_bias`` and ``logprobs``.
    """
    rows = [binding(names[key], source, V.INDEXING_SUBMISSION_ROW)
            for key, source in SAMPLING_SOURCES.items()]
    rows.append(binding(names["logprobs"], V.VALUE_SOURCE_LOGPROBS, V.INDEXING_SUBMISSION_ROW,
                        padding=-1))
    rows.append(binding(names["histogram"], V.VALUE_SOURCE_PROMPT_HISTOGRAM,
                        V.INDEXING_PHYSICAL_REQUEST_ROW))
    rows.append(binding(names["logit_bias"], V.VALUE_SOURCE_LOGIT_BIAS,
                        V.INDEXING_PHYSICAL_REQUEST_ROW))
    return rows


def state_transfer(histogram: str, row_bytes: int, slots: int,
                   logit_bias: str | None = None) -> list[cpb.StateAccess]:
    """The per-slot persistent state a generating graph reads and writes: the histogram
    (read/write) and, when given, the logit bias (read; the same row bytes).

    A StateView's byte_extent is per row: row r covers
    [byte_offset + r * row_stride, + byte_extent), for each of `slots` rows.
    """
    view = cpb.StateView(buffer=histogram, byte_offset=0, row_stride=row_bytes,
                         byte_extent=row_bytes)
    accesses = [cpb.StateAccess(view=view, access=V.ACCESS_READ_WRITE)]
    if logit_bias is not None:
        bias = cpb.StateView(buffer=logit_bias, byte_offset=0, row_stride=row_bytes,
                             byte_extent=row_bytes)
        accesses.append(cpb.StateAccess(view=bias, access=V.ACCESS_READ))
    return accesses


def device_pending_token(buffer: str, *, generating: bool) -> tuple[
        cpb.StateView, cpb.StateAccess]:
    """The device-owned pending-token view (one i32 per physical request row) and this
    graph's access: generating graphs read the fed token and write the sampled one
    (READ_WRITE); prefill only writes the token its final chunk samples (WRITE)."""
    view = cpb.StateView(buffer=buffer, byte_offset=0, row_stride=4, byte_extent=4)
    access = V.ACCESS_READ_WRITE if generating else V.ACCESS_WRITE
    return view, cpb.StateAccess(view=view, access=access)


def paged_text(page_table: str, row_bytes: int, slots: int) -> tuple[
        list[cpb.ValueBinding], list[cpb.StateAccess]]:
    """Page-table binding (physical request rows) and its read access."""
    bindings = [binding(page_table, V.VALUE_SOURCE_PAGE_TABLE, V.INDEXING_PHYSICAL_REQUEST_ROW,
                        padding=0)]
    view = cpb.StateView(buffer=page_table, byte_offset=0, row_stride=row_bytes,
                         byte_extent=row_bytes)
    return bindings, [cpb.StateAccess(view=view, access=V.ACCESS_READ)]


def row_transfer(source_planes: Sequence[str], destination_planes: Sequence[str],
                 row_bytes: Sequence[int], names: Mapping[str, str]) -> tuple[
        list[cpb.ValueBinding], list[cpb.StateAccess]]:
    """A RESTORE program copying whole rows of one storage tier to another: per
    submission row the source row (RESTORE_SOURCE) and destination row
    (SNAPSHOT_DESTINATION), padding -1 (no copy); READ access to every source plane and
    WRITE access to every destination plane (each row of a plane: one page-shaped record;
    the route is what these accesses name).

    Args:
        source_planes / destination_planes: paired planes, in tier order.
        row_bytes: bytes of one row of each pair.
        names: buffer names for ``source`` and ``destination``.
    """
    bindings = [binding(names["source"], V.VALUE_SOURCE_RESTORE_SOURCE,
                        V.INDEXING_SUBMISSION_ROW, padding=-1),
                binding(names["destination"], V.VALUE_SOURCE_SNAPSHOT_DESTINATION,
                        V.INDEXING_SUBMISSION_ROW, padding=-1)]
    accesses = []
    for planes, access in ((source_planes, V.ACCESS_READ), (destination_planes, V.ACCESS_WRITE)):
        for plane, nbytes in zip(planes, row_bytes, strict=True):
            view = cpb.StateView(buffer=plane, byte_offset=0, row_stride=nbytes,
                                 byte_extent=nbytes)
            accesses.append(cpb.StateAccess(view=view, access=access))
    return bindings, accesses


def image_inputs(windows: str, window_count: str, feature_index: str
                 ) -> list[cpb.ValueBinding]:  # fmt: skip
    """The image inputs of an image prefill program (specification: value sources,
    "Image tensors" and "image feature ... indices"): the layout's ``windows`` output
    (f32 ``[windows, 3, S, S]`` pixels of the step's images, in row order; padding
    windows zero) and ``window_count`` (i32 ``[1]``), both whole tensors (SCALAR), and
    per packed token the feature row it reads (-1: a text token).

    Args:
        windows, window_count, feature_index: the buffer names.
    """
    return [
        cpb.ValueBinding(destination=windows, source=V.VALUE_SOURCE_IMAGE_TENSOR,
                         indexing=V.INDEXING_SCALAR, image_output="windows"),
        cpb.ValueBinding(destination=window_count, source=V.VALUE_SOURCE_IMAGE_TENSOR,
                         indexing=V.INDEXING_SCALAR, image_output="window_count"),
        binding(feature_index, V.VALUE_SOURCE_IMAGE_FEATURE_INDEX, V.INDEXING_PACKED_TOKEN,
                padding=-1),
    ]


def tile_grid_images(front: fpb.FrontendContract, tokenizer_json: str, sentinel: int, *,
                     tiling: fpb.ImageTiling, patches_per_feature: int, grid: int,
                     span: str, global_view: str, tile: str, row_separator: str,
                     grid_end: str, placeholder: str) -> fpb.FrontendContract:
    """`front` with IMAGE_PREPARATION_TILED_GLOBAL / IMAGE_LAYOUT_TILE_GRID_SPAN and their
    data, token texts resolved to ids with the checkpoint's tokenizer (a recipe names
    texts, the core holds ids).

    Args:
        sentinel: the nonsampled feature sentinel id (the text vocabulary's size).
        grid: tile rows and columns named (`tile` formatted with r, c from 1).
        span / global_view / placeholder: texts that encode as one token each.
        row_separator / grid_end: texts after a tile row and after the last one.

    Raises:
        ValueError: a text the layout needs as one token encodes otherwise.
    """
    tok = Tokenizer.from_str(tokenizer_json)

    def one(text: str) -> int:
        ids = tok.encode(text, add_special_tokens=False).ids
        if len(ids) != 1:
            raise ValueError(f"image layout token {text!r} encodes as {ids}, not one token")
        return ids[0]

    out = fpb.FrontendContract()
    out.CopyFrom(front)
    out.image_preparation = fpb.IMAGE_PREPARATION_TILED_GLOBAL
    out.image_layout = fpb.IMAGE_LAYOUT_TILE_GRID_SPAN
    out.image_tiling.CopyFrom(tiling)
    out.image_token_layout.CopyFrom(fpb.ImageTokenLayout(
        feature_token_id=sentinel, span_start_token_id=one(span), span_end_token_id=one(span),
        row_separator_token_id=one(row_separator), patches_per_feature=patches_per_feature,
        atomic_spans=True,
        tile_token_ids=[one(tile.format(r=r, c=c)) for r in range(1, grid + 1)
                        for c in range(1, grid + 1)],
        tile_grid_columns=grid, global_token_id=one(global_view),
        grid_end_token_ids=tok.encode(grid_end, add_special_tokens=False).ids,
        template_placeholder=placeholder))
    one(placeholder)
    return out
