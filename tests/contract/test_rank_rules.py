"""Rules of tensor-parallel manifests (helios_contract._rules_manifest.buffers): a weight
names one resource every rank reads, or exactly rank_count per-rank resources.

Each failing case is checked through both consumers: ``from_contract`` raises exactly the
first of ``contract_findings`` (class, path, rule).
"""

from __future__ import annotations

import pytest
from helios_contract import (
    BufferRoleError,
    ContractError,
    MissingFieldError,
    PreparedContract,
    RankLayoutError,
    contract_findings,
)

from tests.contract.example import example_contract, example_manifest


def _buffer(manifest, name):
    return next(b for b in manifest.buffers if b.name == name)


def _split(manifest, name, ranks, count=None):
    """Make weight `name` a split weight of a `ranks`-rank manifest."""
    manifest.rank_count = ranks
    b = _buffer(manifest, name)
    b.weight_resource_id = ""
    b.rank_weight_resource_ids.extend(f"weights/rank{r}/{name}" for r in range(count or ranks))
    return manifest.buffers[:].index(b)


def _index(manifest, name):
    return [b.name for b in manifest.buffers].index(name)


def _both(m):
    i = _split(m, "output_norm", 2)
    m.buffers[i].weight_resource_id = "weights"
    return i


FAILING = [
    ("rank-count-mismatch", lambda m: _split(m, "output_norm", 2, count=3),
     RankLayoutError, "rank_weight_resource_ids"),
    ("rank-resources-without-rank-count", lambda m: _split(m, "output_norm", 0, count=2),
     RankLayoutError, "rank_weight_resource_ids"),
    ("shared-and-per-rank", _both, RankLayoutError, "rank_weight_resource_ids"),
    ("non-weight-per-rank", lambda m: _buffer(m, "kv.k").rank_weight_resource_ids.append("x"),
     BufferRoleError, "rank_weight_resource_ids"),
    ("weight-without-any", lambda m: setattr(_buffer(m, "output_norm"), "weight_resource_id",
                                             ""),
     MissingFieldError, "weight_resource_id"),
]


@pytest.mark.parametrize(("mutate", "cls", "field"), [c[1:] for c in FAILING],
                         ids=[c[0] for c in FAILING])
def test_rank_layout_rejected_by_startup_and_lint_alike(mutate, cls, field):
    serving, manifest = example_contract(), example_manifest()
    mutate(manifest)
    findings = list(contract_findings(serving, manifest))
    with pytest.raises(ContractError) as info:
        PreparedContract.from_contract(serving, manifest)
    error = info.value
    assert type(error) is cls
    assert error.path.startswith("manifest.buffers[") and error.path.endswith(field)
    assert (findings[0].error, findings[0].path, findings[0].rule) == (cls, error.path,
                                                                      error.rule)


def test_rank_count_message_names_both_counts():
    serving, manifest = example_contract(), example_manifest()
    i = _split(manifest, "output_norm", 2, count=3)
    with pytest.raises(RankLayoutError, match=r"names 3 per-rank resources; the manifest "
                                              r"has rank_count 2") as info:
        PreparedContract.from_contract(serving, manifest)
    assert info.value.path == f"manifest.buffers[{i}].rank_weight_resource_ids"
    assert info.value.rule == "buffer.rank_weights"


def test_split_weights_of_a_two_rank_manifest_are_accepted():
    serving, manifest = example_contract(), example_manifest()
    _split(manifest, "output_norm", 2)
    PreparedContract.from_contract(serving, manifest)
    assert list(contract_findings(serving, manifest)) == []
