"""What the bf16 KV cache costs each weight format of SmolLM2-135M-Instruct, against the
same weights with the f32 cache (docs/kv-cache.md, "bf16 KV cache").

bench/fp8_accuracy.py's `bf16kv` row compares bf16 weights with the bf16 cache against
bf16 weights with the f32 cache. This compares pairs of cores that differ only in
`--kv-cache-dtype bf16`: bf16 weights, `--quantize int4` (W4A16), `--quantize fp8` (W8A8:
activations quantized per token to e4m3) and `--weight-dtype gguf` without a target (the
demo core: ggml's Q4_1 products quantize their activations to Q8_1 blocks). On the cpu
backend, over the three golden prompts (tests/golden/smollm2_goldens.json):

- teacher-forced over each prompt's own tokens: mean and max KL(f32 cache || bf16 cache)
  per position (nats) and the fraction of positions whose top token is the same;
- greedy STEPS tokens from each prompt: the first position where the two cores' ids
  differ (STEPS: none).

    OPENBLAS_NUM_THREADS=1 uv run python bench/kv_bf16_pairs.py     # ~5 min on 2 cores

Writes bench/results/kv_bf16_pairs_cpu.json (commit, machine, one row per weight format).
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
from _report import git_commit, write_json
from helios_ignition.export import export_core
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, generate_key, load_public_key, open_core, write_key_pair

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "smollm2_135m_instruct.py"
GOLDENS = ROOT / "tests" / "golden" / "smollm2_goldens.json"
NAMESPACE = "bench"
STEPS = 32
# Weight format -> its export options (the pair adds kv_cache_dtype="bf16").
WEIGHTS = {"bf16": {"weight_dtype": "bf16"}, "int4": {"quantize": "int4"},
           "fp8": {"quantize": "fp8"}, "gguf": {"weight_dtype": "gguf"}}


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def measure(path: Path, public: Path, prompts: list[list[int]]
            ) -> tuple[list[np.ndarray], list[list[int]]]:
    """(teacher-forced log-probabilities [len(prompt) - 1, vocab] per prompt, greedy ids
    per prompt) on the cpu backend."""
    core = open_core(path, [load_public_key(public)])
    authorize(core, NAMESPACE)
    model = load_native(core, "cpu")
    try:
        driver = Driver(model)
        lps = [_log_softmax(driver.teacher_force(p[:1], p[1:])) for p in prompts]
        return lps, Driver(model).generate(prompts, STEPS)
    finally:
        model.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default=",".join(WEIGHTS))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"
                                             / "kv_bf16_pairs_cpu.json"))
    args = parser.parse_args()
    prompts = [p["prompt_ids"] for p in json.loads(GOLDENS.read_text())["prompts"]]
    started = time.time()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        private, public = write_key_pair(generate_key(), folder / "publisher.key")
        for name in args.weights.split(","):
            runs = []
            for kv in ("auto", "bf16"):
                out = folder / f"{name}-{kv}.core"
                export_core(RECIPE, checkpoint="smollm2", key_path=private,
                            namespace=NAMESPACE, out=out, kv_cache_dtype=kv, **WEIGHTS[name])
                runs.append(measure(out, public, prompts))
                out.unlink()
            (ref, ref_ids), (got, got_ids) = runs
            kl = np.concatenate([np.sum(np.exp(a) * (a - b), axis=-1)
                                 for a, b in zip(ref, got, strict=True)])
            top = np.concatenate([a.argmax(-1) == b.argmax(-1)
                                  for a, b in zip(ref, got, strict=True)])
            firsts = [next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y),
                           STEPS) for a, b in zip(ref_ids, got_ids, strict=True)]
            rows[name] = {"export": WEIGHTS[name], "positions": int(kl.size),
                          "mean_kl_nats": float(kl.mean()), "max_kl_nats": float(kl.max()),
                          "teacher_forced_top1_agreement": float(top.mean()),
                          "greedy_first_difference": firsts}
            print(name, json.dumps(rows[name]), flush=True)
    result = {"commit": git_commit(), "machine": platform.node(), "backend": "cpu",
              "greedy_steps": STEPS, "prompts": str(GOLDENS.relative_to(ROOT)),
              "pairs": rows, "seconds": round(time.time() - started, 1)}
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
