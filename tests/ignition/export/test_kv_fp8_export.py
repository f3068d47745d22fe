"""``ignition export --kv-cache-dtype fp8``: the tiny checkpoint's KV cache planes (and
their tier planes) stored as e4m3 codes with per-head scales calibrated at export, the
report line naming where the scales came from (the default 1.0 where calibration does
not run: quantized weights), a lint-clean core for both backends; vLLM's names for the
option, and a refused value in one usage line (exit 2)."""

from __future__ import annotations

import numpy as np
import pytest
from helios_contract.schema import manifest_pb2 as mpb
from helios_tools.core import load_public_key, open_core
from helios_tools.lint import lint_capabilities

from tests.ignition.export.tiny import (
    LLAMA_RECIPE,
    NAMESPACE,
    assert_lint_clean,
    inspect_kv_cache,
    kv_cache_line,
    refused_export,
    run_export,
)


@pytest.mark.parametrize("name", ["fp8", "fp8_e4m3"])
def test_export_stores_the_kv_cache_as_e4m3(tmp_path, make_checkpoint, signing_key_pair,
                                            name):
    private, public = signing_key_pair
    out = tmp_path / "kv8.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", make_checkpoint(), "--key", private,
                        "--namespace", NAMESPACE, "--out", out, "--kv-cache-dtype", name)
    assert result.exit_code == 0, result.output
    planes = [line for line in result.stdout.splitlines() if line.startswith("KV cache")]
    core = open_core(out, [load_public_key(public)])
    stored = [b for b in core.manifest.buffers if b.role == mpb.BUFFER_ROLE_CACHE_PLANE]
    assert stored and all(b.storage.type == mpb.STORAGE_TYPE_FP8_E4M3 for b in stored)
    scales = {b.name: b for b in core.manifest.buffers if b.name.endswith("_cache.scale")}
    layers = len({b.name.split(".")[0] for b in stored})
    assert len(scales) == 2 * layers
    kvh = int(stored[0].shape[-2])
    for b in scales.values():
        assert list(b.shape) == [kvh]
        values = np.frombuffer(core.read_resource(b.weight_resource_id), np.float32)
        assert (values > 0).all() and (values != 1.0).all()  # calibrated, not the default
    assert len(planes) == 1 and planes[0].startswith(
        f"KV cache fp8 e4m3: {2 * layers} planes, {2 * layers * kvh} per-head scales, "
        "calibrated at export on a fixed calibration prompt through the captured prefill "
        "(NumPy), amax x 1.25 / 448: ")
    assert planes[0].endswith("; the checkpoint carries no KV scales")
    line, regions = inspect_kv_cache(out)  # helios-tools inspect names the storage type
    assert line == kv_cache_line("fp8_e4m3")
    assert {(p["element"], p["element_bytes"]) for r in regions for p in r["planes"]} == {
        ("fp8_e4m3", 1)}
    assert_lint_clean(core)
    assert lint_capabilities(core.contract, core.manifest, ["cpu", "cuda"]) == []


def test_auto_keeps_the_f32_cache(tmp_path, make_checkpoint, signing_key_pair):
    private, public = signing_key_pair
    out = tmp_path / "auto.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", make_checkpoint(), "--key", private,
                        "--namespace", NAMESPACE, "--out", out, "--kv-cache-dtype", "auto")
    assert result.exit_code == 0, result.output
    assert "KV cache" not in result.stdout
    core = open_core(out, [load_public_key(public)])
    assert not any(b.HasField("storage") for b in core.manifest.buffers)
    assert inspect_kv_cache(out)[0] == kv_cache_line("f32")


def test_an_unknown_kv_cache_dtype_is_a_usage_error(tmp_path, signing_key_pair):
    private, _ = signing_key_pair
    out = tmp_path / "x.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", "smollm2", "--key", private,
                        "--namespace", NAMESPACE, "--out", out, "--kv-cache-dtype", "fp8_e5m2")
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert "'fp8_e5m2' is not one of 'auto', 'fp8', 'fp8_e4m3', 'bf16'" in result.stderr
    assert not out.exists()


def test_export_core_refuses_an_unknown_kv_cache_dtype(tmp_path, signing_key_pair):
    """The API's own check (the CLI's choice list aside), before anything is read."""
    from helios_ignition.export import ExportUsageError, export_core

    private, _ = signing_key_pair
    with pytest.raises(ExportUsageError, match=r"--kv-cache-dtype must be one of auto, fp8, "
                                               r"fp8_e4m3, bf16, not 'int8'"):
        export_core(LLAMA_RECIPE, checkpoint="smollm2", key_path=private, namespace=NAMESPACE,
                    out=tmp_path / "x.core", kv_cache_dtype="int8")
    assert not (tmp_path / "x.core").exists()


def test_quantized_weights_keep_the_default_scales(tmp_path, make_checkpoint,
                                                   signing_key_pair):
    """Calibration runs the f32 prefill over plain float weights only: with --quantize the
    scales are the default 1.0, and the report says why."""
    private, public = signing_key_pair
    out = tmp_path / "q.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", make_checkpoint(), "--key", private,
                        "--namespace", NAMESPACE, "--out", out, "--kv-cache-dtype", "fp8",
                        "--quantize", "fp8")
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("KV cache")]
    assert line.endswith("per-head scales, 1, the uncalibrated default as vLLM's (quantized "
                         "weights); the checkpoint carries no KV scales")
    core = open_core(out, [load_public_key(public)])
    for b in core.manifest.buffers:
        if b.name.endswith("_cache.scale"):
            values = np.frombuffer(core.read_resource(b.weight_resource_id), np.float32)
            assert values.tolist() == [1.0] * int(b.shape[0])
    assert_lint_clean(core)


def _scales(layers: int, layout: str) -> dict[str, np.ndarray]:
    """Per-layer KV scales as FP8 checkpoints store them (one f32 each)."""
    out = {}
    for i in range(layers):
        for p, value in (("k", 0.02 + i / 100), ("v", 0.005 + i / 1000)):
            name = (f"model.layers.{i}.self_attn.{p}_scale" if layout == "compressed"
                    else f"model.layers.{i}.self_attn.{p}_proj.{p}_scale")
            out[name] = np.array(value, np.float32)
    return out


@pytest.mark.parametrize("layout", ["compressed", "proj"])
def test_a_checkpoints_own_kv_scales_are_used(tmp_path, make_checkpoint, signing_key_pair,
                                              layout):
    """compressed-tensors' `self_attn.k_scale` (and the older `k_proj.k_scale`): one value
    per layer and plane, broadcast to the plane's kv heads, preferred to calibration."""
    private, public = signing_key_pair
    out = tmp_path / "own.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", make_checkpoint(arrays=_scales(2, layout)),
                        "--key", private, "--namespace", NAMESPACE, "--out", out,
                        "--kv-cache-dtype", "fp8")
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("KV cache")]
    assert line.endswith("per-head scales, the checkpoint's own per-layer KV scales: "
                         "0.005..0.03")
    core = open_core(out, [load_public_key(public)])
    scales = {b.name: np.frombuffer(core.read_resource(b.weight_resource_id), np.float32)
              for b in core.manifest.buffers if b.name.endswith("_cache.scale")}
    kvh = len(scales["L0.k_cache.scale"])
    assert scales["L1.k_cache.scale"].tolist() == [np.float32(0.03)] * kvh
    assert scales["L0.v_cache.scale"].tolist() == [np.float32(0.005)] * kvh
    assert_lint_clean(core)


def test_partial_checkpoint_kv_scales_are_refused_in_one_line(tmp_path, make_checkpoint,
                                                              signing_key_pair):
    scales = _scales(2, "compressed")
    del scales["model.layers.1.self_attn.v_scale"]
    private, _ = signing_key_pair
    assert refused_export(make_checkpoint(arrays=scales), private, tmp_path / "x.core",
                          "--kv-cache-dtype", "fp8").endswith(
        "the checkpoint carries KV scales but none for L1.v_cache (1 of 4 planes)")


def test_a_checkpoint_kv_scale_that_is_not_one_positive_value_is_refused(
        tmp_path, make_checkpoint, signing_key_pair):
    scales = _scales(2, "compressed")
    scales["model.layers.0.self_attn.k_scale"] = np.array([0.0], np.float32)
    private, _ = signing_key_pair
    assert refused_export(make_checkpoint(arrays=scales), private, tmp_path / "x.core",
                          "--kv-cache-dtype", "fp8").endswith(
        "model.layers.0.self_attn.k_scale: a KV scale is one positive finite value per "
        "layer, not [0.0]")
