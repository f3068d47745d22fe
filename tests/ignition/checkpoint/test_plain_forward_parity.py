"""The plain NumPy forward (bench/numpy_forward.py) reproduces HF transformers' goldens.

This validates loader (dequantization, Q/K un-permutation, tied head), template and
tokenizer against an independent implementation, without our kernel library.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from helios_ignition.checkpoint import render_chat

BENCH = Path(__file__).resolve().parents[3] / "bench" / "numpy_forward.py"


def _load_plain_llama():
    spec = importlib.util.spec_from_file_location("helios_bench_numpy_forward", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    return module.PlainLlama


@pytest.fixture(scope="module")
def plain(smollm2):
    return _load_plain_llama()(smollm2, max_context=256)


def _prompt_ids(smollm2, tokenizer, prompt) -> list[int]:
    text = render_chat(smollm2.chat_template, prompt["messages"], **smollm2.special_tokens)
    return tokenizer.encode(text, add_special_tokens=False).ids


@pytest.mark.slow
def test_last_position_logits_match(plain, smollm2, smollm2_tokenizer, goldens):
    for prompt in goldens["prompts"]:
        ids = _prompt_ids(smollm2, smollm2_tokenizer, prompt)
        assert ids == prompt["prompt_ids"]
        logits = plain.forward(np.asarray([ids]), plain.new_cache(1, len(ids)))[0]
        top5 = np.argsort(-logits, kind="stable")[:5]
        assert top5.tolist() == prompt["last_top5_ids"], prompt["name"]
        np.testing.assert_allclose(logits[top5], prompt["last_top5_logits"], rtol=0, atol=1e-3)
        fixed = logits[goldens["fixed_token_ids"]]
        np.testing.assert_allclose(fixed, prompt["last_fixed_logits"], rtol=0, atol=1e-3)


@pytest.mark.slow
def test_france_greedy_32(plain, smollm2, smollm2_tokenizer, goldens):
    prompt = next(p for p in goldens["prompts"] if p["name"] == "france")
    ids = _prompt_ids(smollm2, smollm2_tokenizer, prompt)
    greedy, chosen = plain.greedy(ids, goldens["greedy_steps"])
    assert greedy == prompt["greedy_ids"]
    np.testing.assert_allclose(chosen, prompt["greedy_logits"], rtol=0, atol=1e-3)
    answer = smollm2_tokenizer.decode(greedy[: prompt["first_eos_step"]])
    assert answer == "The capital of France is Paris."


@pytest.mark.slow
def test_teacher_forcing_reproduces_greedy_steps(plain, goldens):
    prompt = next(p for p in goldens["prompts"] if p["name"] == "system_haiku")
    seq = prompt["teacher_forcing_ids"]
    n = len(prompt["prompt_ids"])
    logits = plain.forward(np.asarray([seq]), plain.new_cache(1, len(seq)), last_only=False)[0]
    steps = logits[n - 1 : n - 1 + goldens["greedy_steps"]]
    assert steps.argmax(axis=-1).tolist() == prompt["greedy_ids"]
    chosen = steps[np.arange(len(steps)), prompt["greedy_ids"]]
    np.testing.assert_allclose(chosen, prompt["greedy_logits"], rtol=0, atol=1e-3)
