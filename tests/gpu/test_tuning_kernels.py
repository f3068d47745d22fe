"""The decode-split tuning kernels on the GPU against their NumPy references.

Tuned split + merge: for each split count the producer can choose, the splits it runs
match the reference computed with that count, programs past the count write nothing
(their outputs keep the harness's NaN poison), and the merged output is the dense
attention within f32 rounding. Each count rounds differently (the merge groups positions
differently), so exactness is checked per count against the reference, not across counts.
"""

from __future__ import annotations

import numpy as np
import pytest
from helios_tools import kernels as K

pytestmark = pytest.mark.gpu


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "GPU output holds NaN/inf (unwritten or poisoned)"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("rule", ["v2", "v1"])
@pytest.mark.parametrize("H,KVH,HD", [(9, 3, 64), (32, 8, 128)])
@pytest.mark.parametrize("ns", [64, 32, 16, 8, 5])
def test_tuned_split_merge_per_count(gpu, monkeypatch, rule, H, KVH, HD, ns):
    from helios_ignition.capture import launch

    monkeypatch.setattr(launch, "ATTN_RULE", rule)
    rng = np.random.default_rng(ns * 7 + HD)
    B, PT, MP, NS, SPLIT = 64, 16, 128, 64, 32  # 2048 positions in 64 captured splits
    S = B
    P = S * MP
    pages = rng.permutation(P).astype(np.int32).reshape(S, MP)
    kc = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    vc = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    qkv = rng.standard_normal((B, (H + 2 * KVH) * HD)).astype(np.float32)
    slot = rng.permutation(S)[:B].astype(np.int32)
    slot[2] = -1
    pos = rng.integers(0, PT * MP, B).astype(np.int32)
    pos[0], pos[1] = 0, PT * MP - 1
    scale = HD ** -0.5
    choice = np.array([ns], np.int32)
    ml = np.zeros((B, H, NS, 2), np.float32)
    po = np.zeros((B, H, NS, HD), np.float32)
    K.attention_decode_split_tuned(qkv, pos, slot, pages, kc, vc, ml, po, choice, B, MP, PT,
                                   H, KVH, HD, NS, SPLIT, scale)
    got = gpu.run("attention_decode_split_tuned", qkv, pos, slot, pages, kc, vc,
                  np.zeros_like(ml), np.zeros_like(po), choice, B, MP, PT, H, KVH, HD, NS,
                  SPLIT, scale)
    live = slot >= 0
    assert rel(got["part_ml"][live, :, :ns], ml[live, :, :ns]) < 1e-5
    assert rel(got["part_o"][live, :, :ns], po[live, :, :ns]) < 1e-5
    assert np.isnan(got["part_ml"][:, :, ns:]).all()  # programs past the count exited
    ref = np.zeros((B, H * HD), np.float32)
    K.attention_decode(qkv, pos, slot, pages, kc, vc, ref, B, MP, PT, H, KVH, HD, scale)
    out = gpu.run("attention_decode_merge_tuned", got["part_ml"], got["part_o"], slot, choice,
                  np.zeros_like(ref), B, H, HD, NS)["out"]
    assert rel(out, ref) < 1e-5
    assert (out[2] == 0).all()


def test_timer_marks_are_ordered_nanoseconds(gpu):
    first = gpu.run("timer_mark", np.zeros((2, 2), np.uint32), 0)["stamps"]
    second = gpu.run("timer_mark", first, 1)["stamps"]
    a, b = (int(lo) | int(hi) << 32 for lo, hi in second)
    assert 0 < a < b < a + 10**10  # the two launches are less than 10 s apart


def test_setup_and_select_match_their_references(gpu):
    B, MP, PT = 64, 512, 16
    args = (np.zeros(B, np.int32), np.zeros(B, np.int32), np.zeros((B, MP), np.int32),
            np.zeros((4, 4), np.int32), B, MP, PT, 3, 64, 32, 16, 0)
    got = gpu.run("split_tuning_setup", *args)
    ref = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    K.split_tuning_setup(*ref)
    for name, want in zip(("positions", "slot", "page_table"), ref[:3], strict=True):
        assert np.array_equal(got[name], want), name
    assert got["candidates"][:3, 0].tolist() == [64, 32, 16]
    stamps = np.zeros((6, 2), np.uint32)
    for i, (start, end) in enumerate([(100, 900), (1000, 1300), (2000, 2400)]):
        stamps[2 * i] = (start, 7)
        stamps[2 * i + 1] = (end, 7)
    choice = gpu.run("split_tuning_select", stamps, got["candidates"], np.zeros(1, np.int32),
                     3)["choice"]
    assert choice.tolist() == [32]
