"""How often the chunked sampler's nucleus form resolves a top-p-only row in its merge
(CPU, the NumPy references on the real model's logits).

    uv run python bench/nucleus_fit.py --prompts 16 --tokens 64 \
        --json bench/results/nucleus_fit_smollm2_cpu.json

SmolLM2-135M-Instruct (bf16, the recipe's default) decodes held-out chat prompts
(scripts/drafter_prompts.py, `eval` split) sampled as an OpenAI client asks: temperature
0.8, top_p 0.95, no top_k, one seed per request, batches of 8, on the CPU backend. Every
logits row the sampler saw (prefill's last rows and each decode row) is then run
through ``sample_chunks_nucleus`` (2,048 ids per chunk, each chunk's top 64) and
``sample_merge_nucleus``'s row rule for several merged widths KN (NUCLEUS = 128 is
captured): a row is resolved in the merge when its nucleus ends strictly above every id
left out of the KN candidates, else it falls to ``sample_rest``'s bisection. On the GPU
a decode step at batch B waits for its slowest row, so the table also gives the share of
steps in which every row of a batch of 8 resolved. Nucleus sizes are exact (a full sort).
Prints a table; writes --json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _report import write_json  # noqa: E402  (bench/ is this script's folder)

TEMPERATURE, TOP_P = 0.8, 0.95
WIDTHS = (64, 128, 256, 512)


def _core(folder: Path, gguf: str | None):
    from helios_ignition.export import export_core
    from helios_tools.core import generate_key, load_public_key, open_core, write_key_pair

    key = folder / "key.pem"
    write_key_pair(generate_key(), key)
    recipe = folder / "recipe.py"
    recipe.write_text(
        "from dataclasses import replace\nimport importlib.util\n"
        f"s = importlib.util.spec_from_file_location('b', "
        f"{str(ROOT / 'recipes/smollm2_135m_instruct.py')!r})\n"
        "b = importlib.util.module_from_spec(s); s.loader.exec_module(b)\n"
        "RECIPE = replace(b.RECIPE, capacities=replace(b.RECIPE.capacities, "
        "decode_batch=(1, 8), prefill_tokens=(64, 256)))\n")
    out = folder / "smollm2.core"
    export_core(recipe, checkpoint=gguf or "smollm2", key_path=key, namespace="bench.nucleus",
                out=out)
    return open_core(out, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])


def _row_fit(z: np.ndarray, widths) -> dict:
    """One logits row: its exact nucleus size and, per merged width, whether the merge
    resolves it (the reference rule of sample_merge_nucleus)."""
    from helios_tools.kernels.sampling_chunks import (
        CANDIDATES,
        CHUNK,
        UNRESOLVED,
        _nucleus_draw,
        sample_chunks_nucleus,
    )

    V = z.size
    P, KM, W = -(-V // CHUNK), CANDIDATES, (V + 31) // 32
    one = np.ones(1, np.int32)
    zeros = np.zeros(1, np.float32)
    cm, ca = np.zeros((1, P), np.float32), np.zeros((1, P), np.int32)
    mass = np.zeros((1, P), np.float32)
    ck, ci = np.zeros((1, P * KM), np.int32), np.zeros((1, P * KM), np.int32)
    sample_chunks_nucleus(z[None], np.zeros(1, np.int32), np.full(1, TEMPERATURE, np.float32),
                          np.full(1, TOP_P, np.float32), np.zeros(1, np.int32), zeros, zeros,
                          one.astype(np.float32), np.zeros((1, V), np.int32),
                          np.zeros((1, V), np.float32), np.zeros(1, np.int32),
                          np.zeros((1, W), np.int32), np.zeros(1, np.int32), cm, ca, mass, ck,
                          ci, 1, V, W, CHUNK, KM)
    zt = z / np.float32(TEMPERATURE)
    p = np.exp(zt - zt.max())
    p /= p.sum(dtype=np.float32)
    cum = np.cumsum(np.sort(p)[::-1], dtype=np.float32)
    size = int(np.searchsorted(cum, np.float32(TOP_P), side="left")) + 1
    fit = {kn: _nucleus_draw(cm, mass, ck, ci, 0, V, P, CHUNK, KM, kn, TEMPERATURE, TOP_P,
                             0.0, 1, 2, 3) != UNRESOLVED for kn in widths}
    return {"nucleus": size, "resolved": fit}


def run(args) -> dict:
    from helios_serve.engine.plan import SamplingParams
    from helios_serve.runtime.driver import Driver
    from helios_serve.testing.native import load_native
    from speculative_acceptance import _prompts

    prompts = _prompts(args.prompts, args.gguf)
    t0 = time.perf_counter()
    steps = []  # per batch step: the fit of each of its rows
    with tempfile.TemporaryDirectory() as d:
        model = load_native(_core(Path(d), args.gguf), "cpu")
        for start in range(0, len(prompts), 8):
            group = prompts[start:start + 8]
            params = [SamplingParams(temperature=TEMPERATURE, top_p=TOP_P, seed=21 + start + i)
                      for i in range(len(group))]
            driver = Driver(model, collect_logits=True)
            driver.generate(group, args.tokens, params)
            for rows in driver.logits:
                steps.append([_row_fit(np.asarray(r, np.float32), WIDTHS) for r in rows])
        model.close()
    rows = [r for s in steps for r in s]
    full = [s for s in steps if len(s) == 8]
    sizes = np.array([r["nucleus"] for r in rows])
    out = {"model": "SmolLM2-135M-Instruct bf16, CPU backend", "temperature": TEMPERATURE,
           "top_p": TOP_P, "top_k": 0, "prompts": len(prompts), "tokens": args.tokens,
           "rows": len(rows), "batch8_steps": len(full),
           "nucleus_size": {q: float(np.percentile(sizes, q)) for q in (50, 90, 99)} |
           {"max": int(sizes.max()), "mean": float(sizes.mean())},
           "widths": {}, "seconds": time.perf_counter() - t0}
    for kn in WIDTHS:
        ok = np.array([r["resolved"][kn] for r in rows])
        steps_ok = np.mean([all(r["resolved"][kn] for r in s) for s in full]) if full else None
        out["widths"][str(kn)] = {"rows_resolved": float(ok.mean()),
                                  "batch8_steps_all_resolved": None if steps_ok is None
                                  else float(steps_ok)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--gguf")
    ap.add_argument("--json")
    args = ap.parse_args()
    out = run(args)
    print(json.dumps(out))
    print(f"{out['rows']} rows, nucleus size p50 {out['nucleus_size'][50]:.0f} / p90 "
          f"{out['nucleus_size'][90]:.0f} / p99 {out['nucleus_size'][99]:.0f} / max "
          f"{out['nucleus_size']['max']} ids")
    print(f"{'KN':>5} {'rows resolved':>14} {'b8 steps all resolved':>22}")
    for kn, v in out["widths"].items():
        b8 = v["batch8_steps_all_resolved"]
        print(f"{kn:>5} {v['rows_resolved']:>14.3f} {'-' if b8 is None else f'{b8:.3f}':>22}")
    if args.json:
        write_json(args.json, out)


if __name__ == "__main__":
    main()
