"""Qwen3 dense (tied and untied heads) and Qwen3-MoE exported from HF safetensors and run
on the cpu backend, against Hugging Face transformers' logits and greedy ids.

The checkpoints and references are tests/fixtures/qwen3/ (make_reference.py wrote them
with transformers 5.25 on CPU torch, f32). Each is exported through `ignition export`
with recipes/qwen3.py and f32 weights, opened through the verified reader and linted;
the logits of every prompt position (prefill for the first, teacher-forced decode steps
for the rest) must match transformers' within 5e-5, and 8 greedy ids must equal its
`generate`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.checkpoint import GeometryError, load_checkpoint
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, load_public_key, open_core

from tests.ignition.export.tiny import NAMESPACE, REPO, assert_lint_clean, run_export

FIXTURES = REPO / "tests" / "fixtures" / "qwen3"
QWEN3_RECIPE = REPO / "recipes" / "qwen3.py"
REFERENCE = np.load(FIXTURES / "reference.npz")
MODELS = ("dense_tied", "dense_untied", "moe")
PROMPTS = 3
GREEDY = 8


def export(tmp: Path, keys, model: str, *extra: str) -> Path:
    private, public = keys
    out = tmp / f"{model}.core"
    result = run_export(QWEN3_RECIPE, "--checkpoint", FIXTURES / model, "--key", private,
                        "--namespace", NAMESPACE, "--out", out, "--weight-dtype", "f32",
                        *extra)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module", params=MODELS)
def core(request, module_tmp, signing_key_pair):
    out = export(module_tmp("qwen3"), signing_key_pair, request.param)
    opened = open_core(out, [load_public_key(signing_key_pair[1])])
    authorize(opened, NAMESPACE)
    return request.param, opened


def test_logits_and_greedy_ids_match_transformers(core):
    model, opened = core
    assert_lint_clean(opened)
    driver = Driver(load_native(opened, "cpu"))
    for p in range(PROMPTS):
        ids = REFERENCE[f"{model}/p{p}/ids"].tolist()
        want = REFERENCE[f"{model}/p{p}/logits"]
        got = driver.teacher_force(ids[:1], ids[1:] + [0])  # positions 0 .. len - 1
        np.testing.assert_allclose(got, want, rtol=0, atol=5e-5, err_msg=f"{model} p{p}")
        greedy = driver.generate([ids], max_new_tokens=GREEDY)[0]
        assert greedy == REFERENCE[f"{model}/p{p}/greedy"].tolist(), (model, p)
    driver.model.close()


def test_layers_declare_their_math(core):
    """Every layer records QK-norm before RoPE; the MoE core's layers route over 8
    experts, 2 a token, normalized, over stacked expert buffers (no dense MLP)."""
    model, opened = core
    buffers = {b.name: list(b.shape) for b in opened.manifest.buffers}
    kernels = {k.id: k.reference_op for k in opened.manifest.kernels}
    prefill = next(g for g in opened.manifest.graphs if g.name == "prefill_t16")
    ops = [kernels[launch.kernel] for launch in prefill.launches]
    assert ops.count("qk_rmsnorm") == 2
    assert ops.index("qk_rmsnorm") < ops.index("rope_kv_write")
    assert buffers["L0.q_norm"] == [32] and buffers["L0.k_norm"] == [32]
    assert ("lm_head" in buffers) == (model != "dense_tied")
    if model != "moe":
        assert "moe_route" not in ops and buffers["L1.w_gate_up"] == [256, 64]
        return
    assert "L0.w_gate_up" not in buffers and "L0.w_down" not in buffers
    assert buffers["L1.router"] == [8, 64]
    assert buffers["L1.experts_gate_up"] == [8, 64, 64]
    assert buffers["L1.experts_down"] == [8, 64, 32]
    route = next(launch for launch in prefill.launches
                 if kernels[launch.kernel] == "moe_route")
    assert [a.int_value for a in route.args[3:]] == [16, 8, 2, 1]  # T, E, K, NORM
    assert ops.count("moe_gate_up") == ops.count("moe_down") == ops.count("moe_sum") == 2
    stored = next(b for b in opened.manifest.buffers if b.name == "L0.experts_down")
    assert stored.dtype == mpb.D_TYPE_F32
    down = np.frombuffer(opened.read_resource("weights/L0.experts_down"), "<f4")
    ck = load_checkpoint(FIXTURES / "moe")
    np.testing.assert_array_equal(down.reshape(8, 64, 32)[5], ck.tensor(
        "model.layers.0.mlp.experts.5.down_proj.weight"))


def test_moe_refuses_tensor_parallel(tmp_path, signing_key_pair):
    result = run_export(QWEN3_RECIPE, "--checkpoint", FIXTURES / "moe", "--key",
                        signing_key_pair[0], "--namespace", NAMESPACE, "--out",
                        tmp_path / "x.core", "--tensor-parallel", "2")
    assert result.exit_code != 0
    assert result.output.strip().splitlines()[-1].endswith(
        "--tensor-parallel 2: a mixture-of-experts core is one rank: expert parallelism "
        "is not implemented")
    assert list(tmp_path.iterdir()) == []


def test_recipe_family_must_match_the_checkpoint(tmp_path, signing_key_pair):
    result = run_export(REPO / "recipes" / "llama.py", "--checkpoint", FIXTURES / "moe",
                        "--key", signing_key_pair[0], "--namespace", NAMESPACE, "--out",
                        tmp_path / "x.core")
    assert result.exit_code != 0
    assert result.output.strip().splitlines()[-1] == (
        f"ignition: error: checkpoint {FIXTURES / 'moe'}: architecture "
        "'Qwen3MoeForCausalLM' is family 'qwen3_moe', not the recipe's family 'llama'; "
        "supported families: gemma3, llama, qwen3, qwen3_moe")
    assert list(tmp_path.iterdir()) == []


def test_unsupported_architecture_is_named(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["MambaForCausalLM"]}')
    with pytest.raises(GeometryError) as info:
        load_checkpoint(folder)
    assert str(info.value) == (
        f"{folder}: architecture 'MambaForCausalLM' is not supported; supported: "
        "LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, Gemma3ForCausalLM")


def test_moe_geometry_rejections(tmp_path):
    import json
    import shutil

    folder = tmp_path / "moe"
    shutil.copytree(FIXTURES / "moe", folder)
    config = json.loads((folder / "config.json").read_text())
    for change, message in (
            ({"num_experts_per_tok": 9}, "num_experts_per_tok 9 must lie in 1..8"),
            ({"mlp_only_layers": [1]}, "dense layers between MoE layers"),
            ({"attention_bias": True}, "attention_bias is not supported")):
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(GeometryError, match=message):
            load_checkpoint(folder)


@pytest.mark.parametrize("model", ["dense_tied", "dense_untied"])
def test_dense_split_between_two_ranks_matches_transformers(tmp_path, signing_key_pair, model):
    """Qwen3 dense under `--tensor-parallel 2` (2 query heads, 1 key/value head and half
    the FFN a rank; QK-norm gains replicated), ranks as threads on the cpu backend: the
    same logits and greedy ids as transformers'."""
    out = export(tmp_path, signing_key_pair, model, "--tensor-parallel", "2")
    opened = open_core(out, [load_public_key(signing_key_pair[1])])
    authorize(opened, NAMESPACE)
    assert opened.manifest.rank_count == 2
    q_norm = next(b for b in opened.manifest.buffers if b.name == "L0.q_norm")
    assert q_norm.weight_resource_id and not q_norm.rank_weight_resource_ids  # replicated
    driver = Driver(load_native(opened, "cpu"))
    for p in range(PROMPTS):
        ids = REFERENCE[f"{model}/p{p}/ids"].tolist()
        driver.generate([ids], max_new_tokens=1)  # the prefill alone
        # Every rank gathers the whole row of logits; rank 0's are the sampler's.
        got = driver.model.backend.rank0.buffers["scratch.logits"][0]
        np.testing.assert_allclose(got, REFERENCE[f"{model}/p{p}/logits"][-1], rtol=0,
                                   atol=5e-5)
        assert driver.generate([ids], max_new_tokens=GREEDY)[0] == \
            REFERENCE[f"{model}/p{p}/greedy"].tolist()
    driver.model.close()


def test_random_weights_of_the_real_geometries():
    """`--random-weights SEED --geometry qwen3-8b|qwen3-30b-a3b` (benchmarks): the real
    shapes, drawn lazily, one tensor at a time."""
    from helios_ignition.checkpoint import random_checkpoint
    from helios_ignition.families.registry import family_shapes

    moe = random_checkpoint("qwen3-30b-a3b", seed=1)
    assert moe.geometry.family == "qwen3_moe"
    assert moe.tensor("model.layers.47.mlp.experts.127.down_proj.weight").shape == (2048, 768)
    assert moe.tensor("model.layers.0.self_attn.k_norm.weight").shape == (128,)
    shapes = family_shapes("qwen3_moe", moe.geometry)
    assert (shapes.experts, shapes.experts_per_token, shapes.ffn) == (128, 8, 768)
    dense = random_checkpoint("qwen3-8b", seed=1)
    assert family_shapes("qwen3", dense.geometry).qkv_width == (32 + 2 * 8) * 128
