"""Qwen3 geometry (HF `Qwen3ForCausalLM`, `Qwen3MoeForCausalLM`) and the tensors it implies.

Qwen3 is the Llama layer with QK-norm: an RMS norm of every query and key head
(`self_attn.q_norm.weight`, `self_attn.k_norm.weight`, [head_dim] each) before RoPE.
Qwen3-MoE replaces each layer's MLP by a router (`mlp.gate.weight` [experts, d]) over
`experts` SwiGLU experts of width `expert_ffn` (`mlp.experts.{e}.gate_proj` / `up_proj` /
`down_proj`), of which each token uses `experts_per_token`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import GeometryError
from .geometry import LlamaGeometry

QWEN3_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


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
