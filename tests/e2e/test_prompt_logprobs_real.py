"""Prompt log probabilities of the real SmolLM2-135M core (f32, cpu backend) equal a
plain NumPy forward of the GGUF checkpoint (bench/numpy_forward.py): full logits at every
prompt position, log_softmax in float64. Ids exact; logprobs within 2e-3 (the served
core's float32 kernels against the plain forward; DESIGN's 4.4e-5 logit agreement with
transformers is for the same math in another order)."""

from __future__ import annotations

import importlib.util
import sys

import httpx
import numpy as np
import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow
TEXT = "The capital of France is Paris. The capital of Italy is"


def _plain_logprobs(checkpoint, ids: list[int]) -> np.ndarray:
    spec = importlib.util.spec_from_file_location("helios_bench_numpy_forward",
                                                  REPO / "bench" / "numpy_forward.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    plain = module.PlainLlama(checkpoint, max_context=len(ids) + 8)
    logits = plain.forward(np.asarray([ids]), plain.new_cache(1, len(ids)),
                           last_only=False)[0].astype(np.float64)
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def test_echo_logprobs_of_the_real_model(client, real_server, smollm2_checkpoint):
    r = client.completions.create(model="smollm2-135m-instruct", prompt=TEXT, max_tokens=0,
                                  echo=True, logprobs=5, temperature=0)
    ids = httpx.post(real_server.url + "/tokenize",
                     json={"prompt": TEXT, "add_special_tokens": False}).json()["tokens"]
    ref = _plain_logprobs(smollm2_checkpoint, ids)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == TEXT and len(lp.tokens) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    np.testing.assert_allclose(lp.token_logprobs[1:],
                               [ref[p, ids[p + 1]] for p in range(len(ids) - 1)],
                               atol=2e-3, rtol=0)
    # the five alternatives are the plain forward's five most likely (keyed by text)
    for p in range(len(ids) - 1):
        best = [int(i) for i in np.argsort(-ref[p], kind="stable")[:5]]
        texts = [httpx.post(real_server.url + "/detokenize", json={"tokens": [i]}).json()["prompt"]
                 for i in best]
        assert list(lp.top_logprobs[p + 1]) == texts
        np.testing.assert_allclose(list(lp.top_logprobs[p + 1].values()),
                                   [ref[p, i] for i in best], atol=2e-3, rtol=0)
    # " Paris" after "The capital of France is" is the model's first choice there
    paris = lp.tokens.index(" Paris")
    assert lp.token_logprobs[paris] == max(lp.top_logprobs[paris].values())
