"""bf16 activations (``ignition export --activation-dtype bf16``) against f32 activations
on SmolLM2-135M-Instruct, on the cpu backend (issue 27; docs/gpu.md, "bf16 activations").

Exports two bf16-weight cores of the embedded GGUF with every layer product on the packed
path (SmolLM2's matrices are below the default weight bar, ``launch.MMA_MIN_WEIGHTS``, so
the bar is lowered to zero and the rows to 1 for both, as tests/gpu/test_mma_model.py
does): ``f32`` (``split_bf16``: hi + lo terms, about 16 mantissa bits, the f32 products'
accuracy) and ``bf16`` (``round_bf16``: each product's activations rounded to bf16). The
LM head, norms, attention and the residual stream stay f32 in both. Then, on the cpu
backend (the same ops the cuda backend runs, so these are the served model's numbers):

- perplexity of each on bench/prompts/fp8_accuracy_text.txt (teacher-forced) and the
  mean / max per-token KL(f32 || bf16) in nats, teacher-forced top-1 agreement;
- greedy agreement on the golden prompts (tests/golden/smollm2_goldens.json) x 64 tokens
  (fraction of equal positions, first difference);
- long prompts: the first --docs prompts of --length tokens from docs/*.md (prefilled in
  256-token chunks, as bench/prefill_terms_accuracy.py) and 32 greedy tokens: identical
  continuations, first 16 equal, first divergence.

    OPENBLAS_NUM_THREADS=1 uv run python bench/activation_dtype_accuracy.py

Writes bench/results/activation_dtype_accuracy_cpu.json (commit, machine).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _report import git_commit, write_json  # bench/ is this script's folder
from helios_ignition.capture import launch
from helios_ignition.export import export_core
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, generate_key, load_public_key, open_core, write_key_pair
from helios_tools.frontend_assets import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "smollm2_135m_instruct.py"
TEXT = ROOT / "bench" / "prompts" / "fp8_accuracy_text.txt"
GOLDENS = ROOT / "tests" / "golden" / "smollm2_goldens.json"
NAMESPACE = "bench"
STEPS = 64
DOC_TOKENS = 32


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=6)
    ap.add_argument("--length", type=int, default=480)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"
                                         / "activation_dtype_accuracy_cpu.json"))
    args = ap.parse_args()
    started = time.time()
    goldens = json.loads(GOLDENS.read_text())["prompts"]
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        private, public = write_key_pair(generate_key(), folder / "publisher.key")
        launch.LINEAR_MMA, launch.MMA_MIN_WEIGHTS, launch.MMA_ROWS = "on", 0, (1, 256)
        for act in ("f32", "bf16"):
            out = folder / f"smollm2-{act}act.core"
            export_core(RECIPE, checkpoint="smollm2", key_path=private, namespace=NAMESPACE,
                        out=out, weight_dtype="bf16", activation_dtype=act)
            core = open_core(out, [load_public_key(public)])
            authorize(core, NAMESPACE)
            ops = {k.reference_op for k in core.manifest.kernels}
            assert ("round_bf16" in ops) == (act == "bf16") and "linear_packed" in ops
            tok = load_tokenizer(core.read_resource("tokenizer.json").decode())
            text_ids = tok.encode(TEXT.read_text(), add_special_tokens=False).ids
            docs = []
            for path in sorted((ROOT / "docs").glob("*.md")):
                ids = tok.encode(path.read_text()).ids
                if len(ids) >= args.length and len(docs) < args.docs:
                    docs.append(ids[:args.length])
            model = load_native(core, "cpu")
            try:
                lp = _log_softmax(Driver(model).teacher_force(text_ids[:1], text_ids[1:]))
                greedy = [Driver(model).generate([p["prompt_ids"]], STEPS)[0] for p in goldens]
                long = [Driver(model).generate([d], DOC_TOKENS)[0] for d in docs]
            finally:
                model.close()
            runs[act] = dict(lp=lp, greedy=greedy, long=long)
            print(f"{act}: measured ({time.time() - started:.0f} s)", flush=True)
    targets = np.asarray(text_ids[1:])
    rows = np.arange(len(targets))
    ppl = {a: float(np.exp(-r["lp"][rows, targets].mean())) for a, r in runs.items()}
    f32, bf = runs["f32"], runs["bf16"]
    kl = np.sum(np.exp(f32["lp"]) * (f32["lp"] - bf["lp"]), axis=-1)
    greedy = [dict(prompt=p["name"], agreement=sum(a == b for a, b in zip(x, y, strict=True))
                   / STEPS, first_difference=_first_difference(x, y))
              for p, x, y in zip(goldens, f32["greedy"], bf["greedy"], strict=True)]
    firsts = [_first_difference(x, y) for x, y in zip(f32["long"], bf["long"], strict=True)]
    result = {
        "commit": git_commit(), "machine": platform.node(), "backend": "cpu",
        "model": "SmolLM2-135M-Instruct, bf16 weights (the embedded GGUF dequantized), every "
                 "layer product on the packed path (MMA_MIN_WEIGHTS 0, rows 1-256); LM head, "
                 "norms, attention and residual f32",
        "forms": {"f32": "split_bf16: hi + lo bf16 terms (about 16 mantissa bits)",
                  "bf16": "round_bf16: activations rounded to bf16, one term "
                          "(--activation-dtype bf16)"},
        "text": str(TEXT.relative_to(ROOT)), "text_tokens": len(text_ids),
        "f32_perplexity": ppl["f32"], "bf16_perplexity": ppl["bf16"],
        "mean_kl_f32_bf16_nats": float(kl.mean()), "max_kl_f32_bf16_nats": float(kl.max()),
        "teacher_forced_top1_agreement": float(np.mean(f32["lp"].argmax(-1)
                                                       == bf["lp"].argmax(-1))),
        "greedy_steps": STEPS, "greedy": greedy,
        "greedy_agreement_mean": float(np.mean([g["agreement"] for g in greedy])),
        "long_prompts": dict(count=len(firsts), prompt_tokens=args.length,
                             greedy_tokens=DOC_TOKENS,
                             identical=sum(f == DOC_TOKENS for f in firsts),
                             first16=sum(f >= 16 for f in firsts), first_difference=firsts),
        "seconds": round(time.time() - started, 1),
    }
    print(json.dumps(result, indent=1))
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
