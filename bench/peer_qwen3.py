"""Compiled PyTorch peer for Qwen3 (dense): the peer of bench/gpu_peers.py (a minimal
decoder with a static KV cache, torch.compile(mode="reduce-overhead"): one CUDA graph
per decode step, the gpt-fast approach) with Qwen3's layer: QK-norm (an RMS norm of every
query and key head before RoPE), GQA, head_dim 128, untied head. Random bf16 weights of
the real geometry: speed does not depend on the values. Run on the GPU machine (torch):

    python bench/peer_qwen3.py --geometry qwen3-8b --batch 1 8 64 --new-tokens 64 --json OUT

Prints decode tokens/s per batch, step time and the share of the weight-bandwidth
roofline (weight bytes per step / measured device-to-device copy bandwidth).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

GEOMETRY = {  # hidden, ffn, layers, heads, kv_heads, head_dim, vocab, rope_theta, tied
    "qwen3-8b": (4096, 12288, 36, 32, 8, 128, 151936, 1_000_000.0, False),
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128, 151936, 1_000_000.0, True),
}


def copy_bandwidth(dev) -> float:
    x = torch.empty(2 << 30, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    torch.cuda.synchronize()
    s.record()
    for _ in range(10):
        y.copy_(x)
    e.record()
    torch.cuda.synchronize()
    return 2 * x.numel() * 10 / (s.elapsed_time(e) / 1e3)  # bytes/s, read + write


class Layer(torch.nn.Module):
    def __init__(self, d, f, H, Hkv, hd, rnd, dev):
        super().__init__()

        def ones(n):
            return torch.ones(n, device=dev, dtype=torch.bfloat16)

        for name, t in dict(n1=ones(d), n2=ones(d), qn=ones(hd), kn=ones(hd),
                            wqkv=rnd((H + 2 * Hkv) * hd, d), wo=rnd(d, H * hd),
                            w13=rnd(2 * f, d), w2=rnd(d, f)).items():
            self.register_buffer(name, t)


class Qwen3(torch.nn.Module):
    def __init__(self, geometry, batch, max_len, dev, seed=0):
        super().__init__()
        d, f, L, H, Hkv, hd, V, theta, tied = GEOMETRY[geometry]
        g = torch.Generator(device=dev).manual_seed(seed)

        def rnd(*s):
            return (torch.randn(*s, generator=g, device=dev) * 0.02).to(torch.bfloat16)

        self.H, self.Hkv, self.hd = H, Hkv, hd
        self.register_buffer("emb", rnd(V, d))
        self.register_buffer("head", self.emb if tied else rnd(V, d))
        self.layers = torch.nn.ModuleList(Layer(d, f, H, Hkv, hd, rnd, dev) for _ in range(L))
        self.register_buffer("norm", torch.ones(d, device=dev, dtype=torch.bfloat16))
        self.register_buffer("k", torch.zeros(L, batch, Hkv, max_len, hd, device=dev,
                                              dtype=torch.bfloat16))
        self.register_buffer("v", torch.zeros_like(self.k))
        inv = 1.0 / theta ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd)
        ang = torch.outer(torch.arange(max_len, device=dev, dtype=torch.float32), inv)
        self.register_buffer("cos", torch.cat([ang.cos()] * 2, -1))
        self.register_buffer("sin", torch.cat([ang.sin()] * 2, -1))
        self.max_len = max_len
        self.weight_bytes = (sum(t.numel() * 2 for layer in self.layers for t in layer.buffers())
                             + self.head.numel() * 2 + d * 2)

    @staticmethod
    def rms(x, w, eps=1e-6):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    def rope(self, x, pos):  # x: [B, h, T, hd], pos: [T]
        c, s = self.cos[pos][None, None], self.sin[pos][None, None]
        x1, x2 = x.chunk(2, -1)
        return (x * c + torch.cat([-x2, x1], -1) * s).to(x.dtype)

    def forward(self, tok, pos):  # tok: [B, T] int64, pos: [T] int64
        B, T = tok.shape
        x = self.emb[tok]
        mask = (torch.arange(self.max_len, device=tok.device)[None, :]
                <= pos[:, None])[None, None]
        for i, lay in enumerate(self.layers):
            h = self.rms(x, lay.n1) @ lay.wqkv.t()
            q, k, v = h.split([self.H * self.hd, self.Hkv * self.hd, self.Hkv * self.hd], -1)
            q = self.rms(q.view(B, T, self.H, self.hd), lay.qn)  # QK-norm, per head
            k = self.rms(k.view(B, T, self.Hkv, self.hd), lay.kn)
            q = self.rope(q.transpose(1, 2), pos)
            k = self.rope(k.transpose(1, 2), pos)
            self.k[i].index_copy_(2, pos, k)
            self.v[i].index_copy_(2, pos, v.view(B, T, self.Hkv, self.hd).transpose(1, 2))
            o = F.scaled_dot_product_attention(q, self.k[i], self.v[i], attn_mask=mask,
                                               enable_gqa=True)
            x = x + o.transpose(1, 2).reshape(B, T, -1) @ lay.wo.t()
            a, b = (self.rms(x, lay.n2) @ lay.w13.t()).chunk(2, -1)
            x = x + (F.silu(a) * b) @ lay.w2.t()
        return (self.rms(x[:, -1], self.norm) @ self.head.t()).argmax(-1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--geometry", default="qwen3-8b", choices=sorted(GEOMETRY))
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--json")
    a = ap.parse_args()
    dev = "cuda"
    bw = copy_bandwidth(dev)
    out = {"geometry": a.geometry, "copy_TBps": bw / 1e12,
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": []}
    for B in a.batch:
        m = Qwen3(a.geometry, B, a.prompt + a.new_tokens + 8, dev)
        step = torch.compile(m.forward, mode="reduce-overhead", fullgraph=True)
        tok = torch.randint(100, 1000, (B, a.prompt), device=dev)
        nxt = m.forward(tok, torch.arange(a.prompt, device=dev))[:, None]  # prefill, eager
        for w in range(3):  # warm up / compile / capture
            step(nxt, torch.tensor([a.prompt + w], device=dev))
        torch.cuda.synchronize()
        t = time.perf_counter()
        for i in range(a.new_tokens):
            nxt = step(nxt.view(B, 1), torch.tensor([a.prompt + i], device=dev)).clone()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t) / a.new_tokens
        row = {"batch": B, "step_ms": dt * 1e3, "tok_s": B / dt,
               "weight_roofline_share": (m.weight_bytes / bw) / dt}
        out["rows"].append(row)
        print(f"{a.geometry} batch {B}: {row['tok_s']:.1f} tok/s, step {row['step_ms']:.3f} ms,"
              f" {100 * row['weight_roofline_share']:.1f}% of the weight-bandwidth roofline",
              flush=True)
        del m, step
        torch.cuda.empty_cache()
        torch._dynamo.reset()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
