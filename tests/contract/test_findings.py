"""One rule, one generator: startup raises the first finding, lint lists them all.

Every failing case of test_prepared.py and test_frontend_rules.py is replayed through
``contract_findings``: its first finding is exactly the error ``from_contract`` raises
(class, path, value, rule), so the two consumers cannot disagree.
"""

from __future__ import annotations

import pytest
from helios_contract import (
    DTYPE_BYTES,
    ContractError,
    Finding,
    PreparedContract,
    contract_findings,
    raise_first,
)
from helios_contract.schema import manifest_pb2 as mpb

from tests.contract import test_frontend_rules, test_prepared
from tests.contract.example import example_contract, example_manifest

CASES = [(f"prepared-{name}", mutate, cls, path)
         for name, mutate, cls, path in test_prepared.FAILING]
CASES += [(f"frontend-{name}", (lambda m: lambda s, _: m(s))(mutate), cls, path)
          for name, mutate, cls, path in test_frontend_rules.FAILING]


@pytest.mark.parametrize(("mutate", "cls", "path"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_startup_raises_the_first_finding(mutate, cls, path):
    serving, manifest = example_contract(), example_manifest()
    mutate(serving, manifest)
    findings = list(contract_findings(serving, manifest))
    with pytest.raises(ContractError) as info:
        PreparedContract.from_contract(serving, manifest)
    first = findings[0]
    assert (type(info.value), info.value.path, info.value.rule) == (cls, path, first.rule)
    assert (first.error, first.path) == (cls, path)
    assert str(info.value) == str(first.to_error())
    assert first.rule and first.detail


def test_a_valid_contract_has_no_findings():
    assert list(contract_findings(example_contract(), example_manifest())) == []


def test_lint_lists_every_fault_not_only_the_first():
    serving, manifest = example_contract(), example_manifest()
    serving.model.vocabulary.mask_words = 11
    serving.selected_concurrency = 9
    serving.model.graphs[1].name = "decode_b8"
    next(b for b in manifest.buffers if b.name == "kv.v").role = mpb.BUFFER_ROLE_SCRATCH
    rules = [(f.rule, f.path) for f in contract_findings(serving, manifest)]
    assert rules == [
        ("vocabulary.mask_words", "model.vocabulary.mask_words"),
        ("capacity.concurrency", "selected_concurrency"),
        ("view.role", "model.graphs[0].state_accesses[2].view.buffer"),  # kv.v of prefill
        ("graph.missing", "model.graphs[1].name"),
        ("view.role", "model.graphs[1].state_accesses[3].view.buffer"),  # kv.v of decode
        ("cache.plane", "model.cache.regions[0].planes[1]"),
    ]


def test_an_unsupported_version_is_judged_alone():
    serving = example_contract()
    serving.model.version = 7
    serving.served_id = ""
    assert [f.rule for f in contract_findings(serving)] == ["contract.version"]


def test_finding_text_and_error():
    finding = Finding.of("cache.page_tokens", ContractError, "model.cache.page_tokens", 0,
                         "must be positive")
    assert (finding.value, str(finding)) == (
        "0", "cache.page_tokens: model.cache.page_tokens = 0: must be positive")
    assert finding.to_dict() == {"rule": "cache.page_tokens", "path": "model.cache.page_tokens",
                                 "value": "0", "detail": "must be positive"}
    error = finding.to_error()
    assert (error.value, error.rule) == (0, "cache.page_tokens")
    with pytest.raises(ContractError, match="must be positive"):
        raise_first(iter([finding]))
    raise_first(iter([]))


def test_one_dtype_table_covers_every_dtype():
    assert set(DTYPE_BYTES) == set(mpb.DType.values()) - {mpb.D_TYPE_UNSPECIFIED}
