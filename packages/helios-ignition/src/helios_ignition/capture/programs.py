"""Every family's programs: capture the graph variants of a core and their contracts.

Captured per graph variant: PREFILL (packed prompt tokens across rows, per prefill token
capacity), DECODE (one pending token per row, per batch capacity), MIXED (per mixed token
capacity T and decode batch capacity B <= T: B rows of decode lanes and prefill chunks, the
PREFILL program's packing and math, its decode lanes' pending tokens fed from the host
after completion, every sampling row writing the device pending token), in a core with a
learned drafter SPECULATIVE (per batch capacity and width: draft, verify, commit;
capture/speculative.py), and with transfer rows one RESTORE program per storage route
(rows copied between pages, continuation rows and host-tier rows: snapshots, restores,
the host tier). Buffers are shared across variants (capture/buffers.py); each variant
uses the leading rows of the request inputs and scratch. The model's own math is the
family's trunk (capture/family.py: `Family`); everything here is the same for every
family.

Tensor parallelism (`Family.ranks` = N > 1; Megatron-LM's split, arXiv:1909.08053 §3):
the family's shapes are one rank's and its trunk carries the all-reduces; the LM head is
vocabulary-parallel (ceil(V/N) rows per rank: `all_gather_columns` assembles the logits,
so every rank samples the same token from the same logits).
"""

from __future__ import annotations

from helios_contract import PROPOSAL_CONFIDENCE
from helios_contract.schema import contract_pb2 as cpb
from helios_contract.schema import manifest_pb2 as mpb

from ..families import vision
from ..preparation import contract as decl
from ..recipe import Capacities, SplitTuning
from . import launch, layers
from .buffers import (
    INPUT_NAMES,
    LOGPROBS,
    PAGE_TABLE,
    PENDING,
    PREFIX_ROWS_PER_LANE,
    RECORD,
    SAMPLED,
    SCORE_IDS,
    SCORE_TARGETS,
    SCORED_LOGITS,
    SCORED_SHARD,
    SCORES,
    SPEC_NAMES,
    SPLIT_PRODUCER,
    TOP_IDS,
    TRANSFER_NAMES,
    TUNED_SPLITS,
    WINDOW_PAGE_TABLE,
    Speculation,
    declare_buffers,
    paged_planes,
    tier_plane,
    transfer_routes,
)
from .builder import BufferTable, ProgramBuilder
from .family import Family, ImageRows, Pass, Rows, TensorParallelError
from .sampling import declare_chunked_sampling, last_positions, sample
from .speculative import DRAFT_LAG, draft_context, speculative
from .tuning import split_producer


def capture(s: Family, caps: Capacities, weight_dtype: str, *, device_pending: bool = True,
            spec: Speculation | None = None, split_tuning: SplitTuning | None = None,
            fold_layers: bool = False, chunked_sampling: bool = True,
            activations: str = "f32", nucleus_sampling: bool = True,
            wide_sampling: bool = True,
            race_sampling: bool = True) -> tuple[mpb.ExecutionManifest, list[cpb.GraphContract]]:
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
            product's epilogue; the family's trunk). Off by default: the manifest's launches
            record the choice, so cores exported either way keep serving unchanged.
        chunked_sampling: prefill and decode sample with ``sample_chunks`` +
            ``sample_merge`` + ``sample_rest`` instead of ``sample_biased`` (same outputs;
            capture/sampling.py); the default since the H200 run (bench/results/
            gpu_kern_llama8b_chunked.json). False records ``sample_biased``, as cores
            exported before it do (they keep loading).
        activations: the packed products' activation dtype: "f32" (``split_bf16``'s
            hi | lo terms, near-f32 products) or "bf16" (``round_bf16``'s hi | 0: the
            activations rounded to bf16, one MMA term on the GPU; capture.layers.product).
            Products off the packed path keep f32 activations either way.
        nucleus_sampling: with `chunked_sampling`, record ``sample_chunks_nucleus`` +
            ``sample_merge_nucleus`` (top-p rows with no top-k resolved in the merge when
            their nucleus lies inside the NUCLEUS most probable candidates; same outputs).
            False records ``sample_chunks`` + ``sample_merge``, as cores exported before
            it do (they keep loading).
        wide_sampling: with `nucleus_sampling`, record the wide form (every row with no
            top-k raced over its chunks: ``sample_chunks_wide`` + ``sample_race`` +
            ``sample_pick``; same outputs). False records the nucleus form, as cores
            exported before it do (they keep loading).
        race_sampling: with `wide_sampling`, record the candidate race instead of the
            slot race (``sample_chunks_mass`` + ``sample_merge`` + ``sample_race_top`` +
            ``sample_race_mass`` + ``sample_race_pick``: the race's best scores first,
            then the nucleus test of those few ids; same outputs). False records the
            wide form, as cores exported before it do (they keep loading).

    Returns:
        The execution manifest (buffers, kernel variants, graph programs) and one
        GraphContract per variant, in the same order.
    """
    if caps.mixed_tokens and spec is not None:
        raise ValueError("mixed programs are not captured in a drafter core (its decode rows "
                         "stay row-invariant with verification)")
    if spec is not None and not device_pending:
        raise ValueError("speculative programs read the device-owned pending token")
    if fold_layers and s.ranks > 1:  # linear_add would add each rank's partial sum
        raise TensorParallelError("folded layers add the O and down products into the "
                                  "residual, which split ranks must all-reduce first")
    table = declare_buffers(s, caps, weight_dtype, spec)
    rows = max(max(caps.decode_batch), caps.prefill_rows)
    table.declare("in.sample_position", "i32", (rows,), "input")
    if chunked_sampling:
        declare_chunked_sampling(table, s, rows, nucleus_sampling, wide_sampling,
                                 race_sampling)
    kernels: dict[str, mpb.Kernel] = {}
    tuned = split_tuning is not None
    producers = [split_producer(table, kernels, s, caps, split_tuning)] if tuned else []
    programs: list[mpb.GraphProgram] = []
    contracts: list[cpb.GraphContract] = []
    variants = [("decode", b, b, 0) for b in caps.decode_batch]
    variants += [("prefill", t, caps.prefill_rows, 0) for t in caps.prefill_tokens]
    variants += [("scored", t, caps.prefill_rows, 0) for t in caps.scored_tokens]
    variants += [("mixed", t, b, 0) for b in caps.decode_batch for t in caps.mixed_tokens
                 if 2 <= b <= t]
    windows = caps.image_windows if s.vision is not None else 0
    if windows:  # the image inputs, encoder scratch, and one image prefill per T
        vision.declare(table, s.vision, windows, max(caps.prefill_tokens))
        variants += [("image", t, caps.prefill_rows, 0) for t in caps.prefill_tokens]
    if spec is not None:
        variants += [("speculative", b * w, b, w) for b in caps.decode_batch for w in spec.widths]
        if spec.prefix_batches:
            variants += [("prefix", b * PREFIX_ROWS_PER_LANE, b, spec.max_width)
                         for b in caps.decode_batch if b >= 2]
    for kind, tokens, nrows, width in variants:
        builder = ProgramBuilder(table, kernels, activations)
        if kind in ("speculative", "prefix"):
            assert spec is not None
            prefix = kind == "prefix"
            speculative(builder, s, caps, spec, nrows, width, tuned,
                        packed=tokens if prefix else None)
            name = f"spec_b{nrows}_w{width}" + (f"_p{tokens}" if prefix else "")
            op, packed = cpb.OPERATION_SPECULATIVE, tokens
            completion = mpb.CompletionLayout(
                buffer=RECORD, rows=nrows,
                speculative=mpb.SpeculativeCompletion(token_width=width),
                confidence_buffer=PROPOSAL_CONFIDENCE if prefix else "")
        else:
            decode, scored = kind == "decode", kind == "scored"
            images = None
            if kind == "image":
                features = vision.encode(builder, s.vision, windows)
                images = ImageRows(features, table.view(vision.FEATURE_INDEX, (tokens,)))
            forward(builder, s, caps, tokens, nrows, decode, device_pending, spec, tuned,
                    fold_layers, scored=scored, images=images)
            name = (f"decode_b{tokens}" if decode else f"prefill_t{tokens}_w{windows}"
                    if images is not None else f"mixed_b{nrows}_t{tokens}" if kind == "mixed"
                    else f"{kind}_t{tokens}")
            op = (cpb.OPERATION_DECODE if decode else cpb.OPERATION_SCORED_PREFILL if scored
                  else cpb.OPERATION_MIXED if kind == "mixed" else cpb.OPERATION_PREFILL)
            packed = tokens
            completion = mpb.CompletionLayout(
                buffer=SAMPLED, rows=nrows, logprobs_buffer=LOGPROBS, top_ids_buffer=TOP_IDS,
                top_logprobs=decl.TOP_LOGPROBS,
                scores_buffer=SCORES if scored else "",
                score_ids_buffer=SCORE_IDS if scored else "")
        program = mpb.GraphProgram(name=name, operation=op, batch_capacity=nrows,
                                   token_capacity=packed, launches=builder.launches,
                                   completion=completion)
        contract = _graph_contract(name, op, nrows, packed, s, table, device_pending, width,
                                   prefix=kind == "prefix")
        if kind == "image":
            contract.bindings.extend(decl.image_inputs(vision.WINDOWS, vision.WINDOW_COUNT,
                                                       vision.FEATURE_INDEX))
        if tuned and decode_like(op):  # its decode attention reads the choice
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
    experts = getattr(s, "expert_geometry", None)  # a family with sparse layers declares them
    if experts is not None:
        manifest.expert_geometry.CopyFrom(experts())
    return manifest, contracts




def decode_like(op: int) -> bool:
    """DECODE and SPECULATIVE programs: one pending token per row (decode attention)."""
    return op in (cpb.OPERATION_DECODE, cpb.OPERATION_SPECULATIVE)


def forward(b: ProgramBuilder, s: Family, caps: Capacities, tokens: int, rows: int,
             decode: bool, device_pending: bool, spec: Speculation | None = None,
             tuned: bool = False, fold: bool = False, scored: bool = False,
             images: ImageRows | None = None) -> None:
    """Record one PREFILL, SCORED_PREFILL, MIXED or DECODE variant: `tokens` packed tokens
    over `rows` rows (a MIXED variant is the PREFILL recording: its decode lanes are rows
    of one host-fed token, which the packed attention and last-token gather treat as
    chunks of length one).

    A SCORED_PREFILL variant (`scored`) is the prefill variant plus, before the last-token
    gather, the LM head over every packed token into SCORED_LOGITS [T, V] and
    ``score_tokens``: each token's target (SCORE_TARGETS, the next prompt token; -1 for
    none) gets its raw-distribution logprob and the top alternatives in SCORES /
    SCORE_IDS. Sampling and the last token's logprobs are the prefill's, unchanged.
    `images` (an image prefill): the encoded image features replace the embeddings of the
    positions FEATURE_INDEX names (ImageRows).

    With `device_pending`, decode reads each row's fed token from the slot's pending-token
    state and every sampling row writes its sampled id back there (specification: "Host
    values and graph state"), so step N + 1 can be submitted before step N completes.
    In a drafter core (`spec`), decode is row-invariant (its rows equal verification
    rows bit for bit) and prefill and decode also store their features and write the
    head's entries of their tokens (the draft context). `tuned`: decode attention reads the
    tuned split count. `fold`: decode layers fold norms and residual adds into their
    products (the family's trunk; not in a drafter core, whose decode stays row-invariant).
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
    s.trunk(b, Pass(Rows(toks, pos, trow, slot, slot), T, R, caps.page_tokens,
                    caps.context_tokens // caps.page_tokens, decode_attention=decode,
                    invariant=decode and spec is not None, tuned=decode and tuned,
                    fold=fold and decode and spec is None, images=images))
    h = t.view("scratch.h", (T, s.hidden))
    if spec is not None:
        draft_context(b, s, caps, spec, toks, pos, trow, slot, T, R,
                      linear="linear_invariant" if decode else "linear")
    if scored:
        K = decl.TOP_LOGPROBS
        all_logits = t.view(SCORED_LOGITS, (T, s.vocab))
        if s.ranks > 1:  # vocabulary-parallel, as the sampled rows' head below
            shard = t.view(SCORED_SHARD, (T, s.head_rows))
            b.launch("linear", h, t.view("lm_head", (s.head_rows, s.hidden)), shard, T,
                     s.head_rows, s.hidden)
            b.launch("all_gather_columns", shard, all_logits, T, s.head_rows, s.vocab)
        else:
            b.launch("linear", h, t.view(s.head_buffer(), (s.vocab, s.hidden)), all_logits, T,
                     s.vocab, s.hidden)
        b.launch("score_tokens", all_logits, t.view(SCORE_TARGETS, (T,)),
                 t.view(SCORES, (T, 1 + K)), t.view(SCORE_IDS, (T, K)), T, s.vocab, K)
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
        head = t.view(s.head_buffer(), (s.vocab, s.hidden))
        if head_op == "linear" and _head_on_tc(t, head, R, s.vocab, s.hidden):
            layers.product(b, "linear", h, head, logits, R, s.vocab, s.hidden)
        else:
            b.launch(head_op, h, head, logits, R, s.vocab, s.hidden)
    sampled = t.view(SAMPLED, (R,))
    sample(b, s, R, logits, slot, pos if decode else last_positions(b, R), inp,
           "scratch.sample_chunk_max" in t.buffers, "scratch.sample_chunk_mass" in t.buffers,
           "scratch.sample_race_mass" in t.buffers, "scratch.sample_ahead" in t.buffers)
    # Same step, same logits (unmodified by the sampler): rows that ask record logprobs.
    K = decl.TOP_LOGPROBS
    b.launch("token_logprobs", logits, slot, sampled, inp("logprobs", R),
             t.view(LOGPROBS, (R, 1 + K)), t.view(TOP_IDS, (R, K)), R, s.vocab, K)
    if device_pending:
        b.launch("slot_scatter", t.view(SAMPLED, (R,)), slot, inp("sampling_decision", R),
                 pending, R, slots)




def _head_on_tc(t: BufferTable, head, R: int, vocab: int, hidden: int) -> bool:
    """Whether the LM head of `R` rows takes the layer products' packed path: only where
    it is linear_packed's TC=1 tile with one slice (``launch.decode_tc``, issue 27), so
    no K-slice partials of vocabulary width are ever needed; bf16 heads
    (``layers._packed_weights``) with the packed scratch declared."""
    return (layers._packed_weights(head.buffer.dtype) and "scratch.xsplit" in t.buffers
            and launch.decode_tc(R, vocab, hidden) and launch.mma_plan(R, vocab, hidden) == 1)


def _transfer(b: ProgramBuilder, s: Family, spec: Speculation | None, source: str,
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


def _transfer_contract(name: str, s: Family, spec: Speculation | None, table: BufferTable,
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




def _graph_contract(name: str, op: int, rows: int, tokens: int, s: Family,
                    table: BufferTable, device_pending: bool, width: int = 0,
                    prefix: bool = False) -> cpb.GraphContract:
    decode = decode_like(op)
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
    if not decode:
        g.bindings.append(decl.binding("in.sample_position", cpb.VALUE_SOURCE_CONSUMED_ENDPOINT,
                                       cpb.INDEXING_SUBMISSION_ROW, offset=-1))
    if op == cpb.OPERATION_SCORED_PREFILL:
        g.bindings.append(decl.scored_targets(SCORE_TARGETS))
    pt_bindings, pt_access = decl.paged_text(PAGE_TABLE, table.buffers[PAGE_TABLE].shape[1] * 4,
                                             slots)
    g.bindings.extend(pt_bindings)
    g.state_accesses.extend(pt_access)
    if WINDOW_PAGE_TABLE in table.buffers:  # the sliding-window region's page table
        pt_bindings, pt_access = decl.paged_text(
            WINDOW_PAGE_TABLE, table.buffers[WINDOW_PAGE_TABLE].shape[1] * 4, slots)
        g.bindings.extend(pt_bindings)
        g.state_accesses.extend(pt_access)
    g.state_accesses.extend(decl.state_transfer(INPUT_NAMES["histogram"], s.vocab * 4, slots,
                                                logit_bias=INPUT_NAMES["logit_bias"]))
    if device_pending:
        view, access = decl.device_pending_token(PENDING, generating=decode)
        g.pending_token.CopyFrom(view)
        g.state_accesses.append(access)
    return g


