"""`ignition export --tensor-parallel N`: one core with every rank's weights and programs.

The tiny checkpoint (tests/tiny_model.py: 4 query heads, 2 key/value heads, FFN 64,
vocabulary 283) is split between 2 ranks. Each rank's stored weights are checked against
the checkpoint's tensors read independently (safetensors), through the core's per-rank
weight catalog; the programs carry one all-reduce after each row-parallel product and
one gather for the vocabulary-parallel head.
"""

from __future__ import annotations

import numpy as np
import pytest
from helios_contract.schema import manifest_pb2 as mpb
from helios_ignition.capture.family import TensorParallelError
from helios_ignition.capture.programs import capture
from helios_ignition.families.llama import LlamaShapes
from helios_ignition.testing import TINY_CAPACITIES, TINY_SHAPES
from helios_tools.core import authorize, load_public_key, open_core
from safetensors.numpy import load_file

from tests.ignition.export.tiny import LLAMA_RECIPE, NAMESPACE, run_export
from tests.tiny_model import GEOMETRY


@pytest.fixture(scope="module")
def core(tiny_tp2):
    opened = open_core(tiny_tp2.path, [load_public_key(tiny_tp2.public_key)])
    authorize(opened, tiny_tp2.namespace)
    return opened


@pytest.fixture(scope="module")
def tensors(tiny_served):
    out = {}
    for path in sorted(tiny_served.checkpoint.glob("*.safetensors")):
        out.update(load_file(path))
    return out


def test_manifest_declares_two_ranks_with_split_weights(core):
    manifest = core.manifest
    assert manifest.rank_count == 2
    weights = {b.name: b for b in manifest.buffers if b.role == mpb.BUFFER_ROLE_WEIGHT}
    H, KVH, HD, F, D = 4, 2, 8, 64, 32
    split = {n: b for n, b in weights.items() if b.rank_weight_resource_ids}
    assert sorted(split) == sorted(
        [f"L{i}.{k}" for i in range(2) for k in ("wqkv", "wo", "w_gate_up", "w_down")]
        + ["lm_head"])
    for name, b in split.items():
        assert b.weight_resource_id == ""
        assert list(b.rank_weight_resource_ids) == [f"weights/rank{r}/{name}" for r in (0, 1)]
    shapes = {n: list(b.shape) for n, b in weights.items()}
    assert shapes["L0.wqkv"] == [(H + 2 * KVH) // 2 * HD, D]
    assert shapes["L0.wo"] == [D, H // 2 * HD]
    assert shapes["L0.w_gate_up"] == [2 * F // 2, D]
    assert shapes["L0.w_down"] == [D, F // 2]
    assert shapes["lm_head"] == [142, D]  # ceil(283 / 2): rank 1 holds one zero pad row
    assert shapes["embed"] == [283, D] and weights["embed"].weight_resource_id  # replicated
    kv = next(b for b in manifest.buffers if b.name == "L0.k_cache")
    assert list(kv.shape)[2:] == [KVH // 2, HD]


def test_programs_reduce_after_row_parallel_products_and_gather_the_head(core):
    manifest = core.manifest
    ops = {k.id: k.reference_op for k in manifest.kernels}
    forward = [g for g in manifest.graphs if not g.name.startswith("transfer_")]
    assert forward
    for graph in manifest.graphs:
        if graph not in forward:  # RESTORE programs copy rows; no product, no collective
            assert {ops[launch.kernel] for launch in graph.launches} == {"row_copy"}
    for graph in forward:
        launched = [ops[launch.kernel] for launch in graph.launches]
        assert launched.count("all_reduce_sum") == 2 * GEOMETRY.num_layers, graph.name
        # a scored program gathers the head's columns of every packed token first, for
        # score_tokens; then, as every program, those of the sampled rows
        scored = graph.name.startswith("scored_")
        assert launched.count("all_gather_columns") == 1 + scored, graph.name
        if scored:
            first = launched.index("all_gather_columns")
            assert launched[first + 1] == "score_tokens", graph.name
        gather = len(launched) - 1 - launched[::-1].index("all_gather_columns")
        assert launched[gather + 1] in ("sample_chunks_mass", "sample_chunks_nucleus",
                                        "sample_biased")  # the full row
        for i, op in enumerate(launched):
            if op == "all_reduce_sum":  # right after the o_proj / down product
                assert launched[i - 1] in ("linear", "swiglu_linear"), (graph.name, i)


def _expected(tensors, sources, rows):
    parts = []
    for s in sources:
        t = tensors[s.tensor]
        index = [slice(None)] * t.ndim
        index[s.axis] = slice(s.start, s.stop)
        parts.append(t[tuple(index)])
    out = np.concatenate(parts, axis=0)
    return np.concatenate([out, np.zeros((rows - len(out), *out.shape[1:]), out.dtype)])


def test_each_ranks_stored_weights_are_its_catalogued_checkpoint_slices(core, tensors):
    manifest = core.manifest
    buffers = {b.name: b for b in manifest.buffers}
    catalogs = list(manifest.weight_catalogs)
    assert [(c.version, c.rank) for c in catalogs] == [(1, 0), (1, 1)]
    for catalog in catalogs:
        stored = {w.buffer: w for w in catalog.weights}
        assert set(stored) == {n for n, b in buffers.items()
                               if b.role == mpb.BUFFER_ROLE_WEIGHT}
        for name, w in stored.items():
            if name == "rope_inv_freq":  # computed from the geometry, not a checkpoint view
                assert list(w.sources) == []
                continue
            shape = [int(d) for d in buffers[name].shape]
            data = np.frombuffer(core.read_resource(w.resource_id), np.float32).reshape(shape)
            np.testing.assert_array_equal(data, _expected(tensors, w.sources, shape[0]),
                                          err_msg=f"rank {catalog.rank} {name}")
    q = next(w for w in catalogs[1].weights if w.buffer == "L1.wqkv")
    assert [(s.tensor, s.axis, s.start, s.stop) for s in q.sources] == [
        ("model.layers.1.self_attn.q_proj.weight", 0, 16, 32),
        ("model.layers.1.self_attn.k_proj.weight", 0, 8, 16),
        ("model.layers.1.self_attn.v_proj.weight", 0, 8, 16)]
    down = next(w for w in catalogs[0].weights if w.buffer == "L0.w_down")
    assert [(s.axis, s.start, s.stop) for s in down.sources] == [(1, 0, 32)]
    head = next(w for w in catalogs[1].weights if w.buffer == "lm_head")
    assert [(s.tensor, s.start, s.stop) for s in head.sources] == [
        ("model.embed_tokens.weight", 142, 283)]  # tied: cut from the embedding


def test_heads_that_do_not_divide_are_refused_naming_the_counts(tmp_path, tiny_served):
    out = tmp_path / "tp3.core"
    result = run_export(LLAMA_RECIPE, "--checkpoint", tiny_served.checkpoint, "--key",
                        tiny_served.core.private_key, "--namespace", NAMESPACE, "--out", out,
                        "--weight-dtype", "f32", "--tensor-parallel", "3")
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "ignition: error: --tensor-parallel 3: the model's 4 query heads and 2 key/value heads must "
        "both divide by 3"]
    assert not out.exists()


def test_tensor_parallel_zero_is_a_usage_error(tmp_path, tiny_served):
    result = run_export(LLAMA_RECIPE, "--checkpoint", tiny_served.checkpoint, "--key",
                        tiny_served.core.private_key, "--namespace", NAMESPACE, "--out",
                        tmp_path / "x.core", "--tensor-parallel", "0")
    assert result.exit_code == 2
    assert "--tensor-parallel" in result.stderr and "0 is not in the range x>=1" in result.stderr


@pytest.mark.parametrize(("change", "message"), [
    (dict(kv_heads=3, heads=6), "the model's 6 query heads and 3 key/value heads must both "
                                "divide by 2"),
    (dict(ffn=51), "the model's FFN width 51 does not divide by 2"),
])
def test_shard_refuses_what_does_not_divide(change, message):
    from dataclasses import replace

    with pytest.raises(TensorParallelError, match=message):
        replace(TINY_SHAPES, **change).shard(2)


def test_single_rank_capture_is_unchanged_by_tensor_parallel_support():
    one, _ = capture(TINY_SHAPES, TINY_CAPACITIES, "f32")
    also, _ = capture(TINY_SHAPES.shard(1), TINY_CAPACITIES, "f32")
    assert one.SerializeToString(deterministic=True) == also.SerializeToString(
        deterministic=True)
    assert one.rank_count == 0 and not one.weight_catalogs
    assert not any(b.rank_weight_resource_ids for b in one.buffers)
    assert not any(k.reference_op in ("all_reduce_sum", "all_gather_columns")
                   for k in one.kernels)
    assert isinstance(TINY_SHAPES, LlamaShapes) and TINY_SHAPES.ranks == 1


def _lint(core, *backends: str) -> tuple[int, list[dict]]:
    import json

    from click.testing import CliRunner
    from helios_tools.cli import main as tools_main

    args = ["lint-core", str(core.path), "--trust", str(core.public_key), "--accept",
            core.namespace, "--format", "json", *(a for b in backends for a in ("--backend", b))]
    result = CliRunner().invoke(tools_main, args)
    return result.exit_code, json.loads(result.output)["findings"]


def test_lint_passes_the_split_core_on_cpu_and_names_the_rank_count_on_cuda(tiny_tp2):
    assert _lint(tiny_tp2, "cpu") == (0, [])
    code, findings = _lint(tiny_tp2, "cuda")
    assert code == 1
    assert [(f["rule"], f["path"], f["value"]) for f in findings] == [
        ("runtime.rank_count", "manifest.rank_count", "2")]
    assert "not executed by the cuda backend: programs split between 2 tensor-parallel " \
           "ranks (it runs at most 1)" in findings[0]["detail"]


def test_the_cuda_backend_refuses_the_split_core_at_load(core):
    from helios_serve.runtime.errors import UnsupportedContract
    from helios_serve.testing.native import load_native

    with pytest.raises(UnsupportedContract, match="manifest.rank_count = 2") as info:
        load_native(core, "cuda")  # refused before any CUDA call: no GPU needed
    assert info.value.rule == "runtime.rank_count"
