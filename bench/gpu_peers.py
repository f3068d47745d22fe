"""Peers on the same H200, same geometries and batch sizes as bench/gpu_models.py.

    python bench/gpu_peers.py --json OUT.json [--peer .peer/peer_llama.py]

1. The compiled PyTorch peer (``../shared/tools/peer_llama.py``, copied into the
   git-ignored ``.peer/`` for the run): static KV cache, torch.compile reduce-overhead
   (one CUDA graph per decode step), random bf16 weights.
2. HF transformers ``generate`` (eager, bf16, random weights of the real geometry,
   greedy, static prompt of 128 tokens).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from _report import write_json  # bench/ is this script's folder

GEOM = {  # hidden, ffn, layers, heads, kv_heads, vocab, rope_theta, tied
    "smollm2-135m": (576, 1536, 30, 9, 3, 49152, 100000.0, True),
    "llama-3.1-8b": (4096, 14336, 32, 32, 8, 128256, 500000.0, False),
}


def run_peer(peer: str, geometry: str, batches: list[int], new_tokens: int) -> dict:
    out = Path(f"/tmp/peer_{geometry}.json")
    cmd = [sys.executable, peer, "--geometry", geometry, "--batch", *map(str, batches),
           "--new-tokens", str(new_tokens), "--json", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    print(proc.stdout[-3000:], proc.stderr[-2000:], flush=True)
    res = json.loads(out.read_text()) if out.exists() else {"error": proc.stderr[-2000:]}
    res["wall_s"] = time.perf_counter() - t0
    return res


def run_hf(geometry: str, batches: list[int], new_tokens: int = 32, prompt: int = 128) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    d, f, L, H, KVH, V, theta, tied = GEOM[geometry]
    cfg = LlamaConfig(hidden_size=d, intermediate_size=f, num_hidden_layers=L,
                      num_attention_heads=H, num_key_value_heads=KVH, vocab_size=V,
                      rope_theta=theta, tie_word_embeddings=tied, max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    res = {}
    for b in batches:
        ids = torch.randint(3, min(V, 40000), (b, prompt), device="cuda")
        kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                  pad_token_id=0)
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, **kw)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        res[b] = {"tokens_per_s": b * new_tokens / dt, "seconds": dt,
                  "note": "includes the 128-token prefill"}
        print(geometry, "HF eager batch", b, res[b], flush=True)
    del model
    torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", default=".peer/peer_llama.py")
    ap.add_argument("--json")
    ap.add_argument("--skip-hf", action="store_true")
    args = ap.parse_args()
    result = {"compiled_peer": {}, "hf_eager": {}}
    result["compiled_peer"]["smollm2-135m"] = run_peer(args.peer, "smollm2-135m",
                                                       [1, 8, 32, 64], 128)
    result["compiled_peer"]["llama-3.1-8b"] = run_peer(args.peer, "llama-3.1-8b",
                                                       [1, 8, 32, 64], 64)
    if not args.skip_hf:
        for g in GEOM:
            try:
                result["hf_eager"][g] = run_hf(g, [1, 8])
            except Exception as exc:  # report, keep the other numbers
                result["hf_eager"][g] = {"error": f"{type(exc).__name__}: {exc}"}
    if args.json:
        write_json(args.json, result, default=str)
    _ = re
    print(json.dumps(result, default=str)[-4000:])


if __name__ == "__main__":
    main()
