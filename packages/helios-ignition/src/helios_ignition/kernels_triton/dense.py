"""Triton kernels for the dense ops: embedding, norms, linear (and its fused forms), SwiGLU,
add, gather_last.

Each kernel implements its NumPy reference in ``helios_tools.kernels`` exactly (same
parameters in the same order: buffers, then scalars); the trailing ``tl.constexpr``
parameters are the variant constants ``capture.launch.launch_config`` chooses. Rows are
programs: ``program_id(0)`` is a token row unless the docstring says otherwise.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def embedding(ids, table, out, T, D, BLOCK_D: tl.constexpr, VOCAB: tl.constexpr,
              WBF16: tl.constexpr):
    """``out[t] = table[ids[t]]``, zeros for an id outside ``[0, VOCAB)``; grid ``(T,)``.

    The reference reads V from the table's shape; here it is the variant constant VOCAB.
    """
    t = tl.program_id(0)
    tok = tl.load(ids + t)
    d = tl.arange(0, BLOCK_D)
    md = d < D
    ok = (tok >= 0) & (tok < VOCAB)
    row = table + tl.where(ok, tok, 0).to(tl.int64) * D
    x = tl.load(row + d, mask=md & ok, other=0.0).to(tl.float32)
    tl.store(out + t.to(tl.int64) * D + d, x, mask=md)


@triton.jit
def _rms_row(r, w, out_row, d, md, D, eps):
    ms = tl.sum(r * r, axis=0) / D
    inv = tl.math.div_rn(1.0, tl.math.sqrt_rn(ms + eps))
    g = tl.load(w + d, mask=md, other=0.0)
    tl.store(out_row + d, r * inv * g, mask=md)


@triton.jit
def rmsnorm(x, weight, out, T, D, eps, BLOCK_D: tl.constexpr):
    """``out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight``; grid ``(T,)``."""
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    md = d < D
    r = tl.load(x + t * D + d, mask=md, other=0.0)
    _rms_row(r, weight, out + t * D, d, md, D, eps)


@triton.jit
def add_rmsnorm(x, residual, weight, out, T, D, eps, BLOCK_D: tl.constexpr):
    """``residual[t] += x[t]; out[t] = rmsnorm(residual[t])``; grid ``(T,)``."""
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    md = d < D
    r = tl.load(residual + t * D + d, mask=md, other=0.0)
    r = r + tl.load(x + t * D + d, mask=md, other=0.0)
    tl.store(residual + t * D + d, r, mask=md)
    _rms_row(r, weight, out + t * D, d, md, D, eps)


@triton.jit
def _split_bf16(a):
    """``a = hi + lo`` in two bf16 terms (about 16 mantissa bits of the f32 ``a``)."""
    hi = a.to(tl.bfloat16)
    return hi, (a - hi.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def _silu(g):
    return tl.math.div_rn(g, 1.0 + tl.extra.cuda.libdevice.exp(-g))


@triton.jit
def _load_act(ptrs, mask, K, SWIGLU: tl.constexpr):
    """Activation elements at `ptrs`; with SWIGLU, ``silu(gate) * up`` where up lies K
    elements after gate (the ``silu_mul`` arithmetic)."""
    a = tl.load(ptrs, mask=mask, other=0.0)
    if SWIGLU:
        a = _silu(a) * tl.load(ptrs + K, mask=mask, other=0.0)
    return a


@triton.jit
def _rms_inv_row(xrow, K, eps, BLOCK_K: tl.constexpr):
    """Reciprocal RMS of one K-wide row, as ``rmsnorm`` computes it."""
    offs = tl.arange(0, BLOCK_K)
    ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs
        a = tl.load(xrow + kk, mask=kk < K, other=0.0)
        ss += a * a
    return tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.sum(ss, axis=0) / K + eps))


@triton.jit
def _rms_inv_rows(x_rows, mt, K, eps, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
    """Reciprocal RMS ``[BLOCK_T]`` of each row of a ``[BLOCK_T, 1]`` block of row
    pointers (``mt``: live rows; dead rows read zeros)."""
    offs = tl.arange(0, BLOCK_K)
    ss = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs
        a = tl.load(x_rows + kk[None, :], mask=mt[:, None] & (kk < K)[None, :], other=0.0)
        ss += a * a
    return tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.sum(ss, axis=1) / K + eps))


@triton.jit
def _store_out(dst, acc, mask, ACC: tl.constexpr):
    """Store the product, or with ACC add it to what ``dst`` holds (residual epilogue)."""
    if ACC:
        acc = tl.load(dst, mask=mask, other=0.0) + acc
    tl.store(dst, acc, mask=mask)


@triton.jit
def _load_w(ptrs, mask, EVICT: tl.constexpr):
    """A weight tile; EVICT=1 marks it evict-first (each weight byte is read once per
    step, so it should not push the activations and partial sums out of L2)."""
    if EVICT:
        w = tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
    else:
        w = tl.load(ptrs, mask=mask, other=0.0)
    return w


@triton.jit
def _gemv_stream(xrow, norm_weight, weight, out_row, N, K, inv1, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, SWIGLU: tl.constexpr, ACC: tl.constexpr,
                 NORM: tl.constexpr, PRE: tl.constexpr, EVICT: tl.constexpr):
    """One token row's GEMV as a flat loop over (row tile, K step) pairs: tile ``pid +
    i * programs`` for ``i = 0, 1, ...`` (a persistent grid when the launch has fewer
    programs than tiles: ``PERSIST`` in the launch rule), K steps in order within each.
    PRE=1 issues the next pair's weight load before reducing the current one (a register
    double buffer across K steps and tiles, so a program always has a load in flight).
    Each output is the same sum as the plain GEMV's (K steps in order, one tile per
    program at a time), written once by one program."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    nk = tl.cdiv(K, BLOCK_K)
    mine = (tl.cdiv(N, BLOCK_N) - pid + G - 1) // G
    total = mine * nk
    rows = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if PRE:
        n0 = pid * BLOCK_N + rows
        w_next = _load_w(weight + n0[:, None].to(tl.int64) * K + offs_k[None, :],
                         (n0 < N)[:, None] & (offs_k < K)[None, :] & (total > 0), EVICT)
    for j in range(0, total):
        tile = pid + (j // nk) * G
        kk = (j % nk) * BLOCK_K + offs_k
        mk = kk < K
        nc = tile * BLOCK_N + rows
        mc = nc < N
        if PRE:
            w = w_next
            jn = j + 1
            nn = (pid + (jn // nk) * G) * BLOCK_N + rows
            kn = (jn % nk) * BLOCK_K + offs_k
            w_next = _load_w(weight + nn[:, None].to(tl.int64) * K + kn[None, :],
                             (nn < N)[:, None] & (kn < K)[None, :] & (jn < total), EVICT)
        else:
            w = _load_w(weight + nc[:, None].to(tl.int64) * K + kk[None, :],
                        mc[:, None] & mk[None, :], EVICT)
        a = _load_act(xrow + kk, mk, K, SWIGLU)
        if NORM:
            a = a * inv1 * tl.load(norm_weight + kk, mask=mk, other=0.0)
        acc += tl.sum(w.to(tl.float32) * a[None, :], axis=1)
        last = (j % nk) == nk - 1
        _store_out(out_row + nc, acc, mc & last, ACC)
        acc = tl.where(last, 0.0, acc)


@triton.jit
def _kmask(rows_ok, kk, K, EVEN_K: tl.constexpr):
    """Tile mask: live rows, and columns below K unless EVEN_K says K is a multiple of
    BLOCK_K (slices end on K steps, so only K itself cuts one). A mask constant along K
    lets Triton vectorize the loads (16 bytes a thread) and stage them with cp.async."""
    if EVEN_K:
        m = rows_ok[:, None] & (kk >= 0)[None, :]
    else:
        m = rows_ok[:, None] & (kk < K)[None, :]
    return m


@triton.jit
def _tc_tile(tile, T, N, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_T: tl.constexpr):
    """(token tile, column tile) of output tile number `tile`: tiles run column by column
    within groups of GROUP_T token tiles, so the programs in flight share a few activation
    row tiles and each weight tile is read from HBM about once per group."""
    nn = tl.cdiv(N, BLOCK_N)
    width = GROUP_T * nn
    first = (tile // width) * GROUP_T
    size = tl.minimum(tl.cdiv(T, BLOCK_T) - first, GROUP_T)
    return first + (tile % width) % size, (tile % width) // size


@triton.jit
def _linear_tc(x, norm_weight, weight, out, T, N, K, eps, BLOCK_T: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WBF16: tl.constexpr,
               XSPLIT: tl.constexpr, NORM: tl.constexpr, ACC: tl.constexpr,
               GROUP_T: tl.constexpr, TMA: tl.constexpr, EVEN_K: tl.constexpr):
    """The prefill tile path (``TC=1``): one ``BLOCK_T x BLOCK_N`` output tile per
    iteration, tiles ``pid, pid + programs, ...`` (a persistent grid when the launch has
    fewer programs than tiles) in ``_tc_tile``'s grouped order; the K loop is left to
    Triton's pipeliner (``STAGES`` deep: cp.async, or with TMA=1 tensor-memory copies
    through device-side descriptors, which take global scratch) so both operands reach
    the wgmma from shared memory. The f32 activation tile becomes bf16 in registers:
    ``hi`` only (XSPLIT=0: one MMA, activations rounded to bf16) or ``hi`` and ``lo``
    (XSPLIT=1: two MMAs on the same weight tile, about 16 mantissa bits). NORM=1
    accumulates each row's sum of squares in the same loop and scales the finished tile
    by its reciprocal RMS (``x * inv * gain`` reassociated as ``(x * gain) @ w * inv``),
    so the fold costs no second pass over the rows."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    tiles = tl.cdiv(T, BLOCK_T) * tl.cdiv(N, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    if TMA:
        xd = tl.make_tensor_descriptor(x, shape=[T, K], strides=[K, 1],
                                       block_shape=[BLOCK_T, BLOCK_K])
        wd = tl.make_tensor_descriptor(weight, shape=[N, K], strides=[K, 1],
                                       block_shape=[BLOCK_N, BLOCK_K])
    for tile in range(pid, tiles, G):
        pt, pn = _tc_tile(tile, T, N, BLOCK_T, BLOCK_N, GROUP_T)
        offs_t = pt * BLOCK_T + tl.arange(0, BLOCK_T)
        offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        mt = offs_t < T
        mn = offs_n < N
        x_rows = x + offs_t[:, None].to(tl.int64) * K
        w_rows = weight + offs_n[:, None].to(tl.int64) * K
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        ss = tl.zeros((BLOCK_T,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            if TMA:
                a = xd.load([pt * BLOCK_T, k0])
                w = wd.load([pn * BLOCK_N, k0])
            else:
                a = tl.load(x_rows + kk[None, :], mask=_kmask(mt, kk, K, EVEN_K), other=0.0)
                w = tl.load(w_rows + kk[None, :], mask=_kmask(mn, kk, K, EVEN_K), other=0.0)
            if NORM:
                ss += tl.sum(a * a, axis=1)
                a = a * tl.load(norm_weight + kk, mask=kk < K, other=0.0)[None, :]
            wt = tl.trans(w)
            if WBF16:
                hi = a.to(tl.bfloat16)
                acc = tl.dot(hi, wt, acc)
                if XSPLIT:
                    acc = tl.dot((a - hi.to(tl.float32)).to(tl.bfloat16), wt, acc)
            else:
                acc = tl.dot(a, wt, acc, input_precision="ieee")
        if NORM:
            acc = acc * tl.math.div_rn(1.0, tl.math.sqrt_rn(ss / K + eps))[:, None]
        dst = out + offs_t[:, None].to(tl.int64) * N + offs_n[None, :]
        _store_out(dst, acc, mt[:, None] & mn[None, :], ACC)


@triton.jit
def _linear_body(x, norm_weight, weight, out, T, N, K, eps, BLOCK_T: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WBF16: tl.constexpr,
                 K16: tl.constexpr, SWAP: tl.constexpr, PREFETCH: tl.constexpr,
                 XSPLIT: tl.constexpr, STACK: tl.constexpr, FMA: tl.constexpr,
                 SWIGLU: tl.constexpr, ACC: tl.constexpr, NORM: tl.constexpr,
                 PERSIST: tl.constexpr = 0, PRE: tl.constexpr = 0, EVICT: tl.constexpr = 0,
                 TC: tl.constexpr = 0, GROUP_T: tl.constexpr = 8, TMA: tl.constexpr = 0,
                 EVEN_K: tl.constexpr = 0):
    """The body of every linear entry: ``linear`` (NORM=0, ACC=0) and its fused forms.
    NORM=1 scales each activation row by its reciprocal RMS (over its K features) and
    ``norm_weight`` as it is loaded (op ``rmsnorm_linear``). PERSIST / PRE / EVICT are
    GEMV (``BLOCK_T == 1``) constants: see ``_gemv_stream``; TC / GROUP_T / TMA / EVEN_K
    are the prefill tile path's: see ``_linear_tc``."""
    pid_n = tl.program_id(0)
    pid_t = tl.program_id(1)
    if K16:
        K = tl.multiple_of(K, 16)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mn = offs_n < N
    w_rows = weight + offs_n[:, None].to(tl.int64) * K
    if SWIGLU:
        x_stride = 2 * K
    else:
        x_stride = K
    if TC:
        _linear_tc(x, norm_weight, weight, out, T, N, K, eps, BLOCK_T, BLOCK_N, BLOCK_K, WBF16,
                   XSPLIT, NORM, ACC, GROUP_T, TMA, EVEN_K)
    elif FMA:
        # Few rows: one weight tile in registers serves every row ([T, N, K] products
        # reduced over K), f32 FMA like the GEMV below.
        offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        mt = offs_t < T
        x_rows = x + offs_t[:, None].to(tl.int64) * x_stride
        acc_f = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        if NORM:
            inv_t = _rms_inv_rows(x_rows, mt, K, eps, BLOCK_T, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            mk = kk < K
            a = _load_act(x_rows + kk[None, :], mt[:, None] & mk[None, :], K, SWIGLU)
            if NORM:
                a = a * inv_t[:, None] * tl.load(norm_weight + kk, mask=mk, other=0.0)[None, :]
            w = tl.load(w_rows + kk[None, :], mask=mn[:, None] & mk[None, :], other=0.0)
            acc_f += tl.sum(a[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
        dst = out + offs_t[:, None].to(tl.int64) * N + offs_n[None, :]
        _store_out(dst, acc_f, mt[:, None] & mn[None, :], ACC)
    elif BLOCK_T == 1:
        # GEMV (one token row): each program streams a BLOCK_N x K slab in as few rounds
        # as possible (BLOCK_K covers K when it fits) and reduces on the FMA units.
        xrow = x + pid_t.to(tl.int64) * x_stride
        acc1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
        if NORM:
            inv1 = _rms_inv_row(xrow, K, eps, BLOCK_K)
        else:
            inv1 = 1.0
        if PERSIST or PRE:
            _gemv_stream(xrow, norm_weight, weight, out + pid_t.to(tl.int64) * N, N, K, inv1,
                         BLOCK_N, BLOCK_K, SWIGLU, ACC, NORM, PRE, EVICT)
        else:
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + offs_k
                mk = kk < K
                a = _load_act(xrow + kk, mk, K, SWIGLU)
                if NORM:
                    a = a * inv1 * tl.load(norm_weight + kk, mask=mk, other=0.0)
                w = _load_w(w_rows + kk[None, :], mn[:, None] & mk[None, :], EVICT)
                acc1 += tl.sum(w.to(tl.float32) * a[None, :], axis=1)
            _store_out(out + pid_t.to(tl.int64) * N + offs_n, acc1, mn, ACC)
    elif SWAP:
        # Skinny GEMM with A and B swapped: out^T = W x^T. The weight tile is the MMA's
        # M operand straight from a (pipelined) load; the few token rows are its N.
        offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        mt = offs_t < T
        x_cols = x + offs_t[None, :].to(tl.int64) * K
        if NORM:
            inv_s = _rms_inv_rows(x + offs_t[:, None].to(tl.int64) * K, mt, K, eps, BLOCK_T,
                                  BLOCK_K)
        if STACK and WBF16 and XSPLIT:
            acc_s = tl.zeros((BLOCK_N, 2 * BLOCK_T), dtype=tl.float32)  # [n, (hi|lo, t)]
        else:
            acc_s = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            mk = kk < K
            w = tl.load(w_rows + kk[None, :], mask=mn[:, None] & mk[None, :], other=0.0)
            a = tl.load(x_cols + kk[:, None], mask=mk[:, None] & mt[None, :], other=0.0)
            if NORM:
                a = a * inv_s[None, :] * tl.load(norm_weight + kk, mask=mk, other=0.0)[:, None]
            if WBF16:
                hi, lo = _split_bf16(a)
                if not XSPLIT:
                    acc_s = tl.dot(w, hi, acc_s)
                elif STACK:
                    hl = tl.reshape(tl.permute(tl.join(hi, lo), (0, 2, 1)),
                                    (BLOCK_K, 2 * BLOCK_T))
                    acc_s = tl.dot(w, hl, acc_s)
                else:
                    acc_s = tl.dot(w, hi, acc_s)
                    acc_s = tl.dot(w, lo, acc_s)
            else:
                acc_s = tl.dot(w, a, acc_s, input_precision="ieee")
        if STACK and WBF16 and XSPLIT:
            acc_t = tl.sum(tl.reshape(acc_s, (BLOCK_N, 2, BLOCK_T)), axis=1)
        else:
            acc_t = acc_s
        dst = out + offs_t[None, :].to(tl.int64) * N + offs_n[:, None]
        _store_out(dst, acc_t, mn[:, None] & mt[None, :], ACC)
    else:
        offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        mt = offs_t < T
        x_rows = x + offs_t[:, None].to(tl.int64) * K
        if NORM:
            inv_m = _rms_inv_rows(x_rows, mt, K, eps, BLOCK_T, BLOCK_K)
        if STACK and WBF16 and XSPLIT:
            acc_s = tl.zeros((2 * BLOCK_T, BLOCK_N), dtype=tl.float32)  # [(hi|lo, t), n]
        else:
            acc_s = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        # The activation tile is converted in registers; PREFETCH=1 loads the next one by
        # hand, PREFETCH=0 lets Triton pipeline it with the weight's.
        a_next = tl.load(x_rows + offs_k[None, :], mask=mt[:, None] & (offs_k < K)[None, :],
                         other=0.0)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            mk = kk < K
            if PREFETCH:
                a = a_next
                kn = kk + BLOCK_K
                a_next = tl.load(x_rows + kn[None, :], mask=mt[:, None] & (kn < K)[None, :],
                                 other=0.0)
            else:
                a = tl.load(x_rows + kk[None, :], mask=mt[:, None] & mk[None, :], other=0.0)
            if NORM:
                a = a * inv_m[:, None] * tl.load(norm_weight + kk, mask=mk, other=0.0)[None, :]
            w = tl.load(w_rows + kk[None, :], mask=mn[:, None] & mk[None, :], other=0.0)
            if WBF16:
                hi, lo = _split_bf16(a)
                wt = tl.trans(w)
                if not XSPLIT:
                    acc_s = tl.dot(hi, wt, acc_s)
                elif STACK:
                    hl = tl.reshape(tl.permute(tl.join(hi, lo), (2, 0, 1)),
                                    (2 * BLOCK_T, BLOCK_K))
                    acc_s = tl.dot(hl, wt, acc_s)
                else:
                    acc_s = tl.dot(hi, wt, acc_s)
                    acc_s = tl.dot(lo, wt, acc_s)
            else:
                acc_s = tl.dot(a, tl.trans(w), acc_s, input_precision="ieee")
        if STACK and WBF16 and XSPLIT:
            acc = tl.sum(tl.reshape(acc_s, (2, BLOCK_T, BLOCK_N)), axis=0)
        else:
            acc = acc_s
        dst = out + offs_t[:, None].to(tl.int64) * N + offs_n[None, :]
        _store_out(dst, acc, mt[:, None] & mn[None, :], ACC)




@triton.jit
def linear(x, weight, out, T, N, K, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_K: tl.constexpr, WBF16: tl.constexpr, K16: tl.constexpr,
           SWAP: tl.constexpr = 0, PREFETCH: tl.constexpr = 1, XSPLIT: tl.constexpr = 1,
           STACK: tl.constexpr = 0, FMA: tl.constexpr = 0, SWIGLU: tl.constexpr = 0,
           ACC: tl.constexpr = 0, PERSIST: tl.constexpr = 0, PRE: tl.constexpr = 0,
           EVICT: tl.constexpr = 0, TC: tl.constexpr = 0, GROUP_T: tl.constexpr = 8,
           TMA: tl.constexpr = 0, EVEN_K: tl.constexpr = 0):
    """``out[t, n] = sum_k x[t, k] * weight[n, k]``; grid ``(cdiv(N, BLOCK_N), cdiv(T, BLOCK_T))``.

    Reference loop (``helios_tools.kernels.linear``)::

        for t in range(T):
            for n in range(N):
                out[t, n] = sum(x[t, k] * weight[n, k] for k in range(K))

    ``BLOCK_T == 1`` (batch-1 decode) is a pure GEMV: one program per ``BLOCK_N`` rows
    (grid ``(cdiv(N, BLOCK_N), T)``), the whole K in one or a few wide loads.

    Decode GEMV and prefill GEMM in one kernel: each program streams a ``BLOCK_N x K``
    slab of the weight once for ``BLOCK_T`` token rows (wide tiles, many programs, so
    the weight read saturates HBM). bf16 weights are exact in bf16, so the f32
    activations are split into two bf16 terms (``x = hi + lo``, about 16 mantissa bits)
    and multiplied on the tensor cores with f32 accumulation: near-f32 accuracy at bf16
    tensor-core speed (``XSPLIT=0`` keeps only ``hi``: about 3 significant digits). f32
    weights use IEEE f32 dots.

    Variant constants of the multi-row path: ``PREFETCH=1`` loads the next activation
    tile by hand (which stops Triton from pipelining the loop: no ``cp.async`` stages);
    ``PREFETCH=0`` leaves both loads to Triton's pipeliner (``STAGES`` deep).
    ``STACK=1`` stacks ``hi`` over ``lo`` into one ``2*BLOCK_T``-row operand (one MMA
    per K step instead of two; 32 token rows then fill a 64-row wgmma) and adds the two
    halves of the accumulator at the end. ``FMA=1`` (a few token rows, small-batch
    decode) is the GEMV generalised: each weight tile is loaded once and applied to all
    ``BLOCK_T`` rows on the FMA units in f32, so the weight stream runs at GEMV speed
    and the result is as exact as the GEMV's. ``SWIGLU=1`` (GEMV and FMA paths only) is
    the op ``swiglu_linear``: ``x`` is ``[T, 2K]`` gate|up and each activation element is
    ``silu(gate) * up`` computed as it is loaded (the ``silu_mul`` kernel's arithmetic).
    ``ACC=1`` (ops ``linear_add`` / ``swiglu_linear_add``) adds the product into
    ``out`` (the residual add in the epilogue: each output is read and written by the one
    program that computes it). GEMV constants (``BLOCK_T == 1``; ``launch.gemv_constants``):
    ``PERSIST`` (the launch has at most PERSIST x 132 programs, each looping over row
    tiles ``pid, pid + programs, ...``), ``PRE=1`` (the next weight tile is loaded before
    the current one is reduced) and ``EVICT=1`` (evict-first weight loads); each output's
    sum is the same as without them (K steps in order). ``TC=1`` (prefill rows, bf16
    weights; ``launch.prefill_tc``) is the tile path of ``_linear_tc`` on a 1-D grid:
    ``GROUP_T`` token tiles per group, ``TMA=1`` tensor-memory loads, ``EVEN_K=1`` when
    ``BLOCK_K`` divides K, ``XSPLIT`` as above. Every variant is deterministic
    (each output is written once, in a fixed reduction order that depends on the
    constants and the shape, never on the other rows or the grid).
    """
    _linear_body(x, weight, weight, out, T, N, K, 0.0, BLOCK_T, BLOCK_N, BLOCK_K, WBF16, K16,
                 SWAP, PREFETCH, XSPLIT, STACK, FMA, SWIGLU, ACC, 0, PERSIST, PRE, EVICT,
                 TC, GROUP_T, TMA, EVEN_K)


@triton.jit
def rmsnorm_linear(x, norm_weight, weight, out, T, N, K, eps, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_K: tl.constexpr, WBF16: tl.constexpr, K16: tl.constexpr,
           SWAP: tl.constexpr = 0, PREFETCH: tl.constexpr = 1, XSPLIT: tl.constexpr = 1,
           STACK: tl.constexpr = 0, FMA: tl.constexpr = 0, SWIGLU: tl.constexpr = 0,
           ACC: tl.constexpr = 0, PERSIST: tl.constexpr = 0, PRE: tl.constexpr = 0,
           EVICT: tl.constexpr = 0, TC: tl.constexpr = 0, GROUP_T: tl.constexpr = 8,
           TMA: tl.constexpr = 0, EVEN_K: tl.constexpr = 0):
    """``out = rmsnorm(x; norm_weight, eps) @ weight^T`` (op ``rmsnorm_linear``): the
    ``linear`` kernel with each program recomputing the reciprocal RMS of its activation
    rows in a prologue (``rmsnorm``'s arithmetic: ``x * inv * gain``); same grid and
    variant constants as ``linear``. Saves the norm's launch; the normalized rows are
    never stored."""
    _linear_body(x, norm_weight, weight, out, T, N, K, eps, BLOCK_T, BLOCK_N, BLOCK_K, WBF16,
                 K16, SWAP, PREFETCH, XSPLIT, STACK, FMA, SWIGLU, ACC, 1, PERSIST, PRE, EVICT,
                 TC, GROUP_T, TMA, EVEN_K)


@triton.jit
def silu_mul(gate_up, out, T, F, BLOCK: tl.constexpr):
    """``out[t, f] = silu(gate_up[t, f]) * gate_up[t, F + f]``; grid ``(T, cdiv(F, BLOCK))``."""
    t = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = f < F
    g = tl.load(gate_up + t * 2 * F + f, mask=m, other=0.0)
    u = tl.load(gate_up + t * 2 * F + F + f, mask=m, other=0.0)
    tl.store(out + t * F + f, _silu(g) * u, mask=m)


@triton.jit
def add(a, b, out, T, D, BLOCK: tl.constexpr):
    """``out = a + b`` over ``[T, D]``; grid ``(T, cdiv(D, BLOCK))``."""
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = d < D
    va = tl.load(a + t * D + d, mask=m, other=0.0)
    vb = tl.load(b + t * D + d, mask=m, other=0.0)
    tl.store(out + t * D + d, va + vb, mask=m)


@triton.jit
def gather_last(x, query_length, out, T, R, D, BLOCK_D: tl.constexpr):
    """``out[r] = x[last packed token of row r]`` (zeros for an empty row); grid ``(R,)``.

    The row's end is the running sum of ``max(query_length, 0)`` over rows ``0..r``.
    """
    r = tl.program_id(0)
    end = 0
    for i in range(0, r + 1):
        end += tl.maximum(tl.load(query_length + i), 0)
    n = tl.maximum(tl.load(query_length + r), 0)
    last = (end - 1).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    md = d < D
    ok = (n > 0) & (last < T)
    v = tl.load(x + last * D + d, mask=md & ok, other=0.0)
    tl.store(out + r.to(tl.int64) * D + d, v, mask=md)
