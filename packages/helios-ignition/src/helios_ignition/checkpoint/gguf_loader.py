"""Load a llama.cpp GGUF as a `Checkpoint`: architecture `llama` here, the others through
their readers (`GGUF_READERS`; gemma3: checkpoint/gemma3.py).

Tensors are dequantized one at a time with `gguf.quants.dequantize` from the memory-mapped
file. llama.cpp's converter permutes the rows of `attn_q`/`attn_k` within each head so that
RoPE pairs are interleaved; this loader undoes it, so every consumer uses HF half-split RoPE
(mixing the two conventions is silently wrong: a logit error of about 25).
"""

from __future__ import annotations

import re
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
    MissingTensorError,
    MissingTokenizerError,
    UnsupportedTensorError,
)
from .gemma3 import read_gemma3_gguf
from .geometry import LlamaGeometry
from .tokenizer_build import bpe_tokenizer_json

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
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
_TOKEN_TYPE_CONTROL = 3
# general.architecture -> the reader of an opened GGUF of that architecture, called as
# reader(gguf_reader, source, field_of, GGUF_BLOCK_TYPES) (llama: this file's own).
GGUF_READERS = {"gemma3": read_gemma3_gguf}
SUPPORTED_GGUF_ARCHITECTURES = tuple(sorted({"llama", *GGUF_READERS}))


def gguf_to_hf_name(name: str) -> str | None:
    """HF name for a GGUF tensor name, or None when it has no HF counterpart."""
    if name in _GLOBAL_MAP:
        return _GLOBAL_MAP[name]
    m = _LAYER_RE.match(name)
    if m and m.group(2) in _LAYER_MAP:
        return f"model.layers.{m.group(1)}.{_LAYER_MAP[m.group(2)]}"
    return None


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
    f = reader.fields.get(key)
    if f is None:
        return default
    if not f.data:
        return []
    values = [f.parts[i] for i in f.data]
    decoded = [
        bytes(v).decode("utf-8") if v.dtype == np.uint8 else v.tolist()[0] for v in values
    ]
    # Arrays have types [ARRAY, elem]; scalars/strings have one type.
    from gguf import GGUFValueType

    if f.types and f.types[0] == GGUFValueType.ARRAY:
        return decoded
    return decoded[0]


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
        # GGUF stores eps as float32 (9.9999997e-06); round-trip to the decimal it encodes.
        rms_eps=float(np.format_float_positional(
            np.float32(req("attention.layer_norm_rms_epsilon")), unique=True)),
        max_context=int(req("context_length")),
        tie_word_embeddings="output.weight" not in tensor_names,
        rope_scaling=rope_scaling,
    )


def load_gguf(path: str | Path) -> Checkpoint:
    """Open a Llama GGUF; tensors are dequantized lazily, one per `Checkpoint.tensor` call.

    Args:
        path: the `.gguf` file.

    Returns:
        A `Checkpoint` with HF tensor names, the BPE tokenizer rebuilt as `tokenizer.json`
        (the recipe the tests pin against transformers) and the embedded chat template.

    Raises:
        CheckpointNotFoundError: no such file.
        CheckpointFormatError: the file is not a readable GGUF (truncated, bad magic).
        GeometryError: not a llama GGUF or metadata missing.
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
        raise CheckpointFormatError(f"{source}: not a readable GGUF file: {exc}") from exc
    other = GGUF_READERS.get(_field(reader, "general.architecture"))
    if other is not None:
        return other(reader, source, lambda key: _field(reader, key), GGUF_BLOCK_TYPES)
    by_hf: dict[str, Any] = {}
    for t in reader.tensors:
        hf = gguf_to_hf_name(t.name)
        if hf is not None:
            by_hf[hf] = t
    geometry = _geometry(reader, source, {t.name for t in reader.tensors})
    names = tuple(geometry.tensor_shapes())
    for name in names:
        if name not in by_hf:
            raise MissingTensorError(source, name, "no matching GGUF tensor")

    if _field(reader, "tokenizer.ggml.model") != "gpt2" or not _field(
        reader, "tokenizer.ggml.tokens"
    ):
        raise MissingTokenizerError(f"{source}: no GPT-2 style BPE tokenizer (tokenizer.ggml.*)")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    token_types = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = _field(reader, "tokenizer.ggml.merges") or []
    control = [i for i, kind in enumerate(token_types) if kind == _TOKEN_TYPE_CONTROL]
    pre = _field(reader, "tokenizer.ggml.pre") or "default"
    try:
        tokenizer_json = bpe_tokenizer_json(tokens, merges, control, pre=pre)
    except MissingTokenizerError as exc:
        raise MissingTokenizerError(f"{source}: {exc}") from exc

    template = _field(reader, "tokenizer.chat_template")
    if not template:
        raise MissingChatTemplateError(f"{source}: no tokenizer.chat_template")
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    eos_ids = tuple(int(e) for e in ([eos] if eos is not None else []))
    eot = _field(reader, "tokenizer.ggml.eot_token_id")
    if eot is not None and int(eot) not in eos_ids:
        eos_ids += (int(eot),)
    special = {}
    for key, tid in (("bos_token", bos), ("eos_token", eos),
                     ("unk_token", _field(reader, "tokenizer.ggml.unknown_token_id")),
                     ("pad_token", _field(reader, "tokenizer.ggml.padding_token_id"))):
        if tid is not None and 0 <= int(tid) < len(tokens):
            special[key] = tokens[int(tid)]

    def read(name: str) -> np.ndarray:
        t = by_hf.get(name)
        if t is None:
            raise MissingTensorError(source, name, "no matching GGUF tensor")
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as exc:
            raise UnsupportedTensorError(
                f"{source}: tensor {name!r} ({t.name}) has unsupported type {t.tensor_type.name}"
            ) from exc
        w = np.asarray(w, dtype=np.float32)
        if name.endswith("self_attn.q_proj.weight") and w.ndim == 2:
            w = unpermute_qk(w, geometry.num_heads)
        elif name.endswith("self_attn.k_proj.weight") and w.ndim == 2:
            w = unpermute_qk(w, geometry.num_kv_heads)
        return w

    def block_type(name: str) -> str | None:
        t = by_hf.get(name)
        if t is None or t.tensor_type.name not in GGUF_BLOCK_TYPES:
            return None
        return t.tensor_type.name

    def read_blocks(name: str) -> tuple[str, np.ndarray] | None:
        kind = block_type(name)
        if kind is None:
            return None
        raw = np.asarray(by_hf[name].data)  # [rows, row bytes] uint8, memory-mapped
        if name.endswith("self_attn.q_proj.weight"):
            raw = unpermute_qk(raw, geometry.num_heads)  # whole rows move: blocks stay
        elif name.endswith("self_attn.k_proj.weight"):
            raw = unpermute_qk(raw, geometry.num_kv_heads)
        return kind, np.ascontiguousarray(raw)

    return Checkpoint(
        source=source,
        geometry=geometry,
        tokenizer_json=tokenizer_json,
        chat_template=template,
        bos_token_id=int(bos) if bos is not None else None,
        eos_token_ids=eos_ids,
        special_tokens=special,
        tensor_names=names,
        _read=read,
        _read_blocks=read_blocks,
        _block_type=block_type,
    )
