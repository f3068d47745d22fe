"""Numerical parity of exported cores with HF transformers (tests/golden).

The goldens were produced by tests/golden/make_goldens.py with HF transformers (float32)
on the same GGUF; they are an independent implementation. Cores are real exports opened
through the verified reader.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helios_serve.engine.plan import SamplingParams
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, load_public_key, open_core
from helios_tools.frontend_assets import load_tokenizer, render_chat

GOLDENS = json.loads((Path(__file__).parents[2] / "golden" / "smollm2_goldens.json").read_text())
PROMPTS = GOLDENS["prompts"]


def _load(exported):
    core = open_core(exported.path, [load_public_key(exported.public_key)])
    authorize(core, exported.namespace)
    return core, load_native(core, "cpu")


@pytest.fixture(scope="module")
def f32(smollm2_core_f32):
    return _load(smollm2_core_f32)


@pytest.fixture(scope="module")
def bf16(smollm2_core_bf16):
    return _load(smollm2_core_bf16)


@pytest.fixture(scope="module")
def f32_greedy(f32) -> list[tuple[list[int], np.ndarray]]:
    """Per golden prompt, alone: the f32 core's 32 greedy ids and the float32 logits
    `[32, vocab]` of the steps that chose them (row i predicts id i). Where the ids equal
    the goldens' these rows are the teacher-forced f32 logits at every position: the same
    prefill and decode programs fed the same tokens."""
    _, model = f32
    out = []
    for p in PROMPTS:
        driver = Driver(model, collect_logits=True)
        ids = driver.generate([p["prompt_ids"]], max_new_tokens=32)[0]
        out.append((ids, np.stack([step[0] for step in driver.logits])))
    return out


@pytest.fixture(scope="module")
def bf16_teacher_forced(bf16) -> list[np.ndarray]:
    """Per golden prompt: the bf16 core's logits `[32, vocab]` teacher-forced on the
    goldens' greedy ids (teacher_forcing_ids = prompt + greedy), computed once for the
    agreement and the cosine tests."""
    _, model = bf16
    return [Driver(model).teacher_force(p["prompt_ids"], p["greedy_ids"]) for p in PROMPTS]


def test_prompt_ids_from_core_tokenizer_and_template(f32):
    core, _ = f32
    tokenizer = load_tokenizer(core.read_resource("tokenizer.json").decode())
    template = core.read_resource("chat_template.jinja").decode()
    for p in PROMPTS:
        text = render_chat(template, p["messages"], add_generation_prompt=True)
        assert text == p["rendered"]
        assert tokenizer.encode(text, add_special_tokens=False).ids == p["prompt_ids"]


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_f32_matches_golden_logits_and_greedy_tokens(f32_greedy, index):
    p = PROMPTS[index]
    out, logits = f32_greedy[index]
    last = logits[0]
    np.testing.assert_allclose(last[p["last_top5_ids"]], p["last_top5_logits"], atol=1e-3, rtol=0)
    fixed = GOLDENS["fixed_token_ids"]
    np.testing.assert_allclose(last[fixed], p["last_fixed_logits"], atol=1e-3, rtol=0)
    assert out == p["greedy_ids"][:32]


def test_f32_logprobs_are_the_log_softmax_of_the_step_logits_and_match_hf(f32):
    """The completion record's logprobs (computed on the backend in the sampling step)
    against an independent float64 log_softmax of the same step's logits, and their top
    ids and logprob differences against HF transformers' top-5 logits (goldens)."""
    _, model = f32
    for p in PROMPTS:
        driver = Driver(model, collect_logits=True)
        out = driver.generate([p["prompt_ids"]], max_new_tokens=4,
                              sampling=SamplingParams(logprobs=20))[0]
        assert out == p["greedy_ids"][:4]
        for step, (logits, done) in enumerate(zip(driver.logits, driver.completions,
                                                  strict=True)):
            z = logits[0].astype(np.float64)
            ref = z - (z.max() + np.log(np.exp(z - z.max()).sum()))
            lp = done.token_logprob(0, 20)
            assert lp.token_id == out[step]
            np.testing.assert_allclose(lp.logprob, ref[out[step]], atol=1e-5, rtol=0)
            ids = [i for i, _ in lp.top]
            assert ids == np.argsort(-ref, kind="stable")[:20].tolist()
            np.testing.assert_allclose([v for _, v in lp.top], ref[ids], atol=1e-5, rtol=0)
            assert lp.top[0] == (lp.token_id, lp.logprob)  # greedy: the sampled id is top
        # HF transformers: the last prompt position's top-5 ids, and logprob differences
        # equal to its logit differences (the normalizer cancels).
        first = driver.completions[0].token_logprob(0, 5)
        assert [i for i, _ in first.top] == p["last_top5_ids"]
        gaps = np.array([v for _, v in first.top]) - first.top[0][1]
        want = np.array(p["last_top5_logits"]) - p["last_top5_logits"][0]
        np.testing.assert_allclose(gaps, want, atol=2e-3, rtol=0)


def test_bf16_teacher_forced_agreement(bf16_teacher_forced):
    agree, total = 0, 0
    for p, logits in zip(PROMPTS, bf16_teacher_forced, strict=True):
        targets = p["greedy_ids"]  # teacher_forcing_ids = prompt + greedy
        assert logits.shape == (len(targets), 49152)
        agree += int((logits.argmax(-1) == np.asarray(targets)).sum())
        total += len(targets)
    assert agree / total >= 0.95, f"argmax agreement {agree}/{total}"


def test_bf16_logit_cosine_against_f32(f32_greedy, bf16_teacher_forced):
    # The goldens keep only a few logits per step; the f32 core (which matches them to
    # 1e-3) stands in for the full f32 logits at every teacher-forced position: its greedy
    # run fed exactly the goldens' ids (asserted), so its step logits are the
    # teacher-forced ones.
    for p, (ids, a), b in zip(PROMPTS, f32_greedy, bf16_teacher_forced, strict=True):
        targets = p["greedy_ids"]  # teacher_forcing_ids = prompt + greedy
        assert ids == targets
        assert a.shape == b.shape == (len(targets), 49152)
        cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
        assert cos.min() >= 0.999, f"min cosine {cos.min():.5f} at {int(cos.argmin())}"


def test_batch_invariance_f32(f32, f32_greedy):
    _, model = f32
    target = PROMPTS[0]["prompt_ids"]
    others = [p["prompt_ids"] for p in PROMPTS[1:]]
    alone = f32_greedy[0][0][:12]  # its first 12 greedy ids alone (generation is causal)
    neighbours = [others[i % len(others)][: 5 + 3 * i] for i in range(7)]
    batch = Driver(model).generate(neighbours[:3] + [target] + neighbours[3:], 12)
    assert batch[3] == alone


def test_capital_of_france_answers_paris(bf16):
    core, model = bf16
    tokenizer = load_tokenizer(core.read_resource("tokenizer.json").decode())
    template = core.read_resource("chat_template.jinja").decode()
    text = render_chat(template, [{"role": "user", "content": "What is the capital of France?"}],
                       add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    out = Driver(model).generate([ids], max_new_tokens=12, sampling=SamplingParams())[0]
    answer = tokenizer.decode(out[: out.index(2)] if 2 in out else out)
    assert "Paris" in answer, answer
