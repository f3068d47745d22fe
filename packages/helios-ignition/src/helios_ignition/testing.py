"""Tiny in-memory models for tests: real capture, real contract, seeded random weights.

`tiny_core(seed)` returns an object with `contract`, `manifest` and `read_resource`,
which is what NativeModel.load reads from a verified core, so runtime tests run the full
capture -> packing -> backend path in milliseconds. `dense_forward` is an independent
plain NumPy implementation of the same model (contiguous cache, no paging) to check the
paged, packed execution against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from helios_contract.schema import contract_pb2 as cpb
from helios_contract.schema import frontend_pb2 as fe
from helios_contract.schema import manifest_pb2 as mpb
from helios_tools.kernels import grammar_mask_words

from .capture.buffers import Speculation, cache_contract, weight_resource_id
from .capture.programs import capture
from .checkpoint.drafter import DrafterGeometry, random_drafter
from .checkpoint.geometry import LlamaGeometry
from .families.llama import LlamaShapes, rope_inv_freq
from .recipe import Capacities, SplitTuning

TINY_SHAPES = LlamaShapes(vocab=96, hidden=32, ffn=48, layers=2, heads=4, kv_heads=2,
                          head_dim=8, rope_theta=10000.0, rms_eps=1e-5, tied=True)
TINY_CAPACITIES = Capacities(decode_batch=(1, 2, 4), prefill_tokens=(8, 16), prefill_rows=4,
                             context_tokens=64, page_tokens=4, prepared_pages=32)


@dataclass
class TinyCore:
    """What NativeModel.load reads, held in memory."""

    contract: cpb.ServingContract
    manifest: mpb.ExecutionManifest
    weights: dict[str, np.ndarray]

    def read_resource(self, resource_id: str) -> bytes:
        return self.weights[resource_id].tobytes()


def tiny_weights(shapes: LlamaShapes, seed: int) -> dict[str, np.ndarray]:
    """Seeded random f32 weights by physical buffer name (norms near 1, never zero)."""
    rng = np.random.default_rng(seed)
    out = {}
    computed = getattr(shapes, "computed_weight", None)  # families with computed tables
    for name, shape in shapes.weight_layout().items():
        value = computed(name, None) if computed is not None else None
        if value is not None:
            out[name] = value
        elif name == "rope_inv_freq":
            out[name] = rope_inv_freq(shapes, None)
        elif len(shape) == 1:
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (0.3 * rng.standard_normal(shape)).astype(np.float32)
    return out


def tiny_drafter(shapes: LlamaShapes, draft_vocab: int, seed: int,
                 weights: dict[str, np.ndarray], *, copy: float = 0.0
                 ) -> tuple[DrafterGeometry, dict[str, np.ndarray]]:
    """A seeded random draft head for `shapes` and its physical weight buffers (the LM
    head is the target embedding's rows `vocab_map`, as export builds it).

    `copy` > 0 mixes in a head that proposes the token it reads (fc_embed = copy x I):
    the tiny target tends to repeat tokens, so drafts are then often accepted and every
    verification path (accept, reject, bonus) runs."""
    target = LlamaGeometry(vocab_size=shapes.vocab, hidden_size=shapes.hidden,
                           intermediate_size=shapes.ffn, num_layers=shapes.layers,
                           num_heads=shapes.heads, num_kv_heads=shapes.kv_heads,
                           head_dim=shapes.head_dim, rope_theta=shapes.rope_theta,
                           rms_eps=shapes.rms_eps, max_context=1 << 16,
                           tie_word_embeddings=shapes.tied)
    tensors = random_drafter(target, draft_vocab, seed, (shapes.vocab - 1,))
    rng = np.random.default_rng(seed + 1)
    for name in ("fc_embed", "wqkv", "wo", "w_gate_up", "w_down"):  # tiny: make it matter
        tensors[name] = (0.3 * rng.standard_normal(tensors[name].shape)).astype(np.float32)
    if copy:
        tensors["fc_embed"] += np.float32(copy) * np.eye(shapes.hidden, dtype=np.float32)
    out = {f"D.{k}": v for k, v in tensors.items()}
    out["D.lm_head"] = weights["embed"][tensors["vocab_map"]].copy()
    return DrafterGeometry.for_target(target, draft_vocab), out


def tiny_core(seed: int = 0, shapes: LlamaShapes = TINY_SHAPES,
              caps: Capacities = TINY_CAPACITIES, *, device_pending: bool = True,
              speculative_widths: tuple[int, ...] = (), draft_vocab: int = 48,
              draft_copy: float = 0.0, split_tuning: SplitTuning | None = None,
              fold_layers: bool = False, chunked_sampling: bool = True,
              coupled_verification: bool = True, nucleus_sampling: bool = True,
              wide_sampling: bool = True, race_sampling: bool = True,
              activations: str = "f32") -> TinyCore:
    """Capture the tiny model and wrap it with seeded f32 weights and a full contract
    (`device_pending`: the pending token is device-owned, else host-bound;
    `speculative_widths`: add a seeded random draft head over `draft_vocab` ids and one
    SPECULATIVE program per decode batch and width; `draft_copy`: see tiny_drafter;
    `split_tuning`: with the decode-split tuning producer; `fold_layers`: decode graphs
    fold norms and residual adds into their products; `chunked_sampling`: the chunked
    sampler, False for sample_biased; `coupled_verification`: False records standard
    speculative sampling, as cores exported before coupled verification;
    `nucleus_sampling`: False records the chunked sampler of cores exported before its
    nucleus form; `wide_sampling`: False records the nucleus form of cores exported before
    the wide form; `race_sampling`: False records the wide form of cores exported before
    the candidate race; `activations`: the packed products' activation dtype, capture's
    argument)."""
    raw = tiny_weights(shapes, seed)
    spec = None
    if speculative_widths:
        geometry, draft_weights = tiny_drafter(shapes, draft_vocab, seed, raw, copy=draft_copy)
        raw.update(draft_weights)
        spec = Speculation(geometry, tuple(speculative_widths), coupled=coupled_verification)
    manifest, graphs = capture(shapes, caps, "f32", device_pending=device_pending, spec=spec,
                               split_tuning=split_tuning, fold_layers=fold_layers,
                               chunked_sampling=chunked_sampling,
                               nucleus_sampling=nucleus_sampling,
                               wide_sampling=wide_sampling,
                               race_sampling=race_sampling, activations=activations)
    frontend = fe.FrontendContract(tool_parser=fe.TOOL_PARSER_NONE,
                                   reasoning_parser=fe.REASONING_PARSER_NONE,
                                   image_preparation=fe.IMAGE_PREPARATION_NONE,
                                   image_layout=fe.IMAGE_LAYOUT_NONE)
    cache = cache_contract(shapes, caps, spec)
    words = grammar_mask_words(shapes.vocab)
    contract = cpb.ServingContract(
        served_id="tiny", cache_identity="tiny/f32", context_tokens=caps.context_tokens,
        prefill_chunk_tokens=max(caps.prefill_tokens), prepared_pages=caps.prepared_pages,
        prepared_snapshots=caps.prepared_snapshots if caps.transfer_rows else 0,
        selected_concurrency=max(caps.decode_batch), eos_token_ids=[shapes.vocab - 1],
        speculative_widths=list(speculative_widths),
        defaults=cpb.ServingDefaults(sampling=cpb.SamplingDefaults(top_p=1.0,
                                                                   repetition_penalty=1.0,
                                                                   max_output_tokens=16)),
        model=cpb.ModelContract(
            version=3, vocabulary=cpb.Vocabulary(sampled_tokens=shapes.vocab,
                                                 histogram_width=shapes.vocab,
                                                 mask_words=words),
            input_vocabulary=cpb.InputVocabulary(input_tokens=shapes.vocab),
            vision=cpb.VisionContract(), cache=cache, graphs=graphs, frontend=frontend))
    weights = {weight_resource_id(k): v for k, v in raw.items()}
    return TinyCore(contract, manifest, weights)


def dense_forward(weights: dict[str, np.ndarray], shapes: LlamaShapes,
                  tokens: list[int]) -> np.ndarray:
    """Plain causal forward over `tokens` (f32); returns logits `[len(tokens), vocab]`.

    Independent of the kernel library: contiguous K/V, explicit loops over heads.
    """
    w = {k.removeprefix("weights/"): v for k, v in weights.items()}
    s = shapes
    n = len(tokens)

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + s.rms_eps) * g

    pos = np.arange(n)
    angles = pos[:, None] * w["rope_inv_freq"][None, :]
    cos, sin = np.cos(angles), np.sin(angles)

    def rope(x):  # [n, heads, hd], half-split
        half = s.head_dim // 2
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * cos[:, None] - b * sin[:, None],
                               b * cos[:, None] + a * sin[:, None]], -1)

    r = w["embed"][tokens].astype(np.float64)
    hq, hk = s.heads * s.head_dim, s.kv_heads * s.head_dim
    for i in range(s.layers):
        h = norm(r, w[f"L{i}.attn_norm"])
        qkv = h @ w[f"L{i}.wqkv"].T
        q = rope(qkv[:, :hq].reshape(n, s.heads, s.head_dim))
        k = rope(qkv[:, hq:hq + hk].reshape(n, s.kv_heads, s.head_dim))
        v = qkv[:, hq + hk:].reshape(n, s.kv_heads, s.head_dim)
        out = np.zeros((n, s.heads, s.head_dim))
        group = s.heads // s.kv_heads
        for head in range(s.heads):
            kv = head // group
            scores = q[:, head] @ k[:, kv].T / np.sqrt(s.head_dim)
            scores[np.triu_indices(n, 1)] = -np.inf
            p = np.exp(scores - scores.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            out[:, head] = p @ v[:, kv]
        r = r + out.reshape(n, hq) @ w[f"L{i}.wo"].T
        h = norm(r, w[f"L{i}.ffn_norm"])
        gu = h @ w[f"L{i}.w_gate_up"].T
        g, u = gu[:, :s.ffn], gu[:, s.ffn:]
        r = r + (g / (1 + np.exp(-g)) * u) @ w[f"L{i}.w_down"].T
    h = norm(r, w["final_norm"])
    return (h @ w["embed"].T).astype(np.float32)
