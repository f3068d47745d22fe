"""The real SmolLM2 GGUF (Q4_1 projections, Q8_0 embedding = tied LM head) exported with
``--weight-dtype gguf`` for the GPU target: its blocks repacked (checkpoint/gguf_repack.py)
into INT4_MIN and INT8 storage that both backends execute, linted clean for both, served
on the cpu backend through HTTP.

Exact values: every stored weight dequantizes (helios_tools.kernels.int8) bit for bit to
the checkpoint's f32 tensor (gguf-py's dequantization, the llama Q/K row order undone),
which is the weight the HF float32 goldens (tests/golden/smollm2_goldens.json, the same
GGUF dequantized) ran, so the cpu backend's greedy ids equal the goldens' over 16 steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.export import export_core
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, load_public_key, open_core
from helios_tools.kernels.int8 import dequantize_int4_min, dequantize_int8
from helios_tools.lint import lint_capabilities

from tests.conftest import NAMESPACE, RECIPE
from tests.e2e.conftest import served_on_cpu

REPO = Path(__file__).resolve().parents[2]
GOLDENS = json.loads((REPO / "tests" / "golden" / "smollm2_goldens.json").read_text())
STEPS = 16


@pytest.fixture(scope="module")
def gguf_core(module_tmp, signing_key_pair, smollm2_checkpoint):
    private, public = signing_key_pair
    out = module_tmp("gguf-cuda") / "smollm2-gguf-sm90.core"
    export_core(RECIPE, checkpoint=smollm2_checkpoint, key_path=private, namespace=NAMESPACE,
                out=out, weight_dtype="gguf", targets=("sm_90",))
    core = open_core(out, [load_public_key(public)])
    authorize(core, NAMESPACE)
    return out, public, core


def test_every_block_matrix_is_repacked_and_none_is_a_gguf_block(gguf_core):
    _, _, core = gguf_core
    buffers = {b.name: b for b in core.manifest.buffers}
    stored = {n: b.storage for n, b in buffers.items() if b.HasField("storage")}
    projections = {f"L{i}.{k}" for i in range(30)
                   for k in ("wqkv", "wo", "w_gate_up", "w_down")}
    assert set(stored) == projections | {"embed"}
    assert stored["L0.w_down"] == mpb.TensorStorage(
        type=mpb.STORAGE_TYPE_INT4_MIN, block_elements=32, block_bytes=16,
        scales=mpb.SideBuffer(buffer="L0.w_down.scale", dtype=mpb.D_TYPE_F32),
        mins=mpb.SideBuffer(buffer="L0.w_down.min", dtype=mpb.D_TYPE_F32))
    assert stored["embed"] == mpb.TensorStorage(
        type=mpb.STORAGE_TYPE_INT8, block_elements=32, block_bytes=32,
        scales=mpb.SideBuffer(buffer="embed.scale", dtype=mpb.D_TYPE_F32))
    assert list(buffers["L0.w_down.min"].shape) == [576, 48]
    assert list(buffers["embed.scale"].shape) == [49152, 18]
    ops = {k.reference_op for k in core.manifest.kernels}
    assert {"linear_int4_min", "swiglu_linear_int4_min", "embedding_int8",
            "linear_int8"} <= ops
    assert not ops & {"linear", "swiglu_linear", "embedding"}


def test_stored_weights_dequantize_to_the_checkpoint_bit_for_bit(gguf_core, smollm2_checkpoint):
    """The fused QKV of layer 0 (q and k rows permuted back from llama.cpp's order, on whole
    block rows) and the embedding, against the checkpoint's f32 tensors."""
    _, _, core = gguf_core
    ckpt = smollm2_checkpoint

    def read(name, shape, dtype):
        return np.frombuffer(core.read_resource(f"weights/{name}"), dtype).reshape(shape)

    wqkv = dequantize_int4_min(read("L0.wqkv", (960, 288), np.uint8),
                               read("L0.wqkv.scale", (960, 18), "<f4"),
                               read("L0.wqkv.min", (960, 18), "<f4"))
    want = np.concatenate([ckpt.tensor(f"model.layers.0.self_attn.{p}_proj.weight")
                           for p in "qkv"], axis=0)
    assert np.array_equal(wqkv.view(np.uint32), want.view(np.uint32))
    embed = dequantize_int8(read("embed", (49152, 576), np.uint8),
                            read("embed.scale", (49152, 18), "<f4"))
    want = ckpt.tensor("model.embed_tokens.weight")
    assert np.array_equal(embed.view(np.uint32), want.view(np.uint32))


def test_lint_core_passes_for_both_backends_with_the_target(gguf_core):
    """`helios-tools lint-core --require-target sm_90`: every rule, both backends."""
    from click.testing import CliRunner
    from helios_tools.cli import main as tools_main

    path, public, _ = gguf_core
    result = CliRunner().invoke(tools_main, [
        "lint-core", str(path), "--trust", str(public), "--accept", NAMESPACE,
        "--require-target", "sm_90", "--format", "json"])
    assert json.loads(result.stdout)["findings"] == [] and result.exit_code == 0


def test_a_minimum_argument_must_be_the_weights_own(gguf_core):
    """runtime.storage, both backends: an INT4_MIN form passing another weight's minimums,
    and one passing its own scales where its minimums go."""
    _, _, core = gguf_core
    for wrong in ("other", "scales"):
        manifest = type(core.manifest)()
        manifest.CopyFrom(core.manifest)
        ops = {k.id: k.reference_op for k in manifest.kernels}
        launch = next(x for g in manifest.graphs for x in g.launches
                      if ops[x.kernel] == "linear_int4_min")
        weight = launch.args[1].buffer.buffer
        other = "L29.wo" if weight != "L29.wo" else "L0.wo"
        launch.args[3].buffer.buffer = f"{other}.min" if wrong == "other" else \
            f"{weight}.scale"
        for backend in ("cpu", "cuda"):
            found = [f for f in lint_capabilities(core.contract, manifest, [backend])
                     if f.rule == "runtime.storage"]
            assert len(found) == 1 and found[0].path.endswith(".args[3].buffer.buffer")
            assert found[0].detail.endswith(f"must read {weight!r}'s own mins "
                                            f"{weight + '.min'!r}"), found[0].detail


def test_cpu_greedy_ids_equal_the_hf_goldens_and_http_serves_them(gguf_core):
    """Driver: 16 greedy ids of every golden prompt equal HF float32's on the same weights;
    HTTP: the "france" chat answer's ids (temperature 0, up to its EOS) are their prefix."""
    path, public, core = gguf_core
    prompts = GOLDENS["prompts"]
    model = load_native(core, "cpu")
    try:
        ids = Driver(model).generate([p["prompt_ids"] for p in prompts], STEPS)
    finally:
        model.close()
    assert ids == [p["greedy_ids"][:STEPS] for p in prompts]
    golden = next(p for p in prompts if p["name"] == "france")
    with served_on_cpu(path, public, NAMESPACE) as (bootstrap, settings, client):
        r = client.chat.completions.create(
            model=settings.served_name, messages=golden["messages"], temperature=0,
            max_tokens=STEPS, extra_body={"return_token_ids": True})
    got = r.choices[0].token_ids
    assert got and got == golden["greedy_ids"][:len(got)]
    assert r.choices[0].message.content == golden["greedy_text"][:len(
        r.choices[0].message.content)]


@pytest.mark.slow
def test_gemma3_q4_k_m_repacks_every_projection_exactly(tmp_path, signing_key_pair,
                                                       gemma3_checkpoint):
    """Gemma 3 270M Q4_K_M for sm_90: the fused QKV of Q5_0 query/key and Q8_0 value rows
    is INT8 in groups of 32 (one repacked form), the Q4_K output projections INT4_MIN, the
    down projections INT8 in groups of 16 (Q6_K) or INT4_MIN (Q4_K), the Q8_0 embedding
    INT8; lint clean for both backends; layer 0's QKV dequantizes to the checkpoint's f32
    rows bit for bit."""
    from helios_tools.lint import lint_core

    private, public = signing_key_pair
    out = tmp_path / "gemma3-sm90.core"
    export_core(REPO / "recipes" / "gemma3_270m.py", checkpoint=gemma3_checkpoint,
                key_path=private, namespace=NAMESPACE, out=out, targets=("sm_90",))
    core = open_core(out, [load_public_key(public)])
    assert lint_core(core, acceptance=NAMESPACE, require_targets=["sm_90"]) == []
    stored = {b.name: b.storage for b in core.manifest.buffers if b.HasField("storage")}
    layers = range(18)
    kinds = {(n, mpb.StorageType.Name(s.type), s.block_elements) for n, s in stored.items()}
    assert {(f"L{i}.wqkv", "STORAGE_TYPE_INT8", 32) for i in layers} <= kinds
    assert {(f"L{i}.wo", "STORAGE_TYPE_INT4_MIN", 32) for i in layers} <= kinds
    assert ("embed", "STORAGE_TYPE_INT8", 32) in kinds
    downs = {(s.type, s.block_elements) for n, s in stored.items() if n.endswith("w_down")}
    assert downs == {(mpb.STORAGE_TYPE_INT8, 16), (mpb.STORAGE_TYPE_INT4_MIN, 32)}
    assert len(stored) == 4 * 18 + 1
    rows = int(next(b for b in core.manifest.buffers if b.name == "L0.wqkv").shape[0])
    codes = np.frombuffer(core.read_resource("weights/L0.wqkv"), np.uint8).reshape(rows, -1)
    scales = np.frombuffer(core.read_resource("weights/L0.wqkv.scale"), "<f4").reshape(
        rows, -1)
    want = np.concatenate([gemma3_checkpoint.tensor(f"model.layers.0.self_attn.{p}_proj"
                                                    ".weight") for p in "qkv"], axis=0)
    got = dequantize_int8(codes, scales)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_an_e4m3_kv_cache_beside_repacked_weights_keeps_the_default_scales(
        tmp_path, signing_key_pair, smollm2_checkpoint, monkeypatch):
    """``--kv-cache-dtype fp8`` on the repacked export: the repacked launches read codes
    the f32 calibration prefill does not run, so the scales are vLLM's default 1.0 and the
    report says why; both storages in one core, lint-clean for both backends. (The cubins
    are not what this checks: compile_targets is stubbed, the fixture compiles them.)"""
    import helios_ignition.kernels_aot as aot

    monkeypatch.setattr(aot, "compile_targets", lambda manifest, targets, progress=None: {})
    private, public = signing_key_pair
    out = tmp_path / "smollm2-gguf-kv8.core"
    summary = export_core(RECIPE, checkpoint=smollm2_checkpoint, key_path=private,
                          namespace=NAMESPACE, out=out, weight_dtype="gguf", targets=("sm_90",),
                          kv_cache_dtype="fp8")
    assert summary.kv_cache.endswith(
        "per-head scales, 1, the uncalibrated default as vLLM's (quantized weights); the "
        "checkpoint carries no KV scales")
    core = open_core(out, [load_public_key(public)])
    buffers = {b.name: b for b in core.manifest.buffers}
    assert buffers["L0.w_down"].storage.type == mpb.STORAGE_TYPE_INT4_MIN
    assert buffers["embed"].storage.type == mpb.STORAGE_TYPE_INT8
    planes = [b for b in buffers.values() if b.role == mpb.BUFFER_ROLE_CACHE_PLANE]
    assert planes and all(b.storage.type == mpb.STORAGE_TYPE_FP8_E4M3 for b in planes)
    for name in ("L0.k_cache.scale", "L29.v_cache.scale"):
        values = np.frombuffer(core.read_resource(buffers[name].weight_resource_id),
                               np.float32)
        assert values.tolist() == [1.0, 1.0, 1.0]
    ops = {k.reference_op for k in core.manifest.kernels}
    assert {"linear_int4_min", "rope_kv_write_fp8kv", "attention_decode_split_fp8kv"} <= ops
    assert lint_capabilities(core.contract, core.manifest, ["cpu", "cuda"]) == []
