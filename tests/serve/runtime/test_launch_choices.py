"""The tiny model captured with the issue-17 launch choices (``fold_layers``: norms and
residual adds folded into the products; ``chunked_sampling``: the three-launch sampler)
on the CPU backend: the same logits bit for bit and the same greedy and seeded sampled
ids as a capture with neither (``sample_biased``), at every decode batch, two frames."""

from __future__ import annotations

import numpy as np
import pytest
from helios_ignition.testing import TINY_SHAPES, tiny_core
from helios_serve.engine.plan import SamplingParams
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native

PROMPTS = [[1, 5, 9, 33, 2], [7, 7, 3], [4, 8, 15, 16, 23, 42], [90, 91]]
SAMPLING = [SamplingParams(),
            SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234),
            SamplingParams(temperature=1.0, top_p=0.8, seed=9),  # top-p only (OpenAI's)
            SamplingParams(temperature=0.7, top_k=3, min_p=0.1, seed=5, presence_penalty=0.5,
                           logit_bias=((4, 3.0), (17, -50.0)))]


@pytest.fixture(scope="module")
def models():
    plain = load_native(tiny_core(seed=3, chunked_sampling=False), "cpu", cpu_frames=2)
    chosen = load_native(tiny_core(seed=3, fold_layers=True, chunked_sampling=True), "cpu",
                         cpu_frames=2)
    return plain, chosen


@pytest.fixture(scope="module")
def before_nucleus():
    """The chunked sampler as cores exported before its nucleus form record it."""
    return load_native(tiny_core(seed=3, fold_layers=True, chunked_sampling=True,
                                 nucleus_sampling=False), "cpu", cpu_frames=2)


def test_choices_are_recorded_in_the_launches(models):
    plain, chosen = models

    def ops(model):
        names = {k.id: k.reference_op for k in model.prepared.manifest.kernels}
        graphs = model.prepared.manifest.graphs
        return {names[launch.kernel] for g in graphs for launch in g.launches}

    assert {"rmsnorm_linear", "linear_add", "sample_chunks_mass", "sample_merge",
            "sample_race_top", "sample_race_mass", "sample_race_pick"} <= ops(chosen)
    assert not ops(chosen) & {"sample_chunks", "sample_chunks_nucleus", "sample_chunks_wide",
                              "sample_race", "sample_pick", "sample_rest"}
    assert not ops(plain) & {"rmsnorm_linear", "linear_add", "sample_chunks",
                             "sample_chunks_nucleus"}
    assert "sample_biased" in ops(plain) and "sample_biased" not in ops(chosen)


def test_same_logits_and_tokens_as_the_default_capture(models):
    plain, chosen = models
    a, b = Driver(plain, collect_logits=True), Driver(chosen, collect_logits=True)
    got = b.generate(PROMPTS, max_new_tokens=14, sampling=SAMPLING)
    assert got == a.generate(PROMPTS, max_new_tokens=14, sampling=SAMPLING)
    for x, y in zip(a.logits, b.logits, strict=True):
        assert np.array_equal(x, y)
    # batch independence: each request alone samples what it sampled in the batch
    for prompt, sp, tokens in zip(PROMPTS, SAMPLING, got, strict=True):
        assert Driver(chosen).generate([prompt], 14, sp)[0] == tokens


def test_cores_recording_the_chunked_sampler_before_its_nucleus_form(models, before_nucleus):
    """A core exported before the nucleus form (``sample_chunks`` + ``sample_merge``)
    loads and samples what the nucleus form samples, top-p-only rows included."""
    ops = {k.reference_op for k in before_nucleus.prepared.manifest.kernels}
    assert {"sample_chunks", "sample_merge", "sample_rest"} <= ops
    assert not ops & {"sample_chunks_nucleus", "sample_merge_nucleus"}
    _, chosen = models
    got = Driver(before_nucleus).generate(PROMPTS, max_new_tokens=14, sampling=SAMPLING)
    assert got == Driver(chosen).generate(PROMPTS, max_new_tokens=14, sampling=SAMPLING)


@pytest.fixture(scope="module")
def before_wide():
    """The nucleus form as cores exported before the wide form record it."""
    return load_native(tiny_core(seed=3, fold_layers=True, chunked_sampling=True,
                                 wide_sampling=False), "cpu", cpu_frames=2)


WIDE_SAMPLING = [SamplingParams(temperature=0.8, top_p=0.95, seed=21),
                 SamplingParams(temperature=1.3, seed=22),  # temperature alone
                 SamplingParams(temperature=1.0, min_p=0.05, seed=23, frequency_penalty=0.4),
                 SamplingParams(temperature=0.9, top_p=0.5, seed=24, repetition_penalty=1.2,
                                logit_bias=((4, 2.0),))]


def test_cores_recording_the_nucleus_form_before_the_wide_form(models, before_wide):
    """A core exported before the wide form (``sample_chunks_nucleus``, no race) loads
    and samples what the wide form samples: top-p, temperature-only and min-p rows with
    penalties and bias, each alone as in the batch."""
    ops = {k.reference_op for k in before_wide.prepared.manifest.kernels}
    assert {"sample_chunks_nucleus", "sample_merge_nucleus", "sample_rest"} <= ops
    assert not ops & {"sample_chunks_wide", "sample_race", "sample_pick"}
    plain, chosen = models
    got = Driver(chosen).generate(PROMPTS, max_new_tokens=14, sampling=WIDE_SAMPLING)
    assert got == Driver(before_wide).generate(PROMPTS, max_new_tokens=14,
                                               sampling=WIDE_SAMPLING)
    assert got == Driver(plain).generate(PROMPTS, max_new_tokens=14, sampling=WIDE_SAMPLING)
    for prompt, sp, tokens in zip(PROMPTS, WIDE_SAMPLING, got, strict=True):
        assert Driver(chosen).generate([prompt], 14, sp)[0] == tokens


@pytest.fixture(scope="module")
def attention_rules():
    """The tiny model captured under attention rules v2 (split + merge, as cores exported
    before rule v3) and v3 with ``HELIOS_ATTN_FUSED=1`` (one ``attention_decode_fused``
    launch), with and without a
    speculative program (its verification attention is decode-style too)."""
    from helios_ignition.capture import launch

    mp = pytest.MonkeyPatch()
    out = {}
    try:
        mp.setattr(launch, "ATTN_FUSED", True)
        for rule in ("v2", "v3"):
            mp.setattr(launch, "ATTN_RULE", rule)
            out[rule] = load_native(tiny_core(seed=5, speculative_widths=(1, 2)), "cpu",
                                    cpu_frames=2)
    finally:
        mp.undo()
    return out


def test_fused_decode_attention_is_recorded_and_changes_nothing(attention_rules):
    def counts(model):  # graph name -> reference op -> launches
        names = {k.id: k.reference_op for k in model.prepared.manifest.kernels}
        out = {}
        for g in model.prepared.manifest.graphs:
            c = out.setdefault(g.name, {})
            for x in g.launches:
                c[names[x.kernel]] = c.get(names[x.kernel], 0) + 1
        return out

    old, new = attention_rules["v2"], attention_rules["v3"]
    layers = TINY_SHAPES.layers
    seen = set()
    for name, c in counts(new).items():
        o = counts(old)[name]
        assert "attention_decode_fused" not in o
        if "attention_decode_fused" not in c:
            continue
        seen.add(name.split("_")[0])
        # every target layer's split + merge became one launch (a draft head's stay)
        assert c["attention_decode_fused"] == layers
        for op in ("attention_decode_split", "attention_decode_merge"):
            assert c.get(op, 0) == o[op] - layers, (name, op)
    assert {"decode", "spec"} <= seen, seen
    a, b = Driver(old, collect_logits=True), Driver(new, collect_logits=True)
    got = b.generate(PROMPTS, max_new_tokens=14, sampling=SAMPLING)
    assert got == a.generate(PROMPTS, max_new_tokens=14, sampling=SAMPLING)
    for x, y in zip(a.logits, b.logits, strict=True):
        assert np.array_equal(x, y)
    for prompt, sp, tokens in zip(PROMPTS, SAMPLING, got, strict=True):
        assert Driver(new).generate([prompt], 14, sp)[0] == tokens


@pytest.fixture(scope="module")
def before_race():
    """The wide form (the slot race) as cores exported before the candidate race record
    it."""
    return load_native(tiny_core(seed=3, fold_layers=True, chunked_sampling=True,
                                 race_sampling=False), "cpu", cpu_frames=2)


def test_cores_recording_the_wide_form_before_the_candidate_race(models, before_race):
    """A core exported before the candidate race (``sample_race`` + ``sample_pick``)
    loads and samples what the candidate race samples: top-p, temperature-only and min-p
    rows with penalties and bias, each alone as in the batch, and sample_biased's
    tokens."""
    ops = {k.reference_op for k in before_race.prepared.manifest.kernels}
    assert {"sample_chunks_wide", "sample_race", "sample_pick", "sample_rest"} <= ops
    assert not ops & {"sample_chunks_mass", "sample_race_top", "sample_race_pick"}
    plain, chosen = models
    for sampling in (WIDE_SAMPLING, SAMPLING):
        got = Driver(chosen).generate(PROMPTS, max_new_tokens=14, sampling=sampling)
        assert got == Driver(before_race).generate(PROMPTS, max_new_tokens=14,
                                                   sampling=sampling)
        assert got == Driver(plain).generate(PROMPTS, max_new_tokens=14, sampling=sampling)
        for prompt, sp, tokens in zip(PROMPTS, sampling, got, strict=True):
            assert Driver(chosen).generate([prompt], 14, sp)[0] == tokens


def test_race_geometry_is_chosen_per_batch_bucket_at_capture():
    """HELIOS_RACE_GEOMETRY picks the candidate race's chunk and candidate counts per
    decode bucket; the launches record them (the kernels' BLOCK_V and MTOP) and the
    tokens stay sample_biased's, each request alone as in the batch."""
    from helios_ignition.capture import sampling

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(sampling, "RACE_GEOMETRY", "2:512:2,4:256:8")
        core = tiny_core(seed=3, chunked_sampling=True)
    finally:
        mp.undo()
    kernels = {k.id: k for k in core.manifest.kernels}
    chosen = {}
    for g in core.manifest.graphs:
        for launch in g.launches:
            k = kernels[launch.kernel]
            if k.reference_op == "sample_race_top":
                chosen[g.name] = (k.constants["BLOCK_V"], k.constants["MTOP"])
    assert chosen["decode_b1"] == (2048, 4)
    assert chosen["decode_b2"] == (512, 2)
    assert chosen["decode_b4"] == (256, 8)
    model = load_native(core, "cpu", cpu_frames=2)
    plain = load_native(tiny_core(seed=3, chunked_sampling=False), "cpu", cpu_frames=2)
    for sampling_ in (WIDE_SAMPLING, SAMPLING):
        got = Driver(model).generate(PROMPTS, max_new_tokens=10, sampling=sampling_)
        assert got == Driver(plain).generate(PROMPTS, max_new_tokens=10, sampling=sampling_)
        for prompt, sp, tokens in zip(PROMPTS, sampling_, got, strict=True):
            assert Driver(model).generate([prompt], 10, sp)[0] == tokens


@pytest.mark.parametrize("spec, message", [
    ("4:2048", "is not ROWS:C:M"),
    ("a:2048:4", "is not ROWS:C:M"),
    ("8:2048:4,4:1024:4", "rows must ascend"),
    ("0:2048:4", "rows must ascend"),
    ("8:3000:4", "C must be a power of two"),
    ("8:128:4", "C must be a power of two"),
    ("8:2048:3", "M must be a power of two"),
    ("8:2048:32", "M must be a power of two"),
])
def test_race_geometry_rejects_bad_entries(spec, message):
    from helios_ignition.capture.sampling import race_geometry

    with pytest.raises(ValueError, match=message):
        race_geometry(8, spec)


def test_race_geometry_takes_the_last_entry_at_or_below_the_rows():
    from helios_ignition.capture.sampling import race_geometry

    spec = "1:1024:2,64:2048:4,256:4096:8"
    assert race_geometry(1, spec) == (1024, 2) and race_geometry(63, spec) == (1024, 2)
    assert race_geometry(64, spec) == (2048, 4) and race_geometry(300, spec) == (4096, 8)
    assert race_geometry(8, "") == (2048, 4)
