"""Contract rules of SCORED_PREFILL programs (prompt log probabilities), one generator
each, raised first at startup and listed by lint: the targets binding
(`_rules_contract._scored_targets`: rule scored.targets) and the per-token scores record
(`_rules_manifest.scores`: rule scored.record)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helios_contract import contract_findings
from helios_contract.errors import BindingError, MissingFieldError, ViewBoundsError
from helios_contract.prepared import PreparedContract
from helios_contract.schema import contract_pb2 as cpb
from helios_ignition.testing import TINY_CAPACITIES, tiny_core


@pytest.fixture
def core():
    return tiny_core(0, caps=replace(TINY_CAPACITIES, scored_tokens=(8,)))


def _graph(core, name):
    index, graph = next((i, g) for i, g in enumerate(core.contract.model.graphs)
                        if g.name == name)
    return f"model.graphs[{index}]", graph


def _program(core, name):
    index, program = next((i, p) for i, p in enumerate(core.manifest.graphs) if p.name == name)
    return f"manifest.graphs[{index}]", program


def _only(core, error):
    found = list(contract_findings(core.contract, core.manifest))
    assert len(found) == 1, found
    with pytest.raises(error):
        PreparedContract.from_contract(core.contract, core.manifest)
    return found[0]


def _targets(graph):
    return next(i for i, b in enumerate(graph.bindings)
                if b.source == cpb.VALUE_SOURCE_SCORED_TARGET_TOKENS)


def test_a_core_with_scored_programs_is_clean(core):
    assert list(contract_findings(core.contract, core.manifest)) == []
    prepared = PreparedContract.from_contract(core.contract, core.manifest)
    assert [g.name for g in prepared.graphs_for(cpb.OPERATION_SCORED_PREFILL)] == ["scored_t8"]


def test_a_scored_graph_binds_its_targets(core):
    path, graph = _graph(core, "scored_t8")
    del graph.bindings[_targets(graph)]
    found = _only(core, BindingError)
    assert (found.rule, found.path) == ("scored.targets", f"{path}.bindings")


@pytest.mark.parametrize(("field", "value"), [
    ("indexing", cpb.INDEXING_SUBMISSION_ROW), ("padding", 0), ("offset", 1)])
def test_targets_are_per_packed_token_padded_with_minus_one(core, field, value):
    path, graph = _graph(core, "scored_t8")
    i = _targets(graph)
    setattr(graph.bindings[i], field, value)
    found = _only(core, BindingError)
    assert found.rule == "scored.targets"
    assert found.path == f"{path}.bindings[{i}].{'padding' if field == 'offset' else field}"


def test_only_scored_graphs_bind_targets(core):
    _, scored = _graph(core, "scored_t8")
    path, prefill = _graph(core, "prefill_t8")
    prefill.bindings.append(scored.bindings[_targets(scored)])
    found = [f for f in contract_findings(core.contract, core.manifest)
             if f.rule == "scored.targets"]
    assert [f.path for f in found] == [f"{path}.bindings[{len(prefill.bindings) - 1}].source"]


def test_a_scored_program_names_its_scores_record(core):
    path, program = _program(core, "scored_t8")
    program.completion.ClearField("score_ids_buffer")
    found = _only(core, MissingFieldError)
    assert (found.rule, found.path) == ("scored.record", f"{path}.completion.score_ids_buffer")


def test_the_scores_record_holds_every_packed_token(core):
    path, program = _program(core, "scored_t8")
    program.completion.scores_buffer = "out.logprobs"  # f32 [rows 4, 21]: 4 < 8 tokens
    found = _only(core, ViewBoundsError)
    assert (found.rule, found.path) == ("scored.record", f"{path}.completion.scores_buffer")
    assert "F32 [>= 8 packed tokens, 21]" in found.detail


def test_only_scored_programs_record_scores(core):
    path, program = _program(core, "decode_b1")
    program.completion.scores_buffer = "out.scores"
    found = _only(core, BindingError)
    assert (found.rule, found.path) == ("scored.record", f"{path}.completion.scores_buffer")
