"""Gemma 3 from HF safetensors on the GPU: the tiny seeded `Gemma3ForCausalLM` of
tests/fixtures/gemma3_tiny (window 16 on its local layers, one global layer) exported with
bf16 weights for this GPU through recipes/gemma3_270m.py. The cuda backend's logits at
every position of every prompt (one of 48 tokens: three windows) follow the cpu backend of
the same core, teacher-forced token by token (decode over the window region) and after
one prefill of the whole prompt (windowed prefill); its greedy ids equal the cpu
backend's; both stay near transformers' f32 logits (the f32 core's cpu logits are
transformers' within 5e-5: tests/ignition/families/test_gemma3_hf.py).

Run on the device: ``uv run pytest -m gpu tests/gpu/test_gemma3_hf.py -q``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "gemma3_tiny"


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "GPU output holds NaN/inf (unwritten or poisoned)"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.fixture(scope="module")
def models(gpu, tmp_path_factory):
    from helios_ignition.export import export_core
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.testing.native import load_native
    from helios_tools.core import generate_key, load_public_key, open_core, write_key_pair

    folder = tmp_path_factory.mktemp("gemma3hf")
    key = folder / "key.pem"
    write_key_pair(generate_key(), key)
    out = folder / "gemma3-tiny-bf16.core"
    export_core(ROOT / "recipes/gemma3_270m.py", checkpoint=str(FIXTURE / "checkpoint"),
                key_path=key, namespace="gpu.test", out=out, weight_dtype="bf16",
                targets=(gpu.target,))
    core = open_core(out, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])
    cuda = load_native(core, "cuda", cache=CacheSizing(num_pages=64))
    cpu = load_native(core, "cpu")
    yield cuda, cpu
    cuda.close()
    cpu.close()


def test_cuda_matches_cpu_and_transformers(models):
    from gpu_steps import Steps

    cuda, cpu = models
    ref = np.load(FIXTURE / "reference.npz")
    for p in range(3):
        ids = ref[f"p{p}/ids"].tolist()
        want = ref[f"p{p}/logits"]
        a = Steps(cuda, lambda n: cuda.backend.read_buffer("scratch.logits")[:n])
        b = Steps(cpu, lambda n: cpu.backend.buffers["scratch.logits"][:n].copy())
        on_cuda = a.teacher_force(ids[:1], ids[1:] + [0])
        on_cpu = b.teacher_force(ids[:1], ids[1:] + [0])
        print(p, "cuda vs cpu", rel(on_cuda, on_cpu), "cpu(bf16) vs HF(f32)",
              rel(on_cpu, want))
        assert rel(on_cuda, on_cpu) < 1e-4, p
        assert rel(on_cpu, want) < 2e-2, p  # bf16 weights
        greedy = Steps(cpu).generate([ids], 8)[0]
        assert Steps(cuda).generate([ids], 8)[0] == greedy, p
        after_cuda = a.teacher_force(ids, greedy)  # one prefill of the whole prompt
        after_cpu = b.teacher_force(ids, greedy)
        assert rel(after_cuda, after_cpu) < 1e-4, p
