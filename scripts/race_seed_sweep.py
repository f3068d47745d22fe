"""Seed sweep of tests/gpu/test_sampling_chunks.py::test_race_sampler_flat_rows_ties_and_fallback
on the CPU: the test's exact construction (its own function, R = 8, V = 49152) for many
seeds, the candidate race against ``sample_biased``. Reports every seed whose tokens or
histograms differ, with the row, both tokens, their probabilities, top_p and the mass
ahead of each as the reference and the race sum it.

    uv run python scripts/race_seed_sweep.py numpy 0 500      # the NumPy race references
    uv run python scripts/race_seed_sweep.py interpret 0 20   # the Triton kernels, interpreted

``numpy`` runs the race's NumPy references (helios_tools.kernels.sampling_chunks) as the
device (about 2 s a seed): the race's logic and its f32 mass order (per-chunk sums, then
across chunks) against ``sample_biased``'s sequential cumsum. ``interpret`` runs the Triton
kernels under TRITON_INTERPRET (scripts/interpret_kernels.py; about 50 s a seed on a
shared core), which also checks each kernel against its reference. Neither reproduces the
device's libdevice exp or its reduction order bit for bit; a device failure is reproduced
with the seed the test prints (HELIOS_TEST_SEED). Prints one line per seed with a
mismatch and a summary line; exit 1 on any mismatch.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from helios_tools import kernels as K  # noqa: E402
from helios_tools.kernels.sampling import _top_p, row_logits  # noqa: E402
from helios_tools.kernels.sampling_chunks import CHUNK, RACE_TOP, race_candidates  # noqa: E402


class _Reference:
    """The GPU tests' ``gpu`` fixture with the NumPy references as the device: outputs
    poisoned, every buffer returned by name; remembers each op's buffers."""

    def __init__(self) -> None:
        self.last: dict[str, dict[str, np.ndarray]] = {}
        self.calls: list[tuple[str, dict[str, np.ndarray], tuple]] = []

    def run(self, op: str, *args) -> dict[str, np.ndarray]:
        params = K.kernel_params(op)
        arrs = []
        for spec, a in zip(params, args, strict=True):
            if spec.kind == "buffer":
                a = np.ascontiguousarray(a).copy()
                if spec.direction == "out":
                    a[...] = np.nan if a.dtype.kind == "f" else -7777
            arrs.append(a)
        getattr(K, op)(*arrs)
        out = {s.name: a for s, a in zip(params, arrs, strict=True) if s.kind == "buffer"}
        scalars = tuple(a for s, a in zip(params, arrs, strict=True) if s.kind != "buffer")
        self.calls.append((op, out, scalars))
        return out


class _Recording:
    """``_Interpreted`` (scripts/interpret_kernels.py) that remembers each op's buffers."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[tuple[str, dict[str, np.ndarray], tuple]] = []

    def run(self, op: str, *args) -> dict[str, np.ndarray]:
        out = self.inner.run(op, *args)
        scalars = tuple(a for s, a in zip(K.kernel_params(op), args, strict=True)
                        if s.kind != "buffer")
        self.calls.append((op, out, scalars))
        return out


def _explain(calls) -> list[str]:
    """For the last race pass of a failed run: each row whose pick differs from
    sample_biased's, with both tokens' probabilities and masses ahead."""
    pick = [c for c in calls if c[0] == "sample_race_pick"][-1]
    top = [c for c in calls if c[0] == "sample_race_top"][-1]
    buf = pick[1]
    R, V, W32, P, M = pick[2]
    lines = []
    # the inputs of sample_biased are the pick's own (its histogram is the merge's output,
    # so re-run the reference row by row from the merge's state)
    merged = top[1]["sampled"]
    for r in range(R):
        if int(merged[r]) != -2 or int(buf["slot"][r]) < 0:
            continue
        hist = [c for c in calls if c[0] == "sample_merge"][-1][1]["histogram"].copy()
        args = [buf[k] for k in ("slot", "positions", "sampling_decision", "seed",
                                 "temperature", "top_p", "top_k", "min_p", "presence",
                                 "frequency", "repetition")]
        one = np.zeros(R, np.int32)
        K.sample_biased(buf["logits"], *args, hist, buf["logit_bias"], buf["use_bias"],
                        buf["grammar_mask"], buf["use_mask"], one, R, V, W32)
        got = int(buf["sampled"][r])
        want = int(one[r])
        if got == want:
            continue
        z = row_logits(buf["logits"], buf["slot"], buf["presence"], buf["frequency"],
                       buf["repetition"], hist, buf["logit_bias"], buf["use_bias"],
                       buf["grammar_mask"], buf["use_mask"], r, V, W32)
        z = z / np.float32(buf["temperature"][r])
        e = np.exp(z - z.max())
        pr = (e / e.sum(dtype=np.float32)).astype(np.float32)
        tp = np.float32(buf["top_p"][r])
        order = np.argsort(-pr, kind="stable")
        cum = np.cumsum(pr[order], dtype=np.float32)
        ahead_ref = np.empty(V, np.float32)  # each id's mass ahead, the reference's sum
        ahead_ref[order] = np.concatenate([[np.float32(0)], cum[:-1]])
        nucleus = _top_p(pr, tp)

        score, cid, _ = race_candidates(top[1]["top_score"][r], top[1]["top_id"][r],
                                        top[1]["top_zt"][r], P, M)
        ahead = buf["ahead"][r, :P * M].reshape(P, M)
        race_before = [float(ahead[:, m].sum(dtype=np.float32)) for m in range(M)]
        lines.append(
            f"  row {r}: race {got} (p {pr[got]:.9g}, reference's mass ahead "
            f"{ahead_ref[got]:.9g}, in its nucleus {got in set(nucleus.tolist())}) vs "
            f"sample_biased {want} (p {pr[want]:.9g}, mass ahead {ahead_ref[want]:.9g}); "
            f"top_p {tp:.9g}, nucleus {nucleus.size} ids; candidates {cid.tolist()}, "
            f"the race's mass ahead {race_before}, the reference's "
            f"{[float(ahead_ref[i]) if 0 <= i < V else None for i in cid]}")
    return lines


def _margins(calls) -> list[tuple[float, float]]:
    """For every race pass and raced row with top_p < 1, each candidate the pick examines
    (up to the first inside the nucleus): (|its race mass ahead - top_p|, |its race mass
    ahead - the reference's cumsum ahead|). The pick can differ from sample_biased's only
    where the first is below the second (the two sums on opposite sides of top_p)."""
    out = []
    tops = [c for c in calls if c[0] == "sample_race_top"]
    picks = [c for c in calls if c[0] == "sample_race_pick"]
    merges = [c for c in calls if c[0] == "sample_merge"]
    for top, pick, merge in zip(tops, picks, merges, strict=True):
        buf = pick[1]
        R, V, W32, P, M = pick[2]
        for r in range(R):
            tp = np.float32(buf["top_p"][r])
            if int(top[1]["sampled"][r]) != -2 or int(buf["slot"][r]) < 0 or not tp < 1:
                continue
            z = row_logits(buf["logits"], buf["slot"], buf["presence"], buf["frequency"],
                           buf["repetition"], merge[1]["histogram"], buf["logit_bias"],
                           buf["use_bias"], buf["grammar_mask"], buf["use_mask"], r, V, W32)
            z = z / np.float32(buf["temperature"][r])
            e = np.exp(z - z.max())
            pr = (e / e.sum(dtype=np.float32)).astype(np.float32)
            order = np.argsort(-pr, kind="stable")
            ahead_ref = np.empty(V, np.float32)
            ahead_ref[order] = np.concatenate([[np.float32(0)],
                                               np.cumsum(pr[order], dtype=np.float32)[:-1]])
            score, cid, _ = race_candidates(top[1]["top_score"][r], top[1]["top_id"][r],
                                            top[1]["top_zt"][r], P, M)
            ahead = buf["ahead"][r, :P * M].reshape(P, M)
            for m in range(M):
                if not score[m] > -np.inf:
                    break
                race = ahead[:, m].sum(dtype=np.float32)
                out.append((abs(float(race) - float(tp)),
                            abs(float(race) - float(ahead_ref[cid[m]]))))
                if race < tp or race == 0:
                    break
    return out


def main() -> int:
    if len(sys.argv) != 4 or sys.argv[1] not in ("numpy", "interpret"):
        print(__doc__.strip().splitlines()[3], file=sys.stderr)
        return 2
    mode, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if mode == "interpret":
        import interpret_kernels as ik  # sets TRITON_INTERPRET before Triton loads

        make = lambda: _Recording(ik._Interpreted())  # noqa: E731
    else:
        make = _Reference
    from tests.gpu import test_sampling_chunks as t

    bad = 0
    edge, order_err, close = np.inf, 0.0, 0
    t0 = time.time()
    for seed in range(lo, hi):
        gpu = make()
        try:
            t.test_race_sampler_flat_rows_ties_and_fallback(gpu, np.random.default_rng(seed))
        except AssertionError as exc:
            bad += 1
            print(f"BAD seed {seed}: {str(exc).strip().splitlines()[0][:200]}")
            for line in _explain(gpu.calls):
                print(line)
            sys.stdout.flush()
        for d_edge, d_order in _margins(gpu.calls):
            edge, order_err = min(edge, d_edge), max(order_err, d_order)
            close += d_edge <= 4 * d_order
        # a running summary (every seed interpreted, every 50 else): a cut-off sweep counts
        if (seed + 1 - lo) % (1 if mode == "interpret" else 50) == 0 or seed + 1 == hi:
            _summary(mode, lo, seed + 1, bad, time.time() - t0, edge, order_err, close)
    return 1 if bad else 0


def _summary(mode, lo, hi, bad, seconds, edge, order_err, close) -> None:
    print(f"{mode}: {hi - lo} seeds [{lo}, {hi}) of the test's construction "
          f"(R 8, V 49152, CHUNK {CHUNK}, RACE_TOP {RACE_TOP}): {bad} with a mismatch, "
          f"{seconds:.0f} s; over the candidates the picks examined, the nearest "
          f"race mass ahead to top_p {edge:.3g}, the largest race-vs-reference mass "
          f"difference {order_err:.3g}, {close} within 4x that difference of top_p",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
