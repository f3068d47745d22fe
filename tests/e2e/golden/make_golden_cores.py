"""Generate the golden cores of the tiny model that tests/e2e/test_golden_cores.py serves.

Usage (only to ADD a core when an exporter changes what it writes; never to "fix" a
failing test: a golden core that stops serving is a runtime regression):

    uv run python tests/e2e/golden/make_golden_cores.py [--only NAME]

Writes, beside this script:
    tiny_v3.core        the tiny model of tests/tiny_model.py exported by today's
                        `ignition export` (recipes/llama.py, f32 weights): contract version 3
    tiny_v2.core        the same core as a contract version 2 exporter wrote it: no
                        `vocabulary.mask_words` (and no speculative `lane_limit`)
    tiny_v1.core        as a version 1 exporter wrote it: also no `cache.page_table_views`
                        (version 1's implicit view names the buffer "page_table") and no
                        `completion_cursor`
    golden_signing.pub  the Ed25519 public key that signed them (a seeded test key)
    expected.json       per prompt, the greedy ids of the independent plain NumPy forward
                        (bench/numpy_forward.py) on the same checkpoint, cut after EOS; per
                        core, its contract version, SHA-256 and the commit that made it

What versions 1 and 2 lacked is helios_contract.upgrade's list (proto/helios/v1/contract.proto
header); the older cores are today's core with those fields removed, re-signed with the
same resources, exactly what an exporter of that version wrote for this model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))  # tests.tiny_model when run as a script

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

SEED = hashlib.sha256(b"helios golden tiny-model signing key (test only)").digest()
STEPS = 12
CORES = {"tiny_v3.core": 3, "tiny_v2.core": 2, "tiny_v1.core": 1}
TODAY_PAGE_TABLE = "state.page_table"


def _rename_strings(message, old: str, new: str) -> int:
    """Replace every string field equal to `old` in `message` (recursively); returns the
    count."""
    count = 0
    for field, value in message.ListFields():
        if field.type == field.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                continue  # scalar maps hold no buffer names
            for item in (value if field.is_repeated else [value]):
                count += _rename_strings(item, old, new)
        elif field.type == field.TYPE_STRING:
            if field.is_repeated:
                for i, item in enumerate(value):
                    if item == old:
                        value[i] = new
                        count += 1
            elif value == old:
                setattr(message, field.name, new)
                count += 1
    return count


def downgrade(contract, manifest, version: int):
    """Today's (contract, manifest) as an exporter of contract `version` wrote them."""
    from helios_contract.upgrade import IMPLICIT_PAGE_TABLE

    contract, manifest = type(contract).FromString(contract.SerializeToString()), \
        type(manifest).FromString(manifest.SerializeToString())
    model = contract.model
    model.version = version
    model.vocabulary.ClearField("mask_words")
    for graph in model.graphs:
        if graph.HasField("speculative"):
            graph.speculative.ClearField("lane_limit")
    if version == 1:
        views = list(model.cache.page_table_views)
        assert [v.buffer for v in views] == [TODAY_PAGE_TABLE], views
        assert all(v.page_offset == 0 for v in views)
        model.cache.ClearField("page_table_views")
        for graph in model.graphs:
            graph.ClearField("completion_cursor")
        renamed = _rename_strings(contract, TODAY_PAGE_TABLE, IMPLICIT_PAGE_TABLE)
        renamed += _rename_strings(manifest, TODAY_PAGE_TABLE, IMPLICIT_PAGE_TABLE)
        assert renamed > 0
    return contract, manifest


def resign(src: Path, dst: Path, key, contract, manifest) -> None:
    """Write `dst`: `src`'s resources (decoded, re-framed) under a new signed body."""
    from helios_tools.core import CoreWriter, open_core

    with open_core(src, [key.public_key()]) as core, \
            CoreWriter(dst, key, None, core.namespace) as writer:
        for rid, res in core.resources.items():
            writer.add_resource(rid, res.kind, core.read_resource(rid))
        writer.finish(contract, manifest)


def main() -> None:
    from helios_tools.core import open_core

    from tests.tiny_model import (
        PROMPTS,
        export_tiny,
        plain_greedy,
        prompt_ids,
        until_eos,
        write_tiny_checkpoint,
    )

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(CORES), action="append",
                        help="write only these cores (others keep their committed bytes)")
    args = parser.parse_args()
    only = set(args.only or CORES)
    key = Ed25519PrivateKey.from_private_bytes(SEED)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    record_path = HERE / "expected.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {"cores": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        pem = tmp / "golden.key"
        pem.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
        checkpoint = write_tiny_checkpoint(tmp)
        today = export_tiny(checkpoint, pem, tmp / "today.core")
        with open_core(today, [key.public_key()]) as core:
            contract, manifest = core.contract, core.manifest
        for name, version in CORES.items():
            if name not in only:
                continue
            out = HERE / name
            if version == 3:
                out.write_bytes(today.read_bytes())
            else:
                resign(today, out, key, *downgrade(contract, manifest, version))
            record["cores"][name] = {
                "contract_version": version,
                "file_sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
                "made_at_commit": commit,
            }
        record["steps"] = STEPS
        record["greedy_ids"] = {
            text: until_eos(plain_greedy(checkpoint, prompt_ids(text), STEPS))
            for text in PROMPTS}
        record["reference"] = "bench/numpy_forward.py PlainLlama on tests/tiny_model.py's " \
                              "checkpoint (seed 0), greedy, cut after EOS (id 2)"
    (HERE / "golden_signing.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    record_path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(f"wrote {', '.join(sorted(only))} and expected.json under {HERE}")


if __name__ == "__main__":
    main()
