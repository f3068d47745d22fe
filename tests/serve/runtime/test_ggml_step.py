"""Whole-program ggml graphs (runtime.ggml_step) against the NumPy reference ops, on small
synthetic programs: each graph form alone, a decode layer built as one graph and replayed
with new host values, the fallback to the launch path, and HELIOS_CPU_STEP_GRAPHS.

f32 weights keep every product in f32, so the graphs differ from the references only by
summation order and ggml's exp/silu (tolerances below); quantized weights are covered by
test_gguf_core.py on the real model.
"""

from __future__ import annotations

import numpy as np
import pytest
from helios_serve.runtime.errors import RuntimeLoadError
from helios_serve.runtime.ggml_lib import GgmlPrograms
from helios_serve.runtime.ggml_step import StepPrograms, step_graphs_enabled
from helios_tools.kernels import reference_op

T, H, KVH, HD, D = 3, 4, 2, 8, 32
W = (H + 2 * KVH) * HD
P, PT, MP = 6, 4, 3  # pages, tokens per page, page-table width
RTOL, ATOL = 1e-5, 1e-5


def _rng(seed=0):
    return np.random.default_rng(seed)


def _refuse(*args):
    raise AssertionError("the launch path ran: the step fell outside the graphs")


def _run(records, arrays_for_oracle=None, graphs_only=False):
    """Build `records` as one program, run it once (`graphs_only`: a launch-path
    fallback fails); returns the StepPrograms."""
    steps = StepPrograms(GgmlPrograms({}, threads=1))
    bound = [(_refuse if graphs_only else reference_op(op), args) for op, _, args in records]
    assert steps.add_program("p", records, bound)
    steps.seal()
    steps.runner("p")()
    return steps


def _oracle(records):
    for op, _, args in records:
        reference_op(op)(*args)


def _copy_args(records):
    """The same records over copies of every array (the oracle's buffers)."""
    copies: dict[int, np.ndarray] = {}
    out = []
    for op, names, args in records:
        new = []
        for a in args:
            if isinstance(a, np.ndarray):
                new.append(copies.setdefault(id(a), a.copy()))
            else:
                new.append(a)
        out.append((op, names, tuple(new)))
    return out


def test_norms_and_products_equal_their_references():
    r = _rng()
    x = r.standard_normal((T, D)).astype(np.float32)
    res = r.standard_normal((T, D)).astype(np.float32)
    gain = r.standard_normal(D).astype(np.float32)
    w = r.standard_normal((2 * D, D)).astype(np.float32)
    w2 = r.standard_normal((D, D)).astype(np.float32)
    h = np.zeros((T, D), np.float32)
    gu = np.zeros((T, 2 * D), np.float32)
    y = np.zeros((T, D), np.float32)
    records = [
        ("add_rmsnorm", ["x", "res", "g", "h", None, None, None], (x, res, gain, h, T, D, 1e-5)),
        ("linear", ["h", "w", "gu", None, None, None], (h, w, gu, T, 2 * D, D)),
        ("swiglu_linear", ["gu", "w2", "y", None, None, None], (gu, w2, y, T, D, D)),
        ("rmsnorm", ["y", "g", "h", None, None, None], (y, gain, h, T, D, 1e-5)),
    ]
    oracle = _copy_args(records)
    _oracle(oracle)
    _run(records)
    for (_, _, got), (_, _, want) in zip(records, oracle, strict=True):
        for a, b in zip(got, want, strict=True):
            if isinstance(a, np.ndarray):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def _layer(seed=1):
    """qkv -> rope_kv_write -> attention split/merge over a paged cache: a decode step of
    B=2 rows (row 1 padding) whose row 0 has 6 cached positions before this one."""
    r = _rng(seed)
    B = 2
    qkv = r.standard_normal((B, W)).astype(np.float32)
    positions = np.array([6, 0], np.int32)
    token_row = np.array([0, -1], np.int32)
    slot = np.array([1, -1], np.int32)
    page_table = np.array([[0, 1, 2], [3, 5, 4]], np.int32)
    k_cache = r.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    v_cache = r.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    inv = (1.0 / (10000 ** (np.arange(0, HD, 2) / HD))).astype(np.float32)
    NS, SPLIT = 2, 8
    ml = np.zeros((B, H, NS, 2), np.float32)
    po = np.zeros((B, H, NS, HD), np.float32)
    out = np.zeros((B, H * HD), np.float32)
    n = [None] * 8
    records = [
        ("rope_kv_write", ["qkv", "pos", "inv", "row", "slot", "pt", "k", "v", *n[:7]],
         (qkv, positions, inv, token_row, slot, page_table, k_cache, v_cache,
          B, B, MP, PT, H, KVH, HD)),
        ("attention_decode_split", ["qkv", "pos", "slot", "pt", "k", "v", "ml", "po", *n],
         (qkv, positions, slot, page_table, k_cache, v_cache, ml, po,
          B, MP, PT, H, KVH, HD, NS, SPLIT, HD ** -0.5)),
        ("attention_decode_merge", ["ml", "po", "slot", "out", *n[:4]],
         (ml, po, slot, out, B, H, HD, NS)),
    ]
    return records


def test_a_decode_layer_is_one_graph_replayed_with_new_host_values():
    records = _layer()
    oracle = _copy_args(records)
    _oracle(oracle)
    steps = _run(records)
    assert steps.graph_count == 1  # one context bucket: the page table reaches 12 positions
    qkv = records[0][2][0]
    out, k_cache = records[2][2][3], records[0][2][6]
    np.testing.assert_allclose(qkv, oracle[0][2][0], rtol=RTOL, atol=ATOL)  # rotated q, k
    np.testing.assert_allclose(k_cache, oracle[0][2][6], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out[0], oracle[2][2][3][0], rtol=1e-4, atol=1e-5)
    assert not out[1].any()  # the padding row: zeros, as the reference
    # replay: the next position, new projections; host values are rewritten
    nxt = _rng(7).standard_normal(qkv.shape).astype(np.float32)
    for recs in (records, oracle):
        recs[0][2][0][...] = nxt
        recs[0][2][1][0] = 7
    _oracle(oracle)
    steps.runner("p")()
    np.testing.assert_allclose(k_cache, oracle[0][2][6], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out[0], oracle[2][2][3][0], rtol=1e-4, atol=1e-5)


def test_a_step_past_the_graphs_runs_the_launch_path():
    """No live row: the graphs hold nothing to do; the launch path (the reference) runs."""
    records = _layer()
    steps = _run(records)
    slot = records[0][2][4]
    slot[0] = -1
    out = records[2][2][3]
    out[...] = 5.0
    steps.runner("p")()
    assert not out.any()  # the reference merge zeroed the padding rows


def test_step_graphs_switch(monkeypatch):
    monkeypatch.delenv("HELIOS_CPU_STEP_GRAPHS", raising=False)
    assert step_graphs_enabled()
    monkeypatch.setenv("HELIOS_CPU_STEP_GRAPHS", "0")
    assert not step_graphs_enabled()
    monkeypatch.setenv("HELIOS_CPU_STEP_GRAPHS", "yes")
    with pytest.raises(RuntimeLoadError, match="HELIOS_CPU_STEP_GRAPHS='yes': not 0 or 1"):
        step_graphs_enabled()


def test_prefill_attention_is_causal_over_the_cache_and_zeroes_padding():
    """Four packed tokens: three of row 0 at positions 4..6 (positions 0..3 already in
    the cache) and one padding token."""
    r = _rng(3)
    Tp, R = 4, 1
    qkv = r.standard_normal((Tp, W)).astype(np.float32)
    positions = np.array([4, 5, 6, 0], np.int32)
    token_row = np.array([0, 0, 0, -1], np.int32)
    slot = np.array([1], np.int32)
    page_table = np.array([[0, 1, 2], [3, 5, 4]], np.int32)
    k_cache = r.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    v_cache = r.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    inv = (1.0 / (10000 ** (np.arange(0, HD, 2) / HD))).astype(np.float32)
    out = np.full((Tp, H * HD), 3.0, np.float32)
    n = [None] * 8
    records = [
        ("rope_kv_write", ["qkv", "pos", "inv", "row", "slot", "pt", "k", "v", *n[:7]],
         (qkv, positions, inv, token_row, slot, page_table, k_cache, v_cache,
          Tp, R, MP, PT, H, KVH, HD)),
        ("attention_prefill", ["qkv", "pos", "row", "slot", "pt", "k", "v", "out", *n],
         (qkv, positions, token_row, slot, page_table, k_cache, v_cache, out,
          Tp, R, MP, PT, H, KVH, HD, HD ** -0.5)),
    ]
    oracle = _copy_args(records)
    _oracle(oracle)
    _run(records)
    np.testing.assert_allclose(k_cache, oracle[0][2][6], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out[:3], oracle[1][2][7][:3], rtol=1e-4, atol=1e-5)
    assert not out[3].any()


def test_prefill_attention_of_two_packed_rows_gathers_each_rows_context():
    """Tokens of two requests in one step (rows 0 and 1, slots 1 and 0): each token
    attends to its own row's positions only."""
    r = _rng(4)
    Tp, R = 4, 2
    qkv = r.standard_normal((Tp, W)).astype(np.float32)
    positions = np.array([2, 3, 0, 1], np.int32)
    token_row = np.array([0, 0, 1, 1], np.int32)
    slot = np.array([1, 0], np.int32)
    page_table = np.array([[0, 1, 2], [3, 5, 4]], np.int32)
    k_cache = r.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    v_cache = r.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    inv = (1.0 / (10000 ** (np.arange(0, HD, 2) / HD))).astype(np.float32)
    out = np.zeros((Tp, H * HD), np.float32)
    n = [None] * 8
    records = [
        ("rope_kv_write", ["qkv", "pos", "inv", "row", "slot", "pt", "k", "v", *n[:7]],
         (qkv, positions, inv, token_row, slot, page_table, k_cache, v_cache,
          Tp, R, MP, PT, H, KVH, HD)),
        ("attention_prefill", ["qkv", "pos", "row", "slot", "pt", "k", "v", "out", *n],
         (qkv, positions, token_row, slot, page_table, k_cache, v_cache, out,
          Tp, R, MP, PT, H, KVH, HD, HD ** -0.5)),
    ]
    oracle = _copy_args(records)
    _oracle(oracle)
    _run(records)
    np.testing.assert_allclose(k_cache, oracle[0][2][6], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out, oracle[1][2][7], rtol=1e-4, atol=1e-5)


def _windowed(r, lengths, W, pages=16):
    """A page table and caches for rows `lengths` long whose pages wholly behind the
    window of position length - 3 hold NaN and whose entries there name a NaN page (the
    pool took them back): a form reading behind a window turns its output NaN."""
    k_cache = r.standard_normal((pages, PT, KVH, HD)).astype(np.float32)
    v_cache = r.standard_normal((pages, PT, KVH, HD)).astype(np.float32)
    k_cache[-1] = v_cache[-1] = np.nan
    order = r.permutation(pages - 1).astype(np.int32)
    table = np.zeros((len(lengths), 5), np.int32)
    for row, n in enumerate(lengths):
        table[row] = order[row * 5:(row + 1) * 5]
        for j in range(max(0, n - 3 - W + 1) // PT):
            k_cache[table[row, j]] = v_cache[table[row, j]] = np.nan
            table[row, j] = pages - 1
    return table, k_cache, v_cache


@pytest.mark.parametrize("window", [3, 6])
def test_window_attention_forms_gather_only_the_window(window):
    """attention_decode_window and attention_prefill_window as graphs: two rows of 18
    and 9 positions (5 pages of 4), pages behind each window poisoned."""
    r = _rng(5)
    mp = 5
    lengths = [18, 9]
    table, k_cache, v_cache = _windowed(r, lengths, window)
    slot = np.array([0, 1], np.int32)
    B = 2
    qkv = r.standard_normal((B, W)).astype(np.float32)
    pos = np.array([n - 1 for n in lengths], np.int32)
    out = np.full((B, H * HD), 3.0, np.float32)
    n = [None] * 8
    decode = [("attention_decode_window", ["qkv", "pos", "slot", "wpt", "k", "v", "out", *n],
               (qkv, pos, slot, table, k_cache, v_cache, out, B, mp, PT, H, KVH, HD, window,
                HD ** -0.5))]
    oracle = _copy_args(decode)
    _oracle(oracle)
    _run(decode, graphs_only=True)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, oracle[0][2][6], rtol=1e-4, atol=1e-5)
    # prefill: the last 3 tokens of each row packed, and a padding token
    rows = np.array([0, 0, 0, 1, 1, 1, -1], np.int32)
    ppos = np.array([15, 16, 17, 6, 7, 8, 0], np.int32)
    Tp = len(rows)
    pq = r.standard_normal((Tp, W)).astype(np.float32)
    pout = np.full((Tp, H * HD), 3.0, np.float32)
    prefill = [("attention_prefill_window",
                ["qkv", "pos", "row", "slot", "wpt", "k", "v", "out", *n],
                (pq, ppos, rows, slot, table, k_cache, v_cache, pout, Tp, B, mp, PT, H, KVH,
                 HD, window, HD ** -0.5))]
    oracle = _copy_args(prefill)
    _oracle(oracle)
    _run(prefill, graphs_only=True)
    assert np.isfinite(pout).all() and not pout[-1].any()
    np.testing.assert_allclose(pout, oracle[0][2][7], rtol=1e-4, atol=1e-5)


def test_prefill_attention_of_mixed_rows_gathers_lanes_and_chunks():
    """A MIXED step's packed rows: two one-token decode lanes deep in their contexts
    (positions 9 and 6, the rest from the cache), a three-token prefill chunk and a
    padding token: each attends to its own row's positions only."""
    r = _rng(5)
    Tp, R = 6, 4
    qkv = r.standard_normal((Tp, W)).astype(np.float32)
    positions = np.array([9, 6, 0, 1, 2, 0], np.int32)
    token_row = np.array([0, 1, 2, 2, 2, -1], np.int32)
    slot = np.array([1, 0, 2, -1], np.int32)
    page_table = np.array([[0, 1, 0], [2, 3, 4], [5, 0, 0]], np.int32)
    k_cache = r.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    v_cache = r.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    inv = (1.0 / (10000 ** (np.arange(0, HD, 2) / HD))).astype(np.float32)
    out = np.full((Tp, H * HD), 3.0, np.float32)
    n = [None] * 8
    records = [
        ("rope_kv_write", ["qkv", "pos", "inv", "row", "slot", "pt", "k", "v", *n[:7]],
         (qkv, positions, inv, token_row, slot, page_table, k_cache, v_cache,
          Tp, R, MP, PT, H, KVH, HD)),
        ("attention_prefill", ["qkv", "pos", "row", "slot", "pt", "k", "v", "out", *n],
         (qkv, positions, token_row, slot, page_table, k_cache, v_cache, out,
          Tp, R, MP, PT, H, KVH, HD, HD ** -0.5)),
    ]
    oracle = _copy_args(records)
    _oracle(oracle)
    _run(records)
    np.testing.assert_allclose(k_cache, oracle[0][2][6], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out[:5], oracle[1][2][7][:5], rtol=1e-4, atol=1e-5)
    assert not out[5].any()


def _gemma_block(seed=9, wide=2.0):
    """A Gemma 3 trunk's start as launch records: embedding, scale by sqrt(D), rmsnorm,
    the qkv product, per-head RMS norm of q and k, the gate/up product, GeGLU and the down
    product (f32 weights, fresh random values; `wide` scales the gate so GELU's tails and
    its tanh's bend are both reached)."""
    r = _rng(seed)
    F, V = 2 * D, 11
    ids = np.array([3, 0, 10], np.int32)
    table = r.standard_normal((V, D)).astype(np.float32)
    gain = r.standard_normal(D).astype(np.float32)
    w_qkv = r.standard_normal((W, D)).astype(np.float32)
    q_gain = r.standard_normal(HD).astype(np.float32)
    k_gain = r.standard_normal(HD).astype(np.float32)
    w_gu = (wide * r.standard_normal((2 * F, D))).astype(np.float32)
    w_down = r.standard_normal((D, F)).astype(np.float32)
    res, h, y = (np.zeros((T, D), np.float32) for _ in range(3))
    qkv = np.zeros((T, W), np.float32)
    gu = np.zeros((T, 2 * F), np.float32)
    act = np.zeros((T, F), np.float32)
    n = [None] * 8
    return [
        ("embedding", ["ids", "table", "res", *n[:2]], (ids, table, res, T, D)),
        ("scale", ["res", *n[:3]], (res, T, D, float(np.sqrt(D)))),
        ("rmsnorm", ["res", "g", "h", *n[:3]], (res, gain, h, T, D, 1e-6)),
        ("linear", ["h", "wqkv", "qkv", *n[:3]], (h, w_qkv, qkv, T, W, D)),
        ("head_rmsnorm", ["qkv", "qg", "kg", *n[:5]], (qkv, q_gain, k_gain, T, H, KVH, HD,
                                                        1e-6)),
        ("linear", ["h", "wgu", "gu", *n[:3]], (h, w_gu, gu, T, 2 * F, D)),
        ("gelu_mul", ["gu", "act", *n[:2]], (gu, act, T, F)),
        ("linear", ["act", "wd", "y", *n[:3]], (act, w_down, y, T, D, F)),
    ]


def test_gemma_forms_equal_their_references_in_one_graph():
    """scale, head_rmsnorm and gelu_mul have graph forms: a Gemma 3 block's launches are
    one graph (no launch runs as NumPy), and each buffer equals the NumPy references'
    (GeGLU: ggml's GELU reads a table at f16 inputs, as llama.cpp computes it)."""
    records = _gemma_block()
    oracle = _copy_args(records)
    _oracle(oracle)
    steps = _run(records, graphs_only=True)
    assert steps.graph_count == 1
    names = ("res", "h", "qkv", "gu", "act", "y")
    got = {n: records[i][2][j] for n, (i, j) in zip(names, ((1, 0), (2, 2), (4, 0), (5, 2),
                                                            (6, 1), (7, 2)), strict=True)}
    want = {n: oracle[i][2][j] for n, (i, j) in zip(names, ((1, 0), (2, 2), (4, 0), (5, 2),
                                                            (6, 1), (7, 2)), strict=True)}
    np.testing.assert_array_equal(got["res"], want["res"])  # one f32 multiply each
    for n in ("h", "qkv", "gu"):
        np.testing.assert_allclose(got[n], want[n], rtol=RTOL, atol=ATOL, err_msg=n)
    gate = want["gu"][:, :got["act"].shape[1]]
    assert gate.min() < -4 and gate.max() > 4  # both tails and the bend are exercised
    # f16 table: the gate rounded to f16 and GELU's value stored in f16 (2^-11 each)
    np.testing.assert_allclose(got["act"], want["act"], rtol=5e-3, atol=5e-3)
    err = np.linalg.norm(got["y"] - want["y"]) / np.linalg.norm(want["y"])
    assert err < 2e-3, err


def test_qk_rmsnorm_is_the_head_rmsnorm_form():
    """Qwen3's name for the same operation takes the same form (values untouched)."""
    r = _rng(4)
    qkv = r.standard_normal((T, W)).astype(np.float32)
    q_gain, k_gain = (r.standard_normal(HD).astype(np.float32) for _ in range(2))
    records = [("qk_rmsnorm", ["qkv", "qg", "kg", *[None] * 5],
                (qkv, q_gain, k_gain, T, H, KVH, HD, 1e-6))]
    values = qkv[:, (H + KVH) * HD:].copy()
    oracle = _copy_args(records)
    _oracle(oracle)
    _run(records, graphs_only=True)
    np.testing.assert_allclose(qkv, oracle[0][2][0], rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(qkv[:, (H + KVH) * HD:], values)


def test_a_launch_without_a_graph_form_splits_the_graph():
    """An operation with no graph form ends the graph before it and runs as its bound
    callable (the launch path's); the launches after it start a second graph."""
    r = _rng(6)
    x = r.standard_normal((T, D)).astype(np.float32)
    b = r.standard_normal((T, D)).astype(np.float32)
    out = np.zeros((T, D), np.float32)
    records = [("scale", ["x", None, None, None], (x, T, D, 0.5)),
               ("op_without_a_graph_form", ["x", "b", "out", None, None], (x, b, out, T, D)),
               ("scale", ["out", None, None, None], (out, T, D, 3.0))]
    oracle = _copy_args(records)
    for op, _, args in oracle:
        (reference_op("add") if op == "op_without_a_graph_form" else reference_op(op))(*args)
    steps = StepPrograms(GgmlPrograms({}, threads=1))
    bound = [(reference_op("add") if op == "op_without_a_graph_form" else _refuse, args)
             for op, _, args in records]
    assert steps.add_program("p", records, bound)
    steps.seal()
    steps.runner("p")()
    assert steps.graph_count == 2
    np.testing.assert_array_equal(out, oracle[2][2][0])


def test_window_and_whole_context_attentions_in_one_graph_share_a_long_enough_bucket():
    """A run holding a window attention (W = 3) before a whole-context one (Gemma 3's
    local and global layers as one graph): the bucket holds the whole 18-position
    context, and the window attention still reads only its window (pages behind it are
    NaN)."""
    r = _rng(8)
    mp, window, B = 5, 3, 2
    lengths = [18, 9]
    wtable, wk, wv = _windowed(r, lengths, window)
    gk = r.standard_normal((16, PT, KVH, HD)).astype(np.float32)
    gv = r.standard_normal((16, PT, KVH, HD)).astype(np.float32)
    gtable = r.permutation(16)[:2 * mp].reshape(2, mp).astype(np.int32)
    slot = np.array([0, 1], np.int32)
    pos = np.array([n - 1 for n in lengths], np.int32)
    qkv = r.standard_normal((B, W)).astype(np.float32)
    wout, gout = (np.full((B, H * HD), 3.0, np.float32) for _ in range(2))
    NS, SPLIT = 2, 16
    ml = np.zeros((B, H, NS, 2), np.float32)
    po = np.zeros((B, H, NS, HD), np.float32)
    n = [None] * 8
    records = [
        ("attention_decode_window", ["qkv", "pos", "slot", "wpt", "wk", "wv", "wout", *n],
         (qkv, pos, slot, wtable, wk, wv, wout, B, mp, PT, H, KVH, HD, window, HD ** -0.5)),
        ("attention_decode_split", ["qkv", "pos", "slot", "gpt", "gk", "gv", "ml", "po", *n],
         (qkv, pos, slot, gtable, gk, gv, ml, po, B, mp, PT, H, KVH, HD, NS, SPLIT,
          HD ** -0.5)),
        ("attention_decode_merge", ["ml", "po", "slot", "gout", *n[:4]],
         (ml, po, slot, gout, B, H, HD, NS)),
    ]
    oracle = _copy_args(records)
    _oracle(oracle)
    steps = _run(records, graphs_only=True)
    assert steps.graph_count == 1  # one bucket (20 positions) holds both
    assert np.isfinite(wout).all()
    np.testing.assert_allclose(wout, oracle[0][2][6], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gout, oracle[2][2][3], rtol=1e-4, atol=1e-5)
