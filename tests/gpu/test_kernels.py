"""Every Triton kernel against its NumPy reference on fresh random inputs.

Outputs are poisoned (NaN / -7777) before each launch; errors are relative
``||gpu - ref|| / ||ref||``. bf16 weights are the same bf16 values on both sides (the
reference gets them widened to f32), so the bound is near f32 rounding, not bf16's.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_harness import bf16_round
from helios_tools import kernels as K
from helios_tools.kernels.linear_splitk import unpack_terms

pytestmark = pytest.mark.gpu


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "GPU output holds NaN/inf (unwritten or poisoned)"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.fixture
def rng(request):
    return np.random.default_rng(abs(hash(request.node.name)) % 2**32)


@pytest.mark.parametrize("D", [576, 4096])
def test_embedding(gpu, rng, D):
    V, T = 1000, 9
    bits, table = bf16_round(rng.standard_normal((V, D)).astype(np.float32))
    ids = rng.integers(0, V, T).astype(np.int32)
    ids[2], ids[5] = -1, V + 3
    ref = np.zeros((T, D), np.float32)
    K.embedding(ids, table, ref, T, D)
    out = gpu.run("embedding", ids, bits, np.zeros((T, D), np.float32), T, D,
                  bf16=("table",))["out"]
    assert rel(out, ref) == 0.0


@pytest.mark.parametrize("D", [576, 4096])
def test_norms(gpu, rng, D):
    T = 7
    x = rng.standard_normal((T, D)).astype(np.float32)
    res = rng.standard_normal((T, D)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    ref = np.zeros((T, D), np.float32)
    K.rmsnorm(x, w, ref, T, D, 1e-5)
    out = gpu.run("rmsnorm", x, w, np.zeros_like(ref), T, D, 1e-5)["out"]
    assert rel(out, ref) < 1e-6
    ref_res = res.copy()
    K.add_rmsnorm(x, ref_res, w, ref, T, D, 1e-5)
    got = gpu.run("add_rmsnorm", x, res, w, np.zeros_like(ref), T, D, 1e-5)
    assert rel(got["residual"], ref_res) == 0.0
    assert rel(got["out"], ref) < 1e-6


@pytest.mark.parametrize("T,N,K_", [(1, 960, 576), (1, 49152, 576), (5, 1536, 576),
                                    (33, 576, 1536), (70, 3072, 576), (3, 4096, 4096),
                                    (8, 6144, 4096), (32, 4096, 14336), (64, 28672, 4096),
                                    (64, 1000, 1000), (8, 960, 576), (6, 576, 1536),
                                    (300, 4096, 512)])
def test_linear_bf16(gpu, rng, T, N, K_):
    x = rng.standard_normal((T, K_)).astype(np.float32)
    bits, w = bf16_round((rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32))
    ref = np.zeros((T, N), np.float32)
    K.linear(x, w, ref, T, N, K_)
    out = gpu.run("linear", x, bits, np.zeros_like(ref), T, N, K_, bf16=("weight",))["out"]
    assert rel(out, ref) < 5e-5


# Batch-1 GEMV specs (HELIOS_LINEAR_GEMV): today's v1 and the streamed forms (persistent
# grids with several row tiles per program, the register prefetch, evict-first loads).
GEMV_SPECS = ("v1", "v2", "4,1024,2,0,0,0", "4,2048,4,2,0,0", "4,4096,8,4,1,1",
              "8,1024,4,8,1,0", "2,4096,4,0,1,0")


@pytest.mark.parametrize("spec", GEMV_SPECS)
@pytest.mark.parametrize("N,K_", [(6144, 4096), (49157, 576), (4096, 14336), (100, 40)])
def test_gemv_specs(gpu, rng, monkeypatch, spec, N, K_):
    """Every op on the GEMV path under each spec: plain, SwiGLU, folded norm, residual
    add, SwiGLU + add (odd N: a partial last tile; 100 x 40: f32 weights, unaligned K)."""
    from helios_ignition.capture import launch

    monkeypatch.setattr(launch, "LINEAR_GEMV", spec)
    wb = K_ % 16 == 0
    x = (rng.standard_normal((1, 2 * K_)) * 3).astype(np.float32)
    xk = np.ascontiguousarray(x[:, :K_])
    g = (1 + 0.1 * rng.standard_normal(K_)).astype(np.float32)
    w = (rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32)
    bits, w = bf16_round(w) if wb else (w, w)
    bf = ("weight",) if wb else ()
    res = (rng.standard_normal((1, N)) * 3).astype(np.float32)
    for op, xin, extra, tol in (("linear", xk, (), 5e-5), ("swiglu_linear", x, (), 5e-6),
                                ("rmsnorm_linear", xk, (g,), 5e-5),
                                ("linear_add", xk, (), 5e-5),
                                ("swiglu_linear_add", x, (), 5e-6)):
        acc = op.endswith("_add")
        ref = res.copy() if acc else np.zeros((1, N), np.float32)
        tail = (1e-5,) if op == "rmsnorm_linear" else ()
        getattr(K, op)(xin, *extra, w, ref, 1, N, K_, *tail)
        out = gpu.run(op, xin, *extra, bits, res.copy() if acc else np.zeros_like(ref), 1, N,
                      K_, *tail, bf16=bf)["out"]
        err = rel(out - res, ref - res) if acc else rel(out, ref)
        assert err < tol, (op, err)
        again = gpu.run(op, xin, *extra, bits, res.copy() if acc else np.zeros_like(ref), 1,
                        N, K_, *tail, bf16=bf)["out"]
        assert np.array_equal(out.view(np.uint32), again.view(np.uint32)), op  # deterministic


@pytest.mark.parametrize("T", [1, 3])
def test_linear_f32_unaligned(gpu, rng, T):
    N, K_ = 100, 40
    x = rng.standard_normal((T, K_)).astype(np.float32)
    w = rng.standard_normal((N, K_)).astype(np.float32)
    ref = np.zeros((T, N), np.float32)
    K.linear(x, w, ref, T, N, K_)
    out = gpu.run("linear", x, w, np.zeros_like(ref), T, N, K_)["out"]
    assert rel(out, ref) < 1e-6


def test_elementwise(gpu, rng):
    T, F = 6, 1536
    gu = rng.standard_normal((T, 2 * F)).astype(np.float32) * 3
    ref = np.zeros((T, F), np.float32)
    K.silu_mul(gu, ref, T, F)
    assert rel(gpu.run("silu_mul", gu, np.zeros_like(ref), T, F)["out"], ref) < 1e-6
    a, b = gu[:, :F].copy(), gu[:, F:].copy()
    K.add(a, b, ref, T, F)
    assert rel(gpu.run("add", a, b, np.zeros_like(ref), T, F)["out"], ref) == 0.0


def test_gather_last(gpu, rng):
    T, R, D = 40, 6, 576
    x = rng.standard_normal((T, D)).astype(np.float32)
    ql = np.array([5, 0, 12, 1, -1, 9], np.int32)
    ref = np.zeros((R, D), np.float32)
    K.gather_last(x, ql, ref, T, R, D)
    assert rel(gpu.run("gather_last", x, ql, np.zeros_like(ref), T, R, D)["out"], ref) == 0.0


@pytest.mark.parametrize("R", [1, 7, 200])
def test_slot_gather_scatter(gpu, rng, R):
    S = 256
    src = rng.integers(0, 49152, S).astype(np.int32)
    slot = rng.permutation(S)[:R].astype(np.int32)
    slot[::3] = -1
    if R > 1:
        slot[1] = S + 4
    ref = np.zeros(R, np.int32)
    K.slot_gather(src, slot, ref, R, S)
    np.testing.assert_array_equal(gpu.run("slot_gather", src, slot, np.zeros_like(ref), R, S)["out"],
                                  ref)
    values = rng.integers(0, 49152, R).astype(np.int32)
    decision = rng.integers(0, 2, R).astype(np.int32)
    ref_dst = src.copy()
    K.slot_scatter(values, slot, decision, ref_dst, R, S)
    got = gpu.run("slot_scatter", values, slot, decision, src.copy(), R, S)["dst"]
    np.testing.assert_array_equal(got, ref_dst)


@pytest.mark.parametrize("R,ROW", [(1, 16 * 3 * 64), (8, 16 * 3 * 64), (33, 16 * 8 * 128 + 5)])
def test_row_copy(gpu, rng, R, ROW):
    """Rows of one plane to rows of another; padding rows (-1 on either side) copy nothing
    and the destination's other rows keep their bytes."""
    src = rng.standard_normal((R + 3, ROW)).astype(np.float32)
    dst = rng.standard_normal((R + 5, ROW)).astype(np.float32)
    src_rows = rng.permutation(R + 3)[:R].astype(np.int32)
    dst_rows = rng.permutation(R + 5)[:R].astype(np.int32)
    src_rows[::4] = -1
    if R > 2:
        dst_rows[2] = -1
    ref = dst.copy()
    K.row_copy(src, ref, src_rows, dst_rows, R, ROW)
    got = gpu.run("row_copy", src, dst, src_rows, dst_rows, R, ROW)["dst"]
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("H,KVH,HD", [(9, 3, 64), (32, 8, 128)])
def test_rope(gpu, rng, H, KVH, HD):
    T = 11
    qkv = rng.standard_normal((T, (H + 2 * KVH) * HD)).astype(np.float32)
    pos = rng.integers(0, 8000, T).astype(np.int32)
    inv = (1.0 / 10000 ** (np.arange(0, HD, 2) / HD)).astype(np.float32)
    ref = qkv.copy()
    K.rope(ref, pos, inv, T, H, KVH, HD)
    out = gpu.run("rope", qkv, pos, inv, T, H, KVH, HD)["qkv"]
    assert rel(out, ref) < 2e-6


def _cache_case(rng, H=9, KVH=3, HD=64, PT=16, MP=32, S=6):
    P = S * MP
    pages = rng.permutation(P).astype(np.int32).reshape(S, MP)
    kc = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    vc = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    return pages, kc, vc


def test_kv_write(gpu, rng):
    H, KVH, HD, PT, MP = 9, 3, 64, 16, 32
    pages, kc, vc = _cache_case(rng)
    T, R = 10, 3
    qkv = rng.standard_normal((T, (H + 2 * KVH) * HD)).astype(np.float32)
    trow = np.array([0, 0, 0, 1, 1, 2, 2, 2, -1, -1], np.int32)
    slot = np.array([4, -1, 1], np.int32)
    pos = rng.integers(0, PT * MP, T).astype(np.int32)
    rk, rv = kc.copy(), vc.copy()
    K.kv_write(qkv, pos, trow, slot, pages, rk, rv, T, R, MP, PT, H, KVH, HD)
    got = gpu.run("kv_write", qkv, pos, trow, slot, pages, kc, vc, T, R, MP, PT, H, KVH, HD)
    assert rel(got["k_cache"], rk) == 0.0 and rel(got["v_cache"], rv) == 0.0


@pytest.mark.parametrize("H,KVH,HD", [(9, 3, 64), (32, 8, 128)])
def test_rope_kv_write_fused(gpu, rng, H, KVH, HD):
    PT, MP = 16, 32
    pages, kc, vc = _cache_case(rng, H=H, KVH=KVH, HD=HD)
    T, R = 10, 3
    qkv = rng.standard_normal((T, (H + 2 * KVH) * HD)).astype(np.float32)
    trow = np.array([0, 0, 0, 1, 1, 2, 2, 2, -1, -1], np.int32)
    slot = np.array([4, -1, 1], np.int32)
    pos = rng.integers(0, PT * MP, T).astype(np.int32)
    inv = (1.0 / 10000 ** (np.arange(0, HD, 2) / HD)).astype(np.float32)
    rq, rk, rv = qkv.copy(), kc.copy(), vc.copy()
    K.rope_kv_write(rq, pos, inv, trow, slot, pages, rk, rv, T, R, MP, PT, H, KVH, HD)
    got = gpu.run("rope_kv_write", qkv, pos, inv, trow, slot, pages, kc, vc,
                  T, R, MP, PT, H, KVH, HD)
    assert rel(got["qkv"], rq) < 2e-6
    assert rel(got["k_cache"], rk) < 2e-6 and rel(got["v_cache"], rv) == 0.0


@pytest.mark.parametrize("T,N,K_", [(1, 576, 1536), (1, 4096, 14336), (5, 576, 1536),
                                    (8, 960, 576)])
def test_swiglu_linear_fused(gpu, rng, T, N, K_):
    x = (rng.standard_normal((T, 2 * K_)) * 3).astype(np.float32)
    bits, w = bf16_round((rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32))
    ref = np.zeros((T, N), np.float32)
    K.swiglu_linear(x, w, ref, T, N, K_)
    out = gpu.run("swiglu_linear", x, bits, np.zeros_like(ref), T, N, K_,
                  bf16=("weight",))["out"]
    assert rel(out, ref) < 5e-6


@pytest.mark.parametrize("T,N,K_", [(1, 960, 576), (1, 3072, 576), (1, 6144, 4096),
                                    (5, 960, 576), (8, 3072, 576), (3, 4096, 4096),
                                    (33, 960, 576), (64, 3072, 576), (64, 28672, 4096)])
def test_rmsnorm_linear_folded(gpu, rng, T, N, K_):
    """The RMS prologue on the GEMV, FMA and MMA paths (layer folding)."""
    x = (rng.standard_normal((T, K_)) * 4).astype(np.float32)
    g = (1 + 0.1 * rng.standard_normal(K_)).astype(np.float32)
    bits, w = bf16_round((rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32))
    ref = np.zeros((T, N), np.float32)
    K.rmsnorm_linear(x, g, w, ref, T, N, K_, 1e-5)
    out = gpu.run("rmsnorm_linear", x, g, bits, np.zeros_like(ref), T, N, K_, 1e-5,
                  bf16=("weight",))["out"]
    assert rel(out, ref) < 5e-5


@pytest.mark.parametrize("T,N,K_", [(1, 576, 576), (1, 4096, 4096), (8, 576, 1536),
                                    (3, 4096, 4096), (64, 576, 576), (32, 4096, 14336)])
def test_linear_add_folded(gpu, rng, T, N, K_):
    """The residual add in the epilogue: `out` holds the residual stream (not poisoned:
    it is read), and every element must come back as residual + product."""
    x = rng.standard_normal((T, K_)).astype(np.float32)
    bits, w = bf16_round((rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32))
    res = (rng.standard_normal((T, N)) * 3).astype(np.float32)
    ref = res.copy()
    K.linear_add(x, w, ref, T, N, K_)
    out = gpu.run("linear_add", x, bits, res, T, N, K_, bf16=("weight",))["out"]
    assert rel(out - res, ref - res) < 5e-5  # the product's error, not hidden by res
    assert rel(out, ref) < 5e-5


@pytest.mark.parametrize("T,N,K_", [(1, 576, 1536), (1, 4096, 14336), (5, 576, 1536)])
def test_swiglu_linear_add_folded(gpu, rng, T, N, K_):
    x = (rng.standard_normal((T, 2 * K_)) * 3).astype(np.float32)
    bits, w = bf16_round((rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32))
    res = (rng.standard_normal((T, N)) * 3).astype(np.float32)
    ref = res.copy()
    K.swiglu_linear_add(x, w, ref, T, N, K_)
    out = gpu.run("swiglu_linear_add", x, bits, res, T, N, K_, bf16=("weight",))["out"]
    assert rel(out - res, ref - res) < 5e-6


@pytest.mark.parametrize("ctx_max", [40, 500])
def test_attention_decode(gpu, rng, ctx_max):
    H, KVH, HD, PT, MP = 9, 3, 64, 16, 32
    pages, kc, vc = _cache_case(rng)
    B = 5
    qkv = rng.standard_normal((B, (H + 2 * KVH) * HD)).astype(np.float32)
    slot = np.array([0, 3, -1, 5, 2], np.int32)
    pos = rng.integers(0, ctx_max, B).astype(np.int32)
    pos[0] = 0
    ref = np.zeros((B, H * HD), np.float32)
    scale = HD ** -0.5
    K.attention_decode(qkv, pos, slot, pages, kc, vc, ref, B, MP, PT, H, KVH, HD, scale)
    out = gpu.run("attention_decode", qkv, pos, slot, pages, kc, vc, np.zeros_like(ref),
                  B, MP, PT, H, KVH, HD, scale)["out"]
    assert rel(out, ref) < 1e-5


@pytest.mark.parametrize("H,KVH,HD", [(9, 3, 64), (32, 8, 128)])
def test_attention_prefill(gpu, rng, H, KVH, HD):
    PT, MP = 16, 32
    pages, kc, vc = _cache_case(rng, H, KVH, HD)
    # three rows: a fresh prompt, a second chunk (earlier context cached), a padding row
    lens, starts, slots = [23, 30, 4], [0, 100, 0], [2, 4, -1]
    T = 64
    trow = np.full(T, -1, np.int32)
    pos = np.zeros(T, np.int32)
    t = 0
    for r, (n, s0) in enumerate(zip(lens, starts, strict=True)):
        trow[t:t + n] = r
        pos[t:t + n] = np.arange(s0, s0 + n)
        t += n
    R = 3
    slot = np.array(slots, np.int32)
    qkv = rng.standard_normal((T, (H + 2 * KVH) * HD)).astype(np.float32)
    ref = np.zeros((T, H * HD), np.float32)
    scale = HD ** -0.5
    K.attention_prefill(qkv, pos, trow, slot, pages, kc, vc, ref, T, R, MP, PT, H, KVH, HD,
                        scale)
    out = gpu.run("attention_prefill", qkv, pos, trow, slot, pages, kc, vc,
                  np.zeros_like(ref), T, R, MP, PT, H, KVH, HD, scale)["out"]
    assert rel(out, ref) < 1e-5


def _sample_inputs(rng, R, V, S=16):
    logits = (rng.standard_normal((R, V)) * 3).astype(np.float32)
    words = K.grammar_mask_words(V)
    p = dict(
        slot=rng.permutation(S)[:R].astype(np.int32),
        positions=rng.integers(0, 5000, R).astype(np.int32),
        sampling_decision=np.ones(R, np.int32),
        seed=rng.integers(0, 2**32, (R, 2), dtype=np.uint64).astype(np.uint32),
        temperature=np.full(R, 0.8, np.float32), top_p=np.ones(R, np.float32),
        top_k=np.zeros(R, np.int32), min_p=np.zeros(R, np.float32),
        presence=np.zeros(R, np.float32), frequency=np.zeros(R, np.float32),
        repetition=np.ones(R, np.float32),
        histogram=rng.integers(0, 3, (S, V)).astype(np.int32) * (rng.random((S, V)) < 0.01),
        grammar_mask=rng.integers(-2**31, 2**31, (R, words), dtype=np.int64).astype(np.int32),
        use_mask=np.zeros(R, np.int32))
    p["histogram"] = p["histogram"].astype(np.int32)
    return logits, p


ORDER = ["slot", "positions", "sampling_decision", "seed", "temperature", "top_p", "top_k",
         "min_p", "presence", "frequency", "repetition", "histogram", "grammar_mask",
         "use_mask"]


def _run_sample(gpu, logits, p, R, V):
    words = K.grammar_mask_words(V)
    ref_hist = p["histogram"].copy()
    ref = np.zeros(R, np.int32)
    args = [p[k] if k != "histogram" else ref_hist for k in ORDER]
    K.sample(logits, *args, ref, R, V, words)
    got = gpu.run("sample", logits, *[p[k] for k in ORDER], np.zeros(R, np.int32), R, V, words)
    return got, ref, ref_hist


@pytest.mark.parametrize("V", [5000, 49152])
def test_sample_matches_reference(gpu, rng, V):
    R = 10
    logits, p = _sample_inputs(rng, R, V)
    p["temperature"][0] = 0.0                              # greedy
    p["top_k"][1] = 40                                     # top-k
    p["top_p"][2] = 0.9                                    # top-p
    p["min_p"][3] = 0.05                                   # min-p
    p["top_k"][4], p["top_p"][4], p["min_p"][4] = 50, 0.8, 0.02
    p["presence"][5], p["frequency"][5], p["repetition"][5] = 0.5, 0.3, 1.3
    p["use_mask"][6] = 1                                   # grammar mask
    p["slot"][7] = -1                                      # padding
    p["sampling_decision"][8] = 0                          # do not count
    p["temperature"][9], p["top_k"][9] = 1.5, 1            # top-1 == greedy
    got, ref, ref_hist = _run_sample(gpu, logits, p, R, V)
    np.testing.assert_array_equal(got["sampled"], ref)
    np.testing.assert_array_equal(got["histogram"], ref_hist)


def test_sample_masked_greedy_and_ties(gpu, rng):
    R, V = 4, 3000
    logits, p = _sample_inputs(rng, R, V)
    logits[:, 100:110] = 50.0                              # ten-way tie at the top
    p["temperature"][0] = 0.0
    p["top_k"][1] = 3                                      # tie broken by lower ids
    p["use_mask"][2] = 1
    p["grammar_mask"][2] = 0                               # everything masked -> token 0
    p["top_p"][3] = 0.25
    got, ref, ref_hist = _run_sample(gpu, logits, p, R, V)
    np.testing.assert_array_equal(got["sampled"], ref)
    np.testing.assert_array_equal(got["histogram"], ref_hist)


def test_sample_seeded_batch_independent(gpu, rng):
    R, V = 8, 4096
    logits, p = _sample_inputs(rng, R, V)
    p["top_p"][:] = 0.95
    first = gpu.run("sample", logits, *[p[k] for k in ORDER], np.zeros(R, np.int32),
                    R, V, K.grammar_mask_words(V))["sampled"]
    perm = rng.permutation(R)
    q = {k: (v[perm] if k not in ("histogram",) else v) for k, v in p.items()}
    again = gpu.run("sample", logits[perm], *[q[k] for k in ORDER], np.zeros(R, np.int32),
                    R, V, K.grammar_mask_words(V))["sampled"]
    np.testing.assert_array_equal(again, first[perm])
    # a row alone samples what it sampled in the batch
    one = {k: (v[3:4] if k != "histogram" else v) for k, v in p.items()}
    alone = gpu.run("sample", logits[3:4], *[one[k] for k in ORDER], np.zeros(1, np.int32),
                    1, V, K.grammar_mask_words(V))["sampled"]
    assert alone[0] == first[3]


BIASED_ORDER = ORDER[:12] + ["logit_bias", "use_bias"] + ORDER[12:]


@pytest.mark.parametrize("V", [5000, 49152, 128256])
def test_sample_biased_matches_reference(gpu, rng, V):
    """Every sampler path with a dense per-slot bias on some rows (fresh random inputs,
    poisoned output), against the NumPy reference."""
    R, S = 8, 16
    logits, p = _sample_inputs(rng, R, V, S)
    p["logit_bias"] = np.zeros((S, V), np.float32)
    p["use_bias"] = np.zeros(R, np.int32)
    for r in range(0, R, 2):  # a sparse bias on the even rows' slots, both signs
        ids = rng.choice(V, 300, replace=False)
        p["logit_bias"][p["slot"][r], ids] = rng.uniform(-100, 100, 300).astype(np.float32)
        p["use_bias"][r] = 1
    p["logit_bias"][p["slot"][1]] = 50.0  # a row that must ignore its slot's bias row
    p["temperature"][0] = 0.0
    p["top_k"][2], p["top_p"][4], p["min_p"][6] = 40, 0.9, 0.05
    p["repetition"][2], p["presence"][4] = 1.3, 0.5
    p["use_mask"][6] = 1
    words = K.grammar_mask_words(V)
    ref_hist = p["histogram"].copy()
    ref = np.zeros(R, np.int32)
    K.sample_biased(logits, *[p[k] if k != "histogram" else ref_hist for k in BIASED_ORDER],
                    ref, R, V, words)
    got = gpu.run("sample_biased", logits, *[p[k] for k in BIASED_ORDER],
                  np.zeros(R, np.int32), R, V, words)
    np.testing.assert_array_equal(got["sampled"], ref)
    np.testing.assert_array_equal(got["histogram"], ref_hist)
    assert (got["logit_bias"] == p["logit_bias"]).all()  # read only


def test_sample_biased_seeded_batch_independent(gpu, rng):
    R, V, S = 8, 4096, 8
    logits, p = _sample_inputs(rng, R, V, S)
    p["logit_bias"] = rng.uniform(-5, 5, (S, V)).astype(np.float32)
    p["use_bias"] = np.ones(R, np.int32)
    p["top_p"][:] = 0.95
    words = K.grammar_mask_words(V)

    def run(q, lg, rows):
        return gpu.run("sample_biased", lg, *[q[k] for k in BIASED_ORDER],
                       np.zeros(rows, np.int32), rows, V, words)["sampled"]

    first = run(p, logits, R)
    perm = rng.permutation(R)
    per_slot = ("histogram", "logit_bias")
    q = {k: (v[perm] if k not in per_slot else v) for k, v in p.items()}
    np.testing.assert_array_equal(run(q, logits[perm], R), first[perm])
    one = {k: (v[3:4] if k not in per_slot else v) for k, v in p.items()}
    assert run(one, logits[3:4], 1)[0] == first[3]


@pytest.mark.parametrize("V", [5000, 49152, 128256])
def test_token_logprobs_matches_reference(gpu, rng, V):
    """The raw-distribution logprobs record (top 20) against the NumPy reference and an
    independent float64 log_softmax; rows that ask nothing and padding rows stay
    poisoned."""
    R, TOP = 9, 20
    logits = (rng.standard_normal((R, V)) * 4).astype(np.float32)
    logits[4, 100:130] = 30.0  # a 30-way tie at the top: ids ascending
    slot = rng.permutation(16)[:R].astype(np.int32)
    slot[7] = -1  # padding
    sampled = rng.integers(0, V, R).astype(np.int32)
    k = np.array([20, 0, 5, 1, 20, -1, 13, 20, 20], np.int32)
    ref_lp = np.full((R, 1 + TOP), np.nan, np.float32)
    ref_ids = np.full((R, TOP), -7777, np.int32)
    K.token_logprobs(logits, slot, sampled, k, ref_lp, ref_ids, R, V, TOP)
    got = gpu.run("token_logprobs", logits, slot, sampled, k,
                  np.zeros((R, 1 + TOP), np.float32), np.zeros((R, TOP), np.int32), R, V, TOP)
    for r in range(R):
        n = int(k[r]) if slot[r] >= 0 else -1
        if n < 0:
            assert np.isnan(got["logprobs"][r]).all() and (got["top_ids"][r] == -7777).all()
            continue
        np.testing.assert_array_equal(got["top_ids"][r, :n], ref_ids[r, :n])
        assert (got["top_ids"][r, n:] == -7777).all() and np.isnan(got["logprobs"][r, 1 + n:]).all()
        np.testing.assert_allclose(got["logprobs"][r, :1 + n], ref_lp[r, :1 + n], atol=2e-5)
        z = logits[r].astype(np.float64)
        lse = z.max() + np.log(np.exp(z - z.max()).sum())
        np.testing.assert_allclose(got["logprobs"][r, 0], z[sampled[r]] - lse, atol=2e-5)
    assert got["top_ids"][4, :20].tolist() == list(range(100, 120))


@pytest.mark.parametrize("rule", ["v1", "v2"])
@pytest.mark.parametrize("H,KVH,HD,split,B,ctx", [
    (9, 3, 64, 128, 5, 0), (32, 8, 128, 64, 5, 0), (9, 3, 64, 64, 8, 0),
    (32, 8, 128, 64, 64, 160), (32, 8, 128, 64, 64, 1000), (9, 3, 64, 64, 64, 1000)])
def test_attention_decode_split_merge(gpu, rng, monkeypatch, rule, H, KVH, HD, split, B, ctx):
    """Both launch rules (``HELIOS_ATTN_RULE``); ``ctx`` > 0: 8B-shaped batches of 64 rows
    at about ``ctx`` positions (MP * PT = 2048), NaN in the cache past each row's context
    and unmapped page ids past its last page."""
    from helios_ignition.capture import launch

    monkeypatch.setattr(launch, "ATTN_RULE", rule)
    PT, MP = 16, (32 if not ctx else 128)
    S = max(6, B)
    pages, kc, vc = _cache_case(rng, H, KVH, HD, PT=PT, MP=MP, S=S)
    NS = PT * MP // split
    qkv = rng.standard_normal((B, (H + 2 * KVH) * HD)).astype(np.float32)
    slot = rng.permutation(S)[:B].astype(np.int32)
    slot[2] = -1
    if ctx:
        pos = np.full(B, ctx - 1, np.int32) - rng.integers(0, 16, B).astype(np.int32)
    else:
        pos = rng.integers(0, PT * MP, B).astype(np.int32)
    pos[0] = 0
    scale = HD ** -0.5
    ml = np.zeros((B, H, NS, 2), np.float32)
    po = np.zeros((B, H, NS, HD), np.float32)
    K.attention_decode_split(qkv, pos, slot, pages, kc, vc, ml, po, B, MP, PT, H, KVH, HD,
                             NS, split, scale)
    ref = np.zeros((B, H * HD), np.float32)
    K.attention_decode(qkv, pos, slot, pages, kc, vc, ref, B, MP, PT, H, KVH, HD, scale)
    if ctx:  # what the kernel must not read
        kc, vc, pages = kc.copy(), vc.copy(), pages.copy()
        for b in np.flatnonzero(slot >= 0):
            c = int(pos[b]) + 1
            last = (c - 1) // PT
            kc[pages[slot[b], last], (c - 1) % PT + 1:] = np.nan
            vc[pages[slot[b], last], (c - 1) % PT + 1:] = np.nan
            pages[slot[b], last + 1:] = 1 << 30
    got = gpu.run("attention_decode_split", qkv, pos, slot, pages, kc, vc, np.zeros_like(ml),
                  np.zeros_like(po), B, MP, PT, H, KVH, HD, NS, split, scale)
    assert rel(got["part_ml"], ml) < 1e-5 and rel(got["part_o"], po) < 1e-5
    out = gpu.run("attention_decode_merge", got["part_ml"], got["part_o"], slot,
                  np.zeros_like(ref), B, H, HD, NS)["out"]
    assert rel(out, ref) < 1e-5


def _long_case(rng, H, KVH, HD, B, ctx, PT=16, MP=512):
    """A page table of MP * PT = 8,192 positions (the serving recipes' capacity), rows at
    about `ctx` positions (row 0 at position 0, one padding row), and the cache and page
    table the kernel gets: NaN past each row's context in its last page, unmapped page ids
    past it."""
    S = B + 1
    P = S * (-(-ctx // PT) + 1)
    pages = np.full((S, MP), 1 << 30, np.int32)
    used = -(-ctx // PT) + 1
    pages[:, :used] = rng.permutation(P)[:S * used].reshape(S, used)
    kc = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    vc = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    qkv = rng.standard_normal((B, (H + 2 * KVH) * HD)).astype(np.float32)
    slot = rng.permutation(S)[:B].astype(np.int32)
    pos = (np.full(B, ctx - 1) - rng.integers(0, 24, B)).clip(0).astype(np.int32)
    pos[0] = 0
    if B > 2:
        slot[2] = -1
    kn, vn = kc.copy(), vc.copy()
    for b in np.flatnonzero(slot >= 0):
        c = int(pos[b]) + 1
        last = (c - 1) // PT
        kn[pages[slot[b], last], (c - 1) % PT + 1:] = np.nan
        vn[pages[slot[b], last], (c - 1) % PT + 1:] = np.nan
    return pages, kc, vc, kn, vn, qkv, slot, pos


def _assert_parts(got, ml, po, slot):
    """The split kernel's partials against the reference's, on what the merge reads: the
    statistics of every split of a live row, the outputs of its live splits (the live-split
    layout leaves the rest unwritten: poisoned)."""
    live = slot >= 0
    written = live[:, None, None] & (ml[..., 1] != 0)
    assert rel(got["part_ml"][live], ml[live]) < 1e-5
    assert rel(got["part_o"][written], po[written]) < 1e-5


# (H, KVH, HD, B, ctx): small NumPy references (the device time of these tests is mostly
# the host's reference), every launch-rule branch: one tile per split at HD 64 and 128,
# several splits per program at 64 rows, an odd head dim.
LONG_CASES = [(9, 3, 64, 1, 4096), (9, 3, 64, 8, 512), (9, 3, 64, 64, 130),
              (32, 8, 128, 1, 2048), (32, 8, 128, 64, 200), (6, 2, 40, 5, 700)]


@pytest.mark.parametrize("rule", ["v3"])
@pytest.mark.parametrize("H,KVH,HD,B,ctx", LONG_CASES)
def test_attention_decode_split_merge_long(gpu, rng, monkeypatch, rule, H, KVH, HD, B, ctx):
    """Split + merge under the default rule at the recipes' 8,192-position capacity
    (``decode_splits``: 128 splits of 64 positions; several per program at 64 rows) and
    the tuned kernel at 16 splits (512 positions each: longer than a tile), against the
    NumPy references (rules v1 / v2: test_attention_decode_split_merge)."""
    from helios_ignition.capture import launch
    from helios_ignition.capture.buffers import decode_splits

    monkeypatch.setattr(launch, "ATTN_RULE", rule)
    MP, PT = 512, 16
    NS, split = decode_splits(MP * PT)
    pages, kc, vc, kn, vn, qkv, slot, pos = _long_case(rng, H, KVH, HD, B, ctx)
    scale = HD ** -0.5
    ref = np.zeros((B, H * HD), np.float32)
    K.attention_decode(qkv, pos, slot, pages, kc, vc, ref, B, MP, PT, H, KVH, HD, scale)
    ml = np.zeros((B, H, NS, 2), np.float32)
    po = np.zeros((B, H, NS, HD), np.float32)
    K.attention_decode_split(qkv, pos, slot, pages, kc, vc, ml, po, B, MP, PT, H, KVH, HD,
                             NS, split, scale)
    got = gpu.run("attention_decode_split", qkv, pos, slot, pages, kn, vn, np.zeros_like(ml),
                  np.zeros_like(po), B, MP, PT, H, KVH, HD, NS, split, scale)
    _assert_parts(got, ml, po, slot)
    out = gpu.run("attention_decode_merge", got["part_ml"], got["part_o"], slot,
                  np.zeros_like(ref), B, H, HD, NS)["out"]
    assert rel(out, ref) < 1e-5
    choice = np.array([16], np.int32)
    tml, tpo = np.zeros_like(ml), np.zeros_like(po)
    K.attention_decode_split_tuned(qkv, pos, slot, pages, kc, vc, tml, tpo, choice, B, MP, PT,
                                   H, KVH, HD, NS, split, scale)
    got = gpu.run("attention_decode_split_tuned", qkv, pos, slot, pages, kn, vn, tml.copy(),
                  tpo.copy(), choice, B, MP, PT, H, KVH, HD, NS, split, scale)
    assert rel(got["part_ml"][:, :, :16], tml[:, :, :16]) < 1e-5
    assert rel(got["part_o"][:, :, :16], tpo[:, :, :16]) < 1e-5
    out = gpu.run("attention_decode_merge_tuned", got["part_ml"], got["part_o"], slot, choice,
                  np.zeros_like(ref), B, H, HD, NS)["out"]
    assert rel(out, ref) < 1e-5


@pytest.mark.parametrize("H,KVH,HD,B,ctx,walk", [
    (9, 3, 64, 8, 60, False), (9, 3, 64, 64, 130, False), (32, 8, 128, 1, 2048, False),
    (6, 2, 40, 5, 700, False), (32, 8, 128, 8, 700, True)])
def test_attention_decode_fused(gpu, rng, H, KVH, HD, B, ctx, walk):
    """One-launch split + merge (``HELIOS_ATTN_FUSED=1``) against the NumPy reference: rows of one split (written by
    the split itself) and of many (merged by the program completing the last split), the
    split counters zero afterwards, bitwise the same on a second launch and for a row
    whatever its neighbours (the same row alone in a batch of one). The recipes'
    partition of 8,192 positions (``decode_splits``), and (`walk`) 32 splits of 256
    positions, longer than a tile (GROUPED=3's walk)."""
    MP, PT = 512, 16
    from helios_ignition.capture.buffers import decode_splits

    NS, split = (32, 256) if walk else decode_splits(MP * PT)
    pages, kc, vc, kn, vn, qkv, slot, pos = _long_case(rng, H, KVH, HD, B, ctx)
    scale = HD ** -0.5
    ref = np.zeros((B, H * HD), np.float32)
    K.attention_decode(qkv, pos, slot, pages, kc, vc, ref, B, MP, PT, H, KVH, HD, scale)
    ml = np.full((B, H, NS, 2), np.nan, np.float32)
    po = np.full((B, H, NS, HD), np.nan, np.float32)
    arrivals = np.zeros((B, KVH), np.int32)
    args = (qkv, pos, slot, pages, kn, vn, ml, po, arrivals, np.zeros_like(ref), B, MP, PT, H,
            KVH, HD, NS, split, scale)
    first = gpu.run("attention_decode_fused", *args)
    assert rel(first["out"], ref) < 1e-5
    assert (first["arrivals"] == 0).all()
    again = gpu.run("attention_decode_fused", *args)
    assert np.array_equal(again["out"].view(np.uint32), first["out"].view(np.uint32))
    b = B - 1  # the last row alone
    alone = gpu.run("attention_decode_fused", qkv[b:], pos[b:], slot[b:], pages, kn, vn,
                    ml[b:], po[b:], arrivals[b:], np.zeros_like(ref[b:]), 1, MP, PT, H, KVH,
                    HD, NS, split, scale)
    assert np.array_equal(alone["out"].view(np.uint32), first["out"][b:].view(np.uint32))


# Batched-decode GEMM path (kernels_triton/mma.py): packed bf16 terms, K-split products,
# fixed-order reduction, at the 8B matrices and ragged shapes.
@pytest.mark.parametrize("T,K_", [(8, 4096), (37, 576), (256, 14336)])
def test_split_bf16_exact(gpu, rng, T, K_):
    x = (rng.standard_normal((T, K_)) * 5).astype(np.float32)
    ref = np.zeros_like(x)
    K.split_bf16(x, ref, T, K_)
    out = gpu.run("split_bf16", x, np.zeros_like(x), T, K_)["out"]
    assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))  # RNE on both sides
    assert rel(unpack_terms(out, T, K_), x) < 1e-5


@pytest.mark.parametrize("T,F", [(8, 14336), (19, 1536)])
def test_swiglu_split_bf16(gpu, rng, T, F):
    gu = (rng.standard_normal((T, 2 * F)) * 3).astype(np.float32)
    ref = np.zeros((T, F), np.float32)
    K.swiglu_split_bf16(gu, ref, T, F)
    out = gpu.run("swiglu_split_bf16", gu, np.zeros((T, F), np.float32), T, F)["out"]
    act = np.zeros((T, F), np.float32)
    K.silu_mul(gu, act, T, F)
    assert rel(unpack_terms(out, T, F), unpack_terms(ref, T, F)) < 5e-6  # silu: 1-ulp exp
    assert rel(unpack_terms(out, T, F), act) < 1e-5


MMA_CASES = [(8, 6144, 4096), (16, 4096, 4096), (32, 28672, 4096), (64, 4096, 14336),
             (128, 6144, 4096), (256, 4096, 14336), (5, 1000, 1000), (70, 3072, 576)]


@pytest.mark.parametrize("T,N,K_", MMA_CASES)
def test_linear_packed_splitk(gpu, rng, T, N, K_):
    """The launch rule's tiles and K slices: partials vs the reference's, then the
    reduction (same f32 order: bitwise) and the whole product vs linear."""
    from helios_ignition.capture.launch import mma_splits

    S = mma_splits(T, N, K_)
    x = rng.standard_normal((T, K_)).astype(np.float32)
    bits, w = bf16_round((rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32))
    xs = np.zeros_like(x)
    K.split_bf16(x, xs, T, K_)
    ref_p = np.zeros((S * T, N), np.float32)
    K.linear_packed(xs, w, ref_p, T, N, K_, S)
    part = gpu.run("linear_packed", xs, bits, np.zeros_like(ref_p), T, N, K_, S,
                   bf16=("weight",))["partial"]
    assert rel(part, ref_p) < 5e-5
    ref = np.zeros((T, N), np.float32)
    K.splitk_reduce(part, ref, T, N, S)
    out = gpu.run("splitk_reduce", part, np.zeros_like(ref), T, N, S)["out"]
    assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))
    full = np.zeros((T, N), np.float32)
    K.linear(x, w, full, T, N, K_)
    assert rel(out, full) < 5e-5
    res = (rng.standard_normal((T, N)) * 3).astype(np.float32)
    ref_add = res.copy()
    K.splitk_reduce_add(part, ref_add, T, N, S)
    got = gpu.run("splitk_reduce_add", part, res, T, N, S)["out"]
    assert np.array_equal(got.view(np.uint32), ref_add.view(np.uint32))


@pytest.mark.parametrize("S", [1, 3, 7])
def test_linear_packed_rows_independent(gpu, rng, S):
    """Row 0's partials are bitwise the same whatever the other rows hold."""
    T, N, K_ = 48, 4096, 4096
    bits, _ = bf16_round((rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32))
    runs = []
    for _ in range(2):
        x = rng.standard_normal((T, K_)).astype(np.float32)
        x[0] = np.linspace(-3, 3, K_, dtype=np.float32)
        xs = np.zeros_like(x)
        K.split_bf16(x, xs, T, K_)
        p = gpu.run("linear_packed", xs, bits, np.zeros((S * T, N), np.float32), T, N, K_, S,
                    bf16=("weight",))["partial"]
        runs.append(p.reshape(S, T, N)[:, 0])
    assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))


@pytest.mark.parametrize("T,N,K_,S", [(8, 6144, 4096, 4), (64, 4096, 14336, 2), (3, 100, 40, 1)])
def test_linear_partial_splitk(gpu, rng, T, N, K_, S):
    x = rng.standard_normal((T, K_)).astype(np.float32)
    bits, w = bf16_round((rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32))
    ref_p = np.zeros((S * T, N), np.float32)
    K.linear_partial(x, w, ref_p, T, N, K_, S)
    part = gpu.run("linear_partial", x, bits, np.zeros_like(ref_p), T, N, K_, S,
                   bf16=("weight",))["partial"]
    assert rel(part, ref_p) < 5e-5


# Prefill tile paths (TC=1, issue 27): the launch rule's tiles beyond the batched-decode
# rows at the 8B matrices, ragged row counts (partial token tiles), both activation forms.
PREFILL_CASES = [(300, 6144, 4096), (520, 4096, 4096), (1030, 28672, 4096), (257, 4096, 14336)]


@pytest.mark.parametrize("terms", [2, 1])
@pytest.mark.parametrize("T,N,K_", PREFILL_CASES)
def test_linear_packed_prefill_tc(gpu, rng, monkeypatch, terms, T, N, K_):
    """split_bf16 + linear_packed (one slice, TC=1): hi/lo against linear's reference
    (near f32), one term (round_bf16's hi | 0, XSPLIT=0) against the reference over
    activations rounded to bf16; every element written (poisoned output), a second
    launch bitwise equal."""
    from helios_ignition.capture import launch

    monkeypatch.setattr(launch, "PREFILL_PACKED", True)  # the default (HELIOS_LINEAR_PREFILL_PACKED)
    assert launch.mma_plan(T, N, K_) == 1
    x = rng.standard_normal((T, K_)).astype(np.float32)
    bits, w = bf16_round((rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32))
    xs = np.zeros_like(x)
    (K.split_bf16 if terms == 2 else K.round_bf16)(x, xs, T, K_)
    runs = [gpu.run("linear_packed", xs, bits, np.zeros((T, N), np.float32), T, N, K_, 1,
                    bf16=("weight",), rounded=terms == 1)["partial"] for _ in range(2)]
    assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))
    ref = np.zeros((T, N), np.float32)
    if terms == 2:
        K.linear(x, w, ref, T, N, K_)
        assert rel(runs[0], ref) < 5e-5
    else:
        K.linear(bf16_round(x)[1], w, ref, T, N, K_)
        assert rel(runs[0], ref) < 5e-5
        full = np.zeros((T, N), np.float32)
        K.linear(x, w, full, T, N, K_)
        assert 1e-4 < rel(runs[0], full) < 1e-2  # activations rounded to bf16


@pytest.mark.parametrize("T,N,K_", PREFILL_CASES)
def test_linear_prefill_tc_folded(gpu, rng, T, N, K_):
    """The linear kernel's TC=1 tile over f32 activations (hi/lo) on linear, and the
    folded ops (rmsnorm_linear, linear_add) at the same rows under their launch rule."""
    from helios_ignition.capture import launch

    class _V:
        shape, buffer = (N, K_), type("D", (), {"dtype": "bf16"})()

    assert launch.launch_config("linear", [T, N, K_], [None, _V]).constants["TC"] == 1
    x = (rng.standard_normal((T, K_)) * 3).astype(np.float32)
    g = (1 + 0.1 * rng.standard_normal(K_)).astype(np.float32)
    bits, w = bf16_round((rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32))
    ref = np.zeros((T, N), np.float32)
    K.linear(x, w, ref, T, N, K_)
    outs = [gpu.run("linear", x, bits, np.zeros_like(ref), T, N, K_, bf16=("weight",))["out"]
            for _ in range(2)]
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    assert rel(outs[0], ref) < 5e-5
    K.rmsnorm_linear(x, g, w, ref, T, N, K_, 1e-5)
    out = gpu.run("rmsnorm_linear", x, g, bits, np.zeros_like(ref), T, N, K_, 1e-5,
                  bf16=("weight",))["out"]
    assert rel(out, ref) < 5e-5
    res = (rng.standard_normal((T, N)) * 3).astype(np.float32)
    ref = res.copy()
    K.linear_add(x, w, ref, T, N, K_)
    out = gpu.run("linear_add", x, bits, res, T, N, K_, bf16=("weight",))["out"]
    assert rel(out - res, ref - res) < 5e-5


def _live_case(rng, H, KVH, HD, B, MP=512, PT=16):
    """Rows of every length 1 .. MP * PT (the recipes' 8,192-position capacity): row 0 at
    position 0, row 1 (B > 1) at the last position, the rest mostly short with a few long
    ones, one padding row (B > 2). Page-table rows index a shared 640-page pool (reads
    only; keeps the 8B geometry's cache at 42 MB) and hold unmapped ids past each row's
    last page."""
    P = 640
    kc = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    vc = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    qkv = rng.standard_normal((B, (H + 2 * KVH) * HD)).astype(np.float32)
    pos = rng.integers(0, 300, B)
    long = rng.random(B) < 0.05
    pos[long] = rng.integers(300, MP * PT, int(long.sum()))
    pos[0] = 0
    if B > 1:
        pos[1] = MP * PT - 1
    pos = pos.astype(np.int32)
    slot = np.arange(B, dtype=np.int32)
    if B > 2:
        slot[2] = -1
    pages = rng.integers(0, P, (B, MP)).astype(np.int32)
    for b in range(B):
        pages[b, int(pos[b]) // PT + 1:] = 1 << 30
    return pages, kc, vc, qkv, slot, pos


def _split_merge(gpu, qkv, pos, slot, pages, kc, vc, B, MP, PT, H, KVH, HD, NS, split, scale):
    ml = np.zeros((B, H, NS, 2), np.float32)
    got = gpu.run("attention_decode_split", qkv, pos, slot, pages, kc, vc, ml,
                  np.zeros((B, H, NS, HD), np.float32), B, MP, PT, H, KVH, HD, NS, split,
                  scale)
    out = gpu.run("attention_decode_merge", got["part_ml"], got["part_o"], slot,
                  np.zeros((B, H * HD), np.float32), B, H, HD, NS)["out"]
    return got, out


@pytest.mark.parametrize("B,MP", [(1, 512), (8, 512), (64, 512), (256, 512), (8, 1024),
                                  (256, 1024)])
@pytest.mark.parametrize("H,KVH,HD", [(32, 8, 128), (9, 3, 64)])
def test_attention_decode_live_splits(gpu, rng, monkeypatch, H, KVH, HD, B, MP):
    """Rule v3's live-split layout (``LIVE``: programs over each row's live splits only,
    empty splits' outputs unwritten) at 1, 8, 64 and 256 rows of 1 .. 8,192 positions
    (one tile a split) and 8 and 256 rows of 1 .. 16,384 (128 splits of 128: GROUPED=3's
    walk), against the NumPy reference row by row (poisoned outputs); and each row
    bitwise what it gets alone in a batch of one (another LIVE), under other program
    counts, and under the knob's 0 (a program per split, several per program at 64+ rows
    of one-tile splits): the results depend on neither the bucket nor the layout."""
    from helios_ignition.capture import launch
    from helios_ignition.capture.buffers import decode_splits

    monkeypatch.setattr(launch, "ATTN_LIVE", 4096)  # the default, whatever the env says
    monkeypatch.setattr(launch, "ATTN_LIVE_MIN_ROWS", 1)
    PT = 16
    NS, split = decode_splits(MP * PT)
    pages, kc, vc, qkv, slot, pos = _live_case(rng, H, KVH, HD, B, MP=MP)
    scale = HD ** -0.5
    args = (B, MP, PT, H, KVH, HD, NS, split, scale)
    c = launch.attention_split_constants(B, H, KVH, HD, NS, split)
    assert c["LIVE"] == min(NS, -(-launch.ATTN_LIVE // (B * KVH)))
    assert c["GROUPED"] == (3 if split > 64 else 2)
    got, out = _split_merge(gpu, qkv, pos, slot, pages, kc, vc, *args)
    ref = np.zeros((B, H * HD), np.float32)
    ml = np.zeros((1, H, NS, 2), np.float32)
    po = np.zeros((1, H, NS, HD), np.float32)
    for b in np.flatnonzero(slot >= 0):  # row by row: the reference pads to the longest
        one = (qkv[b:b + 1], pos[b:b + 1], slot[b:b + 1], pages, kc, vc)
        K.attention_decode(*one, ref[b:b + 1], 1, MP, PT, H, KVH, HD, scale)
        K.attention_decode_split(*one, ml, po, 1, MP, PT, H, KVH, HD, NS, split, scale)
        _assert_parts({"part_ml": got["part_ml"][b:b + 1], "part_o": got["part_o"][b:b + 1]},
                      ml, po, slot[b:b + 1])
    assert rel(out, ref) < 1e-5
    assert (out[slot < 0] == 0).all()
    bits = out.view(np.uint32)
    for b in {0, B - 1, 1 % B}:
        alone = _split_merge(gpu, qkv[b:b + 1], pos[b:b + 1], slot[b:b + 1], pages, kc, vc,
                             1, *args[1:])[1]
        assert np.array_equal(alone.view(np.uint32), bits[b:b + 1]), b
    for target in (1, 3 * B * KVH, 0):  # one program a (row, kv head); 3; the old grid
        monkeypatch.setattr(launch, "ATTN_LIVE", target)
        again = _split_merge(gpu, qkv, pos, slot, pages, kc, vc, *args)[1]
        assert np.array_equal(again.view(np.uint32), bits), target
