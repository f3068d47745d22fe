"""Weight assembly: HF-named checkpoint tensors -> the family's physical weight buffers.

Fused buffers are concatenations along the output axis (`[q; k; v]`, `[gate; up]`), so a
decode step reads each weight once. Stored bytes are little-endian in the buffer dtype;
bf16 is rounded to nearest even from float32.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .families.llama import LlamaShapes, rope_inv_freq, weight_layout


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(x)
    out = rounded.astype(np.uint16)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def _sources(name: str) -> list[str]:
    """HF tensors concatenated (row-wise) into physical weight `name`."""
    if name == "embed":
        return ["model.embed_tokens.weight"]
    if name == "final_norm":
        return ["model.norm.weight"]
    if name == "lm_head":
        return ["lm_head.weight"]
    layer, kind = name.split(".", 1)
    prefix = f"model.layers.{layer[1:]}."
    table = {
        "attn_norm": ["input_layernorm.weight"],
        "wqkv": ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"],
        "wo": ["self_attn.o_proj.weight"],
        "ffn_norm": ["post_attention_layernorm.weight"],
        "w_gate_up": ["mlp.gate_proj.weight", "mlp.up_proj.weight"],
        "w_down": ["mlp.down_proj.weight"],
    }
    return [prefix + t for t in table[kind]]


def iter_weight_buffers(checkpoint, shapes: LlamaShapes, weight_dtype: str
                        ) -> Iterator[tuple[str, np.ndarray]]:
    """Yield `(buffer name, stored array)` one buffer at a time.

    Matrices are stored in `weight_dtype` (bf16 as uint16 bit patterns); norm vectors and
    the RoPE table stay float32.
    """
    for name, shape in weight_layout(shapes).items():
        if name == "rope_inv_freq":
            yield name, rope_inv_freq(shapes, checkpoint.geometry.rope_scaling)
            continue
        parts = [checkpoint.tensor(src) for src in _sources(name)]
        array = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        assert array.shape == shape, (name, array.shape, shape)
        if len(shape) > 1 and weight_dtype == "bf16":
            yield name, to_bf16_bits(array)
        else:
            yield name, np.ascontiguousarray(array, dtype=np.float32)


def iter_drafter_buffers(drafter, checkpoint, shapes: LlamaShapes, weight_dtype: str
                         ) -> Iterator[tuple[str, np.ndarray]]:
    """Yield the learned drafter's `(buffer name, stored array)` (families/draft.py names).

    Matrices in `weight_dtype`, norms float32, `D.vocab_map` int32; `D.lm_head` is the
    target's LM head (the tied embedding when tied) restricted to the rows `vocab_map`,
    so the head shares the target's output projection.
    """
    for name, array in drafter.tensors.items():
        if name == "vocab_map":
            yield "D.vocab_map", np.ascontiguousarray(array, dtype=np.int32)
        elif array.ndim > 1 and weight_dtype == "bf16":
            yield f"D.{name}", to_bf16_bits(array)
        else:
            yield f"D.{name}", np.ascontiguousarray(array, dtype=np.float32)
    source = "model.embed_tokens.weight" if shapes.tied else "lm_head.weight"
    head = checkpoint.tensor(source)[drafter.vocab_map]
    yield "D.lm_head", to_bf16_bits(head) if weight_dtype == "bf16" else np.ascontiguousarray(head)
