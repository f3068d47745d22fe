"""The Qwen3 families: Qwen3 (dense) and Qwen3-MoE, written against the builder.

Qwen3 (HF `Qwen3ForCausalLM`) is Llama's layer (families/llama.py) with QK-norm: after
the fused QKV product every query head is RMS-normalized with `q_norm` and every key head
with `k_norm` ([head_dim] gains), before RoPE (op ``qk_rmsnorm``, in place on
`scratch.qkv`). Heads are GQA; the LM head is tied or not, as in Llama.

Qwen3-MoE (HF `Qwen3MoeForCausalLM`) replaces every layer's MLP by a sparse block: router
logits ``h @ router^T`` ([T, E]), top-k with normalized weights (``moe_route``), the
(token, expert) pairs grouped by expert in blocks of `MOE_BLOCK_ROWS` (``moe_align``),
each active expert's gate/up and down products over its block (``moe_gate_up``,
``moe_down``: grouped matrix products, each expert's weights read once per step), and the
K weighted pair results summed per token (``moe_sum``); helios_tools.kernels.experts
states the algorithm. Expert geometry (E experts, K per token, expert width F, the
normalization, block rows) is data: the manifest's `expert_geometry`, which the stacked
expert buffers' shapes and every expert launch's scalars must match (helios_contract's
`_rules_experts`, run by startup and lint-core alike).
Expert parallelism is not implemented: an MoE core is one rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from helios_contract.schema import manifest_pb2 as mpb
from helios_tools.kernels import moe_blocks

from ..capture.builder import BufferTable, ProgramBuilder
from ..capture.family import Pass, TensorParallelError
from .llama import LlamaShapes

# Pair rows of one expert block: the MMA tile's M (tl.dot needs at least 16).
MOE_BLOCK_ROWS = 16


@dataclass(frozen=True)
class Qwen3Shapes(LlamaShapes):
    """Qwen3 dense geometry: Llama's plus the QK-norm gains."""

    @classmethod
    def from_geometry(cls, g) -> Qwen3Shapes:
        return cls(vocab=g.vocab_size, hidden=g.hidden_size, ffn=g.intermediate_size,
                   layers=g.num_layers, heads=g.num_heads, kv_heads=g.num_kv_heads,
                   head_dim=g.head_dim, rope_theta=float(g.rope_theta),
                   rms_eps=float(g.rms_eps), tied=bool(g.tie_word_embeddings))

    def weight_layout(self) -> dict[str, tuple[int, ...]]:
        """Llama's buffers with `L{i}.q_norm` and `L{i}.k_norm` ([head_dim] f32) after
        each layer's `wqkv`."""
        shapes: dict[str, tuple[int, ...]] = {}
        for name, shape in super().weight_layout().items():
            shapes[name] = shape
            if name.endswith(".wqkv"):
                layer = name.removesuffix(".wqkv")
                shapes[f"{layer}.q_norm"] = (self.head_dim,)
                shapes[f"{layer}.k_norm"] = (self.head_dim,)
        return shapes

    def checkpoint_tensors(self, name: str) -> list[str]:
        kind = name.split(".", 1)[-1]
        if kind in ("q_norm", "k_norm"):
            layer = name.split(".", 1)[0]
            return [f"model.layers.{layer[1:]}.self_attn.{kind}.weight"]
        return super().checkpoint_tensors(name)

    def attention_inputs(self, b: ProgramBuilder, p: Pass, i: int, qkv) -> None:
        """QK-norm: every query and key head of `qkv` RMS-normalized in place."""
        t, HD = b.table, self.head_dim
        b.launch("qk_rmsnorm", qkv, t.view(f"L{i}.q_norm", (HD,)), t.view(f"L{i}.k_norm", (HD,)),
                 p.tokens, self.heads, self.kv_heads, HD, self.rms_eps)


@dataclass(frozen=True)
class Qwen3MoeShapes(Qwen3Shapes):
    """Qwen3-MoE geometry: Qwen3's attention; `ffn` is one expert's SwiGLU width.

    Attributes (beyond Qwen3Shapes'):
        experts: experts per layer (E).
        experts_per_token: experts each token is routed to (K).
        norm_topk: renormalize the K routing weights to sum to 1.
    """

    experts: int = 8
    experts_per_token: int = 2
    norm_topk: bool = True

    @classmethod
    def from_geometry(cls, g) -> Qwen3MoeShapes:
        dense = Qwen3Shapes.from_geometry(g)
        fields = {f: getattr(dense, f) for f in dense.__dataclass_fields__}
        return cls(**{**fields, "ffn": g.expert_ffn}, experts=g.experts,
                   experts_per_token=g.experts_per_token, norm_topk=bool(g.norm_topk))

    def shard(self, ranks: int) -> Qwen3MoeShapes:
        """Raises TensorParallelError for ranks > 1 (no expert parallelism)."""
        if ranks != 1:
            raise TensorParallelError("a mixture-of-experts core is one rank: expert "
                                      "parallelism is not implemented")
        return self

    def expert_geometry(self) -> mpb.ExpertGeometry:
        """The manifest's declaration of these experts (helios_contract checks every
        expert launch against it)."""
        return mpb.ExpertGeometry(experts=self.experts, experts_per_token=self.experts_per_token,
                                  hidden=self.hidden, expert_width=self.ffn,
                                  normalize_top_k=self.norm_topk, block_rows=MOE_BLOCK_ROWS)

    def weight_layout(self) -> dict[str, tuple[int, ...]]:
        """Qwen3's buffers with each layer's MLP replaced by `L{i}.router` [E, hidden],
        `L{i}.experts_gate_up` [E, 2F, hidden] (expert e's gate rows, then its up rows)
        and `L{i}.experts_down` [E, hidden, F]."""
        E, D, F = self.experts, self.hidden, self.ffn
        shapes: dict[str, tuple[int, ...]] = {}
        for name, shape in super().weight_layout().items():
            kind = name.split(".", 1)[-1]
            if kind == "w_gate_up":
                layer = name.split(".", 1)[0]
                shapes[f"{layer}.router"] = (E, D)
                shapes[f"{layer}.experts_gate_up"] = (E, 2 * F, D)
                shapes[f"{layer}.experts_down"] = (E, D, F)
            elif kind != "w_down":
                shapes[name] = shape
        return shapes

    def weight_split(self, name: str) -> int | None:
        return None  # one rank: shard() refuses more

    def checkpoint_tensors(self, name: str) -> list[str]:
        """The router is `mlp.gate.weight`; a stacked expert buffer concatenates every
        expert's tensors in expert order (gate then up for `experts_gate_up`), so its rows
        are the stacked [E, ...] buffer's."""
        kind = name.split(".", 1)[-1]
        layer = name.split(".", 1)[0]
        prefix = f"model.layers.{layer[1:]}.mlp."
        if kind == "router":
            return [prefix + "gate.weight"]
        if kind == "experts_gate_up":
            return [f"{prefix}experts.{e}.{w}_proj.weight" for e in range(self.experts)
                    for w in ("gate", "up")]
        if kind == "experts_down":
            return [f"{prefix}experts.{e}.down_proj.weight" for e in range(self.experts)]
        return super().checkpoint_tensors(name)

    def declare_scratch(self, t: BufferTable, tokens: int, weight_dtype: str) -> None:
        """Qwen3's scratch plus the sparse block's: router logits [T, E], routed ids and
        weights [T, K], the expert blocks (pairs [NB x BT], block experts [NB]) and the
        pair activations [T K, F] and results [T K, hidden]."""
        super().declare_scratch(t, tokens, weight_dtype)
        E, K, F, D = self.experts, self.experts_per_token, self.ffn, self.hidden
        nb = moe_blocks(tokens, E, K, MOE_BLOCK_ROWS)
        t.declare("scratch.router_logits", "f32", (tokens, E), "scratch")
        t.declare("scratch.moe_ids", "i32", (tokens, K), "scratch")
        t.declare("scratch.moe_weights", "f32", (tokens, K), "scratch")
        t.declare("scratch.moe_pairs", "i32", (nb * MOE_BLOCK_ROWS,), "scratch")
        t.declare("scratch.moe_block_expert", "i32", (nb,), "scratch")
        t.declare("scratch.moe_act", "f32", (tokens * K, F), "scratch")
        t.declare("scratch.moe_pair_out", "f32", (tokens * K, D), "scratch")

    def mlp(self, b: ProgramBuilder, p: Pass, i: int, h, x) -> None:
        """The sparse block of layer `i` over the normalized `h` into `x` (both [T, D])."""
        t, T = b.table, p.tokens
        E, K, F, D, BT = self.experts, self.experts_per_token, self.ffn, self.hidden, \
            MOE_BLOCK_ROWS
        nb = moe_blocks(T, E, K, BT)
        lin = "linear_invariant" if p.invariant else "linear"
        logits = t.view("scratch.router_logits", (T, E))
        ids, weights = t.view("scratch.moe_ids", (T, K)), t.view("scratch.moe_weights", (T, K))
        pairs = t.view("scratch.moe_pairs", (nb * BT,))
        blocks = t.view("scratch.moe_block_expert", (nb,))
        act, pair_out = t.view("scratch.moe_act", (T * K, F)), \
            t.view("scratch.moe_pair_out", (T * K, D))
        b.launch(lin, h, t.view(f"L{i}.router", (E, D)), logits, T, E, D)
        b.launch("moe_route", logits, ids, weights, T, E, K, int(self.norm_topk))
        b.launch("moe_align", ids, pairs, blocks, T, E, K, BT, nb)
        b.launch("moe_gate_up", h, pairs, blocks, t.view(f"L{i}.experts_gate_up",
                                                         (E, 2 * F, D)), act, T, D, F, K, BT, nb)
        b.launch("moe_down", act, pairs, blocks, t.view(f"L{i}.experts_down", (E, D, F)),
                 weights, pair_out, T, D, F, K, BT, nb)
        b.launch("moe_sum", pair_out, x, T, D, K)

    def folded_mlp(self, b: ProgramBuilder, p: Pass, i: int, res, attn, T: int) -> None:
        """Folding (`p.fold`) with the sparse block: the O product added into the residual,
        its RMS norm into `scratch.h`, the sparse block into `scratch.x`, added back."""
        t, D, HO = b.table, self.hidden, self.heads * self.head_dim
        h, x = t.view("scratch.h", (T, D)), t.view("scratch.x", (T, D))
        b.launch("linear_add", attn, t.view(f"L{i}.wo", (D, HO)), res, T, D, HO)
        b.launch("rmsnorm", res, t.view(f"L{i}.ffn_norm", (D,)), h, T, D, self.rms_eps)
        self.mlp(b, p, i, h, x)
        b.launch("add", x, res, res, T, D)
