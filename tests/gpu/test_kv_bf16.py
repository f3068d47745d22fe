"""The bf16 KV cache forms (``*_bf16kv``: the f32 entry points over bf16 planes,
kernels_triton/kv_bf16.py) against their NumPy references (helios_tools/kernels/
kv_bf16.py) on fresh random inputs.

Outputs are poisoned (NaN / -7777) before each launch. The cache holds random bf16 bit
patterns; past each row's context its last page holds NaN bits (0x7FC0) and its page
table unmapped ids, which a reader must never touch. The writes are compared bit for bit
(round to nearest even on both sides: ``cvt.rn.bf16.f32`` and ``encode_bf16``, exact ties
included); the readers within f32 rounding of the references (the same arithmetic over
the same widened values, summed in another order).

    uv run pytest tests/gpu/test_kv_bf16.py -q      # on the GPU machine
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from helios_tools import kernels as K
from helios_tools.kernels.kv_bf16 import decode_bf16, encode_bf16

pytestmark = pytest.mark.gpu

BF16_NAN = 0x7FC0
ROOT = Path(__file__).resolve().parents[2]
GOLDENS = json.loads((ROOT / "tests/golden/smollm2_goldens.json").read_text())


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "GPU output holds NaN/inf (unwritten or poisoned)"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.fixture
def rng(request):
    return np.random.default_rng(abs(hash(request.node.name)) % 2**32)


def _case(rng, H, KVH, HD, B, ctx, PT=16, MP=512):
    """Rows at about `ctx` positions (row 0 at position 0, row 2 padding when B > 2) over
    a bf16 cache: (pages, bits k, v, the bits the kernel gets (NaN past each row's
    context), qkv, slot, pos)."""
    S = B + 1
    used = -(-ctx // PT) + 1
    P = S * used
    pages = np.full((S, MP), 1 << 30, np.int32)
    pages[:, :used] = rng.permutation(P)[:S * used].reshape(S, used)
    kc = encode_bf16(rng.standard_normal((P, PT, KVH, HD)) * 2)
    vc = encode_bf16(rng.standard_normal((P, PT, KVH, HD)) * 2)
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
        kn[pages[slot[b], last], (c - 1) % PT + 1:] = BF16_NAN
        vn[pages[slot[b], last], (c - 1) % PT + 1:] = BF16_NAN
    return pages, kc, vc, kn, vn, qkv, slot, pos


@pytest.mark.parametrize("H,KVH,HD", [(9, 3, 64), (32, 8, 128)])
def test_kv_write_bf16kv(gpu, rng, H, KVH, HD):
    """Bit for bit, exact ties (low half 0x8000) of both parities and values past the
    largest bfloat16 included, padding writing nothing; ``rope_kv_write_bf16kv``: the
    rotated keys' bits (RoPE's cos/sin may differ from NumPy's by an ulp, so a key may sit
    one bf16 step away) and qkv as ``rope``'s."""
    T, R, PT, MP, P = 9, 4, 16, 8, 40
    width = (H + 2 * KVH) * HD
    qkv = (rng.standard_normal((T, width)) * 30).astype(np.float32)
    u = qkv.view(np.uint32)
    u[:, H * HD::5] = (u[:, H * HD::5] & 0xFFFF0000) | 0x8000  # ties, both parities
    qkv[0, H * HD] = 3.4e38  # rounds to +inf (beyond the largest bfloat16)
    trow = np.array([0, 0, 1, -1, 2, 2, 2, 3, 3], np.int32)
    slot = np.array([3, 0, 4, -1], np.int32)
    pos = np.array([5, 6, 0, 0, 17, 18, 19, 1, 2], np.int32)
    pages = rng.permutation(P)[:5 * MP].reshape(5, MP).astype(np.int32)
    kc = encode_bf16(rng.standard_normal((P, PT, KVH, HD)))
    vc = encode_bf16(rng.standard_normal((P, PT, KVH, HD)))
    rk, rv = kc.copy(), vc.copy()
    K.reference_op("kv_write_bf16kv")(qkv, pos, trow, slot, pages, rk, rv, T, R, MP, PT, H,
                                      KVH, HD)
    assert decode_bf16(rk[pages[slot[trow[0]], pos[0] // PT], pos[0] % PT, 0, 0]) == np.inf
    got = gpu.run("kv_write_bf16kv", qkv, pos, trow, slot, pages, kc, vc, T, R, MP, PT, H, KVH,
                  HD)
    assert np.array_equal(got["k_cache"], rk) and np.array_equal(got["v_cache"], rv)
    inv = (1.0 / 10000 ** (np.arange(HD // 2) / (HD // 2))).astype(np.float32)
    qkv[0, H * HD] = 1.0
    rq, rk, rv = qkv.copy(), kc.copy(), vc.copy()
    K.reference_op("rope_kv_write_bf16kv")(rq, pos, inv, trow, slot, pages, rk, rv, T, R, MP,
                                           PT, H, KVH, HD)
    got = gpu.run("rope_kv_write_bf16kv", qkv, pos, inv, trow, slot, pages, kc, vc, T, R, MP,
                  PT, H, KVH, HD)
    assert rel(got["qkv"], rq) < 1e-6
    assert np.array_equal(got["v_cache"], rv)
    differ = got["k_cache"] != rk
    assert differ.mean() < 1e-3
    steps = np.abs(got["k_cache"][differ].astype(int) - rk[differ].astype(int))
    assert (steps == 1).all()


def test_row_copy_bf16kv(gpu, rng):
    """The TRANSFER programs' row copy of bf16 planes: rows bit for bit, padding rows and
    the rows not named untouched."""
    ROW = 16 * 8 * 128  # a page of the 8B geometry
    src = encode_bf16(rng.standard_normal((12, ROW)))
    dst = encode_bf16(rng.standard_normal((6, ROW)))
    rows, to = np.array([11, -1, 0, 5], np.int32), np.array([2, 0, 5, -1], np.int32)
    ref = dst.copy()
    K.reference_op("row_copy_bf16kv")(src, ref, rows, to, 4, ROW)
    got = gpu.run("row_copy_bf16kv", src, dst, rows, to, 4, ROW)
    assert np.array_equal(got["dst"], ref)


LONG_CASES = [(9, 3, 64, 1, 4096), (9, 3, 64, 64, 130), (32, 8, 128, 1, 2048),
              (32, 8, 128, 64, 200), (32, 8, 128, 256, 1100), (6, 2, 40, 5, 700)]


@pytest.mark.parametrize("rule", ["v1", "v2", "v3", "v3-spp"])
@pytest.mark.parametrize("H,KVH,HD,B,ctx", LONG_CASES)
def test_attention_decode_split_bf16kv(gpu, rng, monkeypatch, rule, H, KVH, HD, B, ctx):
    """Split + merge under every launch rule (each GROUPED layout; v3: the live-split
    layout at the default HELIOS_ATTN_LIVE, v3-spp: without it), and the tuned kernel at
    16 splits, at the recipes' 8,192-position capacity; 256 rows as the serving recipe."""
    from helios_ignition.capture import launch
    from helios_ignition.capture.buffers import decode_splits

    monkeypatch.setattr(launch, "ATTN_RULE", rule.removesuffix("-spp"))
    monkeypatch.setattr(launch, "ATTN_LIVE", 0 if rule.endswith("-spp") else 4096)
    monkeypatch.setattr(launch, "ATTN_LIVE_MIN_ROWS", 1)
    MP, PT = 512, 16
    NS, split = decode_splits(MP * PT)
    pages, kc, vc, kn, vn, qkv, slot, pos = _case(rng, H, KVH, HD, B, ctx)
    scale = HD ** -0.5
    ref = np.zeros((B, H * HD), np.float32)
    K.attention_decode(qkv, pos, slot, pages, decode_bf16(kc), decode_bf16(vc), ref, B, MP, PT,
                       H, KVH, HD, scale)
    ml = np.zeros((B, H, NS, 2), np.float32)
    po = np.zeros((B, H, NS, HD), np.float32)
    K.reference_op("attention_decode_split_bf16kv")(qkv, pos, slot, pages, kc, vc, ml, po, B,
                                                    MP, PT, H, KVH, HD, NS, split, scale)
    got = gpu.run("attention_decode_split_bf16kv", qkv, pos, slot, pages, kn, vn,
                  np.zeros_like(ml), np.zeros_like(po), B, MP, PT, H, KVH, HD, NS, split, scale)
    live = slot >= 0
    written = live[:, None, None] & (ml[..., 1] != 0)
    assert rel(got["part_ml"][live], ml[live]) < 1e-5
    assert rel(got["part_o"][written], po[written]) < 1e-5
    out = gpu.run("attention_decode_merge", got["part_ml"], got["part_o"], slot,
                  np.zeros_like(ref), B, H, HD, NS)["out"]
    assert rel(out, ref) < 1e-5
    choice = np.array([16], np.int32)
    tml, tpo = np.zeros_like(ml), np.zeros_like(po)
    K.reference_op("attention_decode_split_tuned_bf16kv")(qkv, pos, slot, pages, kc, vc, tml,
                                                          tpo, choice, B, MP, PT, H, KVH, HD,
                                                          NS, split, scale)
    got = gpu.run("attention_decode_split_tuned_bf16kv", qkv, pos, slot, pages, kn, vn,
                  tml.copy(), tpo.copy(), choice, B, MP, PT, H, KVH, HD, NS, split, scale)
    assert rel(got["part_ml"][:, :, :16], tml[:, :, :16]) < 1e-5
    assert rel(got["part_o"][:, :, :16], tpo[:, :, :16]) < 1e-5


@pytest.mark.parametrize("terms", [2, 1])
@pytest.mark.parametrize("layout", ["live", "grid"])
@pytest.mark.parametrize("H,KVH,HD,B,ctx,capacity", [
    (32, 8, 128, 256, 780, 4096), (32, 8, 128, 64, 1100, 8192), (32, 8, 128, 2, 2000, 2048),
    (9, 3, 64, 64, 130, 8192), (9, 3, 64, 8, 4000, 4096), (6, 2, 40, 5, 700, 8192),
    (32, 8, 128, 8, 3000, 32768), (9, 3, 64, 5, 3000, 32768)])  # fmt: skip
def test_attention_decode_split_mma_bf16kv(gpu, rng, monkeypatch, terms, layout, H, KVH, HD,
                                           B, ctx, capacity):
    """The opt-in tensor-core body (HELIOS_ATTN_MMA, GROUPED=4: query heads padded to 16
    MMA rows, bf16 K/V tiles into ``tl.dot``) over the live layout and the grid of NS
    splits, one-tile splits (capacities to 8,192) and walks of 4 tiles (32,768: splits of
    256), against the f32 NumPy reference (its own error ~1e-6) within the body's bound
    ``launch.ATTN_MMA_BOUND[terms]`` (5e-5 with two terms, 5e-2 with one) on the merged
    output's max |error| over max |output|, the split maxima's max |error| (logit units)
    and the sums' and split outputs' max relative errors; outputs NaN-poisoned,
    NaN bits past each row's context and unmapped pages past its last page; empty splits
    exactly (-1e30, 0) (and zero outputs on the NS grid); a padding row zeros. The live
    layout's merged output is bitwise the NS grid's: a split's arithmetic does not depend
    on which program computes it."""
    from helios_ignition.capture import launch
    from helios_ignition.capture.buffers import decode_splits

    monkeypatch.setattr(launch, "ATTN_RULE", "v3")
    monkeypatch.setattr(launch, "ATTN_MMA", str(terms))
    monkeypatch.setattr(launch, "ATTN_LIVE", 4096 if layout == "live" else 0)
    monkeypatch.setattr(launch, "ATTN_LIVE_MIN_ROWS", 1)
    PT = 16
    MP = capacity // PT
    NS, split = decode_splits(capacity)
    pages, kc, vc, kn, vn, qkv, slot, pos = _case(rng, H, KVH, HD, B, ctx, MP=MP)
    scale = HD ** -0.5
    args = (B, MP, PT, H, KVH, HD, NS, split, scale)
    c = launch.attention_split_constants(B, H, KVH, HD, NS, split, plane="bf16")
    assert c["GROUPED"] == 4 and c["TERMS"] == terms and c["BLOCK_G"] == 16
    ml = np.zeros((B, H, NS, 2), np.float32)
    po = np.zeros((B, H, NS, HD), np.float32)
    K.reference_op("attention_decode_split_bf16kv")(qkv, pos, slot, pages, kc, vc, ml, po,
                                                    *args)
    ref = np.zeros((B, H * HD), np.float32)
    K.attention_decode_merge(ml, po, slot, ref, B, H, HD, NS)
    got = gpu.run("attention_decode_split_bf16kv", qkv, pos, slot, pages, kn, vn,
                  np.zeros_like(ml), np.zeros_like(po), *args)
    out = gpu.run("attention_decode_merge", got["part_ml"], got["part_o"], slot,
                  np.zeros_like(ref), B, H, HD, NS)["out"]
    live = slot >= 0
    written = live[:, None, None] & (ml[..., 1] != 0)
    empty = live[:, None, None] & (ml[..., 1] == 0)
    gml, gpo = got["part_ml"], got["part_o"]
    assert np.isfinite(out).all() and np.isfinite(gml[live]).all()
    assert np.isfinite(gpo[written]).all()
    assert np.array_equal(gml[empty], ml[empty])  # (-1e30, 0)
    if layout == "grid":
        assert (gpo[empty] == 0).all()
    assert (out[~live] == 0).all()
    errs = {"out": float(np.abs(out - ref).max() / np.abs(ref).max()),
            "max": float(np.abs(gml[..., 0][written] - ml[..., 0][written]).max()),
            "sum": float((np.abs(gml[..., 1][written] - ml[..., 1][written])
                          / ml[..., 1][written]).max()),
            "o": float(np.abs(gpo[written] - po[written]).max() / np.abs(po[written]).max())}
    print(f"GROUPED=4 TERMS={terms} {layout} H={H} B={B} ctx={ctx} cap={capacity}:", errs)
    assert max(errs.values()) < launch.ATTN_MMA_BOUND[terms], errs
    if layout == "live":
        monkeypatch.setattr(launch, "ATTN_LIVE", 0)
        again = gpu.run("attention_decode_split_bf16kv", qkv, pos, slot, pages, kn, vn,
                        np.zeros_like(ml), np.zeros_like(po), *args)
        grid = gpu.run("attention_decode_merge", again["part_ml"], again["part_o"], slot,
                       np.zeros_like(ref), B, H, HD, NS)["out"]
        assert np.array_equal(grid.view(np.uint32), out.view(np.uint32))


@pytest.mark.parametrize("H,KVH,HD,B,ctx", [(9, 3, 64, 8, 60), (32, 8, 128, 1, 2048),
                                             (32, 8, 128, 64, 700), (6, 2, 40, 5, 700)])
def test_attention_decode_fused_bf16kv(gpu, rng, H, KVH, HD, B, ctx):
    """The one-launch form: within f32 rounding of the reference, counters zero after."""
    from helios_ignition.capture.buffers import decode_splits

    MP, PT = 512, 16
    NS, split = decode_splits(MP * PT)
    pages, kc, vc, kn, vn, qkv, slot, pos = _case(rng, H, KVH, HD, B, ctx)
    scale = HD ** -0.5
    ref = np.zeros((B, H * HD), np.float32)
    ml = np.zeros((B, H, NS, 2), np.float32)
    po = np.zeros((B, H, NS, HD), np.float32)
    arrivals = np.zeros((B, KVH), np.int32)
    K.reference_op("attention_decode_fused_bf16kv")(qkv, pos, slot, pages, kc, vc, ml.copy(),
                                                    po.copy(), arrivals, ref, B, MP, PT, H, KVH,
                                                    HD, NS, split, scale)
    got = gpu.run("attention_decode_fused_bf16kv", qkv, pos, slot, pages, kn, vn,
                  np.full_like(ml, np.nan), np.full_like(po, np.nan), arrivals,
                  np.zeros_like(ref), B, MP, PT, H, KVH, HD, NS, split, scale)
    assert rel(got["out"], ref) < 1e-5
    assert (got["arrivals"] == 0).all()


@pytest.mark.parametrize("H,KVH,HD,W", [(9, 3, 64, 0), (32, 8, 128, 0), (8, 4, 64, 37),
                                        (6, 2, 40, 0)])
def test_attention_prefill_and_window_bf16kv(gpu, rng, H, KVH, HD, W):
    """Prefill chunks (two rows, a padding token inside the chunk: also the mixed and
    speculative-verification rows, which read through this body) and, with `W`, the
    windowed prefill and decode: within f32 rounding (3xTF32 dots) of the references."""
    PT, MP, B, ctx = 16, 512, 4, 300
    pages, kc, vc, kn, vn, qkv, slot, pos = _case(rng, H, KVH, HD, B, ctx)
    scale = HD ** -0.5
    width = (H + 2 * KVH) * HD
    live = [b for b in range(B) if slot[b] >= 0 and pos[b] >= 4]
    rows = np.array([b for b in live for _ in range(5)] + [-1], np.int32)
    ppos = np.array([int(pos[b]) - 4 + i for b in live for i in range(5)] + [0], np.int32)
    T = len(rows)
    pq = rng.standard_normal((T, width)).astype(np.float32)
    window = (W,) if W else ()
    op = "attention_prefill_window_bf16kv" if W else "attention_prefill_bf16kv"
    ref = np.zeros((T, H * HD), np.float32)
    K.reference_op(op)(pq, ppos, rows, slot, pages, kc, vc, ref, T, B, MP, PT, H, KVH, HD,
                       *window, scale)
    got = gpu.run(op, pq, ppos, rows, slot, pages, kn, vn, np.zeros_like(ref), T, B, MP, PT, H,
                  KVH, HD, *window, scale)
    assert rel(got["out"], ref) < 1e-5
    assert (got["out"][-1] == 0).all()  # the padding token
    if W:
        dref = np.zeros((B, H * HD), np.float32)
        K.reference_op("attention_decode_window_bf16kv")(qkv, pos, slot, pages, kc, vc, dref, B,
                                                         MP, PT, H, KVH, HD, W, scale)
        got = gpu.run("attention_decode_window_bf16kv", qkv, pos, slot, pages, kn, vn,
                      np.zeros_like(dref), B, MP, PT, H, KVH, HD, W, scale)
        assert rel(got["out"], dref) < 1e-5


def _mixed_case(rng, H, KVH, HD, n_lanes, ctx, W, PT=16, MP=256):
    """A MIXED step's packed rows over a bf16 cache: `n_lanes` decode lanes first (row 0
    at position 0, row 1 padding: slot -1), the others at up to 200 positions below
    `ctx`; then chunks of 40 and 9 tokens starting mid-context, a single-token row after
    them (a block program's, not a lane) and three padding tokens. Past each row's last
    position its last page holds NaN bits and its page table unmapped ids, and so do the
    pages wholly behind the `W`-position window of its first token (W > 0).

    Returns:
        (page table, k and v bits of the reference, the page table and bits the kernel
        gets, q, token_row, slot, positions, the live lanes' token indices).
    """
    spec = [(int(c), 1) for c in ctx - rng.integers(0, 200, n_lanes)]
    spec[0] = (0, 1)
    spec += [(ctx - 60, 40), (ctx // 3, 9), (17, 1)]  # (context before the step, tokens)
    R = len(spec)
    S = R + 1
    used = -(-ctx // PT) + 1
    pages = np.full((S, MP), 1 << 30, np.int32)
    pages[:, :used] = rng.permutation(S * used).reshape(S, used)
    kc = encode_bf16(rng.standard_normal((S * used, PT, KVH, HD)) * 2)
    vc = encode_bf16(rng.standard_normal((S * used, PT, KVH, HD)) * 2)
    slot = rng.permutation(S)[:R].astype(np.int32)
    slot[1] = -1
    trow = np.array([r for r, (_, n) in enumerate(spec) for _ in range(n)] + [-1] * 3,
                    np.int32)
    pos = np.array([p for c, n in spec for p in range(c, c + n)] + [0] * 3, np.int32)
    kn, vn, pn = kc.copy(), vc.copy(), pages.copy()
    for r, (c, n) in enumerate(spec):
        if slot[r] < 0:
            continue
        end = c + n - 1
        kn[pn[slot[r], end // PT], end % PT + 1:] = BF16_NAN
        vn[pn[slot[r], end // PT], end % PT + 1:] = BF16_NAN
        pn[slot[r], end // PT + 1:] = 1 << 30
        for j in range(max(0, c - W + 1) // PT if W else 0):
            kn[pn[slot[r], j]] = vn[pn[slot[r], j]] = BF16_NAN
            pn[slot[r], j] = 1 << 30
    q = rng.standard_normal((len(trow), (H + 2 * KVH) * HD)).astype(np.float32)
    lanes = np.array([r for r in range(n_lanes) if slot[r] >= 0])
    return pages, kc, vc, pn, kn, vn, q, trow, slot, pos, lanes


@pytest.mark.parametrize("terms", [2, 1])
@pytest.mark.parametrize("H,KVH,HD,W,n_lanes,ctx", [
    (32, 8, 128, 0, 200, 1100),  # the 8B: ~200 lanes, as the slow H100 MIXED steps
    (32, 8, 128, 512, 16, 2000),
    (9, 3, 64, 0, 64, 700), (9, 3, 64, 300, 16, 2000),
    (6, 2, 40, 0, 8, 500)])  # fmt: skip
def test_attention_prefill_mma_lanes_bf16kv(gpu, rng, monkeypatch, terms, H, KVH, HD, W,
                                            n_lanes, ctx):
    """A MIXED step's decode lanes on the tensor cores (HELIOS_ATTN_MMA: ``_prefill_lane``
    with LANE_TERMS, the GROUPED=4 decode body's online softmax) beside prefill chunks in
    one ``attention_prefill_bf16kv`` (``_window_bf16kv`` with `W`) launch, against the f32
    NumPy reference: the lanes' max |error| over their max |output| within
    ``launch.ATTN_MMA_BOUND[terms]`` (5e-5 with two terms, 5e-2 with one; the
    interpreter's worst against float64 4.2e-6 and 3.9e-3: scripts/interpret_kernels.py
    mixedmma); every other token bitwise what the knob-off launch (the FMA lanes, within
    1e-5 of the reference) gives, the block programs being the same code; padding tokens
    (the padding lane row's included) zeros; outputs NaN-poisoned, NaN bits and unmapped
    pages past each row's context and behind its window."""
    from helios_ignition.capture import launch

    PT, MP = 16, 256
    pages, kc, vc, pn, kn, vn, q, trow, slot, pos, lanes = _mixed_case(
        rng, H, KVH, HD, n_lanes, ctx, W, PT, MP)
    T, R = len(trow), len(slot)
    window = (W,) if W else ()
    op = "attention_prefill_window_bf16kv" if W else "attention_prefill_bf16kv"
    args = (T, R, MP, PT, H, KVH, HD, *window, HD ** -0.5)
    ref = np.zeros((T, H * HD), np.float32)
    K.reference_op(op)(q, pos, trow, slot, pages, kc, vc, ref, *args)
    out = {}
    for mode in ("off", str(terms)):
        monkeypatch.setattr(launch, "ATTN_MMA", mode)
        c = launch.launch_config(op, list(args)).constants
        assert c.get("LANE_TERMS", 0) == (terms if mode != "off" else 0)
        out[mode] = gpu.run(op, q, pos, trow, slot, pn, kn, vn, np.zeros_like(ref),
                            *args)["out"]
    on, off = out[str(terms)], out["off"]
    pad = (trow < 0) | (slot[trow] < 0)
    rest = ~pad
    rest[lanes] = False
    assert np.isfinite(on).all() and np.isfinite(off).all()
    assert (on[pad] == 0).all() and (off[pad] == 0).all()
    assert rel(off, ref) < 1e-5
    assert np.array_equal(on[rest].view(np.uint32), off[rest].view(np.uint32))
    err = float(np.abs(on[lanes] - ref[lanes]).max() / np.abs(ref[lanes]).max())
    fma = float(np.abs(off[lanes] - ref[lanes]).max() / np.abs(ref[lanes]).max())
    print(f"MIXED lanes LANE_TERMS={terms} H={H} HD={HD} W={W} lanes={len(lanes)} "
          f"ctx={ctx}: {err:.1e} (FMA lanes {fma:.1e})")
    assert err < launch.ATTN_MMA_BOUND[terms]

@pytest.fixture(scope="module")
def models(gpu, tmp_path_factory):
    from helios_ignition.export import export_core
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.testing.native import load_native
    from helios_tools.core import generate_key, load_public_key, open_core, write_key_pair

    d = tmp_path_factory.mktemp("kvbf16")
    key = d / "key.pem"
    write_key_pair(generate_key(), key)
    out = d / "smollm2-kvbf16.core"
    export_core(ROOT / "recipes/smollm2_135m_instruct.py",
                checkpoint=os.environ.get("HELIOS_SMOLLM2_GGUF", "smollm2"), key_path=key,
                namespace="gpu.test", out=out, weight_dtype="bf16", kv_cache_dtype="bf16",
                targets=(gpu.target,))
    core = open_core(out, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])
    cuda = load_native(core, "cuda", cache=CacheSizing(num_pages=1024))
    cpu = load_native(core, "cpu")
    yield cuda, cpu
    cuda.close()


def test_kv_bf16_core_greedy_and_logits_match_cpu_backend(models):
    """The same bf16 cache on both backends: greedy ids equal over 16 steps on the golden
    prompts (tests/golden/smollm2_kvbf16_greedy.json holds the cpu backend's); after each
    teacher-forced run the layer-0 keys and values (the embedding through one layer: f32
    products that differ only in summation order, RoPE's cos/sin by an ulp, then the same
    rounding) hold the same bits but for at most 1 % of them, each one bf16 step apart
    (a value on a rounding boundary); a wrong head order, K/V swap or rounding rule (a
    truncation flips about half the bits' last place) changes far more. The logits within
    1.0: one bf16 step is 2**-8 of a value, 32x finer than e4m3's (whose bound is 6)."""
    from gpu_steps import Steps

    cuda, cpu = models
    prompts = [p["prompt_ids"] for p in GOLDENS["prompts"]]
    got = Steps(cuda).generate(prompts, 16)
    want = Steps(cpu).generate(prompts, 16)
    expected = json.loads((ROOT / "tests/golden/smollm2_kvbf16_greedy.json").read_text())
    assert want == [p["ids"] for p in expected["prompts"]]
    for g, w, p in zip(got, want, GOLDENS["prompts"], strict=True):
        assert g == w, p["name"]
    for p in GOLDENS["prompts"]:
        steps = {"cuda": Steps(cuda, lambda n: cuda.backend.read_buffer("scratch.logits")[:n]),
                 "cpu": Steps(cpu, lambda n: cpu.backend.buffers["scratch.logits"][:n].copy())}
        logits = {k: s.teacher_force(p["prompt_ids"], p["greedy_ids"])
                  for k, s in steps.items()}
        n = len(p["prompt_ids"]) + len(p["greedy_ids"]) - 1  # positions written
        for plane in ("L0.k_cache", "L0.v_cache"):
            bits = {k: _written(m, steps[k], plane, n) for k, m in
                    (("cuda", cuda), ("cpu", cpu))}
            differ = bits["cuda"] != bits["cpu"]
            print(p["name"], plane, "bf16 values differing cuda vs cpu", int(differ.sum()),
                  "of", differ.size)
            assert differ.mean() <= 1e-2, (p["name"], plane)
            step = np.abs(bits["cuda"][differ].astype(int) - bits["cpu"][differ].astype(int))
            assert (step == 1).all(), (p["name"], plane)
        err = float(np.abs(logits["cuda"] - logits["cpu"]).max())
        print(p["name"], "kv bf16 max |logit diff| cuda vs cpu", err)
        assert err < 1.0


def _written(model, steps, plane: str, n: int) -> np.ndarray:
    """Slot 0's bf16 bit patterns of `plane` at positions ``0..n-1``: ``[n, KVH, HD]``
    uint16 (both backends read a bf16 plane back widened to f32)."""
    values = model.backend.read_buffer(plane)
    assert values.dtype == np.float32, values.dtype
    rows = values[list(steps.pages(0, n))]
    bits = encode_bf16(rows.reshape(-1, *values.shape[2:])[:n])
    assert np.array_equal(decode_bf16(bits), rows.reshape(-1, *values.shape[2:])[:n])
    return bits


@pytest.fixture(scope="module")
def mma_model(gpu, tmp_path_factory):
    """SmolLM2 with a bf16 cache exported with HELIOS_ATTN_MMA=2: its decode attention on
    the tensor-core body (the `models` fixture's export otherwise)."""
    from helios_ignition.capture import launch
    from helios_ignition.export import export_core
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.testing.native import load_native
    from helios_tools.core import generate_key, load_public_key, open_core, write_key_pair

    d = tmp_path_factory.mktemp("kvbf16mma")
    key = d / "key.pem"
    write_key_pair(generate_key(), key)
    out = d / "smollm2-kvbf16-mma.core"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch, "ATTN_MMA", "2")
        mp.setattr(launch, "ATTN_RULE", "v3")
        export_core(ROOT / "recipes/smollm2_135m_instruct.py",
                    checkpoint=os.environ.get("HELIOS_SMOLLM2_GGUF", "smollm2"), key_path=key,
                    namespace="gpu.test", out=out, weight_dtype="bf16", kv_cache_dtype="bf16",
                    targets=(gpu.target,))
    core = open_core(out, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])
    cuda = load_native(core, "cuda", cache=CacheSizing(num_pages=1024))
    yield cuda
    cuda.close()


def test_kv_bf16_core_on_the_tensor_core_body_matches_cpu_backend(mma_model, models):
    """An opted-in core records every split decode attention kernel as GROUPED=4 with two
    terms (SmolLM2's recipe has no tuned or fused attention). Its greedy ids equal the cpu
    backend's over 16 steps on the golden prompts and its logits are within 1.0 of cpu's
    after teacher forcing: the bounds of the FMA body's core above (the attention differs
    by ~1e-5, below the bf16 cache's own rounding flips)."""
    from gpu_steps import Steps

    _, cpu = models
    kernels = [k for k in mma_model.prepared.manifest.kernels
               if k.reference_op == "attention_decode_split_bf16kv"]
    assert kernels and all(k.constants["GROUPED"] == 4 and k.constants["TERMS"] == 2
                           and k.constants["BLOCK_G"] == 16 for k in kernels)
    prompts = [p["prompt_ids"] for p in GOLDENS["prompts"]]
    got = Steps(mma_model).generate(prompts, 16)
    expected = json.loads((ROOT / "tests/golden/smollm2_kvbf16_greedy.json").read_text())
    for g, w, p in zip(got, expected["prompts"], GOLDENS["prompts"], strict=True):
        assert g == w["ids"], p["name"]
    for p in GOLDENS["prompts"]:
        logits = {k: Steps(m, read).teacher_force(p["prompt_ids"], p["greedy_ids"])
                  for k, m, read in (
                      ("cuda", mma_model,
                       lambda n: mma_model.backend.read_buffer("scratch.logits")[:n]),
                      ("cpu", cpu, lambda n: cpu.backend.buffers["scratch.logits"][:n].copy()))}
        err = float(np.abs(logits["cuda"] - logits["cpu"]).max())
        print(p["name"], "kv bf16, tensor-core attention: max |logit diff| cuda vs cpu", err)
        assert err < 1.0
