"""Run the issue-17 Triton kernels under Triton's interpreter on the CPU (no GPU) against
their NumPy references: the folded linear ops (GEMV, FMA and, with f32 weights, MMA paths)
and the chunked sampler (``sample_chunks`` -> ``sample_merge`` -> ``sample_rest`` against
``sample_biased``). A check of the kernels' logic before device time is spent; the GPU
tests (tests/gpu/test_kernels.py, test_sampling_chunks.py) remain the verdict.

    uv run python scripts/interpret_kernels.py     # prints one line per case; exit 1 on a mismatch
    uv run python scripts/interpret_kernels.py speculative   # the speculative kernels only
    uv run python scripts/interpret_kernels.py nucleus       # the nucleus sampler's GPU tests
    uv run python scripts/interpret_kernels.py wide          # the wide sampler's GPU tests
    uv run python scripts/interpret_kernels.py race          # the candidate race's GPU tests
    uv run python scripts/interpret_kernels.py gemv          # the batch-1 GEMV variants only
    uv run python scripts/interpret_kernels.py invariant     # linear_invariant: rows bitwise alone
    uv run python scripts/interpret_kernels.py attention     # split decode attention layouts
    uv run python scripts/interpret_kernels.py attnmma       # its tensor-core body (bf16 KV)
    uv run python scripts/interpret_kernels.py mma           # packed terms, K split, reduce
    uv run python scripts/interpret_kernels.py scores        # score_tokens (scored prefill)
    uv run python scripts/interpret_kernels.py experts       # QK-norm and the MoE ops
    uv run python scripts/interpret_kernels.py window        # sliding-window family ops (and
                                                             # the unwindowed attention bodies)
    uv run python scripts/interpret_kernels.py vision        # the vision tower's kernels
    uv run python scripts/interpret_kernels.py fp8           # the FP8 W8A8 products
    uv run python scripts/interpret_kernels.py int4          # the W4A16 GEMV
    uv run python scripts/interpret_kernels.py kvfp8         # the e4m3 KV cache forms
    uv run python scripts/interpret_kernels.py kvbf16        # the bf16 KV cache forms
    uv run python scripts/interpret_kernels.py repacked      # repacked GGUF: INT4_MIN, INT8
    uv run python scripts/interpret_kernels.py mixed         # a MIXED program's packed rows
    uv run python scripts/interpret_kernels.py mixedmma      # its lanes on the tensor cores
    uv run python scripts/interpret_kernels.py decodetc      # decode buckets on the TC tile
    uv run python scripts/interpret_kernels.py bf16act       # round_bf16, one-term products

Runs on NumPy arrays without torch by adapting the interpreter's argument handling (its
internals as of Triton 3.9); libdevice's exp/log/ceil run as NumPy's. The interpreter
does not emulate bf16 tensor-core dots faithfully (the unchanged ``linear`` kernel fails
there too), so bf16 weights are checked on the GEMV and FMA paths only.
"""

from __future__ import annotations

import os
import sys
import types

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is decorated

import numpy as np  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra.cuda import libdevice  # noqa: E402
from triton.runtime import interpreter as interp  # noqa: E402

interp.GridExecutor._init_args_hst = lambda self, args, kwargs: (list(args), dict(kwargs))
interp.GridExecutor._restore_args_dev = lambda self, *a, **k: None
libdevice.exp = lambda x, **k: tl.exp(x)
libdevice.log = lambda x, **k: tl.log(x)
libdevice.ceil = lambda x, **k: tl.ceil(x)
libdevice.cos = lambda x, **k: tl.cos(x)
libdevice.sin = lambda x, **k: tl.sin(x)
# The fused attention's per-thread memory fence (PTX) has no meaning in the sequential
# interpreter: a no-op.
tl.inline_asm_elementwise = lambda asm, constraints, args, dtype, is_pure, pack: args[0]


class _Bools:  # the interpreter's masked load/store want np.bool_ masks
    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def load(self, ptrs, mask, other, dtype):
        return self._inner.load(ptrs, np.asarray(mask).astype(np.bool_), other, dtype)

    def store(self, ptrs, value, mask):
        return self._inner.store(ptrs, value, np.asarray(mask).astype(np.bool_))


interp._interpreter = _Bools(interp._interpreter)
_binary = interp.InterpreterBuilder.binary_op


def _bitwise(self, lhs, rhs, op):  # scalar comparisons come back as non-bool arrays
    if op in (np.bitwise_and, np.bitwise_or, np.bitwise_xor) and \
            np.bool_ in (lhs.data.dtype, rhs.data.dtype) and lhs.data.dtype != rhs.data.dtype:
        lhs = interp.TensorHandle(lhs.data.astype(np.bool_), tl.int1)
        rhs = interp.TensorHandle(rhs.data.astype(np.bool_), tl.int1)
    return _binary(self, lhs, rhs, op)


interp.InterpreterBuilder.binary_op = _bitwise
_fp_to_fp = interp.InterpreterBuilder.create_fp_to_fp


def _fp_to_fp8(self, src, dst_type, rounding_mode):
    """f32 -> e4m3 as the GPU's cvt.rn.satfinite does (kernels.fp8.encode_e4m3), f32 ->
    bf16 as its cvt.rn.bf16.f32 does (kernels.kv_bf16.encode_bf16): the interpreter's
    own conversion (Triton 3.9) drops the carry when rounding overflows the mantissa
    (31.2 -> 16, not 32), rounds ties up and flushes subnormals."""
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.float8e4nv:
        from helios_tools.kernels.fp8 import encode_e4m3

        return interp.TensorHandle(encode_e4m3(src.data), dst_type.scalar)
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
        from helios_tools.kernels.kv_bf16 import encode_bf16

        bits = encode_bf16(src.data).view(interp._get_np_dtype(dst_type))
        return interp.TensorHandle(bits, dst_type.scalar)
    return _fp_to_fp(self, src, dst_type, rounding_mode)


interp.InterpreterBuilder.create_fp_to_fp = _fp_to_fp8
_cast_impl = interp.InterpreterBuilder.cast_impl


def _cast_bf16(self, src, dst_type):
    """f32 -> bf16 truncations (a store into a bf16 plane) round to nearest even, as
    ``cvt.rn.bf16.f32`` on the GPU; the interpreter's own conversion truncates."""
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
        return _fp_to_fp8(self, src, dst_type, None)
    return _cast_impl(self, src, dst_type)


interp.InterpreterBuilder.cast_impl = _cast_bf16
_constexpr_sub = tl.constexpr.__sub__


def _sub(self, other):  # `INT_MAX - idx` (a constexpr minus a tensor) must be a tensor
    if isinstance(other, tl.tensor):
        return tl.full((), self.value, other.dtype) - other
    return _constexpr_sub(self, other)


tl.constexpr.__sub__ = _sub

from helios_ignition.capture.launch import launch_config  # noqa: E402
from helios_ignition.kernels_triton import TRITON_KERNELS  # noqa: E402
from helios_tools import kernels as K  # noqa: E402
from helios_tools.kernels.sampling_chunks import CANDIDATES, CHUNK  # noqa: E402
from helios_tools.kernels.speculative import RECORD_FIELDS  # noqa: E402

_DTYPES = {np.dtype(np.float32): tl.float32, np.dtype(np.int32): tl.int32,
           np.dtype(np.uint32): tl.uint32, np.dtype(np.uint16): tl.bfloat16,
           np.dtype(np.uint8): tl.uint8}


class _Arr:
    def __init__(self, a: np.ndarray):
        self.a, self.dtype = a, _DTYPES[a.dtype]

    def data_ptr(self) -> int:
        return self.a.ctypes.data


class _View:  # what capture passes launch_config: a shape and a buffer dtype
    def __init__(self, a: np.ndarray, bf16: bool = False):
        self.shape = a.shape
        self.buffer = types.SimpleNamespace(dtype="bf16" if bf16 else
                                            {"f": "f32", "i": "i32", "u": "u32"}[a.dtype.kind])


def launch(op: str, *args, bf16: tuple[int, ...] = (), rounded: bool = False) -> dict:
    arrays = [a for a in args if isinstance(a, np.ndarray)]
    views = [_View(a, i in bf16) for i, a in enumerate(arrays)]
    cfg = launch_config(op, [a for a in args if not isinstance(a, np.ndarray)], views,
                        rounded=rounded)
    constants = {k: v for k, v in cfg.constants.items() if k not in ("WARPS", "STAGES")}
    TRITON_KERNELS[op][cfg.grid](*[_Arr(a) if isinstance(a, np.ndarray) else a for a in args],
                                 **constants)
    return constants


def _bf16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    b = x.view(np.uint32)
    bits = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32)


def _rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def check_linear(rng) -> bool:
    ok = True
    for wb in (0, 1):
        for T, N, Kd in [(1, 96, 40), (5, 96, 48), (8, 200, 64), (20, 70, 64), (40, 130, 48)]:
            x = (rng.standard_normal((T, Kd)) * 3).astype(np.float32)
            g = (1 + 0.1 * rng.standard_normal(Kd)).astype(np.float32)
            w = (rng.standard_normal((N, Kd)) / np.sqrt(Kd)).astype(np.float32)
            bits, wv = _bf16(w) if wb else (w, w)
            res = rng.standard_normal((T, N)).astype(np.float32)
            ref = np.zeros((T, N), np.float32)
            K.rmsnorm_linear(x, g, wv, ref, T, N, Kd, 1e-5)
            out = np.full((T, N), np.nan, np.float32)
            c = launch("rmsnorm_linear", x, g, bits, out, T, N, Kd, 1e-5, bf16=(2,) if wb else ())
            path = "GEMV" if c["BLOCK_T"] == 1 else "FMA" if c.get("FMA") else "MMA"
            if wb and path == "MMA":
                continue  # not emulated faithfully (see the module docstring)
            errs = {"rmsnorm_linear": _rel(out, ref)}
            ref = res.copy()
            K.linear_add(x, wv, ref, T, N, Kd)
            out = res.copy()
            launch("linear_add", x, bits, out, T, N, Kd, bf16=(1,) if wb else ())
            errs["linear_add"] = _rel(out - res, ref - res)
            if path != "MMA":
                gu = rng.standard_normal((T, 2 * Kd)).astype(np.float32)
                ref = res.copy()
                K.swiglu_linear_add(gu, wv[:, :Kd], ref, T, N, Kd)
                out = res.copy()
                wd = np.ascontiguousarray(bits[:, :Kd])
                launch("swiglu_linear_add", gu, wd, out, T, N, Kd, bf16=(1,) if wb else ())
                errs["swiglu_linear_add"] = _rel(out - res, ref - res)
            good = all(e < 1e-6 for e in errs.values())
            ok &= good
            print(f"{'ok ' if good else 'BAD'} {'bf16' if wb else 'f32 '} T={T:<3} N={N:<4} "
                  f"K={Kd:<3} {path:<4} " + " ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    return ok


# FP8 tile families of bench/gpu_fp8_sweep.py (launch._FP8_TILES cells): (T, N, K, tiles)
# with K steps narrower than K and partial tiles, so each loop and mask runs: the GEMV at
# several rows (one program row per token row), evict-first loads, the prologue pass
# narrower than the product's K step, several row tiles a program (TILES, the last
# partial), MMA tiles with IMPRECISE promotion.
FP8_TILE_CASES = (
    (4, 37, 160, dict(MMA=0, BLOCK_T=1, BLOCK_N=8, BLOCK_K=64, BLOCK_KS=32, WARPS=4,
                      EVICT=1)),
    (1, 70, 96, dict(MMA=0, BLOCK_T=1, BLOCK_N=32, BLOCK_K=32, BLOCK_KS=64, WARPS=2)),
    (3, 37, 96, dict(MMA=0, BLOCK_T=1, BLOCK_N=4, BLOCK_K=32, BLOCK_KS=32, WARPS=2,
                     TILES=4)),
    (9, 70, 160, dict(MMA=1, BLOCK_T=16, BLOCK_N=32, BLOCK_K=64, BLOCK_KS=32, WARPS=4,
                      STAGES=3, IMPRECISE=32, TILES=2)),
    (33, 130, 96, dict(MMA=1, BLOCK_T=32, BLOCK_N=64, BLOCK_K=32, BLOCK_KS=128, WARPS=4,
                       STAGES=2)),
)


def check_fp8(rng) -> bool:
    """The FP8 W8A8 products (kernels_triton/fp8.py: the GEMV at one row, tl.dot on e4m3
    operands above) against kernels.fp8's references, with the interpreter's f32 -> e4m3
    conversion replaced by the exact one (``_fp_to_fp8``). Same codes, different f32
    summation order: 1e-5 relative; tests/gpu/test_fp8.py is the verdict on hardware.
    The default rule's cases, then FP8_TILE_CASES through the swept-tile table."""
    from helios_ignition.capture import launch as L
    from helios_tools.kernels.fp8 import quantize_rows

    ok = True
    cases = [(T, N, Kd, None) for T, N, Kd in
             [(1, 40, 96), (1, 130, 64), (3, 70, 64), (20, 96, 160), (40, 130, 48),
              (1, 33, 100), (5, 40, 100), (70, 24, 256)]]
    # the few-row GEMV (HELIOS_FP8_FEW): its default tiles, K steps narrower than K with
    # a partial last one, a partial token tile (5 of 8 rows), 16 rows
    # (with EARLY: the first K step's codes before the prologue pass, at several rows and
    # at one through the several-row body)
    few = [(T, N, Kd, None, spec) for T, N, Kd, spec in
           [(2, 40, 96, ""), (5, 70, 160, "8,64,4"), (16, 37, 96, "4,32,2"),
            (8, 130, 256, ""), (5, 70, 160, "8,64,4 early"), (1, 130, 64, "early")]]
    few.append((*FP8_TILE_CASES[2], "table early"))  # one row a program, TILES=4
    for T, N, Kd, tiles, spec in [*[(*c, "table") for c in cases],
                                  *[(*c, "table") for c in FP8_TILE_CASES], *few]:
        saved, saved_few, saved_early = L._FP8_TILES, L.FP8_FEW, L.FP8_EARLY
        L.FP8_EARLY = "1" if spec.endswith("early") else "0"
        spec = spec.removesuffix("early").strip()
        L.FP8_FEW = spec or "rows"
        if tiles is not None:
            bucket = next((r for r in L.FP8_ROWS if r >= T), L.FP8_ROWS[-1])
            L._FP8_TILES = {(N, Kd, bucket): tiles}
        x = (rng.standard_normal((T, 2 * Kd)) * 3).astype(np.float32)
        g = (1 + 0.1 * rng.standard_normal(Kd)).astype(np.float32)
        codes, scales = quantize_rows(rng.standard_normal((N, Kd)).astype(np.float32))
        res = rng.standard_normal((T, N)).astype(np.float32)
        xk = np.ascontiguousarray(x[:, :Kd])
        errs = {}
        for op, pre, xin in (("linear_fp8", (), xk), ("linear_add_fp8", (), xk),
                             ("rmsnorm_linear_fp8", (g,), xk), ("swiglu_linear_fp8", (), x),
                             ("swiglu_linear_add_fp8", (), x)):
            tail = (T, N, Kd, 1e-5) if op.startswith("rmsnorm") else (T, N, Kd)
            ref, out = res.copy(), res.copy()
            K.reference_op(op)(xin, *pre, codes, scales, ref, *tail)
            c = launch(op, xin, *pre, codes, scales, out, *tail)
            errs[op] = _rel(out - res, ref - res)
        L._FP8_TILES, L.FP8_FEW, L.FP8_EARLY = saved, saved_few, saved_early
        # The RMS prologue's reciprocal RMS and max are summed in another order than
        # NumPy's (last-bit differences in the scale), which can move one activation
        # across an e4m3 rounding boundary: one code of K flipped is ~1e-3 here.
        good = all(e < (5e-3 if op.startswith("rmsnorm") else 1e-5)
                   for op, e in errs.items())
        ok &= good
        path = ("MMA" if c["MMA"] else "GEMV") + ("*" if tiles is not None else "")
        path += "" if spec == "table" else f" rows{c['BLOCK_T']}"
        path += " early" if c.get("EARLY") else ""
        print(f"{'ok ' if good else 'BAD'} fp8 T={T:<3} N={N:<4} K={Kd:<4} {path:<5} "
              + " ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    return ok


def check_int4(rng) -> bool:
    """The W4A16 products (kernels_triton/int4.py: every INT4 form, the row GEMV and the
    tl.dot tiles from 32 rows) against kernels.int4's references: same dequantized values,
    different f32 summation order (the interpreter's dot is f32; the GPU's is TF32:
    tests/gpu/test_int4.py)."""
    from helios_ignition.capture import launch as L
    from helios_tools.kernels.int4 import INT4_FORMS, quantize_int4

    ok = True
    # (T, N, K, group, HELIOS_INT4_ROWS spec): the v2 rows form by default (partial output
    # and token tiles, 20 rows = two token tiles, K steps of several groups with a partial
    # last one: 9 groups of 64 in steps of 4; one row in the word form and in the byte
    # form), then the v1 row GEMV; from 32 rows the tiles (MMA=2; a partial token tile of
    # 70 rows in 32 x 16 tiles at group 32; the v1 MMA=1 tile)
    for T, N, Kd, group, spec in [
            (1, 40, 256, 128, ""), (1, 130, 512, 128, ""), (3, 70, 1024, 128, ""),
            (2, 33, 96, 32, ""), (8, 48, 256, 128, ""), (20, 37, 576, 64, ""),
            (5, 40, 576, 64, "8,256,2,1,8,256,2"), (1, 24, 576, 64, "8,256,2,0,8,256,2"),
            (1, 24, 576, 64, "8,256,2,1,8,256,2"), (1, 33, 96, 32, ""),
            (1, 40, 256, 128, "v1"), (8, 48, 256, 128, "v1"),
            (32, 70, 256, 128, ""), (40, 130, 192, 64, ""), (64, 64, 128, 128, ""),
            (70, 40, 256, 32, "tile 32,16,4"), (40, 130, 192, 64, "tile v1")]:
        saved = L.INT4_ROWS, L.INT4_TILE
        L.INT4_ROWS = L.INT4_TILE = "v2"
        if spec.startswith("tile "):  # HELIOS_INT4_TILE from 32 rows
            L.INT4_TILE = spec[5:]
        elif spec:
            L.INT4_ROWS = spec
        x = rng.standard_normal((T, 2 * Kd)).astype(np.float32)
        xk = np.ascontiguousarray(x[:, :Kd])
        g = (1 + 0.1 * rng.standard_normal(Kd)).astype(np.float32)
        packed, scales, zeros = quantize_int4(rng.standard_normal((N, Kd)).astype(np.float32),
                                              group)
        res = rng.standard_normal((T, N)).astype(np.float32)
        errs = {}
        for op in INT4_FORMS.values():
            pre, xin = ((g,), xk) if op.startswith("rmsnorm") else ((), x if "swiglu" in op
                                                                    else xk)
            tail = (T, N, Kd, 1e-5) if op.startswith("rmsnorm") else (T, N, Kd)
            ref, out = res.copy(), res.copy()
            K.reference_op(op)(xin, *pre, packed, scales, zeros, ref, *tail)
            c = launch(op, xin, *pre, packed, scales, zeros, out, *tail)
            errs[op] = _rel(out - res, ref - res)
        L.INT4_ROWS, L.INT4_TILE = saved
        good = all(e < 1e-5 for e in errs.values())
        ok &= good
        path = (f"MMA{c['MMA']}" if c["MMA"] else "words" if c.get("WORDS") else
                f"rows{c['BLOCK_T']}" if c.get("ROWS") else "v1")
        print(f"{'ok ' if good else 'BAD'} int4 T={T:<3} N={N:<4} K={Kd:<5} G={group:<4} {path:<6} "
              + " ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    return ok


def repacked_weights(rng, N: int, K: int, group: int, kind: str):
    """Random repacked-GGUF storage of [N, K]: ("int4_min": packed 4-bit codes, f32 scales
    and minimums; "int8": int8 codes as bytes and f32 scales), groups of `group`."""
    from helios_tools.kernels.int4 import pack_int4

    scales = (rng.random((N, K // group)) * 0.02 + 1e-3).astype(np.float32)
    if kind == "int4_min":
        codes = pack_int4(rng.integers(0, 16, (N, K)))
        return codes, scales, (-rng.random((N, K // group)) * 0.1).astype(np.float32)
    return rng.integers(-128, 128, (N, K)).astype(np.int8).view(np.uint8), scales


def _tf32(x: np.ndarray) -> np.ndarray:
    """f32 `x` rounded to TF32 as kernels_triton/int4.py's ``_tf32`` (ties away)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def check_repacked(rng) -> bool:
    """The repacked GGUF products (kernels_triton/int4.py's INT4_MIN kernels,
    kernels_triton/int8.py): every form, the row GEMV and the tl.dot tiles from 32 rows,
    against kernels.int8's references (f32 summation order only differs; the GPU's dot
    is TF32: tests/gpu/test_repacked.py)."""
    from helios_ignition.capture.launch import INT4_MMA_ROWS
    from helios_tools.kernels.int8 import INT4_MIN_FORMS, INT8_FORMS

    ok = True
    for T, N, Kd, group in [(1, 40, 256, 32), (1, 130, 512, 32), (3, 70, 96, 16),
                            (2, 33, 96, 32), (8, 48, 256, 16), (32, 70, 256, 32),
                            (40, 130, 192, 16), (64, 64, 128, 32)]:
        x = rng.standard_normal((T, 2 * Kd)).astype(np.float32)
        xk = np.ascontiguousarray(x[:, :Kd])
        g = (1 + 0.1 * rng.standard_normal(Kd)).astype(np.float32)
        res = rng.standard_normal((T, N)).astype(np.float32)
        for kind, forms in (("int4_min", INT4_MIN_FORMS), ("int8", INT8_FORMS)):
            sides = repacked_weights(rng, N, Kd, group, kind)
            errs, tol = {}, {}
            for op in forms.values():
                if op == "embedding_int8":
                    continue  # check_repacked_embedding
                pre, xin = ((g,), xk) if op.startswith("rmsnorm") else \
                    ((), x if "swiglu" in op else xk)
                tail = (T, N, Kd, 1e-5) if op.startswith("rmsnorm") else (T, N, Kd)
                ref, out = res.copy(), res.copy()
                # The INT4_MIN tile rounds its activations to TF32 before the dot and the
                # minimum's sum: exact against TF32 inputs where no prologue comes first
                tf = kind == "int4_min" and T >= INT4_MMA_ROWS
                K.reference_op(op)(_tf32(xin) if tf and not pre and "swiglu" not in op
                                   else xin, *pre, *sides, ref, *tail)
                c = launch(op, xin, *pre, *sides, out, *tail)
                errs[op] = _rel(out - res, ref - res)
                tol[op] = 2e-3 if tf and (pre or "swiglu" in op) else 1e-5
            good = all(e < tol[op] for op, e in errs.items())
            ok &= good
            path = "MMA" if c["MMA"] else "GEMV"
            print(f"{'ok ' if good else 'BAD'} {kind:<8} T={T:<3} N={N:<4} K={Kd:<5} "
                  f"G={group:<3} {path:<4} " + " ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    return ok


def check_repacked_embedding(rng) -> bool:
    """``embedding_int8`` (kernels_triton/int8.py) against its reference: the same products
    of one code and one scale, so equal bitwise; ids outside the table give zeros."""
    ok = True
    for V, D, G in [(50, 96, 32), (70, 640, 32), (33, 80, 16)]:
        codes, scales = repacked_weights(rng, V, D, G, "int8")
        ids = np.array([3, -1, V - 1, V, 0], np.int32)
        ref = np.full((len(ids), D), 7, np.float32)
        out = ref.copy()
        K.reference_op("embedding_int8")(ids, codes, scales, ref, len(ids), D)
        launch("embedding_int8", ids, codes, scales, out, len(ids), D)
        good = bool(np.array_equal(ref, out))
        ok &= good
        print(f"{'ok ' if good else 'BAD'} embedding_int8 V={V} D={D} G={G}")
    return ok


# GEMV variants (HELIOS_LINEAR_GEMV specs; v1 is check_linear's T = 1): the streamed forms
# with K steps narrow enough for several per row and (SMS patched to 2) fewer programs
# than row tiles, with and without the prefetch; one non-persistent prefetching form.
GEMV_SPECS = ("4,16,4,1,0,0", "4,32,4,1,1,1", "2,16,2,3,1,0", "8,64,4,0,1,0")


def check_gemv(rng) -> bool:
    """The batch-1 GEMV variants on every linear op (plain, folded norm, residual add,
    SwiGLU with and without the add) against the references, bf16 and f32 weights."""
    from helios_ignition.capture import launch as L

    ok, sms, spec0 = True, L.SMS, L.LINEAR_GEMV
    try:
        L.SMS = 2
        for spec in GEMV_SPECS:
            L.LINEAR_GEMV = spec
            for wb in (0, 1):
                for N, Kd in [(37, 100), (130, 64)]:
                    x = (rng.standard_normal((1, 2 * Kd)) * 3).astype(np.float32)
                    g = (1 + 0.1 * rng.standard_normal(Kd)).astype(np.float32)
                    w = (rng.standard_normal((N, Kd)) / np.sqrt(Kd)).astype(np.float32)
                    bits, wv = _bf16(w) if wb else (w, w)
                    res = rng.standard_normal((1, N)).astype(np.float32)
                    xk = np.ascontiguousarray(x[:, :Kd])
                    errs = {}
                    for op, args, ref_fn, xin in (
                            ("linear", (), K.linear, xk),
                            ("rmsnorm_linear", (g,), K.rmsnorm_linear, xk),
                            ("linear_add", (), K.linear_add, xk),
                            ("swiglu_linear", (), K.swiglu_linear, x),
                            ("swiglu_linear_add", (), K.swiglu_linear_add, x)):
                        acc = op.endswith("_add")
                        ref = res.copy() if acc else np.zeros((1, N), np.float32)
                        tail = (1e-5,) if op == "rmsnorm_linear" else ()
                        ref_fn(xin, *args, wv, ref, 1, N, Kd, *tail)
                        out = res.copy() if acc else np.full((1, N), np.nan, np.float32)
                        c = launch(op, xin, *args, bits, out, 1, N, Kd, *tail,
                                   bf16=(1 + len(args),) if wb else ())
                        errs[op] = _rel(out - res, ref - res) if acc else _rel(out, ref)
                    good = all(e < 1e-6 for e in errs.values())
                    ok &= good
                    print(f"{'ok ' if good else 'BAD'} GEMV {spec:<13} {'bf16' if wb else 'f32 '} "
                          f"N={N:<4} K={Kd:<3} BLOCK_K={c['BLOCK_K']:<3} "
                          + " ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    finally:
        L.SMS, L.LINEAR_GEMV = sms, spec0
    return ok


def check_invariant(rng) -> bool:
    """``linear_invariant`` (kernels_triton/invariant.py): every row of a T-row launch is
    bitwise the row launched alone (the decode row), at any T, any place in the launch
    (row groups, permuted rows), under the default GEMV tiles and under narrow K steps
    (several per row) with and without EVICT; and within 1e-6 of the NumPy reference.
    The interpreter reduces with NumPy, so this checks the indexing and masking; the
    device test (tests/gpu/test_speculative.py::test_linear_invariant_rows_are_the_decode_
    rows) checks the compiled reduction order."""
    from helios_ignition.capture import launch as L

    ok, spec0 = True, L.LINEAR_GEMV
    try:
        for spec in ("v2", "4,32,4,0,0,0", "2,16,2,0,0,1"):
            L.LINEAR_GEMV = spec
            for wb in (0, 1):
                for N, Kd in [(37, 100), (130, 64)]:
                    T = 19
                    x = (rng.standard_normal((T, Kd)) * 3).astype(np.float32)
                    w = (rng.standard_normal((N, Kd)) / np.sqrt(Kd)).astype(np.float32)
                    bits, wv = _bf16(w) if wb else (w, w)
                    ref = np.zeros((T, N), np.float32)
                    K.linear_invariant(x, wv, ref, T, N, Kd)
                    alone = np.full((T, N), np.nan, np.float32)
                    for t in range(T):
                        row = np.full((1, N), np.nan, np.float32)
                        c = launch("linear_invariant", np.ascontiguousarray(x[t:t + 1]), bits,
                                   row, 1, N, Kd, bf16=(1,) if wb else ())
                        alone[t] = row[0]
                    same = True
                    for n in (T, 4, 8, 9):
                        perm = rng.permutation(T)[:n]
                        got = np.full((n, N), np.nan, np.float32)
                        launch("linear_invariant", np.ascontiguousarray(x[perm]), bits, got, n,
                               N, Kd, bf16=(1,) if wb else ())
                        same &= np.array_equal(got.view(np.uint32), alone[perm].view(np.uint32))
                    err = _rel(alone, ref)
                    good = same and err < 1e-6
                    ok &= good
                    print(f"{'ok ' if good else 'BAD'} linear_invariant GEMV {spec:<12} "
                          f"{'bf16' if wb else 'f32 '} N={N:<4} K={Kd:<3} BLOCK_K={c['BLOCK_K']:<3}"
                          f" ROWS={c['ROWS']} rows bitwise alone/in T=19,4,8,9 launches: {same}, "
                          f"ref {err:.1e}")
    finally:
        L.LINEAR_GEMV = spec0
    return ok


def _packed_rows(xs, w, rows, N, Kd, S):
    """``linear_packed_rows`` over the packed rows `rows` of `xs`: ``[S, len(rows), N]``."""
    out = np.full((S * len(rows), N), np.nan, np.float32)
    launch("linear_packed_rows", np.ascontiguousarray(xs[rows]), w, out, len(rows), N, Kd, S)
    return out.reshape(S, len(rows), N)


def check_packed_rows(rng) -> bool:
    """``linear_packed_rows`` (HELIOS_LINEAR_INVARIANT=packed; f32 weights, whose IEEE
    dots the interpreter computes as the GPU's f32 path, which checks the token-tile-first
    grid, the packed indexing, the slices and the masks): every row of a T-row launch
    bitwise the row alone, and the reference's values."""
    ok = True
    for T, N, Kd, S in ((40, 200, 1024, 2), (33, 70, 300, 1)):
        x = (rng.standard_normal((T, Kd)) * 3).astype(np.float32)
        xs = np.zeros_like(x)
        K.split_bf16(x, xs, T, Kd)
        w = (rng.standard_normal((N, Kd)) / np.sqrt(Kd)).astype(np.float32)

        alone = np.concatenate([_packed_rows(xs, w, [t], N, Kd, S) for t in range(T)], axis=1)
        same = np.array_equal(_packed_rows(xs, w, list(range(T)), N, Kd, S).view(np.uint32),
                              alone.view(np.uint32))
        ref = np.zeros((S * T, N), np.float32)
        K.linear_packed_rows(xs, w, ref, T, N, Kd, S)
        err = _rel(alone.reshape(S * T, N), ref)
        good = same and err < 1e-6
        ok &= good
        print(f"{'ok ' if good else 'BAD'} linear_packed_rows f32 T={T} N={N} K={Kd} S={S}: "
              f"rows bitwise alone/in one launch: {same}, ref {err:.1e}")
    return ok


def check_sampler(rng, V: int) -> bool:
    R, S = 10, 16
    W, P, KM = K.grammar_mask_words(V), -(-V // CHUNK), CANDIDATES
    logits = (rng.standard_normal((R, V)) * 3).astype(np.float32)
    logits[1, 100:110] = 50.0  # ties at the top, and across a chunk edge
    logits[1, 2047:2050] = 50.0
    logits[4] = np.round(logits[4])
    p = dict(slot=rng.permutation(S)[:R].astype(np.int32),
             positions=rng.integers(0, 5000, R).astype(np.int32),
             sampling_decision=np.ones(R, np.int32),
             seed=rng.integers(0, 2**32, (R, 2), dtype=np.uint64).astype(np.uint32),
             temperature=np.full(R, 0.8, np.float32), top_p=np.full(R, 0.95, np.float32),
             top_k=np.full(R, 50, np.int32), min_p=np.zeros(R, np.float32),
             presence=np.zeros(R, np.float32), frequency=np.zeros(R, np.float32),
             repetition=np.ones(R, np.float32))
    hist = (rng.integers(0, 3, (S, V)) * (rng.random((S, V)) < 0.01)).astype(np.int32)
    bias, ub = np.zeros((S, V), np.float32), np.zeros(R, np.int32)
    mask = rng.integers(-2**31, 2**31, (R, W), dtype=np.int64).astype(np.int32)
    um = np.zeros(R, np.int32)
    p["temperature"][0] = 0.0
    p["top_k"][1], p["top_k"][2], p["min_p"][3] = 3, 0, 0.05
    p["presence"][5], p["frequency"][5], p["repetition"][5] = 0.5, 0.3, 1.3
    um[5] = 1
    p["slot"][6], p["sampling_decision"][7], p["top_k"][8], p["top_k"][9] = -1, 0, 64, 65
    bias[p["slot"][3], rng.choice(V, 300, replace=False)] = rng.uniform(-100, 100, 300)
    ub[3] = 1
    um[4], mask[4] = 1, 0
    mask[4, [0, 3]] = 1
    row = [p[k] for k in ("slot", "positions", "sampling_decision", "seed", "temperature",
                          "top_p", "top_k", "min_p", "presence", "frequency", "repetition")]
    ref_hist, ref = hist.copy(), np.zeros(R, np.int32)
    K.sample_biased(logits, *row, ref_hist, bias, ub, mask, um, ref, R, V, W)
    h = hist.copy()
    chunks = [np.full((R, P), np.nan, np.float32), np.full((R, P), -7, np.int32),
              np.full((R, P * KM), -7, np.int32), np.full((R, P * KM), -7, np.int32)]
    launch("sample_chunks", logits, p["slot"], p["temperature"], p["top_k"], p["presence"],
           p["frequency"], p["repetition"], h, bias, ub, mask, um, *chunks, R, V, W, CHUNK, KM)
    out = np.full(R, -7, np.int32)
    launch("sample_merge", *chunks, *row[:8], h, np.full((R, 2 * KM), -7, np.int32), out, R, V,
           P, KM)
    launch("sample_rest", logits, *row, h, bias, ub, mask, um, out, R, V, W)
    good = np.array_equal(out, ref) and np.array_equal(h, ref_hist)
    print(f"{'ok ' if good else 'BAD'} chunked sampler V={V}: {out.tolist()} "
          f"(sample_biased {ref.tolist()})")
    return good


def check_candidate_masks(rng, V: int) -> bool:
    """spec_candidate_masks (issue 13): per-position grammar masks of copied candidates;
    constrained and free lanes, fresh and stale candidates, NaN-poisoned padding rows."""
    B, CMAX, DMAX, W32 = 6, 3, 3, K.grammar_mask_words(V)
    ok = True
    for trial in range(4):
        qlen = rng.integers(0, 5, B).astype(np.int32)
        P = int(qlen.sum()) + 3
        slot = rng.permutation(16)[:B].astype(np.int32)
        slot[trial % B] = -1
        start = rng.integers(5, 4000, B).astype(np.int32)
        token_row = np.concatenate([np.repeat(np.arange(B), qlen), [-1] * 3]).astype(np.int32)
        positions = np.concatenate([start[b] + np.arange(qlen[b]) for b in range(B)]
                                   + [np.zeros(3, np.int64)]).astype(np.int32)
        logits = (rng.standard_normal((P, V)) * 2).astype(np.float32)
        logits[-3:] = np.nan
        generation = rng.integers(1, 3, B).astype(np.int32)
        args = [slot, start, qlen, (rng.random(B) < 0.7).astype(np.int32),
                rng.integers(-2**31, 2**31, (16, CMAX, W32), dtype=np.int64).astype(np.int32),
                rng.integers(-1, 5, B).astype(np.int32),
                np.where(rng.random(B) < 0.3, generation + 1, generation).astype(np.int32),
                np.where(rng.random(B) < 0.2, start + 1, start).astype(np.int32), generation]
        drafts = rng.integers(0, V, (B, DMAX)).astype(np.int32)
        want_l, want_d = logits.copy(), drafts.copy()
        K.spec_candidate_masks(want_l, token_row, positions, *args, want_d, P, B, V, W32, CMAX,
                               DMAX)
        got_l, got_d = logits.copy(), drafts.copy()
        launch("spec_candidate_masks", got_l, token_row, positions, *args, got_d, P, B, V, W32,
               CMAX, DMAX)
        good = np.array_equal(got_l, want_l, equal_nan=True) and np.array_equal(got_d, want_d)
        ok &= good
        print(f"{'ok ' if good else 'BAD'} spec_candidate_masks V={V} trial {trial}: "
              f"{int(np.isneginf(want_l).sum())} ids masked, drafts {want_d.tolist()}")
    return ok


def check_verify_cut(rng, V: int) -> bool:
    """spec_verify with drafts cut to -1 (never accepted, no q row read), greedy and
    sampled lanes: records, pending tokens, commit rows and histograms as the reference."""
    import helios_ignition.kernels_triton.speculative as spec_kernels

    spec_kernels.RECORD_FIELDS = RECORD_FIELDS  # a constexpr in range() trips the interpreter
    B, W, S = 4, 4, 8
    DMAX, W32 = W - 1, K.grammar_mask_words(V)
    qlen = np.asarray([4, 3, 4, 2], np.int32)
    P = int(qlen.sum())
    off = np.concatenate([[0], np.cumsum(qlen)[:-1]])
    ok = True
    for temperature in (0.0, 0.8):
        logits = (rng.standard_normal((P, V)) * 2).astype(np.float32)
        greedy = logits.argmax(-1)
        drafts = np.stack([np.resize(greedy[off[b]:off[b] + min(qlen[b], DMAX)], DMAX)
                           for b in range(B)]).astype(np.int32)
        drafts[0, 2], drafts[1, 0], drafts[2, 1:] = -1, -1, -1
        q = np.full((B, DMAX, V), 1.0 / V, np.float32)
        f = np.float32
        common = [np.asarray([1, 4, 6, 0], np.int32), np.arange(B, dtype=np.int32) + 3,
                  rng.integers(0, 4000, B).astype(np.int32), qlen, np.ones(B, np.int32),
                  rng.integers(0, 2**32, (B, 2), dtype=np.uint64).astype(np.uint32),
                  np.full(B, temperature, f), np.full(B, 0.9, f), np.zeros(B, np.int32),
                  np.zeros(B, f), np.zeros(B, f), np.zeros(B, f), np.ones(B, f)]
        hist = rng.integers(0, 3, (S, V)).astype(np.int32)
        tail = [np.full((B, W32), -1, np.int32), np.ones(B, np.int32), drafts, q,
                np.arange(V, dtype=np.int32), np.repeat(np.arange(B), qlen).astype(np.int32)]
        pending = rng.integers(0, V, S).astype(np.int32)
        outs = {}
        for who in ("ref", "triton"):
            o = [hist.copy(), pending.copy(), np.full(P, -99, np.int32),
                 np.full((B, RECORD_FIELDS + W), -99, np.int32)]
            fn = K.spec_verify if who == "ref" else (lambda *a: launch("spec_verify", *a))
            fn(logits, *common, o[0], *tail, o[1], o[2], o[3], B, P, V, V, W32, DMAX, W, 0)
            outs[who] = o
        good = all(np.array_equal(a, b) for a, b in zip(outs["ref"], outs["triton"],
                                                         strict=True))
        ok &= good
        rec = outs["ref"][3]
        print(f"{'ok ' if good else 'BAD'} spec_verify with cut drafts T={temperature}: "
              f"accepted {rec[:, 2].tolist()} (triton {outs['triton'][3][:, 2].tolist()})")
    return ok


def check_attention(rng) -> bool:
    """Split-context decode attention layouts (GROUPED 2 and 3, one-tile and walked
    splits, HD 64 and 128, several splits per program, the tuned split count) and the
    one-launch
    ``attention_decode_fused`` against ``attention_decode_split`` /
    ``_merge``'s references: NaN past each row's context, unmapped pages past its last
    page, a padding row, a row at position 0."""
    from helios_ignition.capture import launch as L

    ok = True
    cases = [  # (H, KVH, HD, NS, SPLIT, constants)
        (9, 3, 64, 4, 128, dict(BLOCK_N=64, BLOCK_G=4, GROUPED=2, EVEN_HD=1)),
        (9, 3, 64, 4, 128, dict(BLOCK_N=128, BLOCK_G=4, GROUPED=2, EVEN_HD=1)),
        (9, 3, 64, 4, 128, dict(BLOCK_N=64, BLOCK_G=4, GROUPED=3, EVEN_HD=1)),
        (9, 3, 64, 2, 256, dict(BLOCK_N=32, BLOCK_G=4, GROUPED=3, EVEN_HD=1)),
        (32, 8, 128, 4, 128, dict(BLOCK_N=64, BLOCK_G=4, GROUPED=3, EVEN_HD=1)),
        (32, 8, 128, 8, 64, dict(BLOCK_N=64, BLOCK_G=4, GROUPED=2, EVEN_HD=1)),
        (32, 8, 128, 8, 64, dict(BLOCK_N=64, BLOCK_G=4, GROUPED=2, EVEN_HD=1, SPP=3)),
        (9, 3, 64, 4, 128, dict(BLOCK_N=128, BLOCK_G=4, GROUPED=2, EVEN_HD=1, SPP=4)),
        (6, 2, 40, 4, 128, dict(BLOCK_N=64, BLOCK_G=4, GROUPED=3, EVEN_HD=0)),
        # the live-split layout: programs over live splits only, part_o of empty splits
        # left unwritten (checked on live splits; the merge must not read the rest)
        (32, 8, 128, 8, 64, dict(BLOCK_N=64, BLOCK_G=4, GROUPED=2, EVEN_HD=1, LIVE=3)),
        (9, 3, 64, 8, 64, dict(BLOCK_N=64, BLOCK_G=4, GROUPED=2, EVEN_HD=1, LIVE=1)),
        (9, 3, 64, 8, 64, dict(BLOCK_N=64, BLOCK_G=4, GROUPED=2, EVEN_HD=1, LIVE=8)),
        (6, 2, 40, 4, 64, dict(BLOCK_N=64, BLOCK_G=4, GROUPED=2, EVEN_HD=0, LIVE=2)),
        (32, 8, 128, 4, 128, dict(BLOCK_N=64, BLOCK_G=4, GROUPED=3, EVEN_HD=1, LIVE=3)),
        (6, 2, 40, 4, 128, dict(BLOCK_N=64, BLOCK_G=4, GROUPED=3, EVEN_HD=0, LIVE=1)),
    ]
    PT, B = 16, 4
    for H, KVH, HD, NS, SPLIT, c in cases:
        MP = NS * SPLIT // PT
        S = B + 1
        pages = rng.permutation(S * MP).astype(np.int32).reshape(S, MP)
        kc = rng.standard_normal((S * MP, PT, KVH, HD)).astype(np.float32)
        vc = rng.standard_normal((S * MP, PT, KVH, HD)).astype(np.float32)
        qkv = rng.standard_normal((B, (H + 2 * KVH) * HD)).astype(np.float32)
        slot = rng.permutation(S)[:B].astype(np.int32)
        slot[2] = -1
        pos = rng.integers(0, NS * SPLIT, B).astype(np.int32)
        pos[0], pos[3] = 0, NS * SPLIT - 1
        scale = HD ** -0.5
        ml = np.zeros((B, H, NS, 2), np.float32)
        po = np.zeros((B, H, NS, HD), np.float32)
        K.attention_decode_split(qkv, pos, slot, pages, kc, vc, ml, po, B, MP, PT, H, KVH,
                                 HD, NS, SPLIT, scale)
        ref = np.zeros((B, H * HD), np.float32)
        K.attention_decode_merge(ml, po, slot, ref, B, H, HD, NS)
        kn, vn, pn = kc.copy(), vc.copy(), pages.copy()
        for b in np.flatnonzero(slot >= 0):
            n = int(pos[b]) + 1
            last = (n - 1) // PT
            kn[pn[slot[b], last], (n - 1) % PT + 1:] = np.nan
            vn[pn[slot[b], last], (n - 1) % PT + 1:] = np.nan
            pn[slot[b], last + 1:] = 1 << 30
        for tuned in (0, 2):  # 2: the tuned kernel at half the splits (SPLIT doubled)
            gml, gpo = np.full_like(ml, np.nan), np.full_like(po, np.nan)
            args = [qkv, pos, slot, pn, kn, vn, gml, gpo]
            rml, rpo = ml, po
            if tuned:
                rml, rpo = np.zeros_like(ml), np.zeros_like(po)
                K.attention_decode_split(qkv, pos, slot, pages, kc, vc, rml, rpo, B, MP, PT,
                                         H, KVH, HD, NS, SPLIT * NS // tuned, scale)
                gml[:, :, tuned:] = rml[:, :, tuned:]  # splits past the choice: untouched
                gpo[:, :, tuned:] = rpo[:, :, tuned:]
                args.append(np.array([tuned], np.int32))
            op = "attention_decode_split_tuned" if tuned else "attention_decode_split"
            if tuned and (c.get("SPP", 1) > 1 or c.get("LIVE")):  # (the tuned kernel has
                continue                                             # neither)
            grid = (B, KVH, c.get("LIVE") or -(-NS // c.get("SPP", 1)))
            TRITON_KERNELS[op][grid](*[_Arr(a) for a in args], B, MP, PT, H, KVH, HD, NS,
                                     SPLIT, scale, BLOCK_HD=L._np2(HD, 16), **c)
            out = np.full_like(ref, np.nan)
            mc = {k: v for k, v in L.attention_merge_constants(HD, NS, "v2").items()
                  if k != "WARPS"}
            if HD != L._np2(HD, 16):
                mc["EVEN_HD"] = 0
            TRITON_KERNELS["attention_decode_merge"][(B, H)](
                _Arr(gml), _Arr(gpo), _Arr(slot), _Arr(out), B, H, HD, NS, **mc)
            want = np.zeros_like(ref)
            K.attention_decode_merge(rml, rpo, slot, want, B, H, HD, NS)
            written = np.ones(rml.shape[:3], bool)  # [B, H, NS]: part_o written
            if c.get("LIVE"):
                written = (slot >= 0)[:, None, None] & (rml[..., 1] != 0)
                # statistics of a padding row's splits: unwritten (the merge skips it)
                gml[slot < 0], gpo[~written] = rml[slot < 0], rpo[~written]
            errs = (_rel(gml[..., 1], rml[..., 1]), _rel(gml[..., 0], rml[..., 0]),
                    _rel(gpo, rpo), _rel(out, want))
            good = bool(np.isfinite(gpo).all() and np.isfinite(out).all()
                        and max(errs) < 1e-5 and (tuned or _rel(out, ref) < 1e-5))
            ok &= good
            print(f"{'ok ' if good else 'BAD'} attention_decode_split{'_tuned' if tuned else ''}"
                  f" H={H} KVH={KVH} HD={HD} NS={NS} SPLIT={SPLIT} {c}: rel "
                  f"{max(errs):.1e}")
        if (c["BLOCK_N"] == 128 and HD == 64) or c.get("SPP", 1) > 1 or c.get("LIVE"):
            continue
        # The one-launch form at the same partition (its launch rule's constants: one tile
        # per split where SPLIT <= BLOCK_N, else the walk), with rows of one split
        # (pos[0] = 0) and of several.
        arrivals = np.zeros((B, KVH), np.int32)
        got = _Interpreted().run("attention_decode_fused", qkv, pos, slot, pn, kn, vn, ml, po,
                                 arrivals, np.zeros_like(ref), B, MP, PT, H, KVH, HD, NS,
                                 SPLIT, scale)
        err = _rel(got["out"], ref)
        good = bool(np.isfinite(got["out"]).all() and err < 1e-5
                    and (got["arrivals"] == 0).all())
        ok &= good
        print(f"{'ok ' if good else 'BAD'} attention_decode_fused H={H} KVH={KVH} HD={HD} "
              f"NS={NS} SPLIT={SPLIT}: rel {err:.1e}, counters {got['arrivals'].sum()}")
    return ok


def _split_f64(qkv, pos, slot, pages, kf, vf, B, MP, PT, H, KVH, HD, NS, SPLIT, scale):
    """Split-decode statistics in float64 (``attention_decode_split``'s contract: max, sum
    of exponentials and the unnormalized output per (row, head, split); an empty split
    (-1e30, 0, 0)) over f32 key/value planes `kf`, `vf`, and the merged output: the
    float64 evaluation the tensor-core body's error is measured against."""
    G = H // KVH
    ml = np.zeros((B, H, NS, 2))
    ml[..., 0] = -1.0e30
    po = np.zeros((B, H, NS, HD))
    out = np.zeros((B, H, HD))
    q = qkv[:, :H * HD].astype(np.float64).reshape(B, H, HD) * np.float64(np.float32(scale))
    for b in np.flatnonzero(slot >= 0):
        ctx = int(pos[b]) + 1
        j = np.arange(ctx)
        rows = pages[slot[b], j // PT].astype(np.int64) * PT + j % PT
        k = kf.reshape(-1, KVH, HD)[rows].astype(np.float64)  # [ctx, KVH, HD]
        v = vf.reshape(-1, KVH, HD)[rows].astype(np.float64)
        sc = np.einsum("hd,jhd->hj", q[b], np.repeat(k, G, axis=1))
        vv = np.repeat(v, G, axis=1)
        for sp in range(-(-ctx // SPLIT)):
            lo, hi = sp * SPLIT, min(sp * SPLIT + SPLIT, ctx)
            m = sc[:, lo:hi].max(axis=1)
            p = np.exp(sc[:, lo:hi] - m[:, None])
            ml[b, :, sp] = np.stack([m, p.sum(axis=1)], axis=1)
            po[b, :, sp] = np.einsum("hj,jhd->hd", p, vv[lo:hi])
        m = sc.max(axis=1)
        p = np.exp(sc - m[:, None])
        out[b] = np.einsum("hj,jhd->hd", p, vv) / p.sum(axis=1)[:, None]
    return ml, po, out.reshape(B, H * HD)


def _bf16_split_merge(inputs, args, consts):
    """``attention_decode_split_bf16kv`` with variant `consts` (grid by their LIVE), then
    ``attention_decode_merge``, interpreted over `inputs` (qkv, positions, slot, page
    table, k and v planes as bf16 bits) and scalars `args` (B .. scale), outputs poisoned:
    ``(part_ml, part_o, out)``."""
    from helios_ignition.capture import launch as L

    B, _, _, H, KVH, HD, NS = args[:7]
    bhd = L._np2(HD, 16)
    gml = np.full((B, H, NS, 2), np.nan, np.float32)
    gpo = np.full((B, H, NS, HD), np.nan, np.float32)
    TRITON_KERNELS["attention_decode_split_bf16kv"][(B, KVH, consts.get("LIVE") or NS)](
        *[_Arr(a) for a in (*inputs, gml, gpo)], *args, BLOCK_HD=bhd,
        EVEN_HD=int(HD == bhd), **consts)
    mc = {k: v for k, v in L.attention_merge_constants(HD, NS, "v3").items() if k != "WARPS"}
    out = np.full((B, H * HD), np.nan, np.float32)
    TRITON_KERNELS["attention_decode_merge"][(B, H)](_Arr(gml), _Arr(gpo), _Arr(inputs[2]),
                                                     _Arr(out), B, H, HD, NS, **mc)
    return gml, gpo, out


def check_attention_mma(rng) -> bool:
    """The tensor-core decode body (GROUPED=4, ``_split_mma_at``) over bf16 planes, bf16
    dots widened exactly (``_bf16_dots``: the stock interpreter multiplies bf16 operands as
    their uint16 bits), at the 8B geometry (H 32, KVH 8, HD 128: G = 4 padded to 16 MMA
    rows), SmolLM2's (H 9, KVH 3, HD 64: G = 3) and HD 40 (masked head dims): one-tile and
    multi-tile splits, BLOCK_N 32 / 64 / 128, the live-split and the NS grids, TERMS 1 and
    2; a padding row, a row at position 0, a row at the last position, empty splits; NaN
    bits past each row's context and unmapped pages past its last page; poisoned outputs.
    Against (a) the float64 evaluation (``_split_f64``): the merged output's max |error|
    over max |output|, the split maxima's max |error| (logit units), the sums' and split
    outputs' max relative errors; (b) the f32 reference of ``attention_decode_split_bf16kv``
    (NumPy) and (c) the f32 FMA body (GROUPED=2 or 3, interpreted, same planes): max abs
    error of the merged output. Bound: (a)'s errors within ``launch.ATTN_MMA_BOUND`` of
    the TERMS; empty splits exactly (-1e30, 0) (and zeros in the NS grid). Then the
    launch rule's constants (HELIOS_ATTN_MMA=2, bf16 planes) through ``launch``; f32
    planes keeping the FMA body; e4m3 planes refused."""
    from helios_ignition.capture import launch as L
    from helios_tools.kernels.kv_bf16 import decode_bf16, encode_bf16

    dot = _bf16_dots()
    ok = True
    worst = {1: 0.0, 2: 0.0}
    try:
        PT, B = 16, 4
        cases = [  # (H, KVH, HD, NS, SPLIT, constants)
            (32, 8, 128, 8, 64, dict(BLOCK_N=64, LIVE=3)),
            (32, 8, 128, 8, 64, dict(BLOCK_N=64, LIVE=0)),
            (32, 8, 128, 8, 64, dict(BLOCK_N=32, LIVE=2)),
            (32, 8, 128, 4, 128, dict(BLOCK_N=128, LIVE=1)),
            (32, 8, 128, 4, 128, dict(BLOCK_N=64, LIVE=4)),
            (9, 3, 64, 8, 64, dict(BLOCK_N=64, LIVE=3)),
            (9, 3, 64, 8, 64, dict(BLOCK_N=32, LIVE=0)),
            (9, 3, 64, 4, 128, dict(BLOCK_N=128, LIVE=2)),
            (9, 3, 64, 4, 128, dict(BLOCK_N=32, LIVE=8)),
            (6, 2, 40, 4, 64, dict(BLOCK_N=64, LIVE=2)),
            (6, 2, 40, 2, 128, dict(BLOCK_N=32, LIVE=0)),
        ]
        for H, KVH, HD, NS, SPLIT, c in cases:
            MP = NS * SPLIT // PT
            S = B + 1
            pages = rng.permutation(S * MP).astype(np.int32).reshape(S, MP)
            kc = encode_bf16(rng.standard_normal((S * MP, PT, KVH, HD)) * 2)
            vc = encode_bf16(rng.standard_normal((S * MP, PT, KVH, HD)) * 2)
            qkv = rng.standard_normal((B, (H + 2 * KVH) * HD)).astype(np.float32)
            slot = rng.permutation(S)[:B].astype(np.int32)
            slot[2] = -1
            pos = rng.integers(0, NS * SPLIT // 2, B).astype(np.int32)  # empty splits
            pos[0], pos[3] = 0, NS * SPLIT - 1
            scale = HD ** -0.5
            kn, vn, pn = kc.copy(), vc.copy(), pages.copy()
            for b in np.flatnonzero(slot >= 0):
                n = int(pos[b]) + 1
                last = (n - 1) // PT
                kn[pn[slot[b], last], (n - 1) % PT + 1:] = 0x7FC0
                vn[pn[slot[b], last], (n - 1) % PT + 1:] = 0x7FC0
                pn[slot[b], last + 1:] = 1 << 30
            args = (B, MP, PT, H, KVH, HD, NS, SPLIT, scale)
            xml, xpo, xout = _split_f64(qkv, pos, slot, pages, decode_bf16(kc), decode_bf16(vc),
                                        *args)
            rml = np.zeros((B, H, NS, 2), np.float32)
            rpo = np.zeros((B, H, NS, HD), np.float32)
            K.reference_op("attention_decode_split_bf16kv")(qkv, pos, slot, pages, kc, vc, rml,
                                                            rpo, *args)
            inputs = (qkv, pos, slot, pn, kn, vn)
            ref = np.zeros((B, H * HD), np.float32)
            K.attention_decode_merge(rml, rpo, slot, ref, B, H, HD, NS)
            bn_fma = min(SPLIT, 64)
            _, _, fma = _bf16_split_merge(inputs, args, dict(
                BLOCK_N=bn_fma, BLOCK_G=L._np2(H // KVH), GROUPED=2 if bn_fma == SPLIT else 3))
            live = slot >= 0
            written = live[:, None, None] & (xml[..., 1] != 0)
            empty = live[:, None, None] & (xml[..., 1] == 0)
            scale_o = np.abs(xout).max()
            f32_own = max(float(np.abs(ref - xout).max() / scale_o),
                          float(np.abs(rml[..., 0][written] - xml[..., 0][written]).max()))
            for terms in (2, 1):
                gml, gpo, out = _bf16_split_merge(inputs, args, dict(
                    c, GROUPED=4, TERMS=terms, BLOCK_G=L._np2(H // KVH, 16)))
                finite = bool(np.isfinite(out).all() and np.isfinite(gml[live]).all()
                              and np.isfinite(gpo[written]).all())
                errs = {
                    "out": np.abs(out - xout).max() / scale_o,
                    "max": np.abs(gml[..., 0][written] - xml[..., 0][written]).max(),
                    "sum": (np.abs(gml[..., 1][written] - xml[..., 1][written])
                            / xml[..., 1][written]).max(),
                    "o": (np.abs(gpo[written] - xpo[written]).max()
                          / np.abs(xpo[written]).max()),
                } if finite else {"out": np.inf}
                # empty splits of live rows: (-1e30, 0); their outputs zeros in the NS grid
                # (the live layout leaves them unwritten: the merge skips them)
                exact = bool(np.array_equal(gml[empty], xml[empty].astype(np.float32))
                             and (c["LIVE"] or (gpo[empty] == 0).all()))
                vs_f32 = float(np.abs(out - ref).max())
                vs_fma = float(np.abs(out - fma).max())
                worst[terms] = max(worst[terms], max(errs.values()))
                good = finite and exact and max(errs.values()) < L.ATTN_MMA_BOUND[terms]
                ok &= good
                print(f"{'ok ' if good else 'BAD'} GROUPED=4 TERMS={terms} H={H} KVH={KVH} "
                      f"HD={HD} NS={NS} SPLIT={SPLIT} {c}: vs f64 "
                      + " ".join(f"{k} {e:.1e}" for k, e in errs.items())
                      + f"; max abs vs f32 ref {vs_f32:.1e}, vs FMA body {vs_fma:.1e} "
                        f"(|ref| <= {scale_o:.2f}; the f32 reference's own out/max error "
                        f"{f32_own:.1e}); empty splits "
                      + ("exact" if exact else "WRONG"))
        # the launch rule, opted in: the constants it picks, through launch_config
        H, KVH, HD, NS, SPLIT, MP = 9, 3, 64, 8, 64, 32
        saved = L.ATTN_MMA
        try:
            L.ATTN_MMA = "2"
            pages = rng.permutation(5 * MP).astype(np.int32).reshape(5, MP)
            kc = encode_bf16(rng.standard_normal((5 * MP, PT, KVH, HD)))
            vc = encode_bf16(rng.standard_normal((5 * MP, PT, KVH, HD)))
            qkv = rng.standard_normal((B, (H + 2 * KVH) * HD)).astype(np.float32)
            slot = np.array([0, 3, -1, 1], np.int32)
            pos = np.array([0, 300, 5, 511], np.int32)
            args = (B, MP, PT, H, KVH, HD, NS, SPLIT, HD ** -0.5)
            xml, _, xout = _split_f64(qkv, pos, slot, pages, decode_bf16(kc), decode_bf16(vc),
                                      *args)
            gml = np.full((B, H, NS, 2), np.nan, np.float32)
            gpo = np.full((B, H, NS, HD), np.nan, np.float32)
            got = launch("attention_decode_split_bf16kv", qkv, pos, slot, pages, kc, vc, gml,
                         gpo, *args, bf16=(4, 5))
            out = np.full((B, H * HD), np.nan, np.float32)
            launch("attention_decode_merge", gml, gpo, slot, out, B, H, HD, NS)
            err = float(np.abs(out - xout).max() / np.abs(xout).max())
            good = (got["GROUPED"] == 4 and got["TERMS"] == 2 and got["BLOCK_G"] == 16
                    and np.isfinite(out).all() and err < L.ATTN_MMA_BOUND[2])
            # f32 planes (what capture records before the bf16 rewrite): the FMA body
            f32 = launch("attention_decode_split", qkv, pos, slot, pages, decode_bf16(kc),
                         decode_bf16(vc), gml, gpo, *args)
            good &= f32["GROUPED"] == 2 and "TERMS" not in f32
            try:
                L.launch_config("attention_decode_split_fp8kv", list(args))
                refused = "not refused"
            except ValueError as exc:
                refused = str(exc)
            good &= "bf16 KV planes only, not e4m3 planes" in refused
            ok &= good
            print(f"{'ok ' if good else 'BAD'} HELIOS_ATTN_MMA=2 rule: {got}: vs f64 out "
                  f"{err:.1e}; f32 planes: GROUPED={f32['GROUPED']}; e4m3 planes: {refused}")
        finally:
            L.ATTN_MMA = saved
    finally:
        interp.InterpreterBuilder.create_dot = dot
    print(f"GROUPED=4 worst error vs float64 over the cases: TERMS=2 {worst[2]:.1e}, "
          f"TERMS=1 {worst[1]:.1e}")
    return ok


class _Interpreted:
    """The GPU tests' ``gpu`` fixture, launching under the interpreter: outputs poisoned,
    every buffer returned by name (tests/gpu/gpu_harness.py Gpu.run)."""

    def run(self, op: str, *args) -> dict[str, np.ndarray]:
        params = K.kernel_params(op)
        arrs = []
        for spec, a in zip(params, args, strict=True):
            if spec.kind == "buffer":
                a = np.ascontiguousarray(a).copy()
                if spec.direction == "out":
                    a[...] = np.nan if a.dtype.kind == "f" else -7777
            arrs.append(a)
        launch(op, *arrs)
        return {s.name: a for s, a in zip(params, arrs, strict=True) if s.kind == "buffer"}


def check_speculative() -> bool:
    """The coupled-verification kernel tests of tests/gpu/test_speculative.py (V = 49152),
    with the interpreter as the device (about 3 minutes: the sampled verify's bisections)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from tests.gpu import test_speculative as t

    cases = [("test_copy_drafts", ()), ("test_draft_sample_coupled", (512, 49152)),
             ("test_draft_sample_coupled", (8192, 49152)),
             ("test_spec_verify_coupled", (0.0,)), ("test_spec_verify_coupled", (0.8,))]
    ok = True
    for i, (name, extra) in enumerate(cases):
        try:
            getattr(t, name)(_Interpreted(), np.random.default_rng(100 + i), *extra)
            print(f"ok  {name}{list(extra) or ''}")
        except AssertionError as exc:
            ok = False
            print(f"BAD {name}{list(extra) or ''}: {str(exc).splitlines()[0][:200]}")
    return ok


def check_nucleus(full: bool) -> bool:
    """The nucleus-sampler tests of tests/gpu/test_sampling_chunks.py (top-p rows with
    no top-k resolved in sample_merge_nucleus, or left to sample_rest) with the
    interpreter as the device; `full` adds V = 128256 and the 64-row batch test."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from tests.gpu import test_sampling_chunks as t

    cases = [("test_nucleus_sampler_matches_sample_biased", (5000,)),
             ("test_nucleus_sampler_matches_sample_biased", (49152,)),
             ("test_nucleus_fallback_at_the_candidate_bound", ())]
    if full:
        cases += [("test_nucleus_sampler_matches_sample_biased", (128256,)),
                  ("test_nucleus_sampler_seeded_and_batch_independent", ())]
    ok = True
    for i, (name, extra) in enumerate(cases):
        try:
            getattr(t, name)(_Interpreted(), np.random.default_rng(200 + i), *extra)
            print(f"ok  {name}{list(extra) or ''}")
        except AssertionError as exc:
            ok = False
            print(f"BAD {name}{list(extra) or ''}: {str(exc).splitlines()[0][:200]}")
    return ok


def check_wide(full: bool) -> bool:
    """The wide-sampler tests of tests/gpu/test_sampling_chunks.py (rows with no top-k
    raced over their chunks: sample_chunks_wide -> sample_merge_nucleus -> sample_race /
    sample_pick at two levels -> sample_rest) with the interpreter as the device; `full`
    adds V = 128256 and the 64-row batch test."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from tests.gpu import test_sampling_chunks as t

    cases = [("test_wide_sampler_matches_sample_biased", (5000,)),
             ("test_wide_sampler_matches_sample_biased", (49152,)),
             ("test_wide_sampler_flat_rows_and_ties", ())]
    if full:
        cases += [("test_wide_sampler_matches_sample_biased", (128256,)),
                  ("test_wide_sampler_seeded_and_batch_independent", ())]
    ok = True
    for i, (name, extra) in enumerate(cases):
        try:
            getattr(t, name)(_Interpreted(), np.random.default_rng(300 + i), *extra)
            print(f"ok  {name}{list(extra) or ''}")
        except AssertionError as exc:
            ok = False
            print(f"BAD {name}{list(extra) or ''}: {str(exc).splitlines()[0][:300]}")
    return ok


def check_race(full: bool) -> bool:
    """The candidate-race tests of tests/gpu/test_sampling_chunks.py (sample_chunks_mass
    -> sample_merge -> sample_race_top -> sample_race_mass -> sample_race_pick) with the
    interpreter as the device; `full` adds V = 128256 and the 64-row batch test."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from tests.gpu import test_sampling_chunks as t

    cases = [("test_race_sampler_matches_sample_biased", (5000,)),
             ("test_race_sampler_matches_sample_biased", (49152,)),
             ("test_race_sampler_flat_rows_ties_and_fallback", ())]
    if full:
        cases += [("test_race_sampler_matches_sample_biased", (128256,)),
                  ("test_race_sampler_seeded_and_batch_independent", ())]
    ok = True
    for i, (name, extra) in enumerate(cases):
        try:
            getattr(t, name)(_Interpreted(), np.random.default_rng(400 + i), *extra)
            print(f"ok  {name}{list(extra) or ''}")
        except AssertionError as exc:
            ok = False
            print(f"BAD {name}{list(extra) or ''}: {str(exc).splitlines()[0][:300]}")
    return ok


def check_mma(rng) -> bool:
    """The batched-decode GEMM ops (kernels_triton/mma.py): split_bf16 and
    swiglu_split_bf16 bitwise, linear_packed / linear_partial (f32 weights: IEEE dots of
    the widened terms, which checks the packed indexing, the K slices and the masks; and
    bf16 weights) under the launch rule and other tiles, splitk_reduce[_add] bitwise."""
    from helios_tools.kernels.linear_splitk import unpack_terms

    ok = True
    for T, N, Kd, S in ((8, 200, 384, 3), (5, 130, 1000, 2), (40, 96, 512, 1), (3, 64, 40, 1)):
        x = (rng.standard_normal((T, Kd)) * 3).astype(np.float32)
        xs_ref = np.zeros_like(x)
        K.split_bf16(x, xs_ref, T, Kd)
        xs = np.full_like(x, np.nan)
        launch("split_bf16", x, xs, T, Kd)
        gu = (rng.standard_normal((T, 2 * Kd)) * 3).astype(np.float32)
        sw_ref, sw = np.zeros_like(x), np.full_like(x, np.nan)
        K.swiglu_split_bf16(gu, sw_ref, T, Kd)
        launch("swiglu_split_bf16", gu, sw, T, Kd)
        # The interpreter truncates f32 -> bf16 (the GPU rounds to nearest even, as the
        # reference; tests/gpu checks that bitwise): here the terms' sum must keep x.
        errs = {"split": _rel(unpack_terms(xs, T, Kd), x),
                "swiglu_split": _rel(unpack_terms(sw, T, Kd), unpack_terms(sw_ref, T, Kd))}
        w = (rng.standard_normal((N, Kd)) / np.sqrt(Kd)).astype(np.float32)
        bits, wv = _bf16(w)
        for op, xin in (("linear_packed", xs_ref), ("linear_partial", x)):
            for wb in (False,):  # bf16 dots are not emulated (see the module docstring)
                ref = np.zeros((S * T, N), np.float32)
                getattr(K, op)(xin, wv, ref, T, N, Kd, S)
                out = np.full_like(ref, np.nan)
                launch(op, xin, bits if wb else wv, out, T, N, Kd, S, bf16=(1,) if wb else ())
                errs[f"{op}{'_bf16' if wb else ''}"] = _rel(out, ref)
        tiles = dict(BLOCK_T=16, BLOCK_N=64, BLOCK_K=128, WBF16=0, K16=int(Kd % 16 == 0),
                     PACKED=1, EVEN_K=int(Kd % 128 == 0))
        ref = np.zeros((S * T, N), np.float32)
        K.linear_packed(xs_ref, wv, ref, T, N, Kd, S)
        out = np.full_like(ref, np.nan)
        TRITON_KERNELS["linear_packed"][(-(-N // 64), -(-T // 16), S)](
            _Arr(xs_ref), _Arr(wv), _Arr(out), T, N, Kd, S, **tiles)
        errs["packed_T16_N64_K128"] = _rel(out, ref)
        red_ref, red = np.zeros((T, N), np.float32), np.full((T, N), np.nan, np.float32)
        K.splitk_reduce(ref, red_ref, T, N, S)
        launch("splitk_reduce", ref, red, T, N, S)
        res = rng.standard_normal((T, N)).astype(np.float32)
        add_ref, add = res.copy(), res.copy()
        K.splitk_reduce_add(ref, add_ref, T, N, S)
        launch("splitk_reduce_add", ref, add, T, N, S)
        errs["reduce"] = int(not np.array_equal(red.view(np.uint32), red_ref.view(np.uint32)))
        errs["reduce_add"] = int(not np.array_equal(add.view(np.uint32), add_ref.view(np.uint32)))
        bad = {k: v for k, v in errs.items() if not v < (5e-5 if "split" in k else 1e-6)}
        print(f"mma T={T} N={N} K={Kd} S={S}: " + " ".join(f"{k} {v:.1e}" for k, v in errs.items())
              + ("" if not bad else f"  MISMATCH {sorted(bad)}"))
        ok &= not bad
    return ok


def _bf16_dots():
    """The interpreter's dot multiplies bf16 operands as their uint16 bits; this wraps it
    to widen them to f32 first (exact: a bf16 x bf16 product fits f32), so bf16
    tensor-core tiles can be checked. Returns the original, to restore."""
    dot = interp.InterpreterBuilder.create_dot

    def widened(self, a, b, d, input_precision, max_num_imprecise_acc):
        def f32(h):
            if h.dtype.scalar != tl.bfloat16:
                return h
            return interp.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32),
                                       tl.float32)
        return dot(self, f32(a), f32(b), d, input_precision, max_num_imprecise_acc)

    interp.InterpreterBuilder.create_dot = widened
    return dot


def check_decode_tc(rng) -> bool:
    """Decode buckets on linear_packed's TC=1 tile (issue 27, ``launch.decode_tc``), bf16
    weights with bf16 dots widened (``_bf16_dots``): the launch rule's tile (threshold
    rule, the N floor lowered so small matrices take it) at ragged and whole buckets, and
    every DECODE_TILES candidate on one cell, both activation forms, poisoned outputs:
    hi/lo against ``linear`` (near f32), hi only against the product of the activations
    rounded to bf16."""
    from helios_ignition.capture import launch as rule

    dot = _bf16_dots()
    saved = rule.DECODE_TC, rule.PREFILL_TC_MIN_N
    rule.DECODE_TC, rule.PREFILL_TC_MIN_N = "8", 0
    ok = True
    try:
        cases = [(T, N, Kd, None) for T, N, Kd in ((96, 320, 256), (100, 192, 128),
                                                   (256, 130, 192))]
        cases += [(160, 320, 128, tile) for tile in rule.DECODE_TILES]
        for T, N, Kd, tile in cases:
            x = (rng.standard_normal((T, Kd)) * 3).astype(np.float32)
            xs, xr = np.zeros_like(x), np.zeros_like(x)
            K.split_bf16(x, xs, T, Kd)
            K.round_bf16(x, xr, T, Kd)  # a bf16-activation core's input: hi | 0
            bits, wv = _bf16((rng.standard_normal((N, Kd)) / np.sqrt(Kd)).astype(np.float32))
            ref = np.zeros((T, N), np.float32)
            K.linear(x, wv, ref, T, N, Kd)
            ref_b = np.zeros((T, N), np.float32)
            K.linear(_bf16(x)[1], wv, ref_b, T, N, Kd)
            errs = {}
            for xsplit in (1, 0):
                out = np.full((T, N), np.nan, np.float32)
                xin = xs if xsplit else xr
                if tile is None:
                    c = launch("linear_packed", xin, bits, out, T, N, Kd, 1, bf16=(1,),
                               rounded=not xsplit)
                else:
                    bt, bn, bk, _, _ = tile
                    c = dict(TC=1, BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk, GROUP_T=8,
                             XSPLIT=xsplit, EVEN_K=1, WBF16=1, K16=1, PACKED=1)
                    TRITON_KERNELS["linear_packed"][(-(-T // bt) * -(-N // bn), 1, 1)](
                        _Arr(xin), _Arr(bits), _Arr(out), T, N, Kd, 1, **c)
                assert c["TC"] == 1 and c["XSPLIT"] == xsplit
                errs["hilo" if xsplit else "hi"] = (
                    _rel(out, ref if xsplit else ref_b) if np.isfinite(out).all() else np.inf)
            bad = {k: v for k, v in errs.items() if not v < 5e-5}
            print(f"{'ok ' if not bad else 'BAD'} decode TC T={T} N={N} K={Kd} tile "
                  f"{c['BLOCK_T']}x{c['BLOCK_N']}x{c['BLOCK_K']}: "
                  + " ".join(f"{k} {v:.1e}" for k, v in errs.items()))
            ok &= not bad
    finally:
        rule.DECODE_TC, rule.PREFILL_TC_MIN_N = saved
        interp.InterpreterBuilder.create_dot = dot
    return ok


def check_bf16_activations(rng) -> bool:
    """bf16 activations (``round_bf16`` / ``swiglu_round_bf16`` and ``linear_packed``
    ``XSPLIT=0``): the producers write zeros for every lo term and hi within the
    interpreter's bf16 conversion (it truncates; the GPU rounds to nearest even, which
    tests/gpu/test_bf16_activations.py checks bitwise); linear_packed over the reference's
    ``hi | 0`` under the launch rule's ``rounded`` constants, on the K split (f32 weights:
    IEEE dots; bf16 weights: dots widened) and the TC=1 tile (the N floor lowered), equal
    to ``XSPLIT=1`` over the same buffer bit for bit and to the reference within 1e-6."""
    from helios_ignition.capture import launch as rule
    from helios_tools.kernels.linear_splitk import unpack_terms

    ok = True
    for T, Kd in ((5, 1000), (8, 384), (3, 40)):
        x = (rng.standard_normal((T, Kd)) * 3).astype(np.float32)
        gu = (rng.standard_normal((T, 2 * Kd)) * 3).astype(np.float32)
        errs = {}
        for op, xin in (("round_bf16", x), ("swiglu_round_bf16", gu)):
            ref, out = np.zeros_like(x), np.full_like(x, np.nan)
            getattr(K, op)(xin, ref, T, Kd)
            c = launch(op, xin, out, T, Kd)
            assert c["LO"] == 0
            bits = out.view(np.uint16).reshape(T, 2 * Kd)
            errs[f"{op}_lo"] = int(bits[:, Kd:].any())
            errs[op] = _rel(unpack_terms(out, T, Kd), unpack_terms(ref, T, Kd))
        bad = {k: v for k, v in errs.items() if not v < (1 if k.endswith("_lo") else 2 ** -7)}
        print(f"{'ok ' if not bad else 'BAD'} round T={T} K={Kd}: "
              + " ".join(f"{k} {v:.1e}" for k, v in errs.items()))
        ok &= not bad
    dot = _bf16_dots()
    saved = rule.DECODE_TC, rule.PREFILL_TC_MIN_N
    rule.DECODE_TC, rule.PREFILL_TC_MIN_N = "96", 0
    try:
        for T, N, Kd, S, wb in ((8, 200, 384, 3, False), (5, 130, 1000, 2, True),
                                (40, 96, 512, 1, True), (96, 320, 256, 1, True),
                                (300, 192, 128, 1, True)):
            x = (rng.standard_normal((T, Kd)) * 3).astype(np.float32)
            xr = np.zeros_like(x)
            K.round_bf16(x, xr, T, Kd)
            bits, wv = _bf16((rng.standard_normal((N, Kd)) / np.sqrt(Kd)).astype(np.float32))
            ref = np.zeros((S * T, N), np.float32)
            K.linear_packed(xr, wv, ref, T, N, Kd, S)
            outs = {}
            for rounded in (True, False):
                out = np.full_like(ref, np.nan)
                c = launch("linear_packed", xr, bits if wb else wv, out, T, N, Kd, S,
                           bf16=(1,) if wb else (), rounded=rounded)
                assert c.get("XSPLIT", 1) == int(not rounded)
                outs[rounded] = out
            same = np.array_equal(outs[True].view(np.uint32), outs[False].view(np.uint32))
            err = _rel(outs[True], ref) if np.isfinite(outs[True]).all() else np.inf
            good = same and err < 1e-6
            print(f"{'ok ' if good else 'BAD'} one term T={T} N={N} K={Kd} S={S} "
                  f"{'TC' if c.get('TC') else 'K split'} {'bf16' if wb else 'f32'} weights: "
                  f"rel {err:.1e}, XSPLIT=0 {'==' if same else '!='} XSPLIT=1")
            ok &= good
    finally:
        rule.DECODE_TC, rule.PREFILL_TC_MIN_N = saved
        interp.InterpreterBuilder.create_dot = dot
    return ok


def check_scores(rng, V: int) -> bool:
    """score_tokens (SCORED_PREFILL's log-softmax gather of the targets) against its NumPy
    reference: tokens with target -1 stay poisoned, a tie at the top keeps ids ascending."""
    T, TOP = 7, 20
    logits = (rng.standard_normal((T, V)) * 4).astype(np.float32)
    logits[3, 10:40] = 30.0
    targets = rng.integers(0, V, T).astype(np.int32)
    targets[[1, 6]] = -1
    ref = np.full((T, 1 + TOP), np.nan, np.float32)
    ref_ids = np.full((T, TOP), -7, np.int32)
    K.score_tokens(logits, targets, ref, ref_ids, T, V, TOP)
    got = np.full((T, 1 + TOP), np.nan, np.float32)
    ids = np.full((T, TOP), -7, np.int32)
    launch("score_tokens", logits, targets, got, ids, T, V, TOP)
    ok = (np.array_equal(ids, ref_ids) and np.array_equal(np.isnan(got), np.isnan(ref))
          and bool(np.nanmax(np.abs(got - ref)) < 2e-5) and ids[3].tolist() == list(range(10, 30)))
    print(f"score_tokens V={V}: {'ok' if ok else 'MISMATCH'} "
          f"(max |err| {float(np.nanmax(np.abs(got - ref))):.2e})")
    return ok


def check_experts(rng) -> bool:
    """``qk_rmsnorm`` and the MoE chain (route -> align -> gate_up -> down -> sum) against
    the references, f32 weights (the interpreter's bf16 dots are not faithful), for
    decode-sized and prefill-sized row counts, with idle expert blocks and padded rows."""
    ok = True
    for T, H, KVH, HD in [(5, 4, 2, 32), (3, 6, 2, 24)]:
        qkv = rng.standard_normal((T, (H + 2 * KVH) * HD)).astype(np.float32) * 3
        gq, gk = (1 + 0.1 * rng.standard_normal((2, HD))).astype(np.float32)
        ref, out = qkv.copy(), qkv.copy()
        K.qk_rmsnorm(ref, gq, gk, T, H, KVH, HD, 1e-6)
        launch("qk_rmsnorm", out, gq, gk, T, H, KVH, HD, 1e-6)
        err = _rel(out, ref)
        good = err < 1e-6 and np.array_equal(out[:, (H + KVH) * HD:], qkv[:, (H + KVH) * HD:])
        ok &= good
        print(f"{'ok ' if good else 'BAD'} qk_rmsnorm T={T} H={H} KVH={KVH} HD={HD} {err:.1e}")
    for T, E, Kt, D, F, norm in [(1, 8, 2, 64, 32, 1), (7, 8, 2, 64, 32, 1), (19, 8, 2, 48, 40, 0),
                                 (3, 128, 8, 32, 16, 1), (40, 12, 3, 64, 32, 1)]:
        BT = 16
        NB = K.moe_blocks(T, E, Kt, BT)
        logits = rng.standard_normal((T, E)).astype(np.float32) * 2
        ids_r, w_r = np.zeros((T, Kt), np.int32), np.zeros((T, Kt), np.float32)
        K.moe_route(logits, ids_r, w_r, T, E, Kt, norm)
        ids, w = np.full((T, Kt), -7, np.int32), np.full((T, Kt), np.nan, np.float32)
        launch("moe_route", logits, ids, w, T, E, Kt, norm)
        errs = {"route_ids": float(np.any(ids != ids_r)), "route_w": _rel(w, w_r)}
        sp_r, be_r = np.zeros(NB * BT, np.int32), np.zeros(NB, np.int32)
        K.moe_align(ids_r, sp_r, be_r, T, E, Kt, BT, NB)
        sp, be = np.full(NB * BT, -9, np.int32), np.full(NB, -9, np.int32)
        launch("moe_align", ids_r, sp, be, T, E, Kt, BT, NB)
        errs["align"] = float(np.any(sp != sp_r) or np.any(be != be_r))
        x = rng.standard_normal((T, D)).astype(np.float32)
        wgu = (rng.standard_normal((E, 2 * F, D)) / np.sqrt(D)).astype(np.float32)
        wd = (rng.standard_normal((E, D, F)) / np.sqrt(F)).astype(np.float32)
        act_r = np.zeros((T * Kt, F), np.float32)
        K.moe_gate_up(x, sp_r, be_r, wgu, act_r, T, D, F, Kt, BT, NB)
        act = np.full((T * Kt, F), np.nan, np.float32)
        launch("moe_gate_up", x, sp_r, be_r, wgu, act, T, D, F, Kt, BT, NB)
        errs["gate_up"] = _rel(act, act_r)
        po_r = np.zeros((T * Kt, D), np.float32)
        K.moe_down(act_r, sp_r, be_r, wd, w_r, po_r, T, D, F, Kt, BT, NB)
        po = np.full((T * Kt, D), np.nan, np.float32)
        launch("moe_down", act_r, sp_r, be_r, wd, w_r, po, T, D, F, Kt, BT, NB)
        errs["down"] = _rel(po, po_r)
        y_r = np.zeros((T, D), np.float32)
        K.moe_sum(po_r, y_r, T, D, Kt)
        y = np.full((T, D), np.nan, np.float32)
        launch("moe_sum", po_r, y, T, D, Kt)
        errs["sum"] = float(np.any(y != y_r))
        good = all(v < 1e-6 for v in errs.values())
        ok &= good
        print(f"{'ok ' if good else 'BAD'} moe T={T:<3} E={E:<3} K={Kt} D={D} F={F} norm={norm} "
              f"blocks {int((be_r >= 0).sum())}/{NB} "
              + " ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    return ok


def check_window(rng) -> bool:
    """The sliding-window family's kernels (kernels_triton/window.py): windowed prefill and
    decode attention with the pages behind every window NaN and their page-table entries
    pointing at a NaN page, head_rmsnorm, gelu_mul, scale."""
    ok = True
    PT, MP, P, H, KVH, HD = 4, 8, 40, 4, 2, 16
    width = (H + 2 * KVH) * HD
    # W = 0: the unwindowed ops, whose bodies the window kernels share (attention.py).
    for W, lengths in ((0, [9, 3]), (1, [9, 3]), (5, [17, 6, 11]), (8, [30, 2]),
                       (64, [13, 7])):
        decode_op, prefill_op = (("attention_decode", "attention_prefill") if W == 0 else
                                 ("attention_decode_window", "attention_prefill_window"))
        window = (W,) if W else ()
        k_cache = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
        v_cache = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
        k_cache[P - 1] = v_cache[P - 1] = np.nan  # never owned
        table = np.full((len(lengths), MP), P - 1, np.int32)
        pages = rng.permutation(P - 1)
        for r, n in enumerate(lengths):
            table[r, :-(-n // PT)] = pages[r * MP:r * MP + -(-n // PT)]
        B = len(lengths)
        pos = np.array([n - 1 for n in lengths], np.int32)
        for r, n in enumerate(lengths):  # pages behind the prefill chunk's first window go
            for j in range(max(0, n - 3 - W + 1) // PT if W else 0):
                k_cache[table[r, j]] = v_cache[table[r, j]] = np.nan
                table[r, j] = P - 1
        qkv = rng.standard_normal((B, width)).astype(np.float32)
        slot = np.arange(B, dtype=np.int32)
        ref = np.zeros((B, H * HD), np.float32)
        getattr(K, decode_op)(qkv, pos, slot, table, k_cache, v_cache, ref, B, MP, PT, H, KVH,
                              HD, *window, HD**-0.5)
        out = np.full_like(ref, np.nan)
        launch(decode_op, qkv, pos, slot, table, k_cache, v_cache, out, B, MP, PT, H, KVH, HD,
               *window, HD**-0.5)
        errs = {"decode": _rel(out, ref)}
        # prefill: the last 3 tokens of each row as one packed chunk plus a padding token
        rows = np.array([r for r, n in enumerate(lengths) for _ in range(min(3, n))] + [-1],
                        np.int32)
        ppos = np.array([p for n in lengths for p in range(max(0, n - 3), n)] + [0], np.int32)
        T = len(rows)
        pq = rng.standard_normal((T, width)).astype(np.float32)
        ref = np.zeros((T, H * HD), np.float32)
        getattr(K, prefill_op)(pq, ppos, rows, slot, table, k_cache, v_cache, ref, T, B, MP,
                               PT, H, KVH, HD, *window, HD**-0.5)
        out = np.full_like(ref, np.nan)
        launch(prefill_op, pq, ppos, rows, slot, table, k_cache, v_cache, out, T, B, MP, PT, H,
               KVH, HD, *window, HD**-0.5)
        errs["prefill"] = _rel(out, ref)
        bad = {k: e for k, e in errs.items() if not e < 1e-5}
        print(f"window W={W} lengths={lengths}: " + ", ".join(f"{k} {e:.1e}"
                                                               for k, e in errs.items())
              + ("  MISMATCH" if bad else ""))
        ok &= not bad
    T = 5
    x = rng.standard_normal((T, width)).astype(np.float32) * 3
    qw, kw = (rng.standard_normal(HD).astype(np.float32) for _ in range(2))
    ref, out = x.copy(), x.copy()
    K.head_rmsnorm(ref, qw, kw, T, H, KVH, HD, 1e-6)
    launch("head_rmsnorm", out, qw, kw, T, H, KVH, HD, 1e-6)
    gu = (rng.standard_normal((T, 2 * 1100)) * 4).astype(np.float32)
    gref, gout = np.zeros((T, 1100), np.float32), np.full((T, 1100), np.nan, np.float32)
    K.gelu_mul(gu, gref, T, 1100)
    launch("gelu_mul", gu, gout, T, 1100)
    sref, sout = x.copy(), x.copy()
    K.scale(sref, T, width, 25.3)
    launch("scale", sout, T, width, 25.3)
    errs = {"head_rmsnorm": _rel(out, ref), "gelu_mul": _rel(gout, gref),
            "scale": _rel(sout, sref)}
    bad = {k: e for k, e in errs.items() if not e < 1e-6}
    print("window elementwise: " + ", ".join(f"{k} {e:.1e}" for k, e in errs.items())
          + ("  MISMATCH" if bad else ""))
    return ok and not bad


def check_kv(rng, kind: str) -> bool:
    """The stored KV cache forms of `kind` against their references: "fp8", e4m3 codes with
    per-head scales after the planes (kernels_triton/kv_fp8.py against kernels/kv_fp8.py),
    or "bf16", the f32 entry points over bf16 planes (kernels_triton/kv_bf16.py against
    kernels/kv_bf16.py). The writes element for element (``kv_write_<kind>kv``,
    ``rope_kv_write_<kind>kv``: values past +-448 times the scale saturating to e4m3, exact
    ties rounding to even in bf16), ``row_copy_<kind>kv`` element for element, and every
    reader over random planes (prefill, windowed prefill and decode, split decode in each
    GROUPED layout and the live-split layout, merged, tuned, fused) with NaN elements past
    each row's context and unmapped pages past its last page."""
    from helios_ignition.capture import launch as L
    from helios_tools.kernels.kv_bf16 import encode_bf16
    from helios_tools.kernels.kv_fp8 import quantize_kv

    form = f"_{kind}kv"
    encode = quantize_kv if kind == "fp8" else (lambda x, scale: encode_bf16(x))
    nan = {"fp8": 0x7F, "bf16": 0x7FC0}[kind]  # the e4m3 NaN code, a quiet bf16 NaN
    ok = True
    PT, B = 16, 4
    for H, KVH, HD, NS, SPLIT in ((9, 3, 64, 4, 64), (32, 8, 128, 4, 64), (6, 2, 40, 2, 128)):
        MP = NS * SPLIT // PT
        S = B + 1
        P = S * MP
        width = (H + 2 * KVH) * HD
        # e4m3's per-head k and v scales, passed after the planes (bf16 planes have none)
        scales = tuple((0.02 + rng.random(KVH)).astype(np.float32) for _ in "kv") \
            if kind == "fp8" else ()
        ks, vs = scales or (None, None)
        pages = rng.permutation(P).astype(np.int32).reshape(S, MP)
        kc = encode(rng.standard_normal((P, PT, KVH, HD)) * 3, ks)
        vc = encode(rng.standard_normal((P, PT, KVH, HD)) * 3, vs)
        # the writes: T tokens of 3 rows (one padding token), some values beyond 448 * scale,
        # exact ties (low 16 bits 0x8000) in both parities: rounding to even is visible
        T = 7
        qkv = (rng.standard_normal((T, width)) * 40).astype(np.float32)
        ties = qkv.view(np.uint32)
        ties[:, H * HD::7] = (ties[:, H * HD::7] & 0xFFFF0000) | 0x8000
        trow = np.array([0, 0, 1, -1, 2, 2, 2], np.int32)
        wslot = np.array([3, 0, 4], np.int32)
        wpos = np.array([5, 6, 0, 0, 17, 18, 19], np.int32)
        inv = (1.0 / 10000 ** (np.arange(HD // 2) / (HD // 2))).astype(np.float32)
        errs = {}
        for op, extra in (("kv_write" + form, ()), ("rope_kv_write" + form, (inv,))):
            rk, rv, rq = kc.copy(), vc.copy(), qkv.copy()
            K.reference_op(op)(rq, wpos, *extra, trow, wslot, pages, rk, rv, *scales, T, 3, MP,
                               PT, H, KVH, HD)
            got = _Interpreted().run(op, qkv, wpos, *extra, trow, wslot, pages, kc, vc,
                                     *scales, T, 3, MP, PT, H, KVH, HD)
            errs[op] = int((got["k_cache"] != rk).sum() + (got["v_cache"] != rv).sum())
            errs[op + " qkv"] = _rel(got["qkv"], rq)
        rows = np.array([2, -1, 0, 7], np.int32)
        dst = np.array([1, 0, -1, 3], np.int32)
        plane = kc.reshape(P, -1)
        rdst = encode(rng.standard_normal(kc.shape), ks).reshape(P, -1)
        ref = rdst.copy()
        K.reference_op("row_copy" + form)(plane, ref, rows, dst, 4, plane.shape[1])
        got = _Interpreted().run("row_copy" + form, plane, rdst, rows, dst, 4, plane.shape[1])
        errs["row_copy"] = int((got["dst"] != ref).sum())
        # the readers
        qd = rng.standard_normal((B, width)).astype(np.float32)
        slot = rng.permutation(S)[:B].astype(np.int32)
        slot[2] = -1
        pos = rng.integers(0, NS * SPLIT, B).astype(np.int32)
        pos[0], pos[3] = 0, NS * SPLIT - 1
        kn, vn, pn = kc.copy(), vc.copy(), pages.copy()
        for b in np.flatnonzero(slot >= 0):
            n = int(pos[b]) + 1
            last = (n - 1) // PT
            kn[pn[slot[b], last], (n - 1) % PT + 1:] = nan
            vn[pn[slot[b], last], (n - 1) % PT + 1:] = nan
            pn[slot[b], last + 1:] = 1 << 30
        scale = HD ** -0.5
        ml = np.zeros((B, H, NS, 2), np.float32)
        po = np.zeros((B, H, NS, HD), np.float32)
        K.reference_op("attention_decode_split" + form)(qd, pos, slot, pages, kc, vc, *scales,
                                                        ml, po, B, MP, PT, H, KVH, HD, NS,
                                                        SPLIT, scale)
        ref = np.zeros((B, H * HD), np.float32)
        K.attention_decode_merge(ml, po, slot, ref, B, H, HD, NS)
        even = int(HD == L._np2(HD, 16))
        layouts = [dict(BLOCK_N=64, BLOCK_G=4, GROUPED=2, EVEN_HD=even),
                   dict(BLOCK_N=32, BLOCK_G=4, GROUPED=3, EVEN_HD=even),
                   dict(BLOCK_N=32, BLOCK_G=4, GROUPED=1),
                   dict(BLOCK_N=32, GROUPED=0, BLOCK_G=1),
                   # the live-split layout (_split_fma_live): programs over live splits
                   # only, part_o of empty splits and a padding row's statistics unwritten
                   dict(BLOCK_N=64, BLOCK_G=4, GROUPED=2, EVEN_HD=even, LIVE=3),
                   dict(BLOCK_N=32, BLOCK_G=4, GROUPED=3, EVEN_HD=even, LIVE=1)]
        for c in layouts:
            gml, gpo = np.full_like(ml, np.nan), np.full_like(po, np.nan)
            grid = (B, KVH if c["GROUPED"] else H, c.get("LIVE") or NS)
            TRITON_KERNELS["attention_decode_split" + form][grid](
                *[_Arr(a) for a in (qd, pos, slot, pn, kn, vn, *scales, gml, gpo)], B, MP, PT,
                H, KVH, HD, NS, SPLIT, scale, BLOCK_HD=L._np2(HD, 16), **c)
            if c["GROUPED"] == 1:
                continue  # (tl.dot tiles: the interpreter's f32 dot is not 3xTF32's; GPU only)
            name = f"split G{c['GROUPED']}"
            if c.get("LIVE"):
                name += f" LIVE={c['LIVE']}"
                written = (slot >= 0)[:, None, None] & (ml[..., 1] != 0)
                gml[slot < 0], gpo[~written] = ml[slot < 0], po[~written]
                out = np.full_like(ref, np.nan)
                mc = {k: v for k, v in L.attention_merge_constants(HD, NS, "v2").items()
                      if k != "WARPS"}
                mc["EVEN_HD"] = even
                TRITON_KERNELS["attention_decode_merge"][(B, H)](
                    _Arr(gml), _Arr(gpo), _Arr(slot), _Arr(out), B, H, HD, NS, **mc)
                errs[name + " merged"] = (_rel(out, ref) if np.isfinite(out).all()
                                          else np.inf)
            errs[name] = (max(_rel(gml[..., 1], ml[..., 1]), _rel(gpo, po))
                          if np.isfinite(gpo).all() else np.inf)
        tml, tpo = np.zeros_like(ml), np.zeros_like(po)
        K.reference_op("attention_decode_split_tuned" + form)(
            qd, pos, slot, pages, kc, vc, *scales, tml, tpo, np.array([2], np.int32), B, MP,
            PT, H, KVH, HD, NS, SPLIT, scale)
        got = _Interpreted().run("attention_decode_split_tuned" + form, qd, pos, slot, pn, kn,
                                 vn, *scales, ml, po, np.array([2], np.int32), B, MP, PT, H,
                                 KVH, HD, NS, SPLIT, scale)
        errs["split tuned"] = _rel(got["part_o"][:, :, :2], tpo[:, :, :2])
        got = _Interpreted().run("attention_decode_fused" + form, qd, pos, slot, pn, kn, vn,
                                 *scales, ml, po, np.zeros((B, KVH), np.int32),
                                 np.zeros_like(ref), B, MP, PT, H, KVH, HD, NS, SPLIT, scale)
        errs["fused"] = _rel(got["out"], ref) if np.isfinite(got["out"]).all() else np.inf
        # windowed decode (one body with attention_decode) and prefill over the same planes
        W = 20
        wref = np.zeros((B, H * HD), np.float32)
        K.reference_op("attention_decode_window" + form)(qd, pos, slot, pages, kc, vc, *scales,
                                                         wref, B, MP, PT, H, KVH, HD, W, scale)
        got = _Interpreted().run("attention_decode_window" + form, qd, pos, slot, pn, kn, vn,
                                 *scales, wref, B, MP, PT, H, KVH, HD, W, scale)
        errs["decode window"] = _rel(got["out"], wref)
        prow = np.array([0, -1, -1, 1, -1, 3, 3], np.int32)  # padding inside the chunk
        ppos = np.array([int(pos[0]), 0, 0, int(pos[1]), 0, int(pos[3]) - 1, int(pos[3])],
                        np.int32)
        Tp = len(prow)
        pq = rng.standard_normal((Tp, width)).astype(np.float32)
        for op, wa in (("attention_prefill" + form, ()),
                       ("attention_prefill_window" + form, (W,))):
            pref = np.zeros((Tp, H * HD), np.float32)
            K.reference_op(op)(pq, ppos, prow, slot, pages, kc, vc, *scales, pref, Tp, B, MP,
                               PT, H, KVH, HD, *wa, scale)
            got = _Interpreted().run(op, pq, ppos, prow, slot, pn, kn, vn, *scales, pref, Tp, B,
                                     MP, PT, H, KVH, HD, *wa, scale)
            errs[op.replace("attention_", "").replace(form, "")] = (
                _rel(got["out"], pref) if np.isfinite(got["out"]).all() else np.inf)
        bad = {k: e for k, e in errs.items() if not e < (1e-5 if isinstance(e, float) else 1)}
        print(f"{'ok ' if not bad else 'BAD'} kv {kind} H={H} KVH={KVH} HD={HD} NS={NS} "
              f"SPLIT={SPLIT}: " + ", ".join(f"{k} {e:.1e}" if isinstance(e, float) else
                                             f"{k} {e} differ" for k, e in errs.items()))
        ok &= not bad
    return ok


def check_mixed(rng) -> bool:
    """A MIXED program's packed rows (issue 27): one-token decode lanes at long positions
    beside prefill chunks that start mid-context, then padding rows and tokens, through
    ``attention_prefill`` and ``gather_last`` against their references; and each lane's
    attention equals what ``attention_decode`` gives that row alone."""
    ok = True
    PT, MP, P, H, KVH, HD = 4, 16, 80, 4, 2, 16
    width = (H + 2 * KVH) * HD
    # (context before the step, tokens this step): lanes of 1 token, then chunks
    rows_spec = [(37, 1), (5, 1), (60, 1), (0, 9), (22, 6), (13, 1)]
    k_cache = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    v_cache = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    R = len(rows_spec) + 2  # two padding rows
    table = np.zeros((R, MP), np.int32)
    pages, used = rng.permutation(P), 0
    for r, (ctx, n) in enumerate(rows_spec):
        need = -(-(ctx + n) // PT)
        table[r, :need] = pages[used:used + need]
        used += need
    slot = np.array(list(range(len(rows_spec))) + [-1, -1], np.int32)
    token_row = np.array([r for r, (_, n) in enumerate(rows_spec) for _ in range(n)]
                         + [-1] * 3, np.int32)
    positions = np.array([p for ctx, n in rows_spec for p in range(ctx, ctx + n)] + [0] * 3,
                         np.int32)
    T = len(token_row)
    q = rng.standard_normal((T, width)).astype(np.float32)
    ref = np.zeros((T, H * HD), np.float32)
    K.attention_prefill(q, positions, token_row, slot, table, k_cache, v_cache, ref, T, R, MP,
                        PT, H, KVH, HD, HD**-0.5)
    out = np.full_like(ref, np.nan)
    launch("attention_prefill", q, positions, token_row, slot, table, k_cache, v_cache, out, T,
           R, MP, PT, H, KVH, HD, HD**-0.5)
    errs = {"prefill attention": _rel(out, ref)}
    lanes = [i for i, (_, n) in enumerate(rows_spec) if n == 1]
    at = np.cumsum([0] + [n for _, n in rows_spec])[lanes]
    dec = np.zeros((len(lanes), H * HD), np.float32)
    K.attention_decode(q[at], positions[at], slot[lanes], table, k_cache, v_cache, dec,
                       len(lanes), MP, PT, H, KVH, HD, HD**-0.5)
    errs["lanes vs decode"] = _rel(out[at], dec)
    lengths = np.array([n for _, n in rows_spec] + [0, 0], np.int32)
    x = rng.standard_normal((T, 24)).astype(np.float32)
    gref = np.zeros((R, 24), np.float32)
    K.gather_last(x, lengths, gref, T, R, 24)
    gout = np.full_like(gref, np.nan)
    launch("gather_last", x, lengths, gout, T, R, 24)
    errs["gather_last"] = _rel(gout, gref)
    bad = {k: e for k, e in errs.items() if not e < 1e-5}
    print("mixed rows: " + ", ".join(f"{k} {e:.1e}" for k, e in errs.items())
          + ("  MISMATCH" if bad else ""))
    ok &= not bad
    return ok


def _prefill_f64(q, pos, token_row, slot, table, kf, vf, T, PT, H, KVH, HD, W, scale):
    """Packed-token attention in float64 over f32 key/value planes `kf`, `vf`
    (``attention_prefill``'s contract: a token of row ``r`` at position ``p`` sees positions
    ``max(0, p - W + 1)..p`` of its row, all of ``0..p`` for W = 0; padding tokens and
    rows zeros): what the tensor-core lanes' error is measured against."""
    G = H // KVH
    out = np.zeros((T, H * HD))
    for t in range(T):
        r = int(token_row[t])
        if r < 0 or slot[r] < 0:
            continue
        p = int(pos[t])
        j = np.arange(max(0, p - W + 1) if W else 0, p + 1)
        rows = table[slot[r], j // PT].astype(np.int64) * PT + j % PT
        k = np.repeat(kf.reshape(-1, KVH, HD)[rows].astype(np.float64), G, axis=1)
        v = np.repeat(vf.reshape(-1, KVH, HD)[rows].astype(np.float64), G, axis=1)
        qt = q[t, :H * HD].astype(np.float64).reshape(H, HD) * np.float64(np.float32(scale))
        sc = np.einsum("hd,jhd->hj", qt, k)
        e = np.exp(sc - sc.max(axis=1, keepdims=True))
        out[t] = (np.einsum("hj,jhd->hd", e, v) / e.sum(axis=1)[:, None]).reshape(-1)
    return out


def check_mixed_mma(rng) -> bool:
    """A MIXED step's decode lanes on the tensor cores (``_prefill_lane`` with LANE_TERMS,
    HELIOS_ATTN_MMA=2 and 1) beside prefill chunks in one ``attention_prefill_bf16kv`` /
    ``attention_prefill_window_bf16kv`` launch through the launch rule, bf16 dots widened
    exactly (``_bf16_dots``), at the 8B geometry (H 32, KVH 8, HD 128: G = 4 padded to 16
    MMA rows), SmolLM2's (9, 3, 64: G = 3) and HD 40 (masked head dims), without a window
    and with windows of 24 and 100 positions. Rows: five lanes (positions 0, 37, 300, 129,
    64: one to ten 32-position tiles, not tile-aligned) with a padding row's token among
    them (slot -1: not a lane), two chunks starting mid-context, a single-token row after
    them (a block program's, not a lane), three padding tokens; NaN bits past each row's
    last position and behind the first window of its first token, unmapped pages past its
    last page and wholly behind that window; outputs poisoned. Against (a) the float64
    evaluation (``_prefill_f64``): the lanes' max abs error over their max |output| within
    ``launch.ATTN_MMA_BOUND[terms]``; (b) the knob off (the FMA lanes): every other token
    bitwise equal (the block programs do not depend on LANE_TERMS), padding tokens zeros
    in every launch, and the whole output within 1e-5 of the f32 NumPy reference; the
    recorded constants (``BLOCK_G`` 16, ``LANE_TERMS``, ``EVEN_HD``) and, knob off, none
    of them."""
    from helios_ignition.capture import launch as L
    from helios_tools.kernels.kv_bf16 import decode_bf16, encode_bf16

    dot = _bf16_dots()
    saved = L.ATTN_MMA
    ok = True
    worst = {1: 0.0, 2: 0.0}
    PT, MP = 16, 32
    # (context before the step, tokens this step); row 2 is padding (slot -1)
    spec = [(0, 1), (37, 1), (50, 1), (300, 1), (129, 1), (64, 1), (70, 20), (5, 40), (13, 1)]
    lanes = np.array([0, 1, 3, 4, 5])  # the live leading single-token rows' tokens
    try:
        for H, KVH, HD, windows in ((32, 8, 128, (0, 24)), (9, 3, 64, (0, 24, 100)),
                                    (6, 2, 40, (0, 100))):
            for W in windows:
                R = len(spec)
                S = R + 1
                table = rng.permutation(S * MP).astype(np.int32).reshape(S, MP)
                kc = encode_bf16(rng.standard_normal((S * MP, PT, KVH, HD)) * 2)
                vc = encode_bf16(rng.standard_normal((S * MP, PT, KVH, HD)) * 2)
                slot = rng.permutation(S)[:R].astype(np.int32)
                slot[2] = -1
                trow = np.array([r for r, (_, n) in enumerate(spec) for _ in range(n)]
                                + [-1] * 3, np.int32)
                pos = np.array([p for c, n in spec for p in range(c, c + n)] + [0] * 3,
                               np.int32)
                T = len(trow)
                kn, vn, tn = kc.copy(), vc.copy(), table.copy()
                for r, (c, n) in enumerate(spec):
                    if slot[r] < 0:
                        continue
                    end = c + n - 1
                    kn[tn[slot[r], end // PT], end % PT + 1:] = 0x7FC0
                    vn[tn[slot[r], end // PT], end % PT + 1:] = 0x7FC0
                    tn[slot[r], end // PT + 1:] = 1 << 30
                    for j in range(max(0, c - W + 1) // PT if W else 0):
                        kn[tn[slot[r], j]] = vn[tn[slot[r], j]] = 0x7FC0
                        tn[slot[r], j] = 1 << 30
                q = rng.standard_normal((T, (H + 2 * KVH) * HD)).astype(np.float32)
                scale = HD ** -0.5
                op = "attention_prefill_window_bf16kv" if W else "attention_prefill_bf16kv"
                args = (T, R, MP, PT, H, KVH, HD, *((W,) if W else ()), scale)
                ref = np.zeros((T, H * HD), np.float32)
                K.reference_op(op)(q, pos, trow, slot, table, kc, vc, ref, *args)
                x = _prefill_f64(q, pos, trow, slot, table, decode_bf16(kc), decode_bf16(vc),
                                 T, PT, H, KVH, HD, W, scale)
                outs, consts = {}, {}
                for mode in ("off", "2", "1"):
                    L.ATTN_MMA = mode
                    outs[mode] = np.full((T, H * HD), np.nan, np.float32)
                    consts[mode] = launch(op, q, pos, trow, slot, tn, kn, vn, outs[mode], *args,
                                          bf16=(5, 6))
                off = outs["off"]
                pad = (trow < 0) | (slot[trow] < 0)
                zeros = all((o[pad] == 0).all() for o in outs.values())
                scale_o = np.abs(x[lanes]).max()
                fma = float(np.abs(off[lanes] - x[lanes]).max() / scale_o)
                good_off = (zeros and np.isfinite(off).all() and _rel(off, ref) < 1e-5
                            and "LANE_TERMS" not in consts["off"]
                            and consts["off"]["BLOCK_G"] == L._np2(H // KVH))
                ok &= good_off
                for terms in (2, 1):
                    out, c = outs[str(terms)], consts[str(terms)]
                    rest = np.ones(T, bool)
                    rest[lanes] = False
                    err = (float(np.abs(out[lanes] - x[lanes]).max() / scale_o)
                           if np.isfinite(out).all() else np.inf)
                    same = np.array_equal(out[rest], off[rest])
                    want = dict(BLOCK_G=16, LANE_TERMS=terms, EVEN_HD=int(HD in (64, 128)))
                    good = (err < L.ATTN_MMA_BOUND[terms] and same and good_off
                            and all(c.get(k) == v for k, v in want.items()))
                    worst[terms] = max(worst[terms], err)
                    ok &= good
                    print(f"{'ok ' if good else 'BAD'} MIXED lanes LANE_TERMS={terms} H={H} "
                          f"KVH={KVH} HD={HD} W={W}: lanes vs f64 {err:.1e} (bound "
                          f"{L.ATTN_MMA_BOUND[terms]:.0e}; FMA lanes {fma:.1e}), max abs vs "
                          f"FMA lanes {float(np.abs(out[lanes] - off[lanes]).max()):.1e}; "
                          f"other tokens {'bitwise the FMA launch' if same else 'DIFFER'}; "
                          f"knob off vs f32 ref {_rel(off, ref):.1e}; padding tokens "
                          f"{'zeros' if zeros else 'NOT ZERO'}; {c}")
    finally:
        L.ATTN_MMA = saved
        interp.InterpreterBuilder.create_dot = dot
    print(f"MIXED tensor-core lanes, worst error vs float64: LANE_TERMS=2 {worst[2]:.1e}, "
          f"LANE_TERMS=1 {worst[1]:.1e}")
    return ok

def check_vision(rng) -> bool:
    """The vision tower's kernels (kernels_triton/vision.py) against their references,
    with fewer live windows than captured (dead rows zero) and bf16 positions."""
    ok = True
    W, S, P, D, H, HD, R = 3, 8, 2, 12, 3, 4, 2
    G, NP = S // P, (S // P) ** 2
    T = W * NP
    count = np.array([2], np.int32)
    windows = rng.standard_normal((W, 3, S, S)).astype(np.float32)
    errs = {}
    ref, out = np.zeros((T, 3 * P * P), np.float32), np.full((T, 3 * P * P), np.nan, np.float32)
    K.patchify(windows, count, ref, W, S, P)
    launch("patchify", windows, count, out, W, S, P)
    errs["patchify"] = _rel(out, ref)
    x = rng.standard_normal((T, D)).astype(np.float32)
    bits, pos = _bf16(rng.standard_normal((NP, D)).astype(np.float32))
    ref, out = x.copy(), x.copy()
    K.position_add(ref, pos, T, NP, D)
    launch("position_add", out, bits, T, NP, D, bf16=(1,))
    errs["position_add"] = _rel(out, ref)
    g, b = rng.standard_normal(D).astype(np.float32), rng.standard_normal(D).astype(np.float32)
    ref, out = np.zeros_like(x), np.full_like(x, np.nan)
    K.layernorm(x, g, b, ref, T, D, 1e-6)
    launch("layernorm", x, g, b, out, T, D, 1e-6)
    errs["layernorm"] = _rel(out, ref)
    ref, out = x.copy(), x.copy()
    K.bias_add(ref, b, T, D)
    launch("bias_add", out, b, T, D)
    errs["bias_add"] = _rel(out, ref)
    big = (x * 4).astype(np.float32)
    ref, out = np.zeros_like(x), np.full_like(x, np.nan)
    K.gelu_tanh(big, ref, T, D)
    launch("gelu_tanh", big, out, T, D)
    errs["gelu_tanh"] = _rel(out, ref)
    qkv = rng.standard_normal((T, 3 * H * HD)).astype(np.float32)
    ref, out = np.zeros((T, H * HD), np.float32), np.full((T, H * HD), np.nan, np.float32)
    K.window_attention(qkv, count, ref, W, NP, H, HD, 0.5)
    launch("window_attention", qkv, count, out, W, NP, H, HD, 0.5)
    errs["window_attention"] = _rel(out, ref)
    F = T // (R * R)
    ref, out = np.zeros((F, D * R * R), np.float32), np.full((F, D * R * R), np.nan, np.float32)
    K.pixel_shuffle(x, ref, W, G, D, R)
    launch("pixel_shuffle", x, out, W, G, D, R)
    errs["pixel_shuffle"] = _rel(out, ref)
    feats = rng.standard_normal((5, D)).astype(np.float32)
    index = np.array([-1, 3, 0, 7, 4, -1, 1, 2] * (T // 8), np.int32)
    ref, out = x.copy(), x.copy()
    K.image_merge(feats, index, ref, T, 5, D)
    launch("image_merge", feats, index, out, T, 5, D)
    errs["image_merge"] = _rel(out, ref)
    for op, err in errs.items():
        good = err < 1e-6
        ok &= good
        print(f"{'ok ' if good else 'BAD'} {op:<17} {err:.1e}")
    return ok


def main() -> None:
    rng = np.random.default_rng(0)
    np.seterr(divide="ignore", under="ignore", invalid="ignore", over="ignore")
    ok = True
    if sys.argv[1:] == ["nucleus"]:
        sys.exit(0 if check_nucleus(full=True) else 1)
    if sys.argv[1:] == ["wide"]:
        sys.exit(0 if check_wide(full=True) else 1)
    if sys.argv[1:] == ["race"]:
        sys.exit(0 if check_race(full=True) else 1)
    if sys.argv[1:] == ["race-quick"]:
        sys.exit(0 if check_race(full=False) else 1)
    if sys.argv[1:] == ["wide-quick"]:
        sys.exit(0 if check_wide(full=False) else 1)
    if sys.argv[1:] == ["gemv"]:
        sys.exit(0 if check_gemv(rng) else 1)
    if sys.argv[1:] == ["invariant"]:
        sys.exit(0 if check_invariant(rng) and check_packed_rows(rng) else 1)
    if sys.argv[1:] == ["attention"]:
        sys.exit(0 if check_attention(rng) else 1)
    if sys.argv[1:] == ["attnmma"]:
        sys.exit(0 if check_attention_mma(rng) else 1)
    if sys.argv[1:] == ["mma"]:
        sys.exit(0 if check_mma(rng) else 1)
    if sys.argv[1:] == ["scores"]:
        sys.exit(0 if all([check_scores(rng, V) for V in (300, 4097)]) else 1)
    if sys.argv[1:] == ["experts"]:
        sys.exit(0 if check_experts(rng) else 1)
    if sys.argv[1:] == ["window"]:
        sys.exit(0 if check_window(rng) else 1)
    if sys.argv[1:] == ["vision"]:
        sys.exit(0 if check_vision(rng) else 1)
    if sys.argv[1:] == ["fp8"]:
        sys.exit(0 if check_fp8(rng) else 1)
    if sys.argv[1:] == ["int4"]:
        sys.exit(0 if check_int4(rng) else 1)
    if sys.argv[1:] == ["repacked"]:
        sys.exit(0 if check_repacked(rng) & check_repacked_embedding(rng) else 1)
    if sys.argv[1:] == ["decodetc"]:
        sys.exit(0 if check_decode_tc(rng) else 1)
    if sys.argv[1:] == ["bf16act"]:
        sys.exit(0 if check_bf16_activations(rng) else 1)
    if sys.argv[1:] == ["kvfp8"]:
        sys.exit(0 if check_kv(rng, "fp8") else 1)
    if sys.argv[1:] == ["kvbf16"]:
        sys.exit(0 if check_kv(rng, "bf16") else 1)
    if sys.argv[1:] == ["mixed"]:
        sys.exit(0 if check_mixed(rng) else 1)
    if sys.argv[1:] == ["mixedmma"]:
        sys.exit(0 if check_mixed_mma(rng) else 1)
    if sys.argv[1:] != ["speculative"]:
        ok = check_linear(rng)
        ok &= check_gemv(rng)
        ok &= check_invariant(rng)
        ok &= check_packed_rows(rng)
        for V in (5000, 4097, 49152):
            ok &= check_sampler(rng, V)
        ok &= check_nucleus(full=False)
        ok &= check_wide(full=False)
        ok &= check_race(full=False)
        ok &= check_attention(rng)
        ok &= check_attention_mma(rng)
        ok &= check_scores(rng, 4097)
        ok &= check_window(rng)
        ok &= check_mixed(rng)
        ok &= check_mixed_mma(rng)
    for V in (4100, 300):
        ok &= check_candidate_masks(rng, V)
    ok &= check_verify_cut(rng, 300)
    ok &= check_speculative()  # coupled verification (about 3 minutes)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
