"""FP8 W8A8, INT4 W4A16, repacked-GGUF and FP8 KV cache accuracy of SmolLM2-135M-Instruct
against its bf16 core (issue 31, "Accuracy, measured").

Exports cores of the same checkpoint (the embedded GGUF; its blocks dequantized at
export): bf16 weights, ``--quantize fp8`` (the products' matrices as e4m3 codes with
per-output-channel scales, activations quantized per token when served), ``--quantize
int4`` (packed 4-bit codes, group 128 or 64 along K with scales and zero points, f32
activations), ``gguf`` (``--weight-dtype gguf`` with a GPU target: the GGUF's own Q4_1
and Q8_0 blocks repacked exactly into INT4_MIN / INT8 storage, docs/gguf-cuda.md; on the
cpu backend too, so its rows measure the repacked form through the NumPy references, not
ggml's blocks), ``--kv-cache-dtype fp8`` (bf16 weights, the KV cache as e4m3 codes with
per-head scales: row "fp8kv") and ``--kv-cache-dtype bf16`` (bf16 weights, the KV cache
as bfloat16, each write rounded to nearest even: row "bf16kv"; against the bf16 core,
whose cache is f32). Then, on the chosen backend, for each quantized format
against bf16:

- perplexity of each core on a fixed committed text (bench/prompts/fp8_accuracy_text.txt,
  teacher-forced: every position's logits predict the next token), and the mean per-token
  KL divergence KL(bf16 || format) over the same positions (nats);
- greedy agreement on the golden prompts (tests/golden/smollm2_goldens.json) x 64 tokens:
  the fraction of the 64 positions where the format's token equals the bf16 core's, and
  the first position where they differ (64: none).

    OPENBLAS_NUM_THREADS=1 uv run python bench/fp8_accuracy.py   # cpu backend (~10 min)
    OPENBLAS_NUM_THREADS=1 uv run python bench/fp8_accuracy.py --formats gguf  # one row
    OPENBLAS_NUM_THREADS=1 uv run python bench/fp8_accuracy.py --formats bf16kv
    uv run python bench/fp8_accuracy.py --backend cuda        # on a GPU (kernels for --target)

On a shared machine keep BLAS to one thread: OpenBLAS's spinning workers starved the
NumPy launch path here (a 45-minute run left unfinished; 7 minutes with one thread).
Greedy agreement counts equal tokens position by position, so after the first different
token the two continuations rarely line up again: `first_difference` says where they part.

Writes bench/results/quantized_accuracy_<backend>.json (commit, machine, backend, one row
per format, each with the commit it was measured at): rows of formats not run this time
are kept from the file as it was.
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
from helios_tools.frontend_assets import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "smollm2_135m_instruct.py"
TEXT = ROOT / "bench" / "prompts" / "fp8_accuracy_text.txt"
GOLDENS = ROOT / "tests" / "golden" / "smollm2_goldens.json"
STEPS = 64
FORMATS = {"fp8": "e4m3 per-channel weights, per-token dynamic e4m3 activations (W8A8); "
                  "embedding and LM head bf16",
           "int4": "4-bit codes, asymmetric groups (128 along K, 64 where 128 does not "
                   "divide K) with f32 scales and zero points, f32 activations (W4A16); "
                   "embedding and LM head bf16",
           "gguf": "the GGUF's own blocks repacked exactly (never through floats): Q4_1 "
                   "projections as 4-bit codes in groups of 32 with f32 scale and minimum "
                   "(INT4_MIN), the Q8_0 embedding / tied LM head as int8 codes with f32 "
                   "scales (INT8); f32 activations (W4A16 / W8A16)",
           "fp8kv": "bf16 weights, KV cache as e4m3 codes with one f32 scale per layer and "
                    "kv head, calibrated at export (amax x 1.25 / 448 on a fixed prompt; "
                    "--kv-cache-dtype fp8)",
           "bf16kv": "bf16 weights, KV cache as bfloat16 (each write rounded to nearest "
                     "even; --kv-cache-dtype bf16)"}
# Export options of each format but gguf (--quantize, --kv-cache-dtype).
EXPORT = {"bf16": {}, "fp8": {"quantize": "fp8"}, "int4": {"quantize": "int4"},
          "fp8kv": {"kv_cache_dtype": "fp8"}, "bf16kv": {"kv_cache_dtype": "bf16"}}
NAMESPACE = "bench"
_KEYS: dict[Path, tuple[Path, Path]] = {}  # folder -> (private, public) key files


def _export(folder: Path, name: str, targets: tuple[str, ...],
            target: str = "sm_90") -> Path:
    """The core of format `name` (a FORMATS key or "bf16"). ``gguf`` is always exported
    for `target`: only a core for a GPU target stores the repacked form."""
    if folder not in _KEYS:
        _KEYS[folder] = write_key_pair(generate_key(), folder / "publisher.key")
    private = _KEYS[folder][0]
    out = folder / f"smollm2-{name}.core"
    if name == "gguf":
        export_core(RECIPE, checkpoint="smollm2", key_path=private, namespace=NAMESPACE,
                    out=out, weight_dtype="gguf", targets=(target,))
        return out
    export_core(RECIPE, checkpoint="smollm2", key_path=private, namespace=NAMESPACE, out=out,
                weight_dtype="bf16", targets=targets, **EXPORT[name])
    return out


def _public(folder: Path) -> Path:
    return _KEYS[folder][1]


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def measure(core_path: Path, backend: str, text_ids: list[int], prompts: list[list[int]]
            ) -> tuple[np.ndarray, list[list[int]]]:
    """(teacher-forced log-probabilities [len(text) - 1, vocab], greedy ids per prompt)."""
    core = open_core(core_path, [load_public_key(_public(core_path.parent))])
    authorize(core, NAMESPACE)
    model = load_native(core, backend)
    try:
        driver = Driver(model)
        logprobs = _log_softmax(driver.teacher_force(text_ids[:1], text_ids[1:]))
        greedy = [Driver(model).generate([p], STEPS)[0] for p in prompts]
    finally:
        model.close()
    return logprobs, greedy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--target", default="sm_90", help="with --backend cuda")
    parser.add_argument("--out", default=None)
    parser.add_argument("--formats", default="fp8,int4,fp8kv",
                        help="comma-separated quantized formats to compare with bf16")
    args = parser.parse_args()
    formats = args.formats.split(",")
    targets = (args.target,) if args.backend == "cuda" else ()
    goldens = json.loads(GOLDENS.read_text())
    prompts = [p["prompt_ids"] for p in goldens["prompts"]]
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cores = {"bf16": _export(folder, "bf16", targets),
                 **{f: _export(folder, f, targets, args.target) for f in formats}}
        tok = load_tokenizer(open_core(cores["bf16"], [load_public_key(_public(folder))])
                             .read_resource("tokenizer.json").decode())
        text_ids = tok.encode(TEXT.read_text(), add_special_tokens=False).ids
        results = {name: measure(path, args.backend, text_ids, prompts)
                   for name, path in cores.items()}
    targets_next = np.asarray(text_ids[1:])
    rows = np.arange(len(targets_next))
    lp = {name: r[0] for name, r in results.items()}
    ppl = {name: float(np.exp(-lp[name][rows, targets_next].mean())) for name in lp}
    table = {}
    for name in formats:
        kl = np.sum(np.exp(lp["bf16"]) * (lp["bf16"] - lp[name]), axis=-1)
        agree = []
        for ref, got in zip(results["bf16"][1], results[name][1], strict=True):
            same = [a == b for a, b in zip(ref, got, strict=True)]
            agree.append({"agreement": sum(same) / STEPS,
                          "first_difference": same.index(False) if False in same else STEPS})
        table[name] = {
            "format": FORMATS[name], "commit": git_commit(), "bf16_perplexity": ppl["bf16"],
            "perplexity": ppl[name],
            "mean_kl_vs_bf16_nats": float(kl.mean()), "max_kl_vs_bf16_nats": float(kl.max()),
            "teacher_forced_top1_agreement": float(np.mean(lp["bf16"].argmax(-1)
                                                           == lp[name].argmax(-1))),
            "greedy": agree,
            "greedy_agreement_mean": float(np.mean([a["agreement"] for a in agree])),
        }
    out = Path(args.out or ROOT / "bench" / "results" / f"quantized_accuracy_{args.backend}.json")
    if out.exists():  # keep the rows of formats not run now, each with its own commit
        before = json.loads(out.read_text())
        kept = {k: {"commit": before.get("commit"), **v}
                for k, v in before.get("formats", {}).items() if k not in table}
        table = {**kept, **table}
    result = {
        "commit": git_commit(), "machine": platform.node(), "backend": args.backend,
        "model": "SmolLM2-135M-Instruct (the embedded GGUF: dequantized for bf16/fp8/int4, "
                 "its blocks repacked for gguf)",
        "text": str(TEXT.relative_to(ROOT)), "text_tokens": len(text_ids),
        "bf16_perplexity": ppl["bf16"], "greedy_steps": STEPS, "formats": table,
        "seconds": round(time.time() - started, 1),
    }
    print(json.dumps(result, indent=1))
    write_json(out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
