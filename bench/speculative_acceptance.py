"""Acceptance of coupled verification against standard speculative sampling (CPU).

    uv run python bench/speculative_acceptance.py --prompts 16 --tokens 48 \
        --json bench/results/spec_acceptance_cpu.json

SmolLM2-135M-Instruct with the committed trained drafter, sampled (T 0.8, top_p 0.95),
lanes of W = 4 (3 drafts), held-out chat prompts (scripts/drafter_prompts.py, `eval`
split), batches of 8, one seed per request. Two cores are exported from the same recipe:
coupled verification (the default: `draft_sample_coupled` + `spec_verify_coupled`) and
standard speculative sampling (`DrafterDecl(coupled=False)`: `draft_sample` +
`spec_verify`, the ops of cores exported before coupling). Both run the real CPU
programs through `Driver.generate_speculative`; two measurements each:

1. Empirical, from the completion records: mean accepted length (tokens a lane emits
   per round, accepted drafts + 1, over lanes offered all 4 positions) and the
   acceptance rate at each draft position k (lanes that reached k).
2. Exact, per verified draft position on the recorded distributions (the CPU backend's
   draft and verify ops are wrapped to read their inputs): p = the target row's
   sampling distribution, q = the head's (temperature, top-p), the draft path the lane
   actually proposed. Standard speculative sampling accepts with probability
   1 - TV(p, q) = sum_i min(p_i, q_i) (Leviathan et al. 2023); the coupled race (shared
   Gumbel / exponential noise) with probability sum_i p_i q_i / sum_j max(p_j q_i,
   q_j p_i) (for each i the chance that i wins both races: integrate exp(-e sum_j
   max(p_j / p_i, q_j / q_i)) over e ~ Exp(1)), at least (1 - TV) / (1 + TV) (Daliri,
   Musco, Suresh 2025, arXiv 2408.07978). A greedy head (argmax of q) would be accepted
   with probability p(argmax q) under either rule. Expected accepted length of a lane
   = a1 + a1 a2 + a1 a2 a3 along the path (a_k the position-k probability given drafts
   1..k-1), + 1.

Prints one JSON line per core and a table; writes --json.
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

from _report import write_json  # noqa: E402  bench/ is this script's folder

TRAINED = ROOT / "recipes" / "drafters" / "smollm2-135m-instruct-eagle.safetensors"
TEMPERATURE, TOP_P, WIDTH = 0.8, 0.95, 4


def _distribution(z: np.ndarray, ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(ids, probabilities) of the sampler's distribution of logits `z` (temperature,
    top-p; helios_tools.kernels.sampling), renormalized; `ids` maps positions to ids."""
    from helios_tools.kernels.sampling import _candidates

    cand, p = _candidates(z.astype(np.float32), TEMPERATURE, 0, TOP_P, 0.0)
    p = p.astype(np.float64) / float(p.sum(dtype=np.float64))
    return (cand if ids is None else ids[cand]).astype(np.int64), p


def acceptance(p_ids, p, q_ids, q) -> dict[str, float]:
    """Exact acceptance probabilities of one draft position (module docstring)."""
    union = np.union1d(p_ids, q_ids)
    pu = np.zeros(union.size)
    qu = np.zeros(union.size)
    pu[np.searchsorted(union, p_ids)] = p
    qu[np.searchsorted(union, q_ids)] = q
    standard = float(np.minimum(pu, qu).sum())
    both = np.flatnonzero((pu > 0) & (qu > 0))
    pi, qi = pu[both][:, None], qu[both][:, None]
    denom = np.maximum(pu[None, :] * qi, qu[None, :] * pi).sum(axis=1)
    coupled = float((pu[both] * qu[both] / denom).sum())
    tv = 1.0 - standard
    return {"standard": standard, "coupled": coupled, "bound": (1 - tv) / (1 + tv),
            "greedy_head": float(pu[int(np.argmax(qu))])}


class Recorder:
    """Wraps the CPU backend's draft and verify ops: per lane and draft position the
    exact acceptance probabilities of both rules on the recorded p and q."""

    DRAFT = ("draft_sample", "draft_sample_coupled")
    VERIFY = ("spec_verify", "spec_verify_coupled")

    def __init__(self) -> None:
        self.head: dict[int, np.ndarray] = {}  # draft step -> [B, VD] head logits
        self.lanes: list[list[dict[str, float]]] = []

    def wrap(self, op: str, fn):
        from helios_tools.kernels import kernel_params

        names = [p.name for p in kernel_params(op)]
        if op not in self.DRAFT + self.VERIFY:
            return fn

        def run(*args):
            a = dict(zip(names, args, strict=True))
            if op in self.DRAFT:
                self.head[int(a["STEP"])] = a["logits"][:int(a["B"])].copy()
                self.vocab_map = a["vocab_map"].astype(np.int64)
            else:
                self._verify(a)
                self.head.clear()
            return fn(*args)
        return run

    def _verify(self, a) -> None:
        qlen = a["query_length"][:int(a["B"])].astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(np.maximum(qlen, 0))[:-1]])
        V = int(a["V"])
        for b, n in enumerate(qlen):
            if a["slot"][b] < 0 or n < WIDTH:
                continue
            lane = []
            for j in range(n - 1):
                p_ids, p = _distribution(a["logits"][offsets[b] + j, :V])
                q_ids, q = _distribution(self.head[j + 1][b], self.vocab_map)
                lane.append(acceptance(p_ids, p, q_ids, q))
            self.lanes.append(lane)


def _export(folder: Path, coupled: bool, drafter: str, gguf: str | None):
    from helios_ignition.export import export_core
    from helios_tools.core import generate_key, load_public_key, open_core, write_key_pair

    key = folder / f"key{int(coupled)}.pem"
    write_key_pair(generate_key(), key)
    recipe = folder / f"spec{int(coupled)}.py"
    recipe.write_text(
        "from dataclasses import replace\nimport importlib.util\n"
        f"s = importlib.util.spec_from_file_location('b', "
        f"{str(ROOT / 'recipes/smollm2_135m_instruct.py')!r})\n"
        "b = importlib.util.module_from_spec(s); s.loader.exec_module(b)\n"
        "from helios_ignition.recipe import DrafterDecl\n"
        f"RECIPE = replace(b.RECIPE, drafter=DrafterDecl({drafter!r}, widths=(1, {WIDTH}), "
        f"coupled={coupled}), capacities=replace(b.RECIPE.capacities, decode_batch=(1, 8), "
        "prefill_tokens=(64, 256)))\n")
    out = folder / f"spec{int(coupled)}.core"
    export_core(recipe, checkpoint=gguf or "smollm2", key_path=key, namespace="bench.spec",
                out=out, weight_dtype="bf16")
    return open_core(out, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])


def _prompts(count: int, gguf: str | None) -> list[list[int]]:
    from helios_ignition.checkpoint import load_gguf, smollm2_gguf_path
    from speculative import _prompts as chat_prompts

    return chat_prompts(count, load_gguf(gguf or smollm2_gguf_path()))


def run(args) -> dict:
    import helios_serve.runtime.cpu_backend as cpu
    from helios_serve.engine.plan import SamplingParams
    from helios_serve.runtime.driver import Driver
    from helios_serve.testing.native import load_native

    prompts = _prompts(args.prompts, args.gguf)
    base = cpu.reference_op
    rows = {}
    with tempfile.TemporaryDirectory() as d:
        cores = {name: _export(Path(d), name == "coupled", args.drafter, args.gguf)
                 for name in ("coupled", "standard")}
        for name, core in cores.items():
            recorder = Recorder()
            cpu.reference_op = lambda op, r=recorder: r.wrap(op, base(op))
            try:
                model = load_native(core, "cpu")
            finally:
                cpu.reference_op = base
            t0 = time.perf_counter()
            records = []
            for start in range(0, len(prompts), 8):
                group = prompts[start:start + 8]
                params = [SamplingParams(temperature=TEMPERATURE, top_p=TOP_P, seed=11 + start + i)
                          for i in range(len(group))]
                _, recs = Driver(model).generate_speculative(group, args.tokens, WIDTH, params)
                records += recs
            model.close()
            rows[name] = _summary(records, recorder, time.perf_counter() - t0)
            print(json.dumps({"core": name, **{k: v for k, v in rows[name].items()
                                               if k != "exact_per_position"}}), flush=True)
    return {"model": "smollm2-135m-instruct", "drafter": args.drafter, "backend": "cpu",
            "sampling": {"temperature": TEMPERATURE, "top_p": TOP_P}, "width": WIDTH,
            "prompts": len(prompts), "tokens_per_request": args.tokens, "cores": rows}


def _summary(records, recorder: Recorder, seconds: float) -> dict:
    # lanes offered W positions (record columns: generation, offers, accepted, emitted)
    full = np.concatenate([r[r[:, 1] == WIDTH, :4] for r in records])
    accepted = full[:, 2]
    per_position = [float((accepted >= k).sum() / max((accepted >= k - 1).sum(), 1))
                    for k in range(1, WIDTH)]
    exact = {}
    for rule in ("standard", "coupled", "bound", "greedy_head"):
        a = np.asarray([[pos[rule] for pos in lane] for lane in recorder.lanes])
        exact[rule] = {"per_position": [round(float(x), 4) for x in a.mean(axis=0)],
                       "expected_accepted_length": round(float(
                           (1 + np.cumprod(a, axis=1).sum(axis=1)).mean()), 4)}
    return {"lane_rounds_at_full_width": int(full.shape[0]),
            "mean_accepted_length": round(float(accepted.mean() + 1), 4),
            "acceptance_per_position": [round(x, 4) for x in per_position],
            "recorded_lanes": len(recorder.lanes), "seconds": round(seconds, 1),
            "exact_on_recorded_paths": exact}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--drafter", default=str(TRAINED))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    result = run(args)
    print(f"{'core':<9} {'lanes':>6} {'mean acc len':>12} {'acc/pos (empirical)':>22} "
          f"{'exact std':>10} {'exact coupled':>14} {'bound':>7}")
    for name, row in result["cores"].items():
        e = row["exact_on_recorded_paths"]
        print(f"{name:<9} {row['lane_rounds_at_full_width']:>6} "
              f"{row['mean_accepted_length']:>12.3f} "
              f"{' '.join(f'{x:.3f}' for x in row['acceptance_per_position']):>22} "
              f"{e['standard']['expected_accepted_length']:>10.3f} "
              f"{e['coupled']['expected_accepted_length']:>14.3f} "
              f"{e['bound']['expected_accepted_length']:>7.3f}")
    if args.json:
        write_json(args.json, result, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
