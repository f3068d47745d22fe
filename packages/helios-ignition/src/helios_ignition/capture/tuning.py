"""The decode-split tuning producer (recipe.SplitTuning; helios_tools.kernels.tuning):
an INITIALIZE program in the manifest's tuning catalog, the same for every family."""

from __future__ import annotations

import math

from helios_contract.schema import contract_pb2 as cpb
from helios_contract.schema import manifest_pb2 as mpb
from helios_tools.kernels.tuning import CANDIDATE_STRIDE, MAX_CANDIDATES

from ..recipe import Capacities, SplitTuning
from .buffers import SPLIT_PRODUCER, TUNED_SPLITS, decode_splits
from .builder import BufferTable, ProgramBuilder
from .family import Family


def split_candidates(ns: int, count: int) -> list[int]:
    """Split counts the producer times: ``ns, ns/2, ns/4, ns/8`` (ceil, distinct, first
    `count`)."""
    out: list[int] = []
    for shift in range(4):
        c = max(-(-ns // (1 << shift)), 1)
        if c not in out:
            out.append(c)
    return out[:count]


def split_producer(table: BufferTable, kernels: dict[str, mpb.Kernel], s: Family,
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


