"""``ignition export --quantize fp8`` of a tiny checkpoint whose projections are an FP8
shard written by HF compressed-tensors itself (tests/fixtures/fp8_tiny, made by its
make_fixture.py in a throwaway torch + compressed-tensors environment): layer 0 in the
FP8_DYNAMIC scheme (bf16 scales per output channel), layer 1 in the FP8 scheme (one bf16
scale per tensor, a static input_scale), config.json's quantization_config as the library
writes it. The loader's weights equal compressed-tensors' own dequantization bitwise, the
export keeps the codes and scales exactly (FP8 storage with [rows, 1] scale weights), lint
passes for both backends, and the cpu backend serves the core: its greedy tokens and
logits are those of the plain NumPy forward (bench/numpy_forward.py) with each
projection's input rows quantized to e4m3 per token. Then every rejection of the option
and of the layouts the loader does not read."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.checkpoint import load_safetensors_dir
from helios_ignition.checkpoint.errors import UnsupportedTensorError
from helios_ignition.checkpoint.safetensors_loader import bf16_to_float32
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, load_public_key, open_core
from helios_tools.kernels.fp8 import decode_e4m3, quantize_rows
from helios_tools.lint import lint_capabilities
from safetensors.numpy import load_file

from tests.ignition.export.test_tiny_export import plain_llama_class
from tests.ignition.export.tiny import (
    LLAMA_RECIPE,
    NAMESPACE,
    REPO,
    TINY,
    export_error,
    refused_on_load_and_export,
    run_export,
)

FIXTURE = REPO / "tests" / "fixtures" / "fp8_tiny"
SHARD = FIXTURE / "model-fp8.safetensors"
REFERENCE = load_file(str(FIXTURE / "reference-dequantized.safetensors"))
QUANT_CONFIG = json.loads((FIXTURE / "config.json").read_text())["quantization_config"]
PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
FP8_NAMES = tuple(f"model.layers.{i}.{p}.weight" for i in range(2) for p in PROJ)


def _read(path: Path) -> tuple[dict, dict[str, bytes]]:
    """A safetensors file's header entries (no __metadata__) and each tensor's bytes."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in header.items()}
    return header, data


def _write(path: Path, header: dict, data: dict[str, bytes]) -> None:
    """Write entries back (dtype and shape from `header`, bytes from `data`)."""
    entries, blob = {}, bytearray()
    for name, info in header.items():
        entries[name] = {"dtype": info["dtype"], "shape": info["shape"],
                         "data_offsets": [len(blob), len(blob) + len(data[name])]}
        blob += data[name]
    text = json.dumps(entries).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(blob))


def _stored(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(codes, scales [rows, 1] f32) of `name` read straight from the fixture's bytes."""
    header, data = _read(SHARD)
    assert header[name]["dtype"] == "F8_E4M3" and header[name + "_scale"]["dtype"] == "BF16"
    codes = np.frombuffer(data[name], np.uint8).reshape(header[name]["shape"])
    scale = bf16_to_float32(np.frombuffer(data[name + "_scale"], "<u2"))
    return codes, np.broadcast_to(scale.reshape(-1, 1), (codes.shape[0], 1))


def _fp8_folder(folder: Path, frontend, quant: dict | None = None) -> Path:
    """The tiny checkpoint with the fixture's shard and its quantization_config."""
    from tests.ignition.export.tiny import write_checkpoint

    write_checkpoint(folder, frontend, drop=FP8_NAMES)
    shutil.copy(SHARD, folder / SHARD.name)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = QUANT_CONFIG if quant is None else quant
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def fp8_checkpoint(module_tmp, smollm2_frontend) -> Path:
    return _fp8_folder(module_tmp("fp8") / "tiny-fp8", smollm2_frontend)


def test_the_fixture_is_what_compressed_tensors_writes():
    groups = QUANT_CONFIG["config_groups"]
    assert QUANT_CONFIG["quant_method"] == "compressed-tensors"
    assert QUANT_CONFIG["format"] == "float-quantized"
    assert [(g["weights"]["strategy"], g["input_activations"]["strategy"],
             g["input_activations"]["dynamic"]) for g in groups.values()] == [
        ("channel", "token", True), ("tensor", "tensor", False)]
    header, _ = _read(SHARD)
    assert header["model.layers.0.mlp.up_proj.weight_scale"]["shape"] == [128, 1]
    assert "model.layers.0.mlp.up_proj.input_scale" not in header  # dynamic: none stored
    assert header["model.layers.1.mlp.up_proj.weight_scale"]["shape"] == [1]
    scale = header["model.layers.1.mlp.up_proj.input_scale"]
    assert (scale["dtype"], scale["shape"]) == ("BF16", [1])  # static: stored, not read


def test_loader_reads_compressed_tensors_weights_exactly(fp8_checkpoint):
    """Bitwise: an e4m3 code times a bf16 scale is exact in f32, on both sides."""
    ck = load_safetensors_dir(fp8_checkpoint)
    for name in FP8_NAMES:
        np.testing.assert_array_equal(ck.tensor(name), REFERENCE[name])
        codes, scales = ck.fp8(name)
        want_codes, want_scales = _stored(name)
        assert np.array_equal(codes, want_codes) and np.array_equal(scales, want_scales)
        assert np.array_equal(decode_e4m3(codes) * scales, REFERENCE[name])
    assert ck.fp8("model.norm.weight") is None


@pytest.fixture(scope="module")
def fp8_core(module_tmp, fp8_checkpoint, signing_key_pair):
    private, public = signing_key_pair
    out = module_tmp("fp8-core") / "tiny-fp8.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", fp8_checkpoint, "--key", private,
                        "--namespace", NAMESPACE, "--out", out, "--weight-dtype", "f32",
                        "--quantize", "fp8")
    assert result.exit_code == 0, result.output
    core = open_core(out, [load_public_key(public)])
    authorize(core, NAMESPACE)
    return core


def test_export_keeps_the_codes_and_declares_fp8_storage(fp8_core):
    buffers = {b.name: b for b in fp8_core.manifest.buffers}
    stored = sorted(n for n, b in buffers.items() if b.HasField("storage"))
    assert stored == sorted(f"L{i}.{k}" for i in range(2)
                            for k in ("wqkv", "wo", "w_gate_up", "w_down"))
    wqkv = buffers["L1.wqkv"]
    assert wqkv.storage == mpb.TensorStorage(
        type=mpb.STORAGE_TYPE_FP8_E4M3, block_elements=64, block_bytes=64,
        scales=mpb.SideBuffer(buffer="L1.wqkv.scale", dtype=mpb.D_TYPE_F32))
    assert list(buffers["L1.wqkv.scale"].shape) == [128, 1]
    parts = [_stored(f"model.layers.1.self_attn.{p}_proj.weight") for p in "qkv"]
    codes = np.frombuffer(fp8_core.read_resource("weights/L1.wqkv"), np.uint8)
    scales = np.frombuffer(fp8_core.read_resource("weights/L1.wqkv.scale"), "<f4")
    assert np.array_equal(codes, np.concatenate([c for c, _ in parts]).reshape(-1))
    assert np.array_equal(scales, np.concatenate([s for _, s in parts]).reshape(-1))
    ops = {k.reference_op for k in fp8_core.manifest.kernels}
    assert {"linear_fp8", "swiglu_linear_fp8"} <= ops
    # the embedding (and the tied LM head reading it) stays plain
    assert not buffers["embed"].HasField("storage")


def test_lint_passes_for_both_backends(fp8_core):
    assert lint_capabilities(fp8_core.contract, fp8_core.manifest, ["cpu", "cuda"]) == []


def _first_fp8_launch(manifest):
    ops = {k.id: k.reference_op for k in manifest.kernels}
    return next(launch for g in manifest.graphs for launch in g.launches
                if ops[launch.kernel] == "linear_fp8")


@pytest.mark.parametrize("swap", ["scale", "weight"])
def test_an_fp8_product_must_read_codes_and_their_own_scales(fp8_core, swap):
    """runtime.storage on both backends: a linear_fp8 launch passing another weight's
    scales, or a plain buffer as its codes, is refused at the argument."""
    manifest = type(fp8_core.manifest)()
    manifest.CopyFrom(fp8_core.manifest)
    launch = _first_fp8_launch(manifest)
    if swap == "scale":
        index, value = 2, "L1.wo.scale" if launch.args[1].buffer.buffer != "L1.wo" else "L0.wo.scale"
    else:
        index, value = 1, "final_norm"
    launch.args[index].buffer.buffer = value
    for backend in ("cpu", "cuda"):
        findings = [f for f in lint_capabilities(fp8_core.contract, manifest, [backend])
                    if f.rule == "runtime.storage"]
        assert len(findings) == 1, [str(f) for f in findings]
        assert findings[0].path.endswith(f".args[{index}].buffer.buffer")
        assert findings[0].value == value


class _W8A8:
    """An input-major weight [in, out] whose products quantize their input rows per token
    (e4m3, scale max|row| / 448): ``h @ _W8A8(w)``."""

    __array_ufunc__ = None  # ndarray @ this defers to __rmatmul__

    def __init__(self, w_t: np.ndarray):
        self.w_t = w_t

    def __rmatmul__(self, h: np.ndarray) -> np.ndarray:
        rows = h.reshape(-1, h.shape[-1])
        codes, scales = quantize_rows(rows)
        return ((decode_e4m3(codes) * scales) @ self.w_t).reshape(*h.shape[:-1], -1)


def test_cpu_serves_fp8_like_the_plain_forward(fp8_core, fp8_checkpoint):
    ck = load_safetensors_dir(fp8_checkpoint)
    tokenizer_ids = [[1, 504, 3458, 282, 2012, 30], [1, 9690, 314]]
    model = load_native(fp8_core, "cpu")
    try:
        driver = Driver(model, collect_logits=True)
        got = driver.generate(tokenizer_ids, max_new_tokens=6)
    finally:
        model.close()
    plain = plain_llama_class()(ck, max_context=256)
    for layer in plain.layers:
        for key in ("wq", "wk", "wv", "wo", "wg", "wu", "wd"):
            layer[key] = _W8A8(layer[key])
    for i, ids in enumerate(tokenizer_ids):
        want, _ = plain.greedy(ids, 6)
        assert got[i] == want, i
        first = plain.forward(np.asarray([ids]), plain.new_cache(1, len(ids)))[0]
        np.testing.assert_allclose(driver.logits[i][0], first, rtol=0, atol=1e-3)


def test_quantize_from_float_weights(tmp_path, make_checkpoint, signing_key_pair):
    """A float checkpoint: each row quantized with scale max|row| / 448."""
    private, public = signing_key_pair
    folder = make_checkpoint()
    out = tmp_path / "q.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", folder, "--key", private, "--namespace",
                        NAMESPACE, "--out", out, "--quantize", "fp8")
    assert result.exit_code == 0, result.output
    core = open_core(out, [load_public_key(public)])
    w = load_safetensors_dir(folder).tensor("model.layers.0.self_attn.o_proj.weight")
    codes, scales = quantize_rows(w)
    assert np.array_equal(np.frombuffer(core.read_resource("weights/L0.wo"), np.uint8),
                          codes.reshape(-1))
    assert np.array_equal(np.frombuffer(core.read_resource("weights/L0.wo.scale"), "<f4"),
                          scales.reshape(-1))
    # the recipe's bf16 embedding is kept in bf16
    assert next(b for b in core.manifest.buffers if b.name == "embed").dtype == mpb.D_TYPE_BF16


@pytest.mark.parametrize(("extra", "message"), [
    (("--weight-dtype", "gguf"), "--quantize fp8 and --weight-dtype gguf are exclusive"),
    (("--tensor-parallel", "2"), "--quantize fp8 stores whole tensors"),
    (("--quantize", "int3"), "Invalid value for '--quantize'"),
])
def test_rejections_are_usage_errors(tmp_path, tiny_checkpoint, signing_key_pair, extra,
                                     message):
    private, _ = signing_key_pair
    out = tmp_path / "x.core"
    args = ["--quantize", "fp8", *extra] if extra[0] != "--quantize" else list(extra)
    result = run_export(LLAMA_RECIPE, "--checkpoint", tiny_checkpoint, "--key", private,
                        "--namespace", NAMESPACE, "--out", out, *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_a_recipe_keeping_gguf_blocks_is_named_in_the_refusal(tmp_path, tiny_checkpoint,
                                                               signing_key_pair):
    """Without --weight-dtype the gguf weights are the recipe's (as gemma3_270m.py's): the
    refusal named `--weight-dtype gguf`, an option the operator never passed."""
    private, _ = signing_key_pair
    recipe = tmp_path / "gguf_recipe.py"
    recipe.write_text(
        "from dataclasses import replace\n"
        "from helios_ignition.recipe import load_recipe_module\n"
        f"_LLAMA = load_recipe_module({str(LLAMA_RECIPE)!r})\n\n\n"
        "def make_recipe(checkpoint):\n"
        "    return replace(_LLAMA.make_recipe(checkpoint), name='tiny-gguf', "
        "weight_dtype='gguf')\n")
    out = tmp_path / "x.core"
    for quantize in ("fp8", "int4"):
        result = run_export(recipe, "--checkpoint", tiny_checkpoint, "--key", private,
                            "--namespace", NAMESPACE, "--out", out, "--quantize", quantize)
        assert result.exit_code == 2, result.output
        assert export_error(result) == (
            f"ignition: error: --quantize {quantize} and recipe tiny-gguf's weight dtype gguf "
            "(pass --weight-dtype bf16 or f32 to quantize float weights) are exclusive (the "
            "gguf blocks are quantized already)")
    assert not out.exists()


@pytest.mark.parametrize(("shape", "layout"), [
    ([64, 2], "compressed-tensors' group strategy, groups of 64 along K = 128"),
    ([32, 2], "a block-wise layout: as many values as rows, not one per row"),
])
def test_fp8_scale_of_another_shape_is_refused(tmp_path, smollm2_frontend, shape, layout):
    """A scale that is neither one per output channel ([rows, 1] or [rows]) nor one per
    tensor is refused, naming the tensor (`layout` says which checkpoint writes it)."""
    folder = _fp8_folder(tmp_path / "grouped", smollm2_frontend)
    header, data = _read(folder / SHARD.name)
    name = "model.layers.0.mlp.down_proj.weight_scale"
    header[name]["shape"] = shape
    data[name] = np.full(shape[0] * shape[1], 0x3C00, "<u2").tobytes()  # bf16 2**-7
    _write(folder / SHARD.name, header, data)
    ck = load_safetensors_dir(folder)
    with pytest.raises(UnsupportedTensorError, match=f"{name!r} has shape "
                       f"\\[{shape[0]}, {shape[1]}\\]; FP8 scales are one per tensor or one "
                       "per output channel \\(64\\), not per block"):
        ck.tensor("model.layers.0.mlp.down_proj.weight")
    assert TINY.hidden_size == 64


OTHER_SCHEMES = json.loads((FIXTURE / "other-schemes.json").read_text())


@pytest.mark.parametrize(("scheme", "described"), [
    ("W4A16", "pack-quantized int4 weights by group"),
    ("W8A8", "int-quantized int8 weights by channel"),
    ("FP8_BLOCK", "float-quantized float8 weights by block"),
])
def test_a_compressed_tensors_scheme_not_read_is_refused(tmp_path, smollm2_frontend,
                                                         signing_key_pair, scheme, described):
    """The quantization_config compressed-tensors writes for that preset (the fixture's
    other-schemes.json) is refused by its config group, in one line, before any tensor
    is read: a block-wise scale on these small matrices is a single value that would
    pass for one per tensor."""
    folder = _fp8_folder(tmp_path / scheme, smollm2_frontend, OTHER_SCHEMES[scheme])
    message = (f"{folder}: config.json's quantization_config group 'group_0' is {described}; "
               "the compressed-tensors scheme read is float8 weights by channel or tensor "
               "(float-quantized)")
    private, _ = signing_key_pair
    refused_on_load_and_export(folder, private, tmp_path / "x.core", "fp8", message)
