"""The family boundary (capture/family.py): a family that writes only its trunk gets every
program (PREFILL, DECODE, the sampler, logprobs, RESTORE) from capture/programs.py.

`ParallelBlock` is a second family of the test's own: a GPT-J-style parallel residual
(attention and MLP both read one norm of the residual, r += o(attn(h)) + mlp(h)) over
Llama's weights minus `ffn_norm`. It copies no program code; the CPU backend runs its
captured prefill and the logits match a plain NumPy forward of the same math.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from helios_ignition.capture.builder import ProgramBuilder
from helios_ignition.capture.family import Pass
from helios_ignition.capture.layers import attend, product, write_kv
from helios_ignition.capture.programs import capture
from helios_ignition.families.llama import LlamaShapes
from helios_ignition.testing import TINY_CAPACITIES, TINY_SHAPES, tiny_core

TRANSFER_CAPS = replace(TINY_CAPACITIES, prepared_snapshots=4, host_tier=True,
                        transfer_rows=8)


@dataclass(frozen=True)
class ParallelBlock(LlamaShapes):
    """Parallel attention + MLP blocks (no post-attention norm)."""

    def weight_layout(self) -> dict[str, tuple[int, ...]]:
        return {name: shape for name, shape in super().weight_layout().items()
                if not name.endswith(".ffn_norm")}

    def trunk(self, b: ProgramBuilder, p: Pass) -> None:
        s, t, T = self, b.table, p.tokens
        D, F, HO = s.hidden, s.ffn, s.heads * s.head_dim
        x, res, h = (t.view(f"scratch.{n}", (T, D)) for n in ("x", "residual", "h"))
        qkv = t.view("scratch.qkv", (T, s.qkv_width))
        attn = t.view("scratch.attn", (T, HO))
        gate_up = t.view("scratch.gate_up", (T, 2 * F))
        inv_freq = t.view("rope_inv_freq", (s.head_dim // 2,))
        b.launch("embedding", p.rows.tokens, t.view("embed", (s.vocab, D)), res, T, D)
        for i in range(s.layers):
            b.launch("rmsnorm", res, t.view(f"L{i}.attn_norm", (D,)), h, T, D, s.rms_eps)
            product(b, "linear", h, t.view(f"L{i}.wqkv", (s.qkv_width, D)), qkv, T,
                    s.qkv_width, D)
            write_kv(b, p, i, qkv, inv_freq, s.heads, s.kv_heads, s.head_dim)
            attend(b, p, i, qkv, attn, s.heads, s.kv_heads, s.head_dim,
                   1.0 / math.sqrt(s.head_dim))
            product(b, "linear", h, t.view(f"L{i}.w_gate_up", (2 * F, D)), gate_up, T, 2 * F,
                    D)
            product(b, "linear", attn, t.view(f"L{i}.wo", (D, HO)), x, T, D, HO)
            b.launch("add", x, res, res, T, D)
            product(b, "linear", gate_up, t.view(f"L{i}.w_down", (D, F)), x, T, D, F,
                    swiglu=True)
            b.launch("add", x, res, res, T, D)
        b.launch("rmsnorm", res, t.view("final_norm", (D,)), h, T, D, s.rms_eps)


PARALLEL = ParallelBlock(**{f: getattr(TINY_SHAPES, f) for f in TINY_SHAPES.__dataclass_fields__})


def _plain_parallel(weights: dict[str, np.ndarray], s: ParallelBlock,
                    tokens: list[int]) -> np.ndarray:
    """f64 NumPy forward of ParallelBlock over `tokens`: logits [len(tokens), vocab]."""
    w = {k.removeprefix("weights/"): v.astype(np.float64) for k, v in weights.items()}
    n, hd = len(tokens), s.head_dim

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + s.rms_eps) * g

    angles = np.arange(n)[:, None] * w["rope_inv_freq"][None, :]
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]

    def rope(x):  # [n, heads, hd], half-split
        a, b = x[..., :hd // 2], x[..., hd // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)

    r = w["embed"][tokens]
    hq, hk = s.heads * hd, s.kv_heads * hd
    for i in range(s.layers):
        h = norm(r, w[f"L{i}.attn_norm"])
        qkv = h @ w[f"L{i}.wqkv"].T
        q = rope(qkv[:, :hq].reshape(n, s.heads, hd))
        k = rope(qkv[:, hq:hq + hk].reshape(n, s.kv_heads, hd))
        v = qkv[:, hq + hk:].reshape(n, s.kv_heads, hd)
        out = np.zeros((n, s.heads, hd))
        for head in range(s.heads):
            kv = head // (s.heads // s.kv_heads)
            scores = q[:, head] @ k[:, kv].T / np.sqrt(hd)
            scores[np.triu_indices(n, 1)] = -np.inf
            p = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, head] = (p / p.sum(-1, keepdims=True)) @ v[:, kv]
        gu = h @ w[f"L{i}.w_gate_up"].T
        g, u = gu[:, :s.ffn], gu[:, s.ffn:]
        r = r + out.reshape(n, hq) @ w[f"L{i}.wo"].T + (g / (1 + np.exp(-g)) * u) @ w[
            f"L{i}.w_down"].T
    return norm(r, w["final_norm"]) @ w["embed"].T


def _outside_trunk(graph) -> list[str]:
    """Kernel ids of a graph's launches before its first `embedding` and after its last
    norm into `scratch.h` (the program's own launches, not the trunk's)."""
    kernels = [launch.kernel for launch in graph.launches]
    ops = [k.split("__")[0] for k in kernels]
    if "embedding" not in ops:
        return kernels
    first = ops.index("embedding")
    last = max(i for i, launch in enumerate(graph.launches)  # out: 4th arg from the end
               if ops[i] in ("rmsnorm", "add_rmsnorm")
               and launch.args[-4].buffer.buffer == "scratch.h")
    return kernels[:first] + kernels[last + 1:]


def test_a_second_family_gets_every_program_unchanged():
    llama, llama_graphs = capture(TINY_SHAPES, TRANSFER_CAPS, "f32")
    other, other_graphs = capture(PARALLEL, TRANSFER_CAPS, "f32")
    assert [(g.name, g.operation) for g in other.graphs] == \
        [(g.name, g.operation) for g in llama.graphs]
    assert [g.name for g in other.graphs] == [
        "decode_b1", "decode_b2", "decode_b4", "prefill_t8", "prefill_t16",
        "transfer_pages_continuation_r8", "transfer_continuation_pages_r8",
        "transfer_pages_host_r8", "transfer_host_pages_r8", "transfer_continuation_host_r8"]
    assert other_graphs == llama_graphs  # the contracts know nothing of the trunk
    dropped = {f"L{i}.ffn_norm" for i in range(TINY_SHAPES.layers)}
    assert [b for b in llama.buffers if b.name not in dropped] == list(other.buffers)
    for mine, theirs in zip(other.graphs, llama.graphs, strict=True):
        assert _outside_trunk(mine) == _outside_trunk(theirs), mine.name
    prefill = next(g for g in other.graphs if g.name == "prefill_t8")
    assert [k.split("__")[0] for k in _outside_trunk(prefill)] == [
        "gather_last", "linear", "sample_chunks_mass", "sample_merge", "sample_race_top",
        "sample_race_mass", "sample_race_pick", "token_logprobs", "slot_scatter"]


def test_the_second_family_runs_on_the_cpu_backend():
    from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
    from helios_serve.testing.native import load_native

    core = tiny_core(seed=3, shapes=PARALLEL)
    model = load_native(core, "cpu")
    prompts = {0: [1, 2, 3, 4, 5], 2: [9, 8, 7]}
    pages = {0: [0, 1], 2: [5]}
    rows = tuple(RowPlan(request_id=10 + s, slot=s, generation=1, tokens=tuple(p),
                         start_position=0, page_ids=tuple(pages[s]), sample=True,
                         sampling=SamplingParams(), histogram_tokens=tuple(p))
                 for s, p in prompts.items())
    model.execute(StepPlan(StepKind.PREFILL, rows))
    got = model.backend.buffers["scratch.logits"][:2]
    for i, p in enumerate(prompts.values()):
        np.testing.assert_allclose(got[i], _plain_parallel(core.weights, PARALLEL, p)[-1],
                                   atol=2e-3, rtol=1e-3)
    model.close()
