"""Batched decode on the tensor-core tile (issue 27, ``launch.decode_tc``): which decode
buckets take linear_packed's TC=1 tile with one slice, what capture records for them, and
that every candidate tile compiles for sm_90."""

from __future__ import annotations

import pytest
from helios_ignition.capture import launch
from helios_ignition.capture.programs import capture
from helios_ignition.families.llama import LlamaShapes
from helios_ignition.kernels_aot import compile_all, variant_kernel
from helios_ignition.testing import TINY_CAPACITIES

# The tiny model with K a multiple of 64 (the TC tile's whole K steps)
SHAPES = LlamaShapes(vocab=96, hidden=64, ffn=128, layers=2, heads=4, kv_heads=2,
                     head_dim=16, rope_theta=10000.0, rms_eps=1e-5, tied=True)

ELF_MAGIC = b"\x7fELF"


class _W:  # a bf16 weight view
    shape, buffer = (6144, 4096), type("D", (), {"dtype": "bf16"})()


def test_decode_tc_rule(monkeypatch):
    # the default "table" rule without measured cells: every decode bucket keeps the K split
    monkeypatch.setattr(launch, "DECODE_TC", "table")
    monkeypatch.setattr(launch, "_DECODE_TC_TILES", {})
    assert not launch.decode_tc(256, 6144, 4096)
    assert launch.mma_plan(256, 6144, 4096) == 1  # measured K-split cell, S = 1
    assert "TC" not in launch.launch_config("linear_packed", [256, 6144, 4096, 1],
                                            [None, _W]).constants
    assert launch.mma_plan(128, 4096, 14336) == 4
    # a threshold: buckets from it up to MMA_ROWS[1] take the TC tile, one slice
    assert launch.decode_tc(128, 6144, 4096, "128") and launch.decode_tc(256, 6144, 4096, "96")
    assert not launch.decode_tc(96, 6144, 4096, "128")
    assert not launch.decode_tc(300, 6144, 4096, "8")  # prefill rows: prefill_tc's rule
    assert not launch.decode_tc(128, 3072, 576, "8")  # narrow N (SmolLM2's gate/up)
    assert not launch.decode_tc(128, 4096, 4100, "8")  # K not a multiple of 64
    assert not launch.decode_tc(128, 6144, 4096, "off")
    with pytest.raises(ValueError, match="HELIOS_LINEAR_DECODE_TC must be 'table', 'off' or "
                                         "a row count, got 'x'"):
        launch.decode_tc(128, 6144, 4096, "x")
    monkeypatch.setattr(launch, "DECODE_TC", "128")
    assert launch.mma_plan(128, 4096, 14336) == 1 and launch.mma_plan(96, 4096, 14336) == 4
    c = launch.launch_config("linear_packed", [128, 4096, 14336, 1], [None, _W])
    # _decode_tile: 64 x 128 tiles (2 x 32 = 64 programs) beat 128 x 128 (32 programs)
    assert {k: c.constants[k] for k in ("TC", "PACKED", "XSPLIT", "BLOCK_T", "BLOCK_N",
                                        "BLOCK_K", "STAGES")} == dict(
        TC=1, PACKED=1, XSPLIT=1, BLOCK_T=64, BLOCK_N=128, BLOCK_K=64, STAGES=4)
    assert c.grid == (64, 1, 1) and c.block == (128, 1, 1)
    # 256 rows of gate/up: 2 x 112 = 224 tiles of 128 x 256 (two waves, 1.0 per area)
    g = launch.launch_config("linear_packed", [256, 28672, 4096, 1], [None, _W])
    assert (g.constants["BLOCK_T"], g.constants["BLOCK_N"], g.grid) == (128, 256, (224, 1, 1))
    # a measured cell's tile wins over _decode_tile; under "table" only measured cells
    monkeypatch.setattr(launch, "_DECODE_TC_TILES", {(4096, 14336, 128): (128, 128, 64, 8, 4)})
    assert launch.tc_constants(128, 4096, 14336)["BLOCK_T"] == 128
    monkeypatch.setattr(launch, "DECODE_TC", "table")
    assert launch.decode_tc(128, 4096, 14336) and not launch.decode_tc(256, 4096, 14336)
    # one term only over a rounded input (round_bf16's hi | 0: bf16-activation cores)
    assert launch.tc_constants(128, 4096, 14336)["XSPLIT"] == 1
    assert launch.tc_constants(128, 4096, 14336, rounded=True)["XSPLIT"] == 0
    assert launch.tc_constants(1024, 4096, 14336, rounded=True)["XSPLIT"] == 0
    # the row-invariant products keep their own path (linear_packed_rows / linear_rows)
    assert launch.invariant_splits(4096, 14336) is None


def test_capture_records_one_slice_tc_products(monkeypatch):
    """With the tiny matrices let through, the decode buckets at or above the threshold
    record split -> linear_packed (TC=1, one slice) with no splitk_reduce; the smaller
    ones keep the K split with its reduction."""
    monkeypatch.setattr(launch, "LINEAR_MMA", "on")
    monkeypatch.setattr(launch, "MMA_MIN_WEIGHTS", 0)
    monkeypatch.setattr(launch, "MMA_ROWS", (1, 256))
    monkeypatch.setattr(launch, "PREFILL_TC_MIN_N", 0)
    monkeypatch.setattr(launch, "mma_splits", lambda T, N, K, c=None: 2)
    monkeypatch.setattr(launch, "DECODE_TC", "4")
    manifest, _ = capture(SHAPES, TINY_CAPACITIES, "bf16")
    kernels = {k.id: k for k in manifest.kernels}
    seen = set()
    for g in manifest.graphs:
        if not g.name.startswith("decode_b"):
            continue
        B = int(g.name.removeprefix("decode_b"))
        ops = [kernels[x.kernel].reference_op for x in g.launches]
        packed = [kernels[x.kernel] for x in g.launches
                  if kernels[x.kernel].reference_op == "linear_packed"]
        assert packed, g.name
        tc = {dict(k.constants).get("TC", 0) for k in packed}
        assert tc == ({1} if B >= 4 else {0}), g.name
        assert ("splitk_reduce" in ops) == (B < 4), g.name
        # the LM head (N = vocab) joins the TC tile where it applies, else stays linear
        heads = [k for k in packed if k.reference_op == "linear_packed"
                 and any(x.int_value == SHAPES.vocab for x in _args_of(g, k))]
        assert bool(heads) == (B >= 4), g.name
        assert ("linear" in ops) == (B < 4), g.name
        seen.add(B >= 4)
    assert seen == {True, False}
    # bf16 activations: the same launches over round_bf16, every one XSPLIT=0 (the LM
    # head's TC sequence and the K split included)
    rounded, _ = capture(SHAPES, TINY_CAPACITIES, "bf16", activations="bf16")
    kernels = {k.id: k for k in rounded.kernels}
    for g, f32 in zip(rounded.graphs, manifest.graphs, strict=True):
        ops = [kernels[x.kernel].reference_op for x in g.launches]
        assert len(ops) == len(f32.launches) and "split_bf16" not in ops, g.name
        for x in g.launches:
            k = kernels[x.kernel]
            if k.reference_op == "linear_packed":
                assert k.constants["XSPLIT"] == 0, g.name
        if g.name.startswith("decode_b") and int(g.name.removeprefix("decode_b")) >= 4:
            head = [x for x in g.launches if kernels[x.kernel].reference_op == "linear_packed"
                    and any(a.int_value == SHAPES.vocab for a in x.args)]
            assert len(head) == 1 and kernels[head[0].kernel].constants["TC"] == 1, g.name


def _args_of(graph, kernel):
    """The argument lists of `graph`'s launches of `kernel`, flattened."""
    return [a for x in graph.launches if x.kernel == kernel.id for a in x.args]


def test_decode_tiles_compile_for_sm90():
    """Every DECODE_TILES candidate in both activation forms (what _decode_tile and
    bench/gpu_decode_gemm.py can launch) compiles for sm_90 within its shared memory."""
    base = dict(WBF16=1, K16=1, GROUP_T=8, EVEN_K=1, TC=1, PACKED=1)
    variants = [dict(base, BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk, WARPS=w, STAGES=s, XSPLIT=x)
                for bt, bn, bk, w, s in launch.DECODE_TILES for x in (0, 1)]
    kernels = [variant_kernel(f"dtc{i}", "linear_packed", c) for i, c in enumerate(variants)]
    compiled = compile_all(kernels, ("sm_90",), workers=2)
    assert len(compiled) == len(kernels)
    for ck in compiled:
        assert ck.binary[:4] == ELF_MAGIC
        assert ck.global_scratch_bytes > 0  # device-side tensor descriptors
        assert ck.shared_bytes <= 227 * 1024


def test_tc_sequence_on_the_cpu_backend_matches_dense(monkeypatch):
    """Prefill and decode programs recorded with every product and the LM head on the TC
    tile (split_bf16 -> one-slice linear_packed, no reduction) run by the CPU backend's
    references give the dense forward's logits (f32 weights let through for the test)."""
    import numpy as np
    from helios_ignition.capture import layers
    from helios_ignition.testing import dense_forward, tiny_core
    from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
    from helios_serve.testing.native import load_native

    monkeypatch.setattr(launch, "LINEAR_MMA", "on")
    monkeypatch.setattr(launch, "MMA_MIN_WEIGHTS", 0)
    monkeypatch.setattr(launch, "MMA_ROWS", (1, 256))
    monkeypatch.setattr(launch, "PREFILL_TC_MIN_N", 0)
    monkeypatch.setattr(launch, "DECODE_TC", "2")
    monkeypatch.setattr(layers, "_packed_weights", lambda dtype: True)
    core = tiny_core(seed=5, shapes=SHAPES)
    graphs = {g.name: g for g in core.manifest.graphs}
    kernels = {k.id: k for k in core.manifest.kernels}
    dec = [kernels[x.kernel] for x in graphs["decode_b4"].launches]
    assert {k.reference_op for k in dec} >= {"split_bf16", "linear_packed"}
    assert not {"linear", "splitk_reduce"} & {k.reference_op for k in dec}
    model = load_native(core, "cpu")
    prompts = {0: [1, 2, 3, 4, 5], 1: [9, 8, 7], 3: [40, 41, 42, 43, 44, 45, 46]}
    pages = {0: [0, 1], 1: [5], 3: [9, 2]}
    rows = tuple(RowPlan(request_id=10 + s, slot=s, generation=1, tokens=tuple(p),
                         start_position=0, page_ids=tuple(pages[s]), sample=True,
                         sampling=SamplingParams(), histogram_tokens=tuple(p))
                 for s, p in prompts.items())
    model.execute(StepPlan(StepKind.PREFILL, rows))  # 15 tokens: the 16-token graph
    got = model.backend.buffers["scratch.logits"][:3].copy()
    for i, p in enumerate(prompts.values()):
        ref = dense_forward(core.weights, SHAPES, p)[-1]
        np.testing.assert_allclose(got[i], ref, atol=2e-3, rtol=1e-3)
    fed = {0: 11, 1: 12, 3: 13}
    rows = tuple(RowPlan(request_id=10 + s, slot=s, generation=1, tokens=(fed[s],),
                         start_position=len(p), page_ids=tuple(pages[s]), sample=True,
                         sampling=SamplingParams())
                 for s, p in prompts.items())
    if model.device_pending:  # the fed tokens, not the sampled ones
        model.write_pending_tokens(list(prompts), list(fed.values()))
    model.execute(StepPlan(StepKind.DECODE, rows))  # 3 rows: decode_b4
    got = model.backend.buffers["scratch.logits"][:3]
    for i, (s, p) in enumerate(prompts.items()):
        ref = dense_forward(core.weights, SHAPES, p + [fed[s]])[-1]
        np.testing.assert_allclose(got[i], ref, atol=2e-3, rtol=1e-3)
    model.close()
