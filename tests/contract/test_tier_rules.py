"""Rules of continuation storage, host-tier planes and RESTORE programs: one passing case
and one failing case per rule, each asserting the exact error class, path and rule id.

The contract is the tiny Llama core's (helios_ignition.testing.tiny_core) with snapshots,
a host tier and the five RESTORE programs (one per route, 4 rows each); its cache regions
are [0] kv (paged), [1] continuation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from helios_contract import (
    BindingError,
    BufferRoleError,
    DuplicateIdentifierError,
    ExtentError,
    MissingFieldError,
    UnknownIdentifierError,
    UnsupportedVersionError,
    contract_findings,
)
from helios_contract.schema import contract_pb2 as c
from helios_contract.schema import manifest_pb2 as mpb
from helios_contract.tiers import storage_tiers, transfer_route
from helios_ignition.testing import TINY_CAPACITIES, tiny_core

from tests.contract.checks import accepts, rejects

CAPS = replace(TINY_CAPACITIES, prepared_snapshots=4, host_tier=True, transfer_rows=4)


@pytest.fixture
def core():
    return tiny_core(caps=CAPS)


def _restore(serving, route: tuple[str, str]) -> c.GraphContract:
    tiers = storage_tiers(serving.model.cache)
    return next(g for g in serving.model.graphs
                if g.operation == c.OPERATION_RESTORE and transfer_route(g, tiers) == route)


def _index(serving, graph) -> int:
    return list(serving.model.graphs).index(graph)


def test_the_tiny_core_with_every_route_validates(core):
    prepared = accepts(core.contract, core.manifest)
    tiers = storage_tiers(prepared.serving.model.cache)
    routes = {transfer_route(g, tiers) for g in prepared.serving.model.graphs
              if g.operation == c.OPERATION_RESTORE}
    assert routes == {("pages", "continuation"), ("continuation", "pages"), ("pages", "host"),
                      ("host", "pages"), ("continuation", "host")}
    assert len(tiers.pages) == len(tiers.continuation) == len(tiers.host) == 4


def test_a_speculative_core_pairs_the_draft_planes_too():
    core = tiny_core(caps=CAPS, speculative_widths=(1, 3))
    accepts(core.contract, core.manifest)
    tiers = storage_tiers(core.contract.model.cache)
    assert tiers.pages[-3:] == ("D.k_cache", "D.v_cache", "D.f_cache")
    assert tiers.continuation[-1] == "D.f_cache.continuation"


Mutation = Callable[[c.ServingContract, mpb.ExecutionManifest], None]


def _drop_continuation_plane(s, m):
    del s.model.cache.regions[1].planes[-1]


def _second_continuation(s, m):
    s.model.cache.regions.add().CopyFrom(s.model.cache.regions[1])
    s.model.cache.regions[2].name = "continuation2"
    for i, plane in enumerate(s.model.cache.regions[2].planes):
        s.model.cache.regions[2].planes[i] = plane + "2"


def _no_prepared_snapshots(s, m):
    s.prepared_snapshots = 0


def _host_planes_on_continuation(s, m):
    s.model.cache.regions[1].host_planes.append("L0.k_cache.host")


def _short_host_planes(s, m):
    del s.model.cache.regions[0].host_planes[-1]


def _host_plane_is_a_page_plane(s, m):
    s.model.cache.regions[0].host_planes[0] = "L0.v_cache.continuation"


def _restore_without_destination(s, m):
    g = _restore(s, ("continuation", "pages"))
    del g.bindings[1]


def _restore_reads_two_tiers(s, m):
    g = _restore(s, ("continuation", "pages"))
    g.state_accesses.add().CopyFrom(g.state_accesses[0])
    g.state_accesses[-1].view.buffer = "L0.k_cache.host"


def _restore_read_write(s, m):
    g = _restore(s, ("pages", "host"))
    g.state_accesses[0].access = c.ACCESS_READ_WRITE


def _duplicate_route(s, m):
    g = s.model.graphs.add()
    g.CopyFrom(_restore(s, ("pages", "host")))
    g.name = "transfer_again"
    p = m.graphs.add()
    p.CopyFrom(next(x for x in m.graphs if x.name == "transfer_pages_host_r4"))
    p.name = "transfer_again"


def _restore_no_rows(s, m):
    _restore(s, ("host", "pages")).batch_capacity = 0


def _drop_route(route):
    def mutate(s, m):
        s.model.graphs.remove(_restore(s, route))
    mutate.__name__ = f"_drop_{route[0]}_{route[1]}"
    return mutate


def _host_version_two(s, m):
    s.model.version = 2
    s.model.vocabulary.mask_words = 0  # implicit in version 2


def _tier_index(s, route):
    return _index(s, _restore(s, route))


CONTRACT_CASES = [
    ("cache.continuation_planes", ExtentError, _drop_continuation_plane,
     lambda s: "model.cache.regions[1].planes"),
    ("cache.continuation_duplicate", DuplicateIdentifierError, _second_continuation,
     lambda s: "model.cache.regions[2].kind"),
    ("capacity.prepared_snapshots", ExtentError, _no_prepared_snapshots,
     lambda s: "prepared_snapshots"),
    ("cache.host_planes_region", ExtentError, _host_planes_on_continuation,
     lambda s: "model.cache.regions[1].host_planes"),
    ("cache.host_planes", ExtentError, _short_host_planes,
     lambda s: "model.cache.regions[0].host_planes"),
    ("cache.host_plane_duplicate", DuplicateIdentifierError, _host_plane_is_a_page_plane,
     lambda s: "host_planes[0]"),
    ("restore.bindings", BindingError, _restore_without_destination,
     lambda s: f"model.graphs[{_tier_index(s, ('continuation', 'pages'))}].bindings"),
    ("restore.route", UnknownIdentifierError, _restore_reads_two_tiers,
     lambda s: "model.graphs[{}].state_accesses"),
    ("restore.route", UnknownIdentifierError, _restore_read_write,
     lambda s: "model.graphs[{}].state_accesses"),
    ("restore.duplicate", DuplicateIdentifierError, _duplicate_route,
     lambda s: f"model.graphs[{len(s.model.graphs)}].name"),
    ("graph.capacity_zero", ExtentError, _restore_no_rows,
     lambda s: f"model.graphs[{_tier_index(s, ('host', 'pages'))}].batch_capacity"),
    ("restore.continuation_routes", MissingFieldError, _drop_route(("continuation", "pages")),
     lambda s: "model.cache.regions[1].planes"),
    ("restore.continuation_routes", MissingFieldError, _drop_route(("pages", "continuation")),
     lambda s: "model.cache.regions[1].planes"),
    ("restore.host_routes", MissingFieldError, _drop_route(("host", "pages")),
     lambda s: "model.cache.regions[0].host_planes"),
    ("restore.host_routes", MissingFieldError, _drop_route(("pages", "host")),
     lambda s: "model.cache.regions[0].host_planes"),
    ("contract.version_field", UnsupportedVersionError, _host_version_two,
     lambda s: "model.cache.regions[0].host_planes"),
]


@pytest.mark.parametrize("rule,error,mutate,path", CONTRACT_CASES,
                         ids=[f"{r}-{m.__name__}" for r, _, m, _ in CONTRACT_CASES])
def test_each_tier_rule_rejects_with_its_path(core, rule, error, mutate, path):
    s, m = core.contract, core.manifest
    route_index = {
        _restore_reads_two_tiers: ("continuation", "pages"),
        _restore_read_write: ("pages", "host"),
    }.get(mutate)
    want = path(s)
    if route_index is not None:
        want = want.format(_tier_index(s, route_index))
    mutate(s, m)
    found = rejects(error, want, s, m)
    assert found.rule == rule
    assert any(f.rule == rule and f.path == want for f in contract_findings(s, m))


def _buffer(m, name):
    return next(b for b in m.buffers if b.name == name)


def _reshape(buffer, shape):
    """Keep the bytes (state views stay inside), change the rows (the rule's concern)."""
    del buffer.shape[:]
    buffer.shape.extend(shape)


MANIFEST_CASES = [
    ("cache.tier_row_shape", ExtentError,
     lambda s, m: _reshape(_buffer(m, "L0.k_cache.continuation"), [4, 4, 1, 16]),
     "model.cache.regions[1].planes[0]"),
    ("cache.tier_row_shape", ExtentError,
     lambda s, m: setattr(_buffer(m, "L1.v_cache.host"), "dtype", mpb.D_TYPE_I32),
     "model.cache.regions[0].host_planes[3]"),
    ("capacity.snapshots", ExtentError,
     lambda s, m: _reshape(_buffer(m, "L1.k_cache.continuation"), [3, 4, 2, 8]),
     "model.cache.regions[1].planes[2]"),
    ("cache.plane", BufferRoleError,
     lambda s, m: setattr(_buffer(m, "L0.v_cache.host"), "role", mpb.BUFFER_ROLE_PERSISTENT_STATE),
     "model.cache.regions[0].host_planes[1]"),
]


@pytest.mark.parametrize("rule,error,mutate,path", MANIFEST_CASES,
                         ids=[f"{r}-{p}" for r, _, _, p in MANIFEST_CASES])
def test_each_tier_plane_rule_rejects_with_its_path(core, rule, error, mutate, path):
    s, m = core.contract, core.manifest
    mutate(s, m)
    found = rejects(error, path, s, m)
    assert found.rule == rule


def test_a_missing_host_plane_buffer_is_named(core):
    s, m = core.contract, core.manifest
    s.model.cache.regions[0].host_planes[2] = "L1.k_cache.elsewhere"
    findings = [f for f in contract_findings(s, m) if f.rule == "manifest.buffer_missing"]
    assert [f.path for f in findings] == ["model.cache.regions[0].host_planes[2]"]


def test_host_planes_on_only_some_paged_regions_are_rejected():
    core = tiny_core(caps=CAPS, speculative_widths=(1, 3))
    s = core.contract
    del s.model.cache.regions[1].host_planes[:]  # draft_kv keeps none
    found = rejects(MissingFieldError, "model.cache.regions", s, core.manifest)
    assert found.rule == "cache.host_planes"


def test_a_runtime_without_a_host_tier_rejects_host_planes(core):
    """Startup (NativeModel.load) and lint-core --backend read the same capability rule."""
    from helios_contract import PreparedContract, RuntimeCapabilities, capability_findings
    from helios_tools.capabilities import CPU, CUDA

    prepared = PreparedContract.from_contract(core.contract, core.manifest)
    for table in (CPU, CUDA):
        assert [f.rule for f in capability_findings(prepared.serving, prepared.manifest, table)
                if f.rule.startswith("runtime.")] == []
    no_host = replace(CPU, host_tier=False)
    assert isinstance(no_host, RuntimeCapabilities)
    (finding,) = capability_findings(prepared.serving, prepared.manifest, no_host)
    assert (finding.rule, finding.path, finding.value) == (
        "runtime.host_tier", "model.cache.regions[0].host_planes", "4")
    assert str(finding).endswith("not executed by the cpu backend: host-memory tier planes "
                                 "(it backs no host tier)")


@pytest.mark.parametrize(("field", "rule"), [
    ("operations", "runtime.operation"), ("history_kinds", "runtime.history_kind"),
    ("bindings", "runtime.binding")])
def test_a_runtime_without_restore_rejects_the_tiers(core, field, rule):
    from helios_contract import PreparedContract, capability_findings
    from helios_tools.capabilities import CPU

    drop = {"operations": {c.OPERATION_RESTORE},
            "history_kinds": {c.HISTORY_KIND_CONTINUATION},
            "bindings": {(c.VALUE_SOURCE_RESTORE_SOURCE, c.INDEXING_SUBMISSION_ROW)}}[field]
    table = replace(CPU, **{field: getattr(CPU, field) - drop})
    prepared = PreparedContract.from_contract(core.contract, core.manifest)
    rules = {f.rule for f in capability_findings(prepared.serving, prepared.manifest, table)}
    assert rules == {rule}
