"""Qwen3 geometry (HF `Qwen3ForCausalLM`, `Qwen3MoeForCausalLM`) and the tensors it implies.

Qwen3 is the Llama layer with QK-norm: an RMS norm of every query and key head
(`self_attn.q_norm.weight`, `self_attn.k_norm.weight`, [head_dim] each) before RoPE.
Qwen3-MoE replaces each layer's MLP by a router (`mlp.gate.weight` [experts, d]) over
`experts` SwiGLU experts of width `expert_ffn` (`mlp.experts.{e}.gate_proj` / `up_proj` /
`down_proj`), of which each token uses `experts_per_token`.

The GGUF reader (architectures `qwen3` and `qwen3moe`, as llama.cpp's converter writes
them) returns the same HF names and values:

- Q/K rows: llama.cpp runs Qwen3's RoPE in the NEOX (half-split) convention, HF's, so its
  converter does not permute them; nothing is undone (unlike the Llama reader).
- Experts: the converter stacks each layer's experts into one tensor per projection
  (`blk.N.ffn_gate_exps` / `ffn_up_exps` [experts, expert_ffn, d], `ffn_down_exps`
  [experts, d, expert_ffn]); expert e of `mlp.experts.{e}.gate_proj.weight` is slice e
  (a quantized stack is sliced in its blocks, whole rows, never decoded).
- Routing: llama.cpp's qwen3moe graph always renormalizes the top-k weights (its
  `build_moe_ffn(..., norm_w = true, ...)`) and the converter writes no
  `expert_weights_norm` for it, so `norm_topk` is that key when present, else true.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .checkpoint import Checkpoint
from .errors import GeometryError
from .geometry import LlamaGeometry
from .gguf_read import (
    LAYER_RE,
    gguf_checkpoint,
    gpt2_tokenizer_json,
    hf_name,
    require_tensors,
    rms_eps,
    tensors_by_hf,
)

QWEN3_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
# GGUF general.architecture -> the HF architecture it holds.
QWEN3_GGUF_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM"}

# GGUF per-layer suffix -> HF per-layer suffix (llama.cpp's qwen3 / qwen3moe tensor names).
_LAYER_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
}
_GLOBAL_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# GGUF stacked expert tensor suffix -> the HF projection of each expert.
_EXPERT_MAP = {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj",
               "ffn_down_exps.weight": "down_proj"}
# Tensors a Qwen3 GGUF may hold that this family does not capture, with the reason.
_REFUSED_TENSORS = (
    (re.compile(r"attn_[qkv]\.bias$"), "attention biases"),
    (re.compile(r"ffn_(gate|up|down)_shexp\.weight$"), "shared experts"),
)


@dataclass(frozen=True)
class Qwen3Geometry(LlamaGeometry):
    """Shapes and constants of a Qwen3 (dense or MoE) decoder.

    Attributes (beyond LlamaGeometry's; `intermediate_size` is the dense MLP width, unused
    by an MoE model whose every layer is sparse):
        architecture: the HF architecture name.
        experts: experts per MoE layer (0: a dense model).
        experts_per_token: experts each token is routed to (top-k).
        expert_ffn: SwiGLU width of one expert (`moe_intermediate_size`).
        norm_topk: the top-k routing weights are renormalized to sum to 1.
    """

    architecture: str = "Qwen3ForCausalLM"
    experts: int = 0
    experts_per_token: int = 0
    expert_ffn: int = 0
    norm_topk: bool = True

    @property
    def family(self) -> str:
        """The helios family that captures this geometry (families/qwen3.py)."""
        return "qwen3_moe" if self.experts else "qwen3"

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """HF tensor name -> shape, in canonical order: Llama's, plus QK-norm gains; an MoE
        layer's router and experts in place of the dense MLP."""
        d, hd = self.hidden_size, self.head_dim
        shapes: dict[str, tuple[int, ...]] = {}
        for name, shape in super().tensor_shapes().items():
            if self.experts and ".mlp." in name:
                continue
            shapes[name] = shape
            if name.endswith("self_attn.o_proj.weight"):
                prefix = name.removesuffix("o_proj.weight")
                shapes[prefix + "q_norm.weight"] = (hd,)
                shapes[prefix + "k_norm.weight"] = (hd,)
            if self.experts and name.endswith("post_attention_layernorm.weight"):
                layer = name.removesuffix("post_attention_layernorm.weight")
                shapes[layer + "mlp.gate.weight"] = (self.experts, d)
                f = self.expert_ffn
                for e in range(self.experts):
                    shapes[f"{layer}mlp.experts.{e}.gate_proj.weight"] = (f, d)
                    shapes[f"{layer}mlp.experts.{e}.up_proj.weight"] = (f, d)
                    shapes[f"{layer}mlp.experts.{e}.down_proj.weight"] = (d, f)
        return shapes


def qwen3_geometry(config: dict[str, Any], source: str) -> Qwen3Geometry:
    """The geometry a Qwen3 `config.json` declares (transformers 4 and 5 spellings:
    `rope_theta` or `rope_parameters.rope_theta`, `num_experts` or `num_local_experts`).

    Raises:
        GeometryError: a required key is missing, or the config declares what the family
            does not capture: attention biases, sliding windows, rope scaling, dense
            layers between MoE layers (`mlp_only_layers`, `decoder_sparse_step` != 1).
    """
    arch = (config.get("architectures") or ["Qwen3ForCausalLM"])[0]
    where = f"{source}/config.json"
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        rope = config.get("rope_parameters") or {}
        theta = config.get("rope_theta", rope.get("rope_theta", 1_000_000.0))
        scaling = config.get("rope_scaling")
        if scaling or rope.get("rope_type", "default") != "default":
            raise GeometryError(f"{where}: rope scaling {scaling or rope} is not supported "
                                "for Qwen3 (only the default RoPE)")
        if config.get("attention_bias"):
            raise GeometryError(f"{where}: attention_bias is not supported for Qwen3")
        if config.get("use_sliding_window"):
            raise GeometryError(f"{where}: use_sliding_window is not supported for Qwen3")
        moe = arch == "Qwen3MoeForCausalLM"
        experts = int(config.get("num_experts") or config.get("num_local_experts") or 0) \
            if moe else 0
        if moe and (config.get("mlp_only_layers") or int(config.get("decoder_sparse_step",
                                                                    1)) != 1):
            raise GeometryError(f"{where}: dense layers between MoE layers (mlp_only_layers "
                                f"{config.get('mlp_only_layers')}, decoder_sparse_step "
                                f"{config.get('decoder_sparse_step')}) are not supported")
        top_k = int(config["num_experts_per_tok"]) if moe else 0
        if moe and not 1 <= top_k <= experts:
            raise GeometryError(f"{where}: num_experts_per_tok {top_k} must lie in "
                                f"1..{experts} (the experts)")
        return Qwen3Geometry(
            vocab_size=int(config["vocab_size"]), hidden_size=hidden,
            intermediate_size=int(config.get("intermediate_size") or 0),
            num_layers=int(config["num_hidden_layers"]), num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            rope_theta=float(theta), rms_eps=float(config.get("rms_norm_eps", 1e-6)),
            max_context=int(config.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            rope_scaling=None, architecture=arch, experts=experts,
            experts_per_token=top_k,
            expert_ffn=int(config["moe_intermediate_size"]) if moe else 0,
            norm_topk=bool(config.get("norm_topk_prob", True)))
    except KeyError as exc:
        raise GeometryError(f"{where}: missing key {exc.args[0]!r}") from exc


# Real geometries for benchmarks with random weights (the models' config.json values).
QWEN3_8B = Qwen3Geometry(
    vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36,
    num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=1_000_000.0, rms_eps=1e-6,
    max_context=40960, tie_word_embeddings=False)
QWEN3_30B_A3B = Qwen3Geometry(
    vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=48,
    num_heads=32, num_kv_heads=4, head_dim=128, rope_theta=1_000_000.0, rms_eps=1e-6,
    max_context=40960, tie_word_embeddings=False, architecture="Qwen3MoeForCausalLM",
    experts=128, experts_per_token=8, expert_ffn=768, norm_topk=True)
QWEN3_GEOMETRIES = {"qwen3-8b": QWEN3_8B, "qwen3-30b-a3b": QWEN3_30B_A3B}


@dataclass(frozen=True)
class _ExpertSlice:
    """Expert `index` of a GGUF stacked expert tensor, shaped as a GGUF reader tensor
    (`name`, `tensor_type`, `data`: `[rows, columns]` floats or `[rows, row bytes]`
    blocks, a view of the memory-mapped stack) for `gguf_read.tensor_access`."""

    name: str
    tensor_type: Any
    data: np.ndarray


def _gguf_geometry(field_of, source: str, arch: str, tensor_names: set[str]
                   ) -> Qwen3Geometry:
    def req(key: str) -> Any:
        value = field_of(f"{arch}.{key}")
        if value is None:
            raise GeometryError(f"{source}: missing metadata key '{arch}.{key}'")
        return value

    for name in sorted(tensor_names):
        for pattern, what in _REFUSED_TENSORS:
            if pattern.search(name):
                raise GeometryError(f"{source}: tensor {name!r}: {what} are not supported "
                                    "for Qwen3")
    scaling = field_of(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise GeometryError(f"{source}: {arch}.rope.scaling.type {scaling!r} is not "
                            "supported for Qwen3 (only the default RoPE)")
    if field_of(f"{arch}.attention.sliding_window") is not None:
        raise GeometryError(f"{source}: {arch}.attention.sliding_window is not supported "
                            "for Qwen3")
    heads = int(req("attention.head_count"))
    hidden = int(req("embedding_length"))
    head_dim = int(field_of(f"{arch}.attention.key_length") or hidden // heads)
    value_dim = int(field_of(f"{arch}.attention.value_length") or head_dim)
    if value_dim != head_dim:
        raise GeometryError(f"{source}: {arch}.attention.value_length {value_dim} differs "
                            f"from the key length {head_dim}")
    moe = arch == "qwen3moe"
    experts = int(req("expert_count")) if moe else 0
    top_k = int(req("expert_used_count")) if moe else 0
    if moe and not 1 <= top_k <= experts:
        raise GeometryError(f"{source}: {arch}.expert_used_count {top_k} must lie in "
                            f"1..{experts} (the experts)")
    norm = field_of(f"{arch}.expert_weights_norm")
    tokens = field_of("tokenizer.ggml.tokens") or ()
    return Qwen3Geometry(
        vocab_size=int(field_of(f"{arch}.vocab_size") or len(tokens)),
        hidden_size=hidden,
        intermediate_size=int(field_of(f"{arch}.feed_forward_length") or 0),
        num_layers=int(req("block_count")), num_heads=heads,
        num_kv_heads=int(field_of(f"{arch}.attention.head_count_kv") or heads),
        head_dim=head_dim, rope_theta=float(field_of(f"{arch}.rope.freq_base") or 1_000_000.0),
        rms_eps=rms_eps(req("attention.layer_norm_rms_epsilon")),
        max_context=int(req("context_length")),
        tie_word_embeddings="output.weight" not in tensor_names, rope_scaling=None,
        architecture=QWEN3_GGUF_ARCHITECTURES[arch], experts=experts,
        experts_per_token=top_k,
        expert_ffn=int(req("expert_feed_forward_length")) if moe else 0,
        norm_topk=True if norm is None else bool(norm))


def _qwen3_tensors(reader: Any) -> dict[str, Any]:
    """HF name -> the GGUF tensor holding it; each stacked expert tensor is split into
    one `_ExpertSlice` per expert."""
    by_hf = tensors_by_hf(reader, lambda name: hf_name(name, _GLOBAL_MAP, _LAYER_MAP))
    for t in reader.tensors:
        m = LAYER_RE.match(t.name)
        if m and m.group(2) in _EXPERT_MAP:
            projection = _EXPERT_MAP[m.group(2)]
            for e in range(t.data.shape[0]):
                by_hf[f"model.layers.{m.group(1)}.mlp.experts.{e}.{projection}.weight"] = \
                    _ExpertSlice(f"{t.name}[{e}]", t.tensor_type, t.data[e])
    return by_hf


def read_qwen3_gguf(reader: Any, source: str, field_of, block_types: tuple[str, ...]
                    ) -> Checkpoint:
    """A `Checkpoint` of an opened `qwen3` or `qwen3moe` GGUF (gguf_loader.load_gguf
    dispatches here), with HF names and values.

    Args:
        reader: the `gguf.GGUFReader`.
        source: the file's path, for messages.
        field_of: metadata key -> value (None when absent).
        block_types: the ggml block types a core may keep as they are.

    Raises:
        GeometryError: metadata missing, or what the family does not capture (attention
            biases, shared experts, RoPE scaling, a sliding window, value heads of
            another width, top-k outside 1..experts).
        MissingTensorError: a tensor the geometry needs is absent.
        MissingTokenizerError: no GPT-2 style BPE (`tokenizer.ggml.model` gpt2).
    """
    arch = field_of("general.architecture")
    by_hf = _qwen3_tensors(reader)
    geometry = _gguf_geometry(field_of, source, arch, {t.name for t in reader.tensors})
    names = tuple(geometry.tensor_shapes())
    require_tensors(by_hf, names, source)
    return gguf_checkpoint(by_hf, source, field_of, geometry,
                           gpt2_tokenizer_json(field_of, source), block_types)
