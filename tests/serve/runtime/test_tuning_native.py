"""Startup tuning on the CPU backend: a core exported with `--tune-decode-splits` carries the
decode-split producer; NativeModel.load runs it before exposing the decode graphs, which
read its choice. Forcing each candidate changes which attention splits run, and the
decode logits stay the independent plain NumPy forward's (each count rounds its own way,
so they are compared per count within f32, not across counts)."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.capture.buffers import SPLIT_PRODUCER, TUNED_SPLITS
from helios_ignition.checkpoint import load_safetensors_dir
from helios_ignition.recipe import SplitTuning
from helios_serve.runtime.driver import Driver
from helios_serve.startup import StartupLog
from helios_serve.testing.native import load_native
from helios_tools.core import load_public_key, open_core

from tests.tiny_model import GEOMETRY, REPO, export_tiny, prompt_ids

CANDIDATES = [4, 2, 1]  # 256 positions in 4 captured splits of 64: 4, 2, 1


@pytest.fixture(scope="module")
def tuned_core(tiny_served, module_tmp):
    out = module_tmp("tuned") / "tiny-tuned.core"
    export_tiny(tiny_served.checkpoint, tiny_served.core.private_key, out,
                split_tuning=SplitTuning(repeats=1))
    with open_core(out, [load_public_key(tiny_served.core.public_key)]) as core:
        yield core


@pytest.fixture(scope="module")
def loaded(tuned_core):
    log = StartupLog()
    model = load_native(tuned_core, "cpu", log=log)
    return model, log


def test_the_core_declares_the_producer_and_its_dependents(tuned_core):
    manifest, contract = tuned_core.manifest, tuned_core.contract
    assert [p.name for p in manifest.tuning.producers] == [SPLIT_PRODUCER]
    tuned = next(b for b in manifest.buffers if b.name == TUNED_SPLITS)
    assert (tuned.role, list(tuned.shape)) == (mpb.BUFFER_ROLE_TUNED, [1])
    for graph, program in zip(contract.model.graphs, manifest.graphs, strict=True):
        decode = graph.name.startswith("decode_")
        assert [(t.buffer, t.producer_graph) for t in graph.tuned_bindings] == (
            [(TUNED_SPLITS, SPLIT_PRODUCER)] if decode else [])
        assert list(program.tuning_producers) == ([SPLIT_PRODUCER] if decode else [])


def test_load_runs_the_producer_before_exposing_the_graphs(loaded):
    model, log = loaded
    chosen = int(model.backend.read_buffer(TUNED_SPLITS)[0])
    assert chosen in CANDIDATES  # zero-initialized buffers hold 0 until the producer runs
    tuning = next(p for p in log.phases if p.name == "tuning")
    assert tuning.detail == f"{SPLIT_PRODUCER} wrote {TUNED_SPLITS} = [{chosen}]"
    assert [p.name for p in log.phases] == ["cache tiers", "weights", "cache sizing", "graphs",
                                           "tuning"]


def _plain_logits(checkpoint, ids: list[int]) -> np.ndarray:
    spec = importlib.util.spec_from_file_location("helios_bench_numpy_forward",
                                                  REPO / "bench" / "numpy_forward.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    plain = module.PlainLlama(load_safetensors_dir(checkpoint), max_context=GEOMETRY.max_context)
    return plain.forward(np.asarray([ids]), plain.new_cache(1, len(ids)), last_only=False)[0]


@pytest.mark.parametrize("count", CANDIDATES)
def test_a_forced_count_decides_the_splits_and_decode_stays_exact(loaded, tiny_served, count):
    model, _ = loaded
    backend = model.backend
    backend.write_state(TUNED_SPLITS, 0, np.array([count], np.int32))
    backend.buffers["scratch.attn_ml"][...] = np.nan  # what no split has written
    prompt = prompt_ids("What is the capital of France?")
    targets = [125, 11, 211, 71, 62, 137, 186, 62, 269, 120]  # any tokens: teacher-forced
    got = Driver(model).teacher_force(prompt, targets)
    ml = backend.buffers["scratch.attn_ml"][0]  # row 0 of the last decode step, [H, NS, 2]
    assert np.isfinite(ml[:, :count]).all() and np.isnan(ml[:, count:]).all()
    want = _plain_logits(tiny_served.checkpoint, prompt + targets[:-1])[len(prompt) - 1:]
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4)


def test_a_tuned_binding_without_its_producer_fails_startup(tuned_core):
    from helios_contract.errors import TunedProducerError
    from helios_contract.prepared import PreparedContract

    manifest = type(tuned_core.manifest)()
    manifest.CopyFrom(tuned_core.manifest)
    del manifest.tuning.producers[:]
    with pytest.raises(TunedProducerError) as info:
        PreparedContract.from_contract(tuned_core.contract, manifest)
    assert info.value.path == "model.graphs[0].tuned_bindings[0].producer_graph"
    assert info.value.value == SPLIT_PRODUCER


def test_speculation_reads_the_same_tuned_count_so_greedy_output_is_unchanged():
    """Verification attention reads the tuned count too: for every forced count, greedy
    speculative output equals greedy decode (rows stay invariant between the two)."""
    from dataclasses import replace

    from helios_ignition.testing import TINY_CAPACITIES, tiny_core

    caps = replace(TINY_CAPACITIES, context_tokens=1024, prepared_pages=300)  # 16 splits
    core = tiny_core(1, caps=caps, speculative_widths=(1, 4), draft_copy=3.0, draft_vocab=96,
                     split_tuning=SplitTuning(repeats=1))
    spec = [g for g in core.contract.model.graphs if g.name.startswith("spec_")]
    assert spec and all([t.buffer for t in g.tuned_bindings] == [TUNED_SPLITS] for g in spec)
    model = load_native(core, "cpu")
    prompts = [list(range(3, 9)), [5, 7, 9], [20, 21, 22, 23]]
    for count in (16, 8, 4, 2):
        model.backend.write_state(TUNED_SPLITS, 0, np.array([count], np.int32))
        decoded = Driver(model).generate(prompts, 12)
        speculated, _ = Driver(model).generate_speculative(prompts, 12, 4)
        assert speculated == decoded, count
