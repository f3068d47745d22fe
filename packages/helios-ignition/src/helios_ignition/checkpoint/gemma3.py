"""Gemma 3 text checkpoints: geometry, HF tensor names, the GGUF reader (architecture
`gemma3`) and the HF `config.json` reader (`Gemma3ForCausalLM`).

Conventions, so every consumer sees HF Gemma 3 (`Gemma3ForCausalLM`) tensors:

- Norm weights: Gemma's RMS norm multiplies by (1 + w). llama.cpp's converter stores
  1 + w in the GGUF; this reader returns w (HF's value), and the family adds its declared
  norm shift when it stores the buffer (families/gemma3.py).
- Q/K rows: llama.cpp runs Gemma's RoPE in the NEOX (half-split) convention, so its
  converter does not permute them; nothing is undone here (unlike the Llama reader).
- Layer pattern and the local RoPE base: the GGUF keys
  `gemma3.attention.sliding_window_pattern` (n: every n-th layer global) and
  `gemma3.rope.local_freq_base` when present, else the architecture's values llama.cpp
  and HF's `Gemma3TextConfig` use (pattern 6, local base 10,000).
- HF safetensors (`Gemma3ForCausalLM`) already hold HF's names and w, so the safetensors
  loader reads them as they are; only the geometry is read here (`gemma3_hf_geometry`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .checkpoint import Checkpoint
from .errors import GeometryError, MissingTokenizerError
from .gguf_read import gguf_checkpoint, hf_name, require_tensors, rms_eps, tensors_by_hf
from .sentencepiece import spm_tokenizer_json

ARCHITECTURE = "gemma3"
HF_ARCHITECTURE = "Gemma3ForCausalLM"
# HF's activation of the GeGLU (the family's `gelu_mul` is the tanh approximation).
_HF_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_new")
DEFAULT_SLIDING_WINDOW_PATTERN = 6
DEFAULT_LOCAL_ROPE_THETA = 10000.0

LAYER_TENSORS: tuple[str, ...] = (
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "pre_feedforward_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "post_feedforward_layernorm.weight",
)

# GGUF per-layer suffix -> HF per-layer suffix (llama.cpp's gemma3 tensor names).
_LAYER_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_GLOBAL_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# The value llama.cpp's converter adds to every Gemma norm weight.
_GGUF_NORM_SHIFT = np.float32(1.0)


@dataclass(frozen=True)
class Gemma3Geometry:
    """Shapes and constants of a Gemma 3 text decoder.

    Attributes:
        vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads,
            head_dim, rms_eps, max_context, tie_word_embeddings: as `LlamaGeometry`'s
            (`intermediate_size`: the GeGLU width).
        rope_theta: RoPE base of the global layers.
        rope_local_theta: RoPE base of the sliding-window (local) layers.
        sliding_window: tokens a local layer attends to (itself included).
        layer_windows: per layer, its attention window in tokens (0: global, the whole
            causal context).
        query_scale: attention logit multiplier (Gemma 3: query_pre_attn_scalar ** -0.5,
            query_pre_attn_scalar = head_dim).
        rope_scaling: HF `rope_scaling` of the global layers, or None (the 270M: none).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rope_local_theta: float
    rms_eps: float
    max_context: int
    tie_word_embeddings: bool
    sliding_window: int
    layer_windows: tuple[int, ...]
    query_scale: float
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False, compare=True)
    architecture: str = ARCHITECTURE

    @property
    def vision(self) -> None:
        """No vision tower: text weights only (the loaders' `geometry.vision`)."""
        return None

    @property
    def family(self) -> str:
        """The helios family that captures this geometry (families/gemma3.py)."""
        return "gemma3"

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """HF tensor name -> float32 shape `[out, in]` (norms `[d]`), in canonical order."""
        d, f, v, hd = self.hidden_size, self.intermediate_size, self.vocab_size, self.head_dim
        q_rows, kv_rows = self.num_heads * hd, self.num_kv_heads * hd
        per_layer = {
            "input_layernorm.weight": (d,),
            "self_attn.q_proj.weight": (q_rows, d),
            "self_attn.k_proj.weight": (kv_rows, d),
            "self_attn.v_proj.weight": (kv_rows, d),
            "self_attn.q_norm.weight": (hd,),
            "self_attn.k_norm.weight": (hd,),
            "self_attn.o_proj.weight": (d, q_rows),
            "post_attention_layernorm.weight": (d,),
            "pre_feedforward_layernorm.weight": (d,),
            "mlp.gate_proj.weight": (f, d),
            "mlp.up_proj.weight": (f, d),
            "mlp.down_proj.weight": (d, f),
            "post_feedforward_layernorm.weight": (d,),
        }
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, d)}
        for i in range(self.num_layers):
            for suffix in LAYER_TENSORS:
                shapes[f"model.layers.{i}.{suffix}"] = per_layer[suffix]
        shapes["model.norm.weight"] = (d,)
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (v, d)
        return shapes


def layer_windows(layers: int, pattern: int, window: int) -> tuple[int, ...]:
    """Per-layer attention windows of Gemma 3's pattern: every `pattern`-th layer (1-based)
    is global (0), the others see `window` tokens (HF `layer_types`, llama.cpp's
    `swa_pattern`)."""
    return tuple(0 if (i + 1) % pattern == 0 else window for i in range(layers))


def gemma3_hf_geometry(config: dict[str, Any], source: str) -> Gemma3Geometry:
    """The geometry a HF `Gemma3ForCausalLM` `config.json` (`Gemma3TextConfig`) declares.

    Reads both transformers spellings: the RoPE bases from `rope_parameters`
    (`full_attention` / `sliding_attention`, transformers 5) or `rope_theta` /
    `rope_local_base_freq` (transformers 4); the layer pattern from `layer_types`, else
    `sliding_window_pattern` (every n-th layer global; HF's default 6); the attention scale
    `query_pre_attn_scalar ** -0.5`.

    A value of the wrong type (a string or null where a number is needed) is refused by the
    safetensors loader, which reads every family's config.json.

    Raises:
        GeometryError: a required key is missing, or the config declares what the family
            does not capture: logit soft-capping (final or attention), bidirectional
            attention, attention biases, RoPE scaling, an activation other than the tanh
            GELU, a `layer_types` entry other than sliding_attention / full_attention, or
            no positive `sliding_window`.
    """
    where = f"{source}/config.json"

    def refuse(what: str) -> GeometryError:
        return GeometryError(f"{where}: {what} is not supported for Gemma 3")

    try:
        for key in ("final_logit_softcapping", "attn_logit_softcapping"):
            if config.get(key) is not None:
                raise refuse(f"{key} {config[key]}")
        if config.get("use_bidirectional_attention"):
            raise refuse("use_bidirectional_attention")
        if config.get("attention_bias"):
            raise refuse("attention_bias")
        act = config.get("hidden_activation") or config.get("hidden_act") or _HF_ACTIVATIONS[0]
        if act not in _HF_ACTIVATIONS:
            raise refuse(f"hidden_activation {act!r} (only the tanh GELU)")
        rope = config.get("rope_parameters") or {}
        full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
        scaling = config.get("rope_scaling")
        for params in (full, local, scaling or {}):
            if params.get("rope_type", params.get("type", "default")) != "default":
                raise refuse(f"rope scaling {params}")
        theta = full.get("rope_theta", config.get("rope_theta", 1_000_000.0))
        local_theta = local.get("rope_theta", config.get("rope_local_base_freq",
                                                         DEFAULT_LOCAL_ROPE_THETA))
        layers = int(config["num_hidden_layers"])
        window = config.get("sliding_window")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise GeometryError(f"{where}: sliding_window must be a positive number of "
                                f"tokens, not {window!r}")
        types = config.get("layer_types")
        if types is not None:
            unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
            if unknown or len(types) != layers:
                raise GeometryError(f"{where}: layer_types must be {layers} entries of "
                                    f"sliding_attention or full_attention, not {types}")
            windows = tuple(window if t == "sliding_attention" else 0 for t in types)
        else:
            pattern = int(config.get("sliding_window_pattern")
                          or DEFAULT_SLIDING_WINDOW_PATTERN)
            windows = layer_windows(layers, pattern, window)
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        head_dim = int(config.get("head_dim") or hidden // heads)
        return Gemma3Geometry(
            vocab_size=int(config["vocab_size"]), hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]), num_layers=layers,
            num_heads=heads, num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=head_dim, rope_theta=float(theta), rope_local_theta=float(local_theta),
            rms_eps=float(config.get("rms_norm_eps", 1e-6)),
            max_context=int(config.get("max_position_embeddings", 131072)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
            sliding_window=window, layer_windows=windows,
            query_scale=float(config.get("query_pre_attn_scalar", head_dim)) ** -0.5)
    except KeyError as exc:
        raise GeometryError(f"{where}: missing key {exc.args[0]!r}") from exc


def gguf_to_hf_name(name: str) -> str | None:
    """HF name of a gemma3 GGUF tensor, or None when it has no HF counterpart."""
    return hf_name(name, _GLOBAL_MAP, _LAYER_MAP)


def _geometry(field_of, source: str, tensor_names: set[str]) -> Gemma3Geometry:
    def req(key: str) -> Any:
        value = field_of(f"gemma3.{key}")
        if value is None:
            raise GeometryError(f"{source}: missing metadata key 'gemma3.{key}'")
        return value

    heads = int(req("attention.head_count"))
    head_dim = int(req("attention.key_length"))
    if field_of("gemma3.rope.scaling.type") not in (None, "none"):
        raise GeometryError(f"{source}: gemma3.rope.scaling.type "
                            f"{field_of('gemma3.rope.scaling.type')!r} is not supported")
    layers = int(req("block_count"))
    window = int(req("attention.sliding_window"))
    pattern = int(field_of("gemma3.attention.sliding_window_pattern")
                  or DEFAULT_SLIDING_WINDOW_PATTERN)
    return Gemma3Geometry(
        vocab_size=len(field_of("tokenizer.ggml.tokens") or ()),
        hidden_size=int(req("embedding_length")),
        intermediate_size=int(req("feed_forward_length")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(field_of("gemma3.attention.head_count_kv") or heads),
        head_dim=head_dim,
        rope_theta=float(field_of("gemma3.rope.freq_base") or 1000000.0),
        rope_local_theta=float(field_of("gemma3.rope.local_freq_base")
                               or DEFAULT_LOCAL_ROPE_THETA),
        rms_eps=rms_eps(req("attention.layer_norm_rms_epsilon")),
        max_context=int(req("context_length")),
        tie_word_embeddings="output.weight" not in tensor_names,
        sliding_window=window,
        layer_windows=layer_windows(layers, pattern, window),
        query_scale=float(head_dim) ** -0.5,
    )


def read_gemma3_gguf(reader: Any, source: str, field_of, block_types: tuple[str, ...]
                     ) -> Checkpoint:
    """A `Checkpoint` of an opened gemma3 GGUF (gguf_loader.load_gguf dispatches here).

    Args:
        reader: the `gguf.GGUFReader`.
        source: the file's path, for messages.
        field_of: metadata key -> value (None when absent).
        block_types: the ggml block types a core may keep as they are.

    Raises:
        GeometryError: metadata missing or a RoPE scaling this reader does not know.
        MissingTensorError: a tensor the geometry needs is absent.
        MissingTokenizerError: no SentencePiece vocabulary (`tokenizer.ggml.model` llama).
    """
    by_hf = tensors_by_hf(reader, gguf_to_hf_name)
    geometry = _geometry(field_of, source, {t.name for t in reader.tensors})
    names = tuple(geometry.tensor_shapes())
    require_tensors(by_hf, names, source)
    tokens = field_of("tokenizer.ggml.tokens")
    if field_of("tokenizer.ggml.model") != "llama" or not tokens:
        raise MissingTokenizerError(f"{source}: no SentencePiece tokenizer (tokenizer.ggml.*)")
    unk = field_of("tokenizer.ggml.unknown_token_id")
    try:
        tokenizer_json = spm_tokenizer_json(
            tokens, field_of("tokenizer.ggml.scores") or [0.0] * len(tokens),
            field_of("tokenizer.ggml.token_type") or [1] * len(tokens),
            int(unk) if unk is not None else 0,
            bool(field_of("tokenizer.ggml.add_space_prefix")))
    except MissingTokenizerError as exc:
        raise MissingTokenizerError(f"{source}: {exc}") from exc

    def hf_norms(name: str, w: np.ndarray) -> np.ndarray:
        """HF's norm weight w from the GGUF's 1 + w."""
        return w - _GGUF_NORM_SHIFT if name.endswith("norm.weight") else w

    return gguf_checkpoint(by_hf, source, field_of, geometry, tokenizer_json, block_types,
                           values=hf_norms)
