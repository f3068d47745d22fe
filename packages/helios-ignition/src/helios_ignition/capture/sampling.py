"""The sampling step every family's PREFILL and DECODE programs end with.

``sample_biased``, or the chunked sampler (helios_tools.kernels.sampling_chunks), over a
pass's logits into the sampled-token output.
"""

from __future__ import annotations

import os

from helios_tools.kernels import grammar_mask_words
from helios_tools.kernels.sampling_chunks import (
    CANDIDATES,
    CHUNK,
    NUCLEUS,
    RACE_SLOTS,
    RACE_TOP,
)

from .buffers import INPUT_NAMES, PAGE_TABLE, SAMPLED
from .builder import BufferTable, ProgramBuilder
from .family import Family

# The candidate race's (ids per chunk, candidates per chunk) by batch bucket, chosen at
# capture and recorded in its launches (data in the core): HELIOS_RACE_GEOMETRY =
# "ROWS:C:M,..." uses C ids and M candidates per chunk from ROWS rows up (entries in
# ascending ROWS; bench/gpu_sampling.py prints the fastest per bucket). Default: CHUNK ids
# and RACE_TOP candidates at every batch.
RACE_GEOMETRY = os.environ.get("HELIOS_RACE_GEOMETRY", "")


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def race_geometries(spec: str) -> list[tuple[int, int, int]]:
    """``(from_rows, C, M)`` entries of a HELIOS_RACE_GEOMETRY value, the default
    ``(1, CHUNK, RACE_TOP)`` first.

    Raises:
        ValueError: an entry not ``ROWS:C:M`` of integers, rows not ascending from 1 up, C
            not a power of two in 256..8192 or M not a power of two in 1..16 (both are
            Triton block sizes).
    """
    out = [(1, CHUNK, RACE_TOP)]
    for item in filter(None, (x.strip() for x in spec.split(","))):
        try:
            lo, c, m = (int(x) for x in item.split(":"))
        except ValueError:
            raise ValueError(f"HELIOS_RACE_GEOMETRY entry {item!r} is not ROWS:C:M") from None
        if lo < 1 or (len(out) > 1 and lo <= out[-1][0]):
            raise ValueError(f"HELIOS_RACE_GEOMETRY entry {item!r}: rows must ascend from 1")
        if not (_pow2(c) and 256 <= c <= 8192):
            raise ValueError(f"HELIOS_RACE_GEOMETRY entry {item!r}: C must be a power of "
                             "two from 256 to 8192")
        if not (_pow2(m) and m <= 16):
            raise ValueError(f"HELIOS_RACE_GEOMETRY entry {item!r}: M must be a power of "
                             "two from 1 to 16")
        out.append((lo, c, m))
    return out


def race_geometry(rows: int, spec: str | None = None) -> tuple[int, int]:
    """The candidate race's (C ids per chunk, M candidates per chunk) at `rows` rows: the
    last entry of `spec` (HELIOS_RACE_GEOMETRY by default) whose rows are <= `rows`."""
    C, M = CHUNK, RACE_TOP
    for lo, c, m in race_geometries(RACE_GEOMETRY if spec is None else spec):
        if rows >= lo:
            C, M = c, m
    return C, M


def declare_chunked_sampling(t: BufferTable, s: Family, rows: int,
                             nucleus: bool = True, wide: bool = True,
                             race: bool = True) -> None:
    """Scratch of the chunked sampler (``sample_chunks`` -> ``sample_merge``): per row, each
    chunk's maximum and arg-max, its top-k candidates, and the merged winners; with
    `nucleus` (``sample_chunks_nucleus`` -> ``sample_merge_nucleus``) also each chunk's
    softmax mass, and the staging row holds the NUCLEUS picks; with `wide` (and
    `nucleus`: ``sample_race`` -> ``sample_pick``) each (chunk, probability slot)'s mass,
    best race score (f64 as two i32 words) and id, and the row's slot level; with `race`
    (and `wide`: the candidate race, ``sample_race_top`` -> ``sample_race_mass`` ->
    ``sample_race_pick``) instead each chunk's softmax mass, its RACE_TOP best race scores
    (f64 as two i32 words), their ids and probabilities, and the chunk's mass ahead of
    each of the row's RACE_TOP candidates."""
    P = -(-s.vocab // CHUNK)
    if nucleus and wide and race:
        # Sized for the widest bucket geometry: each launch views its own (R, P, M).
        geos = [g for g in race_geometries(RACE_GEOMETRY) if g[0] <= rows]
        P = max(-(-s.vocab // c) for _, c, _ in geos)
        PM = max(-(-s.vocab // c) * m for _, c, m in geos)  # candidates per row
        t.declare("scratch.sample_chunk_max", "f32", (rows, P), "scratch")
        t.declare("scratch.sample_chunk_arg", "i32", (rows, P), "scratch")
        t.declare("scratch.sample_chunk_mass", "f32", (rows, P), "scratch")
        t.declare("scratch.sample_cand_key", "i32", (rows, P * CANDIDATES), "scratch")
        t.declare("scratch.sample_cand_id", "i32", (rows, P * CANDIDATES), "scratch")
        t.declare("scratch.sample_selected", "i32", (rows, 2 * CANDIDATES), "scratch")
        t.declare("scratch.sample_top_score", "i32", (rows, 2 * PM), "scratch")
        t.declare("scratch.sample_top_id", "i32", (rows, PM), "scratch")
        t.declare("scratch.sample_top_zt", "f32", (rows, PM), "scratch")
        t.declare("scratch.sample_ahead", "f32", (rows, PM), "scratch")
        return
    if nucleus and wide:
        t.declare("scratch.sample_race_mass", "f32", (rows, P * RACE_SLOTS), "scratch")
        t.declare("scratch.sample_race_best", "i32", (rows, 2 * P * RACE_SLOTS), "scratch")
        t.declare("scratch.sample_race_arg", "i32", (rows, P * RACE_SLOTS), "scratch")
        t.declare("scratch.sample_race_level", "i32", (rows, 2), "scratch")
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


def sample(b: ProgramBuilder, s: Family, R: int, logits, slot, positions, inp,
           chunked: bool, nucleus: bool, wide: bool = False, race: bool = False) -> None:
    """Record the sampling step over `R` rows of `logits` into SAMPLED: ``sample_biased``,
    or with `chunked` its three-launch form (helios_tools.kernels.sampling_chunks: the
    vocabulary split over ``ceil(V / CHUNK)`` programs per row; same outputs), with
    `nucleus` the form that also resolves top-p rows with no top-k in the merge (cores
    exported before it record ``sample_chunks`` + ``sample_merge``; they keep loading), with
    `wide` (and `nucleus`) the form that draws every row with no top-k over its chunks:
    ``sample_chunks_wide`` -> ``sample_merge_nucleus`` -> ``sample_race`` + ``sample_pick``
    at two levels -> ``sample_rest`` (helios_tools.kernels.sampling_chunks; cores exported
    before it record the nucleus form and keep loading), with `race` (the default since;
    cores exported before it record the wide form and keep loading) the candidate race:
    ``sample_chunks_mass`` -> ``sample_merge`` -> ``sample_race_top`` ->
    ``sample_race_mass`` -> ``sample_race_pick`` (five launches, each chunk's ids read by
    three of them)."""
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
    if race:
        C, M = race_geometry(R)
        P = -(-s.vocab // C)
        cmax = t.view("scratch.sample_chunk_max", (R, P))
        carg = t.view("scratch.sample_chunk_arg", (R, P))
        ckey = t.view("scratch.sample_cand_key", (R, P * CANDIDATES))
        cid = t.view("scratch.sample_cand_id", (R, P * CANDIDATES))
        mass = t.view("scratch.sample_chunk_mass", (R, P))
        b.launch("sample_chunks_mass", logits, slot, inp("temperature", R), inp("top_k", R),
                 *penalties, hist, *masks, cmax, carg, mass, ckey, cid, R, s.vocab, words,
                 C, CANDIDATES)
        b.launch("sample_merge", cmax, carg, ckey, cid, *row,
                 t.view("scratch.sample_selected", (R, 2 * CANDIDATES)), sampled, R, s.vocab,
                 P, CANDIDATES)
        top = [t.view("scratch.sample_top_score", (R, 2 * P * M)),
               t.view("scratch.sample_top_id", (R, P * M)),
               t.view("scratch.sample_top_zt", (R, P * M))]
        ahead = t.view("scratch.sample_ahead", (R, P * M))
        b.launch("sample_race_top", logits, slot, positions, inp("seed", R, 2),
                 inp("temperature", R), inp("top_k", R), inp("min_p", R), *penalties, hist,
                 *masks, cmax, mass, sampled, *top, R, s.vocab, words, C, M)
        b.launch("sample_race_mass", logits, slot, inp("temperature", R), inp("top_p", R),
                 inp("top_k", R), inp("min_p", R), *penalties, hist, *masks, cmax, mass,
                 sampled, *top, ahead, R, s.vocab, words, C, M)
        b.launch("sample_race_pick", logits, slot, positions, inp("sampling_decision", R),
                 inp("seed", R, 2), *params, *penalties, hist, *masks, *top, ahead, sampled,
                 R, s.vocab, words, P, M)
        return
    if nucleus:
        mass = t.view("scratch.sample_chunk_mass", (R, P))
        width = 2 * max(CANDIDATES, NUCLEUS)
        b.launch("sample_chunks_wide" if wide else "sample_chunks_nucleus", logits, slot,
                 inp("temperature", R),
                 inp("top_p", R), inp("top_k", R), *penalties, hist, *masks, cmax, carg, mass,
                 ckey, cid, R, s.vocab, words, CHUNK, CANDIDATES)
        b.launch("sample_merge_nucleus", cmax, carg, mass, ckey, cid, *row,
                 t.view("scratch.sample_selected", (R, width)), sampled, R, s.vocab, P, CHUNK,
                 CANDIDATES, NUCLEUS)
        if wide:
            NB = RACE_SLOTS
            level = t.view("scratch.sample_race_level", (R, 2))
            race = [t.view("scratch.sample_race_mass", (R, P * NB)),
                    t.view("scratch.sample_race_best", (R, 2 * P * NB)),
                    t.view("scratch.sample_race_arg", (R, P * NB))]
            for lv in (1, 2):
                b.launch("sample_race", logits, slot, positions, inp("seed", R, 2),
                         inp("temperature", R), inp("top_k", R), inp("min_p", R), *penalties,
                         hist, *masks, cmax, mass, sampled, level, *race, R, s.vocab, words,
                         CHUNK, NB, lv)
                b.launch("sample_pick", *race, slot, inp("sampling_decision", R),
                         inp("temperature", R), inp("top_p", R), inp("top_k", R), hist, level,
                         sampled, R, s.vocab, P, NB, lv)
    else:
        b.launch("sample_chunks", logits, slot, inp("temperature", R), inp("top_k", R),
                 *penalties, hist, *masks, cmax, carg, ckey, cid, R, s.vocab, words, CHUNK,
                 CANDIDATES)
        b.launch("sample_merge", cmax, carg, ckey, cid, *row,
                 t.view("scratch.sample_selected", (R, 2 * CANDIDATES)), sampled, R, s.vocab,
                 P, CANDIDATES)
    b.launch("sample_rest", *common)




def last_positions(b: ProgramBuilder, rows: int):
    """Per-row RNG positions for prefill: each row's last fed token.

    Decode rows key the sampler with the fed token's position; prefill rows with the
    position of their chunk's last token, bound as CONSUMED_ENDPOINT - 1 per submission
    row, so a request draws the same numbers whichever step samples it.
    """
    return b.table.view("in.sample_position", (rows,))

