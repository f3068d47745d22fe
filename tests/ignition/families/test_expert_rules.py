"""The manifest's expert geometry and its rules (helios_contract/_rules_experts.py), on a
captured Qwen3-MoE core: startup (`PreparedContract.from_contract`) raises the first
finding, lint lists them all, and each rule can fail."""

from __future__ import annotations

import pytest
from helios_contract import ExpertGeometryError, PreparedContract, contract_findings
from helios_ignition.testing import tiny_core

from tests.ignition.families.test_qwen3_capture import MOE


@pytest.fixture
def core():
    return tiny_core(seed=1, shapes=MOE)


def _first_route(manifest) -> tuple[int, int]:
    """(graph index, launch index) of the first moe_route launch."""
    ops = {k.id: k.reference_op for k in manifest.kernels}
    for i, g in enumerate(manifest.graphs):
        for j, launch in enumerate(g.launches):
            if ops[launch.kernel] == "moe_route":
                return i, j
    raise AssertionError("no moe_route launch")


def _startup(core) -> ExpertGeometryError:
    with pytest.raises(ExpertGeometryError) as info:
        PreparedContract.from_contract(core.contract, core.manifest)
    return info.value


def test_the_capture_declares_the_geometry(core):
    g = core.manifest.expert_geometry
    assert (g.experts, g.experts_per_token, g.hidden, g.expert_width, g.normalize_top_k,
            g.block_rows) == (8, 2, 32, 16, True, 16)
    assert list(contract_findings(core.contract, core.manifest)) == []
    dense = tiny_core(seed=1)
    assert not dense.manifest.HasField("expert_geometry")


def test_expert_launches_need_the_declaration(core):
    core.manifest.ClearField("expert_geometry")
    i, j = _first_route(core.manifest)
    error = _startup(core)
    assert (error.rule, error.path) == ("experts.undeclared",
                                        f"manifest.graphs[{i}].launches[{j}]")
    assert "an expert op needs the manifest's expert_geometry" in str(error)


def test_a_launch_must_run_the_declared_geometry(core):
    core.manifest.expert_geometry.experts_per_token = 3
    i, j = _first_route(core.manifest)
    error = _startup(core)
    assert (error.rule, error.path) == ("experts.launch",
                                        f"manifest.graphs[{i}].launches[{j}].args[5]")
    assert "moe_route's K must be the declared 3" in str(error)


def test_stacked_weights_must_have_the_declared_shape(core):
    core.manifest.expert_geometry.expert_width = 17
    rules = {(f.rule, f.detail) for f in contract_findings(core.contract, core.manifest)}
    assert ("experts.weights", "w_gate_up must be the declared stack [8, 34, 32]") in rules
    assert ("experts.weights", "w_down must be the declared stack [8, 32, 17]") in rules
    assert any(r == "experts.launch" for r, _ in rules)  # F of every gate/up and down
    assert _startup(core).rule == "experts.weights"  # the first: moe_gate_up's w_gate_up


@pytest.mark.parametrize(("field", "value", "detail"), [
    ("experts_per_token", 0, "top-k must lie in 1..8 (the experts)"),
    ("experts_per_token", 9, "top-k must lie in 1..8 (the experts)"),
    ("block_rows", 0, "must be positive")])
def test_the_declaration_is_consistent(core, field, value, detail):
    setattr(core.manifest.expert_geometry, field, value)
    error = _startup(core)
    assert (error.rule, error.path) == ("experts.geometry",
                                        f"manifest.expert_geometry.{field}")
    assert detail in str(error)
