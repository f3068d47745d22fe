"""The Llama family: its layer math and weight buffers, written against the builder.

Implements `capture.family.Family`; the programs that run it (PREFILL, DECODE,
SPECULATIVE, RESTORE, the tuning producer) are capture/programs.py's.

Layer math (HF Llama): h = rmsnorm(r); r += o_proj(attn(rope(qkv(h)))); h = rmsnorm(r);
r += down(silu(gate(h)) * up(h)). Q/K/V and gate/up projections are fused into one
`[out, in]` matrix each (fused QKV, fused gate_up), so a decode step reads each weight
once.

Tensor parallelism (`LlamaShapes.ranks` = N > 1; Megatron-LM's split, arXiv:1909.08053
§3): the shapes are one rank's. Each rank holds its H/N query and KVH/N key/value heads
(its `wqkv` is the fused [q; k; v] of those heads: column-parallel), F/N of the FFN
(`w_gate_up` = [gate; up] of its columns), the matching columns of `wo` and `w_down`
(row-parallel: an `all_reduce_sum` follows each) and ceil(V/N) rows of the LM head
(vocabulary-parallel; the programs gather the logits). Embeddings, norms and the RoPE
table are replicated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..capture import launch
from ..capture.builder import BufferTable, ProgramBuilder
from ..capture.family import Pass, TensorParallelError
from ..capture.layers import attend, declare_mma_scratch, product, write_kv
from ..checkpoint.geometry import VisionGeometry
from . import vision
from .shapes import DecoderShapes


@dataclass(frozen=True)
class LlamaShapes(DecoderShapes):
    """Llama geometry (read from the checkpoint; the fields of DecoderShapes and those
    below) and the family hooks the programs call (capture.family.Family)."""

    # Tensor-parallel ranks these shapes are one rank's of (heads, kv_heads and ffn are
    # that rank's share; vocab and hidden are the model's).
    ranks: int = 1
    # An image-text model's vision tower (families/vision.py records it), else None.
    vision: VisionGeometry | None = None

    @property
    def head_rows(self) -> int:
        """LM-head rows of one rank: ceil(vocab / ranks) (the last rank's pad rows are
        zero and its pad logits dropped by the gather)."""
        return -(-self.vocab // self.ranks)

    def shard(self, ranks: int) -> LlamaShapes:
        """One rank's shapes under `ranks`-way tensor parallelism.

        Raises:
            TensorParallelError: `ranks` < 1, these shapes are already a rank's, or the
                query heads, key/value heads or FFN width do not divide by `ranks`
                (the message names the counts).
        """
        if ranks < 1:
            raise TensorParallelError(f"tensor parallel size must be >= 1, got {ranks}")
        if self.ranks != 1:
            raise TensorParallelError("these shapes are already one rank's")
        if ranks == 1:
            return self
        if self.vision is not None:
            raise TensorParallelError("a vision tower is captured for one rank only")
        if self.heads % ranks or self.kv_heads % ranks:
            raise TensorParallelError(
                f"the model's {self.heads} query heads and "
                f"{self.kv_heads} key/value heads must both divide by {ranks}")
        if self.ffn % ranks:
            raise TensorParallelError(f"the model's FFN width {self.ffn} does not divide "
                                      f"by {ranks}")
        return replace(self, heads=self.heads // ranks, kv_heads=self.kv_heads // ranks,
                       ffn=self.ffn // ranks, ranks=ranks)

    @classmethod
    def from_geometry(cls, g) -> LlamaShapes:
        return cls(**DecoderShapes.geometry_fields(g), vision=g.vision)

    def weight_layout(self) -> dict[str, tuple[int, ...]]:
        """Weight buffer name -> one rank's shape `[out, in]` (norms and rope table are
        vectors). Under tensor parallelism every core has an `lm_head` (a tied head's
        rank shard is cut from the embedding)."""
        s = self
        shapes: dict[str, tuple[int, ...]] = {"embed": (s.vocab, s.hidden)}
        for i in range(s.layers):
            shapes[f"L{i}.attn_norm"] = (s.hidden,)
            shapes[f"L{i}.wqkv"] = (s.qkv_width, s.hidden)
            shapes[f"L{i}.wo"] = (s.hidden, s.heads * s.head_dim)
            shapes[f"L{i}.ffn_norm"] = (s.hidden,)
            shapes[f"L{i}.w_gate_up"] = (2 * s.ffn, s.hidden)
            shapes[f"L{i}.w_down"] = (s.hidden, s.ffn)
        shapes["final_norm"] = (s.hidden,)
        if s.ranks > 1:
            shapes["lm_head"] = (s.head_rows, s.hidden)
        elif not s.tied:
            shapes["lm_head"] = (s.vocab, s.hidden)
        shapes["rope_inv_freq"] = (s.head_dim // 2,)
        if s.vision is not None:
            shapes.update(vision.weight_layout(s.vision))
        return shapes

    def weight_split(self, name: str) -> int | None:
        """The axis along which tensor-parallel ranks split weight buffer `name` (0:
        output rows, column-parallel; 1: input columns, row-parallel), or None when
        replicated."""
        kind = name.split(".", 1)[-1]
        return {"wqkv": 0, "w_gate_up": 0, "lm_head": 0, "wo": 1, "w_down": 1}.get(kind)

    def checkpoint_tensors(self, name: str) -> list[str]:
        """HF checkpoint tensors concatenated (along axis 0) into weight buffer `name`
        (`lm_head` of a tied model: the embedding). `rope_inv_freq` is computed
        (`rope_inv_freq`), not read."""
        if vision.owns(name):
            return vision.checkpoint_tensors(name)
        if name == "embed":
            return ["model.embed_tokens.weight"]
        if name == "final_norm":
            return ["model.norm.weight"]
        if name == "lm_head":
            return ["model.embed_tokens.weight" if self.tied else "lm_head.weight"]
        layer, kind = name.split(".", 1)
        prefix = f"model.layers.{layer[1:]}."
        table = {
            "attn_norm": ["input_layernorm.weight"],
            "wqkv": ["self_attn.q_proj.weight", "self_attn.k_proj.weight",
                     "self_attn.v_proj.weight"],
            "wo": ["self_attn.o_proj.weight"],
            "ffn_norm": ["post_attention_layernorm.weight"],
            "w_gate_up": ["mlp.gate_proj.weight", "mlp.up_proj.weight"],
            "w_down": ["mlp.down_proj.weight"],
        }
        return [prefix + t for t in table[kind]]

    def split_widths(self, name: str) -> tuple[int, ...]:
        """One rank's width, along `weight_split(name)`, of each of split layer weight
        `name`'s checkpoint tensors (these shapes are a rank's: its query and key/value
        heads, its FFN columns)."""
        q, kv, f = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.ffn
        kind = name.split(".", 1)[1]
        return {"wqkv": (q, kv, kv), "w_gate_up": (f, f), "wo": (q,), "w_down": (f,)}[kind]

    def head_buffer(self) -> str:
        """The LM head's weight buffer (a single-rank tied core reads the embedding)."""
        return "embed" if self.tied and self.ranks == 1 else "lm_head"

    def declare_scratch(self, t: BufferTable, tokens: int, weight_dtype: str) -> None:
        """The trunk's f32 activations ([tokens, width] each) and, for bf16 weights, the
        packed-product scratch (capture.layers.declare_mma_scratch)."""
        s = self
        for name, width in (("x", s.hidden), ("residual", s.hidden), ("h", s.hidden),
                            ("qkv", s.qkv_width), ("attn", s.heads * s.head_dim),
                            ("gate_up", 2 * s.ffn), ("act", s.ffn)):
            t.declare(f"scratch.{name}", "f32", (tokens, width), "scratch")
        declare_mma_scratch(t, _layer_products(s), weight_dtype, tokens)

    def trunk(self, b: ProgramBuilder, p: Pass) -> None:
        """Embedding, every layer and the final norm over `p.tokens` (T) packed rows; the
        final-norm hidden states (the LM head's input) are left in `scratch.h`.

        Attention is capture.layers' (`p.decode_attention`, `p.tuned`). `p.invariant`
        records `linear_invariant` and no fused SwiGLU. `p.fold`
        (``capture(fold_layers=True)``) records 7 launches per layer instead of 9: each
        RMS norm folded into the product that follows it (``rmsnorm_linear``: the QKV and
        gate/up products read the residual stream) and each residual add into the
        epilogue of the product before it (``linear_add`` / ``swiglu_linear_add`` add
        into ``scratch.residual``); the final norm stays one ``rmsnorm``. The
        composition is the same arithmetic as the unfolded sequence (the NumPy
        references are those sequences).
        """
        s, t = self, b.table
        T = p.tokens
        D = s.hidden
        H, KVH, HD = s.heads, s.kv_heads, s.head_dim
        QKV = s.qkv_width
        lin = "linear_invariant" if p.invariant else "linear"

        def scratch(name: str, width: int, count: int = T):
            return t.view(f"scratch.{name}", (count, width))

        x, res, h = scratch("x", D), scratch("residual", D), scratch("h", D)
        qkv, attn = scratch("qkv", QKV), scratch("attn", H * HD)
        inv_freq = t.view("rope_inv_freq", (HD // 2,))
        scale = 1.0 / math.sqrt(HD)
        b.launch("embedding", p.rows.tokens, t.view("embed", (s.vocab, D)), res, T, D)
        if p.images is not None:  # feature sentinels embed as zeros; their rows get features
            b.launch("image_merge", p.images.features, p.images.index, res, T,
                     p.images.features.shape[0], D)
        if not p.fold:
            b.launch("rmsnorm", res, t.view("L0.attn_norm", (D,)), h, T, D, s.rms_eps)
        for i in range(s.layers):
            if p.fold:
                b.launch("rmsnorm_linear", res, t.view(f"L{i}.attn_norm", (D,)),
                         t.view(f"L{i}.wqkv", (QKV, D)), qkv, T, QKV, D, s.rms_eps)
            else:
                product(b, lin, h, t.view(f"L{i}.wqkv", (QKV, D)), qkv, T, QKV, D)
            self.attention_inputs(b, p, i, qkv)
            write_kv(b, p, i, qkv, inv_freq, H, KVH, HD)
            attend(b, p, i, qkv, attn, H, KVH, HD, scale)
            if p.fold:
                self.folded_mlp(b, p, i, res, attn, T)
                continue
            product(b, lin, attn, t.view(f"L{i}.wo", (D, H * HD)), x, T, D, H * HD)
            if s.ranks > 1:  # row-parallel: every rank holds a partial sum
                b.launch("all_reduce_sum", x, T, D)
            b.launch("add_rmsnorm", x, res, t.view(f"L{i}.ffn_norm", (D,)), h, T, D,
                     s.rms_eps)
            self.mlp(b, p, i, h, x)
            if s.ranks > 1:
                b.launch("all_reduce_sum", x, T, D)
            next_norm = f"L{i + 1}.attn_norm" if i + 1 < s.layers else "final_norm"
            b.launch("add_rmsnorm", x, res, t.view(next_norm, (D,)), h, T, D, s.rms_eps)
        if p.fold:
            b.launch("rmsnorm", res, t.view("final_norm", (D,)), h, T, D, s.rms_eps)

    def attention_inputs(self, b: ProgramBuilder, p: Pass, i: int, qkv) -> None:
        """Hook between layer `i`'s QKV product and RoPE (`qkv` [T, qkv_width]): nothing
        for Llama; a subclass family may transform the heads in place (Qwen3's QK-norm)."""

    def mlp(self, b: ProgramBuilder, p: Pass, i: int, h, x) -> None:
        """Layer `i`'s MLP of the normalized `h` ([T, hidden]) into `x` ([T, hidden]):
        SwiGLU over the fused gate/up product (batch-1 decode fuses the down product)."""
        t, T, D, F = b.table, p.tokens, self.hidden, self.ffn
        lin = "linear_invariant" if p.invariant else "linear"
        gate_up = t.view("scratch.gate_up", (T, 2 * F))
        product(b, lin, h, t.view(f"L{i}.w_gate_up", (2 * F, D)), gate_up, T, 2 * F, D)
        if p.decode_attention and not p.invariant and launch.fuse_swiglu_linear(T, D, F):
            b.launch("swiglu_linear", gate_up, t.view(f"L{i}.w_down", (D, F)), x, T, D, F)
        else:
            product(b, lin, gate_up, t.view(f"L{i}.w_down", (D, F)), x, T, D, F,
                    swiglu=True)

    def folded_mlp(self, b: ProgramBuilder, p: Pass, i: int, res, attn, T: int) -> None:
        """Layer `i` after attention with folding (`p.fold`): the O product added into
        the residual `res`, then the MLP added into it (`_folded_mlp`)."""
        t = b.table
        _folded_mlp(b, self, i, res, attn, t.view("scratch.gate_up", (T, 2 * self.ffn)),
                    t.view("scratch.act", (T, self.ffn)), T)


def _layer_products(s: LlamaShapes) -> tuple[tuple[int, int], ...]:
    """(N, K) of each layer's products: QKV, O, gate/up, down."""
    return ((s.qkv_width, s.hidden), (s.hidden, s.heads * s.head_dim), (2 * s.ffn, s.hidden),
            (s.hidden, s.ffn))


def _folded_mlp(b: ProgramBuilder, s: LlamaShapes, i: int, res, attn, gate_up, act,
                T: int) -> None:
    """Layer `i` after attention with folding: O projection added into the residual,
    gate/up from the normalized residual, down projection added into the residual."""
    t = b.table
    D, F, HO = s.hidden, s.ffn, s.heads * s.head_dim
    b.launch("linear_add", attn, t.view(f"L{i}.wo", (D, HO)), res, T, D, HO)
    b.launch("rmsnorm_linear", res, t.view(f"L{i}.ffn_norm", (D,)),
             t.view(f"L{i}.w_gate_up", (2 * F, D)), gate_up, T, 2 * F, D, s.rms_eps)
    if launch.fuse_swiglu_linear(T, D, F):
        b.launch("swiglu_linear_add", gate_up, t.view(f"L{i}.w_down", (D, F)), res, T, D, F)
    else:
        b.launch("silu_mul", gate_up, act, T, F)
        b.launch("linear_add", act, t.view(f"L{i}.w_down", (D, F)), res, T, D, F)


def rope_inv_freq(s: LlamaShapes, rope_scaling: dict | None) -> np.ndarray:
    """f32 [head_dim/2] inverse frequencies, with Llama-3 scaling when declared.

    Source: HF transformers `_compute_llama3_parameters` (rope_type "llama3").
    """
    inv = 1.0 / (s.rope_theta ** (np.arange(0, s.head_dim, 2, dtype=np.float64) / s.head_dim))
    if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) == "llama3":
        factor = float(rope_scaling["factor"])
        low = float(rope_scaling.get("low_freq_factor", 1.0))
        high = float(rope_scaling.get("high_freq_factor", 4.0))
        original = float(rope_scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        low_wavelen, high_wavelen = original / low, original / high
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (original / wavelen - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = np.where(is_mid, mid, scaled)
    return inv.astype(np.float32)
