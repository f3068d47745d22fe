"""What one-term bf16 activations in prefill GEMMs do to the real model (CPU, no GPU).

    uv run python bench/prefill_terms_accuracy.py --json OUT.json [--prompts 6] [--tokens 32]

Exports SmolLM2-135M-Instruct (bf16 core) and runs it on the f32 CPU backend three ways,
changing only the ``linear`` products of prefill chunks (rows >= --min-rows, 256: the
recipe's largest chunk; decode steps and the LM head's rows are untouched):

- ``f32``: the reference ops as they are (the CPU backend the GPU tests compare with);
- ``hilo``: each activation replaced by ``hi + lo`` (two bf16 terms, the GPU's default
  prefill tiles);
- ``bf16``: each activation rounded to bf16 (one term, ``HELIOS_LINEAR_PREFILL_TERMS=1``).

Prompts are real English text (this repository's docs, tokenized, --length tokens each,
prefilled in 256-token chunks), then --tokens greedy tokens (480 + 32 fill the 512
positions a slot gets). Reports, per mode, how many
prompts keep the f32 greedy continuation in full and in its first 16 tokens (the GPU
test's bar), the first diverging position, and the largest |logit| difference of the
first sampled position against f32. SmolLM2's matrices are narrower than the 8B's (no
TC tile runs for it on the GPU): this measures the arithmetic, emulated in NumPy.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _report import git_commit, write_json  # bench/ is this script's folder
from helios_contract.schema import core_pb2
from helios_ignition.export import export_core
from helios_serve.engine.plan import SamplingParams
from helios_serve.testing.native import load_native
from helios_tools import kernels as K
from helios_tools.core import generate_key, load_public_key, open_core, write_key_pair
from helios_tools.frontend_assets import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def bf16(x: np.ndarray) -> np.ndarray:
    """Round f32 to bf16 (nearest even), widened back to f32."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(
        np.float32)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--length", type=int, default=480)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--min-rows", type=int, default=256)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    from gpu_steps import Steps  # the GPU tests' step driver (a test helper, not a package)

    t0 = time.perf_counter()
    d = Path(tempfile.mkdtemp())
    key = d / "key.pem"
    write_key_pair(generate_key(), key)
    out = d / "smollm2.core"
    export_core(ROOT / "recipes/smollm2_135m_instruct.py", checkpoint="smollm2", key_path=key,
                namespace="bench.prefill", out=out)
    core = open_core(out, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])
    tok = load_tokenizer(bytes(core.read_resource(next(
        rid for rid, res in core.resources.items()
        if res.kind == core_pb2.RESOURCE_KIND_TOKENIZER))).decode("utf-8"))
    docs = sorted((ROOT / "docs").glob("*.md"))
    prompts = []
    for path in docs:
        ids = tok.encode(path.read_text()).ids
        if len(ids) >= args.length:
            prompts.append(ids[: args.length])
        if len(prompts) == args.prompts:
            break
    print(f"core exported, {len(prompts)} prompts of {args.length} tokens "
          f"({time.perf_counter() - t0:.0f}s)", flush=True)

    base = K.REFERENCE_OPS["linear"]
    modes = {"f32": lambda x: x, "hilo": lambda x: bf16(x) + bf16(x - bf16(x)),
             "bf16": bf16}
    runs = {}
    for mode, fn in modes.items():
        def linear(x, weight, o, T, N, Kd, fn=fn):
            base(fn(x) if T >= args.min_rows else x, weight, o, T, N, Kd)

        K.REFERENCE_OPS["linear"] = linear  # bound by the backend at load
        model = load_native(core, "cpu")
        steps = Steps(model)
        gen, first_logits = [], []
        for p in prompts:  # the prefill's logits (first sampled position), then greedy
            steps.prefill(0, p, SamplingParams())
            first_logits.append(model.backend.buffers["scratch.logits"][0].copy())
            gen.append(steps.generate([p], args.tokens)[0])
        runs[mode] = dict(gen=gen, logits=first_logits)
        model.close()
        print(f"{mode}: done ({time.perf_counter() - t0:.0f}s)", flush=True)
    K.REFERENCE_OPS["linear"] = base

    ref = runs["f32"]
    result = dict(commit=git_commit(), model="SmolLM2-135M-Instruct (bf16 core, CPU backend)",
                  prompts=len(prompts), prompt_tokens=args.length, greedy_tokens=args.tokens,
                  chunk_rows=args.min_rows, modes={})
    print(f"\n{'mode':5} {'identical':>9} {'first16':>7}  first divergence   max|dlogit| (first "
          "sampled position)")
    for mode in ("hilo", "bf16"):
        r = runs[mode]
        div = [next((i for i, (a, b) in enumerate(zip(g, w, strict=True)) if a != b), None)
               for g, w in zip(r["gen"], ref["gen"], strict=True)]
        dl = [float(np.abs(a - b).max()) for a, b in zip(r["logits"], ref["logits"],
                                                         strict=True)]
        same = sum(d is None for d in div)
        first16 = sum(d is None or d >= 16 for d in div)
        result["modes"][mode] = dict(identical=same, first16=first16, divergence=div,
                                     max_logit_diff=dl)
        print(f"{mode:5} {same:>5}/{len(div)} {first16:>4}/{len(div)}  {div}   "
              f"{max(dl):.2e}")
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
