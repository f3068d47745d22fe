"""SPECULATIVE programs and the draft context, for any family with a learned drafter.

The draft head's own launches are families/draft.py's; the target's verification pass
is the family's trunk (`Family.trunk`) over the packed verification rows.

Tensor parallelism (`Family.ranks` = N > 1): the head is replicated (its weights, its
K/V and feature histories are whole on every rank; its inputs -- the target's final-norm
features and the tokens -- are the same on every rank), so every rank drafts the same
tokens; the target's verification is the trunk's split forward (its collectives) and
the vocabulary-parallel LM head (`all_gather_columns`), so every rank verifies the same
logits. Prefix-limit programs broadcast rank 0's proposal confidence before
`spec_allocate` (`broadcast_rank0`; the specification: "Rank-zero confidence is
broadcast before allocation"), so every rank allocates the same rows whatever its own
confidences were. Every rank's completion record must then equal rank 0's (the runtime's
validation agreement: runtime/ranks.py).
"""

from __future__ import annotations

from helios_contract import PROPOSAL_CONFIDENCE
from helios_tools.kernels import grammar_mask_words
from helios_tools.kernels.speculative import RECORD_FIELDS

from ..families import draft
from ..recipe import Capacities
from .buffers import (
    INPUT_NAMES,
    PAGE_TABLE,
    PENDING,
    RECORD,
    SPEC_NAMES,
    Speculation,
    decode_splits,
)
from .builder import ProgramBuilder
from .family import Family, Pass, Rows

# The head's entries are committed up to the consumed endpoint: draft cursor lag 0.
DRAFT_LAG = 0


def draft_context(b: ProgramBuilder, s: Family, caps: Capacities, spec: Speculation,
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


def speculative(b: ProgramBuilder, s: Family, caps: Capacities, spec: Speculation,
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
        if s.ranks > 1:  # every rank allocates from rank 0's confidence
            b.launch("broadcast_rank0", confidence, B, dmax)
        qlen = sp("query_length", B)
        b.launch("spec_allocate", inp("lane_ceiling", B), slot, confidence, qlen, B, P, dmax)
        pos, trow, tslot = sp("positions", P), sp("token_row", P), sp("token_slot", P)
        b.launch("spec_pack_rows", qlen, start, slot, pos, trow, tslot, B, P)
    else:
        pos, trow, tslot = inp("positions", P), inp("token_row", P), inp("token_slot", P)
    tokens = sp("tokens", P)
    b.launch("spec_pack_tokens", pending, slot, start, drafts, pos, trow, tokens, B, P, slots,
             dmax)
    s.trunk(b, Pass(Rows(tokens, pos, trow, slot, tslot), P, B, PT, MP, decode_attention=True,
                    invariant=True, tuned=tuned))
    h = t.view("scratch.h", (P, s.hidden))
    logits = t.view("scratch.logits", (P, s.vocab))
    if s.ranks > 1:  # vocabulary-parallel, as decode: this rank's rows, then every rank's
        shard = t.view("scratch.logits_shard", (P, s.head_rows))
        b.launch("linear_invariant", h, t.view("lm_head", (s.head_rows, s.hidden)), shard, P,
                 s.head_rows, s.hidden)
        b.launch("all_gather_columns", shard, logits, P, s.head_rows, s.vocab)
    else:
        head = t.view(s.head_buffer(), (s.vocab, s.hidden))
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


