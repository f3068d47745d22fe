"""Speculative generation with tensor-parallel ranks on the CPU backend (threads).

The tiny checkpoint with a seeded random drafter (widths 1, 2, 4, prefix-limit programs
at batch >= 2) exported at TP = 1 and TP = 2: every rank runs the same SPECULATIVE
program (the head replicated, the target split); greedy ids at TP = 2 equal TP = 1's
and plain decode's at every width and with prefix-limit programs; prefix-limit programs
broadcast rank 0's confidence before allocation; a rank whose completion record of a
speculative step disagrees with rank 0's fails exactly that step (the specification,
"Complete speculative generation": validation agreement suppresses commit on all ranks
if a rank rejects the cohort), and the model serves the next step."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from helios_serve.runtime import NativeModel
from helios_serve.runtime.collectives import _ThreadMember
from helios_serve.runtime.driver import Driver
from helios_serve.runtime.errors import RankFailure, SpeculativeRejection
from helios_serve.runtime.ranks import RankedBackend
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, load_public_key, open_core

from tests.tiny_model import LLAMA_RECIPE, NAMESPACE, PROMPTS, prompt_ids

RECIPE = """
from dataclasses import replace
import importlib.util
spec = importlib.util.spec_from_file_location("base", {base!r})
base = importlib.util.module_from_spec(spec); spec.loader.exec_module(base)
from helios_ignition.recipe import DrafterDecl


def make_recipe(checkpoint):
    return replace(base.make_recipe(checkpoint),
                   drafter=DrafterDecl("random:7:128", widths=(1, 2, 4)))
"""
TOKENS = 12


@dataclass(frozen=True)
class Cores:
    single: Path
    split: Path
    public: Path


@pytest.fixture(scope="module")
def cores(module_tmp, tiny_served) -> Cores:
    from helios_ignition.export import export_core

    core = tiny_served.core
    folder = module_tmp("tiny-spec-tp")
    recipe = folder / "tiny_spec.py"
    recipe.write_text(RECIPE.format(base=str(LLAMA_RECIPE)))
    out = {}
    for ranks in (1, 2):
        out[ranks] = folder / f"tiny-spec-tp{ranks}.core"
        export_core(recipe, checkpoint=str(tiny_served.checkpoint), key_path=core.private_key,
                    namespace=NAMESPACE, out=out[ranks], weight_dtype="f32",
                    tensor_parallel=ranks)
    return Cores(out[1], out[2], core.public_key)


def _load(path: Path, public: Path, **options) -> NativeModel:
    core = open_core(path, [load_public_key(public)])
    authorize(core, NAMESPACE)
    return load_native(core, "cpu", **options)


@pytest.fixture(scope="module")
def prompts():
    return [prompt_ids(p) for p in PROMPTS[:2]]


@pytest.fixture(scope="module")
def single(cores, prompts):
    """TP = 1: plain decode ids, and the speculative ids at W = 4 (equal by construction)."""
    model = _load(cores.single, cores.public)
    try:
        driver = Driver(model)
        decode = driver.generate(prompts, TOKENS)
        spec, _ = driver.generate_speculative(prompts, TOKENS, 4)
        assert spec == decode
        return decode
    finally:
        model.close()


def test_a_split_drafter_core_captures_speculative_programs_with_collectives(cores):
    core = open_core(cores.split, [load_public_key(cores.public)])
    manifest = core.manifest
    assert manifest.rank_count == 2
    ops = {k.id: k.reference_op for k in manifest.kernels}
    programs = {g.name: [ops[launch.kernel] for launch in g.launches] for g in manifest.graphs}
    spec = programs["spec_b2_w4"]
    assert "all_reduce_sum" in spec and "all_gather_columns" in spec
    assert "broadcast_rank0" not in spec  # exact host-chosen lengths: no allocation
    prefix = programs["spec_b2_w4_p4"]
    # rank 0's confidence reaches every rank after the last draft, before allocation
    assert prefix.index("broadcast_rank0") == prefix.index("spec_allocate") - 1
    assert prefix.index("broadcast_rank0") > max(
        i for i, op in enumerate(prefix) if op == "spec_confidence")


@pytest.mark.parametrize("width", [2, 4])
def test_two_ranks_speculate_the_one_rank_greedy_ids(cores, prompts, single, width):
    model = _load(cores.split, cores.public)
    try:
        assert isinstance(model.backend, RankedBackend) and model.backend.peers.ranks == 2
        driver = Driver(model)
        assert driver.generate(prompts, TOKENS) == single
        ids, records = driver.generate_speculative(prompts, TOKENS, width)
        assert ids == single
        assert max(int(r[1]) for record in records for r in record) == width  # lanes of W
    finally:
        model.close()


@pytest.mark.parametrize("frames", [1, 2])
def test_two_ranks_allocate_prefix_rows_from_rank_zeros_confidence(cores, prompts, single,
                                                                    frames):
    model = _load(cores.split, cores.public, cpu_frames=frames)
    try:
        driver = Driver(model)
        ids, records = driver.generate_speculative(prompts, TOKENS, 4, packed_rows=4)
        assert ids == single
        # two lanes of ceiling 4 shared 4 rows: the device allocated, the lanes stayed
        # within them
        assert all(sum(int(r[1]) for r in record) <= 4 for record in records)
        # the mirror holds rank 0's confidence in the plane of the step's frame
        framed = model.backend.staging(0)["proposal_confidence"][0]
        assert framed.shape[-1] == 3 and np.isfinite(framed).all()
    finally:
        model.close()


def _perturbed(cores: Cores) -> NativeModel:
    """The split core with rank 1's head sharpened: the same greedy drafts (argmax), other
    confidences (softmax) than rank 0's."""
    model = _load(cores.split, cores.public)
    rank1 = model.backend.peers._ranks[1].backend
    rank1.buffers["D.final_norm"][...] *= np.float32(3.0)
    return model


def test_a_rank_whose_confidence_differs_still_allocates_rank_zeros_rows(cores, prompts,
                                                                          single, monkeypatch):
    """With the broadcast every rank allocates from rank 0's confidence, so the records
    agree; without it (the collective made a no-op) rank 1 allocates other rows and the
    step is rejected."""
    model = _perturbed(cores)
    try:
        ids, records = Driver(model).generate_speculative(prompts, TOKENS, 4, packed_rows=4)
        assert ids == single
    finally:
        model.close()
    monkeypatch.setattr(_ThreadMember, "broadcast_rank0", lambda self, x, T, N: None)
    model = _perturbed(cores)
    try:
        with pytest.raises(SpeculativeRejection, match="spec_b2_w4_p4"):
            Driver(model).generate_speculative(prompts, TOKENS, 4, packed_rows=4)
    finally:
        model.close()


def test_a_rank_that_disagrees_fails_exactly_that_speculative_step(cores, prompts, single):
    model = _load(cores.split, cores.public)
    try:
        rank1 = model.backend.peers._ranks[1]
        honest = rank1.run
        lied = []

        def lying(step):
            record = honest(step)
            if step.graph.startswith("spec_") and not lied:  # one speculative step
                record["out.record"][0, 2] += 1  # rank 1 accepted one more draft
                lied.append(step.graph)
            return record

        rank1.run = lying
        driver = Driver(model)
        with pytest.raises(SpeculativeRejection, match=r"rank 1's completion record "
                                                       r"\(out.record\) of spec_b\d+_w4 "
                                                       r"differs from rank 0's"):
            driver.generate_speculative(prompts, TOKENS, 4)
        assert not isinstance(SpeculativeRejection("x"), RankFailure)  # the model lives on
        assert model.backend.failed is None
        # the ranks serve the next requests, speculative and plain, with the same ids
        ids, _ = driver.generate_speculative(prompts, TOKENS, 4)
        assert ids == single
        assert driver.generate(prompts, TOKENS) == single
    finally:
        model.close()
