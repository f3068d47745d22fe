"""How closely Gemma 3 270M on the cpu backend follows llama.cpp on the same GGUF: per
golden prompt of tests/golden/gemma3/llamacpp_reference.json, the steps its free-running
greedy ids equal the reference's, and with teacher forcing (fed the reference's ids) how
many argmaxes are the reference's and the largest and mean |difference| of the
reference's top-5 logits.

    uv run python bench/gemma3_llamacpp_agreement.py [--out PATH]
        -> bench/results/gemma3_llamacpp_agreement.json

The core is exported fresh (recipes/gemma3_270m.py, --weight-dtype gguf) into a temporary
folder, so the figures are the checked-out code's. A figure, not a test: the test that
holds these bounds is tests/serve/runtime/test_gemma3_core.py. HELIOS_CPU_STEP_GRAPHS and
HELIOS_GGML_LIB apply as when serving.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from pathlib import Path

import numpy as np
from _report import git_commit, write_json
from helios_ignition.export import export_core
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native
from helios_tools.core import (
    authorize,
    generate_key,
    load_public_key,
    open_core,
    write_key_pair,
)

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "tests" / "golden" / "gemma3" / "llamacpp_reference.json"
NAMESPACE = "helios.bench/models"


def measure(core_path: Path, public: Path, reference: dict) -> list[dict]:
    """Per prompt: name, free-run steps equal to the reference before the first that
    differs, teacher-forced argmax matches, top-5 |logit difference| max and mean, and
    the reference's margin (top1 - top2) at each teacher-forced argmax that differs."""
    core = open_core(core_path, [load_public_key(public)])
    authorize(core, NAMESPACE)
    model = load_native(core, "cpu")
    try:
        driver = Driver(model, collect_logits=True)
        free = driver.generate([p["prompt_ids"] for p in reference["prompts"]],
                               reference["steps"])
        rows = []
        for prompt, ids in zip(reference["prompts"], free, strict=True):
            steps = prompt["steps"]
            ref = [s["id"] for s in steps]
            forced = driver.teacher_force(prompt["prompt_ids"], ref)
            diffs = [np.abs(forced[k][s["top_ids"]] - np.asarray(s["top_logits"])).max()
                     for k, s in enumerate(steps)]
            missed = [k for k, s in enumerate(steps) if int(np.argmax(forced[k])) != s["id"]]
            rows.append({
                "prompt": prompt["name"],
                "free_run_equal_steps": next((k for k in range(len(ref)) if ids[k] != ref[k]),
                                             len(ref)),
                "teacher_forced_argmax_equal": len(steps) - len(missed),
                "top5_abs_diff_max": round(float(max(diffs)), 4),
                "top5_abs_diff_mean": round(float(np.mean(diffs)), 4),
                "missed_argmax_reference_margins": {
                    k: round(steps[k]["top_logits"][0] - steps[k]["top_logits"][1], 4)
                    for k in missed},
            })
        return rows
    finally:
        model.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "bench" / "results" /
                                             "gemma3_llamacpp_agreement.json"))
    args = parser.parse_args()
    reference = json.loads(REFERENCE.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        key, public = write_key_pair(generate_key(), Path(tmp) / "publisher.key")
        core = Path(tmp) / "gemma3-270m.core"
        export_core(REPO / "recipes" / "gemma3_270m.py", checkpoint="gemma3-270m",
                    key_path=key, namespace=NAMESPACE, out=core)
        rows = measure(core, public, reference)
    steps = reference["steps"]
    for r in rows:
        print(f"{r['prompt']:16s} free run {r['free_run_equal_steps']:2d}/{steps}  "
              f"teacher-forced argmax {r['teacher_forced_argmax_equal']:2d}/{steps}  "
              f"top-5 |d| max {r['top5_abs_diff_max']:.3f} mean {r['top5_abs_diff_mean']:.3f}")
    result = {
        "commit": git_commit(), "machine": platform.machine(), "node": platform.node(),
        "python": platform.python_version(), "reference": str(REFERENCE.relative_to(REPO)),
        "env": {k: os.environ[k] for k in ("HELIOS_CPU_STEP_GRAPHS", "HELIOS_GGML_LIB")
                if k in os.environ},
        "prompts_equal_for_all_steps": sum(r["free_run_equal_steps"] == steps for r in rows),
        "teacher_forced_argmax_equal": sum(r["teacher_forced_argmax_equal"] for r in rows),
        "steps": steps * len(rows),
        "top5_abs_diff_max": max(r["top5_abs_diff_max"] for r in rows),
        "prompts": rows,
    }
    print(f"wrote {write_json(args.out, result)}")


if __name__ == "__main__":
    main()
