"""Token sampling: logit bias, penalties, grammar mask, temperature, top-k/top-p/min-p,
seeded draw; and the logprobs of the raw model distribution.

Invariant: a row's token depends only on that row's inputs (logits, histogram and bias
rows, seed, position, parameters), never on its batch neighbours or its row index, because
every random number is Philox(seed, position, token id) and the draw is an exponential race
(Gumbel-max): ``argmax_i log p_i - log(-log u_i)`` samples ``i`` with probability ``p_i``.

Ops: ``sample_biased`` (the sampler), ``sample`` (the same without logit bias: the op of
cores exported before logit bias, kept so they keep loading) and ``token_logprobs``
(log_softmax of the unprocessed logits: the sampled token's logprob and the top-k). The
per-row functions (``_sample_row``, ``_row_logprobs``) are what a speculative verify step
calls per position.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .rng import philox_uniform

_BITS = np.arange(32, dtype=np.uint32)


def grammar_mask_words(V: int) -> int:
    """Number of 32-bit words in one row of the allowed-token bitmask: ``ceil(V / 32)``."""
    return (V + 31) // 32


def _allowed(words: NDArray[np.int32], V: int) -> NDArray[np.bool_]:
    # bit j % 32 of word j // 32 set <=> token j allowed
    w = words.view(np.uint32)
    return (((w[:, None] >> _BITS[None, :]) & np.uint32(1)) != 0).reshape(-1)[:V]


def _top_k(z: NDArray[np.float32], k: int) -> NDArray[np.int64]:
    """Ascending ids of the k largest logits; ties at the boundary keep lower ids."""
    kth = np.partition(z, z.size - k)[z.size - k]
    above = np.flatnonzero(z > kth)
    tied = np.flatnonzero(z == kth)[: k - above.size]
    return np.sort(np.concatenate([above, tied]))


# top-p first tries the most probable ids only; a peaked LM distribution almost always
# reaches top_p inside them, saving the full sort of the vocabulary.
_TOP_P_PARTIAL = 1024


def _top_p_prefix(p: NDArray[np.float32], ids: NDArray[np.int64], top_p: np.float32) -> int:
    """Length of the shortest prefix of ``ids`` (sorted by p descending) reaching top_p."""
    cum = np.cumsum(p[ids], dtype=np.float32)
    return int(np.searchsorted(cum, top_p, side="left")) + 1


def _top_p(p: NDArray[np.float32], top_p: np.float32) -> NDArray[np.int64]:
    """Ascending positions in ``p`` of the nucleus: the shortest prefix of ids sorted by p
    descending (ties by lower position) whose sum reaches ``top_p``; at least one."""
    m = _TOP_P_PARTIAL
    if p.size > 2 * m:
        top = np.sort(np.argpartition(-p, m)[:m])  # the m largest, in position order
        order = top[np.argsort(-p[top], kind="stable")]
        n = _top_p_prefix(p, order, top_p)
        # Exact only if the prefix ends strictly above every id left out of ``top``.
        if n < m and p[order[n - 1]] > p[order[-1]]:
            return np.sort(order[:n])
    order = np.argsort(-p, kind="stable")
    n = min(_top_p_prefix(p, order, top_p), order.size)
    return np.sort(order[:n])


def _penalize(
    z: NDArray[np.float32],
    counts: NDArray[np.int32],
    presence: float,
    frequency: float,
    repetition: float,
) -> NDArray[np.float32]:
    """Repetition, then frequency, then presence penalty over one row's f32 logits."""
    if repetition == 1.0 and frequency == 0.0 and presence == 0.0:
        return z
    seen = counts > 0
    if repetition != 1.0:
        rep = np.float32(repetition)
        z = np.where(seen, np.where(z > 0, z / rep, z * rep), z)
    if frequency != 0.0:
        z = z - np.float32(frequency) * counts.astype(np.float32)
    if presence != 0.0:
        z = z - np.float32(presence) * seen.astype(np.float32)
    return z


def _candidates(
    z: NDArray[np.float32], temperature: float, top_k: int, top_p: float, min_p: float
) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """Surviving ids (ascending) and their f32 probabilities after the truncations.

    ``z`` has a finite maximum and ``temperature > 0``.
    """
    z = z / np.float32(temperature)
    V = z.size
    if 0 < top_k < V:
        cand = _top_k(z, top_k)
        zc = z[cand]
    else:
        cand = np.arange(V)
        zc = z
    return _truncate(cand, zc, top_p, min_p)


def _truncate(cand: NDArray[np.int64], zc: NDArray[np.float32], top_p: float, min_p: float
              ) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """Softmax of the top-k survivors' scaled logits ``zc`` (ids ``cand`` ascending), then
    top-p and min-p: the surviving ids (ascending) and their f32 probabilities."""
    with np.errstate(under="ignore"):
        p = np.exp(zc - zc.max())
    p /= p.sum(dtype=np.float32)
    if top_p < 1.0:
        keep = _top_p(p, np.float32(top_p))
        cand, p = cand[keep], p[keep]
    if min_p > 0.0:
        keep = p >= np.float32(min_p) * p.max()
        cand, p = cand[keep], p[keep]
    return cand, p


def _processed(z: NDArray[np.float32], counts: NDArray[np.int32],
               bias: NDArray[np.float32] | None, presence: float, frequency: float,
               repetition: float, allowed: NDArray[np.bool_] | None) -> NDArray[np.float32]:
    """One row's logits after logit bias, penalties and the grammar mask (`z` itself when
    none applies; never modified)."""
    if bias is not None:
        z = z + bias
    z = _penalize(z, counts, presence, frequency, repetition)
    if allowed is not None:
        z = np.where(allowed, z, np.float32(-np.inf))
    return z


def row_logits(logits: NDArray[np.float32], slot: NDArray[np.int32],
               presence: NDArray[np.float32], frequency: NDArray[np.float32],
               repetition: NDArray[np.float32], histogram: NDArray[np.int32],
               logit_bias: NDArray[np.float32], use_bias: NDArray[np.int32],
               grammar_mask: NDArray[np.int32], use_mask: NDArray[np.int32], r: int, V: int,
               W32: int) -> NDArray[np.float32]:
    """Submission row r's ``[V]`` f32 logits after its slot's logit bias, its penalties
    (the slot's histogram) and its grammar mask: the one preparation every sampler form
    applies before temperature (``sample_biased`` and the chunked references). Arguments
    as ``sample_biased``'s; ``slot[r]`` must be >= 0."""
    s = int(slot[r])
    allowed = _allowed(grammar_mask[r, :W32], V) if use_mask[r] else None
    return _processed(logits[r, :V].astype(np.float32, copy=False), histogram[s, :V],
                      logit_bias[s, :V] if use_bias[r] else None, float(presence[r]),
                      float(frequency[r]), float(repetition[r]), allowed)


def row_distribution(
    z: NDArray[np.float32],
    counts: NDArray[np.int32],
    bias: NDArray[np.float32] | None,
    temperature: float,
    top_p: float,
    top_k: int,
    min_p: float,
    presence: float,
    frequency: float,
    repetition: float,
    allowed: NDArray[np.bool_] | None,
) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """The sampling distribution of one row: surviving ids (ascending) and their f32
    probabilities, after bias, penalties, mask, temperature and the truncations.

    Greedy rows (temperature <= 0) and rows whose every token is masked return the argmax
    alone with probability 1 (token 0 for a fully masked row). ``z`` is the row's f32
    logits (not modified); ``bias`` its logit bias or None; ``allowed`` its grammar mask
    or None. A speculative verify step reads p(token) and residuals from this.
    """
    z = _processed(z, counts, bias, presence, frequency, repetition, allowed)
    return _distribution(z, temperature, top_k, top_p, min_p)


def _distribution(z: NDArray[np.float32], temperature: float, top_k: int, top_p: float,
                  min_p: float) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """``row_distribution`` of logits ``z`` already biased, penalized and masked."""
    best = int(np.argmax(z))
    if temperature <= 0.0 or not np.isfinite(z[best]):
        return np.array([best], np.int64), np.ones(1, np.float32)
    return _candidates(z, temperature, top_k, top_p, min_p)


def _race(cand: NDArray[np.int64], p: NDArray[np.float32], seed_lo: int, seed_hi: int,
          position: int, stream: int = 0) -> int:
    """The seeded exponential race over ids ``cand`` with weights ``p``:
    ``argmax log p_i - log(-log u_i)``, ``u_i = philox_uniform(seed, position, cand_i,
    stream)``; the first of ``cand`` on ties (the lowest id when ascending).

    The one noise function of every seeded draw: the sampler's (stream 0), a coupled
    draft's (the same stream-0 noise over the head's distribution, so a draft equals the
    target's draw whenever the two races agree: helios_tools.kernels.speculative) and
    the residual of cores exported before coupled verification (stream 3)."""
    if cand.size == 1:  # greedy, a fully masked row, or one survivor: no draw needed
        return int(cand[0])
    u = philox_uniform(seed_lo, seed_hi, position, cand, stream=stream)
    with np.errstate(divide="ignore"):  # p may underflow to 0 -> -inf, never chosen
        race = np.log(p.astype(np.float64)) - np.log(-np.log(u))
    return int(cand[int(np.argmax(race))])


def sample_biased(
    logits: NDArray[np.float32],
    slot: NDArray[np.int32],
    positions: NDArray[np.int32],
    sampling_decision: NDArray[np.int32],
    seed: NDArray[np.uint32],
    temperature: NDArray[np.float32],
    top_p: NDArray[np.float32],
    top_k: NDArray[np.int32],
    min_p: NDArray[np.float32],
    presence: NDArray[np.float32],
    frequency: NDArray[np.float32],
    repetition: NDArray[np.float32],
    histogram: NDArray[np.int32],
    logit_bias: NDArray[np.float32],
    use_bias: NDArray[np.int32],
    grammar_mask: NDArray[np.int32],
    use_mask: NDArray[np.int32],
    sampled: NDArray[np.int32],
    R: int,
    V: int,
    W32: int,
) -> None:
    """Sample one token per request row and count it in the row's histogram.

    Reference loop (per row; every step in this order)::

        for r in range(R):
            s = slot[r]
            if s < 0:
                sampled[r] = -1; continue                 # padding writes nothing else
            l = logits[r].copy(); c = histogram[s]
            if use_bias[r]:
                l += logit_bias[s]                         # OpenAI logit_bias, dense per slot
            for i in range(V):                             # penalties (c counts prompt+output)
                if c[i] > 0 and repetition[r] != 1:
                    l[i] = l[i] / repetition[r] if l[i] > 0 else l[i] * repetition[r]
                l[i] -= frequency[r] * c[i]
                l[i] -= presence[r] * (c[i] > 0)
                if use_mask[r] and not (grammar_mask[r, i // 32] >> (i % 32)) & 1:
                    l[i] = -inf
            if temperature[r] <= 0:
                tok = argmax(l)                            # first index on ties
            else:
                l /= temperature[r]
                if top_k[r] > 0: keep the top_k[r] largest l (ties: lower ids)
                p = softmax(l over kept)
                if top_p[r] < 1: keep the shortest prefix of kept ids sorted by p
                                 descending (ties: lower id) whose sum >= top_p[r] (>= 1 id)
                if min_p[r] > 0: drop kept ids with p < min_p[r] * max(p)
                tok = argmax over kept i of
                      log(p[i]) - log(-log(philox_u(seed[r], positions[r], i)))
            sampled[r] = tok
            if sampling_decision[r] != 0:
                histogram[s, tok] += 1

    ``philox_u`` is ``rng.philox_uniform``: Philox4x32-10 with key ``(seed[r,0], seed[r,1])``,
    counter ``(i, positions[r], 0, 0)``, word 0 mapped to ``((x0 >> 8) + 0.5) * 2**-24``.
    The race is evaluated in float64; the probabilities are f32. (A float32 ``u`` would
    round ``(2**24 - 0.5) / 2**24`` up to 1, making ``-log(-log u)`` infinite: GPU kernels
    must keep ``u < 1``.) A row whose every token is masked samples ``argmax`` (token 0).

    Args:
        logits: ``[R, V]`` f32 (submission rows).
        slot: ``[R]`` i32 physical request row, < 0 for padding.
        positions: ``[R]`` i32 position of the token being sampled (RNG counter word 1).
        sampling_decision: ``[R]`` i32, nonzero to count the token in ``histogram``.
        seed: ``[R, 2]`` u32 (lo, hi) Philox key.
        temperature: ``[R]`` f32, <= 0 means greedy.
        top_p: ``[R]`` f32, >= 1 disables.
        top_k: ``[R]`` i32, <= 0 disables.
        min_p: ``[R]`` f32, <= 0 disables.
        presence: ``[R]`` f32 presence penalty.
        frequency: ``[R]`` f32 frequency penalty.
        repetition: ``[R]`` f32 repetition penalty, 1 disables.
        histogram: ``[S, V]`` i32 token counts per physical request row, updated in place.
        logit_bias: ``[S, V]`` f32 additive logit bias per physical request row.
        use_bias: ``[R]`` i32, nonzero to add the row's slot's ``logit_bias`` row.
        grammar_mask: ``[R, W32]`` i32 allowed-token bitmask.
        use_mask: ``[R]`` i32, nonzero to apply ``grammar_mask``.
        sampled: ``[R]`` i32, written.
        R: submission rows.
        V: vocabulary size.
        W32: mask words per row, ``grammar_mask_words(V)``.
    """
    for r in range(R):
        s = int(slot[r])
        if s < 0:
            sampled[r] = -1
            continue
        z = row_logits(logits, slot, presence, frequency, repetition, histogram, logit_bias,
                       use_bias, grammar_mask, use_mask, r, V, W32)
        cand, p = _distribution(z, float(temperature[r]), int(top_k[r]), float(top_p[r]),
                                float(min_p[r]))
        tok = _race(cand, p, int(seed[r, 0]), int(seed[r, 1]), int(positions[r]))
        sampled[r] = tok
        if sampling_decision[r] != 0:
            histogram[s, tok] += 1


def sample(
    logits: NDArray[np.float32],
    slot: NDArray[np.int32],
    positions: NDArray[np.int32],
    sampling_decision: NDArray[np.int32],
    seed: NDArray[np.uint32],
    temperature: NDArray[np.float32],
    top_p: NDArray[np.float32],
    top_k: NDArray[np.int32],
    min_p: NDArray[np.float32],
    presence: NDArray[np.float32],
    frequency: NDArray[np.float32],
    repetition: NDArray[np.float32],
    histogram: NDArray[np.int32],
    grammar_mask: NDArray[np.int32],
    use_mask: NDArray[np.int32],
    sampled: NDArray[np.int32],
    R: int,
    V: int,
    W32: int,
) -> None:
    """``sample_biased`` with no logit bias (the sampler op of cores exported before
    logit bias; same arguments otherwise)."""
    no_bias = np.zeros((0, V), np.float32)
    sample_biased(logits, slot, positions, sampling_decision, seed, temperature, top_p,
                  top_k, min_p, presence, frequency, repetition, histogram, no_bias,
                  np.zeros(R, np.int32), grammar_mask, use_mask, sampled, R, V, W32)


def _row_logprobs(z: NDArray[np.float32], token: int, k: int
                  ) -> tuple[float, NDArray[np.int64], NDArray[np.float32]]:
    """log_softmax of one row's f32 logits ``z``: (logprob of ``token``, the ids of the
    ``k`` largest logits, most likely first with ties to the lower id, their logprobs).
    The normalizer is computed in float64 (``max + log(sum(exp(z - max)))``)."""
    z64 = z.astype(np.float64)
    m = z64.max()
    with np.errstate(under="ignore"):
        lse = m + np.log(np.exp(z64 - m).sum())
    top = _top_k(z, k) if 0 < k < z.size else np.arange(z.size)[:k]
    order = top[np.argsort(-z[top], kind="stable")]  # ids ascending, so ties keep lower ids
    return (float(z64[token] - lse), order,
            (z64[order] - lse).astype(np.float32))


def token_logprobs(
    logits: NDArray[np.float32],
    slot: NDArray[np.int32],
    sampled: NDArray[np.int32],
    logprobs_k: NDArray[np.int32],
    logprobs: NDArray[np.float32],
    top_ids: NDArray[np.int32],
    R: int,
    V: int,
    K: int,
) -> None:
    """Log probabilities of the raw model distribution: the sampled token and the top-k.

    The distribution is ``log_softmax(logits[r])`` of the unprocessed logits: before logit
    bias, penalties, grammar mask, temperature and truncation (vLLM's default
    ``raw_logprobs``), so it describes the model, not the sampler's settings.

    Reference loop::

        for r in range(R):
            k = logprobs_k[r]
            if slot[r] < 0 or k < 0:
                continue                                  # writes nothing for this row
            lse = log(sum(exp(logits[r])))                # max-shifted
            logprobs[r, 0] = logits[r, sampled[r]] - lse
            for j, i in enumerate(the k largest logits[r], largest first, ties: lower i):
                top_ids[r, j] = i
                logprobs[r, 1 + j] = logits[r, i] - lse

    Entries past ``k`` are not written.

    Args:
        logits: ``[R, V]`` f32 (submission rows), not modified.
        slot: ``[R]`` i32, < 0 for padding.
        sampled: ``[R]`` i32 sampled ids (``sample_biased``'s output).
        logprobs_k: ``[R]`` i32, -1 for rows that record no logprobs, else 0..K.
        logprobs: ``[R, 1 + K]`` f32, written: the sampled token, then the top k.
        top_ids: ``[R, K]`` i32, written: the top k ids.
        R: submission rows.
        V: vocabulary size.
        K: top alternatives the record holds per row.
    """
    for r in range(R):
        k = int(logprobs_k[r])
        if int(slot[r]) < 0 or k < 0:
            continue
        k = min(k, K)
        lp, ids, values = _row_logprobs(logits[r, :V].astype(np.float32, copy=False),
                                        int(sampled[r]), k)
        logprobs[r, 0] = lp
        logprobs[r, 1:1 + k] = values
        top_ids[r, :k] = ids


def score_tokens(
    logits: NDArray[np.float32],
    targets: NDArray[np.int32],
    scores: NDArray[np.float32],
    score_ids: NDArray[np.int32],
    T: int,
    V: int,
    K: int,
) -> None:
    """Prompt scores of a SCORED_PREFILL program: per packed token, the raw-distribution
    log probability of its target (the next prompt token) and the top-K alternatives.

    The distribution is ``log_softmax(logits[t])`` of the unprocessed logits at packed
    token t's position (as ``token_logprobs``: vLLM's ``prompt_logprobs``, before any
    sampling setting applies).

    Reference loop::

        for t in range(T):
            if targets[t] < 0:
                continue                                  # no target: writes nothing
            lse = log(sum(exp(logits[t])))                # max-shifted
            scores[t, 0] = logits[t, targets[t]] - lse
            for j, i in enumerate(the K largest logits[t], largest first, ties: lower i):
                score_ids[t, j] = i
                scores[t, 1 + j] = logits[t, i] - lse

    Args:
        logits: ``[T, V]`` f32 (packed tokens), not modified.
        targets: ``[T]`` i32 target ids, -1 for tokens without one (a prompt's last
            token, rows that score nothing, padding).
        scores: ``[T, 1 + K]`` f32, written: the target, then the top K.
        score_ids: ``[T, K]`` i32, written: the top K ids.
        T: packed tokens.
        V: vocabulary size.
        K: top alternatives recorded per token.
    """
    for t in range(T):
        target = int(targets[t])
        if target < 0:
            continue
        lp, ids, values = _row_logprobs(logits[t, :V].astype(np.float32, copy=False),
                                        target, K)
        scores[t, 0] = lp
        scores[t, 1:1 + K] = values
        score_ids[t, :K] = ids
