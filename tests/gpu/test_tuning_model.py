"""Startup tuning and cache sizing on the cuda backend (SmolLM2, bf16 core for this GPU).

The core is exported with the decode-split tuning producer: NativeModel.load runs it on the
device (global-timer marks around each candidate) and the decode graphs read its choice.
For each candidate forced into the tuned buffer, the decode graph runs exactly that many
splits (the rest of the split statistics keep a NaN poison) and its greedy ids and
teacher-forced logits agree with the CPU backend forced to the same count. Each count
rounds differently, so agreement is per count, within the tolerance of the untuned tests.

The KV cache on cuda defaults to 0.9 of the device memory left after the model, and
--kv-cache-fraction / --num-pages choose other sizes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from gpu_steps import Steps

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
GOLDENS = json.loads((ROOT / "tests/golden/smollm2_goldens.json").read_text())


@pytest.fixture(scope="module")
def tuned_path(gpu, tmp_path_factory):
    from helios_ignition.export import export_core
    from helios_ignition.recipe import SplitTuning
    from helios_tools.core import generate_key, write_key_pair

    d = tmp_path_factory.mktemp("tuned")
    key = d / "key.pem"
    write_key_pair(generate_key(), key)
    out = d / "smollm2-tuned.core"
    export_core(ROOT / "recipes/smollm2_135m_instruct.py",
                checkpoint=os.environ.get("HELIOS_SMOLLM2_GGUF", "smollm2"), key_path=key,
                namespace="gpu.test", out=out, targets=(gpu.target,),
                split_tuning=SplitTuning())
    return out, key


def _open(path, key):
    from helios_tools.core import load_public_key, open_core

    return open_core(path, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])


@pytest.fixture(scope="module")
def tuned(tuned_path):
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.startup import StartupLog
    from helios_serve.testing.native import load_native

    core = _open(*tuned_path)
    log = StartupLog(emit=print)
    cuda = load_native(core, "cuda", cache=CacheSizing(num_pages=1024), log=log)
    cpu = load_native(core, "cpu")
    yield cuda, cpu, log
    cuda.close()


def _candidates(model):
    from helios_ignition.capture.buffers import decode_splits
    from helios_ignition.capture.tuning import split_candidates

    g = model.manifests
    ns, _ = decode_splits(g.max_pages_per_request * g.page_tokens)
    return ns, split_candidates(ns, 4)


def test_the_producer_ran_on_the_device_and_chose_a_candidate(tuned):
    from helios_ignition.capture.buffers import SPLIT_PRODUCER, TUNED_SPLITS

    cuda, _, log = tuned
    _, cands = _candidates(cuda)
    chosen = int(cuda.backend.read_buffer(TUNED_SPLITS)[0])
    assert chosen in cands
    tuning = next(p for p in log.phases if p.name == "tuning")
    assert tuning.detail == f"{SPLIT_PRODUCER} wrote {TUNED_SPLITS} = [{chosen}]"
    print(f"producer chose {chosen} of {cands} in {tuning.seconds:.3f} s")
    c = cuda.backend.counters
    assert c["graph_captures"] == 2 * len(cuda.prepared.manifest.graphs) + 1  # + the producer, once


@pytest.mark.parametrize("forced", range(4))
def test_each_forced_count_runs_its_splits_and_matches_the_cpu(tuned, forced):
    from helios_ignition.capture.buffers import TUNED_SPLITS

    cuda, cpu, _ = tuned
    ns, cands = _candidates(cuda)
    if forced >= len(cands):
        pytest.skip(f"only {len(cands)} candidates")
    count = cands[forced]
    cuda.backend.write_buffer(TUNED_SPLITS, np.array([count], np.int32))
    cpu.backend.write_state(TUNED_SPLITS, 0, np.array([count], np.int32))
    prompts = [p["prompt_ids"] for p in GOLDENS["prompts"]]
    ml_shape = cuda.backend.read_buffer("scratch.attn_ml").shape
    cuda.backend.write_buffer("scratch.attn_ml", np.full(ml_shape, np.nan, np.float32))
    got = Steps(cuda).generate(prompts, 16)
    ml = cuda.backend.read_buffer("scratch.attn_ml")[:len(prompts)]
    assert np.isfinite(ml[:, :, :count]).all() and np.isnan(ml[:, :, count:]).all()
    want = Steps(cpu).generate(prompts, 16)
    assert got == want, count
    p = GOLDENS["prompts"][0]
    a = Steps(cuda, lambda n: cuda.backend.read_buffer("scratch.logits")[:n]
              ).teacher_force(p["prompt_ids"], p["greedy_ids"])
    b = Steps(cpu, lambda n: cpu.backend.buffers["scratch.logits"][:n].copy()
              ).teacher_force(p["prompt_ids"], p["greedy_ids"])
    err = float(np.abs(a - b).max())
    print(f"splits {count} of {ns}: max |logit diff| cuda vs cpu {err:.2e}")
    assert err < 0.05


def test_the_cache_defaults_to_most_of_the_free_memory_and_a_fraction_sizes_it(gpu, tuned_path):
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.runtime.cuda import driver as drv
    from helios_serve.testing.native import load_native

    core = _open(*tuned_path)
    results = {}
    for fraction in (None, 0.5):
        free_before, _ = drv.call("cuMemGetInfo", gpu.cu.cuMemGetInfo())
        model = load_native(core, "cuda", cache=CacheSizing(fraction=fraction))
        try:
            b = model.backend
            want = fraction or 0.9
            assert b.cache.how.startswith(f"--kv-cache-fraction {want:g} of ")
            assert model.manifests.num_pages == b.cache.num_pages
            others = b.device_bytes - b.cache.nbytes  # weights, state, scratch
            expected = want * (free_before - others)
            # The context, kernel modules and scratch take a few hundred MiB of it.
            assert abs(b.cache.nbytes - expected) < 0.02 * free_before, (b.cache, expected)
            out = Steps(model).generate([GOLDENS["prompts"][0]["prompt_ids"]], 8)
            results[fraction] = (b.cache.num_pages, out)
        finally:
            model.close()
    assert results[None][1] == results[0.5][1]  # the cache size changes no output
    print("pages at 0.9 / 0.5:", results[None][0], results[0.5][0])
