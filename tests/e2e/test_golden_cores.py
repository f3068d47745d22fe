"""Old cores serve forever: the committed golden cores of the tiny model (contract versions 1
and 2, and one written by a past `ignition export`) load, lint clean and serve the greedy ids
of the independent plain NumPy forward, committed beside them (golden/expected.json, made
by golden/make_golden_cores.py). A runtime change that breaks a previously exported core
fails here; never regenerate a core to make this pass."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from helios_tools.cli import main as tools_main
from helios_tools.core import load_public_key, open_core

from tests.tiny_model import NAMESPACE, ServeProcess

GOLDEN = Path(__file__).resolve().parent / "golden"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())
PUBLIC = GOLDEN / "golden_signing.pub"
CORES = sorted(EXPECTED["cores"])


@pytest.mark.parametrize("name", CORES)
def test_the_golden_core_is_the_committed_one(name):
    path = GOLDEN / name
    want = EXPECTED["cores"][name]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == want["file_sha256"]
    with open_core(path, [load_public_key(PUBLIC)]) as core:
        assert core.contract.model.version == want["contract_version"]


def test_every_contract_version_is_covered():
    versions = {c["contract_version"] for c in EXPECTED["cores"].values()}
    assert versions == {1, 2, 3}


@pytest.mark.parametrize("name", CORES)
def test_golden_core_lints_clean(name):
    result = CliRunner().invoke(tools_main, ["lint-core", str(GOLDEN / name), "--trust",
                                             str(PUBLIC), "--accept", NAMESPACE])
    assert result.exit_code == 0, result.output
    assert result.output.endswith(" 0 finding(s)\n")


@pytest.mark.parametrize("name", CORES)
def test_golden_core_serves_the_reference_greedy_ids(name):
    with ServeProcess(GOLDEN / name, "--trust", PUBLIC, "--accept", NAMESPACE) as served:
        got = {text: served.chat_ids(text, EXPECTED["steps"]) for text in EXPECTED["greedy_ids"]}
    assert got == EXPECTED["greedy_ids"]
