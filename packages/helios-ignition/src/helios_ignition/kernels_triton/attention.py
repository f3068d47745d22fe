"""Triton kernels for RoPE, the paged KV-cache write and paged causal GQA attention.

Same parameters and semantics as ``helios_tools.kernels`` (rope, kv_write,
attention_decode, attention_prefill). Caches are f32 ``[P, PT, KVH, HD]``; a request's
position ``j`` lives at ``page_table[slot, j // PT]``, offset ``j % PT``.

Every body that reads or writes a cache plane takes ``k_scale, v_scale`` after the
planes and goes through ``_kv_load`` / ``_kv_store``: with uint8 planes (an e4m3 cache,
kernels_triton/kv_fp8.py's entry points) they decode and encode in registers; with bf16
planes (a bf16 cache: the ``*_bf16kv`` ops are these entry points compiled with bf16
plane pointers, kernels_triton/kv_bf16.py) they widen on load and round to nearest even
on store; the f32 entry points here pass the planes themselves as the (never read)
scales.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

NEG_BIG = tl.constexpr(-1.0e30)  # finite "minus infinity" for running maxima
E4M3_MAX = tl.constexpr(448.0)  # the largest finite float8_e4m3fn value


@triton.jit
def _kv_load(plane, idx, mask, scales, kvh):
    """Cache elements ``plane[idx]`` (masked to 0) as f32: an f32 plane as stored; a bf16
    plane widened (exact); an e4m3 plane (uint8 codes, kernels/kv_fp8.py) decoded in
    registers and multiplied by kv head `kvh`'s scale ``scales[kvh]`` (f32 and bf16
    planes pass any pointer: never read)."""
    x = tl.load(plane + idx, mask=mask, other=0)
    if plane.dtype.element_ty == tl.uint8:
        x = x.to(tl.float8e4nv, bitcast=True).to(tl.float32) * tl.load(scales + kvh)
    elif plane.dtype.element_ty == tl.bfloat16:
        x = x.to(tl.float32)
    return x


@triton.jit
def _kv_store(plane, idx, x, mask, scales, kvh):
    """Store f32 `x` at ``plane[idx]``: as is into an f32 plane; into a bf16 plane
    rounded to nearest even (``cvt.rn.bf16.f32``: kernels/kv_bf16.py's ``encode_bf16``);
    into an e4m3 plane as ``x / scales[kvh]`` (IEEE division) clamped to +-448 and
    rounded to nearest even (``cvt.rn.satfinite``: kernels/kv_fp8.py's ``quantize_kv``)."""
    if plane.dtype.element_ty == tl.uint8:
        y = tl.math.div_rn(x, tl.load(scales + kvh, mask=mask, other=1.0))
        y = tl.minimum(tl.maximum(y, -E4M3_MAX), E4M3_MAX)
        x = y.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    elif plane.dtype.element_ty == tl.bfloat16:
        x = x.to(tl.bfloat16, fp_downcast_rounding="rtne")
    tl.store(plane + idx, x, mask=mask)


@triton.jit
def _rope_token(qkv, positions, inv_freq, t, H, KVH, HD, BLOCK_H: tl.constexpr,
                BLOCK_HALF: tl.constexpr):
    half = HD // 2
    width = (H + 2 * KVH) * HD
    h = tl.arange(0, BLOCK_H)
    i = tl.arange(0, BLOCK_HALF)
    mh = h < H + KVH
    mi = i < half
    pos = tl.load(positions + t).to(tl.float32)
    angle = pos * tl.load(inv_freq + i, mask=mi, other=0.0)
    c = libdevice.cos(angle)[None, :]
    s = libdevice.sin(angle)[None, :]
    base = qkv + t * width + h[:, None] * HD + i[None, :]
    m = mh[:, None] & mi[None, :]
    x1 = tl.load(base, mask=m, other=0.0)
    x2 = tl.load(base + half, mask=m, other=0.0)
    tl.store(base, x1 * c - x2 * s, mask=m)
    tl.store(base + half, x2 * c + x1 * s, mask=m)


@triton.jit
def _kv_write_token(qkv, positions, token_row, slot, page_table, k_cache, v_cache, k_scale, v_scale, t,
                    MP, PT, H, KVH, HD, BLOCK: tl.constexpr):
    r = tl.load(token_row + t)
    s = tl.load(slot + tl.maximum(r, 0), mask=r >= 0, other=-1)
    if (r >= 0) & (s >= 0):
        pos = tl.load(positions + t)
        page = tl.load(page_table + s.to(tl.int64) * MP + pos // PT).to(tl.int64)
        e = tl.arange(0, BLOCK)
        m = e < KVH * HD
        width = (H + 2 * KVH) * HD
        src = qkv + t * width + H * HD + e
        dst = (page * PT + pos % PT) * (KVH * HD) + e
        kvh = e // HD
        _kv_store(k_cache, dst, tl.load(src, mask=m, other=0.0), m, k_scale, kvh)
        _kv_store(v_cache, dst, tl.load(src + KVH * HD, mask=m, other=0.0), m, v_scale, kvh)


@triton.jit
def rope(qkv, positions, inv_freq, T, H, KVH, HD, BLOCK_H: tl.constexpr,
         BLOCK_HALF: tl.constexpr):
    """Rotate q and k heads of token ``t`` in place (HF half-split); grid ``(T,)``.

    ``angle = f32(position) * inv_freq[i]`` (one f32 multiply, as the reference), with
    correctly rounded libdevice ``cos``/``sin``.
    """
    t = tl.program_id(0).to(tl.int64)
    _rope_token(qkv, positions, inv_freq, t, H, KVH, HD, BLOCK_H, BLOCK_HALF)


@triton.jit
def kv_write(qkv, positions, token_row, slot, page_table, k_cache, v_cache,
             T, R, MP, PT, H, KVH, HD, BLOCK: tl.constexpr):
    """Store token ``t``'s key and value heads at its position; grid ``(T,)``.

    Padding (``token_row < 0`` or ``slot < 0``) writes nothing.
    """
    t = tl.program_id(0).to(tl.int64)
    _kv_write_token(qkv, positions, token_row, slot, page_table, k_cache, v_cache,
                    k_cache, v_cache, t, MP, PT, H, KVH, HD, BLOCK)  # f32 planes: no scales


@triton.jit
def rope_kv_write(qkv, positions, inv_freq, token_row, slot, page_table, k_cache, v_cache,
                  T, R, MP, PT, H, KVH, HD, BLOCK_H: tl.constexpr,
                  BLOCK_HALF: tl.constexpr, BLOCK: tl.constexpr):
    """``rope`` then ``kv_write`` for token ``t`` in one program; grid ``(T,)``.

    The block barrier makes the rotated key this program stored in ``qkv`` visible to all
    of its threads before they copy it into the cache.
    """
    t = tl.program_id(0).to(tl.int64)
    _rope_token(qkv, positions, inv_freq, t, H, KVH, HD, BLOCK_H, BLOCK_HALF)
    tl.debug_barrier()
    _kv_write_token(qkv, positions, token_row, slot, page_table, k_cache, v_cache,
                    k_cache, v_cache, t, MP, PT, H, KVH, HD, BLOCK)  # f32 planes: no scales


# A window of W > 0 tokens: a query at position p sees positions p - W + 1 .. p; W = 0:
# the whole causal context. The span below is the window, or INT32_MAX for none (p - span
# never overflows for p >= 0), so one formula serves both.
_NO_WINDOW = tl.constexpr(2147483647)


@triton.jit
def _window_span(W):
    return tl.where(W > 0, W, _NO_WINDOW)


@triton.jit
def attention_decode(qkv, positions, slot, page_table, k_cache, v_cache, out,
                     B, MP, PT, H, KVH, HD, scale, BLOCK_N: tl.constexpr,
                     BLOCK_HD: tl.constexpr):
    """One query token per row over its cache positions ``0..p``; grid ``(B, H)``.

    Online softmax (running max / sum / weighted value) over ``BLOCK_N``-token context
    blocks, f32 throughout; ``q`` is scaled before the dot as the reference does.
    """
    _decode_rows(qkv, positions, slot, page_table, k_cache, v_cache, k_cache, v_cache, out,
                 MP, PT, H, KVH, HD, 0, scale, BLOCK_N, BLOCK_HD)  # f32 planes: no scales


@triton.jit
def _decode_rows(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, out, MP, PT, H, KVH, HD,
                 W, scale, BLOCK_N: tl.constexpr, BLOCK_HD: tl.constexpr):
    """``attention_decode`` (W = 0) and ``attention_decode_window`` (kernels_triton/
    window.py): the row at position p reads positions ``max(0, p - W + 1)..p`` only, so
    no page-table entry wholly behind its window is read."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    kvh = h // (H // KVH)
    d = tl.arange(0, BLOCK_HD)
    md = d < HD
    s = tl.load(slot + b)
    dst = out + b * (H * HD) + h * HD + d
    if s < 0:
        tl.store(dst, tl.zeros((BLOCK_HD,), tl.float32), mask=md)
    else:
        width = (H + 2 * KVH) * HD
        q = tl.load(qkv + b * width + h * HD + d, mask=md, other=0.0) * scale
        ctx = tl.load(positions + b) + 1
        lo = tl.maximum(ctx - _window_span(W), 0)
        m_i = tl.sum(tl.zeros((BLOCK_N,), tl.float32), axis=0) + NEG_BIG
        l_i = tl.sum(tl.zeros((BLOCK_N,), tl.float32), axis=0)
        acc = tl.zeros((BLOCK_HD,), tl.float32)
        row = page_table + s.to(tl.int64) * MP
        for j0 in range(lo, ctx, BLOCK_N):
            j = j0 + tl.arange(0, BLOCK_N)
            mj = j < ctx
            page = tl.load(row + j // PT, mask=mj, other=0).to(tl.int64)
            off = ((page * PT + j % PT) * KVH + kvh) * HD
            mkv = mj[:, None] & md[None, :]
            k = _kv_load(k_cache, off[:, None] + d[None, :], mkv, k_scale, kvh)
            sc = tl.sum(q[None, :] * k, axis=1)
            sc = tl.where(mj, sc, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, axis=0))
            alpha = libdevice.exp(m_i - m_new)
            p = libdevice.exp(sc - m_new)
            v = _kv_load(v_cache, off[:, None] + d[None, :], mkv, v_scale, kvh)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            m_i = m_new
        tl.store(dst, acc / l_i, mask=md)


@triton.jit
def attention_prefill(qkv, positions, token_row, slot, page_table, k_cache, v_cache, out,
                      T, R, MP, PT, H, KVH, HD, scale, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr,
                      LANE_TERMS: tl.constexpr = 0, EVEN_HD: tl.constexpr = 0):
    """Causal GQA attention of packed tokens for one query head.

    Grid ``(cdiv(T, BLOCK_M) + min(R, T), H)`` (``_prefill_block``): block programs, then
    one lane program per leading single-token row. Packed tokens of a request row are
    contiguous, but a block may span rows: a block program walks the rows present in its
    block, and for each streams that row's cache positions ``0..max position`` with a
    mask that keeps each token to its own row and to ``j <= position`` (flash attention
    with an online softmax; dots in 3xTF32, near f32). Padding tokens and rows get zeros.
    LANE_TERMS > 0 (bf16 planes only: the ``attention_prefill_bf16kv`` form): the lane
    programs' dots on the tensor cores (``_prefill_lane``).
    """
    _prefill_block(qkv, positions, token_row, slot, page_table, k_cache, v_cache, k_cache,
                   v_cache, out, T, MP, PT, H, KVH, HD, 0, scale, BLOCK_M, BLOCK_N,
                   BLOCK_HD, BLOCK_G, LANE_TERMS, EVEN_HD)  # f32 planes: no scales


@triton.jit
def _prefill_block(qkv, positions, token_row, slot, page_table, k_cache, v_cache, k_scale, v_scale, out, T, MP,
                   PT, H, KVH, HD, W, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr, LANE_TERMS: tl.constexpr = 0,
                   EVEN_HD: tl.constexpr = 0):
    """``attention_prefill`` (W = 0) and ``attention_prefill_window`` (kernels_triton/
    window.py), grid ``(cdiv(T, BLOCK_M) + min(R, T), H)``.

    Block programs (``pid < cdiv(T, BLOCK_M)``): each row present in the block streams
    its cache positions from the first its earliest token still sees (``min position -
    W + 1``; 0 without a window) to its latest, masked to ``p - W < j <= p``.

    Lane programs (``pid = cdiv(T, BLOCK_M) + r``): a MIXED step packs its decode lanes
    first, one token a row, so token ``r`` is row ``r``'s only token for every ``r`` of
    that prefix (``_lane_token``: ``token_row[r] == r`` implies rows ``0..r-1`` hold one
    token each). Walked by a block program, such rows run one after another (32 lanes of
    a block streamed serially, each a 32-row tile with one live row); here each is its
    own program, an online softmax over its positions with f32 FMA dots as the decode
    programs', and block programs leave those tokens alone. The lane programs of heads
    ``h < KVH`` each take every query head of kv head ``h`` (``_group_online``, ``BLOCK_G
    = next_pow2(H / KVH)``: a key/value tile loaded once for the group, as the decode
    programs'); the others, and those with no such row, exit after at most three loads.
    LANE_TERMS > 0 (HELIOS_ATTN_MMA, bf16 planes only; with EVEN_HD): the lane
    programs run the tensor-core body of the GROUPED=4 decode programs instead
    (``_prefill_lane``); the block programs are the same for any LANE_TERMS.
    """
    pid = tl.program_id(0)
    h = tl.program_id(1)
    blocks = tl.cdiv(T, BLOCK_M)
    if pid >= blocks:
        _prefill_lane(qkv, positions, token_row, slot, page_table, k_cache, v_cache, k_scale,
                      v_scale, out, T, MP, PT, H, KVH, HD, W, scale, pid - blocks, h,
                      BLOCK_N, BLOCK_HD, BLOCK_G, LANE_TERMS, EVEN_HD)
    else:
        _prefill_tile(qkv, positions, token_row, slot, page_table, k_cache, v_cache, k_scale,
                      v_scale, out, T, MP, PT, H, KVH, HD, W, scale, pid, h, BLOCK_M, BLOCK_N,
                      BLOCK_HD)


@triton.jit
def _prefill_lane(qkv, positions, token_row, slot, page_table, k_cache, v_cache, k_scale,
                  v_scale, out, T, MP, PT, H, KVH, HD, W, scale, r, h, BLOCK_N: tl.constexpr,
                  BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr, LANE_TERMS: tl.constexpr,
                  EVEN_HD: tl.constexpr):
    """``_prefill_block``'s lane program for token ``r`` (row ``r``) and kv head ``h``:
    nothing unless ``h < KVH`` and ``_lane_token``.

    LANE_TERMS=0: the kv head's query heads (``BLOCK_G = next_pow2(G)``) over the lane's
    positions in BLOCK_N-position tiles with f32 FMA dots (``_group_online``). LANE_TERMS 1
    or 2 (bf16 planes only): the GROUPED=4 decode body's online softmax
    (``_group_mma_online``): the query heads padded to ``BLOCK_G >= 16`` rows as the M
    side of bf16 tensor-core dots, BLOCK_N-position key/value tiles fed as stored, queries
    and probabilities in LANE_TERMS bf16 terms, so its error is ``_split_mma_at``'s
    (within ``capture.launch.ATTN_MMA_BOUND``), near the FMA lanes', not bitwise theirs.
    The same over a window (``lo`` = its first position: any ``[lo, hi)`` range).
    EVEN_HD=1 (LANE_TERMS > 0 and HD == BLOCK_HD only): no head-dim masks on the tiles.
    """
    if LANE_TERMS > 0:
        tl.static_assert(k_cache.dtype.element_ty == tl.bfloat16,
                         "LANE_TERMS > 0 (tensor-core MIXED lanes) reads bf16 KV planes only")
        tl.static_assert(BLOCK_G >= 16, "LANE_TERMS > 0 pads the query heads to 16 MMA rows")
        if EVEN_HD:  # HD == BLOCK_HD: offsets are visibly multiples of a power of two >= 16
            HD = BLOCK_HD
    d = tl.arange(0, BLOCK_HD)
    md = d < HD
    t = r.to(tl.int64)
    width = (H + 2 * KVH) * HD
    s = tl.load(slot + r, mask=(r < T) & (h < KVH), other=-1)
    if _lane_token(token_row, r, s, T):
        G = H // KVH
        g = tl.arange(0, BLOCK_G)
        mg = g < G
        p = tl.load(positions + r)
        lo = tl.maximum(p - _window_span(W) + 1, 0)
        heads = (h * G + g[:, None]) * HD + d[None, :]
        m2 = mg[:, None] & md[None, :]
        q = tl.load(qkv + t * width + heads, mask=m2, other=0.0) * scale
        row = page_table + s.to(tl.int64) * MP
        if LANE_TERMS > 0:
            q_hi, q_lo = _bf16_terms(q)
            m_i, l_i, acc = _group_mma_online(q_hi, q_lo, row, lo, p + 1, k_cache, v_cache, h,
                                              d, md, PT, KVH, HD, BLOCK_N, BLOCK_HD, BLOCK_G,
                                              EVEN_HD, LANE_TERMS)
        else:
            m_i, l_i, acc = _group_online(q, row, lo, p + 1, k_cache, v_cache, k_scale,
                                          v_scale, h, d, md, g, PT, KVH, HD, BLOCK_N,
                                          BLOCK_G, 0)
        res = tl.where(l_i[:, None] > 0, acc / l_i[:, None], 0.0)
        tl.store(out + t * (H * HD) + heads, res, mask=m2)


@triton.jit
def _prefill_tile(qkv, positions, token_row, slot, page_table, k_cache, v_cache, k_scale,
                  v_scale, out, T, MP, PT, H, KVH, HD, W, scale, pid, h, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_HD: tl.constexpr):
    """``_prefill_block``'s block program ``pid``, head ``h``: the rows of tokens
    ``pid * BLOCK_M ..`` but the lane programs' tokens."""
    kvh = h // (H // KVH)
    span = _window_span(W)
    d = tl.arange(0, BLOCK_HD)
    md = d < HD
    width = (H + 2 * KVH) * HD
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    mm = offs_m < T
    trow = tl.load(token_row + offs_m, mask=mm, other=-1)
    srow = tl.load(slot + tl.maximum(trow, 0), mask=trow >= 0, other=-1)
    lane = _lane_token(token_row, offs_m, srow, T)  # a lane program's token: not ours
    live = (trow >= 0) & (srow >= 0) & ~lane
    pos = tl.load(positions + offs_m, mask=mm, other=0)
    q = tl.load(qkv + offs_m[:, None].to(tl.int64) * width + h * HD + d[None, :],
                mask=mm[:, None] & md[None, :], other=0.0) * scale
    m_i = tl.full((BLOCK_M,), NEG_BIG, tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_HD), tl.float32)
    r_lo = tl.min(tl.where(live, trow, 2147483647), axis=0)
    r_hi = tl.max(tl.where(live, trow, -1), axis=0)
    for r in range(r_lo, r_hi + 1):
        mine = live & (trow == r)
        s = tl.max(tl.where(mine, srow, -1), axis=0)
        pmax = tl.max(tl.where(mine, pos, -1), axis=0)
        pmin = tl.min(tl.where(mine, pos, 2147483647), axis=0)
        lo = tl.maximum(pmin - span + 1, 0)
        row = page_table + tl.maximum(s, 0).to(tl.int64) * MP
        for j0 in range(lo, pmax + 1, BLOCK_N):
            j = j0 + tl.arange(0, BLOCK_N)
            mj = j <= pmax
            page = tl.load(row + j // PT, mask=mj, other=0).to(tl.int64)
            off = ((page * PT + j % PT) * KVH + kvh) * HD
            mkv = mj[:, None] & md[None, :]
            k = _kv_load(k_cache, off[:, None] + d[None, :], mkv, k_scale, kvh)
            sc = tl.dot(q, tl.trans(k), input_precision="tf32x3")
            vis = (mine[:, None] & (j[None, :] <= pos[:, None])
                   & (j[None, :] > pos[:, None] - span) & mj[None, :])
            sc = tl.where(vis, sc, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, axis=1))
            alpha = libdevice.exp(m_i - m_new)
            p = libdevice.exp(sc - m_new[:, None])
            v = _kv_load(v_cache, off[:, None] + d[None, :], mkv, v_scale, kvh)
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="tf32x3")
            l_i = l_i * alpha + tl.sum(p, axis=1)
            m_i = m_new
    res = tl.where(live[:, None] & (l_i[:, None] > 0), acc / l_i[:, None], 0.0)
    dst = out + offs_m[:, None].to(tl.int64) * (H * HD) + h * HD + d[None, :]
    tl.store(dst, res, mask=(mm & ~lane)[:, None] & md[None, :])


@triton.jit
def _lane_token(token_row, t, s, T):
    """Whether packed token `t` (scalar or block) is the only token of row ``t`` (a
    leading single-token row: ``token_row[t] == t`` and token ``t + 1`` another row's),
    that row a live one (its slot `s` >= 0): what ``_prefill_block``'s lane programs
    compute and its block programs skip. Both evaluate it from the same loads."""
    mine = tl.load(token_row + t, mask=t < T, other=-1)
    after = tl.load(token_row + t + 1, mask=t + 1 < T, other=-1)
    return (mine == t) & (after != t) & (s >= 0)


@triton.jit
def _head_online(q, row, lo, hi, k_cache, v_cache, k_scale, v_scale, kvh, d, md, PT, KVH, HD,
                 BLOCK_N: tl.constexpr, BLOCK_HD: tl.constexpr):
    """Online softmax of one (scaled) query head over cache positions ``[lo, hi)`` of the
    page-table row `row`, in BLOCK_N-position blocks, f32 FMA dots.

    Returns:
        (running max, sum of exp, unnormalized output ``[BLOCK_HD]``); ``(-1e30, 0, 0)``
        for an empty range.
    """
    m_i = tl.sum(tl.zeros((BLOCK_N,), tl.float32), axis=0) + NEG_BIG
    l_i = tl.sum(tl.zeros((BLOCK_N,), tl.float32), axis=0)
    acc = tl.zeros((BLOCK_HD,), tl.float32)
    for j0 in range(lo, hi, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        mj = j < hi
        page = tl.load(row + j // PT, mask=mj, other=0).to(tl.int64)
        off = ((page * PT + j % PT) * KVH + kvh) * HD
        mkv = mj[:, None] & md[None, :]
        k = _kv_load(k_cache, off[:, None] + d[None, :], mkv, k_scale, kvh)
        v = _kv_load(v_cache, off[:, None] + d[None, :], mkv, v_scale, kvh)
        sc = tl.where(mj, tl.sum(q[None, :] * k, axis=1), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=0))
        alpha = libdevice.exp(m_i - m_new)
        p = libdevice.exp(sc - m_new)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _split_per_head(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml, part_o,
                    B, MP, PT, H, KVH, HD, NS, SPLIT, scale, BLOCK_N: tl.constexpr,
                    BLOCK_HD: tl.constexpr):
    """Softmax statistics of context split ``sp`` for row ``b``, head ``h``; grid ``(B, H, NS)``.

    Writes ``part_ml[b, h, sp] = (max, sum exp)`` and the unnormalized ``part_o`` (an empty
    split or a padding row writes ``(-1e30, 0)`` and zeros). Splits are independent
    programs, so a long context is spread over the whole GPU (flash-decoding).
    """
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    sp = tl.program_id(2)
    kvh = h // (H // KVH)
    d = tl.arange(0, BLOCK_HD)
    md = d < HD
    s = tl.load(slot + b)
    ctx = tl.load(positions + b) + 1
    lo = sp * SPLIT
    hi = tl.where(s >= 0, tl.minimum(lo + SPLIT, ctx), lo)
    width = (H + 2 * KVH) * HD
    q = tl.load(qkv + b * width + h * HD + d, mask=md, other=0.0) * scale
    row = page_table + tl.maximum(s, 0).to(tl.int64) * MP
    m_i, l_i, acc = _head_online(q, row, lo, hi, k_cache, v_cache, k_scale, v_scale, kvh, d, md, PT, KVH, HD,
                                 BLOCK_N, BLOCK_HD)
    base = (b * H + h) * NS + sp
    tl.store(part_ml + base * 2, m_i)
    tl.store(part_ml + base * 2 + 1, l_i)
    tl.store(part_o + base * HD + d, acc, mask=md)


@triton.jit
def _split_grouped(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml, part_o,
                   B, MP, PT, H, KVH, HD, NS, SPLIT, scale, BLOCK_N: tl.constexpr,
                   BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr):
    """Softmax statistics of context split ``sp`` for row ``b`` and every query head of kv
    head ``kvh``; grid ``(B, KVH, NS)``.

    The ``G = H / KVH`` query heads sharing a kv head are one tile (padded to BLOCK_G rows
    for the MMA), so each cached key/value is read once per kv head, not once per query
    head. Writes ``part_ml[b, h, sp] = (max, sum exp)`` and the unnormalized ``part_o``
    (an empty split or a padding row writes ``(-1e30, 0)`` and zeros). Splits are
    independent programs, so a long context is spread over the whole GPU (flash-decoding);
    dots in 3xTF32 (near f32).
    """
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    G = H // KVH
    g = tl.arange(0, BLOCK_G)
    mg = g < G
    h = kvh * G + g
    d = tl.arange(0, BLOCK_HD)
    md = d < HD
    s = tl.load(slot + b)
    ctx = tl.load(positions + b) + 1
    lo = sp * SPLIT
    hi = tl.where(s >= 0, tl.minimum(lo + SPLIT, ctx), lo)
    width = (H + 2 * KVH) * HD
    q = tl.load(qkv + b * width + h[:, None] * HD + d[None, :], mask=mg[:, None] & md[None, :],
                other=0.0) * scale
    m_i = tl.full((BLOCK_G,), NEG_BIG, tl.float32)
    l_i = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_HD), tl.float32)
    row = page_table + tl.maximum(s, 0).to(tl.int64) * MP
    for j0 in range(lo, hi, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        mj = j < hi
        page = tl.load(row + j // PT, mask=mj, other=0).to(tl.int64)
        off = ((page * PT + j % PT) * KVH + kvh) * HD
        mkv = mj[:, None] & md[None, :]
        k = _kv_load(k_cache, off[:, None] + d[None, :], mkv, k_scale, kvh)
        v = _kv_load(v_cache, off[:, None] + d[None, :], mkv, v_scale, kvh)
        sc = tl.dot(q, tl.trans(k), input_precision="tf32x3")
        sc = tl.where(mj[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        alpha = libdevice.exp(m_i - m_new)
        p = libdevice.exp(sc - m_new[:, None])
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="tf32x3")
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    base = (b * H + h) * NS + sp
    tl.store(part_ml + base * 2, m_i, mask=mg)
    tl.store(part_ml + base * 2 + 1, l_i, mask=mg)
    tl.store(part_o + base[:, None] * HD + d[None, :], acc, mask=mg[:, None] & md[None, :])


@triton.jit
def _fma_head(qkv, k, v, mj, q_off, d, md, scale, EVEN_HD: tl.constexpr):
    """Split statistics of one query head over one key/value tile already in registers:
    ``(max, sum exp, sum exp * v)`` with f32 FMA dots (no online state)."""
    if EVEN_HD:
        q = tl.load(qkv + q_off + d) * scale
    else:
        q = tl.load(qkv + q_off + d, mask=md, other=0.0) * scale
    sc = tl.where(mj, tl.sum(q[None, :] * k, axis=1), float("-inf"))
    m = tl.max(sc, axis=0)
    p = libdevice.exp(sc - m)
    return m, tl.sum(p, axis=0), tl.sum(p[:, None] * v, axis=0)


@triton.jit
def _split_fma(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml, part_o,
               B, MP, PT, H, KVH, HD, NS, SPLIT, scale, BLOCK_N: tl.constexpr,
               BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr, EVEN_HD: tl.constexpr,
               SPP: tl.constexpr = 1):
    """GROUPED=2: splits ``z * SPP .. z * SPP + SPP - 1`` (those below NS) of row ``b``
    for every query head of kv head ``kvh``, one after the other; grid
    ``(B, KVH, cdiv(NS, SPP))`` (``_split_fma_at``). The partition and every split's
    arithmetic do not depend on SPP, so neither do the results: SPP > 1 only trades the
    programs of mostly empty splits (a short context at 128 splits per row) for a loop."""
    for i in tl.static_range(SPP):
        sp = tl.program_id(2) * SPP + i
        if sp < NS:
            _split_fma_at(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml, part_o,
                          B, MP, PT, H, KVH, HD, NS, SPLIT, scale, sp, BLOCK_N, BLOCK_HD,
                          BLOCK_G, EVEN_HD)


@triton.jit
def _split_fma_at(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml, part_o,
                  B, MP, PT, H, KVH, HD, NS, SPLIT, scale, sp, BLOCK_N: tl.constexpr,
                  BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr, EVEN_HD: tl.constexpr):
    """GROUPED=2: split ``sp`` of row ``b`` for every query head of kv head ``kvh`` with
    f32 FMA dots.

    An empty split (or padding row) only stores ``(-1e30, 0)`` and zeros. A split of at
    most BLOCK_N positions (the launch rule picks BLOCK_N >= SPLIT) loads its keys and
    values once, as one tile (all loads in flight at once), and every query head of the
    kv head reuses it from registers: one pass, no running state. A longer split walks
    BLOCK_N-position tiles with an online softmax per query head (re-reading the tiles
    from L1/L2 per head): correct for any SPLIT, fast for none.
    """
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    G = H // KVH
    if EVEN_HD:  # HD == BLOCK_HD: offsets are visibly multiples of a power of two >= 16
        HD = BLOCK_HD
    d = tl.arange(0, BLOCK_HD)
    md = d < HD
    s = tl.load(slot + b)
    ctx = tl.load(positions + b) + 1
    lo = sp * SPLIT
    hi = tl.where(s >= 0, tl.minimum(lo + SPLIT, ctx), lo)
    width = (H + 2 * KVH) * HD
    hd0 = b * H + kvh * G  # first (b, h) of this kv head
    ob = (hd0 * NS + sp) * HD
    qb = b * width + kvh * G * HD
    if hi <= lo:
        zero = tl.zeros((BLOCK_HD,), tl.float32)
        for g in range(0, G):
            base = (hd0 + g) * NS + sp
            tl.store(part_ml + base * 2, NEG_BIG)
            tl.store(part_ml + base * 2 + 1, 0.0)
            if EVEN_HD:
                tl.store(part_o + ob + g * NS * HD + d, zero)
            else:
                tl.store(part_o + ob + g * NS * HD + d, zero, mask=md)
    else:
        row = page_table + tl.maximum(s, 0).to(tl.int64) * MP
        if hi - lo <= BLOCK_N:
            j = lo + tl.arange(0, BLOCK_N)
            mj = j < hi
            page = tl.load(row + j // PT, mask=mj, other=0).to(tl.int64)
            off = ((page * PT + j % PT) * KVH + kvh) * HD
            if EVEN_HD:
                k = _kv_load(k_cache, off[:, None] + d[None, :], mj[:, None], k_scale, kvh)
                v = _kv_load(v_cache, off[:, None] + d[None, :], mj[:, None], v_scale, kvh)
            else:
                mkv = mj[:, None] & md[None, :]
                k = _kv_load(k_cache, off[:, None] + d[None, :], mkv, k_scale, kvh)
                v = _kv_load(v_cache, off[:, None] + d[None, :], mkv, v_scale, kvh)
            for gi in tl.static_range(BLOCK_G):
                if gi < G:
                    m, lsum, o = _fma_head(qkv, k, v, mj, qb + gi * HD, d, md, scale,
                                           EVEN_HD)
                    base = (hd0 + gi) * NS + sp
                    tl.store(part_ml + base * 2, m)
                    tl.store(part_ml + base * 2 + 1, lsum)
                    if EVEN_HD:
                        tl.store(part_o + ob + gi * NS * HD + d, o)
                    else:
                        tl.store(part_o + ob + gi * NS * HD + d, o, mask=md)
        else:
            for g in range(0, G):
                if EVEN_HD:
                    q = tl.load(qkv + qb + g * HD + d) * scale
                else:
                    q = tl.load(qkv + qb + g * HD + d, mask=md, other=0.0) * scale
                m_i, l_i, acc = _head_online(q, row, lo, hi, k_cache, v_cache, k_scale, v_scale, kvh, d, md, PT,
                                             KVH, HD, BLOCK_N, BLOCK_HD)
                base = (hd0 + g) * NS + sp
                tl.store(part_ml + base * 2, m_i)
                tl.store(part_ml + base * 2 + 1, l_i)
                tl.store(part_o + ob + g * NS * HD + d, acc, mask=md)


@triton.jit
def _split_fma_live(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale,
                    part_ml, part_o, B, MP, PT, H, KVH, HD, NS, SPLIT, scale, BLOCK_N: tl.constexpr,
                    BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr, EVEN_HD: tl.constexpr,
                    GROUPED: tl.constexpr, LIVE: tl.constexpr, TERMS: tl.constexpr = 2):
    """GROUPED=2, 3 or 4 over a row's live splits only; grid ``(B, KVH, LIVE)``.

    Row ``b`` has ``n = min(ceil(ctx / SPLIT), NS)`` live splits (none for a padding
    row). Program ``z`` computes splits ``z, z + LIVE, z + 2 LIVE, .. < n`` one after the
    other (``_split_fma_at``, ``_split_fma_online_at`` for GROUPED=3 or ``_split_mma_at``
    for GROUPED=4 with its TERMS: the partition
    and every split's arithmetic are those of the grid of NS programs a row, so the
    results do not depend on LIVE or on the bucket), then
    stores only ``part_ml = (-1e30, 0)`` for its splits ``n .. NS-1``: the merge
    (SKIP_EMPTY=1) reads their statistics and skips their outputs, so ``part_o`` of an
    empty split is left unwritten and a padding row writes nothing (the merge gives it
    zeros without reading). The grid scales with the rows, not with the capacity: a
    short context at a large capacity costs its live tiles, not ``NS`` programs a row.
    """
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    z = tl.program_id(2)
    s = tl.load(slot + b)
    if s >= 0:
        ctx = tl.load(positions + b) + 1
        n = tl.minimum((ctx + SPLIT - 1) // SPLIT, NS)
        for sp in range(z, n, LIVE):
            if GROUPED == 4:
                _split_mma_at(qkv, positions, slot, page_table, k_cache, v_cache, part_ml,
                              part_o, B, MP, PT, H, KVH, HD, NS, SPLIT, scale, sp, BLOCK_N,
                              BLOCK_HD, BLOCK_G, EVEN_HD, TERMS)
            elif GROUPED == 3:
                _split_fma_online_at(qkv, positions, slot, page_table, k_cache, v_cache,
                                     k_scale, v_scale, part_ml, part_o, B, MP, PT, H, KVH, HD, NS, SPLIT, scale,
                                     sp, BLOCK_N, BLOCK_HD, BLOCK_G, EVEN_HD)
            else:
                _split_fma_at(qkv, positions, slot, page_table, k_cache, v_cache, k_scale,
                              v_scale, part_ml, part_o, B, MP, PT, H, KVH, HD, NS, SPLIT, scale, sp, BLOCK_N,
                              BLOCK_HD, BLOCK_G, EVEN_HD)
        G = H // KVH
        g = tl.arange(0, BLOCK_G)
        mg = g < G
        hd0 = b * H + kvh * G  # first (b, h) of this kv head
        empty_max = tl.zeros((BLOCK_G,), tl.float32) + NEG_BIG
        # this program's first split at or past n (z itself when z >= n)
        first = z + tl.maximum(n - z + LIVE - 1, 0) // LIVE * LIVE
        for sp in range(first, NS, LIVE):
            base = (hd0 + g) * NS + sp
            tl.store(part_ml + base * 2, empty_max, mask=mg)
            tl.store(part_ml + base * 2 + 1, tl.zeros((BLOCK_G,), tl.float32), mask=mg)


@triton.jit
def _group_online(q, row, lo, hi, k_cache, v_cache, k_scale, v_scale, kvh, d, md, g, PT, KVH, HD,
                  BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, EVEN_HD: tl.constexpr):
    """Online softmax of the ``[BLOCK_G, BLOCK_HD]`` (scaled) queries `q` of one kv head
    over cache positions ``[lo, hi)`` of page-table row `row`, in BLOCK_N-position tiles,
    f32 FMA dots; each key/value tile is loaded once for all query heads.

    Returns:
        (``[BLOCK_G]`` running max, ``[BLOCK_G]`` sum of exp, ``[BLOCK_G, BLOCK_HD]``
        unnormalized output); ``(-1e30, 0, 0)`` rows for an empty range.
    """
    m_i = tl.zeros((BLOCK_G,), tl.float32) + NEG_BIG
    l_i = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros(q.shape, tl.float32)
    for j0 in range(lo, hi, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        mj = j < hi
        page = tl.load(row + j // PT, mask=mj, other=0).to(tl.int64)
        off = ((page * PT + j % PT) * KVH + kvh) * HD
        if EVEN_HD:
            k = _kv_load(k_cache, off[:, None] + d[None, :], mj[:, None], k_scale, kvh)
            v = _kv_load(v_cache, off[:, None] + d[None, :], mj[:, None], v_scale, kvh)
        else:
            mkv = mj[:, None] & md[None, :]
            k = _kv_load(k_cache, off[:, None] + d[None, :], mkv, k_scale, kvh)
            v = _kv_load(v_cache, off[:, None] + d[None, :], mkv, v_scale, kvh)
        for gi in tl.static_range(BLOCK_G):
            sel = g == gi
            qg = tl.sum(tl.where(sel[:, None], q, 0.0), axis=0)
            sc = tl.where(mj, tl.sum(qg[None, :] * k, axis=1), float("-inf"))
            m_old = tl.max(tl.where(sel, m_i, NEG_BIG), axis=0)
            m_new = tl.maximum(m_old, tl.max(sc, axis=0))
            alpha = libdevice.exp(m_old - m_new)
            p = libdevice.exp(sc - m_new)
            o = tl.sum(p[:, None] * v, axis=0)
            acc = tl.where(sel[:, None], acc * alpha + o[None, :], acc)
            l_i = tl.where(sel, l_i * alpha + tl.sum(p, axis=0), l_i)
            m_i = tl.where(sel, m_new, m_i)
    return m_i, l_i, acc


@triton.jit
def _split_fma_online(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml, part_o,
                      B, MP, PT, H, KVH, HD, NS, SPLIT, scale, BLOCK_N: tl.constexpr,
                      BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr, EVEN_HD: tl.constexpr):
    """GROUPED=3: split ``sp`` of row ``b`` for every query head of kv head ``kvh``, any
    SPLIT; grid ``(B, KVH, NS)``.

    Walks the split in BLOCK_N-position tiles (``_group_online``): each key/value tile
    is loaded once and every query head of the kv head takes it from registers, with the
    online-softmax state of all BLOCK_G heads kept at once (padded heads compute on zero
    queries and are not stored). So a split of several tiles costs one chained load per
    tile, not one per tile and head as GROUPED=2's walk. An empty split (or padding row)
    runs no tile and stores ``(-1e30, 0)`` and zeros.
    """
    _split_fma_online_at(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale,
                         part_ml, part_o, B, MP, PT, H, KVH, HD, NS, SPLIT, scale,
                         tl.program_id(2), BLOCK_N, BLOCK_HD, BLOCK_G, EVEN_HD)


@triton.jit
def _split_fma_online_at(qkv, positions, slot, page_table, k_cache, v_cache, k_scale,
                         v_scale, part_ml, part_o, B, MP, PT, H, KVH, HD, NS, SPLIT, scale, sp, BLOCK_N: tl.constexpr,
                         BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr,
                         EVEN_HD: tl.constexpr):
    """GROUPED=3's split ``sp`` of row ``b`` (program ids 0 and 1) for every query head of
    kv head ``kvh`` (``_split_fma_online``)."""
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    G = H // KVH
    if EVEN_HD:  # HD == BLOCK_HD: offsets are visibly multiples of a power of two >= 16
        HD = BLOCK_HD
    d = tl.arange(0, BLOCK_HD)
    md = d < HD
    g = tl.arange(0, BLOCK_G)
    mg = g < G
    s = tl.load(slot + b)
    ctx = tl.load(positions + b) + 1
    lo = sp * SPLIT
    hi = tl.where(s >= 0, tl.minimum(lo + SPLIT, ctx), lo)
    width = (H + 2 * KVH) * HD
    hd0 = b * H + kvh * G  # first (b, h) of this kv head
    q = tl.load(qkv + b * width + (kvh * G + g[:, None]) * HD + d[None, :],
                mask=mg[:, None] & md[None, :], other=0.0) * scale
    row = page_table + tl.maximum(s, 0).to(tl.int64) * MP
    m_i, l_i, acc = _group_online(q, row, lo, hi, k_cache, v_cache, k_scale, v_scale, kvh, d, md, g, PT, KVH,
                                  HD, BLOCK_N, BLOCK_G, EVEN_HD)
    base = (hd0 + g) * NS + sp
    tl.store(part_ml + base * 2, m_i, mask=mg)
    tl.store(part_ml + base * 2 + 1, l_i, mask=mg)
    if EVEN_HD:
        tl.store(part_o + base[:, None] * HD + d[None, :], acc, mask=mg[:, None])
    else:
        tl.store(part_o + base[:, None] * HD + d[None, :], acc, mask=mg[:, None] & md[None, :])


@triton.jit
def _bf16_terms(x):
    """f32 `x` as two bf16 terms ``(hi, lo)``: ``hi = bf16(x)``, ``lo = bf16(x - hi)``,
    both rounded to nearest even (``_split_mma_at``: the queries and probabilities of the
    tensor-core attention bodies)."""
    hi = x.to(tl.bfloat16, fp_downcast_rounding="rtne")
    return hi, (x - hi.to(tl.float32)).to(tl.bfloat16, fp_downcast_rounding="rtne")


@triton.jit
def _group_mma_online(q_hi, q_lo, row, lo, hi, k_cache, v_cache, kvh, d, md, PT, KVH, HD,
                      BLOCK_N: tl.constexpr, BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr,
                      EVEN_HD: tl.constexpr, TERMS: tl.constexpr):
    """Online softmax of the ``[BLOCK_G >= 16, BLOCK_HD]`` scaled queries of kv head
    `kvh`, given as their bf16 terms `q_hi`, `q_lo` (``_bf16_terms``; rows past the group
    zero), over cache positions ``[lo, hi)`` of page-table row `row`, in BLOCK_N-position
    tiles, the dots on the tensor cores: bf16 key/value tiles as stored, queries and
    probabilities in TERMS bf16 terms (``_split_mma_at`` gives the arithmetic and its
    error). The decode body (``_split_mma_at``, GROUPED=4) and the MIXED lane programs
    (``_prefill_lane``, LANE_TERMS > 0) share it. EVEN_HD=1: HD is BLOCK_HD (no head-dim
    masks).

    Returns:
        (``[BLOCK_G]`` running max, ``[BLOCK_G]`` sum of exp, ``[BLOCK_G, BLOCK_HD]``
        unnormalized output), f32; ``(-1e30, 0, 0)`` rows for an empty range.
    """
    m_i = tl.zeros((BLOCK_G,), tl.float32) + NEG_BIG
    l_i = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_HD), tl.float32)
    for j0 in range(lo, hi, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        mj = j < hi
        page = tl.load(row + j // PT, mask=mj, other=0).to(tl.int64)
        off = ((page * PT + j % PT) * KVH + kvh) * HD
        if EVEN_HD:
            mkv = mj[:, None]
        else:
            mkv = mj[:, None] & md[None, :]
        k = tl.load(k_cache + off[:, None] + d[None, :], mask=mkv, other=0.0)
        v = tl.load(v_cache + off[:, None] + d[None, :], mask=mkv, other=0.0)
        kt = tl.trans(k)
        if TERMS == 2:  # the small term first: it is added to the large one's products
            sc = tl.dot(q_hi, kt, tl.dot(q_lo, kt))
        else:
            sc = tl.dot(q_hi, kt)
        sc = tl.where(mj[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        alpha = libdevice.exp(m_i - m_new)
        p = libdevice.exp(sc - m_new[:, None])
        p_hi, p_lo = _bf16_terms(p)  # one term: p_lo is dead code
        if TERMS == 2:
            o = tl.dot(p_hi, v, tl.dot(p_lo, v))
        else:
            o = tl.dot(p_hi, v)
        acc = acc * alpha[:, None] + o
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _split_mma_at(qkv, positions, slot, page_table, k_cache, v_cache, part_ml, part_o, B, MP, PT,
                  H, KVH, HD, NS, SPLIT, scale, sp, BLOCK_N: tl.constexpr,
                  BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr, EVEN_HD: tl.constexpr,
                  TERMS: tl.constexpr):
    """GROUPED=4: split ``sp`` of row ``b`` (program ids 0 and 1) for every query head of
    kv head ``kvh``, the dots on the tensor cores; bf16 planes only.

    The split-K partition, outputs and empty-split contract are ``_split_fma_at``'s:
    positions ``[sp * SPLIT, min(sp * SPLIT + SPLIT, ctx))``; ``part_ml[b, h, sp] =
    (max, sum exp)`` (f32) and the unnormalized ``part_o[b, h, sp, :HD]`` (f32); an empty
    split (or padding row) runs no tile and stores ``(-1e30, 0)`` and zeros. So the merge
    and the partial buffers are unchanged.

    The ``G = H / KVH`` scaled queries of the kv head are the M side of the MMA (FlashInfer's
    GQA tensor-core decode; FlashDecoding's split-K): a ``[BLOCK_G >= 16, BLOCK_HD]`` f32
    tile, rows ``G..`` zero (not stored). Each ``[BLOCK_N, BLOCK_HD]`` key and value tile
    is loaded from its pages as bf16 (no widening) and feeds ``tl.dot`` directly with f32
    accumulation; the split is walked in BLOCK_N-position tiles with an online softmax
    (one pass when SPLIT <= BLOCK_N; ``_group_mma_online``, which the MIXED lane programs
    share). Keys and values are exact bf16 values, but the
    queries and the probabilities are f32: TERMS=2 (the default) splits each into two bf16
    terms, ``q = q_hi + q_lo`` with ``q_hi = bf16(q)``, ``q_lo = bf16(q - q_hi)`` (both
    round to nearest even), scores ``= q_lo K^T + q_hi K^T``, and likewise ``p = p_hi +
    p_lo`` for ``P V``; the sum of exponentials is taken from the f32 ``p``. What the two
    terms leave out is ``q - q_hi - q_lo`` (at most 2**-16 of |q| an element: about 16
    bits of mantissa against f32's 24), so the dots are near, not equal to, the f32 FMA
    bodies'. TERMS=1 keeps ``q_hi`` and ``p_hi`` only (2**-8 of an element: for the
    sweep, to measure what the second term costs; not for serving).

    Measured error against the float64 NumPy evaluation of the same splits over the same
    bf16 keys/values and f32 queries (scripts/interpret_kernels.py ``attnmma``: Triton's
    interpreter, bf16 operands widened exactly, f32 accumulation; standard-normal queries,
    keys/values 2x standard normal rounded to bf16, scale HD**-0.5; H/KVH/HD 32/8/128,
    9/3/64, 6/2/40; one- to four-tile splits): TERMS=2, split maxima within 1.8e-5 (logit
    units; the f32 FMA reference's 9e-7), sums of exponentials and split outputs within
    1.3e-5 relative, the merged output within 3.9e-6 of max |output| (the f32 reference's
    9e-7); TERMS=1: 1.2e-2, 8.6e-3 and 2.6e-3. The tensor cores' own accumulation order
    is not the interpreter's: tests/gpu/test_kv_bf16.py holds the device's bound.
    """
    tl.static_assert(k_cache.dtype.element_ty == tl.bfloat16,
                     "GROUPED=4 (tensor-core decode attention) reads bf16 KV planes only")
    tl.static_assert(BLOCK_G >= 16, "GROUPED=4 pads the query heads to 16 MMA rows at least")
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    G = H // KVH
    if EVEN_HD:  # HD == BLOCK_HD: offsets are visibly multiples of a power of two >= 16
        HD = BLOCK_HD
    d = tl.arange(0, BLOCK_HD)
    md = d < HD
    g = tl.arange(0, BLOCK_G)
    mg = g < G
    if EVEN_HD:
        mo = mg[:, None]
    else:
        mo = mg[:, None] & md[None, :]
    s = tl.load(slot + b)
    ctx = tl.load(positions + b) + 1
    lo = sp * SPLIT
    hi = tl.where(s >= 0, tl.minimum(lo + SPLIT, ctx), lo)
    width = (H + 2 * KVH) * HD
    q = tl.load(qkv + b * width + (kvh * G + g[:, None]) * HD + d[None, :], mask=mo,
                other=0.0) * scale
    q_hi, q_lo = _bf16_terms(q)
    row = page_table + tl.maximum(s, 0).to(tl.int64) * MP
    m_i, l_i, acc = _group_mma_online(q_hi, q_lo, row, lo, hi, k_cache, v_cache, kvh, d, md,
                                      PT, KVH, HD, BLOCK_N, BLOCK_HD, BLOCK_G, EVEN_HD, TERMS)
    base = (b * H + kvh * G + g) * NS + sp
    tl.store(part_ml + base * 2, m_i, mask=mg)
    tl.store(part_ml + base * 2 + 1, l_i, mask=mg)
    tl.store(part_o + base[:, None] * HD + d[None, :], acc, mask=mo)


@triton.jit
def attention_decode_split(qkv, positions, slot, page_table, k_cache, v_cache, part_ml, part_o,
                           B, MP, PT, H, KVH, HD, NS, SPLIT, scale, BLOCK_N: tl.constexpr,
                           BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr, GROUPED: tl.constexpr,
                           EVEN_HD: tl.constexpr = 0, SPP: tl.constexpr = 1,
                           LIVE: tl.constexpr = 0, TERMS: tl.constexpr = 2):
    """Per-split softmax statistics (``attention_decode_split``) over f32 planes:
    ``_split_body``."""
    _split_body(qkv, positions, slot, page_table, k_cache, v_cache, k_cache, v_cache, part_ml,
                part_o, B, MP, PT, H, KVH, HD, NS, SPLIT, scale, BLOCK_N, BLOCK_HD, BLOCK_G,
                GROUPED, EVEN_HD, SPP, LIVE, TERMS)  # f32 planes: no scales


@triton.jit
def _split_body(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml,
                part_o, B, MP, PT, H, KVH, HD, NS, SPLIT, scale, BLOCK_N: tl.constexpr,
                BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr, GROUPED: tl.constexpr,
                EVEN_HD: tl.constexpr = 0, SPP: tl.constexpr = 1, LIVE: tl.constexpr = 0,
                TERMS: tl.constexpr = 2):
    """Per-split softmax statistics (``attention_decode_split``), five layouts:

    GROUPED=1, grid ``(B, KVH, NS)``: the query heads of a kv head form one MMA tile, so
    each cached key/value is read once per kv head (rule v1 for SmolLM2 batch <= 8).
    GROUPED=0, grid ``(B, H, NS)``: one program per query head, f32 FMA dots (rule v1
    otherwise). GROUPED=2, grid ``(B, KVH, NS)``: one program per kv head, the split's
    keys/values loaded once as one tile and reused by every query head with f32 FMA dots,
    empty splits exit after their stores (rule v2; see ``_split_fma``). GROUPED=3, grid
    ``(B, KVH, NS)``: GROUPED=2's tile reuse for splits of any length, the online state
    of every query head of the kv head in registers (see ``_split_fma_online``).
    GROUPED=4, grid ``(B, KVH, NS)`` (bf16 planes only; opt-in, HELIOS_ATTN_MMA): the
    query heads of a kv head padded to BLOCK_G >= 16 rows as the M side of bf16 tensor-core
    dots, queries and probabilities in TERMS bf16 terms (``_split_mma_at``).
    EVEN_HD=1 (HD == BLOCK_HD only) drops the head-dim masks and computes offsets with the
    constant BLOCK_HD, which Triton sees divides them, so cache loads are 128-bit
    (GROUPED=2, 3 and 4 only). SPP (GROUPED=2 only): splits per program, grid
    ``(B, KVH, cdiv(NS, SPP))``; the same results for any SPP. LIVE > 0 (GROUPED 2 without
    SPP, 3 or 4): grid ``(B, KVH, LIVE)``, each program strides over its row's live splits
    only and leaves the outputs of empty splits unwritten (``_split_fma_live``); the same
    results for any LIVE. Swept by bench/gpu_attention_sweep.py, gpu_attention_long.py
    and gpu_attention_live.py.
    """
    if LIVE > 0:
        _split_fma_live(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale,
                        part_ml, part_o, B, MP, PT, H, KVH, HD, NS, SPLIT, scale, BLOCK_N,
                        BLOCK_HD, BLOCK_G, EVEN_HD, GROUPED, LIVE, TERMS)
    elif GROUPED == 4:
        _split_mma_at(qkv, positions, slot, page_table, k_cache, v_cache, part_ml, part_o, B,
                      MP, PT, H, KVH, HD, NS, SPLIT, scale, tl.program_id(2), BLOCK_N,
                      BLOCK_HD, BLOCK_G, EVEN_HD, TERMS)
    elif GROUPED == 3:
        _split_fma_online(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml,
                          part_o, B, MP, PT, H, KVH, HD, NS, SPLIT, scale, BLOCK_N, BLOCK_HD,
                          BLOCK_G, EVEN_HD)
    elif GROUPED == 2:
        _split_fma(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml, part_o,
                   B, MP, PT, H, KVH, HD, NS, SPLIT, scale, BLOCK_N, BLOCK_HD, BLOCK_G,
                   EVEN_HD, SPP)
    elif GROUPED == 1:
        _split_grouped(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml, part_o,
                       B, MP, PT, H, KVH, HD, NS, SPLIT, scale, BLOCK_N, BLOCK_HD, BLOCK_G)
    else:
        _split_per_head(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml, part_o,
                        B, MP, PT, H, KVH, HD, NS, SPLIT, scale, BLOCK_N, BLOCK_HD)


@triton.jit
def _merge(part_ml, part_o, slot, out, b, h, H, HD, NS, count, BLOCK_S: tl.constexpr,
           BLOCK_HD: tl.constexpr, SKIP_EMPTY: tl.constexpr, EVEN_HD: tl.constexpr):
    """Combine splits ``0..count-1`` (of ``NS`` in the layout) of row ``b``, head ``h``."""
    d = tl.arange(0, BLOCK_HD)
    md = d < HD
    si = tl.arange(0, BLOCK_S)
    ms = si < count
    if EVEN_HD:  # HD == BLOCK_HD: offsets are visibly multiples of a power of two >= 16
        HD = BLOCK_HD
    base = (b * H + h) * NS + si
    dst = out + b * (H * HD) + h * HD + d
    obase = base * HD
    s = tl.load(slot + b)
    if s < 0:
        if EVEN_HD:
            tl.store(dst, tl.zeros((BLOCK_HD,), tl.float32))
        else:
            tl.store(dst, tl.zeros((BLOCK_HD,), tl.float32), mask=md)
    else:
        m = tl.load(part_ml + base * 2, mask=ms, other=float("-inf"))
        lsum = tl.load(part_ml + base * 2 + 1, mask=ms, other=0.0)
        w = libdevice.exp(m - tl.max(m, axis=0))
        mo = ms
        if SKIP_EMPTY:
            mo = ms & (lsum != 0.0)
        if EVEN_HD:
            o = tl.load(part_o + obase[:, None] + d[None, :], mask=mo[:, None], other=0.0)
        else:
            o = tl.load(part_o + obase[:, None] + d[None, :], mask=mo[:, None] & md[None, :],
                        other=0.0)
        res = tl.sum(w[:, None] * o, axis=0) / tl.sum(w * lsum, axis=0)
        if EVEN_HD:
            tl.store(dst, res)
        else:
            tl.store(dst, res, mask=md)


@triton.jit
def attention_decode_merge(part_ml, part_o, slot, out, B, H, HD, NS, BLOCK_S: tl.constexpr,
                           BLOCK_HD: tl.constexpr, SKIP_EMPTY: tl.constexpr = 0,
                           EVEN_HD: tl.constexpr = 0):
    """Combine the splits of row ``b``, head ``h`` (zeros for padding); grid ``(B, H)``.

    SKIP_EMPTY=1 does not read the outputs of empty splits (sum of exponentials 0: their
    outputs are zeros by contract), so a short context reads its live splits only.
    EVEN_HD=1 (HD == BLOCK_HD only) drops the head-dim mask and uses the constant BLOCK_HD
    in offsets, for 128-bit accesses.
    """
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    _merge(part_ml, part_o, slot, out, b, h, H, HD, NS, NS, BLOCK_S, BLOCK_HD, SKIP_EMPTY,
           EVEN_HD)


@triton.jit
def attention_decode_split_tuned(qkv, positions, slot, page_table, k_cache, v_cache, part_ml,
                                 part_o, choice, B, MP, PT, H, KVH, HD, NS, SPLIT, scale,
                                 BLOCK_N: tl.constexpr, BLOCK_HD: tl.constexpr,
                                 BLOCK_G: tl.constexpr, GROUPED: tl.constexpr,
                                 EVEN_HD: tl.constexpr = 0):
    """``attention_decode_split_tuned`` over f32 planes: ``_split_tuned_body``."""
    _split_tuned_body(qkv, positions, slot, page_table, k_cache, v_cache, k_cache, v_cache,
                      part_ml, part_o, choice, B, MP, PT, H, KVH, HD, NS, SPLIT, scale,
                      BLOCK_N, BLOCK_HD, BLOCK_G, GROUPED, EVEN_HD)  # f32 planes: no scales


@triton.jit
def _split_tuned_body(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale,
                      part_ml, part_o, choice, B, MP, PT, H, KVH, HD, NS, SPLIT, scale,
                      BLOCK_N: tl.constexpr, BLOCK_HD: tl.constexpr,
                      BLOCK_G: tl.constexpr, GROUPED: tl.constexpr,
                      EVEN_HD: tl.constexpr = 0):
    """``attention_decode_split`` with the split count ``ns = choice[0]`` from the tuned
    buffer: the grid is captured at ``NS`` splits; split ``sp < ns`` covers
    ``ceil(NS * SPLIT / ns)`` positions and programs ``sp >= ns`` exit at once. The layout
    of ``part_ml``/``part_o`` keeps ``NS`` splits (helios_tools.kernels reference)."""
    ns = tl.load(choice)
    if tl.program_id(2) < ns:
        split = (NS * SPLIT + ns - 1) // ns
        if GROUPED == 3:
            _split_fma_online(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml,
                              part_o, B, MP, PT, H, KVH, HD, NS, split, scale, BLOCK_N,
                              BLOCK_HD, BLOCK_G, EVEN_HD)
        elif GROUPED == 2:
            _split_fma(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml, part_o,
                       B, MP, PT, H, KVH, HD, NS, split, scale, BLOCK_N, BLOCK_HD, BLOCK_G,
                       EVEN_HD)
        elif GROUPED == 1:
            _split_grouped(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml,
                           part_o, B, MP, PT, H, KVH, HD, NS, split, scale, BLOCK_N,
                           BLOCK_HD, BLOCK_G)
        else:
            _split_per_head(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml,
                            part_o, B, MP, PT, H, KVH, HD, NS, split, scale, BLOCK_N,
                            BLOCK_HD)


@triton.jit
def attention_decode_merge_tuned(part_ml, part_o, slot, choice, out, B, H, HD, NS,
                                 BLOCK_S: tl.constexpr, BLOCK_HD: tl.constexpr,
                                 SKIP_EMPTY: tl.constexpr = 0, EVEN_HD: tl.constexpr = 0):
    """``attention_decode_merge`` of the first ``choice[0]`` splits; grid ``(B, H)``."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    _merge(part_ml, part_o, slot, out, b, h, H, HD, NS, tl.load(choice), BLOCK_S, BLOCK_HD,
           SKIP_EMPTY, EVEN_HD)


@triton.jit
def attention_decode_fused(qkv, positions, slot, page_table, k_cache, v_cache, part_ml, part_o,
                           arrivals, out, B, MP, PT, H, KVH, HD, NS, SPLIT, scale,
                           BLOCK_N: tl.constexpr, BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr,
                           BLOCK_S: tl.constexpr, EVEN_HD: tl.constexpr):
    """``attention_decode_fused`` over f32 planes: ``_fused_body``."""
    _fused_body(qkv, positions, slot, page_table, k_cache, v_cache, k_cache, v_cache, part_ml,
                part_o, arrivals, out, B, MP, PT, H, KVH, HD, NS, SPLIT, scale, BLOCK_N,
                BLOCK_HD, BLOCK_G, BLOCK_S, EVEN_HD)  # f32 planes: no scales


@triton.jit
def _fused_body(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml,
                part_o, arrivals, out, B, MP, PT, H, KVH, HD, NS, SPLIT, scale,
                BLOCK_N: tl.constexpr, BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr,
                BLOCK_S: tl.constexpr, EVEN_HD: tl.constexpr):
    """``attention_decode_split`` + ``attention_decode_merge`` in one launch; grid
    ``(B, KVH, NS)``, one program per (row, kv head, split) as GROUPED=3.

    Row ``b`` has ``n = ceil(ctx / SPLIT)`` live splits. ``n == 1``: split 0 normalizes
    and writes ``out`` itself (no partials). ``n > 1``: each live split stores its
    partials, then counts itself in ``arrivals[b, kvh]`` (every thread fences its stores
    at GPU scope, a block barrier, then one acquire-release atomic: its stores are visible
    to whoever sees the count); the program
    that brings the count to ``n`` resets it to 0 and merges splits ``0..n-1`` of every
    query head of the kv head in that fixed order, reading the partials past L1. Which
    program merges varies, what it computes does not: the result is bitwise the same from
    launch to launch and independent of the other rows (the split-K "last block"
    reduction, Stream-K's fix-up without the spin). Empty splits exit at once; a padding
    row's split 0 writes zeros. `arrivals` must be zero before a launch and is zero after.
    """
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    G = H // KVH
    if EVEN_HD:  # HD == BLOCK_HD: offsets are visibly multiples of a power of two >= 16
        HD = BLOCK_HD
    d = tl.arange(0, BLOCK_HD)
    md = d < HD
    g = tl.arange(0, BLOCK_G)
    mg = g < G
    mo = mg[:, None] & md[None, :]
    s = tl.load(slot + b)
    ctx = tl.load(positions + b) + 1
    # (at most NS: a position past NS * SPLIT is misuse, but must not leave a counter
    # that never reaches its count)
    n = tl.where(s >= 0, tl.minimum((ctx + SPLIT - 1) // SPLIT, NS), 0)
    hd0 = b * H + kvh * G  # first (b, h) of this kv head
    dst = out + b * (H * HD) + (kvh * G + g[:, None]) * HD + d[None, :]
    if s < 0:
        if sp == 0:
            tl.store(dst, tl.zeros((BLOCK_G, BLOCK_HD), tl.float32), mask=mo)
    elif sp < n:
        lo = sp * SPLIT
        hi = tl.minimum(lo + SPLIT, ctx)
        width = (H + 2 * KVH) * HD
        qb = b * width + kvh * G * HD
        row = page_table + s.to(tl.int64) * MP
        if SPLIT <= BLOCK_N:  # one tile, loaded once, every query head from registers
            j = lo + tl.arange(0, BLOCK_N)
            mj = j < hi
            page = tl.load(row + j // PT, mask=mj, other=0).to(tl.int64)
            off = ((page * PT + j % PT) * KVH + kvh) * HD
            if EVEN_HD:
                k = _kv_load(k_cache, off[:, None] + d[None, :], mj[:, None], k_scale, kvh)
                v = _kv_load(v_cache, off[:, None] + d[None, :], mj[:, None], v_scale, kvh)
            else:
                mkv = mj[:, None] & md[None, :]
                k = _kv_load(k_cache, off[:, None] + d[None, :], mkv, k_scale, kvh)
                v = _kv_load(v_cache, off[:, None] + d[None, :], mkv, v_scale, kvh)
            for gi in tl.static_range(BLOCK_G):
                if gi < G:
                    m, lsum, o = _fma_head(qkv, k, v, mj, qb + gi * HD, d, md, scale,
                                           EVEN_HD)
                    if n == 1:
                        tl.store(out + b * (H * HD) + (kvh * G + gi) * HD + d, o / lsum,
                                 mask=md)
                    else:
                        hb = (hd0 + gi) * NS + sp
                        tl.store(part_ml + hb * 2, m)
                        tl.store(part_ml + hb * 2 + 1, lsum)
                        tl.store(part_o + hb * HD + d, o, mask=md)
        else:  # a longer split: GROUPED=3's walk
            q = tl.load(qkv + qb + g[:, None] * HD + d[None, :], mask=mo, other=0.0) * scale
            m_i, l_i, acc = _group_online(q, row, lo, hi, k_cache, v_cache, k_scale, v_scale, kvh, d, md, g, PT,
                                          KVH, HD, BLOCK_N, BLOCK_G, EVEN_HD)
            if n == 1:
                tl.store(dst, acc / tl.where(mg, l_i, 1.0)[:, None], mask=mo)
            else:
                base = (hd0 + g) * NS + sp
                tl.store(part_ml + base * 2, m_i, mask=mg)
                tl.store(part_ml + base * 2 + 1, l_i, mask=mg)
                tl.store(part_o + base[:, None] * HD + d[None, :], acc, mask=mo)
        if n > 1:
            # Each thread fences its own partial stores at GPU scope (a barrier orders
            # them within the block only; thread 0's release below is not enough for
            # another warp's stores still in flight), then one thread counts the split.
            tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.b32 $0, $1;", "=r,r", [sp],
                                      dtype=tl.int32, is_pure=False, pack=1)
            tl.debug_barrier()
            counter = arrivals + b * KVH + kvh
            if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == n - 1:
                tl.debug_barrier()
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
                si = tl.arange(0, BLOCK_S)
                ms = si < n
                for gi in tl.static_range(BLOCK_G):
                    if gi < G:
                        hb = (hd0 + gi) * NS + si
                        m = tl.load(part_ml + hb * 2, mask=ms, other=float("-inf"),
                                    cache_modifier=".cg")
                        lsum = tl.load(part_ml + hb * 2 + 1, mask=ms, other=0.0,
                                       cache_modifier=".cg")
                        w = libdevice.exp(m - tl.max(m, axis=0))
                        o = tl.load(part_o + hb[:, None] * HD + d[None, :],
                                    mask=ms[:, None] & md[None, :], other=0.0,
                                    cache_modifier=".cg")
                        res = tl.sum(w[:, None] * o, axis=0) / tl.sum(w * lsum, axis=0)
                        tl.store(out + b * (H * HD) + (kvh * G + gi) * HD + d, res, mask=md)
