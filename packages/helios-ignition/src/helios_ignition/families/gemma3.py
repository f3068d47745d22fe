"""The Gemma 3 text family: its layer math and weight buffers, written against the builder.

Implements `capture.family.Family`; the programs that run it are capture/programs.py's.
Everything that differs from Llama is data here, read from the checkpoint's geometry:

Layer math (HF `Gemma3DecoderLayer`), every norm an RMS norm with gain (1 + w):

    r = embed(tokens) * sqrt(hidden)                      # embedding scale
    per layer i:
        h = rmsnorm(r, input_layernorm)
        q, k, v = wqkv(h); q, k = rmsnorm_per_head(q, k)  # QK-norm
        q, k = rope(q, k, base_i)                         # local base or global base
        a = attention(q, k, v, window_i)                  # window_i tokens, 0: global
        r += rmsnorm(o(a), post_attention_layernorm)      # post-norm
        h = rmsnorm(r, pre_feedforward_layernorm)
        r += rmsnorm(down(gelu_tanh(gate(h)) * up(h)), post_feedforward_layernorm)
    h = rmsnorm(r, norm)

`windows[i]` (tokens a local layer attends to, 0 for a global layer) and the two RoPE
bases come from the checkpoint (checkpoint/gemma3.py); the norm shift (1 + w) is added
when the norm buffers are stored (`stored_value`), so the programs run plain `rmsnorm`.
One rank only: `shard` refuses tensor parallelism.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..capture.builder import BufferTable, ProgramBuilder
from ..capture.family import Pass, TensorParallelError
from ..capture.layers import attend, declare_mma_scratch, product, write_kv
from .shapes import DecoderShapes

# Gemma's RMS norm gain is (1 + w): the value added to every stored norm weight.
NORM_SHIFT = 1.0
_NORMS = ("attn_norm", "q_norm", "k_norm", "post_attn_norm", "ffn_norm", "post_ffn_norm")


@dataclass(frozen=True)
class Gemma3Shapes(DecoderShapes):
    """Gemma 3 geometry (read from the checkpoint; the fields of DecoderShapes and those
    below) and the family hooks the programs call (capture.family.Family)."""

    rope_local_theta: float
    windows: tuple[int, ...]  # per layer: attention window in tokens, 0 = global
    query_scale: float
    ranks: int = 1

    @property
    def vision(self) -> None:
        """No vision tower: the family exports text-only cores (capture.family.Family)."""
        return None

    @property
    def head_rows(self) -> int:
        return self.vocab

    def shard(self, ranks: int) -> Gemma3Shapes:
        """These shapes for `ranks` = 1.

        Raises:
            TensorParallelError: `ranks` != 1 (the family's trunk has no collectives).
        """
        if ranks != 1:
            raise TensorParallelError(f"the gemma3 family runs on one rank, not {ranks}")
        return self

    @classmethod
    def from_geometry(cls, g) -> Gemma3Shapes:
        """From a `checkpoint.gemma3.Gemma3Geometry`."""
        return cls(**DecoderShapes.geometry_fields(g),
                   rope_local_theta=float(g.rope_local_theta), windows=tuple(g.layer_windows),
                   query_scale=float(g.query_scale))

    def weight_layout(self) -> dict[str, tuple[int, ...]]:
        """Weight buffer name -> shape `[out, in]` (norms and RoPE tables are vectors)."""
        s = self
        D, HD = s.hidden, s.head_dim
        shapes: dict[str, tuple[int, ...]] = {"embed": (s.vocab, D)}
        for i in range(s.layers):
            shapes[f"L{i}.attn_norm"] = (D,)
            shapes[f"L{i}.wqkv"] = (s.qkv_width, D)
            shapes[f"L{i}.q_norm"] = (HD,)
            shapes[f"L{i}.k_norm"] = (HD,)
            shapes[f"L{i}.wo"] = (D, s.heads * HD)
            shapes[f"L{i}.post_attn_norm"] = (D,)
            shapes[f"L{i}.ffn_norm"] = (D,)
            shapes[f"L{i}.w_gate_up"] = (2 * s.ffn, D)
            shapes[f"L{i}.w_down"] = (D, s.ffn)
            shapes[f"L{i}.post_ffn_norm"] = (D,)
        shapes["final_norm"] = (D,)
        if not s.tied:
            shapes["lm_head"] = (s.vocab, D)
        shapes["rope_inv_freq"] = (HD // 2,)
        if any(s.windows):
            shapes["rope_inv_freq_local"] = (HD // 2,)
        return shapes

    def weight_split(self, name: str) -> int | None:
        return None  # one rank

    def checkpoint_tensors(self, name: str) -> list[str]:
        """HF checkpoint tensors concatenated (along axis 0) into weight buffer `name`."""
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
            "q_norm": ["self_attn.q_norm.weight"],
            "k_norm": ["self_attn.k_norm.weight"],
            "wo": ["self_attn.o_proj.weight"],
            "post_attn_norm": ["post_attention_layernorm.weight"],
            "ffn_norm": ["pre_feedforward_layernorm.weight"],
            "w_gate_up": ["mlp.gate_proj.weight", "mlp.up_proj.weight"],
            "w_down": ["mlp.down_proj.weight"],
            "post_ffn_norm": ["post_feedforward_layernorm.weight"],
        }
        return [prefix + t for t in table[kind]]

    def computed_weight(self, name: str, checkpoint) -> np.ndarray | None:
        """The f32 value of a buffer computed rather than read (the RoPE tables
        [head_dim / 2] of the global and local bases), or None for a checkpoint buffer."""
        base = {"rope_inv_freq": self.rope_theta,
                "rope_inv_freq_local": self.rope_local_theta}.get(name)
        if base is None:
            return None
        exponents = np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim
        return (1.0 / base ** exponents).astype(np.float32)

    def stored_value(self, name: str, array: np.ndarray) -> np.ndarray:
        """Buffer `name`'s stored value from its checkpoint value: the norms' (1 + w)."""
        if name == "final_norm" or name.split(".", 1)[-1] in _NORMS:
            return array + np.float32(NORM_SHIFT)
        return array

    def head_buffer(self) -> str:
        return "embed" if self.tied else "lm_head"

    def declare_scratch(self, t: BufferTable, tokens: int, weight_dtype: str) -> None:
        """The trunk's f32 activations ([tokens, width] each) and, for bf16 weights, the
        packed-product scratch."""
        s = self
        for name, width in (("x", s.hidden), ("y", s.hidden), ("residual", s.hidden),
                            ("h", s.hidden), ("qkv", s.qkv_width),
                            ("attn", s.heads * s.head_dim), ("gate_up", 2 * s.ffn),
                            ("act", s.ffn)):
            t.declare(f"scratch.{name}", "f32", (tokens, width), "scratch")
        declare_mma_scratch(t, ((s.qkv_width, s.hidden), (s.hidden, s.heads * s.head_dim),
                                (2 * s.ffn, s.hidden), (s.hidden, s.ffn)), weight_dtype,
                            tokens)

    def trunk(self, b: ProgramBuilder, p: Pass) -> None:
        """Embedding, every layer and the final norm over `p.tokens` (T) packed rows (the
        module docstring's math); the final-norm hidden states are left in `scratch.h`.
        `p.invariant` records `linear_invariant`; `p.fold` is ignored (no folded forms)."""
        s, t, T = self, b.table, p.tokens
        D, H, KVH, HD, F = s.hidden, s.heads, s.kv_heads, s.head_dim, s.ffn
        lin = "linear_invariant" if p.invariant else "linear"

        def scratch(name: str, width: int):
            return t.view(f"scratch.{name}", (T, width))

        x, y, res, h = (scratch(n, D) for n in ("x", "y", "residual", "h"))
        qkv, attn = scratch("qkv", s.qkv_width), scratch("attn", H * HD)
        gate_up, act = scratch("gate_up", 2 * F), scratch("act", F)
        tables = {0: t.view("rope_inv_freq", (HD // 2,))}
        if any(s.windows):
            tables[1] = t.view("rope_inv_freq_local", (HD // 2,))

        def w(name: str, *shape: int):
            return t.view(name, shape)

        b.launch("embedding", p.rows.tokens, w("embed", s.vocab, D), res, T, D)
        b.launch("scale", res, T, D, math.sqrt(D))
        b.launch("rmsnorm", res, w("L0.attn_norm", D), h, T, D, s.rms_eps)
        for i in range(s.layers):
            window = s.windows[i]
            product(b, lin, h, w(f"L{i}.wqkv", s.qkv_width, D), qkv, T, s.qkv_width, D)
            b.launch("head_rmsnorm", qkv, w(f"L{i}.q_norm", HD), w(f"L{i}.k_norm", HD), T, H,
                     KVH, HD, s.rms_eps)
            write_kv(b, p, i, qkv, tables[int(window > 0)], H, KVH, HD, window=window)
            attend(b, p, i, qkv, attn, H, KVH, HD, s.query_scale, window=window)
            product(b, lin, attn, w(f"L{i}.wo", D, H * HD), x, T, D, H * HD)
            b.launch("rmsnorm", x, w(f"L{i}.post_attn_norm", D), y, T, D, s.rms_eps)
            b.launch("add_rmsnorm", y, res, w(f"L{i}.ffn_norm", D), h, T, D, s.rms_eps)
            product(b, lin, h, w(f"L{i}.w_gate_up", 2 * F, D), gate_up, T, 2 * F, D)
            b.launch("gelu_mul", gate_up, act, T, F)
            product(b, lin, act, w(f"L{i}.w_down", D, F), x, T, D, F)
            b.launch("rmsnorm", x, w(f"L{i}.post_ffn_norm", D), y, T, D, s.rms_eps)
            next_norm = f"L{i + 1}.attn_norm" if i + 1 < s.layers else "final_norm"
            b.launch("add_rmsnorm", y, res, w(next_norm, D), h, T, D, s.rms_eps)
