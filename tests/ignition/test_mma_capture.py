"""Capture of the batched-decode GEMM path (``launch.mma_plan``): which products take it,
what they record, and that cores where it applies nowhere are unchanged."""

from __future__ import annotations

import pytest
from helios_ignition.capture import launch
from helios_ignition.capture.programs import capture
from helios_ignition.testing import TINY_CAPACITIES, TINY_SHAPES


def _launches(manifest):
    kernels = {k.id: k.reference_op for k in manifest.kernels}
    return {g.name: [kernels[x.kernel] for x in g.launches] for g in manifest.graphs}


def test_mma_off_and_small_models_record_linear_only(monkeypatch):
    monkeypatch.setattr(launch, "LINEAR_MMA", "on")  # on, but the tiny matrices are small
    manifest, _ = capture(TINY_SHAPES, TINY_CAPACITIES, "bf16")
    ops = {k.reference_op for k in manifest.kernels}
    assert not ops & {"split_bf16", "swiglu_split_bf16", "linear_packed", "splitk_reduce"}
    assert not {b.name for b in manifest.buffers} & {"scratch.xsplit", "scratch.mma_partial"}
    assert launch.mma_plan(64, 6144, 4096, "off") is None
    assert launch.mma_plan(4, 6144, 4096, "on") is None  # below 8 rows: GEMV / FMA / v3
    assert launch.mma_plan(8, 960, 576, "on") is None  # SmolLM2: launch-bound, unchanged
    # beyond 256 rows: the packed TC prefill tile (one slice), unless turned off
    assert launch.mma_plan(300, 6144, 4096, "on") == 1
    monkeypatch.setattr(launch, "PREFILL_PACKED", False)  # HELIOS_LINEAR_PREFILL_PACKED=0
    assert launch.mma_plan(300, 6144, 4096, "on") is None  # the linear kernel's prefill tile
    monkeypatch.setattr(launch, "PREFILL_PACKED", True)
    # the measured cells (bench/results/h200_2026-12-02/mma_sweep_bf8287c.json)
    assert launch.mma_plan(8, 6144, 4096) == 2 and launch.mma_plan(48, 4096, 14336) == 4
    assert launch.mma_constants(48, 4096, 14336) == dict(
        BLOCK_T=64, BLOCK_N=64, BLOCK_K=64, WARPS=4, STAGES=4, EVEN_K=1)
    c = launch.launch_config("linear_packed", [8, 28672, 4096, 1])
    assert c.grid == (224, 1, 1) and c.block == (128, 1, 1)
    assert launch.mma_plan(24, 1000, 20000) == 16  # not measured: default tile, most slices
    with pytest.raises(ValueError, match="HELIOS_LINEAR_MMA must be 'on' or 'off', got 'x'"):
        launch.mma_plan(8, 6144, 4096, "x")


def test_mma_on_records_split_packed_reduce(monkeypatch):
    monkeypatch.setattr(launch, "LINEAR_MMA", "on")
    monkeypatch.setattr(launch, "MMA_MIN_WEIGHTS", 0)  # let the tiny matrices take it
    monkeypatch.setattr(launch, "mma_splits", lambda T, N, K, c=None: 2)  # and a K split
    manifest, _ = capture(TINY_SHAPES, TINY_CAPACITIES, "bf16")
    buffers = {b.name: list(b.shape) for b in manifest.buffers}
    tokens = buffers["scratch.qkv"][0]
    assert buffers["scratch.xsplit"] == [tokens, TINY_SHAPES.ffn]
    assert buffers["scratch.mma_partial"] == [2 * tokens * 2 * TINY_SHAPES.ffn + 1]
    seen = 0
    for ops in _launches(manifest).values():
        n = ops.count("linear_packed")
        if not n:
            assert "split_bf16" not in ops
            continue
        seen += 1
        layers = TINY_SHAPES.layers
        assert n == 4 * layers  # qkv, o, gate/up, down of every layer
        assert ops.count("split_bf16") == 3 * layers and ops.count("swiglu_split_bf16") == layers
        assert ops.count("splitk_reduce") == 4 * layers and "silu_mul" not in ops
        i = ops.index("linear_packed")
        assert ops[i - 1] == "split_bf16" and ops[i + 1] == "splitk_reduce"
    assert seen  # the 8- and 16-token prefill graphs
    f32, _ = capture(TINY_SHAPES, TINY_CAPACITIES, "f32")  # f32 weights keep linear
    assert "linear_packed" not in {k.reference_op for k in f32.kernels}


def test_mma_path_on_the_cpu_backend_matches_dense(monkeypatch):
    """The recorded split -> packed K slices -> reduce sequence run by the CPU backend's
    references (views into scratch.xsplit / scratch.mma_partial) gives the dense forward's
    logits (the tiny model's f32 weights let through for the test)."""
    import numpy as np
    from helios_ignition.capture import layers
    from helios_ignition.testing import dense_forward, tiny_core
    from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
    from helios_serve.testing.native import load_native

    monkeypatch.setattr(launch, "LINEAR_MMA", "on")
    monkeypatch.setattr(launch, "MMA_MIN_WEIGHTS", 0)
    monkeypatch.setattr(launch, "mma_splits", lambda T, N, K, c=None: 3)
    monkeypatch.setattr(layers, "_packed_weights", lambda dtype: True)
    core = tiny_core(seed=3)
    assert "linear_packed" in {k.reference_op for k in core.manifest.kernels}
    model = load_native(core, "cpu")
    prompts = {0: [1, 2, 3, 4, 5], 1: [9, 8, 7], 3: [40, 41, 42, 43, 44, 45, 46]}
    pages = {0: [0, 1], 1: [5], 3: [9, 2]}
    rows = tuple(RowPlan(request_id=10 + s, slot=s, generation=1, tokens=tuple(p),
                         start_position=0, page_ids=tuple(pages[s]), sample=True,
                         sampling=SamplingParams(), histogram_tokens=tuple(p))
                 for s, p in prompts.items())
    model.execute(StepPlan(StepKind.PREFILL, rows))  # 15 tokens: the 16-token graph
    got = model.backend.buffers["scratch.logits"][:3]
    for i, p in enumerate(prompts.values()):
        ref = dense_forward(core.weights, TINY_SHAPES, p)[-1]
        np.testing.assert_allclose(got[i], ref, atol=2e-3, rtol=1e-3)
    model.close()


def _force_packed(monkeypatch):
    """The tiny model's products on the packed path (f32 weights let through)."""
    from helios_ignition.capture import layers

    monkeypatch.setattr(launch, "LINEAR_MMA", "on")
    monkeypatch.setattr(launch, "MMA_MIN_WEIGHTS", 0)
    monkeypatch.setattr(launch, "mma_splits", lambda T, N, K, c=None: 3)
    monkeypatch.setattr(layers, "_packed_weights", lambda dtype: True)


def test_bf16_activations_record_round_and_one_term(monkeypatch):
    """activations="bf16": every packed product's producer is round_bf16 /
    swiglu_round_bf16 and its linear_packed kernels carry XSPLIT=0; the f32 form records
    split_bf16 and leaves the K split's constants (and kernel ids) as before."""
    from helios_ignition.capture.builder import CaptureError, ProgramBuilder

    _force_packed(monkeypatch)
    manifest, _ = capture(TINY_SHAPES, TINY_CAPACITIES, "bf16", activations="bf16")
    kernels = {k.id: k for k in manifest.kernels}
    layers_ = TINY_SHAPES.layers
    seen = 0
    for ops in _launches(manifest).values():
        if "linear_packed" not in ops:
            continue
        seen += 1
        assert ops.count("round_bf16") == 3 * layers_
        assert ops.count("swiglu_round_bf16") == layers_
        assert not {"split_bf16", "swiglu_split_bf16"} & set(ops)
        i = ops.index("linear_packed")
        assert ops[i - 1] == "round_bf16"
    assert seen
    packed = [k for k in kernels.values() if k.reference_op == "linear_packed"]
    assert packed and all(k.constants["XSPLIT"] == 0 for k in packed)
    assert all(k.constants["LO"] == 0 for k in kernels.values()
               if k.reference_op in ("round_bf16", "swiglu_round_bf16"))
    f32, _ = capture(TINY_SHAPES, TINY_CAPACITIES, "bf16")
    assert all("XSPLIT" not in k.constants for k in f32.kernels
               if k.reference_op == "linear_packed")
    with pytest.raises(CaptureError, match="activation dtype must be one of f32, bf16, "
                                           "not 'fp16'"):
        ProgramBuilder(None, {}, "fp16")


def test_bf16_activations_on_the_cpu_backend(monkeypatch):
    """The cpu backend executes the rounded sequence: logits within bf16 rounding of the
    f32-activation core's and not equal to them, while the backend that lacks the
    rounded producers refuses the core at startup (runtime.reference_op, the one rule
    lint-core applies)."""
    from dataclasses import replace

    import numpy as np
    from helios_contract.capabilities import capability_findings
    from helios_ignition.testing import tiny_core
    from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
    from helios_serve.runtime.errors import RuntimeLoadError
    from helios_serve.testing.native import load_native
    from helios_tools.capabilities import BACKENDS, CPU
    from helios_tools.kernels.linear_splitk import ROUNDED_PRODUCERS

    _force_packed(monkeypatch)
    prompt = (1, 2, 3, 4, 5, 6, 7, 8, 9)
    row = RowPlan(request_id=1, slot=0, generation=1, tokens=prompt, start_position=0,
                  page_ids=(0,), sample=True, sampling=SamplingParams(),
                  histogram_tokens=prompt)
    logits = {}
    for act in ("f32", "bf16"):
        core = tiny_core(seed=5, activations=act)
        model = load_native(core, "cpu")
        model.execute(StepPlan(StepKind.PREFILL, (row,)))
        logits[act] = model.backend.buffers["scratch.logits"][0].copy()
        model.close()
    diff = np.abs(logits["bf16"] - logits["f32"]).max()
    assert 0 < diff < 0.05 * np.abs(logits["f32"]).max()
    old = replace(CPU, reference_ops=CPU.reference_ops - frozenset(ROUNDED_PRODUCERS))
    found = list(capability_findings(core.contract, core.manifest, old))
    assert {f.rule for f in found} == {"runtime.reference_op"}
    assert {f.value for f in found} == set(ROUNDED_PRODUCERS)
    monkeypatch.setitem(BACKENDS, "cpu", old)  # a runtime built before the ops
    with pytest.raises(RuntimeLoadError, match="round_bf16"):
        load_native(core, "cpu")


def test_one_term_launches_must_read_a_rounded_producer(monkeypatch):
    """runtime.one_term_input (cuda): a bf16-activation core passes; the same core whose
    producer writes hi | lo (split_bf16), or whose one-term launch reads another view,
    is refused, for the cuda backend only (the cpu backend runs the references)."""
    from helios_contract.capabilities import capability_findings
    from helios_ignition.testing import tiny_core
    from helios_tools.capabilities import CPU, CUDA

    _force_packed(monkeypatch)
    core = tiny_core(seed=5, activations="bf16")
    assert list(capability_findings(core.contract, core.manifest, CUDA)) == []

    def findings(edit, caps=CUDA):
        manifest = type(core.manifest)()
        manifest.CopyFrom(core.manifest)
        edit(manifest)
        return [f for f in capability_findings(core.contract, manifest, caps)
                if f.rule == "runtime.one_term_input"]

    def two_terms(m):
        for k in m.kernels:
            if k.reference_op == "round_bf16":
                k.reference_op = "split_bf16"

    found = findings(two_terms)
    rounded = sum(1 for g in core.manifest.graphs for x in g.launches
                  if x.kernel.startswith("round_bf16"))
    assert len(found) == rounded  # every product whose producer was round_bf16
    assert found[0].value == "scratch.xsplit"
    assert found[0].path.endswith(".args[0].buffer.buffer")
    assert "runs XSPLIT=0 (one term) over a view no rounded producer (round_bf16, " \
           "swiglu_round_bf16) wrote just before" in found[0].detail
    assert findings(two_terms, CPU) == []

    def moved(m):
        g = next(g for g in m.graphs if any(x.kernel.startswith("linear_packed")
                                            for x in g.launches))
        x = next(x for x in g.launches if x.kernel.startswith("linear_packed"))
        x.args[0].buffer.byte_offset += 4

    assert len(findings(moved)) == 1
