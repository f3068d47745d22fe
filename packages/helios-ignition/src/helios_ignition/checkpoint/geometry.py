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


VISION_LAYER_TENSORS: tuple[str, ...] = (
    "layer_norm1.weight", "layer_norm1.bias",
    "self_attn.q_proj.weight", "self_attn.q_proj.bias",
    "self_attn.k_proj.weight", "self_attn.k_proj.bias",
    "self_attn.v_proj.weight", "self_attn.v_proj.bias",
    "self_attn.out_proj.weight", "self_attn.out_proj.bias",
    "layer_norm2.weight", "layer_norm2.bias",
    "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias",
)
VISION_PREFIX = "model.vision_model."
CONNECTOR = "model.connector.modality_projection.proj.weight"


@dataclass(frozen=True)
class VisionGeometry:
    """A SigLIP vision tower and Idefics3's pixel-shuffle connector (HF
    ``Idefics3VisionTransformer`` + ``Idefics3Connector``).

    Attributes:
        hidden_size / intermediate_size / num_layers / num_heads: the encoder's widths.
        image_size: edge of one window (tile) in pixels.
        patch_size: edge of one patch in pixels.
        layer_norm_eps: LayerNorm epsilon.
        scale_factor: pixel-shuffle side R (R x R patches merge into one feature).
        text_hidden: the connector's output width (the text model's hidden size).
    """

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    layer_norm_eps: float
    scale_factor: int
    text_hidden: int

    @property
    def grid(self) -> int:
        """Patches along a window's edge (G)."""
        return self.image_size // self.patch_size

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """HF tensor name -> float32 shape; the patch convolution ``[D, 3, P, P]`` is read
        flattened ``[D, 3 P P]`` (the loader's layout)."""
        d, f, p = self.hidden_size, self.intermediate_size, self.patch_size
        e = VISION_PREFIX + "embeddings."
        shapes: dict[str, tuple[int, ...]] = {
            e + "patch_embedding.weight": (d, 3 * p * p), e + "patch_embedding.bias": (d,),
            e + "position_embedding.weight": (self.grid ** 2, d)}
        per_layer = {"q_proj": (d, d), "k_proj": (d, d), "v_proj": (d, d), "out_proj": (d, d),
                     "fc1": (f, d), "fc2": (d, f)}
        for i in range(self.num_layers):
            for suffix in VISION_LAYER_TENSORS:
                module, kind = suffix.rsplit(".", 2)[-2:]
                shape = per_layer.get(module, (d,))
                if kind == "bias":
                    shape = (shape[0],)
                shapes[f"{VISION_PREFIX}encoder.layers.{i}.{suffix}"] = shape
        shapes[VISION_PREFIX + "post_layernorm.weight"] = (d,)
        shapes[VISION_PREFIX + "post_layernorm.bias"] = (d,)
        shapes[CONNECTOR] = (self.text_hidden, d * self.scale_factor ** 2)
        return shapes


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
    # An image-text model's vision tower (Idefics3: SigLIP + pixel shuffle), else None.
    vision: VisionGeometry | None = None

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
        if self.vision is not None:
            shapes.update(self.vision.tensor_shapes())
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
