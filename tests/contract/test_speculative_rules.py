"""Contract rules of speculative programs: one generator each, raised first at startup
and listed by lint (helios_contract.contract_findings)."""

from __future__ import annotations

import pytest
from helios_contract import contract_findings
from helios_contract.errors import ContractError
from helios_contract.prepared import PreparedContract
from helios_contract.schema import contract_pb2 as cpb
from helios_ignition.testing import tiny_core


def _rules(core) -> list[str]:
    return [f.rule for f in contract_findings(core.contract, core.manifest)]


def test_a_speculative_core_is_clean():
    core = tiny_core(0, speculative_widths=(1, 2, 4))
    assert _rules(core) == []
    PreparedContract.from_contract(core.contract, core.manifest)


def test_speculative_widths_without_their_programs_fail_startup_and_lint():
    core = tiny_core(0, speculative_widths=(1, 2, 4))
    graphs = [g for g in core.contract.model.graphs if g.operation != cpb.OPERATION_SPECULATIVE]
    del core.contract.model.graphs[:]
    core.contract.model.graphs.extend(graphs)
    found = [f for f in contract_findings(core.contract, core.manifest)]
    assert [f.path for f in found] == [f"speculative_widths[{i}]" for i in range(3)]
    with pytest.raises(ContractError, match=r"speculative_widths\[0\]"):
        PreparedContract.from_contract(core.contract, core.manifest)


def test_this_runtime_needs_width_one_programs_to_serve_speculation():
    # Not a contract rule (the specification allows cores without W = 1): the runtime
    # refuses to serve such a core with speculation on, and serves it with it off.
    from helios_serve.runtime import UnsupportedContract
    from helios_serve.testing.native import load_native

    core = tiny_core(0, speculative_widths=(2, 4))
    assert _rules(core) == []
    with pytest.raises(UnsupportedContract, match="a width-one SPECULATIVE program") as info:
        load_native(core, "cpu")
    assert info.value.rule == "runtime.speculative_width_one"
    assert load_native(core, "cpu", speculative_width=0).manifests.speculative_widths == ()


def test_a_speculative_program_reports_lane_records_of_its_width():
    core = tiny_core(0, speculative_widths=(1, 2, 4))
    program = next(g for g in core.manifest.graphs if g.name == "spec_b2_w4")
    program.completion.speculative.token_width = 2
    assert _rules(core) == ["speculative.record"]
    program.completion.ClearField("speculative")
    found = list(contract_findings(core.contract, core.manifest))
    assert [f.rule for f in found] == ["speculative.record"]
    assert found[0].path.endswith(".completion.speculative")
    decode = next(g for g in core.manifest.graphs if g.name == "decode_b1")
    decode.completion.speculative.token_width = 1
    assert "speculative.record" in _rules(core)


def test_history_drafting_needs_copied_token_inputs_in_every_selected_wider_graph():
    from helios_serve.bootstrap import StartupError
    from helios_serve.config import ServeOptions
    from helios_serve.loading import check_options

    core = tiny_core(0, speculative_widths=(1, 2, 4))
    prepared = PreparedContract.from_contract(core.contract, core.manifest)
    assert list(prepared.history_drafting_findings()) == []
    graph = next(g for g in core.contract.model.graphs if g.name == "spec_b2_w4")
    # (its masks go too: they follow the candidates, rule speculative.candidate_masks)
    kept = [b for b in graph.bindings if b.source not in (
        cpb.VALUE_SOURCE_CANDIDATE_IDS, cpb.VALUE_SOURCE_CANDIDATE_GRAMMAR_MASKS)]
    del graph.bindings[:]
    graph.bindings.extend(kept)
    prepared = PreparedContract.from_contract(core.contract, core.manifest)
    (found,) = prepared.history_drafting_findings()
    assert (found.rule, found.value) == ("speculative.history_inputs",
                                         "['VALUE_SOURCE_CANDIDATE_IDS']")
    assert "'spec_b2_w4' (W = 4)" in found.detail
    assert list(prepared.history_drafting_findings(widths=(1, 2))) == []  # W = 4 not served
    # helios-serve --history-drafting: the same rule, one line, before anything loads.
    with pytest.raises(StartupError) as info:
        check_options(prepared, ServeOptions(history_drafting=True))
    index = list(core.contract.model.graphs).index(graph)
    assert str(info.value) == (
        f"--history-drafting: model.graphs[{index}].bindings = "
        "['VALUE_SOURCE_CANDIDATE_IDS']: history drafting needs copied-token inputs in "
        "'spec_b2_w4' (W = 4)")
    assert info.value.rule == "speculative.history_inputs"
    check_options(prepared, ServeOptions(history_drafting=True, speculative_width=2))
    with pytest.raises(StartupError) as info:
        check_options(prepared, ServeOptions(history_drafting=True, speculative_width=1))
    assert str(info.value) == ("--history-drafting needs learned speculation: "
                               "--speculative-width 1 serves no lane wider than one")
    assert info.value.rule == "speculative.history_inputs"
    with pytest.raises(StartupError) as info:
        check_options(prepared, ServeOptions(history_drafting=True, speculative_width=0))
    assert str(info.value) == ("--history-drafting needs learned speculation: "
                               "--speculative-width 0 serves no lane wider than one")


def _without(graph, *sources):
    kept = [b for b in graph.bindings if b.source not in sources]
    del graph.bindings[:]
    graph.bindings.extend(kept)


def test_candidate_grammar_masks_need_the_candidates_and_the_lane_mask():
    core = tiny_core(0, speculative_widths=(1, 2, 4))
    graph = next(g for g in core.contract.model.graphs if g.name == "spec_b2_w4")
    index = list(core.contract.model.graphs).index(graph)
    _without(graph, cpb.VALUE_SOURCE_CANDIDATE_IDS, cpb.VALUE_SOURCE_GRAMMAR_MASK)
    found = [f for f in contract_findings(core.contract, core.manifest)
             if f.rule == "speculative.candidate_masks"]
    assert [(f.path, f.value) for f in found] == [
        (f"model.graphs[{index}].bindings",
         "['VALUE_SOURCE_CANDIDATE_IDS', 'VALUE_SOURCE_GRAMMAR_MASK']")]
    with pytest.raises(ContractError, match="per-position candidate grammar masks") as info:
        PreparedContract.from_contract(core.contract, core.manifest)
    assert info.value.rule == "speculative.candidate_masks"


def test_constrained_lanes_widen_only_where_every_wider_program_binds_candidate_masks():
    """One rule (PreparedContract.constrained_speculation), read by NativeModel.load into
    ModelGeometry.candidate_masks: without masks in a selected wider program, constrained
    lanes stay at width one."""
    from helios_serve.testing.native import load_native

    core = tiny_core(0, speculative_widths=(1, 2, 4))
    prepared = PreparedContract.from_contract(core.contract, core.manifest)
    assert prepared.constrained_speculation() and prepared.constrained_speculation((1, 2))
    assert not prepared.constrained_speculation((1,))  # no wider program: nothing to verify
    assert load_native(core, "cpu").manifests.candidate_masks
    graph = next(g for g in core.contract.model.graphs if g.name == "spec_b2_w4")
    _without(graph, cpb.VALUE_SOURCE_CANDIDATE_GRAMMAR_MASKS)
    assert _rules(core) == []  # a core without masks is valid ...
    prepared = PreparedContract.from_contract(core.contract, core.manifest)
    assert not prepared.constrained_speculation()  # ... its constrained lanes stay narrow
    assert prepared.constrained_speculation((1, 2))  # unless W = 4 is not served
    assert not load_native(core, "cpu").manifests.candidate_masks
    assert load_native(core, "cpu", speculative_width=2).manifests.candidate_masks
