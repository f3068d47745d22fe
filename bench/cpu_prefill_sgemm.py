"""Prefill's weight products at many rows: ggml's quantized mul_mat against dequantize +
f32 sgemm, on SmolLM2-135M's real matrices, in one run.

At M activation rows (256: a full prefill chunk), each Q4_1 / Q8_0 matrix of the GGUF
(q 576x576, k 192x576, gate 1536x576, down 576x1536, the LM head 49152x576) is
multiplied three ways:

- ggml: `ggml_mul_mat` over the blocks as they are (quantizes the activations to Q8_1 /
  Q8_0 and runs integer dot products: what the cpu backend's graphs run today), the
  wheel's libggml, a persistent pool of THREADS threads;
- dequantize + sgemm: the matrix decoded by ggml's own `to_float` (its type traits, one
  thread) into one reused f32 scratch, then `x @ scratch.T` through NumPy's BLAS
  (OpenBLAS, its threads capped at THREADS) -- no f32 copy of the weights kept;
- sgemm alone on an f32 copy decoded beforehand (the bound: what the f32 core did,
  459 tokens/s at pp256 against ggml's 298 in an earlier quiet 2-thread run).

Each figure is the 10th percentile of single calls (bench/cpu_kernel_lib.py's
time_call); the machine may be shared: compare within one run (the JSON records the
load average before and after). Figures only; never asserted.

Run: `uv run python bench/cpu_prefill_sgemm.py [--threads 1] [--rows 256]`
     -> bench/results/cpu_prefill_sgemm_t{threads}.json
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import sys
from pathlib import Path


def _threads_arg(argv: list[str]) -> str:
    """--threads N from argv ("1" when absent)."""
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "1"


# OpenBLAS reads its thread count once, when NumPy loads it: set before the import.
os.environ["OPENBLAS_NUM_THREADS"] = _threads_arg(sys.argv)

import numpy as np  # noqa: E402
from _report import git_commit, write_json  # noqa: E402  (bench/ is this script's folder)
from cpu_kernel_lib import (  # noqa: E402
    GGML_Q4_1,
    GGML_Q8_0,
    GgmlMatmul,
    load_ggml,
    load_matrices,
    smollm2_gguf,
    time_call,
)

BENCH = Path(__file__).resolve().parent
# SmolLM2-135M's products per layer, by the matrix shape this script times (fused
# buffers count as their parts: wqkv = q + 2 k, gate_up = 2 gate).
PER_LAYER = {"q 576x576": 2, "k 192x576": 2, "gate 1536x576": 2, "down 576x1536": 1}
LAYERS = 30


class _Traits(ctypes.Structure):  # struct ggml_type_traits (ggml.h)
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class DequantSgemm:
    """y[M, N] = x[M, K] @ dequant(W).T: W's blocks decoded into a reused scratch by
    ggml's to_float, then BLAS sgemm."""

    def __init__(self, base, gtype: int, raw: np.ndarray, n: int, k: int):
        base.ggml_get_type_traits.argtypes = [ctypes.c_int]
        base.ggml_get_type_traits.restype = ctypes.POINTER(_Traits)
        self.to_float = _TO_FLOAT(base.ggml_get_type_traits(gtype).contents.to_float)
        self.raw, self.n, self.k = raw, n, k
        self.scratch = np.empty((n, k), np.float32)

    def dequant(self) -> np.ndarray:
        self.to_float(self.raw.ctypes.data, self.scratch.ctypes.data, self.n * self.k)
        return self.scratch

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x @ self.dequant().T


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, nargs="+", default=[256])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    load_before = os.getloadavg()
    base, cpu, features = load_ggml()
    mats = load_matrices(smollm2_gguf())
    rng = np.random.default_rng(0)
    rows_out = []
    if True:  # OpenBLAS' threads: set from --threads before NumPy loaded
        for m in args.rows:
            for name, (btype, raw, deq) in mats.items():
                n, k = deq.shape
                gtype = {"Q4_1": GGML_Q4_1, "Q8_0": GGML_Q8_0}[btype]
                x = rng.standard_normal((m, k)).astype(np.float32)
                ref = x @ deq.T
                gm = GgmlMatmul(base, cpu, gtype, raw, n, k, m, args.threads)
                ds = DequantSgemm(base, gtype, raw, n, k)
                err = {"ggml": float(np.abs(gm(x) - ref).max() / np.abs(ref).max()),
                       "dequant_sgemm": float(np.abs(ds(x) - ref).max() / np.abs(ref).max())}
                t = {"ggml": time_call(gm, x, args.calls),
                     "dequant_sgemm": time_call(ds, x, args.calls),
                     "dequant_only": time_call(lambda _x, ds=ds: ds.dequant(), x, args.calls),
                     "sgemm_f32_copy": time_call(lambda _x, d=deq: _x @ d.T, x, args.calls)}
                gm.close()
                row = {"rows": m, "matrix": name, "type": btype,
                       "us_p10": {key: round(v[0], 1) for key, v in t.items()},
                       "us_median": {key: round(v[1], 1) for key, v in t.items()},
                       "rel_err": err}
                rows_out.append(row)
                print(f"M={m} {name:20s} " + "  ".join(
                    f"{key} {v[0]:8.0f}" for key, v in t.items()), flush=True)
    totals = {}
    for m in args.rows:
        layer = {key: sum(PER_LAYER[r["matrix"]] * r["us_p10"][key] for r in rows_out
                          if r["rows"] == m and r["matrix"] in PER_LAYER)
                 for key in ("ggml", "dequant_sgemm", "sgemm_f32_copy")}
        totals[str(m)] = {key: round(LAYERS * v / 1e3, 1) for key, v in layer.items()}
    result = {
        "commit": git_commit(),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "python": sys.version.split()[0], "load_average_before": load_before,
                    "load_average_after": os.getloadavg()},
        "threads": args.threads, "ggml_simd": features, "statistic": "p10 of single calls",
        "matrices": rows_out,
        "layers_products_ms": totals,
        "note": "layers_products_ms: 30 layers' weight products (q, k, v, o, gate, up, "
                "down) at M rows, the LM head excluded (prefill needs one row of it)",
    }
    out = args.out or str(BENCH / "results" / f"cpu_prefill_sgemm_t{args.threads}.json")
    print(f"30 layers' products, ms: {totals}")
    print(f"wrote {write_json(out, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
