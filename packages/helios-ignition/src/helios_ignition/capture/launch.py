"""Launch geometry of each kernel op: grid, block, shared bytes and variant constants.

The CPU backend ignores these; the GPU backend launches the Triton kernels of
``helios_ignition.kernels_triton`` with them. Shapes travel as runtime scalars; only
block sizes, the weight dtype (``WBF16``) and the warp count (``WARPS``, which sets the
block) are compile-time constants, so a model has a few dozen kernel variants at most.
Shared bytes are filled in per target by ``kernels_aot`` from the compiled binary.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from helios_tools.kernels.kv_bf16 import KV_BF16_BASE
from helios_tools.kernels.kv_fp8 import KV_FP8_BASE

# H200: 132 SMs. Decode GEMVs want at least two programs per SM so the weight stream has
# enough loads in flight to approach HBM bandwidth.
TARGET_PROGRAMS = 264
# Multi-row linear layout: tokens as the MMA's M operand; HELIOS_LINEAR_SWAP=1 at capture
# swaps A and B (measured 1.5-7x slower on the H200: bench/results/gpu_linear_v1.json).
LINEAR_SWAP = os.environ.get("HELIOS_LINEAR_SWAP", "0") == "1"
# Multi-row linear tile rule, chosen at capture with HELIOS_LINEAR_RULE: "v3" (default:
# per-shape winners of the H200 sweep, bench/results/gpu_linear_sweep_v2.json), "v1" (the
# earlier tiles: hand prefetch, 4 warps) or "v2" (pipelined, stacked hi/lo, 8 warps:
# measured 2-8x slower than v1, kept for sweeps).
LINEAR_RULE = os.environ.get("HELIOS_LINEAR_RULE", "v3")
# Few-row decode linear on the FMA units (``FMA=1``: each weight tile serves every row):
# "BLOCK_N,BLOCK_K,WARPS,MAX_ROWS,MAX_N" at capture (HELIOS_LINEAR_FMA), or "off". At 8
# rows (bench/results/gpu_linear_sweep_v4.json) the chosen variant wins only on narrow
# matrices (N <= 1024: 1.4-1.8x the MMA tiles on SmolLM2's qkv and down projections) and
# runs at 0.4-0.97x of them on wide ones (8B, LM heads).
LINEAR_FMA = os.environ.get("HELIOS_LINEAR_FMA", "4,1024,4,8,1024")
# Batch-1 GEMV constants at capture (HELIOS_LINEAR_GEMV): "v2" (default), "v1" (4 rows per
# program, K in at most 2048-wide loads, 4 warps: bench/results/gpu_linear_sweep_v3.json)
# or "BLOCK_N,BLOCK_K,WARPS,PERSIST,PRE,EVICT" (BLOCK_K caps the K step; PERSIST > 0
# launches at most PERSIST x SMS programs, each looping over row tiles; PRE=1 prefetches
# the next weight tile; EVICT=1 loads weights evict-first). v2 is v1 but for K >=
# GEMV_LONG_K (the 8B down projection as a plain linear, K 14336): 1024-wide K steps and
# 2 warps, 34.6 vs 36.4 / 36.0 us in two H200 sweeps. Nothing else of 84 specs beat v1 by
# more than 1 % on an 8B matrix (persistent grids 0.94-0.96x, the register prefetch
# 0.67-0.80x): bench/results/h200_2026-12-02/gemv2_aad133f.json, gemv3_bf8287c.json.
LINEAR_GEMV = os.environ.get("HELIOS_LINEAR_GEMV", "v2")
GEMV_V1 = "4,2048,4,0,0,0"
GEMV_LONG_K, GEMV_V2_LONG = 8192, "4,1024,2,0,0,0"
# Prefill tiles (more than 64 rows) at capture (HELIOS_LINEAR_PREFILL): "auto" (128 x 128
# tiles for N >= 4096, where the prefill sweep measured 1.9-3.0x over v1 on the 8B qkv,
# gate_up and down matrices; v1 below, where they lose up to 2x on SmolLM2's qkv and
# down at 256 rows: bench/results/gpu_prefill_sweep.json),
# "v1" (linear_tiles) or "BLOCK_T,BLOCK_N,BLOCK_K,WARPS,STAGES,PREFETCH,STACK".
LINEAR_PREFILL = os.environ.get("HELIOS_LINEAR_PREFILL", "auto")
PREFILL_WIDE = "128,128,32,8,4,0,0"
# Prefill GEMMs on the tensor-core tile paths (issue 27), for bf16 matrices with N >= 4096
# (the 8B geometry; smaller models keep the rules above) and K a multiple of 64, beyond
# the batched-decode rows (MMA_ROWS). By default (HELIOS_LINEAR_PREFILL_PACKED=1) capture
# records the packed path: split_bf16 + one-slice linear_packed through mma_plan, whose
# TC=1 tile is a plain bf16 GEMM over the packed hi | lo terms (prefill_tc_constants),
# both operands by TMA. On an H100 at ace5daa it ran 0.42-0.48x torch.matmul against the
# f32-activation tile's 0.35x, and a 1,024-token 8B prompt in one chunk took 74.2 ms
# against 84.5 ms (bench/results/h100_2026-12-06b/). HELIOS_LINEAR_PREFILL_PACKED=0 keeps
# the plain linear op (``linear``, ``linear_invariant``) on the linear kernel's TC=1 tile
# over f32 activations (LINEAR_TC); the folded ops (rmsnorm_linear, linear_add) keep the
# tiles above. One activation term (XSPLIT=0: half the tensor work) is recorded only over
# the rounded producers of a bf16-activation core (export --activation-dtype bf16:
# round_bf16 writes hi | 0, so both backends multiply the same bf16 activations).
PREFILL_PACKED = os.environ.get("HELIOS_LINEAR_PREFILL_PACKED", "1") == "1"
PREFILL_TC_MIN_N = 4096
# The linear kernel's TC=1 tile over f32 activations: (BLOCK_T, BLOCK_N, BLOCK_K, WARPS,
# STAGES), TMA loads. The fastest hi/lo tile that was finite and bitwise deterministic at
# every 8B matrix and row count of the H200 sweep (bench/results/h200_2026-12-06/
# prefill_sweep_15a69b7.json: 0.22-0.37x torch.matmul, HEAD's tiles 0.08-0.13x); several
# other TMA tiles of that sweep raced under Triton 3.6 (NaN or run-to-run differences).
LINEAR_TC = (64, 256, 64, 4, 4)
# Fused ops (rope_kv_write; swiglu_linear where the GEMV/FMA path runs): HELIOS_FUSE=0 at
# capture records the unfused pairs instead.
FUSE = os.environ.get("HELIOS_FUSE", "1") != "0"
# Widest FFN whose batch-1 down projection is fused (swiglu_linear) at capture
# (HELIOS_FUSE_GEMV_MAX_K; wider ones record silu_mul + linear). H200,
# gemv3_bf8287c.json: the 8B down (K 14336) fused 52.4 us (best fused variant 46.0) vs
# silu_mul 1.6 + linear 34.6 us -- every program recomputes silu(gate) * up for its rows
# and reads gate and up (8 bytes per K element against 8 of weights at 4 rows); SmolLM2's
# (K 1536) fused 4.1 us vs 1.9 + 2.8 us unfused: there the saved launch wins.
FUSE_GEMV_MAX_K = int(os.environ.get("HELIOS_FUSE_GEMV_MAX_K", "8192"))
# One wave of programs: with about 250 registers a thread, a 256-thread program has an SM.
SMS = 132
# Split-context decode attention rule (HELIOS_ATTN_RULE at capture): "v3" (one tile per
# split, several splits per program at 64+ rows of 128 splits: attention_split_constants), "v2"
# (64-position tiles whatever the split length: cores exported before v3) or "v1" (per
# query head, or an MMA tile per kv head for small batches). HELIOS_ATTN_FUSED=1 (rule v3
# only) records decode-style attention as one attention_decode_fused launch (measured
# slower than split + merge on the H200: off by default).
ATTN_RULE = os.environ.get("HELIOS_ATTN_RULE", "v3")
ATTN_FUSED = os.environ.get("HELIOS_ATTN_FUSED", "0") != "0"
# Rule v3's live-split layout (HELIOS_ATTN_LIVE at capture: attention_split_constants,
# _attention_live): the programs a (row, kv head) gets, aimed at this many programs in
# all; "0" keeps the grid of NS splits a row (SPP). HELIOS_ATTN_LIVE_MIN_ROWS: from how
# many rows the layout is used.
ATTN_LIVE = int(os.environ.get("HELIOS_ATTN_LIVE", "4096"))
ATTN_LIVE_MIN_ROWS = int(os.environ.get("HELIOS_ATTN_LIVE_MIN_ROWS", "1"))
# Rule v3's decode attention on the tensor cores (GROUPED=4, kernels_triton/attention.py
# `_split_mma_at`), opt-in at capture with HELIOS_ATTN_MMA: "off" (the default: not yet
# timed against the FMA bodies, bench/gpu_attention_live.py), "2" (queries and
# probabilities in two bf16 terms each, near f32) or "1" (one term: for sweeps, to measure
# what the second costs). The same knob puts the MIXED steps' decode lanes
# (attention_prefill's lane programs, `_prefill_lane`) on that body too
# (prefill_lane_constants). bf16 KV planes only: an export whose cache is not bf16 is
# refused before capture (check_attention_mma), launches over e4m3 planes when their
# constants are chosen (attention_split_constants, prefill_lane_constants).
ATTN_MMA = os.environ.get("HELIOS_ATTN_MMA", "off")
ATTN_MMA_TERMS = {"off": 0, "1": 1, "2": 2}
# Its error bound by TERMS, on each of: the merged output's max |error| over max |output|,
# the split maxima's max |error| (logit units), the sums of exponentials' and split
# outputs' max relative errors, against f32 / float64 references. The worst measured under
# Triton's interpreter: 1.8e-5 with two terms (the f32 FMA reference's own 9e-7) and
# 1.2e-2 with one against float64 (scripts/interpret_kernels.py attnmma: 8B, SmolLM2 and
# HD-40 geometries); 2.2e-5 and 1.5e-2 against the f32 reference on the smaller cases of
# tests/gpu/test_kv_bf16.py, which with bench/gpu_attention_live.py holds the device to it.
# The MIXED lanes on that body, on their outputs' max |error| over max |output|: 4.2e-6
# and 3.9e-3 against float64 (interpret_kernels.py mixedmma, windows included).
ATTN_MMA_BOUND = {2: 5e-5, 1: 5e-2}
# Grouped expert product tiles at capture (HELIOS_MOE_TILES="BLOCK_N,BLOCK_K,WARPS";
# empty: moe_constants' rule).
MOE_TILES = os.environ.get("HELIOS_MOE_TILES", "")
# Warps of the candidate race's per-chunk programs (sample_race_top, sample_race_mass) at
# capture (HELIOS_RACE_WARPS): their cost is reductions over a chunk, so fewer warps mean
# fewer shared-memory rounds per reduction and more programs per SM. Not yet measured:
# bench/gpu_sampling.py sweeps 2/4/8.
RACE_WARPS = int(os.environ.get("HELIOS_RACE_WARPS", "4"))


@dataclass(frozen=True)
class LaunchConfig:
    """Grid and block in (x, y, z), dynamic shared bytes, compile-time constants."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int] = (128, 1, 1)
    shared_bytes: int = 0
    constants: dict[str, int] = field(default_factory=dict)


def _np2(n: int, floor: int = 1) -> int:
    p = floor
    while p < n:
        p *= 2
    return p


def _cdiv(a: int, b: int) -> int:
    return max((a + b - 1) // b, 1)


def _cfg(grid: tuple[int, ...], warps: int, **constants: int) -> LaunchConfig:
    g = tuple(max(int(x), 1) for x in grid) + (1,) * (3 - len(grid))
    return LaunchConfig(grid=g, block=(32 * warps, 1, 1),
                        constants={**constants, "WARPS": warps})


def _is_bf16(view) -> int:
    return int(getattr(getattr(view, "buffer", None), "dtype", "f32") == "bf16")


def linear_tiles(T: int, N: int, K: int) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_N, BLOCK_K) of the v1 multi-row ``[T, K] x [N, K]^T`` product.

    From a sweep of 72 variants per row count on the H200 (bench/gpu_linear_sweep.py,
    bench/results/gpu_linear_sweep.json): up to 32 rows, the widest N tile that still
    gives every SM two programs with 128-wide K steps (256 for K > 4096); 64 rows, narrow
    N tiles and 64-wide K steps.
    """
    bt = 16 if T <= 16 else 32 if T <= 32 else 64
    tiles_t = _cdiv(T, bt)
    if bt == 64:
        bn = 32 if _cdiv(N, 32) * tiles_t >= TARGET_PROGRAMS else 16
        return bt, bn, 64
    bn = 64 if _cdiv(N, 64) * tiles_t >= TARGET_PROGRAMS else 32
    return bt, bn, 256 if K > 4096 else 128


def _linear_v1(T: int, N: int, K: int) -> dict[str, int]:
    """v1 constants: ``linear_tiles`` with 4 warps (the kernel's default load scheme)."""
    bt, bn, bk = linear_tiles(T, N, K)
    return dict(BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk, WARPS=4)


def linear_constants(T: int, N: int, K: int, rule: str = "") -> dict[str, int]:
    """Variant constants (with ``WARPS``/``STAGES``, without ``WBF16``/``K16``) of a
    multi-row (``T > 1``, tokens as the MMA's M operand) linear under `rule`.

    v2: Triton pipelines both loads (``PREFETCH=0``, 3 stages), the activation's hi/lo
    terms share one MMA (``STACK=1``: 32 rows fill a 64-row wgmma), 8 warps keep the
    thread under 255 registers without spills (ptxas, Triton 3.6), and each program takes
    the widest N tile (fewest activation re-reads from L2) that still fills one wave of
    SMs. Derived from compiler output, then measured 2-8x slower than v1 on the H200
    (bench/results/gpu_linear_sweep_v2.json); kept for sweeps. v3 is the default.

    Raises:
        ValueError: an unknown rule.
    """
    rule = rule or LINEAR_RULE
    if rule == "v3":
        return _linear_v3(T, N, K)
    if rule == "v1":
        return _linear_v1(T, N, K)
    if rule != "v2":
        raise ValueError(f"unknown linear rule {rule!r}; known: v1, v2, v3")
    bt = 32 if T <= 32 else 64
    tiles_t = _cdiv(T, bt)
    bn = next((b for b in (128, 64) if _cdiv(N, b) * tiles_t >= SMS), 32)
    return dict(BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=64, WARPS=8, STAGES=3, PREFETCH=0,
                STACK=1)


def fuse_decode_attention() -> bool:
    """Whether capture records ``attention_decode_fused`` (one launch) instead of
    ``attention_decode_split`` + ``attention_decode_merge`` for decode-style attention
    without a tuned split count (rule v3 with ``HELIOS_ATTN_FUSED=1``)."""
    return ATTN_RULE == "v3" and ATTN_FUSED


def fuse_rope_kv_write() -> bool:
    """Whether capture records ``rope_kv_write`` instead of ``rope`` + ``kv_write``."""
    return FUSE


def gemv_constants(N: int, K: int, spec: str = "") -> dict[str, int]:
    """Constants of the batch-1 GEMV (``BLOCK_T == 1``) for an `N` x `K` weight under
    `spec` (default ``LINEAR_GEMV``), with ``WARPS`` and ``PROGRAMS`` (the grid's x):
    one program per ``BLOCK_N`` rows, or at most ``PERSIST x SMS`` programs that loop
    over the row tiles. PERSIST / PRE / EVICT appear only when nonzero, so the v1
    variants keep the constants (and kernel ids) of cores exported before them.

    Raises:
        ValueError: a spec that is neither "v1", "v2" nor six integers.
    """
    spec = spec or LINEAR_GEMV
    if spec == "v2":
        spec = GEMV_V2_LONG if K >= GEMV_LONG_K else "v1"
    if spec == "v1":
        spec = GEMV_V1
    try:
        bn, bk, warps, persist, pre, evict = (int(v) for v in spec.split(","))
    except ValueError:
        raise ValueError(f"HELIOS_LINEAR_GEMV must be 'v1', 'v2' or 'BLOCK_N,BLOCK_K,WARPS,PERSIST,"
                         f"PRE,EVICT', got {spec!r}") from None
    tiles = _cdiv(N, bn)
    c = dict(BLOCK_N=bn, BLOCK_K=min(_np2(K, 16), bk), WARPS=warps,
             PROGRAMS=min(tiles, persist * SMS) if persist else tiles)
    for name, value in (("PERSIST", persist), ("PRE", pre), ("EVICT", evict)):
        if value:
            c[name] = value
    return c


# The row-invariant products of drafter cores at capture (HELIOS_LINEAR_INVARIANT):
# "rows" (default: linear_rows, the GEMV's tiles on the FMA units for every matrix) or
# "packed" (bf16 matrices of at least MMA_MIN_WEIGHTS weights take the packed tensor-core
# path with one tile and K split per matrix at every row count: invariant_splits; an
# experiment for issue 32's batch-8 verification cost, not yet run on a GPU).
INVARIANT_LINEAR = os.environ.get("HELIOS_LINEAR_INVARIANT", "rows")
# The row cell whose packed tile and K split every row count uses under "packed": 32
# rows, the H200 sweep's winners at 32 rows (_MMA_TILES), so a batch-8 W = 4
# verification and every smaller step is one token tile that reads each weight once;
# more rows take more token tiles, adjacent in launch order (ROWS_FIRST).
INVARIANT_PACKED_ROWS = 32


def invariant_splits(N: int, K: int, rule: str = "") -> int | None:
    """K slices S of a row-invariant bf16 product of `N` x `K` weights on the packed path
    (``linear_packed_rows``: the INVARIANT_PACKED_ROWS cell's tile at every row count,
    S slices so that one token tile gives every SM a program), or None where it runs ``linear_invariant`` (rule `rule`, default
    INVARIANT_LINEAR: "rows", or a matrix below MMA_MIN_WEIGHTS).

    Raises:
        ValueError: a rule other than "rows" / "packed".
    """
    rule = rule or INVARIANT_LINEAR
    if rule not in ("rows", "packed"):
        raise ValueError(f"HELIOS_LINEAR_INVARIANT must be 'rows' or 'packed', got {rule!r}")
    if rule == "rows" or N * K < MMA_MIN_WEIGHTS:
        return None
    # the fewest slices giving every SM a program at one token tile (a batch-1 decode
    # step), not the 32-row cell's measured S, which counted on more rows
    return mma_splits(INVARIANT_PACKED_ROWS, N, K,
                      mma_constants(INVARIANT_PACKED_ROWS, N, K))


# Rows per program of the row-invariant linear (``linear_invariant``: drafter cores'
# decode and verification rows): one weight tile serves up to this many rows, so a
# verification of up to 8 positions (a batch-1 lane of W <= 8, two lanes of W = 4) or
# a batch-8 decode step reads each weight once.
INVARIANT_ROWS = 8


def invariant_constants(N: int, K: int) -> dict[str, int]:
    """Variant constants (with ``WARPS``) of ``linear_invariant`` for an `N` x `K`
    matrix: the batch-1 GEMV's BLOCK_N / BLOCK_K / warps (``gemv_constants``, EVICT where
    its spec sets it; a persistent or prefetching GEMV spec keeps only its tile) and
    ``ROWS = INVARIANT_ROWS``. Nothing depends on the row count, so decode rows and
    verification rows of one matrix run one binary and reduce every row in one order
    (kernels_triton/invariant.py)."""
    g = gemv_constants(N, K)
    c = dict(BLOCK_N=g["BLOCK_N"], BLOCK_K=g["BLOCK_K"], ROWS=INVARIANT_ROWS,
             WARPS=g["WARPS"])
    if g.get("EVICT"):
        c["EVICT"] = 1
    return c


def fuse_swiglu_linear(T: int, N: int, K: int = 0) -> bool:
    """Whether capture records ``swiglu_linear`` instead of ``silu_mul`` + ``linear`` for
    a `T`-row product with `N` outputs over `K` (the FFN width): where the linear runs on
    the FMA path, and as GEMV (1 row) up to ``FUSE_GEMV_MAX_K``."""
    return FUSE and (K <= FUSE_GEMV_MAX_K if T == 1 else linear_fma(T, N) is not None)


def linear_fma(T: int, N: int, spec: str = "") -> dict[str, int] | None:
    """Constants (with ``WARPS``) of the few-row FMA linear for `T` rows and `N` outputs,
    or None when `T` is outside ``2..MAX_ROWS``, `N` exceeds ``MAX_N`` or the spec
    (default ``LINEAR_FMA``) is "off".

    Raises:
        ValueError: a spec that is not five integers.
    """
    spec = spec or LINEAR_FMA
    if spec == "off":
        return None
    try:
        bn, bk, warps, max_rows, max_n = (int(v) for v in spec.split(","))
    except ValueError:
        raise ValueError(f"HELIOS_LINEAR_FMA must be 'BLOCK_N,BLOCK_K,WARPS,MAX_ROWS,MAX_N' "
                         f"or 'off', got {spec!r}") from None
    if not 2 <= T <= max_rows or N > max_n:
        return None
    return dict(BLOCK_T=_np2(T), BLOCK_N=bn, BLOCK_K=bk, WARPS=warps, FMA=1)


# v3 tiles at 17-32 and 33-64 rows: (BLOCK_N, BLOCK_K, WARPS, STAGES, PREFETCH, STACK).
_WIDE_N = 16896  # N with at least 264 programs of 64 columns (two per SM)


def _linear_v3(T: int, N: int, K: int) -> dict[str, int]:
    """v3: the fastest measured variant per shape class on the H200 (3,832 timed variants,
    bench/results/gpu_linear_sweep_v2.json); v1 where nothing measured beat it (up to 16
    rows, prefill tiles beyond 64 rows). Speed-ups over v1 at 8B shapes: 32 rows 1.4-3.7x,
    64 rows 1.4-1.8x."""
    if T > 64:
        return _linear_prefill(T, N, K)
    if T <= 16:
        return _linear_v1(T, N, K)
    if T <= 32:
        if N >= _WIDE_N:  # gate_up, lm_head: 64-wide N tiles, short K steps
            tile = (64, 64, 4, 3, 1, 1)
        elif K < 8192 and N >= 4096:  # qkv / o_proj of 8B
            tile = (64, 128, 8, 3, 1, 1)
        else:  # long K (down_proj) and small models
            tile = (32, 128, 8, 3, 1, 1)
        bt = 32
    else:
        if N >= _WIDE_N:  # wide N: 128-column tiles, loads pipelined by Triton
            tile = (128, 32, 4, 3, 0, 0)
        elif K >= 8192 or (N < 4096 and K >= 1024):
            tile = (32, 128, 8, 3, 1, 1)
        elif N >= 4096:
            tile = (32, 64, 4, 3, 1, 1)
        else:
            return _linear_v1(T, N, K)
        bt = 64
    bn, bk, warps, stages, prefetch, stack = tile
    return dict(BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk, WARPS=warps, STAGES=stages,
                PREFETCH=prefetch, STACK=stack)


# Batched-decode GEMM path (ops split_bf16 + linear_packed + splitk_reduce,
# kernels_triton/mma.py), chosen at capture with HELIOS_LINEAR_MMA: "on" (default since
# the H200 sweep: 2.5-6.3x today's linear per 8B layer at 8-256 rows) records it for bf16
# matrices of at least MMA_MIN_WEIGHTS weights (the 8B geometry; small models are
# launch-bound and keep the linear kernel) at MMA_ROWS token rows, "off" keeps linear.
LINEAR_MMA = os.environ.get("HELIOS_LINEAR_MMA", "on")
MMA_MIN_WEIGHTS = 1 << 24
MMA_ROWS = (8, 256)
MMA_SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)


# Measured choices per (N, K, rows up to): (BLOCK_T, BLOCK_N, BLOCK_K, WARPS, STAGES, S K
# slices), or None where today's linear was faster: the fastest verified packed sequence
# of each Llama-3.1-8B matrix and row count in the H200 sweep
# (bench/results/h200_2026-12-02/mma_sweep_bf8287c.json, printed by
# bench/gpu_mma_pick.py; "xN" = today's linear time / this). Shapes not measured take
# _MMA_DEFAULT with the fewest slices that give every SM a program.
_MMA_TILES: dict[tuple[int, int, int], tuple[int, int, int, int, int, int] | None] = {
    (4096, 14336, 8): (16, 64, 128, 4, 4, 4),  # down x3.21
    (28672, 4096, 8): (16, 128, 128, 4, 3, 1),  # gate_up x2.11
    (4096, 4096, 8): (16, 64, 128, 4, 4, 4),  # o x2.65
    (6144, 4096, 8): (16, 64, 128, 4, 4, 2),  # qkv x2.44
    (4096, 14336, 16): (16, 64, 128, 4, 4, 4),  # down x3.19
    (28672, 4096, 16): (16, 128, 128, 4, 3, 1),  # gate_up x2.16
    (4096, 4096, 16): (16, 64, 128, 4, 4, 4),  # o x2.66
    (6144, 4096, 16): (16, 64, 128, 4, 4, 2),  # qkv x2.42
    (4096, 14336, 32): (32, 64, 128, 4, 3, 4),  # down x3.70
    (28672, 4096, 32): (32, 128, 64, 8, 3, 1),  # gate_up x2.48
    (4096, 4096, 32): (32, 64, 64, 4, 4, 4),  # o x3.06
    (6144, 4096, 32): (32, 64, 128, 4, 4, 1),  # qkv x2.76
    (4096, 14336, 64): (64, 64, 64, 4, 4, 4),  # down x4.62
    (28672, 4096, 64): (64, 128, 64, 4, 3, 1),  # gate_up x3.65
    (4096, 4096, 64): (64, 64, 64, 4, 4, 4),  # o x4.93
    (6144, 4096, 64): (64, 64, 128, 4, 4, 1),  # qkv x3.89
    (4096, 14336, 128): (64, 128, 64, 4, 3, 4),  # down x10.67
    (28672, 4096, 128): (128, 128, 64, 8, 4, 1),  # gate_up x3.51
    (4096, 4096, 128): (64, 64, 128, 4, 4, 1),  # o x8.34
    (6144, 4096, 128): (64, 64, 64, 4, 3, 2),  # qkv x5.84
    (4096, 14336, 256): (64, 128, 64, 4, 3, 2),  # down x6.11
    (28672, 4096, 256): (128, 128, 64, 8, 3, 1),  # gate_up x3.50
    (4096, 4096, 256): (64, 128, 64, 4, 3, 2),  # o x5.38
    (6144, 4096, 256): (64, 128, 64, 4, 3, 1),  # qkv x3.85
}
_MMA_DEFAULT = (32, 128, 64, 4, 4)


def prefill_tc(T: int, N: int, K: int) -> bool:
    """Whether a `T`-row product of a bf16 `N` x `K` matrix takes a TC=1 prefill tile
    (beyond the batched-decode rows, N >= PREFILL_TC_MIN_N, K a multiple of 64: whole K
    steps and 16-byte tensor-memory strides)."""
    return T > MMA_ROWS[1] and N >= PREFILL_TC_MIN_N and K % 64 == 0


# linear_packed TC=1 tiles: (BLOCK_T, BLOCK_N, BLOCK_K, WARPS, STAGES) per (N, K, rows up
# to): filled from the H200 run of bench/gpu_prefill_gemm.py; other shapes and row counts
# take the PREFILL_TILES candidate with the fewest tile-waves weighted by its measured
# rate (_prefill_tile).
_PREFILL_TC_TILES: dict[tuple[int, int, int], tuple[int, int, int, int, int]] = {}
PREFILL_TILES = ((128, 256, 64, 8, 3), (128, 128, 64, 8, 4))


def _prefill_tile(T: int, N: int) -> tuple[int, int, int, int, int]:
    """Fewest waves of SMS programs, each wave costing its tile's area (128 x 128 tiles
    counted at 1.2x their area per output: shorter MMAs, more operand traffic)."""
    def cost(tile):
        bt, bn = tile[0], tile[1]
        waves = _cdiv(_cdiv(T, bt) * _cdiv(N, bn), SMS)
        return waves * bt * bn * (1.2 if bn < 256 else 1.0)
    return min(PREFILL_TILES, key=cost)


def prefill_tc_constants(T: int, N: int, K: int, rounded: bool = False) -> dict[str, int]:
    """Variant constants (with ``WARPS``/``STAGES``, without ``WBF16``/``K16``/``PACKED``)
    of ``linear_packed``'s TC=1 tile for a `T`-row product (``prefill_tc`` holds): the
    measured cell's tile, else ``_prefill_tile``; ``XSPLIT=0`` over a `rounded` input
    (``round_bf16``'s ``hi | 0``), else 1."""
    tile = _PREFILL_TC_TILES.get((N, K, _np2(T))) or _prefill_tile(T, N)
    bt, bn, bk, warps, stages = tile
    return dict(TC=1, BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk, WARPS=warps, STAGES=stages,
                GROUP_T=8, XSPLIT=int(not rounded), EVEN_K=1)


# Batched decode on the tensor-core tile (issue 27): decode buckets of many rows take
# linear_packed's TC=1 tile with one slice (prefill's packed path and numerics: hi then lo
# terms into one f32 accumulator) instead of the K-split path with its reduction.
# HELIOS_LINEAR_DECODE_TC at capture: "table" (default: the (N, K, rows) cells of
# _DECODE_TC_TILES, where a device sweep measured the TC tile faster than the K-split
# sequence; bench/gpu_decode_gemm.py prints them), "off", or ROWS (an integer: every
# bucket of ROWS..MMA_ROWS[1] rows, the table's tile else _decode_tile; for timing
# thresholds 96..256). In a bf16-activation core these tiles run XSPLIT=0 over
# round_bf16's hi | 0 (tc_constants' `rounded`).
DECODE_TC = os.environ.get("HELIOS_LINEAR_DECODE_TC", "table")
# TC=1 tiles at decode rows: (BLOCK_T, BLOCK_N, BLOCK_K, WARPS, STAGES) per (N, K, bucket
# rows), the fastest verified hi/lo tile of bench/gpu_decode_gemm.py where it beat the
# K-split sequence (split_bf16 counted on both sides). From the sweep on an H100 at main
# dc8d9d8 (bench/results/h100_2026-12-06h/decode_gemm_dc8d9d8.json; per-cell ratio over the
# K split): the 8B's LM head at every bucket of 64+ rows, gate_up at 160 and 192. Elsewhere
# the K split stays (hi/lo doubles the tensor work: docs/gpu.md).
_DECODE_TC_TILES: dict[tuple[int, int, int], tuple[int, int, int, int, int]] = {
    (28672, 4096, 160): (64, 256, 64, 4, 4),  # gate_up x1.03
    (28672, 4096, 192): (64, 256, 64, 4, 4),  # gate_up x1.07
    (128256, 4096, 64): (64, 128, 64, 4, 3),  # lm_head x1.39
    (128256, 4096, 96): (128, 128, 64, 8, 4),  # lm_head x1.97
    (128256, 4096, 128): (128, 128, 64, 8, 4),  # lm_head x2.02
    (128256, 4096, 160): (64, 256, 64, 4, 4),  # lm_head x2.90
    (128256, 4096, 192): (64, 256, 64, 4, 4),  # lm_head x3.05
    (128256, 4096, 224): (128, 256, 64, 8, 3),  # lm_head x2.91
    (128256, 4096, 256): (128, 256, 64, 8, 3),  # lm_head x2.88
}
# Candidates of _decode_tile (and the sweep's grid): 64-row tiles give a 128-row bucket
# two token tiles, so narrow matrices still fill the SMs without a K split.
DECODE_TILES = ((64, 128, 64, 4, 4), (64, 256, 64, 8, 3), (128, 128, 64, 8, 4),
                (128, 256, 64, 8, 3))


def decode_tc(T: int, N: int, K: int, rule: str = "") -> bool:
    """Whether a `T`-row product (a decode bucket, ``MMA_ROWS``) of a bf16 `N` x `K`
    matrix takes the TC=1 tile with one slice under `rule` (default DECODE_TC: "table",
    "off" or a row threshold; N >= PREFILL_TC_MIN_N and K a multiple of 64 as for prefill).

    Raises:
        ValueError: a rule that is neither "table", "off" nor an integer.
    """
    rule = rule or DECODE_TC
    if rule == "off":
        return False
    if not (MMA_ROWS[0] <= T <= MMA_ROWS[1] and N >= PREFILL_TC_MIN_N and K % 64 == 0):
        return False
    if rule == "table":
        return (N, K, T) in _DECODE_TC_TILES
    try:
        return T >= int(rule)
    except ValueError:
        raise ValueError("HELIOS_LINEAR_DECODE_TC must be 'table', 'off' or a row count, "
                         f"got {rule!r}") from None


def _decode_tile(T: int, N: int) -> tuple[int, int, int, int, int]:
    """The DECODE_TILES candidate with the fewest waves of SMS programs, each wave costing
    its tile's area (tiles narrower than 128 x 256 counted at 1.2x their area per side
    below it: shorter MMAs, more operand traffic per output)."""
    def cost(tile):
        bt, bn = tile[0], tile[1]
        waves = _cdiv(_cdiv(T, bt) * _cdiv(N, bn), SMS)
        return waves * bt * bn * (1.2 if bn < 256 else 1.0) * (1.2 if bt < 128 else 1.0)
    return min(DECODE_TILES, key=cost)


def tc_constants(T: int, N: int, K: int, rounded: bool = False) -> dict[str, int]:
    """``linear_packed``'s TC=1 constants for a `T`-row product: decode buckets
    (``decode_tc``) from _DECODE_TC_TILES / _decode_tile, prefill rows from
    ``prefill_tc_constants``; ``XSPLIT=0`` over a `rounded` input (``hi | 0``)."""
    if T > MMA_ROWS[1]:
        return prefill_tc_constants(T, N, K, rounded)
    bt, bn, bk, warps, stages = _DECODE_TC_TILES.get((N, K, T)) or _decode_tile(T, N)
    return dict(TC=1, BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk, WARPS=warps, STAGES=stages,
                GROUP_T=8, XSPLIT=int(not rounded), EVEN_K=1)


def _mma_cell(T: int, N: int, K: int) -> tuple[int, int, int]:
    """The table key of a product: (N, K, rows rounded up to 8, 16, 32, ..., 256)."""
    return N, K, max(8, _np2(T))


def mma_constants(T: int, N: int, K: int) -> dict[str, int]:
    """Variant constants (with ``WARPS``/``STAGES``, without ``WBF16``/``K16``/``PACKED``)
    of ``linear_packed`` for a `T`-row product with `N` outputs over `K` inputs."""
    tile = _MMA_TILES.get(_mma_cell(T, N, K))
    bt, bn, bk, warps, stages = tile[:5] if tile else _MMA_DEFAULT
    if not tile and T > 32:
        bt = 64
    return dict(BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk, WARPS=warps, STAGES=stages,
                EVEN_K=int(K % bk == 0))


def mma_splits(T: int, N: int, K: int, c: dict[str, int] | None = None) -> int:
    """K slices S of the `T`-row product: the measured cell's, else (and under tiles `c`,
    default ``mma_constants``) the fewest giving every SM a program, with slices of at
    least 512 inputs."""
    tile = _MMA_TILES.get(_mma_cell(T, N, K))
    if tile and c is None:
        return tile[5]
    c = c or mma_constants(T, N, K)
    tiles = _cdiv(N, c["BLOCK_N"]) * _cdiv(T, c["BLOCK_T"])
    return next((s for s in MMA_SPLITS if tiles * s >= SMS and K // s >= 512),
                max((s for s in MMA_SPLITS if K // s >= 512), default=1))


def mma_plan(T: int, N: int, K: int, rule: str = "") -> int | None:
    """K slices S of the packed path for a `T`-row bf16 product of `N` x `K` weights, or
    None where capture keeps the ``linear`` kernel (rule `rule`, default LINEAR_MMA).

    Raises:
        ValueError: a rule other than "on" / "off".
    """
    rule = rule or LINEAR_MMA
    if rule not in ("on", "off"):
        raise ValueError(f"HELIOS_LINEAR_MMA must be 'on' or 'off', got {rule!r}")
    if rule == "off" or N * K < MMA_MIN_WEIGHTS or T < MMA_ROWS[0]:
        return None
    if T > MMA_ROWS[1]:  # prefill rows: one slice, linear_packed's TC=1 tiles (opt-in)
        return 1 if PREFILL_PACKED and prefill_tc(T, N, K) else None
    if decode_tc(T, N, K):  # a decode bucket on the TC=1 tile: one slice, no reduction
        return 1
    if _MMA_TILES.get(_mma_cell(T, N, K), ()) is None:  # measured: linear was faster
        return None
    return mma_splits(T, N, K)


def attention_split_constants(B: int, H: int, KVH: int, HD: int, NS: int, SPLIT: int,
                              rule: str = "", tuned: bool = False, plane: str = "f32",
                              mma: str = "") -> dict[str, int]:
    """Variant constants (with ``WARPS``) of ``attention_decode_split`` under `rule`; the
    grid is ``(B, KVH if GROUPED else H, NS)``.

    v2 (``GROUPED=2``): a program per (row, kv head, split) loads the split's keys and
    values once as one BLOCK_N x HD tile (BLOCK_N >= SPLIT for contexts up to 4096) and
    every query head of the kv head reuses it with f32 FMA dots; ``EVEN_HD`` gives 128-bit
    loads when HD is a power of two. 4 warps: the fastest measured on the H200 for both
    geometries at every batch (bench/results/gpu_attn_sweep.json: 2-10x faster than v1;
    8 warps cost 20-45 % at HD=128, 2 warps win at most 5 % at HD=64). Its BLOCK_N of 64
    is shorter than the 128-position splits of an 8,192-position capacity, where each
    split walks its tiles once per query head.

    v3 (the default): with ``decode_splits``' 64-position splits, one BLOCK_N = 64 tile
    per split (GROUPED=2; several splits per program at 64+ rows and 128 splits,
    ``_attention_spp``);
    splits longer than 64 positions (capacities over 8,192) ``GROUPED=3``. H200, 8,192
    positions, split + merge per layer against v2 (bench/results/h200_2026-12-02/
    attn_long_0d737c5.json): SmolLM2 b1 6.1-8.7 us (v2 18.4-24.1) at 130-4096
    positions, b8 7.6-24.9 (20.9-57.1); Llama-3.1-8B b1 11.2-26.4 (37.2-62.6), b8
    23.6-128.0 (49.2-418.1). ``HELIOS_ATTN_FUSED=1`` records ``attention_decode_fused``
    instead (``fuse_decode_attention``): measured slower (SmolLM2 b1 8.3-11.2 us).
    Both run over each row's live splits only (``LIVE``: about ``HELIOS_ATTN_LIVE``
    programs in all, ``_attention_live``) unless that knob is 0, where they keep a
    program per split (several a program for one-tile splits: ``_attention_spp``).

    `mma` (default ``ATTN_MMA``, ``HELIOS_ATTN_MMA``) other than "off", rule v3, not
    `tuned` and `plane` (the cache planes' dtype: "f32", "bf16" or "e4m3") "bf16":
    ``GROUPED=4``, the tensor-core body with ``TERMS`` = `mma`, on the same grids
    (``_attention_mma``: f32 planes keep the FMA bodies, e4m3 planes are refused). The
    tuned kernel and rules v1 / v2 keep their FMA bodies whatever `mma` says.

    Raises:
        ValueError: an unknown rule or `mma` value; `mma` on over e4m3 planes.
    """
    rule = rule or ATTN_RULE
    bhd = _np2(HD, 16)
    mma = _attention_mma(mma, plane)
    if rule == "v1":
        grouped = int(B <= 8 and HD <= 64)  # measured on the H200, see the kernel
        return dict(BLOCK_N=64, BLOCK_HD=bhd, BLOCK_G=_np2(H // KVH, 16), GROUPED=grouped,
                    WARPS=4)
    if rule == "v3":
        # One tile per split (decode_splits: 64 positions up to 8,192-position
        # capacities); longer splits (larger capacities) walk their tiles with every
        # query head's online state at once (GROUPED=3: 1.3-1.5x GROUPED=2's walk per
        # query head). The tuned kernel (`tuned`: no SPP) keeps GROUPED=2: one tile at
        # the tuner's largest count, the others are timed against it at startup.
        bn = min(_np2(SPLIT, 16), 64)
        live = {} if tuned else _attention_live(B, KVH, NS)
        if mma and not tuned:  # any SPLIT: one tile, or the online walk over BLOCK_N tiles
            return dict(BLOCK_N=bn, BLOCK_HD=bhd, BLOCK_G=_np2(H // KVH, 16), GROUPED=4,
                        TERMS=mma, EVEN_HD=int(HD == bhd), WARPS=4, **live)
        if bn < SPLIT and not tuned:
            return dict(BLOCK_N=bn, BLOCK_HD=bhd, BLOCK_G=_np2(H // KVH), GROUPED=3,
                        EVEN_HD=int(HD == bhd), WARPS=4, **live)
        if live:
            return dict(BLOCK_N=bn, BLOCK_HD=bhd, BLOCK_G=_np2(H // KVH), GROUPED=2,
                        EVEN_HD=int(HD == bhd), WARPS=4, **live)
        spp = {} if tuned else _attention_spp(B, HD, NS)
        return dict(BLOCK_N=bn, BLOCK_HD=bhd, BLOCK_G=_np2(H // KVH), GROUPED=2,
                    EVEN_HD=int(HD == bhd), WARPS=4, **spp)
    if rule != "v2":
        raise ValueError(f"unknown attention rule {rule!r}; known: v1, v2, v3")
    return dict(BLOCK_N=64, BLOCK_HD=bhd, BLOCK_G=_np2(H // KVH), GROUPED=2,
                EVEN_HD=int(HD == bhd), WARPS=4)


def prefill_lane_constants(H: int, KVH: int, HD: int, plane: str = "f32",
                           mma: str = "") -> dict[str, int]:
    """The lane programs' constants of ``attention_prefill`` / ``attention_prefill_window``
    (a MIXED step's decode lanes, kernels_triton/attention.py ``_prefill_lane``) over
    planes of dtype `plane` ("f32", "bf16" or "e4m3").

    `mma` ("" reads ``ATTN_MMA``, HELIOS_ATTN_MMA) "off", or f32 planes: ``BLOCK_G =
    next_pow2(H / KVH)``, the f32 FMA lanes (the constants of every core before the
    knob). On over bf16 planes: the decode programs' tensor-core body (GROUPED=4's
    ``_group_mma_online``) with ``LANE_TERMS`` = `mma`, the query heads padded to
    ``BLOCK_G >= 16`` MMA rows, and ``EVEN_HD`` (HD a power of two >= 16: no head-dim
    masks); windowed launches take the same body (a window is the range the lane walks).
    The lanes walk the launch's BLOCK_N (32) positions a tile: with 64, as the decode
    programs, the 8B geometry's kernel spills 560 bytes on sm_90 against 60 (the block
    programs share the kernel's registers).

    Raises:
        ValueError: `mma` unknown, or on over e4m3 planes (``_attention_mma``).
    """
    terms = _attention_mma(mma, plane)
    if not terms:
        return dict(BLOCK_G=_np2(H // KVH))
    bhd = _np2(HD, 16)
    return dict(BLOCK_G=_np2(H // KVH, 16), LANE_TERMS=terms, EVEN_HD=int(HD == bhd))


def _attention_mma(mma: str, plane: str) -> int:
    """TERMS of the tensor-core decode body asked for by `mma` ("" reads ``ATTN_MMA``),
    0 for "off", over planes of dtype `plane`: 0 for f32 planes too, because capture
    records every launch over f32 planes first and ``kv_cache.apply_kv_bf16`` then
    rewrites those over bf16 planes into bf16 forms, whose constants carry the body; a
    cache that stays f32 is refused before capture (``check_attention_mma``).

    Raises:
        ValueError: `mma` not "off", "1" or "2"; or on over e4m3 planes (their codes
            need scales: the body feeds keys and values to the MMA as stored).
    """
    mma = mma or ATTN_MMA
    if mma not in ATTN_MMA_TERMS:
        raise ValueError(f"HELIOS_ATTN_MMA must be 'off', '1' or '2', got {mma!r}")
    terms = ATTN_MMA_TERMS[mma]
    if terms and plane == "e4m3":
        raise ValueError(_mma_refusal(mma, "e4m3 planes"))
    return terms if plane == "bf16" else 0


def _mma_refusal(mma: str, what: str) -> str:
    return (f"HELIOS_ATTN_MMA={mma} (tensor-core decode attention, GROUPED=4) reads bf16 KV "
            f"planes only, not {what}: export with --kv-cache-dtype bf16 or with "
            "HELIOS_ATTN_MMA=off")


def check_attention_mma(kv_cache_dtype: str | None) -> None:
    """Refuse ``ATTN_MMA`` (HELIOS_ATTN_MMA) before an export whose cache is not bf16
    (`kv_cache_dtype`: the export's ``--kv-cache-dtype``, None for the recipe's f32):
    the tensor-core body reads bf16 planes only, and the launches over f32 planes would
    silently keep the FMA bodies (``_attention_mma``).

    Raises:
        ValueError: an unknown HELIOS_ATTN_MMA value, or the knob on with another cache.
    """
    if _attention_mma("", "bf16") and kv_cache_dtype != "bf16":
        raise ValueError(_mma_refusal(ATTN_MMA, f"--kv-cache-dtype {kv_cache_dtype}"
                                      if kv_cache_dtype not in (None, "auto") else
                                      "the recipe's f32 cache (--kv-cache-dtype auto)"))


# Rule v3 runs several splits per program only from this many splits (8,192-position
# capacities: decode_splits' 128 x 64); `_attention_spp` says why.
SPP_MIN_SPLITS = 128


def _attention_spp(B: int, HD: int, NS: int) -> dict[str, int]:
    """Splits per program of rule v3's one-tile layout at `B` rows of `NS` splits: one
    below 64 rows (the splits of a row run side by side) or below SPP_MIN_SPLITS splits;
    else 4 (HD <= 64) or 2, where the programs of a short context's empty splits cost
    more than the loop (H200, 128 x 64 splits, bench/results/h200_2026-12-02/
    attn_long_0d737c5.json: SmolLM2 b64 29.2 / 41.4 / 92.1 us per layer at 130 / 512 /
    2048 positions with 4, 35.7 / 50.5 / 99.9 with 1; Llama-3.1-8B b64 164.6 / 250.4 /
    652.4 with 2, 182.3 / 265.9 / 654.1 with 1). With few splits a program walks a short
    context's live splits one after another: at 32 splits (2,048 positions) SmolLM2 b64
    spent 0.693 ms a step in attention_decode_split with 4 against 0.561 with 1
    (smollm2_9f51a62.json against smollm2_5a06ade.json, bench/gpu_models.py)."""
    if B < 64 or NS < SPP_MIN_SPLITS:
        return {}
    return {"SPP": 4 if HD <= 64 else 2}


def _attention_live(B: int, KVH: int, NS: int) -> dict[str, int]:
    """Programs per (row, kv head) of rule v3's live-split layout (``{"LIVE": n}``; empty:
    not used): about ``ATTN_LIVE`` programs in all, at most NS, for one-tile splits
    (GROUPED=2) and longer ones (GROUPED=3) alike. The NS-programs-a-row grid
    costs a program per split whatever the context: at 256 rows of 32 splits the 8B
    geometry's 65,536 programs took ~400 us a layer on the H100 for ~3 live splits a row
    (bench/results/h100_2026-12-06h/decode_breakdown_dc8d9d8.json), where the live
    layout runs 256 x 8 x 2 programs over the live splits only. Bitwise the same results
    for any LIVE (the partition is ``decode_splits``', by capacity), so a row's attention
    does not depend on the bucket it sits in."""
    if ATTN_LIVE <= 0 or B < ATTN_LIVE_MIN_ROWS:
        return {}
    return {"LIVE": max(1, min(NS, _cdiv(ATTN_LIVE, B * KVH)))}


def attention_merge_constants(HD: int, NS: int, rule: str = "") -> dict[str, int]:
    """Variant constants (with ``WARPS``) of ``attention_decode_merge`` under `rule`: v2
    skips the outputs of empty splits and uses 128-bit accesses when HD is a power of two.

    Raises:
        ValueError: an unknown rule.
    """
    rule = rule or ATTN_RULE
    bhd = _np2(HD, 16)
    if rule == "v1":
        return dict(BLOCK_S=_np2(NS, 2), BLOCK_HD=bhd, WARPS=4)
    if rule not in ("v2", "v3"):
        raise ValueError(f"unknown attention rule {rule!r}; known: v1, v2, v3")
    return dict(BLOCK_S=_np2(NS, 2), BLOCK_HD=bhd, SKIP_EMPTY=1, EVEN_HD=int(HD == bhd),
                WARPS=4)


def attention_fused_constants(H: int, KVH: int, HD: int, NS: int, SPLIT: int
                              ) -> dict[str, int]:
    """Variant constants (with ``WARPS``) of ``attention_decode_fused``; the grid is
    ``(B, KVH, NS)``: a split's keys/values in tiles of BLOCK_N = min(SPLIT, 128) positions
    at HD <= 64 (one tile per split at 8,192-position capacities), 64 at wider heads
    (a 128 x 128 f32 K+V tile would spill), and the merge over BLOCK_S >= NS splits."""
    bhd = _np2(HD, 16)
    bn = min(_np2(SPLIT, 16), 128 if HD <= 64 else 64)
    return dict(BLOCK_N=bn, BLOCK_HD=bhd, BLOCK_G=_np2(H // KVH), BLOCK_S=_np2(NS, 2),
                EVEN_HD=int(HD == bhd), WARPS=4)


def _linear_prefill(T: int, N: int, K: int, spec: str = "") -> dict[str, int]:
    """Tiles of a prefill-sized (> 64 rows) product under `spec` (default LINEAR_PREFILL).

    Raises:
        ValueError: a spec that is neither "auto", "v1" nor seven integers.
    """
    spec = spec or LINEAR_PREFILL
    if spec == "auto":
        spec = PREFILL_WIDE if N >= 4096 else "v1"
    if spec == "v1":
        return _linear_v1(T, N, K)
    try:
        bt, bn, bk, warps, stages, prefetch, stack = (int(v) for v in spec.split(","))
    except ValueError:
        raise ValueError("HELIOS_LINEAR_PREFILL must be 'auto', 'v1' or 'BLOCK_T,BLOCK_N,BLOCK_K,"
                         f"WARPS,STAGES,PREFETCH,STACK', got {spec!r}") from None
    return dict(BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk, WARPS=warps, STAGES=stages,
                PREFETCH=prefetch, STACK=stack)


def _linear_config(s: list, views: Sequence, tc: bool) -> LaunchConfig:
    """Launch of the linear kernel for scalars ``[T, N, K]`` (GEMV, FMA, SWAP, the TC=1
    prefill tile where `tc` and ``prefill_tc`` allow, else ``linear_constants``); the
    folded ops pass ``tc=False`` (their TC=1 forms have not run on a GPU)."""
    T, N, K = s
    wbf16 = _is_bf16(views[1]) if len(views) > 1 else 0
    if T == 1:  # GEMV (one token row): see gemv_constants
        c = gemv_constants(N, K)
        return _cfg((c.pop("PROGRAMS"), 1), c.pop("WARPS"), BLOCK_T=1, **c, WBF16=wbf16,
                    K16=int(K % 16 == 0))
    fma = linear_fma(T, N)
    if fma is not None:
        return _cfg((_cdiv(N, fma["BLOCK_N"]), _cdiv(T, fma["BLOCK_T"])), fma.pop("WARPS"),
                    **fma, WBF16=wbf16, K16=int(K % 16 == 0))
    if LINEAR_SWAP:  # out^T = W x^T: 64 weight rows per program, tokens as MMA N
        bt = min(max(_np2(T), 16), 64)
        return _cfg((_cdiv(N, 64), _cdiv(T, bt)), 4, BLOCK_T=bt, BLOCK_N=64, BLOCK_K=128,
                    WBF16=wbf16, K16=int(K % 16 == 0), SWAP=1, STAGES=4)
    if wbf16 and tc and prefill_tc(T, N, K):
        bt, bn, bk, warps, stages = LINEAR_TC
        return _cfg((_cdiv(T, bt) * _cdiv(N, bn),), warps, TC=1, BLOCK_T=bt, BLOCK_N=bn,
                    BLOCK_K=bk, STAGES=stages, GROUP_T=8, TMA=1, EVEN_K=1,
                    XSPLIT=1, WBF16=1, K16=1)
    c = linear_constants(T, N, K)
    return _cfg((_cdiv(N, c["BLOCK_N"]), _cdiv(T, c["BLOCK_T"])), c.pop("WARPS"), **c,
                WBF16=wbf16, K16=int(K % 16 == 0))


def moe_constants(N: int, K: int) -> dict[str, int]:
    """Tiles of the grouped expert products (``moe_gate_up``: N = F, K = D; ``moe_down``:
    N = D, K = F): one expert block of BT pair rows against a BLOCK_N x BLOCK_K weight
    tile per step (the MMA's M is the block). Not yet swept on a GPU: 64-wide N tiles
    give the 30B-A3B geometry's blocks (F 768, D 2048) 12 and 32 programs each.
    HELIOS_MOE_TILES="BLOCK_N,BLOCK_K,WARPS" at capture overrides them (for sweeps;
    each at least 16, powers of two, clipped to the matrix)."""
    if MOE_TILES:
        bn, bk, warps = (int(v) for v in MOE_TILES.split(","))
        return {"BLOCK_N": min(bn, _np2(N, 16)), "BLOCK_K": min(bk, _np2(K, 16)),
                "WARPS": warps}
    return {"BLOCK_N": 64 if N >= 64 else _np2(N, 16),
            "BLOCK_K": 64 if K >= 64 else _np2(K, 16), "WARPS": 4}


# The INT4 products' prologue constant PRO: 0 none, 2 SwiGLU (kernels_triton/int4.py; the
# RMS-norm form is its own kernel).
INT4_PROLOGUE = {"linear_int4": 0, "linear_add_int4": 0, "rmsnorm_linear_int4": 0,
                 "swiglu_linear_int4": 2, "swiglu_linear_add_int4": 2}
# The repacked GGUF products (kernels_triton/int4.py's INT4_MIN kernels and
# kernels_triton/int8.py) take the v1 constants of this rule (their kernels have the v1 row
# GEMV and the MMA=1 tile only).
INT4_PROLOGUE |= {f"{op}_min": pro for op, pro in INT4_PROLOGUE.items()}
INT8_PROLOGUE = {op.replace("_int4", "_int8"): pro for op, pro in INT4_PROLOGUE.items()
                 if not op.endswith("_min")}
# From this many token rows the INT4 products compute output tiles with tl.dot. Not yet
# swept on a GPU (bench/gpu_int4.py).
INT4_MMA_ROWS = 32
# Below INT4_MMA_ROWS, at capture (HELIOS_INT4_ROWS): "v2" (default: ``ROWS=1``, one
# program per BLOCK_T token rows x BLOCK_N output rows, the weight read once for all of
# its rows, whole groups a K step; one row takes the word form, WORDS=1), "v1"
# (``_w4a16_row``: one program per token row x 16 output rows, scales and zero points
# gathered per element; measured on an H100 at dc8d9d8: 8B decode 53.8 tok/s at batch 1,
# 61.7 at batch 8, bench/results/h100_2026-12-06h/), or
# "BLOCK_N,BLOCK_K,WARPS,WORDS,BLOCK_N_ROWS,BLOCK_K_ROWS,WARPS_ROWS" (the one-row tile
# and its form, then the several-row tile; BLOCK_K elements a K step, whole groups).
# v2's tiles compile for sm_90 without spills at the 8B shapes (72-96 registers at one
# row, 58-145 at 2-16 rows); not yet timed on a GPU.
INT4_ROWS = os.environ.get("HELIOS_INT4_ROWS", "v2")
INT4_ROWS_V2 = "8,2048,4,1,16,256,8"
# The most token rows one ``ROWS=1`` program serves (the weight is read once per such
# tile of rows; the products per weight element grow with it).
INT4_ROWS_TILE = 16


def int4_rows_constants(T: int, N: int, K: int, group: int, spec: str = "") -> dict[str, int]:
    """Constants (with ``WARPS``) of a `T`-row INT4 product below INT4_MMA_ROWS for `N`
    outputs over `K` in groups of `group`, under `spec` (default ``INT4_ROWS``): ``ROWS=1``
    with ``BLOCK_T`` (1, else the power of two >= T up to INT4_ROWS_TILE), ``BLOCK_N``,
    ``BLOCK_G`` (groups a K step) and ``WORDS`` (one row only), or the v1 row GEMV
    (``MMA=0``, one program row per token row; its ``BLOCK_T`` is the kernel's unused
    default, as cores before v2 record it).

    Raises:
        ValueError: a spec that is neither "v1", "v2" nor seven integers.
    """
    spec = spec or INT4_ROWS
    if spec == "v1":
        return dict(MMA=0, BLOCK_T=32, BLOCK_N=16, BLOCK_B=min(_np2(K // 2, 16), 256), WARPS=4)
    try:
        bn1, bk1, w1, words, bnr, bkr, wr = (
            int(p) for p in (INT4_ROWS_V2 if spec == "v2" else spec).split(","))
    except ValueError:
        raise ValueError("HELIOS_INT4_ROWS must be 'v1', 'v2' or 'BLOCK_N,BLOCK_K,WARPS,WORDS,"
                         f"BLOCK_N_ROWS,BLOCK_K_ROWS,WARPS_ROWS', got {spec!r}") from None
    bn, bk, warps = (bn1, bk1, w1) if T == 1 else (bnr, bkr, wr)
    c = dict(MMA=0, ROWS=1, BLOCK_T=min(_np2(T), INT4_ROWS_TILE), BLOCK_N=bn,
             BLOCK_G=min(_np2(max(bk // group, 1)), _np2(K // group)), WARPS=warps)
    if T == 1 and words:
        c["WORDS"] = 1
    return c


# INT4 output tiles from INT4_MMA_ROWS rows, at capture (HELIOS_INT4_TILE): "v2" (default:
# MMA=2, 64 x 64 tiles at 8 warps, one TF32 dot a group over vector-loaded bytes), "v1"
# (MMA=1: 64 x 64 tiles at 4 warps, bytes loaded one at a time, two half-group dots;
# compiled for sm_90 it spills 472-1176 stack bytes at the 8B shapes, and 8B decode at 64
# rows ran 738.9 tok/s on an H100 at dc8d9d8, 0.12x bf16: bench/results/h100_2026-12-06h/)
# or "BLOCK_T,BLOCK_N,WARPS" (MMA=2 with these tiles; BLOCK_T is capped at the power of
# two >= the rows, at least 16). v2 compiles without spills at the 8B shapes (128-254
# registers); at 4 warps the SwiGLU form spills (104-464 bytes). Not yet timed on a GPU.
INT4_TILE = os.environ.get("HELIOS_INT4_TILE", "v2")
INT4_TILE_V2 = "64,64,8"


def int4_tile_constants(T: int, spec: str = "") -> dict[str, int]:
    """Tile constants (with ``WARPS``) of a `T`-row INT4 product from INT4_MMA_ROWS rows
    under `spec` (default ``INT4_TILE``).

    Raises:
        ValueError: a spec that is neither "v1", "v2" nor three integers.
    """
    spec = spec or INT4_TILE
    if spec == "v1":
        return dict(MMA=1, BLOCK_T=32 if T <= 32 else 64, BLOCK_N=64, BLOCK_B=16, WARPS=4)
    try:
        bt, bn, warps = (int(v) for v in (INT4_TILE_V2 if spec == "v2" else spec).split(","))
    except ValueError:
        raise ValueError("HELIOS_INT4_TILE must be 'v1', 'v2' or 'BLOCK_T,BLOCK_N,WARPS', "
                         f"got {spec!r}") from None
    return dict(MMA=2, BLOCK_T=min(bt, _np2(T, 16)), BLOCK_N=bn, WARPS=warps)


# The FP8 products' prologue constant PRO: 0 none, 1 the RMS norm, 2 SwiGLU.
FP8_PROLOGUE = {"linear_fp8": 0, "linear_add_fp8": 0, "rmsnorm_linear_fp8": 1,
                "swiglu_linear_fp8": 2, "swiglu_linear_add_fp8": 2}


# FP8 product tiles per (N, K, rows bucket): the sweep's picks (bench/gpu_fp8_sweep.py
# prints this table and writes it as "picks" in its JSON). Empty until a device run fills
# it: every cell then takes fp8_default's guess, chosen only to compile without register
# spills for sm_90. HELIOS_FP8_TILES=<sweep JSON> at capture reads the picks from a sweep's
# output instead (the `fp8-tune` step of bench/gpu_device.sh captures that way).
_FP8_TILES: dict[tuple[int, int, int], dict[str, int]] = {}
# The row counts the sweep times; a launch of T rows takes the cell of the smallest >= T.
FP8_ROWS = (1, 8, 16, 32, 64, 128, 256, 1024)
FP8_TILES_FILE = os.environ.get("HELIOS_FP8_TILES", "")


def _fp8_table() -> dict[tuple[int, int, int], dict[str, int]]:
    """``_FP8_TILES``, or the picks of the sweep JSON named by HELIOS_FP8_TILES.

    Raises:
        ValueError: the file does not hold a sweep's picks.
    """
    if not FP8_TILES_FILE:
        return _FP8_TILES
    import json  # only when a sweep file is named (a sweep-time override)

    try:
        with open(FP8_TILES_FILE) as f:
            picks = json.load(f)["picks"]
        return {tuple(int(v) for v in key.split(",")): dict(c) for key, c in picks.items()}
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"HELIOS_FP8_TILES={FP8_TILES_FILE!r} is not a bench/gpu_fp8_sweep.py "
                         f"JSON with picks: {exc}") from None


def fp8_default(T: int, N: int, K: int) -> dict[str, int]:
    """The unswept tiles (with ``WARPS`` / ``STAGES``) of a `T`-row FP8 product: one row on
    the FMA units (``MMA=0``: 8 weight rows a program, K steps of up to 1024), else
    ``tl.dot`` on e4m3 operands: 16 or 32 token rows by 32 columns (64 where N > 8192:
    without split-K, narrow tiles give the 4096-wide matrices 128 programs), 64-wide K
    steps, 4 warps; from 64 rows 64 x 128 tiles with 128-wide K steps at 8 warps (FP8
    wgmma). Each compiles for sm_90 without register spills at the 8B shapes (150-202
    registers at 64 rows).
    ``IMPRECISE`` = the K step: the wgmma's partial sums are promoted to f32 once per K
    step (accuracy first; the sweep times IMPRECISE=0, no promotion, and picks it where
    it is faster and within the tests' bound)."""
    if T == 1:
        return dict(MMA=0, BLOCK_T=1, BLOCK_N=8, BLOCK_K=min(_np2(K, 32), 1024),
                    BLOCK_KS=min(_np2(K, 32), 1024), WARPS=4)
    if T < 64:
        bk = min(_np2(K, 32), 64)
        return dict(MMA=1, BLOCK_T=max(_np2(T), 16), BLOCK_N=32 if N <= 8192 else 64,
                    BLOCK_K=bk, BLOCK_KS=min(_np2(K, 32), 128), WARPS=4, STAGES=3,
                    IMPRECISE=bk)
    bk = min(_np2(K, 32), 128)
    return dict(MMA=1, BLOCK_T=64, BLOCK_N=128, BLOCK_K=bk, BLOCK_KS=min(_np2(K, 32), 128),
                WARPS=8, STAGES=3, IMPRECISE=bk)


# Few-row FP8 products (2..FP8_FEW_ROWS rows) at capture (HELIOS_FP8_FEW): "table"
# (default: the swept table / fp8_default: at 8 rows the H100 sweep at dc8d9d8 picked one
# GEMV program row per token row or 16-row tl.dot tiles; 8B decode 0.60x bf16), "rows"
# (the GEMV with BLOCK_T = the power of two >= T token rows a program, so each weight tile
# is read once for all of them; measured slower on an H100 at 94c9904: 8B decode at batch
# 8 408.3 tok/s against the table's 700.7 in one process,
# bench/results/h100_2026-12-06i/fp8_b8_few_94c9904.json), or "BLOCK_N,BLOCK_K,WARPS"
# (the rows form with these tiles).
FP8_FEW = os.environ.get("HELIOS_FP8_FEW", "table")
FP8_FEW_ROWS = 16
FP8_FEW_V1 = "16,256,4"


def fp8_few(T: int, K: int, spec: str = "") -> dict[str, int] | None:
    """The few-row GEMV tiles (with ``WARPS``) of a `T`-row FP8 product over `K` under
    `spec` (default ``FP8_FEW``), or None (one row, more than FP8_FEW_ROWS rows, or
    "table").

    Raises:
        ValueError: a spec that is neither "rows", "table" nor three integers.
    """
    spec = spec or FP8_FEW
    if spec == "table" or not 2 <= T <= FP8_FEW_ROWS:
        return None
    try:
        bn, bk, warps = (int(v) for v in (FP8_FEW_V1 if spec == "rows" else spec).split(","))
    except ValueError:
        raise ValueError("HELIOS_FP8_FEW must be 'rows', 'table' or 'BLOCK_N,BLOCK_K,WARPS', "
                         f"got {spec!r}") from None
    bk = min(_np2(K, 32), bk)
    return dict(MMA=0, BLOCK_T=_np2(T), BLOCK_N=bn, BLOCK_K=bk, BLOCK_KS=bk, WARPS=warps)


def fp8_constants(T: int, N: int, K: int) -> dict[str, int]:
    """Tiles (with ``WARPS`` and ``STAGES``) of the FP8 products for `T` rows, `N` outputs
    over `K`: ``fp8_few`` for a few rows, else the swept cell ``(N, K, smallest FP8_ROWS
    >= T)`` where the table has it, else ``fp8_default``. A GEMV (``MMA=0``) program
    serves ``BLOCK_T`` token rows."""
    few = fp8_few(T, K)
    if few is not None:
        return fp8_flags(K, few)
    bucket = next((r for r in FP8_ROWS if r >= T), FP8_ROWS[-1])
    pick = _fp8_table().get((N, K, bucket))
    return fp8_flags(K, dict(pick) if pick else fp8_default(T, N, K))


# HELIOS_FP8_EARLY=1 at capture: the FP8 GEMV (MMA=0) loads its first K step of codes
# before the prologue pass (``EARLY=1``, the same sums; at one row through the several-row
# body, which compiles to more registers than the batch-1 body: 107 against 72 at the 8B
# qkv pick). Off by default; not yet timed.
FP8_EARLY = os.environ.get("HELIOS_FP8_EARLY", "0")


def fp8_flags(K: int, c: dict[str, int]) -> dict[str, int]:
    """Tiles `c` with the alignment constants of K: ``K16`` (K a multiple of 16: vector
    loads) and ``EVEN_K`` (K a multiple of both K steps: masks constant along K), and on
    the GEMV ``EARLY`` (FP8_EARLY)."""
    even = K % c["BLOCK_K"] == 0 and K % c.get("BLOCK_KS", 512) == 0
    early = {"EARLY": 1} if c.get("MMA") == 0 and FP8_EARLY != "0" else {}
    return {**c, "K16": int(K % 16 == 0), "EVEN_K": int(even), **early}


def launch_config(op: str, scalars: list[int | float], views: Sequence = (),
                  rounded: bool = False) -> LaunchConfig:
    """The launch geometry of `op` given its scalar arguments (in parameter order) and
    its buffer views (in parameter order; their buffer dtypes select weight variants).
    `rounded` (``linear_packed`` / ``linear_packed_rows`` only): the packed input was
    written by ``round_bf16`` / ``swiglu_round_bf16`` (``hi | 0``), so the kernel runs
    ``XSPLIT=0`` and skips the zero lo terms; capture says so where it records the pair
    (capture.layers.product).

    Raises:
        KeyError: an op without a launch rule.
    """
    s = [int(x) if not isinstance(x, float) else x for x in scalars]
    # An e4m3- or bf16-cache form (kernels/kv_fp8.py, kv_bf16.py) has its f32 op's
    # scalars and geometry (the cache planes' dtype chooses the decode attention body).
    plane = "e4m3" if op in KV_FP8_BASE else "bf16" if op in KV_BF16_BASE else "f32"
    op = KV_FP8_BASE.get(op, KV_BF16_BASE.get(op, op))
    if op == "embedding":
        T, D = s
        vocab = int(views[1].shape[0]) if len(views) > 1 else 0
        return _cfg((T,), 4 if D <= 1024 else 8, BLOCK_D=_np2(D, 16), VOCAB=vocab,
                    WBF16=_is_bf16(views[1]) if len(views) > 1 else 0)
    if op in ("rmsnorm", "add_rmsnorm"):
        T, D = s[0], s[1]
        return _cfg((T,), 4 if D <= 1024 else 8, BLOCK_D=_np2(D, 16))
    if op == "linear":
        return _linear_config(s, views, tc=True)
    if op == "linear_invariant":
        T, N, K = s
        c = invariant_constants(N, K)
        groups = _cdiv(T, c["ROWS"])
        return _cfg((groups * _cdiv(N, c["BLOCK_N"]),), c.pop("WARPS"), **c,
                    WBF16=_is_bf16(views[1]) if len(views) > 1 else 0, K16=int(K % 16 == 0))
    if op in ("swiglu_linear", "swiglu_linear_add"):
        T, N, K = s
        if T != 1 and linear_fma(T, N) is None:  # any K on the GEMV (cores before v2)
            raise KeyError(f"{op} has no launch rule for {T} rows (GEMV/FMA only)")
        c = launch_config("linear", [T, N, K], views)
        acc = int(op == "swiglu_linear_add")
        return replace(c, constants={**c.constants, "SWIGLU": 1, "ACC": acc})
    if op == "linear_add":  # linear with the residual add in its epilogue
        c = _linear_config(s, views, tc=False)
        return replace(c, constants={**c.constants, "ACC": 1})
    if op == "rmsnorm_linear":  # linear with the RMS prologue: the linear's geometry
        T, N, K = s[0], s[1], s[2]
        return _linear_config([T, N, K], (views[0], views[2], views[3])
                              if len(views) > 3 else (), tc=False)
    if op == "embedding_int8":  # INT8 table rows (kernels_triton/int8.py)
        T, D = s
        vocab = int(views[1].shape[0]) if len(views) > 1 else 0
        groups = int(views[2].shape[1]) if len(views) > 2 else D // 32
        return _cfg((T,), 4 if D <= 1024 else 8, BLOCK_D=_np2(D, 16), VOCAB=vocab,
                    GROUP=D // groups)
    if op in INT4_PROLOGUE or op in INT8_PROLOGUE:  # W4A16 / W8A16 (kernels_triton/int*.py)
        T, N, K = s[0], s[1], s[2]
        at = 3 if op.startswith("rmsnorm_") else 2  # the scales' view
        groups = int(views[at].shape[1]) if len(views) > at else K // 128
        common = dict(GROUP=K // groups, PRO={**INT4_PROLOGUE, **INT8_PROLOGUE}[op],
                      ACC=int(op.startswith(("linear_add_", "swiglu_linear_add_"))))
        if op.endswith("_int4"):  # the plain INT4 storage: the v2 forms (or the knobs')
            if T >= INT4_MMA_ROWS:  # output tiles on the tensor cores
                c = int4_tile_constants(T)
                return _cfg((_cdiv(N, c["BLOCK_N"]), _cdiv(T, c["BLOCK_T"])), c.pop("WARPS"),
                            **common, **c)
            c = int4_rows_constants(T, N, K, K // groups)
            return _cfg((_cdiv(T, c["BLOCK_T"]) if c.get("ROWS") else T,
                         _cdiv(N, c["BLOCK_N"])), c.pop("WARPS"), **common, **c)
        if T >= INT4_MMA_ROWS:  # INT4_MIN / INT8: the v1 forms
            bt = 32 if T <= 32 else 64
            return _cfg((_cdiv(N, 64), _cdiv(T, bt)), 4, **common, MMA=1, BLOCK_T=bt,
                        BLOCK_N=64, BLOCK_B=16)
        per_row = K // 2 if op in INT4_PROLOGUE else K  # bytes of a weight row
        return _cfg((T, _cdiv(N, 16)), 4, **common, MMA=0, BLOCK_T=32, BLOCK_N=16,
                    BLOCK_B=min(_np2(per_row, 16), 256))
    if op in FP8_PROLOGUE:  # the W8A8 products (kernels_triton/fp8.py)
        T, N, K = s[0], s[1], s[2]
        c = fp8_constants(T, N, K)
        rows = _cdiv(T, c["BLOCK_T"])
        return _cfg((_cdiv(N, c["BLOCK_N"] * c.get("TILES", 1)), rows), c.pop("WARPS"), **c,
                    PRO=FP8_PROLOGUE[op], ACC=int(op in ("linear_add_fp8",
                                                         "swiglu_linear_add_fp8")))
    if op == "rope_kv_write":
        T, H, KVH, HD = s[0], s[4], s[5], s[6]
        return _cfg((T,), 4, BLOCK_H=_np2(H + KVH), BLOCK_HALF=_np2(HD // 2),
                    BLOCK=_np2(KVH * HD, 32))
    if op == "rope":
        T, H, KVH, HD = s
        return _cfg((T,), 4, BLOCK_H=_np2(H + KVH), BLOCK_HALF=_np2(HD // 2))
    if op == "kv_write":
        T, KVH, HD = s[0], s[5], s[6]
        return _cfg((T,), 4, BLOCK=_np2(KVH * HD, 32))
    if op in ("attention_prefill", "attention_prefill_window"):
        # Block programs, then one lane program per possible leading single-token row (a
        # MIXED step's decode lanes: kernels_triton/attention.py `_prefill_block`).
        T, R, H, KVH, HD = s[0], s[1], s[4], s[5], s[6]
        return _cfg((_cdiv(T, 32) + min(R, T), H), 4, BLOCK_M=32, BLOCK_N=32,
                    BLOCK_HD=_np2(HD, 16), **prefill_lane_constants(H, KVH, HD, plane))
    if op in ("attention_decode", "attention_decode_window"):
        B, H, HD = s[0], s[3], s[5]
        return _cfg((B, H), 8, BLOCK_N=128, BLOCK_HD=_np2(HD, 16))
    if op in ("attention_decode_split", "attention_decode_split_tuned"):
        # The tuned variant is captured at the maximum split count NS (its programs past
        # the tuned count exit at once): the same grid and constants.
        B, H, KVH, HD, NS, SPLIT = s[0], s[3], s[4], s[5], s[6], s[7]
        c = attention_split_constants(B, H, KVH, HD, NS, SPLIT,
                                      tuned=op == "attention_decode_split_tuned", plane=plane)
        z = c["LIVE"] if c.get("LIVE") else _cdiv(NS, c.get("SPP", 1))
        return _cfg((B, KVH if c["GROUPED"] else H, z), c.pop("WARPS"), **c)
    if op == "attention_decode_fused":
        B, H, KVH, HD, NS, SPLIT = s[0], s[3], s[4], s[5], s[6], s[7]
        c = attention_fused_constants(H, KVH, HD, NS, SPLIT)
        return _cfg((B, KVH, NS), c.pop("WARPS"), **c)
    if op in ("attention_decode_merge", "attention_decode_merge_tuned"):
        B, H, HD, NS = s
        c = attention_merge_constants(HD, NS)
        return _cfg((B, H), c.pop("WARPS"), **c)
    if op == "timer_mark":
        return _cfg((1,), 1)
    if op == "split_tuning_setup":
        B, MP = s[0], s[1]
        return _cfg((B,), 1, BLOCK=_np2(min(MP, 1024), 32))
    if op == "split_tuning_select":
        return _cfg((1,), 1, BLOCK_C=4)
    if op in ("silu_mul", "add", "gelu_mul"):
        T, W = s
        return _cfg((T, _cdiv(W, 1024)), 4, BLOCK=1024)
    if op == "scale":
        T, D = s[0], s[1]
        return _cfg((T, _cdiv(D, 1024)), 4, BLOCK=1024)
    if op == "head_rmsnorm":  # one program per (row, query or key head)
        T, H, KVH, HD = s[0], s[1], s[2], s[3]
        return _cfg((T, H + KVH), 4, BLOCK_D=_np2(HD, 16))
    if op == "gather_last":
        R, D = s[1], s[2]
        return _cfg((R,), 4, BLOCK_D=_np2(D, 16))
    if op in ("slot_gather", "slot_scatter"):
        R = s[0]
        return _cfg((_cdiv(R, 128),), 4, BLOCK=128)
    if op in ("sample", "sample_biased"):
        R = s[0]
        return _cfg((R,), 8, BLOCK_V=2048)
    if op in ("sample_chunks", "sample_chunks_nucleus", "sample_chunks_wide"):  # a program per (row, chunk of C ids)
        R, V, C, KM = s[0], s[1], s[3], s[4]
        return _cfg((R, _cdiv(V, C)), 4, BLOCK_V=C, KMAX=KM)
    if op == "sample_merge":  # one program per row over its P x KM candidates
        R, P, KM = s[0], s[2], s[3]
        return _cfg((R,), 8, BLOCK_P=_np2(P, 2), BLOCK_C=_np2(P * KM, 32), KMAX=KM)
    if op == "sample_merge_nucleus":  # as sample_merge, plus a KN x KN nucleus comparison
        R, P, KM, KN = s[0], s[2], s[4], s[5]  # in blocks of KN x 32
        return _cfg((R,), 8, BLOCK_P=_np2(P, 2), BLOCK_C=_np2(P * KM, 32), KMAX=KM, NMAX=KN,
                    JB=min(KN, 32))
    if op == "sample_race":  # a program per (row, chunk of C ids): JB slots at a time
        R, V, C, NB = s[0], s[1], s[3], s[4]
        return _cfg((R, _cdiv(V, C)), 8, BLOCK_V=C, BLOCK_P=_np2(_cdiv(V, C), 2), NSLOT=NB,
                    JB=4)
    if op == "sample_pick":  # one program per row over its P x NB slots
        R, P, NB = s[0], s[2], s[3]
        return _cfg((R,), 8, BLOCK_P=_np2(P, 2), NSLOT=NB)
    if op == "sample_chunks_mass":  # a program per (row, chunk of C ids)
        R, V, C, KM = s[0], s[1], s[3], s[4]
        return _cfg((R, _cdiv(V, C)), 4, BLOCK_V=C, KMAX=KM)
    if op in ("sample_race_top", "sample_race_mass"):  # a program per (row, chunk of C ids)
        R, V, C, M = s[0], s[1], s[3], s[4]
        P = _cdiv(V, C)
        c = dict(BLOCK_V=C, BLOCK_P=_np2(P, 2), MTOP=M)
        if op == "sample_race_mass":  # each program re-merges the row's P x M candidates
            c["BLOCK_Q"] = _np2(P * M, 2)
        return _cfg((R, P), RACE_WARPS, **c)
    if op == "sample_race_pick":  # one program per row; sample_biased's sweeps if needed
        R, P, M = s[0], s[3], s[4]
        return _cfg((R,), 8, BLOCK_V=2048, BLOCK_P=_np2(P, 2), BLOCK_Q=_np2(P * M, 2), MTOP=M)
    if op == "sample_rest":  # sample_biased's geometry; unresolved rows only
        R = s[0]
        return _cfg((R,), 8, BLOCK_V=2048)
    if op == "token_logprobs":  # k + 2 sweeps of one row per program
        R = s[0]
        return _cfg((R,), 8, BLOCK_V=2048)
    if op == "score_tokens":  # token_logprobs' sweeps, one packed token per program
        T = s[0]
        return _cfg((T,), 8, BLOCK_V=2048)
    if op in ("spec_draft_inputs", "spec_pack_tokens"):  # one program per lane / packed row
        n = s[1] if op == "spec_pack_tokens" else s[0]
        return _cfg((_cdiv(n, 128),), 4, BLOCK=128)
    if op == "draft_sample":  # one program per lane over the draft vocabulary
        B = s[0]
        return _cfg((B,), 8, BLOCK_V=2048)
    if op == "spec_verify":  # one program per lane walks its rows in order
        B, W = s[0], s[6]
        return _cfg((B,), 8, BLOCK_V=2048, WMAX=_np2(W, 2))
    if op == "draft_sample_coupled":  # as draft_sample, with no q row to write
        B = s[0]
        return _cfg((B,), 8, BLOCK_V=2048)
    if op == "spec_verify_coupled":  # as spec_verify
        B, W = s[0], s[5]
        return _cfg((B,), 8, BLOCK_V=2048, WMAX=_np2(W, 2))
    if op == "spec_copy_drafts":  # one lane per thread: a draft id each, no q
        return _cfg((_cdiv(s[0], 128),), 4, BLOCK=128)
    if op in ("spec_copy_candidates", "spec_confidence"):  # one program per lane
        return _cfg((s[0],), 4, BLOCK_V=2048)
    if op == "spec_candidate_masks":  # one program per packed row
        return _cfg((s[0],), 4, BLOCK_V=2048)
    if op == "spec_allocate":  # one program holds every lane
        return _cfg((1,), 4, BLOCK_B=_np2(s[0], 16))
    if op == "spec_pack_rows":
        B, P = s
        return _cfg((_cdiv(P, 64),), 4, BLOCK_B=_np2(B, 16), BLOCK_T=64)
    if op in ("paged_row_write", "paged_row_gather_prev"):
        T, D = s[0], s[4]
        return _cfg((T,), 4, BLOCK_D=_np2(D, 16))
    if op in ("all_reduce_sum", "all_gather_columns", "broadcast_rank0"):
        # Collectives are no kernel launches (rank peers run them; NCCL on cuda): no grid.
        return LaunchConfig(grid=(1, 1, 1), block=(1, 1, 1))
    if op in ("split_bf16", "swiglu_split_bf16"):
        T, K = s
        return _cfg((T, _cdiv(K, 1024)), 4, BLOCK=1024, SWIGLU=int(op == "swiglu_split_bf16"))
    if op in ("round_bf16", "swiglu_round_bf16"):  # split_bf16's kernel, zeros for lo
        T, K = s
        return _cfg((T, _cdiv(K, 1024)), 4, BLOCK=1024, SWIGLU=int(op == "swiglu_round_bf16"),
                    LO=0)
    # One term over a rounded input; cores with two terms keep their constants (and ids).
    terms = {"XSPLIT": 0} if rounded else {}
    if op in ("linear_packed", "linear_partial"):  # grid z: the S K slices
        T, N, K, S = s
        wbf16 = _is_bf16(views[1]) if len(views) > 1 else 0
        if op == "linear_packed" and wbf16 and S == 1 and (prefill_tc(T, N, K)
                                                            or decode_tc(T, N, K)):
            c = tc_constants(T, N, K, rounded)
            tiles = _cdiv(T, c["BLOCK_T"]) * _cdiv(N, c["BLOCK_N"])
            return _cfg((tiles,), c.pop("WARPS"), **c, WBF16=1, K16=1, PACKED=1)
        c = mma_constants(T, N, K)
        return _cfg((_cdiv(N, c["BLOCK_N"]), _cdiv(T, c["BLOCK_T"]), S), c.pop("WARPS"), **c,
                    WBF16=wbf16, K16=int(K % 16 == 0), PACKED=int(op == "linear_packed"),
                    **terms)
    if op == "linear_packed_rows":  # one tile per matrix whatever T: invariant_splits
        T, N, K, S = s
        c = mma_constants(INVARIANT_PACKED_ROWS, N, K)
        return _cfg((_cdiv(T, c["BLOCK_T"]), _cdiv(N, c["BLOCK_N"]), S), c.pop("WARPS"), **c,
                    WBF16=_is_bf16(views[1]) if len(views) > 1 else 0, K16=int(K % 16 == 0),
                    PACKED=1, ROWS_FIRST=1, **terms)
    if op in ("splitk_reduce", "splitk_reduce_add"):
        T, N = s[0], s[1]
        return _cfg((T, _cdiv(N, 1024)), 4, BLOCK=1024, ACC=int(op == "splitk_reduce_add"))
    if op == "qk_rmsnorm":  # one program per (token, query or key head)
        T, H, KVH, HD = s[0], s[1], s[2], s[3]
        return _cfg((T, H + KVH), 1, BLOCK_HD=_np2(HD, 16))
    if op == "moe_route":  # one program per token row over its E router logits
        T, E, K = s[0], s[1], s[2]
        return _cfg((T,), 1 if E <= 256 else 4, BLOCK_E=_np2(E, 16), BLOCK_K=_np2(K, 2))
    if op == "moe_align":  # one program: a counting sort of the T K pairs by expert
        T, K, BT = s[0], s[2], s[3]
        return _cfg((1,), 4, BLOCK_P=_np2(T * K, 16), BLOCK_T=BT)
    if op in ("moe_gate_up", "moe_down"):  # one program per (expert block, N tile)
        D, F, BT, NB = s[1], s[2], s[4], s[5]
        N, K = (F, D) if op == "moe_gate_up" else (D, F)
        c = moe_constants(N, K)
        return _cfg((NB, _cdiv(N, c["BLOCK_N"])), c.pop("WARPS"), BLOCK_T=BT, **c,
                    WBF16=_is_bf16(views[3]) if len(views) > 3 else 0)
    if op == "moe_sum":
        T, D = s[0], s[1]
        return _cfg((T, _cdiv(D, 1024)), 4, BLOCK=1024)
    if op == "row_copy":  # one program per (row, BLOCK elements): rows are ~10-100 KB
        R, ROW = s
        return _cfg((R, _cdiv(ROW, 4096)), 4, BLOCK=4096)
    # Vision encoder (kernels/vision.py): one program per row (window rows, patch rows or
    # packed tokens); no Triton kernels yet, so the cpu backend alone executes them.
    if op == "patchify":
        W, S, P = s
        return _cfg((W * (S // P) ** 2,), 4, BLOCK=_np2(3 * P * P, 16))
    if op == "position_add":
        T, D = s[0], s[2]
        return _cfg((T,), 4, BLOCK_D=_np2(D, 16),
                    WBF16=_is_bf16(views[1]) if len(views) > 1 else 0)
    if op in ("layernorm", "bias_add", "gelu_tanh"):
        T, D = s[0], s[1]
        return _cfg((T,), 4, BLOCK_D=_np2(D, 16))
    if op == "window_attention":
        W, NP, H, HD = s[0], s[1], s[2], s[3]
        return _cfg((W * NP, H), 4, BLOCK_N=_np2(NP, 16), BLOCK_HD=_np2(HD, 16))
    if op == "pixel_shuffle":
        W, G, D, R = s
        return _cfg((W * (G // R) ** 2,), 4, BLOCK_D=_np2(D * R * R, 16))
    if op == "image_merge":
        T, D = s[0], s[2]
        return _cfg((T,), 4, BLOCK_D=_np2(D, 16))
    raise KeyError(f"no launch rule for kernel op {op!r}")
