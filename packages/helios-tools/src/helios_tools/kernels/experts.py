"""Mixture-of-experts kernels: the router's top-k and the experts as grouped matrix products
(Qwen3-MoE's sparse block, HF ``Qwen3MoeSparseMoeBlock``; Shazeer et al. 2017).

One token row t routes to K of E experts; each of its K (token, expert) *pairs* (pair
index ``p = t * K + k``) runs expert ``ids[t, k]``'s SwiGLU MLP on ``x[t]`` and the K
results are summed, weighted by the router's normalized probabilities:

    y[t] = sum_k weights[t, k] * down_e(silu(gate_e(x[t])) * up_e(x[t])),  e = ids[t, k]

The products are grouped by expert so each active expert's weights are read once per step
(the grouped GEMM of MegaBlocks, arXiv:2211.15841, and vLLM's fused MoE): ``moe_align``
lists the pairs of each expert in blocks of BT rows (the expert's pairs in ascending pair
order, its last block padded with -1), ``moe_gate_up`` and ``moe_down`` run one block of
one expert per program, and ``moe_sum`` adds each token's K weighted pair rows in order
k = 0..K-1 (no atomics: the sum is deterministic). Each pair's result depends on its own
row alone, never on which other pairs share its block (here one BLAS GEMV per pair, as
``linear_invariant``; on the GPU every output of a block's tile sums over the same K
steps), so decode and speculative verification agree bit for bit. Stacked expert weights:
``w_gate_up`` ``[E, 2F, D]`` (expert e's gate rows, then its up rows) and ``w_down``
``[E, D, F]``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .elementwise import silu_mul


def moe_blocks(T: int, E: int, K: int, BT: int) -> int:
    """Blocks ``moe_align`` may fill for T rows: every pair in a block of its expert, each
    expert's last block padded (at most ``ceil((T K + E (BT - 1)) / BT)``)."""
    return -(-(T * K + E * (BT - 1)) // BT)


def moe_route(logits: NDArray[np.float32], ids: NDArray[np.int32],
              weights: NDArray[np.float32], T: int, E: int, K: int, NORM: int) -> None:
    """Router top-k: the K most probable experts of each row and their weights.

    Reference loop::

        for t in range(T):
            p = softmax(logits[t, :E])
            top = the K largest p, larger first (ties: the lower expert id first)
            s = sum(p[top]) if NORM else 1
            for k in range(K):
                ids[t, k] = top[k]; weights[t, k] = p[top[k]] / s

    Args:
        logits: ``[T, E]`` f32 router logits (``x @ router^T``).
        ids: ``[T, K]`` i32, written: expert ids.
        weights: ``[T, K]`` f32, written: routing weights.
        T: token rows.
        E: experts.
        K: experts per token (1 <= K <= E).
        NORM: 1 renormalizes the K weights to sum to 1 (Qwen3-MoE's ``norm_topk_prob``),
            0 keeps the softmax probabilities.
    """
    z = logits[:T, :E].astype(np.float32)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    # stable sort of -p: equal probabilities keep ascending expert ids
    top = np.argsort(-p, axis=-1, kind="stable")[:, :K]
    w = np.take_along_axis(p, top, -1)
    if NORM:
        w = w / w.sum(-1, keepdims=True)
    ids[:T, :K] = top.astype(np.int32)
    weights[:T, :K] = w.astype(np.float32)


def moe_align(ids: NDArray[np.int32], sorted_pairs: NDArray[np.int32],
              block_expert: NDArray[np.int32], T: int, E: int, K: int, BT: int,
              NB: int) -> None:
    """Group the T K pairs by expert into blocks of BT rows.

    Reference loop::

        at = 0
        for e in range(E):
            pairs = [p for p in range(T * K) if ids[p // K, p % K] == e]  # ascending
            n = ceil(len(pairs) / BT) * BT
            sorted_pairs[at:at + n] = pairs + [-1] * (n - len(pairs))
            block_expert[at // BT:(at + n) // BT] = e
            at += n
        sorted_pairs[at:NB * BT] = -1; block_expert[at // BT:NB] = -1

    Args:
        ids: ``[T, K]`` i32 expert ids (``moe_route``); an id outside [0, E) joins no block.
        sorted_pairs: ``[NB * BT]`` i32, written: pair indices t * K + k, -1 for padding.
        block_expert: ``[NB]`` i32, written: each block's expert, -1 for an unused block.
        T: token rows.
        E: experts.
        K: experts per token.
        BT: rows of a block.
        NB: blocks (``moe_blocks(T_max, E, K, BT)`` of the buffer's capacity).
    """
    flat = ids[:T, :K].reshape(-1)
    sorted_pairs[:NB * BT] = -1
    block_expert[:NB] = -1
    at = 0
    for e in range(E):
        pairs = np.flatnonzero(flat == e).astype(np.int32)
        n = -(-len(pairs) // BT) * BT
        sorted_pairs[at:at + len(pairs)] = pairs
        block_expert[at // BT:(at + n) // BT] = e
        at += n


def moe_gate_up(x: NDArray[np.float32], sorted_pairs: NDArray[np.int32],
                block_expert: NDArray[np.int32], w_gate_up: NDArray[np.float32],
                act: NDArray[np.float32], T: int, D: int, F: int, K: int, BT: int,
                NB: int) -> None:
    """Each pair's expert gate/up product and SwiGLU: ``act[p] = silu(g) * u`` with
    ``[g | u] = x[p // K] @ w_gate_up[e]^T`` (``silu_mul``'s arithmetic).

    Reference loop::

        for b in range(NB):
            e = block_expert[b]
            if e < 0: continue
            for p in sorted_pairs[b * BT:(b + 1) * BT]:
                if p < 0: continue
                gu = x[p // K] @ w_gate_up[e].T          # [2F]
                act[p] = silu(gu[:F]) * gu[F:]

    Args:
        x: ``[T, D]`` f32 normalized hidden states.
        sorted_pairs: ``[NB * BT]`` i32 (``moe_align``).
        block_expert: ``[NB]`` i32 (``moe_align``).
        w_gate_up: ``[E, 2F, D]`` stacked expert gate/up weights.
        act: ``[T * K, F]`` f32, written for every pair of a used block.
        T: token rows.
        D: hidden size.
        F: expert intermediate size.
        K: experts per token.
        BT: rows of a block.
        NB: blocks.
    """
    for b in range(NB):
        e = int(block_expert[b])
        if e < 0:
            continue
        w = w_gate_up[e, :2 * F, :D]
        gu = np.empty((1, 2 * F), np.float32)
        for p in sorted_pairs[b * BT:(b + 1) * BT]:
            if p >= 0:  # one GEMV per pair: row-invariant (see the module docstring)
                np.dot(w, x[p // K, :D], out=gu[0])
                silu_mul(gu, act[p:p + 1], 1, F)


def moe_down(act: NDArray[np.float32], sorted_pairs: NDArray[np.int32],
             block_expert: NDArray[np.int32], w_down: NDArray[np.float32],
             weights: NDArray[np.float32], pair_out: NDArray[np.float32], T: int, D: int,
             F: int, K: int, BT: int, NB: int) -> None:
    """Each pair's expert down product scaled by its routing weight:
    ``pair_out[p] = weights[p // K, p % K] * (act[p] @ w_down[e]^T)``.

    Reference loop::

        for b in range(NB):
            e = block_expert[b]
            if e < 0: continue
            for p in sorted_pairs[b * BT:(b + 1) * BT]:
                if p >= 0:
                    pair_out[p] = weights.flat[p] * (act[p] @ w_down[e].T)

    Args:
        act: ``[T * K, F]`` f32 (``moe_gate_up``).
        sorted_pairs: ``[NB * BT]`` i32.
        block_expert: ``[NB]`` i32.
        w_down: ``[E, D, F]`` stacked expert down weights.
        weights: ``[T, K]`` f32 routing weights (``moe_route``).
        pair_out: ``[T * K, D]`` f32, written for every pair of a used block.
        T: token rows.
        D: hidden size.
        F: expert intermediate size.
        K: experts per token.
        BT: rows of a block.
        NB: blocks.
    """
    w = weights[:T, :K].reshape(-1)
    for b in range(NB):
        e = int(block_expert[b])
        if e < 0:
            continue
        wd = w_down[e, :D, :F]
        for p in sorted_pairs[b * BT:(b + 1) * BT]:
            if p >= 0:
                np.dot(wd, act[p, :F], out=pair_out[p, :D])
                pair_out[p, :D] *= w[p]


def moe_sum(pair_out: NDArray[np.float32], out: NDArray[np.float32], T: int, D: int,
            K: int) -> None:
    """Each token's K weighted pair rows, added in order: ``out[t] = sum_k pair_out[t K + k]``.

    Reference loop::

        for t in range(T):
            acc = pair_out[t * K]
            for k in range(1, K):
                acc = acc + pair_out[t * K + k]
            out[t] = acc

    Args:
        pair_out: ``[T * K, D]`` f32 (``moe_down``).
        out: ``[T, D]`` f32, written.
        T: token rows.
        D: hidden size.
        K: experts per token.
    """
    rows = pair_out[:T * K, :D].reshape(T, K, D)
    acc = rows[:, 0].copy()
    for k in range(1, K):
        acc += rows[:, k]
    out[:T, :D] = acc
