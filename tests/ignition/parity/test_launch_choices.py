"""The launch choices of issue 17 on the real model, CPU backend: a core exported with
``--fold-layers --bisection-sampling`` (decode graphs with RMS norms folded into the QKV
and gate/up products and residual adds into the O and down products; the one-launch
``sample_biased``) against the default core (unfolded; the chunked sampler,
``sample_chunks`` -> ``sample_merge`` -> ``sample_rest``): the HF goldens' greedy ids,
bit-identical logits, the same seeded samples from either sampler, and 7 launches per
layer instead of 9."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from helios_serve.engine.plan import SamplingParams
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, load_public_key, open_core

from tests.conftest import NAMESPACE, RECIPE

GOLDENS = json.loads((Path(__file__).parents[2] / "golden" / "smollm2_goldens.json").read_text())
PROMPTS = GOLDENS["prompts"]


def _open(path, public):
    core = open_core(path, [load_public_key(public)])
    authorize(core, NAMESPACE)
    return core


@pytest.fixture(scope="module")
def folded(module_tmp, signing_key_pair, smollm2_checkpoint):
    from helios_ignition.export import export_core

    private, public = signing_key_pair
    out = module_tmp("core-folded") / "smollm2-f32-folded.core"
    export_core(RECIPE, checkpoint=smollm2_checkpoint, key_path=private, namespace=NAMESPACE,
                out=out, weight_dtype="f32", fold_layers=True, chunked_sampling=False)
    core = _open(out, public)
    return core, load_native(core, "cpu")


def _decode_ops(core, name="decode_b1") -> Counter:
    ops = {k.id: k.reference_op for k in core.manifest.kernels}
    graph = next(g for g in core.manifest.graphs if g.name == name)
    return Counter(ops[launch.kernel] for launch in graph.launches)


def test_folded_decode_records_seven_launches_per_layer(folded, smollm2_core_f32):
    core, _ = folded
    plain = _open(smollm2_core_f32.path, smollm2_core_f32.public_key)
    got, before = _decode_ops(core), _decode_ops(plain)
    layers = 30
    # two launches fewer per layer; the chunked sampler (candidate race) is five launches
    # instead of one
    assert sum(before.values()) - sum(got.values()) == 2 * layers + 4
    assert got["rmsnorm_linear"] == 2 * layers and got["linear_add"] == layers
    assert got["swiglu_linear_add"] == layers
    assert got["add_rmsnorm"] == 0 and got["rmsnorm"] == 1  # the final norm
    race = ("sample_chunks_mass", "sample_merge", "sample_race_top", "sample_race_mass",
            "sample_race_pick")
    assert all(before[op] == 1 for op in race)
    assert got["sample_biased"] == 1 and before["sample_biased"] == 0
    # prefill graphs are not folded (they differ in the sampler only)
    pre, pre_plain = _decode_ops(core, "prefill_t16"), _decode_ops(plain, "prefill_t16")
    for op in race:
        assert pre_plain.pop(op) == 1
    assert pre.pop("sample_biased") == 1
    assert pre == pre_plain


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_folded_greedy_ids_match_goldens(folded, index):
    _, model = folded
    p = PROMPTS[index]
    out = Driver(model).generate([p["prompt_ids"]], max_new_tokens=20)[0]
    assert out == p["greedy_ids"][:20]


def test_folded_logits_and_seeded_samples_identical_to_default(folded, smollm2_core_f32):
    _, model = folded
    plain = load_native(_open(smollm2_core_f32.path, smollm2_core_f32.public_key), "cpu")
    p = PROMPTS[0]
    a = Driver(model).teacher_force(p["prompt_ids"], p["greedy_ids"][:8])
    b = Driver(plain).teacher_force(p["prompt_ids"], p["greedy_ids"][:8])
    assert np.array_equal(a, b)
    prompts = [q["prompt_ids"] for q in PROMPTS]
    sampling = [SamplingParams(temperature=0.8, top_p=0.95, top_k=50, seed=1234),
                SamplingParams(temperature=1.0, top_p=0.8, seed=99),  # no top-k: the race
                SamplingParams(temperature=0.7, top_k=64, min_p=0.05, seed=7,
                               presence_penalty=0.5)][:len(prompts)]
    got = Driver(model).generate(prompts, max_new_tokens=12, sampling=sampling)
    want = Driver(plain).generate(prompts, max_new_tokens=12, sampling=sampling)
    assert got == want
