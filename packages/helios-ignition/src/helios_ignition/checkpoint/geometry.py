"""Llama-family geometry and the HF tensor names and shapes it implies."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LAYER_TENSORS: tuple[str, ...] = (
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)


@dataclass(frozen=True)
class LlamaGeometry:
    """Shapes and constants of a Llama-architecture decoder.

    Attributes:
        vocab_size: rows of the embedding and of the LM head.
        hidden_size: model width d.
        intermediate_size: SwiGLU FFN width.
        num_layers: decoder blocks.
        num_heads: query heads; num_heads * head_dim need not equal hidden_size.
        num_kv_heads: key/value heads (GQA groups).
        head_dim: per-head width.
        rope_theta: RoPE base (HF half-split convention).
        rms_eps: RMSNorm epsilon.
        max_context: trained context length in tokens.
        tie_word_embeddings: LM head shares `model.embed_tokens.weight`.
        rope_scaling: HF `rope_scaling` dict (e.g. llama3) or None.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    max_context: int
    tie_word_embeddings: bool
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False, compare=True)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """HF tensor name -> float32 shape `[out, in]` (norms `[d]`), in canonical order."""
        d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q_rows, kv_rows = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = {
            "input_layernorm.weight": (d,),
            "self_attn.q_proj.weight": (q_rows, d),
            "self_attn.k_proj.weight": (kv_rows, d),
            "self_attn.v_proj.weight": (kv_rows, d),
            "self_attn.o_proj.weight": (d, q_rows),
            "post_attention_layernorm.weight": (d,),
            "mlp.gate_proj.weight": (f, d),
            "mlp.up_proj.weight": (f, d),
            "mlp.down_proj.weight": (d, f),
        }
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, d)}
        for i in range(self.num_layers):
            for suffix in LAYER_TENSORS:
                shapes[f"model.layers.{i}.{suffix}"] = per_layer[suffix]
        shapes["model.norm.weight"] = (d,)
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (v, d)
        return shapes

    def parameter_count(self) -> int:
        """Number of stored parameters (tied head counted once)."""
        total = 0
        for shape in self.tensor_shapes().values():
            n = 1
            for s in shape:
                n *= s
            total += n
        return total


SMOLLM2_135M = LlamaGeometry(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    rope_theta=100000.0,
    rms_eps=1e-5,
    max_context=8192,
    tie_word_embeddings=True,
    rope_scaling=None,
)

LLAMA_31_8B = LlamaGeometry(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    rope_theta=500000.0,
    rms_eps=1e-5,
    max_context=131072,
    tie_word_embeddings=False,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)

NAMED_GEOMETRIES: dict[str, LlamaGeometry] = {
    "smollm2-135m": SMOLLM2_135M,
    "llama-3.1-8b": LLAMA_31_8B,
}
