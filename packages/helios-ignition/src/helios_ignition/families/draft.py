"""The learned draft head's launches, recorded into a family's graph variants.

The head (helios_ignition/checkpoint/drafter.py) keeps two paged histories that share
the target's page table (one entry per token position): its own key/value planes
(`D.k_cache`, `D.v_cache`) and the target feature of every position (`D.f_cache`, the
final-norm hidden state that fed the target's LM head there). The entry at position j
is computed from the token x_j and the feature f_{j-1}, so:

- every target pass that consumes tokens (prefill chunks, verification rows) stores its
  features (`store_features`), and prefill writes the head's entries of its tokens
  (`entries`): prefix reuse, preemption and readmission then find the draft context in
  the same pages as the target's;
- a draft step (`step`) writes the entry of the position it reads and proposes the next
  token; the commit pass rewrites the entries of accepted positions from true features.

Row-invariant linears (`linear_invariant`) wherever the result must not depend on the
batch: a seeded request then drafts the same tokens alone or in a batch.
"""

from __future__ import annotations

import math

from ..capture.builder import BufferTable, ProgramBuilder, View
from ..checkpoint.drafter import DrafterGeometry

K_CACHE, V_CACHE, F_CACHE = "D.k_cache", "D.v_cache", "D.f_cache"
WEIGHTS = ("fc_embed", "fc_feature", "attn_norm", "wqkv", "wo", "ffn_norm", "w_gate_up",
           "w_down", "final_norm", "lm_head", "vocab_map")


def weight_layout(g: DrafterGeometry) -> dict[str, tuple[int, ...]]:
    """Physical weight buffer name -> shape (`lm_head` = the target embedding's rows
    `vocab_map`, gathered at export)."""
    shapes = {f"D.{name}": shape for name, shape in g.tensor_shapes().items()}
    shapes["D.lm_head"] = (g.draft_vocab, g.hidden)
    return shapes


def declare(t: BufferTable, g: DrafterGeometry, weight_dtype: str, rows: int, pages: int,
            page_tokens: int, splits: int, weight_id) -> None:
    """The head's weights, paged planes and scratch (`rows`: the most rows any pass runs)."""
    for name, shape in weight_layout(g).items():
        if name == "D.vocab_map":
            dtype = "i32"
        else:
            dtype = "f32" if len(shape) == 1 else weight_dtype
        t.declare(name, dtype, shape, "weight", weight_id(name))
    t.declare(K_CACHE, "f32", (pages, page_tokens, g.kv_heads, g.head_dim), "cache")
    t.declare(V_CACHE, "f32", (pages, page_tokens, g.kv_heads, g.head_dim), "cache")
    t.declare(F_CACHE, "f32", (pages, page_tokens, g.hidden), "cache")
    for name, width in (("e", g.hidden), ("r", g.hidden), ("t", g.hidden), ("h", g.hidden),
                        ("feat", g.hidden), ("qkv", g.qkv_width),
                        ("attn", g.heads * g.head_dim), ("x", g.hidden),
                        ("gate_up", 2 * g.ffn), ("act", g.ffn)):
        t.declare(f"D.{name}", "f32", (rows, width), "scratch")
    t.declare("D.part_ml", "f32", (rows, g.heads, splits, 2), "scratch")
    t.declare("D.part_o", "f32", (rows, g.heads, splits, g.head_dim), "scratch")
    t.declare("D.logits", "f32", (rows, g.draft_vocab), "scratch")


def store_features(b: ProgramBuilder, h: View, positions: View, token_row: View, slot: View,
                   page_table: View, T: int, R: int, MP: int, PT: int, D: int) -> None:
    """Store the target features `h` ([T, D]) at their tokens' positions."""
    plane = b.table.view(F_CACHE, b.table.buffers[F_CACHE].shape)
    b.launch("paged_row_write", h, positions, token_row, slot, page_table, plane,
             T, R, MP, PT, D)


def entries(b: ProgramBuilder, g: DrafterGeometry, eps: float, tokens: View, positions: View,
            token_row: View, slot: View, page_table: View, inv_freq: View, T: int, R: int,
            MP: int, PT: int, *, feature: View | None = None, linear: str = "linear") -> View:
    """Write the head's key/value entries of `T` tokens from (x_j, f_{j-1}).

    The feature input is `feature` ([T, D]) when given, else gathered from the feature
    plane at each token's previous position. Returns the head's residual `D.r` ([T, D])
    for a step to continue from.
    """
    t = b.table
    D = g.hidden
    rows = t.buffers["D.r"].shape[0]

    def s(name, width, count=T):
        return t.view(f"D.{name}", (count, width))

    if feature is None:
        feature = s("feat", D)
        plane = t.view(F_CACHE, t.buffers[F_CACHE].shape)
        b.launch("paged_row_gather_prev", plane, positions, token_row, slot, page_table,
                 feature, T, R, MP, PT, D)
    embed = t.view("embed", t.buffers["embed"].shape)
    b.launch("embedding", tokens, embed, s("e", D), T, D)
    b.launch(linear, s("e", D), t.view("D.fc_embed", (D, D)), s("r", D), T, D, D)
    b.launch(linear, feature, t.view("D.fc_feature", (D, D)), s("t", D), T, D, D)
    b.launch("add", s("r", D), s("t", D), s("r", D), T, D)
    b.launch("rmsnorm", s("r", D), t.view("D.attn_norm", (D,)), s("h", D), T, D, eps)
    b.launch(linear, s("h", D), t.view("D.wqkv", (g.qkv_width, D)), s("qkv", g.qkv_width),
             T, g.qkv_width, D)
    kc = t.view(K_CACHE, t.buffers[K_CACHE].shape)
    vc = t.view(V_CACHE, t.buffers[V_CACHE].shape)
    b.launch("rope_kv_write", s("qkv", g.qkv_width), positions, inv_freq, token_row, slot,
             page_table, kc, vc, T, R, MP, PT, g.heads, g.kv_heads, g.head_dim)
    assert T <= rows
    return s("r", D)


def step(b: ProgramBuilder, g: DrafterGeometry, eps: float, lanes: int, lane_rows: View,
         lane_slot: View, slot: View, positions: View, tokens: View, page_table: View,
         inv_freq: View, MP: int, PT: int, splits: int, split: int, *, first: bool) -> View:
    """One draft step over `lanes` rows: entry, attention over the head's history, MLP,
    final norm (the predicted feature, left in `D.feat` for the next step) and the draft
    logits `D.logits` ([lanes, draft_vocab]), which the caller samples.

    `lane_rows` / `lane_slot` are the step's masked rows and slots (< 0: the lane skips
    the step); `first` gathers the feature of the previous position from the plane,
    later steps read the previous step's `D.feat`.
    """
    t = b.table
    D, B = g.hidden, lanes

    def s(name, width):
        return t.view(f"D.{name}", (B, width))

    feature = None if first else s("feat", D)
    r = entries(b, g, eps, tokens, positions, lane_rows, slot, page_table, inv_freq, B, B, MP,
                PT, feature=feature, linear="linear_invariant")
    kc = t.view(K_CACHE, t.buffers[K_CACHE].shape)
    vc = t.view(V_CACHE, t.buffers[V_CACHE].shape)
    part_ml = t.view("D.part_ml", (B, g.heads, splits, 2))
    part_o = t.view("D.part_o", (B, g.heads, splits, g.head_dim))
    b.launch("attention_decode_split", s("qkv", g.qkv_width), positions, lane_slot, page_table,
             kc, vc, part_ml, part_o, B, MP, PT, g.heads, g.kv_heads, g.head_dim, splits,
             split, 1.0 / math.sqrt(g.head_dim))
    attn = s("attn", g.heads * g.head_dim)
    b.launch("attention_decode_merge", part_ml, part_o, lane_slot, attn, B, g.heads,
             g.head_dim, splits)
    b.launch("linear_invariant", attn, t.view("D.wo", (D, g.heads * g.head_dim)), s("x", D),
             B, D, g.heads * g.head_dim)
    b.launch("add_rmsnorm", s("x", D), r, t.view("D.ffn_norm", (D,)), s("h", D), B, D, eps)
    b.launch("linear_invariant", s("h", D), t.view("D.w_gate_up", (2 * g.ffn, D)),
             s("gate_up", 2 * g.ffn), B, 2 * g.ffn, D)
    b.launch("silu_mul", s("gate_up", 2 * g.ffn), s("act", g.ffn), B, g.ffn)
    b.launch("linear_invariant", s("act", g.ffn), t.view("D.w_down", (D, g.ffn)), s("x", D),
             B, D, g.ffn)
    b.launch("add_rmsnorm", s("x", D), r, t.view("D.final_norm", (D,)), s("feat", D), B, D,
             eps)
    logits = t.view("D.logits", (B, g.draft_vocab))
    b.launch("linear_invariant", s("feat", D), t.view("D.lm_head", (g.draft_vocab, D)),
             logits, B, g.draft_vocab, D)
    return logits
