"""The W4A16 Triton products (kernels_triton/int4.py, every INT4 form) against their NumPy
references (helios_tools/kernels/int4.py) at M = 1, 3, 8, 16, 20, 64, 256 token rows,
SmolLM2 and Llama-3.1-8B shapes, group 128 (64 at K = 576), under the default launch
rules and the older forms their knobs keep (HELIOS_INT4_ROWS, HELIOS_INT4_TILE); then the real SmolLM2 exported with
``--quantize int4`` served on the cuda backend against the cpu backend of the same core.

Below 32 rows the GEMV multiplies in f32 on the FMA units: the same dequantized values as
the reference, only the summation order differs (relative 1e-5). From 32 rows the tiles
run ``tl.dot`` on TF32 operands: the weight integers (code - zero point) are exact, the
activations are rounded to TF32 (10-bit mantissa), so the bound is relative 2e-3; a wrong
nibble, scale, zero point or layout errs by 1e-1 or more.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from helios_ignition.capture import launch
from helios_ignition.capture.launch import INT4_MMA_ROWS
from helios_tools import kernels as K
from helios_tools.kernels.int4 import INT4_FORMS, int4_group, quantize_int4

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
GOLDENS = json.loads((ROOT / "tests/golden/smollm2_goldens.json").read_text())
SHAPES = [(m, n, k) for m in (1, 8, 64, 256)
          for n, k in ((960, 576), (6144, 4096), (4096, 14336))] + [
          (1, 28672, 4096), (1, 128256, 4096), (33, 576, 1536),
          # partial token tiles of the rows form (3 of 4, 20 = 16 + 4) and 16 rows
          (3, 960, 576), (16, 4096, 14336), (20, 6144, 4096)]
# The launch rules' older forms, still selectable at capture (HELIOS_INT4_ROWS=v1,
# HELIOS_INT4_TILE=v1), and the byte form at one row: (T, rows spec, tile spec).
KNOBS = [(1, "v1", "v2"), (8, "v1", "v2"), (1, "8,512,4,0,8,256,4", "v2"),
         (64, "v2", "v1"), (256, "v2", "v1")]


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "GPU output holds NaN/inf (unwritten or poisoned)"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("T,N,K_", SHAPES)
@pytest.mark.parametrize("op", sorted(INT4_FORMS.values()))
def test_int4_product(gpu, op, T, N, K_):
    _check(gpu, op, T, N, K_)


@pytest.mark.parametrize("T,rows,tile", KNOBS)
@pytest.mark.parametrize("op", sorted(INT4_FORMS.values()))
def test_int4_product_knobs(gpu, monkeypatch, op, T, rows, tile):
    """The forms the knobs keep selectable, at the 8B down projection's shape."""
    monkeypatch.setattr(launch, "INT4_ROWS", rows)
    monkeypatch.setattr(launch, "INT4_TILE", tile)
    _check(gpu, op, T, 4096, 14336)


def _check(gpu, op, T, N, K_):
    """`op` on the GPU against its reference: relative 1e-5 on the FMA forms, 2e-3 on the
    TF32 tiles (from INT4_MMA_ROWS rows)."""
    rng = np.random.default_rng(T * N + K_)
    x = rng.standard_normal((T, 2 * K_)).astype(np.float32)
    g = (1 + 0.1 * rng.standard_normal(K_)).astype(np.float32)
    packed, scales, zeros = quantize_int4(
        (rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32), int4_group(K_))
    res = rng.standard_normal((T, N)).astype(np.float32)
    xin = x if op.startswith("swiglu") else np.ascontiguousarray(x[:, :K_])
    pre = (g,) if op.startswith("rmsnorm") else ()
    tail = (T, N, K_, 1e-5) if op.startswith("rmsnorm") else (T, N, K_)
    acc = "_add_" in op
    ref = res.copy() if acc else np.zeros((T, N), np.float32)
    K.reference_op(op)(xin, *pre, packed, scales, zeros, ref, *tail)
    out = gpu.run(op, xin, *pre, packed, scales, zeros,
                  res.copy() if acc else np.zeros_like(ref), *tail)["out"]
    if acc:
        out, ref = out - res, ref - res
    assert rel(out, ref) < (2e-3 if T >= INT4_MMA_ROWS else 1e-5)


@pytest.fixture(scope="module")
def models(gpu, tmp_path_factory):
    from helios_ignition.export import export_core
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.testing.native import load_native
    from helios_tools.core import generate_key, load_public_key, open_core, write_key_pair

    d = tmp_path_factory.mktemp("int4")
    key = d / "key.pem"
    write_key_pair(generate_key(), key)
    out = d / "smollm2-int4.core"
    export_core(ROOT / "recipes/smollm2_135m_instruct.py",
                checkpoint=os.environ.get("HELIOS_SMOLLM2_GGUF", "smollm2"), key_path=key,
                namespace="gpu.test", out=out, weight_dtype="bf16", quantize="int4",
                targets=(gpu.target,))
    core = open_core(out, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])
    cuda = load_native(core, "cuda", cache=CacheSizing(num_pages=1024))
    cpu = load_native(core, "cpu")
    yield cuda, cpu
    cuda.close()


def test_int4_core_greedy_and_logits_match_cpu_backend(models):
    """Same codes on both backends; the cuda prefill (>= 32 rows) rounds activations to
    TF32 inside its products: greedy ids equal over 16 steps, logits within 0.05."""
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
        print(p["name"], "int4 max |logit diff| cuda vs cpu", err)
        assert err < 0.05
