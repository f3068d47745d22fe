"""lint_core / lint_manifest: each structural fault yields a finding naming rule, path, value."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from helios_contract.schema import contract_pb2 as pb
from helios_contract.schema import core_pb2
from helios_contract.schema import manifest_pb2 as mpb
from helios_tools.core import CHUNK_NBYTES, open_core
from helios_tools.core.sample import (
    SAMPLE_BACKENDS,
    SAMPLE_NAMESPACE,
    sample_contract,
    sample_manifest,
    sample_resources,
)
from helios_tools.lint import Finding, lint_contract, lint_core, resource_findings


def _resources() -> list[core_pb2.ExecutableResource]:
    return [core_pb2.ExecutableResource(resource_id=rid, kind=kind, decoded_nbytes=len(data),
                                        stored_nbytes=len(data), chunk_nbytes=CHUNK_NBYTES)
            for rid, kind, data in sample_resources()]


def lint_manifest(contract, manifest, resources) -> list[Finding]:
    """What lint-core finds in a core's contract, manifest and resource list."""
    return lint_contract(contract, manifest) + list(resource_findings(contract, manifest,
                                                                      resources))


def test_sample_is_clean():
    assert lint_manifest(sample_contract(), sample_manifest(), _resources()) == []


def _graph(m: mpb.ExecutionManifest, name: str) -> mpb.GraphProgram:
    return next(g for g in m.graphs if g.name == name)


def _buffer(m: mpb.ExecutionManifest, name: str) -> mpb.Buffer:
    return next(b for b in m.buffers if b.name == name)


CASES: dict[str, tuple[Callable[[pb.ServingContract, mpb.ExecutionManifest, list], None],
                       tuple[str, str, str]]] = {
    "graph variant missing": (
        lambda c, m, r: setattr(_graph(m, "decode_b4"), "name", "decode_b8"),
        ("graph.missing", "model.graphs[1].name", "decode_b4")),
    "operation disagrees": (
        lambda c, m, r: setattr(_graph(m, "decode_b4"), "operation", pb.OPERATION_MIXED),
        ("graph.operation", "model.graphs[1].operation", "OPERATION_DECODE")),
    "capacity disagrees": (
        lambda c, m, r: setattr(_graph(m, "decode_b4"), "batch_capacity", 8),
        ("graph.capacity", "model.graphs[1].batch_capacity", "4")),
    "launch names a missing buffer": (
        lambda c, m, r: setattr(_graph(m, "decode_b4").launches[0].args[1].buffer, "buffer",
                                "embd"),
        ("manifest.buffer_missing", "manifest.graphs[1].launches[0].args[1].buffer.buffer",
         "embd")),
    "launch names a missing kernel": (
        lambda c, m, r: setattr(_graph(m, "decode_b4").launches[1], "kernel", "lm_head"),
        ("kernel.missing", "manifest.graphs[1].launches[1].kernel", "lm_head")),
    "launch argument kind": (
        lambda c, m, r: _graph(m, "decode_b4").launches[0].args[3].ClearField("int_value")
        or setattr(_graph(m, "decode_b4").launches[0].args[3], "float_value", 1.0),
        ("launch.args", "manifest.graphs[1].launches[0].args[3]", "float_value")),
    "kernel binary for a declared target": (
        lambda c, m, r: m.targets.append("sm_100"),
        ("kernel.target", "manifest.kernels[0].binaries", "embedding@sm_100")),
    "kernel binary resource missing": (
        lambda c, m, r: setattr(m.kernels[1].binaries[0], "resource_id", "kernels/x"),
        ("resource.missing", "manifest.kernels[1].binaries[0].resource_id", "kernels/x")),
    "weight resource of the wrong size": (
        lambda c, m, r: _buffer(m, "norm").shape.__setitem__(0, 17),
        ("weight.nbytes", "manifest.buffers[1].weight_resource_id", "weights/norm")),
    "weight resource of the wrong kind": (
        lambda c, m, r: setattr(_buffer(m, "norm"), "weight_resource_id",
                                "tokenizer/tokenizer.json"),
        ("resource.kind", "manifest.buffers[1].weight_resource_id", "tokenizer/tokenizer.json")),
    "state view outside its buffer": (
        lambda c, m, r: setattr(c.model.graphs[1].state_accesses[0].view, "byte_offset", 4),
        ("view.bounds", "model.graphs[1].state_accesses[0].view", "bytes up to 20")),
    "page-table view before the first page": (
        lambda c, m, r: setattr(c.model.cache.page_table_views[0], "page_offset", -1),
        ("cache.view_offset", "model.cache.page_table_views[0].page_offset", "-1")),
    "binding without a transport": (
        lambda c, m, r: _graph(m, "decode_b4").transports.pop(),
        ("binding.destination", "model.graphs[1].bindings[3].destination", "page_table")),
    "transport larger than its buffer": (
        lambda c, m, r: setattr(_graph(m, "decode_b4").transports[0], "nbytes", 1000),
        ("view.bounds", "manifest.graphs[1].transports[0].nbytes", "1000")),
    "tuned binding without producer": (
        lambda c, m, r: c.model.graphs[1].tuned_bindings.append(
            pb.TunedBinding(buffer="lengths", producer_graph="tune")),
        ("tuned.producer", "model.graphs[1].tuned_bindings[0].producer_graph", "tune")),
    "graph resource dependency missing": (
        lambda c, m, r: c.model.graphs[0].resource_dependencies.append("weights/lm_head"),
        ("resource.missing", "model.graphs[0].resource_dependencies[4]", "weights/lm_head")),
    "selected concurrency above decode capacity": (
        lambda c, m, r: setattr(c, "selected_concurrency", 8),
        ("capacity.concurrency", "selected_concurrency", "8")),
    "speculative width never captured": (
        lambda c, m, r: c.speculative_widths.append(4),
        ("capacity.speculative_width", "speculative_widths[0]", "4")),
    "paged plane page count": (
        lambda c, m, r: setattr(c, "prepared_pages", 32),
        ("capacity.pages", "model.cache.regions[0].planes[0]", "[64, 16, 16]")),
    "duplicate buffer": (
        lambda c, m, r: m.buffers.append(mpb.Buffer(name="hidden", dtype=mpb.D_TYPE_F32,
                                                    shape=[1], role=mpb.BUFFER_ROLE_SCRATCH)),
        ("manifest.duplicate", "manifest.buffers[14].name", "hidden")),
    "no chat template": (
        lambda c, m, r: r.pop(),
        ("resource.frontend_assets", "resources", "RESOURCE_KIND_CHAT_TEMPLATE")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_fault_is_a_finding(case):
    mutate, (rule, path, value) = CASES[case]
    contract, manifest, resources = sample_contract(), sample_manifest(), _resources()
    mutate(contract, manifest, resources)
    findings = lint_manifest(contract, manifest, resources)
    assert any((f.rule, f.path, f.value) == (rule, path, value) for f in findings), findings
    assert all(isinstance(f, Finding) and f.detail for f in findings)


def test_contract_validation_is_wired_in():
    contract = sample_contract()
    contract.model.vocabulary.sampled_tokens = 0
    finding = lint_contract(contract, sample_manifest())[0]
    assert (finding.rule, finding.path, finding.value) == (
        "vocabulary.sampled_tokens", "model.vocabulary.sampled_tokens", "0")


def test_lint_core_reports_integrity_and_authorization(sample_core, signing_key, tmp_path):
    data = bytearray(sample_core.read_bytes())
    data[-10] ^= 0xFF
    target = tmp_path / "t.core"
    target.write_bytes(data)
    with open_core(target, [signing_key.public_key()]) as core:
        seen = []
        findings = lint_core(core, acceptance="someone.else", progress=seen.append,
                             backends=SAMPLE_BACKENDS)
    rules = [(f.rule, f.path) for f in findings]
    assert ("core.authorize", "publisher_namespace") in rules
    assert ("resource.integrity", "resources['chat_template/template.jinja']") in rules
    assert len(seen) == len(sample_resources())
    with open_core(sample_core, [signing_key.public_key()]) as core:
        assert lint_core(core, acceptance=SAMPLE_NAMESPACE, backends=SAMPLE_BACKENDS) == []


def test_required_targets(sample_core, signing_key):
    with open_core(sample_core, [signing_key.public_key()]) as core:
        declared = list(core.manifest.targets)
        assert lint_core(core, require_targets=declared, backends=SAMPLE_BACKENDS) == []
        findings = lint_core(core, require_targets=["sm_120"], backends=SAMPLE_BACKENDS)
    assert [(f.rule, f.path, f.value) for f in findings] == [
        ("kernel.target", "manifest.targets", "sm_120")]
    assert f"the core declares {sorted(declared)}" in findings[0].detail


def test_cpu_only_core_without_targets_is_clean():
    manifest = sample_manifest()
    for kernel in manifest.kernels:
        del kernel.binaries[:]
    del manifest.targets[:]
    resources = [r for r in _resources() if r.kind != core_pb2.RESOURCE_KIND_KERNEL_BINARY]
    assert [f for f in lint_manifest(sample_contract(), manifest, resources)
            if f.rule == "kernel.target"] == []
