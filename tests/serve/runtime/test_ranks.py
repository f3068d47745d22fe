"""Tensor-parallel ranks on the CPU backend: RankPeers::Threads (runtime/ranks.py).

Greedy ids of split cores equal the single-rank core's: the tiny model at TP = 2 (tests/
tiny_model.py) and SmolLM2 at TP = 3 (9 query, 3 key/value heads), the latter also
against HF transformers' goldens (tests/golden). Rank failures and disagreements fail
the step on every rank, never hang, and leave the model unusable (RankFailure).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helios_serve.runtime import NativeModel
from helios_serve.runtime.collectives import ThreadGroup
from helios_serve.runtime.driver import Driver
from helios_serve.runtime.errors import RankDisagreement, RankLost
from helios_serve.runtime.ranks import RankedBackend
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, load_public_key, open_core
from helios_tools.kernels import collective as reference

from tests.tiny_model import PROMPTS, prompt_ids

GOLDENS = json.loads((Path(__file__).parents[2] / "golden" / "smollm2_goldens.json").read_text())


def _load(exported, **options) -> NativeModel:
    core = open_core(exported.path, [load_public_key(exported.public_key)])
    authorize(core, exported.namespace)
    return load_native(core, "cpu", **options)


def _run_ranks(ranks: int, body) -> list:
    """Run body(rank) on `ranks` threads; their results (or exceptions), rank order."""
    out: list = [None] * ranks

    def run(r):
        try:
            out[r] = body(r)
        except BaseException as exc:  # returned for the test to inspect
            out[r] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return out


def test_thread_collectives_equal_the_references_on_every_rank():
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((5, 7)).astype(np.float32) for _ in range(3)]
    shards = [rng.standard_normal((5, 3)).astype(np.float32) for _ in range(3)]
    want_sum = reference.all_reduce_sum(parts, 4, 7)
    want_cols = reference.all_gather_columns(shards, 4, 3, 8)
    group = ThreadGroup(3)

    def body(r):
        x = parts[r].copy()
        out = np.full((5, 8), -1.0, np.float32)
        member = group.member(r)
        member.all_reduce_sum(x, 4, 7)
        member.all_gather_columns(shards[r], out, 4, 3, 8)
        mine = shards[r].copy()
        member.broadcast_rank0(mine, 4, 2)
        return x, out, mine

    for r, (x, out, mine) in enumerate(_run_ranks(3, body)):
        np.testing.assert_array_equal(x[:4], want_sum)  # bit-identical on every rank
        np.testing.assert_array_equal(x[4], parts[r][4])  # rows past T untouched
        np.testing.assert_array_equal(out[:4], want_cols)
        np.testing.assert_array_equal(out[4], -1.0)
        np.testing.assert_array_equal(mine[:4, :2], shards[0][:4, :2])  # rank 0's values
        np.testing.assert_array_equal(mine[4], shards[r][4])  # outside the view: its own
        np.testing.assert_array_equal(mine[:4, 2], shards[r][:4, 2])


def test_an_abandoned_collective_raises_rank_lost_instead_of_hanging():
    group = ThreadGroup(2)

    def body(r):
        if r == 1:  # rank 1 fails before its collective
            time.sleep(0.2)
            group.abort("rank 1 failed: MemoryError()")
            return None
        group.member(0).all_reduce_sum(np.zeros((1, 1), np.float32), 1, 1)

    first, _ = _run_ranks(2, body)
    assert isinstance(first, RankLost)
    assert str(first) == "collective abandoned: rank 1 failed: MemoryError()"


@pytest.fixture(scope="module")
def tiny_prompts():
    return [prompt_ids(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def tiny_single(tiny_served, tiny_prompts):
    model = _load(tiny_served.core)
    try:
        yield Driver(model).generate(tiny_prompts, 12)
    finally:
        model.close()


@pytest.mark.parametrize("frames", [1, 2])
def test_tiny_two_ranks_greedy_equals_one_rank(tiny_tp2, tiny_prompts, tiny_single, frames):
    model = _load(tiny_tp2, cpu_frames=frames)
    try:
        assert isinstance(model.backend, RankedBackend)
        assert model.backend.peers.ranks == 2
        assert Driver(model).generate(tiny_prompts, 12) == tiny_single
        # Each rank is a thread of this process owning its own buffers.
        names = {t.name for t in threading.enumerate()}
        assert {"helios-rank-0", "helios-rank-1"} <= names
    finally:
        model.close()


def test_a_failing_rank_fails_the_step_and_every_later_one(tiny_tp2, tiny_prompts):
    model = _load(tiny_tp2)
    try:
        Driver(model).generate(tiny_prompts[:1], 2)
        rank1 = model.backend.peers._ranks[1].backend

        def broken(graph, dirty=()):
            raise MemoryError("rank 1 ran out of memory")

        rank1.run = broken
        started = time.monotonic()
        with pytest.raises(RankLost, match="rank 1 failed: rank 1 ran out of memory"):
            Driver(model).generate(tiny_prompts[:1], 2)
        assert time.monotonic() - started < 10  # rank 0 left its collective: no hang
        with pytest.raises(RankLost, match="the model's ranks failed earlier"):
            Driver(model).generate(tiny_prompts[:1], 2)
    finally:
        model.close()


def test_ranks_that_disagree_commit_nothing(tiny_tp2, tiny_prompts):
    model = _load(tiny_tp2)
    try:
        rank1 = model.backend.peers._ranks[1]
        honest = rank1.run

        def lying(step):
            record = honest(step)
            record["out.sampled"][0] += 1  # a rank whose sampled id differs from rank 0's
            return record

        rank1.run = lying
        driver = Driver(model)
        with pytest.raises(RankDisagreement, match=r"rank 1's completion record "
                                                   r"\(out.sampled\) of prefill_t\d+ differs"):
            driver.generate(tiny_prompts[:1], 2)
        staged = model.backend.staging(0)["out.sampled"]
        assert not staged.any()  # the mirror the scheduler reads was never written
    finally:
        model.close()


@pytest.mark.slow
@pytest.mark.timeout(1200)  # about a minute on an idle CI machine
def test_smollm2_three_ranks_greedy_equals_one_rank_and_hf(smollm2_tp3_f32, smollm2_core_f32):
    prompts = [p["prompt_ids"] for p in GOLDENS["prompts"]]
    steps = 8
    split = _load(smollm2_tp3_f32)
    try:
        assert split.backend.peers.ranks == 3
        ids = Driver(split).generate(prompts, steps)
    finally:
        split.close()
    single = _load(smollm2_core_f32)
    try:
        assert ids == Driver(single).generate(prompts, steps)
    finally:
        single.close()
    assert ids == [p["greedy_ids"][:steps] for p in GOLDENS["prompts"]]


def test_every_rank_runs_rank_zeros_tuned_split_count(tiny_served, tiny_prompts, tiny_single,
                                                      tmp_path):
    from dataclasses import replace

    from helios_ignition.recipe import SplitTuning

    from tests.tiny_model import export_tiny

    core = tiny_served.core
    path = export_tiny(tiny_served.checkpoint, core.private_key, tmp_path / "tuned.core",
                       tensor_parallel=2, split_tuning=SplitTuning())
    model = _load(replace(core, path=path))
    try:
        ranks = model.backend.peers._ranks
        tuned = [r.backend.buffers["tuned.decode_splits"].copy() for r in ranks]
        assert tuned[0][0] >= 1 and all(np.array_equal(t, tuned[0]) for t in tuned)
        assert Driver(model).generate(tiny_prompts, 12) == tiny_single
        # A rank whose own timing chose another count still runs rank 0's.
        rank1 = ranks[1].backend
        timed = rank1.run_producers

        def other_choice(names):
            timed(names)
            rank1.buffers["tuned.decode_splits"][...] = tuned[0] + 7

        rank1.run_producers = other_choice
        model.backend.run_producers(["tune.decode_splits"])
        assert np.array_equal(rank1.buffers["tuned.decode_splits"],
                              ranks[0].backend.buffers["tuned.decode_splits"])
    finally:
        model.close()
