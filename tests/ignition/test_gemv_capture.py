"""Capture of the batch-1 down projection (``launch.fuse_swiglu_linear``): fused
``swiglu_linear`` up to ``FUSE_GEMV_MAX_K`` FFN features, ``silu_mul`` + ``linear`` beyond
(the 8B geometry's 14336: measured faster unfused on the H200,
bench/results/gpu-history.md, "Batch-1 GEMV against copy speed")."""

from __future__ import annotations

import pytest
from helios_ignition.capture import launch
from helios_ignition.capture.programs import capture
from helios_ignition.testing import TINY_CAPACITIES, TINY_SHAPES


def _decode_b1(manifest) -> list[str]:
    kernels = {k.id: k.reference_op for k in manifest.kernels}
    (g,) = [g for g in manifest.graphs if g.name == "decode_b1"]
    return [kernels[x.kernel] for x in g.launches]


@pytest.mark.parametrize("fold", [False, True])
def test_down_projection_fused_up_to_the_limit(monkeypatch, fold):
    layers = TINY_SHAPES.layers
    fused_op, plain_op = ("swiglu_linear_add", "linear_add") if fold else ("swiglu_linear",
                                                                            "linear")
    monkeypatch.setattr(launch, "FUSE_GEMV_MAX_K", TINY_SHAPES.ffn)  # at the limit: fused
    ops = _decode_b1(capture(TINY_SHAPES, TINY_CAPACITIES, "bf16", fold_layers=fold)[0])
    assert ops.count(fused_op) == layers and "silu_mul" not in ops
    monkeypatch.setattr(launch, "FUSE_GEMV_MAX_K", TINY_SHAPES.ffn - 1)  # over it: unfused
    unfused = _decode_b1(capture(TINY_SHAPES, TINY_CAPACITIES, "bf16", fold_layers=fold)[0])
    assert fused_op not in unfused and unfused.count("silu_mul") == layers
    assert unfused.count(plain_op) == ops.count(plain_op) + layers
    assert len(unfused) == len(ops) + layers  # one more launch per layer
    # in place of each fused launch: silu_mul then the product, nothing else moves
    i = unfused.index("silu_mul")
    assert unfused[i + 1] == plain_op and ops[i] == fused_op


def test_default_limit_splits_smollm2_from_8b():
    assert launch.FUSE_GEMV_MAX_K == 8192
    assert launch.fuse_swiglu_linear(1, 576, 1536)  # SmolLM2: fused
    assert not launch.fuse_swiglu_linear(1, 4096, 14336)  # Llama-3.1-8B: silu_mul + linear
    assert launch.fuse_swiglu_linear(4, 576, 1536)  # few rows on the FMA path: unchanged
