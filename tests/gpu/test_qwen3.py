"""Qwen3 on the GPU: the QK-norm and mixture-of-experts kernels against their NumPy
references at real geometry (Qwen3-8B heads; Qwen3-30B-A3B experts: 128 experts, top-8,
hidden 2048, expert width 768), and the Qwen3 fixture checkpoints (tests/fixtures/qwen3)
exported for this GPU on the cuda backend against transformers' logits and greedy ids.

Run on the device: ``uv run pytest -m gpu tests/gpu/test_qwen3.py -q``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gpu_harness import bf16_round
from helios_tools import kernels as K

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "qwen3"
BT = 16  # MOE_BLOCK_ROWS


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "GPU output holds NaN/inf (unwritten or poisoned)"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.fixture
def rng(request):
    return np.random.default_rng(abs(hash(request.node.name)) % 2**32)


@pytest.mark.parametrize("T,H,KVH,HD", [(1, 32, 8, 128), (77, 32, 8, 128), (5, 4, 2, 32)])
def test_qk_rmsnorm(gpu, rng, T, H, KVH, HD):
    qkv = (3 * rng.standard_normal((T, (H + 2 * KVH) * HD))).astype(np.float32)
    gq, gk = (1 + 0.1 * rng.standard_normal((2, HD))).astype(np.float32)
    ref = qkv.copy()
    K.qk_rmsnorm(ref, gq, gk, T, H, KVH, HD, 1e-6)
    out = gpu.run("qk_rmsnorm", qkv, gq, gk, T, H, KVH, HD, 1e-6)["qkv"]
    assert rel(out, ref) < 1e-6
    np.testing.assert_array_equal(out[:, (H + KVH) * HD:], qkv[:, (H + KVH) * HD:])


def _moe_chain(gpu, rng, T, E, Kt, D, F, bf16: bool):
    """Route -> align -> gate_up -> down -> sum on the GPU, each stage fed the reference's
    previous output; returns (per-stage relative errors, the GPU's pair outputs)."""
    NB = K.moe_blocks(T, E, Kt, BT)
    logits = (2 * rng.standard_normal((T, E))).astype(np.float32)
    ids_r, w_r = np.zeros((T, Kt), np.int32), np.zeros((T, Kt), np.float32)
    K.moe_route(logits, ids_r, w_r, T, E, Kt, 1)
    got = gpu.run("moe_route", logits, ids_r, w_r, T, E, Kt, 1)
    errs = {"route_ids": float(np.mean(got["ids"] != ids_r)),
            "route_w": rel(got["weights"], w_r)}
    sp_r, be_r = np.zeros(NB * BT, np.int32), np.zeros(NB, np.int32)
    K.moe_align(ids_r, sp_r, be_r, T, E, Kt, BT, NB)
    got = gpu.run("moe_align", ids_r, sp_r, be_r, T, E, Kt, BT, NB)
    errs["align"] = float(np.any(got["sorted_pairs"] != sp_r) or
                          np.any(got["block_expert"] != be_r))
    x = rng.standard_normal((T, D)).astype(np.float32)
    wgu = (rng.standard_normal((E, 2 * F, D)) / np.sqrt(D)).astype(np.float32)
    wd = (rng.standard_normal((E, D, F)) / np.sqrt(F)).astype(np.float32)
    wgu_bits, wgu = bf16_round(wgu) if bf16 else (wgu, wgu)
    wd_bits, wd = bf16_round(wd) if bf16 else (wd, wd)
    act_r = np.zeros((T * Kt, F), np.float32)
    K.moe_gate_up(x, sp_r, be_r, wgu, act_r, T, D, F, Kt, BT, NB)
    act = gpu.run("moe_gate_up", x, sp_r, be_r, wgu_bits, act_r, T, D, F, Kt, BT, NB,
                  bf16=("w_gate_up",) if bf16 else ())["act"]
    errs["gate_up"] = rel(act, act_r)
    po_r = np.zeros((T * Kt, D), np.float32)
    K.moe_down(act_r, sp_r, be_r, wd, w_r, po_r, T, D, F, Kt, BT, NB)
    po = gpu.run("moe_down", act_r, sp_r, be_r, wd_bits, w_r, po_r, T, D, F, Kt, BT, NB,
                 bf16=("w_down",) if bf16 else ())["pair_out"]
    errs["down"] = rel(po, po_r)
    y_r = np.zeros((T, D), np.float32)
    K.moe_sum(po_r, y_r, T, D, Kt)
    y = gpu.run("moe_sum", po_r, y_r, T, D, Kt)["out"]
    errs["sum"] = rel(y, y_r)
    return errs, (x, sp_r, be_r, wgu_bits, act)


@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "f32"])
@pytest.mark.parametrize("T", [1, 8, 64, 256])
def test_moe_chain_30b_a3b_geometry(gpu, rng, T, bf16):
    errs, _ = _moe_chain(gpu, rng, T, 128, 8, 2048, 768, bf16)
    print(T, errs)
    assert errs["route_ids"] == 0.0 and errs["align"] == 0.0 and errs["sum"] == 0.0
    assert errs["route_w"] < 1e-6
    assert errs["gate_up"] < 5e-5 and errs["down"] < 5e-5


def test_moe_gate_up_rows_do_not_depend_on_their_block(gpu, rng):
    """One token alone and the same token among 40 others sharing its experts: its pair
    rows come out bit for bit equal (speculative verification relies on it)."""
    T, E, Kt, D, F = 41, 8, 2, 256, 128
    ids = np.tile(np.array([[1, 5]], np.int32), (T, 1))
    x = rng.standard_normal((T, D)).astype(np.float32)
    bits, _ = bf16_round((rng.standard_normal((E, 2 * F, D)) / np.sqrt(D)).astype(np.float32))
    outs = []
    for rows in (1, T):
        NB = K.moe_blocks(rows, E, Kt, BT)
        sp, be = np.zeros(NB * BT, np.int32), np.zeros(NB, np.int32)
        K.moe_align(ids[:rows], sp, be, rows, E, Kt, BT, NB)
        act = gpu.run("moe_gate_up", x[:rows], sp, be, bits, np.zeros((rows * Kt, F),
                                                                       np.float32),
                      rows, D, F, Kt, BT, NB, bf16=("w_gate_up",))["act"]
        outs.append(act[:Kt])
    np.testing.assert_array_equal(outs[0], outs[1])


class _MemoryCore:
    """What NativeModel.load reads (contract, manifest, resources), held in memory."""

    def __init__(self, contract, manifest, resources):
        self.contract, self.manifest, self.resources = contract, manifest, resources

    def read_resource(self, rid: str) -> bytes:
        return self.resources[rid]


def _fixture_core(model: str, target: str) -> _MemoryCore:
    """The fixture checkpoint with bf16 weights, captured at small capacities (one decode
    batch, one 32-token prefill chunk: few variants to compile) for `target`."""
    from dataclasses import replace

    from helios_ignition.capture.programs import capture
    from helios_ignition.checkpoint import load_checkpoint
    from helios_ignition.export import build_contract, resolve_recipe
    from helios_ignition.families.registry import family_shapes
    from helios_ignition.kernels_aot import compile_targets
    from helios_ignition.recipe import Capacities
    from helios_ignition.weights import iter_stored_weights

    ckpt = load_checkpoint(FIXTURES / model)
    caps = Capacities(decode_batch=(1,), prefill_tokens=(32,), prefill_rows=1,
                      context_tokens=64, page_tokens=16, prepared_pages=8)
    recipe = resolve_recipe(ROOT / "recipes" / "qwen3.py", ckpt)
    recipe = replace(recipe, capacities=caps,
                     sampling=replace(recipe.sampling, max_output_tokens=32))
    shapes = family_shapes(ckpt.geometry.family, ckpt.geometry)
    manifest, graphs = capture(shapes, caps, "bf16")
    resources = compile_targets(manifest, (target,))
    for w in iter_stored_weights(ckpt, shapes, "bf16"):
        resources[w.resource_id] = w.array.tobytes()
    return _MemoryCore(build_contract(recipe, ckpt, shapes, graphs, manifest), manifest,
                       resources)


@pytest.mark.parametrize("model", ["dense_tied", "dense_untied", "moe"])
def test_fixture_on_cuda_matches_the_cpu_backend(gpu, model):
    """The fixture checkpoint with bf16 weights compiled for this GPU: the cuda backend's
    logits at every prompt position follow the cpu backend of the same core (the same
    bf16 values widened) and its greedy ids equal the cpu backend's; both stay near
    transformers' f32 logits (the f32 core's cpu logits are transformers' within 5e-5:
    tests/ignition/families/test_qwen3.py)."""
    from gpu_steps import Steps
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.testing.native import load_native

    core = _fixture_core(model, gpu.target)
    ref = np.load(FIXTURES / "reference.npz")
    cuda = load_native(core, "cuda", cache=CacheSizing(num_pages=8))
    cpu = load_native(core, "cpu")
    try:
        for p in range(3):
            ids = ref[f"{model}/p{p}/ids"].tolist()
            a = Steps(cuda, lambda n: cuda.backend.read_buffer("scratch.logits")[:n])
            b = Steps(cpu, lambda n: cpu.backend.buffers["scratch.logits"][:n].copy())
            on_cuda = a.teacher_force(ids[:1], ids[1:] + [0])
            on_cpu = b.teacher_force(ids[:1], ids[1:] + [0])
            print(model, p, "cuda vs cpu", rel(on_cuda, on_cpu), "cpu(bf16) vs HF(f32)",
                  rel(on_cpu, ref[f"{model}/p{p}/logits"]))
            assert rel(on_cuda, on_cpu) < 1e-4, (model, p)
            assert rel(on_cpu, ref[f"{model}/p{p}/logits"]) < 2e-2  # bf16 weights
            assert Steps(cuda).generate([ids], 8) == Steps(cpu).generate([ids], 8), (model, p)
    finally:
        cuda.close()
