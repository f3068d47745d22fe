"""The repacked-GGUF Triton products (kernels_triton/int4.py's ``*_int4_min`` kernels,
kernels_triton/int8.py's ``*_int8`` and ``embedding_int8``) against their NumPy references
(helios_tools/kernels/int8.py) at M = 1, 8, 64, 256 token rows, SmolLM2 and Llama-3.1-8B
shapes, groups of 32 (16 for INT8 as Q6_K stores); then the real SmolLM2 GGUF exported
with ``--weight-dtype gguf`` for the GPU target (its Q4_1 projections repacked to
INT4_MIN, its Q8_0 embedding / tied LM head to INT8) served on the cuda backend against
the cpu backend of the same core.

Below 32 rows the GEMV multiplies in f32 on the FMA units: the same dequantized values as
the reference, only the summation order differs (relative 1e-5). From 32 rows the tiles
run ``tl.dot`` on TF32 operands: the codes are exact, the activations rounded to TF32 (the INT4_MIN tile
rounds them itself, so its dot and the minimum's activation sum see the same values), so
the bound is relative 2e-3; a
wrong nibble, byte sign, scale, minimum or layout errs by 1e-1 or more. The embedding is
one product of a code and a scale per element on both sides: equal bitwise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from helios_ignition.capture.launch import INT4_MMA_ROWS
from helios_tools import kernels as K
from helios_tools.kernels.int4 import pack_int4
from helios_tools.kernels.int8 import INT4_MIN_FORMS, INT8_FORMS

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
GOLDENS = json.loads((ROOT / "tests/golden/smollm2_goldens.json").read_text())
SHAPES = [(m, n, k) for m in (1, 8, 64, 256)
          for n, k in ((960, 576), (6144, 4096), (4096, 14336))] + [
          (1, 28672, 4096), (1, 128256, 4096), (33, 576, 1536)]
PRODUCTS = sorted(INT4_MIN_FORMS.values()) + sorted(
    op for op in INT8_FORMS.values() if op != "embedding_int8")


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "GPU output holds NaN/inf (unwritten or poisoned)"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def weights(rng, N: int, K_: int, op: str):
    """Random storage of `op`'s type at [N, K]: INT4_MIN in groups of 32 (codes 0..15,
    scale ~ 1 / (8 sqrt K), minimum ~ -8 scale, as Q4_1 stores); INT8 in groups of 16
    (Q6_K's) where 1024 divides K, else 32 (Q8_0's). Scales and minimums are f32 arrays
    (the cast comes last: NumPy 2 promotes an f32 array divided by an np.float64 scalar
    to f64, whose bytes the kernels would read as f32 garbage)."""
    if op.endswith("_int4_min"):
        group = 32
        scales = ((rng.random((N, K_ // group)) + 0.5) / (8 * np.sqrt(K_))).astype(np.float32)
        mins = (-8 * scales * (rng.random(scales.shape) + 0.5)).astype(np.float32)
        return pack_int4(rng.integers(0, 16, (N, K_))), scales, mins
    group = 16 if K_ % 1024 == 0 else 32
    scales = ((rng.random((N, K_ // group)) + 0.5) / (64 * np.sqrt(K_))).astype(np.float32)
    return rng.integers(-128, 128, (N, K_)).astype(np.int8).view(np.uint8), scales


@pytest.mark.parametrize("T,N,K_", SHAPES)
@pytest.mark.parametrize("op", PRODUCTS)
def test_repacked_product(gpu, op, T, N, K_):
    rng = np.random.default_rng(T * N + K_)
    x = rng.standard_normal((T, 2 * K_)).astype(np.float32)
    g = (1 + 0.1 * rng.standard_normal(K_)).astype(np.float32)
    sides = weights(rng, N, K_, op)
    res = rng.standard_normal((T, N)).astype(np.float32)
    xin = x if op.startswith("swiglu") else np.ascontiguousarray(x[:, :K_])
    pre = (g,) if op.startswith("rmsnorm") else ()
    tail = (T, N, K_, 1e-5) if op.startswith("rmsnorm") else (T, N, K_)
    acc = "_add_" in op
    ref = res.copy() if acc else np.zeros((T, N), np.float32)
    K.reference_op(op)(xin, *pre, *sides, ref, *tail)
    out = gpu.run(op, xin, *pre, *sides, res.copy() if acc else np.zeros_like(ref),
                  *tail)["out"]
    if acc:
        out, ref = out - res, ref - res
    assert rel(out, ref) < (2e-3 if T >= INT4_MMA_ROWS else 1e-5)


@pytest.mark.parametrize("V,D,group", [(49152, 576, 32), (128256, 4096, 32), (300, 640, 16)])
def test_embedding_int8_equals_its_reference_bitwise(gpu, V, D, group):
    rng = np.random.default_rng(V + D)
    codes = rng.integers(-128, 128, (V, D)).astype(np.int8).view(np.uint8)
    scales = rng.random((V, D // group)).astype(np.float32)
    ids = np.array([0, V - 1, -1, V, 17, 5], np.int32)
    ref = np.zeros((len(ids), D), np.float32)
    K.reference_op("embedding_int8")(ids, codes, scales, ref, len(ids), D)
    out = gpu.run("embedding_int8", ids, codes, scales, np.zeros_like(ref), len(ids), D)
    np.testing.assert_array_equal(out["out"], ref)


@pytest.fixture(scope="module")
def models(gpu, tmp_path_factory):
    from helios_contract.schema import manifest_pb2 as mpb
    from helios_ignition.export import export_core
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.testing.native import load_native
    from helios_tools.core import generate_key, load_public_key, open_core, write_key_pair

    d = tmp_path_factory.mktemp("gguf-cuda")
    key = d / "key.pem"
    write_key_pair(generate_key(), key)
    out = d / "smollm2-gguf.core"
    export_core(ROOT / "recipes/smollm2_135m_instruct.py",
                checkpoint=os.environ.get("HELIOS_SMOLLM2_GGUF", "smollm2"), key_path=key,
                namespace="gpu.test", out=out, weight_dtype="gguf", targets=(gpu.target,))
    core = open_core(out, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])
    types = {b.storage.type for b in core.manifest.buffers if b.HasField("storage")}
    assert types == {mpb.STORAGE_TYPE_INT4_MIN, mpb.STORAGE_TYPE_INT8}
    cuda = load_native(core, "cuda", cache=CacheSizing(num_pages=1024))
    cpu = load_native(core, "cpu")
    yield cuda, cpu
    cuda.close()


def test_gguf_core_greedy_and_logits_match_cpu_backend(models):
    """Same codes on both backends (the cpu backend dequantizes them once and runs the
    NumPy references); the cuda prefill (>= 32 rows) rounds activations to TF32 inside its
    products: greedy ids equal over 16 steps, logits within 0.05.

    The cpu backend emulating the tiles' arithmetic (prompt "france") puts the bound's
    reason in numbers: TF32 activations, both terms of INT4_MIN's ``code * scale + min``
    rounded alike (as the tile now does): logits 0.022 off; the dot's activations
    rounded (to nearest 0.058, truncated 0.154) but the minimum's f32 sum not (the tile
    at 94c9904; the H100 gave 0.125): the rounding of the uncentred codes' dot left
    uncancelled."""
    from gpu_steps import Steps

    cuda, cpu = models
    prompts = [p["prompt_ids"] for p in GOLDENS["prompts"]]
    got = Steps(cuda).generate(prompts, 16)
    want = Steps(cpu).generate(prompts, 16)
    for g, w, p in zip(got, want, GOLDENS["prompts"], strict=True):
        assert g == w, p["name"]
    for p in GOLDENS["prompts"]:
        a = Steps(cuda, lambda n: cuda.backend.read_buffer("scratch.logits")[:n]
                  ).teacher_force(p["prompt_ids"], p["greedy_ids"])
        b = Steps(cpu, lambda n: cpu.backend.buffers["scratch.logits"][:n].copy()
                  ).teacher_force(p["prompt_ids"], p["greedy_ids"])
        err = float(np.abs(a - b).max())
        print(p["name"], "gguf repacked max |logit diff| cuda vs cpu", err)
        assert err < 0.05
