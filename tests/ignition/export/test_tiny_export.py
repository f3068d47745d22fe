"""A tiny safetensors checkpoint exported end to end through `ignition export`.

The generic recipe (recipes/llama.py) exports the tiny HF directory through the CLI (in
process, and once through the installed console script); the core is opened through the
verified reader, loaded on the CPU backend and decoded greedily, against the plain NumPy
forward of bench/numpy_forward.py on the same checkpoint (an independent implementation:
no paging, no kernel library).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helios_ignition.checkpoint import load_safetensors_dir
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, load_public_key, open_core
from helios_tools.frontend_assets import load_tokenizer, render_chat

from tests.ignition.export.tiny import (
    LLAMA_RECIPE,
    NAMESPACE,
    REPO,
    TINY,
    assert_lint_clean,
    run_export,
)

BENCH = REPO / "bench" / "numpy_forward.py"
MESSAGES = [[{"role": "user", "content": "What is the capital of France?"}],
            [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": "Name three colours."}]]
STEPS = 8


def plain_llama_class():
    spec = importlib.util.spec_from_file_location("helios_bench_numpy_forward", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    return module.PlainLlama


@pytest.fixture(scope="module")
def exported(module_tmp, tiny_checkpoint, signing_key_pair):
    """(CliRunner result, core path) of the tiny checkpoint exported with f32 weights."""
    private, _ = signing_key_pair
    out = module_tmp("tiny-core") / "tiny.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", tiny_checkpoint, "--key", private,
                        "--namespace", NAMESPACE, "--out", out, "--weight-dtype", "f32")
    return result, out


@pytest.fixture(scope="module")
def core(exported, signing_key_pair):
    _, public = signing_key_pair
    opened = open_core(exported[1], [load_public_key(public)])
    authorize(opened, NAMESPACE)
    return opened


@pytest.fixture(scope="module")
def prompts(tiny_checkpoint) -> list[list[int]]:
    ck = load_safetensors_dir(tiny_checkpoint)
    tokenizer = load_tokenizer(ck.tokenizer_json)
    return [tokenizer.encode(render_chat(ck.chat_template, m, add_generation_prompt=True),
                             add_special_tokens=False).ids for m in MESSAGES]


def test_cli_summary(exported):
    result, out = exported
    assert result.exit_code == 0, result.output
    # Checkpoint context 520 tokens: capped to 512 (whole pages); the 1024 chunk is dropped.
    # 9 generation graphs, 2 SCORED_PREFILL graphs and the recipe's 5 RESTORE programs
    # (one per transfer route).
    assert result.stdout.startswith(f"wrote {out} (payload core): served id tiny-llama, 16 graphs ")
    assert "prefill_t128, scored_t16, scored_t128, transfer_" in result.stdout
    assert "prefill_t1024" not in result.stdout
    assert "17 resources" in result.stdout
    assert "weights read: 15/15 (100%)\n" in result.stderr
    assert "bytes written: " in result.stderr and "MiB (100%)\n" in result.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny.core"]


def test_contract_fits_checkpoint_context(core):
    contract = core.contract
    assert contract.served_id == "tiny-llama"
    assert contract.context_tokens == 512
    assert contract.prefill_chunk_tokens == 128
    assert contract.defaults.sampling.max_output_tokens == 512
    assert list(contract.eos_token_ids) == [2]
    assert contract.model.vocabulary.sampled_tokens == TINY.vocab_size


def test_resources_are_the_checkpoint(core, tiny_checkpoint):
    ck = load_safetensors_dir(tiny_checkpoint)
    assert core.read_resource("tokenizer.json").decode() == ck.tokenizer_json
    assert core.read_resource("chat_template.jinja").decode() == ck.chat_template
    fused = np.concatenate([ck.tensor(f"model.layers.1.self_attn.{p}_proj.weight")
                            for p in "qkv"])
    stored = np.frombuffer(core.read_resource("weights/L1.wqkv"), "<f4").reshape(fused.shape)
    np.testing.assert_array_equal(stored, fused)
    norm = np.frombuffer(core.read_resource("weights/final_norm"), "<f4")
    np.testing.assert_array_equal(norm, ck.tensor("model.norm.weight"))


def test_greedy_decode_matches_plain_forward(core, tiny_checkpoint, prompts):
    model = load_native(core, "cpu")
    driver = Driver(model, collect_logits=True)
    got = driver.generate(prompts, max_new_tokens=STEPS)
    plain = plain_llama_class()(load_safetensors_dir(tiny_checkpoint), max_context=256)
    for i, ids in enumerate(prompts):
        want, _ = plain.greedy(ids, STEPS)
        assert got[i] == want, i
        first = plain.forward(np.asarray([ids]), plain.new_cache(1, len(ids)))[0]
        # Prefill runs one prompt per step: logits[i] is prompt i's last position.
        np.testing.assert_allclose(driver.logits[i][0], first, rtol=0, atol=1e-4)


def test_lint_core(core):
    assert_lint_clean(core)


@pytest.mark.slow
def test_console_script(tmp_path, tiny_checkpoint, signing_key_pair, prompts):
    """The installed `ignition` entry point, with the recipe's own dtype (bf16)."""
    private, public = signing_key_pair
    out = tmp_path / "tiny-bf16.core"
    script = Path(sys.executable).parent / "ignition"
    proc = subprocess.run([str(script), "export", str(LLAMA_RECIPE), "--checkpoint",
                           str(tiny_checkpoint), "--key", str(private), "--namespace",
                           NAMESPACE, "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {out} (payload core): served id tiny-llama")
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-bf16.core"]
    opened = open_core(out, [load_public_key(public)])
    authorize(opened, NAMESPACE)
    wqkv = next(b for b in opened.manifest.buffers if b.name == "L0.wqkv")
    assert wqkv.dtype == 2  # D_TYPE_BF16
    out_ids = Driver(load_native(opened, "cpu")).generate(prompts[:1], max_new_tokens=4)
    assert len(out_ids[0]) == 4 and all(0 <= t < TINY.vocab_size for t in out_ids[0])
