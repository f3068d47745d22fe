"""Golden cores: files written by an earlier helios-tools must keep loading, byte for byte.

The cores, their signing public key and the expected digests live in tests/tools/golden/
beside the script that made them (make_golden_cores.py). A failure here means a change broke
cores already in the field: fix the reader, never regenerate the goldens to make it pass.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from helios_contract.prepared import PreparedContract
from helios_tools.core import (
    SignatureError,
    authorize,
    load_public_key,
    open_core,
    pae,
)
from helios_tools.core.sample import SAMPLE_BACKENDS
from helios_tools.lint import lint_core

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
RECORD = json.loads((GOLDEN / "golden_cores.json").read_text())
RESOURCE_KEY = bytes.fromhex((GOLDEN / "golden_resource.key").read_text().strip())


@pytest.fixture(scope="module")
def golden_key():
    return load_public_key(GOLDEN / "golden_signing.pub")


@pytest.mark.parametrize("name", sorted(RECORD))
def test_golden_core_reads_with_todays_reader(name, golden_key):
    expected = RECORD[name]
    path = GOLDEN / name
    assert hashlib.sha256(path.read_bytes()).hexdigest() == expected["file_sha256"]
    with open_core(path, [golden_key], resource_key=RESOURCE_KEY) as core:
        # The exact signed bytes, and the signature over their DSSE encoding.
        assert hashlib.sha256(core.payload).hexdigest() == expected["payload_sha256"]
        assert core.payload_type == expected["payload_type"]
        assert core.key_id == expected["key_id"]
        assert (core.format_version, core.protected_version) == (
            expected["format_version"], expected["protected_version"])
        assert core.namespace == expected["namespace"]
        authorize(core, expected["namespace"])
        assert {rid: hashlib.sha256(core.read_resource(rid)).hexdigest()
                for rid in core.resources} == expected["resources"]
        PreparedContract.from_contract(core.contract, core.manifest)
        assert lint_core(core, acceptance=expected["namespace"], backends=SAMPLE_BACKENDS) == []


def test_golden_signature_is_over_the_dsse_encoding(golden_key):
    with open_core(GOLDEN / "payload_v2.core", [golden_key]) as core:
        payload, payload_type = core.payload, core.payload_type
    data = (GOLDEN / "payload_v2.core").read_bytes()
    signature = data[data.index(payload) + len(payload):][:200]
    prefix = b"DSSEv1 %d %s %d " % (len(payload_type), payload_type.encode(), len(payload))
    assert pae(payload_type, payload) == prefix + payload
    # Exactly one 64-byte window after the payload verifies (the stored signature field).
    hits = [i for i in range(len(signature) - 63)
            if _verifies(golden_key, signature[i:i + 64], prefix + payload)]
    assert len(hits) == 1


def _verifies(key, signature: bytes, message: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        key.verify(signature, message)
    except InvalidSignature:
        return False
    return True


def test_golden_payload_does_not_verify_once_changed(golden_key, tmp_path):
    data = bytearray((GOLDEN / "payload_v2.core").read_bytes())
    at = data.index(b"tiny-llama")
    data[at] ^= 0x20
    (tmp_path / "x.core").write_bytes(data)
    with pytest.raises(SignatureError):
        open_core(tmp_path / "x.core", [golden_key])
