"""Qwen3 and Qwen3-MoE captured programs on their own (no checkpoint): the cuda path's
kernels compile ahead of time for sm_90 (CPU, no GPU), folded decode graphs run on the
cpu backend as the unfolded ones do, and the MoE core's RESTORE programs copy pages as
every family's (snapshots restore an MoE request's prefix exactly).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helios_ignition.capture.programs import capture
from helios_ignition.families.qwen3 import Qwen3MoeShapes, Qwen3Shapes
from helios_ignition.kernels_aot import compile_targets
from helios_ignition.testing import TINY_CAPACITIES, TINY_SHAPES, tiny_core
from helios_serve.engine.plan import Route, Tier
from helios_serve.runtime.driver import Driver
from helios_serve.scheduler import TransferCost
from helios_serve.testing.native import load_native
from helios_serve.testing.serial import Serial

DENSE = Qwen3Shapes(**{f: getattr(TINY_SHAPES, f) for f in TINY_SHAPES.__dataclass_fields__})
MOE = Qwen3MoeShapes(**{**{f: getattr(DENSE, f) for f in DENSE.__dataclass_fields__},
                        "ffn": 16}, experts=8, experts_per_token=2, norm_topk=True)
MOE_OPS = {"qk_rmsnorm", "moe_route", "moe_align", "moe_gate_up", "moe_down", "moe_sum"}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_moe_kernels_compile_for_sm90(dtype):
    manifest, _ = capture(MOE, TINY_CAPACITIES, dtype)
    ops = {k.reference_op for k in manifest.kernels}
    assert MOE_OPS <= ops and "silu_mul" not in ops
    gate_up = next(k for k in manifest.kernels if k.reference_op == "moe_gate_up")
    assert gate_up.constants["WBF16"] == (dtype == "bf16")
    assert gate_up.constants["BLOCK_T"] == 16
    blobs = compile_targets(manifest, ("sm_90",), workers=2)
    assert len(blobs) == len(manifest.kernels)
    assert all(blob[:4] == b"\x7fELF" for blob in blobs.values())


@pytest.mark.parametrize("shapes", [DENSE, MOE], ids=["dense", "moe"])
def test_folded_layers_generate_the_same_ids(shapes):
    """fold_layers records Qwen3's layers with the norms folded into the products (the
    MoE block keeps its own launches between a residual add and a norm): same ids."""
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5]]
    plain = Driver(load_native(tiny_core(seed=4, shapes=shapes), "cpu"))
    folded = Driver(load_native(tiny_core(seed=4, shapes=shapes, fold_layers=True), "cpu"))
    want = plain.generate(prompts, max_new_tokens=6)
    assert folded.generate(prompts, max_new_tokens=6) == want
    assert len({t for ids in want for t in ids}) > 1  # not a constant output


def test_moe_snapshot_restore_equals_a_fresh_prefill():
    """Snapshots only copy pages: an MoE core gets every family's RESTORE programs, and a
    request whose prefix is restored from a snapshot samples the same ids with the same
    logits as one prefilled from scratch (tests/serve/runtime/test_snapshots_native.py's
    check, on the MoE core)."""
    caps = replace(TINY_CAPACITIES, prepared_snapshots=4, host_tier=True, transfer_rows=4)
    moe, _ = capture(MOE, caps, "f32")
    dense, _ = capture(DENSE, caps, "f32")
    restore = [g.name for g in moe.graphs if g.name.startswith("transfer_")]
    assert restore == [g.name for g in dense.graphs if g.name.startswith("transfer_")]
    assert len(restore) == 5
    core = tiny_core(seed=5, shapes=MOE, caps=caps)
    cheap = TransferCost(transfer_step_s=1e-9, page_copy_s=1e-9, prefill_tokens_per_s=1.0)
    prompt = [5, 9, 11, 3, 7, 21, 40, 2, 17]
    run = Serial(load_native(core, "cpu"), cheap)
    run.add(1, prompt, 3)
    run.run()
    follow = prompt + run.out[1] + [44, 45, 46]
    run.add(2, follow, 4)
    run.run()
    assert run.reused[2] == 11 and run.copies(Route(Tier.CONTINUATION, Tier.PAGES)) == 1
    fresh = Serial(load_native(core, "cpu", snapshots=0), cheap)
    fresh.add(2, follow, 4)
    fresh.run()
    assert fresh.reused[2] == 0 and run.out[2] == fresh.out[2]
    for k in range(4):
        np.testing.assert_allclose(run.logits[2][k], fresh.logits[2][k], atol=2e-5, rtol=0)


def test_moe_speculative_generation_keeps_the_greedy_ids():
    """A drafter core of the MoE family: SPECULATIVE programs verify with the same
    (row-invariant) expert products as decode, so greedy speculative output equals plain
    greedy decoding, with the learned drafts alone and with copied candidates that are
    the greedy continuation (every one accepted: verification rows run the experts)."""
    core = tiny_core(seed=6, shapes=MOE, speculative_widths=(1, 2, 3, 4))
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5]]
    want = Driver(load_native(core, "cpu")).generate(prompts, max_new_tokens=12)

    def oracle(seq: list[int]) -> list[int]:  # the true continuation after `seq`
        i = next(i for i, p in enumerate(prompts) if seq[:len(p)] == p)
        done = len(seq) - len(prompts[i])  # outputs so far, the pending one included
        return want[i][done:done + 3]

    learned, _ = Driver(load_native(core, "cpu")).generate_speculative(
        prompts, max_new_tokens=12, width=4)
    assert learned == want
    copied, records = Driver(load_native(core, "cpu")).generate_speculative(
        prompts, max_new_tokens=12, width=4, propose=oracle)
    assert copied == want
    assert [int(r[2]) for r in records[0]] == [3, 3]  # accepted drafts of the first round
