"""Generate the golden cores that tests/tools/core/test_golden.py reads with today's reader.

Usage (only when deliberately adding a new format version; never to "fix" a failing test):

    uv run python tests/tools/golden/make_golden_cores.py

Writes, beside this script:
    payload_v2.core     payload core (CoreBody.format_version 2) of the sample model
    logical_v6.core     logical-resource core, ProtectedIndex version 6 (zstd frames)
    logical_v4.core     logical-resource core, ProtectedIndex version 4 (AES-GCM chunks)
    golden_signing.pub  the Ed25519 public key that signed them (PEM)
    golden_resource.key the AES-256 test key of logical_v4.core (hex)
    golden_cores.json   per core: SHA-256 of the file and of the exact signed payload bytes,
                        payload type, key id, namespace, and SHA-256 of each decoded resource

The signing key is derived from a fixed seed, so it is a test key, never a publisher key.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helios_tools.core import open_core
from helios_tools.core.sample import SAMPLE_NAMESPACE, write_sample_core

HERE = Path(__file__).resolve().parent
SEED = hashlib.sha256(b"helios golden signing key (test only)").digest()
RESOURCE_KEY = hashlib.sha256(b"helios golden resource key (test only)").digest()
CORES = {"payload_v2.core": None, "logical_v6.core": 6, "logical_v4.core": 4}


def main() -> None:
    key = Ed25519PrivateKey.from_private_bytes(SEED)
    (HERE / "golden_signing.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    (HERE / "golden_resource.key").write_text(RESOURCE_KEY.hex() + "\n")
    record = {}
    for name, version in CORES.items():
        path = HERE / name
        write_sample_core(path, key, protected_version=version,
                          resource_key=RESOURCE_KEY if version == 4 else None)
        with open_core(path, [key.public_key()], resource_key=RESOURCE_KEY) as core:
            record[name] = {
                "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                "payload_sha256": hashlib.sha256(core.payload).hexdigest(),
                "payload_type": core.payload_type,
                "format_version": core.format_version,
                "protected_version": core.protected_version,
                "key_id": core.key_id,
                "namespace": core.namespace,
                "resources": {rid: hashlib.sha256(core.read_resource(rid)).hexdigest()
                              for rid in core.resources},
            }
        assert record[name]["namespace"] == SAMPLE_NAMESPACE
    (HERE / "golden_cores.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(f"wrote {', '.join(CORES)} under {HERE}")


if __name__ == "__main__":
    main()
