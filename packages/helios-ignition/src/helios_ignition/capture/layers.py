"""Layer pieces any family's trunk records: products (with the packed bf16 path), the
RoPE + paged cache write, and paged attention (split-context decode or causal prefill).

A family composes these in `Family.trunk`; what differs between families (norms, which
products, the RoPE table, the MLP) stays in the family file.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import launch
from .buffers import PAGE_TABLE, TUNED_SPLITS, WINDOW_PAGE_TABLE, decode_splits
from .builder import BufferTable, ProgramBuilder, View
from .family import Pass


def _packed_weights(dtype: str) -> bool:
    """Whether weights of `dtype` take the packed path: bf16 only (the terms are exact
    against bf16 weights; f32 weights keep the f32 linear)."""
    return dtype == "bf16"


def declare_mma_scratch(t: BufferTable, products: Sequence[tuple[int, int]],
                        weight_dtype: str, tokens: int) -> None:
    """``scratch.xsplit`` (packed activation terms) and ``scratch.mma_partial`` (K-slice
    partial products), sized for every row count up to `tokens` at which capture records
    the packed path for one of a layer's `products` ((N, K) each) (``launch.mma_plan``); neither exists where it records none (small
    models, f32 weights, ``HELIOS_LINEAR_MMA=off``), so those cores are unchanged."""
    if not _packed_weights(weight_dtype):
        return
    width = partial = 0
    for T in range(1, tokens + 1):
        for N, K in products:
            # the packed path of `linear` products, and (HELIOS_LINEAR_INVARIANT=packed)
            # of row-invariant ones, which take it at every row count
            for S in (launch.mma_plan(T, N, K), launch.invariant_splits(N, K)):
                if S is not None:
                    width = max(width, K)
                    partial = max(partial, (S * T * N) if S > 1 else 0)
    if width:
        t.declare("scratch.xsplit", "f32", (tokens, width), "scratch")
    if partial:  # flat, one element over: every [S*T, N] view is a strict prefix (a view
        # of a whole buffer is handed out in the buffer's declared shape)
        t.declare("scratch.mma_partial", "f32", (partial + 1,), "scratch")


def product(b: ProgramBuilder, lin: str, x: View, w: View, out: View, T: int, N: int, K: int,
            swiglu: bool = False) -> None:
    """``out = x @ w^T`` (`swiglu`: of ``silu_mul(x)``, ``x`` the ``[T, 2K]`` gate|up).

    Where ``launch.mma_plan`` picks the packed path (bf16 ``linear`` products of the 8B
    geometry at 8-256 rows): ``split_bf16`` (``swiglu_split_bf16``, which replaces
    ``silu_mul``) into ``scratch.xsplit``, ``linear_packed`` over S K slices into
    ``scratch.mma_partial`` and ``splitk_reduce`` into `out` (S = 1: straight into
    `out`). Otherwise ``silu_mul`` (if `swiglu`, into the family's ``scratch.act``
    ``[T, K]``) and `lin`. Row-invariant products (``linear_invariant``) take `lin`,
    or with HELIOS_LINEAR_INVARIANT=packed (``launch.invariant_splits``) the same
    sequence with ``linear_packed_rows``: one tile and K split per matrix at every row
    count, so a row's result does not depend on T.

    In a bf16-activation core (``b.activations == "bf16"``) the producer is
    ``round_bf16`` (``swiglu_round_bf16``): ``hi | 0``, the activations rounded to bf16,
    and the product is recorded ``rounded`` (``XSPLIT=0`` on the GPU: one MMA term; the
    cpu backend's reference multiplies ``hi + 0``), so both backends compute the same
    values. Products off the packed path keep f32 activations.
    """
    t = b.table
    packed = _packed_weights(w.buffer.dtype) and "scratch.xsplit" in t.buffers
    rows_op = "linear_packed_rows" if lin == "linear_invariant" else "linear_packed"
    S = None
    if packed and lin == "linear":
        S = launch.mma_plan(T, N, K)
    elif packed and lin == "linear_invariant":
        S = launch.invariant_splits(N, K)
    if S is None:
        if swiglu:
            act = t.view("scratch.act", (T, K))
            b.launch("silu_mul", x, act, T, K)
            x = act
        b.launch(lin, x, w, out, T, N, K)
        return
    xs = t.view("scratch.xsplit", (T, K))
    rounded = b.activations == "bf16"
    producer = "round_bf16" if rounded else "split_bf16"
    b.launch(f"swiglu_{producer}" if swiglu else producer, x, xs, T, K)
    if S == 1:
        b.launch(rows_op, xs, w, out, T, N, K, 1, rounded=rounded)
        return
    part = t.view("scratch.mma_partial", (S * T, N))
    b.launch(rows_op, xs, w, part, T, N, K, S, rounded=rounded)
    b.launch("splitk_reduce", part, out, T, N, S)


def _layer_cache(t: BufferTable, layer: int, MP: int, PT: int, KVH: int, HD: int,
                 window: int) -> tuple[View, View, View]:
    """(page table, K plane, V plane) of layer `layer`: a sliding-window layer's planes
    and page table are the window region's (its own pool), the others the paged
    region's."""
    table = WINDOW_PAGE_TABLE if window else PAGE_TABLE
    slots = t.buffers[table].shape[0]
    pages = t.buffers[f"L{layer}.k_cache"].shape[0]
    return (t.view(table, (slots, MP)), t.view(f"L{layer}.k_cache", (pages, PT, KVH, HD)),
            t.view(f"L{layer}.v_cache", (pages, PT, KVH, HD)))


def write_kv(b: ProgramBuilder, p: Pass, layer: int, qkv: View, inv_freq: View, H: int,
             KVH: int, HD: int, window: int = 0) -> None:
    """Rotate the queries and keys of `qkv` ([T, (H + 2 KVH) HD], fused [q; k; v]) by
    RoPE with `inv_freq` ([HD / 2] f32, the family's table) in place and write the keys
    and values at their positions into layer `layer`'s cache planes: ``rope_kv_write``,
    or ``rope`` + ``kv_write`` where the fused op is off. `window` > 0: the layer's
    planes are the sliding-window region's (its page table)."""
    t = b.table
    T, R, PT, MP = p.tokens, p.requests, p.page_tokens, p.pages_per_request
    rows = p.rows
    page_table, kc, vc = _layer_cache(t, layer, MP, PT, KVH, HD, window)
    if launch.fuse_rope_kv_write():
        b.launch("rope_kv_write", qkv, rows.positions, inv_freq, rows.token_row, rows.slot,
                 page_table, kc, vc, T, R, MP, PT, H, KVH, HD)
    else:
        b.launch("rope", qkv, rows.positions, inv_freq, T, H, KVH, HD)
        b.launch("kv_write", qkv, rows.positions, rows.token_row, rows.slot, page_table, kc,
                 vc, T, R, MP, PT, H, KVH, HD)


def attend(b: ProgramBuilder, p: Pass, layer: int, qkv: View, attn: View, H: int, KVH: int,
           HD: int, scale: float, window: int = 0) -> None:
    """Attention of the queries in `qkv` over layer `layer`'s paged cache into `attn`
    ([T, H HD]), logits scaled by `scale`.

    Decode-style (`p.decode_attention`): split over the context, then merged
    (flash-decoding; each row attends to its slot's cache up to its own position, so
    verification rows are causal within a lane), reading the tuned split count when
    `p.tuned`, or fused into one launch where that op is on. Otherwise
    ``attention_prefill``, causal over the chunk.

    `window` > 0 (a sliding-window layer): each query attends to the last `window`
    positions only, itself included (``attention_decode_window``, one launch per decode
    pass; ``attention_prefill_window``), over the window region's planes through its
    page table (entries wholly behind the window are never read: their pages went back
    to the pool).
    """
    t = b.table
    T, R, PT, MP = p.tokens, p.requests, p.page_tokens, p.pages_per_request
    rows = p.rows
    pos = rows.positions
    page_table, kc, vc = _layer_cache(t, layer, MP, PT, KVH, HD, window)
    if window:
        if p.decode_attention:
            b.launch("attention_decode_window", qkv, pos, rows.attn_slot, page_table, kc, vc,
                     attn, T, MP, PT, H, KVH, HD, window, scale)
        else:
            b.launch("attention_prefill_window", qkv, pos, rows.token_row, rows.slot,
                     page_table, kc, vc, attn, T, R, MP, PT, H, KVH, HD, window, scale)
        return
    if not p.decode_attention:
        b.launch("attention_prefill", qkv, pos, rows.token_row, rows.slot, page_table, kc, vc,
                 attn, T, R, MP, PT, H, KVH, HD, scale)
        return
    ns, split = decode_splits(MP * PT)
    part_ml = t.view("scratch.attn_ml", (T, H, ns, 2))
    part_o = t.view("scratch.attn_o", (T, H, ns, HD))
    if p.tuned:
        choice = t.view(TUNED_SPLITS, (1,))
        b.launch("attention_decode_split_tuned", qkv, pos, rows.attn_slot, page_table, kc, vc,
                 part_ml, part_o, choice, T, MP, PT, H, KVH, HD, ns, split, scale)
        b.launch("attention_decode_merge_tuned", part_ml, part_o, rows.attn_slot, choice,
                 attn, T, H, HD, ns)
    elif launch.fuse_decode_attention():
        arrivals = t.view("scratch.attn_arrivals", (T, KVH))
        b.launch("attention_decode_fused", qkv, pos, rows.attn_slot, page_table, kc, vc,
                 part_ml, part_o, arrivals, attn, T, MP, PT, H, KVH, HD, ns, split, scale)
    else:
        b.launch("attention_decode_split", qkv, pos, rows.attn_slot, page_table, kc, vc,
                 part_ml, part_o, T, MP, PT, H, KVH, HD, ns, split, scale)
        b.launch("attention_decode_merge", part_ml, part_o, rows.attn_slot, attn, T, H, HD,
                 ns)

