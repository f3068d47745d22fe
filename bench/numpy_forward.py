"""Plain NumPy float32 Llama forward: the framework-free baseline and an independent oracle.

No paging, no kernels library, no framework: one contiguous KV cache per layer, HF
half-split RoPE (the loader has undone llama.cpp's Q/K permutation), GQA by reshaping the
query heads into KV groups. Other benchmarks import `PlainLlama` to measure against it in
the same process.

Run: `cd /work/main && uv run python bench/numpy_forward.py [--prompt-tokens 256]
[--decode-steps 32]` -> prints a table and writes bench/out/numpy_forward.json.
Figures only; never asserted on.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from helios_ignition.checkpoint import Checkpoint, LlamaGeometry


def rope_inv_freq(geometry: LlamaGeometry) -> np.ndarray:
    """`[head_dim/2]` float32 inverse frequencies, with llama3 scaling when declared."""
    hd = geometry.head_dim
    inv = 1.0 / (geometry.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    scaling = geometry.rope_scaling
    if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3":
        # HF `_compute_llama3_parameters`: scale long wavelengths, smooth the middle band.
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_ctx = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * np.pi / inv
        scaled = np.where(wavelen > old_ctx / low, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
        inv = np.where(medium, smoothed, scaled)
    elif scaling and scaling.get("rope_type", scaling.get("type")) == "linear":
        inv = inv / float(scaling["factor"])
    return inv.astype(np.float32)


def _as_input_major(w: np.ndarray) -> np.ndarray:
    """`[out, in]` matrix -> contiguous `[in, out]`; vectors unchanged."""
    return np.ascontiguousarray(w.T) if w.ndim == 2 else w


@dataclass
class KVCache:
    """Contiguous cache: k, v `[layers, batch, kv_heads, capacity_tokens, head_dim]`."""

    k: np.ndarray
    v: np.ndarray
    length_tokens: int = 0


class PlainLlama:
    """Float32 Llama forward over a `Checkpoint` (all weights resident, ~4 bytes/param).

    Args:
        checkpoint: any `Checkpoint` (GGUF, safetensors, synthetic).
        max_context: RoPE table length in tokens.
    """

    def __init__(self, checkpoint: Checkpoint, max_context: int = 4096) -> None:
        g = checkpoint.geometry
        self.geometry = g
        self.embed = checkpoint.tensor("model.embed_tokens.weight")  # [V, d]
        self.layers = []
        for i in range(g.num_layers):
            p = f"model.layers.{i}."
            # Matrices are kept transposed `[in, out]` (C-contiguous): OpenBLAS runs
            # `x @ w_t` about 1.6x faster than `x @ w.T` on the [out, in] layout.
            self.layers.append(
                {
                    k: _as_input_major(checkpoint.tensor(p + n))
                    for k, n in (
                        ("ln1", "input_layernorm.weight"),
                        ("wq", "self_attn.q_proj.weight"),
                        ("wk", "self_attn.k_proj.weight"),
                        ("wv", "self_attn.v_proj.weight"),
                        ("wo", "self_attn.o_proj.weight"),
                        ("ln2", "post_attention_layernorm.weight"),
                        ("wg", "mlp.gate_proj.weight"),
                        ("wu", "mlp.up_proj.weight"),
                        ("wd", "mlp.down_proj.weight"),
                    )
                }
            )
        self.norm = checkpoint.tensor("model.norm.weight")
        # `[d, V]`; a tied head is a transposed copy of the embedding (speed over memory).
        self.lm_head_t = np.ascontiguousarray(
            (self.embed if g.tie_word_embeddings else checkpoint.tensor("lm_head.weight")).T
        )
        self.tied = g.tie_word_embeddings
        freqs = np.outer(np.arange(max_context, dtype=np.float32), rope_inv_freq(g))
        self.cos, self.sin = np.cos(freqs), np.sin(freqs)  # [max_context, hd/2]

    def weight_bytes(self) -> int:
        """Bytes of weights streamed by one decode step (head counted once when tied)."""
        total = self.lm_head_t.nbytes + self.norm.nbytes
        total += sum(w.nbytes for layer in self.layers for w in layer.values())
        return total

    def new_cache(self, batch: int, capacity_tokens: int) -> KVCache:
        g = self.geometry
        shape = (g.num_layers, batch, g.num_kv_heads, capacity_tokens, g.head_dim)
        return KVCache(np.zeros(shape, np.float32), np.zeros(shape, np.float32))

    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        var = np.mean(x * x, axis=-1, keepdims=True)
        return (x / np.sqrt(var + np.float32(self.geometry.rms_eps))) * w

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        # x: [B, H, S, hd]; pos: [S] absolute positions. Half-split (HF rotate_half).
        half = x.shape[-1] // 2
        cos, sin = self.cos[pos], self.sin[pos]  # [S, hd/2]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def forward(self, tokens: np.ndarray, cache: KVCache, last_only: bool = True) -> np.ndarray:
        """Run `tokens` `[B, S]` (int ids) after the cache's `length_tokens` tokens.

        Every row sits at the same positions `cache.length_tokens .. + S - 1`; the cache
        is extended in place.

        Returns:
            float32 logits `[B, V]` for the last position, or `[B, S, V]` if not last_only.
        """
        g = self.geometry
        tokens = np.asarray(tokens, dtype=np.int64)
        b, s = tokens.shape
        start = cache.length_tokens
        end = start + s
        pos = np.arange(start, end)
        nh, nkv, hd = g.num_heads, g.num_kv_heads, g.head_dim
        group = nh // nkv
        scale = np.float32(1.0 / np.sqrt(hd))
        # Causal mask over [S, end]: query i (absolute start+i) sees keys <= start+i.
        mask = np.where(np.arange(end)[None, :] > pos[:, None], -np.inf, 0.0).astype(np.float32)

        x = self.embed[tokens]  # [B, S, d]
        for li, w in enumerate(self.layers):
            h = self._rms(x, w["ln1"])
            q = (h @ w["wq"]).reshape(b, s, nh, hd).transpose(0, 2, 1, 3)
            k = (h @ w["wk"]).reshape(b, s, nkv, hd).transpose(0, 2, 1, 3)
            v = (h @ w["wv"]).reshape(b, s, nkv, hd).transpose(0, 2, 1, 3)
            q, k = self._rope(q, pos), self._rope(k, pos)
            cache.k[li, :, :, start:end] = k
            cache.v[li, :, :, start:end] = v
            keys = cache.k[li, :, :, :end]  # [B, kv, T, hd]
            vals = cache.v[li, :, :, :end]
            qg = q.reshape(b, nkv, group, s, hd)
            scores = (qg @ keys[:, :, None].swapaxes(-1, -2)) * scale + mask  # [B,kv,g,S,T]
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            att = (probs @ vals[:, :, None]).reshape(b, nh, s, hd).transpose(0, 2, 1, 3)
            x = x + att.reshape(b, s, nh * hd) @ w["wo"]
            h = self._rms(x, w["ln2"])
            gate = h @ w["wg"]
            act = gate / (1.0 + np.exp(-gate)) * (h @ w["wu"])  # SiLU(gate) * up
            x = x + act @ w["wd"]
        cache.length_tokens = end
        if last_only:
            return self._rms(x[:, -1], self.norm) @ self.lm_head_t
        return self._rms(x, self.norm) @ self.lm_head_t

    def greedy(self, prompt_ids: list[int], steps: int) -> tuple[list[int], list[float]]:
        """Greedy decode `steps` tokens (EOS does not stop it): (ids, chosen logits)."""
        cache = self.new_cache(1, len(prompt_ids) + steps)
        logits = self.forward(np.asarray([prompt_ids]), cache)[0]
        ids, chosen = [], []
        for _ in range(steps):
            nxt = int(np.argmax(logits))
            ids.append(nxt)
            chosen.append(float(logits[nxt]))
            logits = self.forward(np.asarray([[nxt]]), cache)[0]
        return ids, chosen


def _bench(prompt_tokens: int, decode_steps: int, batches: list[int]) -> dict:
    from helios_ignition.checkpoint import load_gguf, smollm2_gguf_path

    t0 = time.perf_counter()
    model = PlainLlama(load_gguf(smollm2_gguf_path()), max_context=prompt_tokens + decode_steps + 8)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, model.geometry.vocab_size, size=(1, prompt_tokens))
    capacity = prompt_tokens + decode_steps + 1

    prefill_s = []
    for _ in range(3):
        cache = model.new_cache(1, capacity)
        t = time.perf_counter()
        logits = model.forward(prompt, cache)
        prefill_s.append(time.perf_counter() - t)
    result = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf (dequantized to float32)",
        "load_s": load_s,
        "weight_bytes_per_step": model.weight_bytes(),
        "prompt_tokens": prompt_tokens,
        "prefill_s_median": statistics.median(prefill_s),
        "prefill_tokens_per_s": prompt_tokens / statistics.median(prefill_s),
        "decode": {},
    }
    for batch in batches:
        # Prefill once, replicate the cache rows: all rows decode at context prompt_tokens.
        one = model.new_cache(1, capacity)
        last = model.forward(prompt, one)
        cache = KVCache(np.repeat(one.k, batch, axis=1), np.repeat(one.v, batch, axis=1),
                        one.length_tokens)
        nxt = np.repeat(np.argmax(last, axis=-1)[:, None], batch, axis=0)
        step_s = []
        for _ in range(decode_steps):
            t = time.perf_counter()
            logits = model.forward(nxt, cache)
            step_s.append(time.perf_counter() - t)
            nxt = np.argmax(logits, axis=-1)[:, None]
        med = statistics.median(step_s)
        result["decode"][str(batch)] = {
            "step_s_median": med,
            "tokens_per_s": batch / med,
            "context_tokens": prompt_tokens,
            "steps": decode_steps,
        }
    del logits
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--out", default=str(Path(__file__).parent / "out" / "numpy_forward.json"))
    args = parser.parse_args()
    result = _bench(args.prompt_tokens, args.decode_steps, args.batches)
    result["host"] = {
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "numpy": np.__version__,
        "python": platform.python_version(),
        "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"),
        # Other processes on a shared host skew CPU figures: record how busy it was.
        "loadavg_1m_after": os.getloadavg()[0],
    }
    print(f"NumPy float32 forward, SmolLM2-135M (weights {result['weight_bytes_per_step'] / 1e6:.0f} MB)")
    print(f"{'phase':<22}{'tokens/s':>12}{'ms/step':>12}")
    print(f"{'prefill ' + str(args.prompt_tokens):<22}{result['prefill_tokens_per_s']:>12.1f}"
          f"{result['prefill_s_median'] * 1e3:>12.1f}")
    for batch, d in result["decode"].items():
        print(f"{'decode batch ' + batch:<22}{d['tokens_per_s']:>12.1f}{d['step_s_median'] * 1e3:>12.1f}")
    from _report import write_json  # here: tests import this file for PlainLlama alone

    print(f"wrote {write_json(args.out, result, indent=2)}")


if __name__ == "__main__":
    main()
