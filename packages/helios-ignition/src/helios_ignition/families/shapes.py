"""The geometry every decoder family's shapes share (families/llama.py's LlamaShapes,
families/gemma3.py's Gemma3Shapes): one place for the common fields and their reading
from a checkpoint's geometry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DecoderShapes:
    """A decoder-only transformer's common geometry (one rank's heads and FFN width
    where a family splits them).

    Attributes:
        vocab, hidden, ffn: vocabulary size, model width, FFN width.
        layers, heads, kv_heads, head_dim: layer count, query and key/value heads, head
            width.
        rope_theta: the (global) RoPE base; rms_eps: the RMS norms' epsilon.
        tied: the LM head is the embedding.
    """

    vocab: int
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    tied: bool

    @property
    def qkv_width(self) -> int:
        """Rows of the fused [q; k; v] projection."""
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @staticmethod
    def geometry_fields(g: Any) -> dict[str, Any]:
        """DecoderShapes' fields from a checkpoint geometry (`checkpoint.geometry`'s
        LlamaGeometry, `checkpoint.gemma3`'s Gemma3Geometry: the same attribute names)."""
        return {"vocab": g.vocab_size, "hidden": g.hidden_size, "ffn": g.intermediate_size,
                "layers": g.num_layers, "heads": g.num_heads, "kv_heads": g.num_kv_heads,
                "head_dim": g.head_dim, "rope_theta": float(g.rope_theta),
                "rms_eps": float(g.rms_eps), "tied": bool(g.tie_word_embeddings)}
