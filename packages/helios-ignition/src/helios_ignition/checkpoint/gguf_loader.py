"""Load a llama.cpp GGUF as a `Checkpoint`: architecture `llama` here, the others through
their readers (`GGUF_READERS`; gemma3: checkpoint/gemma3.py; qwen3, qwen3moe:
checkpoint/qwen3.py).

Tensors are dequantized one at a time with `gguf.quants.dequantize` from the memory-mapped
file. llama.cpp's converter permutes the rows of `attn_q`/`attn_k` within each head so that
RoPE pairs are interleaved; this loader undoes it, so every consumer uses HF half-split RoPE
(mixing the two conventions is silently wrong: a logit error of about 25).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from .checkpoint import Checkpoint
from .errors import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    GeometryError,
    MissingChatTemplateError,
)
from .gemma3 import read_gemma3_gguf
from .geometry import LlamaGeometry
from .gguf_read import (
    field_value,
    gguf_checkpoint,
    gpt2_tokenizer_json,
    hf_name,
    require_tensors,
    rms_eps,
    tensors_by_hf,
)
from .qwen3 import QWEN3_GGUF_ARCHITECTURES, read_qwen3_gguf

# GGUF per-layer suffix -> HF per-layer suffix.
_LAYER_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# GGUF block types a core may keep as they are (manifest StorageType GGUF_*).
GGUF_BLOCK_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K")
# general.architecture -> the reader of an opened GGUF of that architecture, called as
# reader(gguf_reader, source, field_of, GGUF_BLOCK_TYPES) (llama: this file's own).
GGUF_READERS = {"gemma3": read_gemma3_gguf,
                **{arch: read_qwen3_gguf for arch in QWEN3_GGUF_ARCHITECTURES}}
SUPPORTED_GGUF_ARCHITECTURES = tuple(sorted({"llama", *GGUF_READERS}))


def gguf_to_hf_name(name: str) -> str | None:
    """HF name for a GGUF tensor name, or None when it has no HF counterpart."""
    return hf_name(name, _GLOBAL_MAP, _LAYER_MAP)


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head RoPE row permutation of a Q or K projection.

    Args:
        w: `[n_heads * head_dim, d]` float32 rows as stored in the GGUF (interleaved pairs).
        n_heads: heads of this projection (query heads for Q, KV heads for K).

    Returns:
        `[n_heads * head_dim, d]` rows in HF half-split order: row `h*hd + i` (i < hd/2) is
        GGUF row `h*hd + 2i`, row `h*hd + hd/2 + i` is GGUF row `h*hd + 2i + 1`.
    """
    rows, d = w.shape
    hd = rows // n_heads
    return w.reshape(n_heads, hd // 2, 2, d).swapaxes(1, 2).reshape(rows, d)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    """Scalar, string or list value of a GGUF metadata key (None/default when absent)."""
    return field_value(reader, key, default)


def _geometry(reader: Any, path: str, tensor_names: set[str]) -> LlamaGeometry:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise GeometryError(f"{path}: architecture {arch!r} is not supported; supported: "
                            f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)}")

    def req(key: str) -> Any:
        value = _field(reader, f"llama.{key}")
        if value is None:
            raise GeometryError(f"{path}: missing metadata key 'llama.{key}'")
        return value

    hidden = int(req("embedding_length"))
    heads = int(req("attention.head_count"))
    kv_heads = int(_field(reader, "llama.attention.head_count_kv", heads))
    head_dim = int(
        _field(reader, "llama.attention.key_length")
        or _field(reader, "llama.rope.dimension_count")
        or hidden // heads
    )
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    vocab = int(_field(reader, "llama.vocab_size") or len(tokens))
    rope_scaling = None
    scaling_type = _field(reader, "llama.rope.scaling.type")
    if scaling_type not in (None, "none"):
        rope_scaling = {
            "rope_type": scaling_type,
            "factor": float(_field(reader, "llama.rope.scaling.factor", 1.0)),
        }
        original = _field(reader, "llama.rope.scaling.original_context_length")
        if original is not None:
            rope_scaling["original_max_position_embeddings"] = int(original)
    return LlamaGeometry(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(req("feed_forward_length")),
        num_layers=int(req("block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        rms_eps=rms_eps(req("attention.layer_norm_rms_epsilon")),
        max_context=int(req("context_length")),
        tie_word_embeddings="output.weight" not in tensor_names,
        rope_scaling=rope_scaling,
    )


def load_gguf(path: str | Path) -> Checkpoint:
    """Open a GGUF: `llama` here, the architectures of `GGUF_READERS` through their readers;
    tensors are dequantized lazily, one per `Checkpoint.tensor` call.

    Args:
        path: the `.gguf` file.

    Returns:
        A `Checkpoint` with HF tensor names, the BPE tokenizer rebuilt as `tokenizer.json`
        (the recipe the tests pin against transformers) and the embedded chat template.

    Raises:
        CheckpointNotFoundError: no such file.
        CheckpointFormatError: the file is not a readable GGUF (truncated, bad magic).
        GeometryError: an architecture not in SUPPORTED_GGUF_ARCHITECTURES (one line
            naming it and the supported ones), or metadata missing.
        MissingTokenizerError / MissingChatTemplateError: tokenizer or template absent.
        MissingTensorError: a tensor the geometry needs is absent.
    """
    import gguf  # start-up time: 0.25 s to import, needed only when a GGUF is read

    path = Path(path)
    if not path.is_file():
        raise CheckpointNotFoundError(f"{path}: no such file")
    source = str(path)
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, IndexError, OSError, struct.error) as exc:
        # The gguf reader's own words ("cannot reshape array ...") name no cause.
        raise CheckpointFormatError(f"{source}: not a readable GGUF file (truncated or "
                                    f"corrupt): {exc}") from exc

    def field_of(key: str) -> Any:
        return _field(reader, key)

    other = GGUF_READERS.get(field_of("general.architecture"))
    if other is not None:
        return other(reader, source, field_of, GGUF_BLOCK_TYPES)
    by_hf = tensors_by_hf(reader, gguf_to_hf_name)
    geometry = _geometry(reader, source, {t.name for t in reader.tensors})
    require_tensors(by_hf, geometry.tensor_shapes(), source)
    tokenizer_json = gpt2_tokenizer_json(field_of, source)
    template = field_of("tokenizer.chat_template")
    if not template:
        raise MissingChatTemplateError(f"{source}: no tokenizer.chat_template")

    def hf_rows(name: str, w: np.ndarray) -> np.ndarray:
        """Q/K rows in HF's half-split order (whole rows move: blocks stay blocks)."""
        if w.ndim != 2:
            return w
        if name.endswith("self_attn.q_proj.weight"):
            return unpermute_qk(w, geometry.num_heads)
        if name.endswith("self_attn.k_proj.weight"):
            return unpermute_qk(w, geometry.num_kv_heads)
        return w

    return gguf_checkpoint(by_hf, source, field_of, geometry, tokenizer_json,
                           GGUF_BLOCK_TYPES, chat_template=template, values=hf_rows,
                           rows=hf_rows)
