"""Gemma 3 (`Gemma3ForCausalLM`) exported from HF safetensors and run on the cpu backend,
against Hugging Face transformers' logits and greedy ids.

The checkpoint and reference are tests/fixtures/gemma3_tiny/ (make_fixture.py wrote them
with transformers 5.25 on CPU torch, f32): 4 layers, local layers with a 16-token window
around one global layer, QK-norm, GeGLU, tied embeddings, query_pre_attn_scalar 24. It is
exported through `ignition export` with recipes/gemma3_270m.py and f32 weights, opened
through the verified reader and linted. Logits of every prompt position must match
transformers' within 5e-5, both teacher-forced one token at a time (decode over the
window region) and as one prefill of the whole prompt (windowed prefill attention); the
48-token prompt is three windows long. 8 greedy ids must equal transformers' `generate`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helios_contract.schema import contract_pb2 as cpb
from helios_ignition.checkpoint import GeometryError, load_checkpoint
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, load_public_key, open_core

from tests.ignition.export.tiny import NAMESPACE, REPO, assert_lint_clean, run_export

FIXTURE = REPO / "tests" / "fixtures" / "gemma3_tiny"
CHECKPOINT = FIXTURE / "checkpoint"
RECIPE = REPO / "recipes" / "gemma3_270m.py"
REFERENCE = np.load(FIXTURE / "reference.npz")
PROMPTS = 3
GREEDY = 8
WINDOW = 16
IGNITION = Path(sys.executable).parent / "ignition"


@pytest.fixture(scope="module")
def opened(module_tmp, signing_key_pair):
    private, public = signing_key_pair
    out = module_tmp("gemma3hf") / "gemma3.core"
    result = run_export(RECIPE, "--checkpoint", CHECKPOINT, "--key", private,
                        "--namespace", NAMESPACE, "--out", out, "--weight-dtype", "f32")
    assert result.exit_code == 0, result.output
    core = open_core(out, [load_public_key(public)])
    authorize(core, NAMESPACE)
    return core


def test_the_config_declares_the_geometry():
    g = load_checkpoint(CHECKPOINT).geometry
    assert g.family == "gemma3"
    assert (g.num_layers, g.hidden_size, g.num_heads, g.num_kv_heads, g.head_dim,
            g.intermediate_size, g.vocab_size) == (4, 64, 2, 1, 32, 128, 400)
    assert g.layer_windows == (16, 16, 0, 16)
    assert (g.rope_theta, g.rope_local_theta) == (1_000_000.0, 10_000.0)
    assert g.query_scale == 24.0 ** -0.5
    assert g.tie_word_embeddings


def test_logits_and_greedy_ids_match_transformers(opened):
    assert_lint_clean(opened)
    regions = {r.name: r for r in opened.contract.model.cache.regions}
    assert regions["window"].kind == cpb.HISTORY_KIND_SLIDING_WINDOW
    assert regions["window"].window_tokens == WINDOW
    assert regions["kv"].kind == cpb.HISTORY_KIND_PAGED_KV
    assert len(REFERENCE["p2/ids"]) == 3 * WINDOW
    driver = Driver(load_native(opened, "cpu"))
    for p in range(PROMPTS):
        ids = REFERENCE[f"p{p}/ids"].tolist()
        want = REFERENCE[f"p{p}/logits"]
        got = driver.teacher_force(ids[:1], ids[1:] + [0])  # positions 0 .. len - 1
        np.testing.assert_allclose(got, want, rtol=0, atol=5e-5, err_msg=f"decode p{p}")
        prefilled = driver.teacher_force(ids, [0])  # the last position, after one prefill
        np.testing.assert_allclose(prefilled[0], want[-1], rtol=0, atol=5e-5,
                                   err_msg=f"prefill p{p}")
        greedy = driver.generate([ids], max_new_tokens=GREEDY)[0]
        assert greedy == REFERENCE[f"p{p}/greedy"].tolist(), p
    driver.model.close()


def test_the_window_is_what_separates_the_long_prompt(tmp_path, signing_key_pair):
    """The same weights with a window longer than every prompt: positions 0..15 (whose
    16-token window is their whole context) keep transformers' logits, position 16 on
    (the first to drop a token) do not, so the window, its bound included, is what the
    reference checks."""
    folder = tmp_path / "ckpt"
    shutil.copytree(CHECKPOINT, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "sliding_window": 4096}))
    out = tmp_path / "wide.core"
    result = run_export(RECIPE, "--checkpoint", folder, "--key", signing_key_pair[0],
                        "--namespace", NAMESPACE, "--out", out, "--weight-dtype", "f32")
    assert result.exit_code == 0, result.output
    core = open_core(out, [load_public_key(signing_key_pair[1])])
    authorize(core, NAMESPACE)
    driver = Driver(load_native(core, "cpu"))
    ids, want = REFERENCE["p2/ids"].tolist(), REFERENCE["p2/logits"]
    got = driver.teacher_force(ids[:1], ids[1:] + [0])
    driver.model.close()
    np.testing.assert_allclose(got[:WINDOW], want[:WINDOW], rtol=0, atol=5e-5)
    gaps = np.abs(got - want).max(axis=1)
    assert (gaps[WINDOW:] > 1e-2).all(), gaps[WINDOW:].round(4).tolist()


def test_norms_are_stored_as_one_plus_w(opened):
    stored = np.frombuffer(opened.read_resource("weights/L2.q_norm"), "<f4")
    hf = load_checkpoint(CHECKPOINT).tensor("model.layers.2.self_attn.q_norm.weight")
    np.testing.assert_array_equal(stored, hf + np.float32(1.0))


@pytest.mark.parametrize(("change", "message"), [
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping 30.0 is not supported for "
                                        "Gemma 3"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping 50.0 is not supported"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention is not supported"),
    ({"hidden_activation": "relu"}, "hidden_activation 'relu' .only the tanh GELU. is not"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "rope scaling"),
    ({"layer_types": ["sliding_attention"]}, "layer_types must be 4 entries"),
    ({"sliding_window": None}, "sliding_window must be a positive number of tokens, not None"),
    ({"num_hidden_layers": None}, "a value is not a number: int.. argument must be"),
    ({"hidden_size": "sixty"}, "hidden_size must be a positive integer, not 'sixty'"),
])
def test_unsupported_declarations_are_refused(tmp_path, change, message):
    folder = tmp_path / "ckpt"
    shutil.copytree(CHECKPOINT, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(change)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(GeometryError, match=message):
        load_checkpoint(folder)


def test_a_missing_key_is_named(tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(CHECKPOINT, folder)
    config = json.loads((folder / "config.json").read_text())
    del config["num_attention_heads"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(GeometryError) as caught:
        load_checkpoint(folder)
    assert str(caught.value) == f"{folder}/config.json: missing key 'num_attention_heads'"


def test_the_pattern_is_read_without_layer_types(tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(CHECKPOINT, folder)
    config = json.loads((folder / "config.json").read_text())
    del config["layer_types"]
    config["sliding_window_pattern"] = 2
    (folder / "config.json").write_text(json.dumps(config))
    assert load_checkpoint(folder).geometry.layer_windows == (16, 0, 16, 0)


def test_the_transformers_4_spelling_is_read(tmp_path):
    """Gemma 3's published configs (transformers 4): `rope_theta`, `rope_local_base_freq`
    and `rope_scaling` null in place of `rope_parameters`."""
    folder = tmp_path / "ckpt"
    shutil.copytree(CHECKPOINT, folder)
    config = json.loads((folder / "config.json").read_text())
    del config["rope_parameters"]
    config.update(rope_theta=500_000.0, rope_local_base_freq=20_000.0, rope_scaling=None)
    (folder / "config.json").write_text(json.dumps(config))
    g = load_checkpoint(folder).geometry
    assert (g.rope_theta, g.rope_local_theta) == (500_000.0, 20_000.0)


def test_export_of_the_vision_model_is_one_line(tmp_path):
    """Through the real `ignition` command: one line on stderr, exit 1, nothing written."""
    from helios_tools.core import generate_key, write_key_pair

    private, _ = write_key_pair(generate_key(), tmp_path / "p.key")
    folder = tmp_path / "gemma3-4b"
    folder.mkdir()
    (folder / "config.json").write_text(
        '{"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3"}')
    proc = subprocess.run(
        [IGNITION, "export", str(RECIPE), "--checkpoint", str(folder), "--key", str(private),
         "--namespace", "a.example/m", "--out", str(tmp_path / "x.core")],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"ignition: error: {folder}: architecture 'Gemma3ForConditionalGeneration': Gemma 3 "
        "with its vision tower is not supported; only the text model (Gemma3ForCausalLM)"]
    assert not (tmp_path / "x.core").exists()


def test_the_vision_model_is_refused_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3"}')
    with pytest.raises(GeometryError) as caught:
        load_checkpoint(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path}: architecture 'Gemma3ForConditionalGeneration': Gemma 3 with its "
        "vision tower is not supported; only the text model (Gemma3ForCausalLM)")
