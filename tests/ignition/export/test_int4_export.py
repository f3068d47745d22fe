"""4-bit AWQ and GPTQ checkpoints, and ``ignition export --quantize int4``.

AWQ: a tiny checkpoint whose projections are an AutoAWQ GEMM shard packed by AutoAWQ
(tests/fixtures/awq_tiny, written by its make_fixture.py with AutoAWQ's own packer): the
loader's weights equal AutoAWQ's dequantize_gemm bitwise, the export repacks the codes
without floats (INT4 storage, group 64 at K = 64, 128 at K = 128, scales and zero points
as the checkpoint has them), lint passes for both backends, and the cpu backend's greedy
tokens and logits are those of the plain NumPy forward over AutoAWQ's dequantized weights.
GPTQ: tiny checkpoints quantized and packed by GPTQModel (tests/fixtures/gptq_tiny, its
make_fixture.py: the GPTQ algorithm, TorchLinear.pack, the v1 zero points it saves), sym
True and False: the loader's weights equal GPTQModel's dequantize_weight bitwise, the
export stores those codes; GPTQModel's act-order output and the layouts not read are
refused in one line. Then the packing rules by hand and the option's rejections."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.checkpoint import load_safetensors_dir
from helios_ignition.checkpoint.errors import UnsupportedTensorError
from helios_ignition.checkpoint.safetensors_loader import awq_codes, gptq_codes
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, load_public_key, open_core
from helios_tools.kernels.int4 import dequantize_int4, pack_int4
from helios_tools.lint import lint_capabilities
from safetensors.numpy import load_file, save_file

from tests.ignition.export.test_tiny_export import plain_llama_class
from tests.ignition.export.tiny import (
    LLAMA_RECIPE,
    NAMESPACE,
    REPO,
    refused_export,
    refused_on_load_and_export,
    run_export,
)

FIXTURE = REPO / "tests" / "fixtures" / "awq_tiny"
GPTQ_FIXTURE = REPO / "tests" / "fixtures" / "gptq_tiny"
SHARD = FIXTURE / "model-awq.safetensors"
REFERENCE = load_file(str(FIXTURE / "reference-dequantized.safetensors"))
PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
NAMES = tuple(f"model.layers.{i}.{p}.weight" for i in range(2) for p in PROJ)


def _with_quant_config(folder: Path, **quant) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quant
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def awq_checkpoint(module_tmp, smollm2_frontend) -> Path:
    from tests.ignition.export.tiny import write_checkpoint

    folder = write_checkpoint(module_tmp("awq") / "tiny-awq", smollm2_frontend,
                              drop=NAMES)
    shutil.copy(SHARD, folder / SHARD.name)
    _with_quant_config(folder, quant_method="awq", bits=4, zero_point=True, version="gemm")
    return folder


def test_loader_reads_autoawq_weights_exactly(awq_checkpoint):
    ck = load_safetensors_dir(awq_checkpoint)
    for name in NAMES:
        np.testing.assert_array_equal(ck.tensor(name), REFERENCE[name])
        codes, scales, zeros = ck.int4(name)
        assert np.array_equal(dequantize_int4(codes, scales, zeros), REFERENCE[name])
    codes, scales, zeros = ck.int4("model.layers.1.mlp.down_proj.weight")
    assert codes.shape == (64, 64) and scales.shape == zeros.shape == (64, 1)  # group 128
    assert ck.int4("model.layers.0.self_attn.q_proj.weight")[1].shape == (64, 1)  # group 64
    assert ck.int4("model.norm.weight") is None


@pytest.fixture(scope="module")
def awq_core(module_tmp, awq_checkpoint, signing_key_pair):
    private, public = signing_key_pair
    out = module_tmp("awq-core") / "tiny-awq.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", awq_checkpoint, "--key", private,
                        "--namespace", NAMESPACE, "--out", out, "--weight-dtype", "f32",
                        "--quantize", "int4")
    assert result.exit_code == 0, result.output
    core = open_core(out, [load_public_key(public)])
    authorize(core, NAMESPACE)
    return core


def test_export_repacks_the_codes_and_declares_int4_storage(awq_core, awq_checkpoint):
    buffers = {b.name: b for b in awq_core.manifest.buffers}
    assert sorted(n for n, b in buffers.items() if b.HasField("storage")) == sorted(
        f"L{i}.{k}" for i in range(2) for k in ("wqkv", "wo", "w_gate_up", "w_down"))
    assert buffers["L1.wqkv"].storage == mpb.TensorStorage(
        type=mpb.STORAGE_TYPE_INT4, block_elements=64, block_bytes=32,
        scales=mpb.SideBuffer(buffer="L1.wqkv.scale", dtype=mpb.D_TYPE_F32),
        zero_points=mpb.SideBuffer(buffer="L1.wqkv.zero", dtype=mpb.D_TYPE_F32))
    assert buffers["L1.w_down"].storage.block_elements == 128
    ck = load_safetensors_dir(awq_checkpoint)
    parts = [ck.int4(f"model.layers.1.self_attn.{p}_proj.weight") for p in "qkv"]
    for i, suffix, dtype in ((0, "", np.uint8), (1, ".scale", "<f4"), (2, ".zero", "<f4")):
        stored = np.frombuffer(awq_core.read_resource(f"weights/L1.wqkv{suffix}"), dtype)
        assert np.array_equal(stored, np.concatenate([p[i] for p in parts]).reshape(-1))
    assert not buffers["embed"].HasField("storage")


def test_lint_passes_for_both_backends(awq_core):
    assert lint_capabilities(awq_core.contract, awq_core.manifest, ["cpu", "cuda"]) == []


def test_cpu_serves_awq_like_the_plain_forward(awq_core, awq_checkpoint):
    ck = load_safetensors_dir(awq_checkpoint)
    prompts = [[1, 504, 3458, 282, 2012, 30], [1, 9690, 314]]
    model = load_native(awq_core, "cpu")
    try:
        driver = Driver(model, collect_logits=True)
        got = driver.generate(prompts, max_new_tokens=6)
    finally:
        model.close()
    plain = plain_llama_class()(ck, max_context=256)
    for i, ids in enumerate(prompts):
        want, _ = plain.greedy(ids, 6)
        assert got[i] == want, i
        first = plain.forward(np.asarray([ids]), plain.new_cache(1, len(ids)))[0]
        np.testing.assert_allclose(driver.logits[i][0], first, rtol=0, atol=1e-4)


def _gptq_pack(codes: np.ndarray, zeros: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GPTQ's layout by hand: qweight [in / 8, out], nibble i of row r = input row 8r + i;
    qzeros [G, out / 8], nibble i of column c = output 8c + i, storing zero - 1 (v1)."""
    k, n = codes.shape
    qweight = np.zeros((k // 8, n), np.uint32)
    for i in range(8):
        qweight |= codes[i::8].astype(np.uint32) << (4 * i)
    z = (zeros.astype(np.int64) - 1) & 0xF
    qzeros = np.zeros((zeros.shape[0], n // 8), np.uint32)
    for i in range(8):
        qzeros |= z[:, i::8].astype(np.uint32) << (4 * i)
    return qweight.view(np.int32), qzeros.view(np.int32)


def test_awq_order_by_hand():
    """Nibble i of an AWQ word holds column (0, 2, 4, 6, 1, 3, 5, 7)[i]: the word
    0x76543210 (nibble i = i) unpacks to columns 0, 4, 1, 5, 2, 6, 3, 7; 0xF..F to 15s."""
    q = np.array([[0x76543210], [-1]], np.int64).astype(np.int32)
    codes, zeros = awq_codes(q, q[:1])
    assert codes.tolist() == [[0, 4, 1, 5, 2, 6, 3, 7], [15] * 8]
    assert zeros.tolist() == [[0, 4, 1, 5, 2, 6, 3, 7]]


def test_gptq_v2_zero_points_are_stored_as_they_are():
    codes = np.arange(16, dtype=np.uint8).reshape(16, 1).repeat(8, axis=1)
    zeros = np.arange(8, dtype=np.uint8).reshape(1, 8)
    qweight, _ = _gptq_pack(codes, zeros)
    qzeros = np.array([[0x76543210]], np.int64).astype(np.int32)
    got_codes, got_zeros = gptq_codes(qweight, qzeros, v2=True)
    assert np.array_equal(got_codes, codes) and got_zeros.tolist() == [list(range(8))]


def test_a_packed_tensor_of_another_dtype_is_refused(tmp_path, smollm2_frontend):
    folder = _awq_folder(tmp_path, smollm2_frontend)
    tensors = load_file(str(folder / SHARD.name))
    name = "model.layers.0.mlp.up_proj.qweight"
    tensors[name] = tensors[name].view(np.float32)
    save_file(tensors, str(folder / SHARD.name))
    ck = load_safetensors_dir(folder)
    with pytest.raises(UnsupportedTensorError, match=f"{name!r} has dtype F32; packed 4-bit "
                       "tensors are I32"):
        ck.tensor("model.layers.0.mlp.up_proj.weight")


def test_gptq_packing_by_hand():
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 16, (64, 16)).astype(np.uint8)
    zeros = rng.integers(0, 16, (1, 16)).astype(np.uint8)  # a zero point of 0 wraps: v1
    qweight, qzeros = _gptq_pack(codes, zeros)
    got_codes, got_zeros = gptq_codes(qweight, qzeros, v2=False)
    assert np.array_equal(got_codes, codes) and np.array_equal(got_zeros, zeros)


def _awq_folder(tmp_path, frontend) -> Path:
    from tests.ignition.export.tiny import write_checkpoint

    folder = write_checkpoint(tmp_path / "tiny-awq", frontend, drop=NAMES)
    shutil.copy(SHARD, folder / SHARD.name)
    _with_quant_config(folder, quant_method="awq", bits=4, zero_point=True, version="gemm")
    return folder


def _gptq_folder(folder: Path, frontend, tag: str) -> Path:
    """The tiny checkpoint with GPTQModel's shard and quantization_config (`tag`: sym or
    asym)."""
    from tests.ignition.export.tiny import write_checkpoint

    write_checkpoint(folder, frontend, drop=NAMES)
    shutil.copy(GPTQ_FIXTURE / f"model-gptq-{tag}.safetensors", folder / "model-gptq.safetensors")
    quant = json.loads((GPTQ_FIXTURE / f"config-{tag}.json").read_text())
    _with_quant_config(folder, **quant["quantization_config"])
    return folder


def test_the_gptq_fixture_is_what_gptqmodel_writes():
    for tag, sym in (("sym", True), ("asym", False)):
        quant = json.loads((GPTQ_FIXTURE / f"config-{tag}.json").read_text())
        assert quant["quantization_config"] == {
            "bits": 4, "checkpoint_format": "gptq", "desc_act": False, "format": "gptq",
            "group_size": 128, "lm_head": False, "method": "gptq", "pack_dtype": "int32",
            "quant_method": "gptq", "sym": sym}
        shard = load_file(str(GPTQ_FIXTURE / f"model-gptq-{tag}.safetensors"))
        prefix = "model.layers.1.mlp.down_proj"
        assert {k.removeprefix(prefix): (v.dtype, v.shape) for k, v in shard.items()
                if k.startswith(prefix)} == {
            ".qweight": (np.int32, (16, 64)), ".qzeros": (np.int32, (1, 8)),
            ".scales": (np.float16, (1, 64)), ".g_idx": (np.int32, (128,))}
    # sym: every zero point is 8, stored v1 as 7 in each nibble
    sym = load_file(str(GPTQ_FIXTURE / "model-gptq-sym.safetensors"))
    assert all(np.all(v == 0x77777777) for k, v in sym.items() if k.endswith(".qzeros"))


@pytest.mark.parametrize("tag", ["sym", "asym"])
def test_loader_reads_gptqmodel_weights_exactly(tmp_path, smollm2_frontend, tag):
    """Bitwise: (code - zero) * f16 scale is exact in f32, here and in the reference."""
    reference = load_file(str(GPTQ_FIXTURE / f"reference-{tag}.safetensors"))
    ck = load_safetensors_dir(_gptq_folder(tmp_path / tag, smollm2_frontend, tag))
    for name in NAMES:
        np.testing.assert_array_equal(ck.tensor(name), reference[name])
        codes, scales, zeros = ck.int4(name)
        assert np.array_equal(dequantize_int4(codes, scales, zeros), reference[name])
    # group_size 128 covers K = 64 in one group: the export's 64 there
    assert ck.int4("model.layers.0.self_attn.q_proj.weight")[1].shape == (64, 1)
    assert ck.int4("model.layers.0.mlp.down_proj.weight")[1].shape == (64, 1)


@pytest.mark.parametrize("tag", ["sym", "asym"])
def test_gptq_export_stores_gptqmodels_codes(tmp_path, smollm2_frontend, signing_key_pair,
                                             tag):
    folder = _gptq_folder(tmp_path / tag, smollm2_frontend, tag)
    private, public = signing_key_pair
    out = tmp_path / "gptq.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", folder, "--key", private,
                        "--namespace", NAMESPACE, "--out", out, "--weight-dtype", "f32",
                        "--quantize", "int4")
    assert result.exit_code == 0, result.output
    core = open_core(out, [load_public_key(public)])
    reference = load_file(str(GPTQ_FIXTURE / f"reference-{tag}.safetensors"))
    sizes = {"wo": ("o_proj", 64), "w_down": ("down_proj", 128)}
    for key, (proj, block) in sizes.items():
        decl = next(b for b in core.manifest.buffers if b.name == f"L1.{key}")
        assert decl.storage.block_elements == block
        codes = np.frombuffer(core.read_resource(f"weights/L1.{key}"), np.uint8)
        scales = np.frombuffer(core.read_resource(f"weights/L1.{key}.scale"), "<f4")
        zeros = np.frombuffer(core.read_resource(f"weights/L1.{key}.zero"), "<f4")
        want = reference[f"model.layers.1.{'mlp' if key == 'w_down' else 'self_attn'}."
                         f"{proj}.weight"]
        rows = want.shape[0]
        got = dequantize_int4(codes.reshape(rows, -1), scales.reshape(rows, -1),
                              zeros.reshape(rows, -1))
        assert np.array_equal(got, want), key
    assert lint_capabilities(core.contract, core.manifest, ["cpu", "cuda"]) == []


def test_gptq_act_order_is_refused_in_one_line(tmp_path, smollm2_frontend, signing_key_pair):
    """GPTQModel's desc_act=True output (act-order.safetensors: down_proj of layer 0, groups
    of 32 along K = 128): input row i belongs to group g_idx[i], not i // 32."""
    folder = _gptq_folder(tmp_path / "act", smollm2_frontend, "asym")
    shard = folder / "model-gptq.safetensors"
    tensors = load_file(str(shard)) | load_file(str(GPTQ_FIXTURE / "act-order.safetensors"))
    save_file(tensors, str(shard))
    _with_quant_config(folder, **json.loads((GPTQ_FIXTURE / "config-asym.json").read_text())[
        "quantization_config"] | {"desc_act": True, "group_size": 32})
    prefix = "model.layers.0.mlp.down_proj"
    message = (f"{folder}: {prefix}.g_idx permutes the groups (GPTQ act-order / desc_act); "
               "re-quantize with desc_act=False")
    with pytest.raises(UnsupportedTensorError) as info:
        load_safetensors_dir(folder).int4(f"{prefix}.weight")
    assert str(info.value) == message
    private, _ = signing_key_pair
    assert refused_export(folder, private, tmp_path / "x.core", "--quantize", "int4").endswith(
        message)


@pytest.mark.parametrize(("method", "key", "value", "read"), [
    ("gptq", "checkpoint_format", "gptq_p", "'gptq', 'gptq_v2'"),
    ("gptq", "checkpoint_format", "marlin", "'gptq', 'gptq_v2'"),
    ("awq", "version", "gemv", "'gemm'"),
])
def test_a_packed_layout_not_read_is_refused(tmp_path, smollm2_frontend, signing_key_pair,
                                            method, key, value, read):
    """Same tensor names, other bit layouts: the config's layout key is refused in one
    line instead of misreading the words."""
    if method == "gptq":
        folder = _gptq_folder(tmp_path / "g", smollm2_frontend, "asym")
        quant = json.loads((GPTQ_FIXTURE / "config-asym.json").read_text())[
            "quantization_config"]
    else:
        folder = _awq_folder(tmp_path, smollm2_frontend)
        quant = {"quant_method": "awq", "bits": 4, "zero_point": True}
    _with_quant_config(folder, **quant | {key: value})
    message = (f"{folder}: config.json's quantization_config {key} is {value!r}; the "
               f"{method} layouts read are {read}")
    private, _ = signing_key_pair
    refused_on_load_and_export(folder, private, tmp_path / "x.core", "int4", message)


def test_packed_weights_without_a_4_bit_config_are_refused(tmp_path, smollm2_frontend):
    folder = _awq_folder(tmp_path, smollm2_frontend)
    _with_quant_config(folder, quant_method="bitsandbytes", bits=4)
    with pytest.raises(UnsupportedTensorError, match="only 4-bit awq and gptq are read"):
        load_safetensors_dir(folder)


def test_quantize_int4_needs_a_group_that_divides_k(tmp_path, make_checkpoint,
                                                    signing_key_pair):
    """The tiny float checkpoint (K 64 and 128) quantizes with groups 64 and 128."""
    private, public = signing_key_pair
    out = tmp_path / "q.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", make_checkpoint(), "--key", private,
                        "--namespace", NAMESPACE, "--out", out, "--quantize", "int4")
    assert result.exit_code == 0, result.output
    core = open_core(out, [load_public_key(public)])
    sizes = {b.name: b.storage.block_elements for b in core.manifest.buffers
             if b.HasField("storage")}
    assert sizes["L0.wqkv"] == 64 and sizes["L0.w_down"] == 128
    assert pack_int4  # the layout the codes are stored in (kernels.int4)


def test_an_int4_weight_without_zero_points_is_refused_on_both_backends(awq_core):
    """runtime.storage: the INT4 forms read zero points; storage declaring none (the
    symmetric form of the schema) has no zero-point argument they could take."""
    manifest = type(awq_core.manifest)()
    manifest.CopyFrom(awq_core.manifest)
    decl = next(b for b in manifest.buffers if b.name == "L0.wo")
    decl.storage.ClearField("zero_points")
    for backend in ("cpu", "cuda"):
        found = [f for f in lint_capabilities(awq_core.contract, manifest, [backend])
                 if f.rule == "runtime.storage"]
        readers = sum(1 for g in manifest.graphs for x in g.launches
                      if any(a.buffer.buffer == "L0.wo" for a in x.args))
        assert len(found) == readers > 0, [str(f) for f in found]  # one per launch
        assert all(f.value == "L0.wo.zero" and f.detail.endswith(
            "must read 'L0.wo''s own zero points (it declares none)") for f in found)


def test_a_checkpoint_group_other_than_the_exports_is_refused(tmp_path, smollm2_frontend,
                                                              signing_key_pair):
    """q_proj stored in groups of 32 (two per row of 64): the export declares 64 at K = 64
    and stops, naming the tensor, instead of regrouping."""
    folder = _awq_folder(tmp_path, smollm2_frontend)
    tensors = load_file(str(folder / SHARD.name))
    prefix = "model.layers.0.self_attn.q_proj"
    tensors[f"{prefix}.scales"] = np.repeat(tensors[f"{prefix}.scales"], 2, axis=0)
    tensors[f"{prefix}.qzeros"] = np.repeat(tensors[f"{prefix}.qzeros"], 2, axis=0)
    save_file(tensors, str(folder / SHARD.name))
    private, _ = signing_key_pair
    assert refused_export(folder, private, tmp_path / "x.core", "--quantize", "int4").endswith(
        f"{prefix}.weight: INT4 groups of 32 elements; the export declares groups of 64 "
        "at K = 64")
