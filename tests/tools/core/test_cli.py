"""The helios-tools CLI: exit codes 0 ok, 1 findings, 2 unreadable; --help everywhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helios_tools.cli import main
from helios_tools.core import load_private_key
from helios_tools.core.sample import SAMPLE_BACKENDS, SAMPLE_NAMESPACE, write_sample_core

UNSIGNED_NOTE = ("signature not checked (no --trust): the core's structure was linted, not "
                 "who signed it")
INTEGRITY_SUMMARY = ("INTEGRITY FAILURE in 1 (listed first): the core is not what its "
                     "publisher signed for this namespace; do not serve it")


@pytest.fixture(scope="module")
def keyed(module_tmp) -> tuple[Path, Path, Path]:
    """(private key, public key, sample core signed by it), made through `keygen`."""
    d = module_tmp("cli")
    result = CliRunner().invoke(main, ["keygen", "--out", str(d / "k")])
    assert result.exit_code == 0, result.output
    write_sample_core(d / "s.core", load_private_key(d / "k"))
    return d / "k", d / "k.pub", d / "s.core"


def _run(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("command", [[], ["keygen"], ["inspect"], ["verify"], ["lint-core"]])
def test_help(command):
    result = _run(*command, "--help")
    assert result.exit_code == 0 and "Usage" in result.output


def test_keygen_modes_and_refuses_overwrite(keyed):
    priv, pub, _ = keyed
    assert priv.stat().st_mode & 0o777 == 0o600
    assert pub.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    assert _run("keygen", "--out", priv).exit_code == 2


@pytest.mark.parametrize("aes", [[], ["--aes"]])
def test_keygen_into_a_missing_folder_is_one_clear_line(tmp_path, aes):
    out = tmp_path / "absent" / "k"
    result = _run("keygen", *aes, "--out", out)
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"helios-tools: error: cannot write {out}: No such file or directory"]


def test_inspect_text_and_json(keyed):
    _, _, core = keyed
    text = _run("inspect", core)
    assert text.exit_code == 0
    for needle in (SAMPLE_NAMESPACE, "tiny-llama", "decode_b4", "DECODE", "weights/embed",
                   "contract     version 3", "aliases: tiny"):
        assert needle in text.output
    assert ("concurrency  serves 4 requests at once by default (serving default max_active "
            "4); --max-active up to 4 request slots; captured concurrency 4\n") in text.output
    data = json.loads(_run("inspect", core, "--json").output)
    assert data["namespace"] == SAMPLE_NAMESPACE and data["served_id"] == "tiny-llama"
    assert {k: data[k] for k in ("selected_concurrency", "serving_default_max_active",
                                 "default_max_active", "request_slots",
                                 "served_concurrency")} == {
        "selected_concurrency": 4, "serving_default_max_active": 4, "default_max_active": 4,
        "request_slots": 4, "served_concurrency": 4}
    assert {g["name"]: (g["batch_capacity"], g["token_capacity"]) for g in data["graphs"]} == {
        "prefill_t32": (1, 32), "decode_b4": (4, 4)}
    res = {r["id"]: r for r in data["resources"]}
    assert res["weights/embed"]["decoded_nbytes"] == 16384
    assert res["weights/embed"]["ratio"] == round(16384 / res["weights/embed"]["stored_nbytes"], 3)


def test_verify_ok_findings_and_unreadable(keyed, tmp_path):
    _, pub, core = keyed
    ok = _run("verify", core, "--trust", pub, "--accept", SAMPLE_NAMESPACE)
    assert ok.exit_code == 0 and "OK" in ok.output
    wrong_ns = _run("verify", core, "--trust", pub, "--accept", SAMPLE_NAMESPACE.upper())
    assert wrong_ns.exit_code == 1 and "NamespaceMismatch" in wrong_ns.output
    tampered = tmp_path / "t.core"
    data = bytearray(core.read_bytes())
    data[-100] ^= 1  # inside the last frame
    tampered.write_bytes(data)
    bad = _run("verify", tampered, "--trust", pub, "--accept", SAMPLE_NAMESPACE)
    assert bad.exit_code == 1 and "ChunkDigestMismatch" in bad.output
    sig = bytearray(core.read_bytes())
    payload_at = sig.index(b"tiny-llama")
    sig[payload_at] ^= 1
    tampered.write_bytes(sig)
    assert _run("verify", tampered, "--trust", pub, "--accept", SAMPLE_NAMESPACE).exit_code == 1
    garbage = tmp_path / "g.core"
    garbage.write_bytes(b"not a core at all")
    assert _run("verify", garbage, "--trust", pub, "--accept", "x").exit_code == 2
    assert _run("verify", tmp_path / "missing", "--trust", pub, "--accept", "x").exit_code == 2
    assert _run("verify", core, "--accept", "x").exit_code == 2  # --trust is required


def test_lint_core_clean_and_json(keyed):
    _, pub, core = keyed
    cuda = ("--backend", *SAMPLE_BACKENDS)
    clean = _run("lint-core", core, "--trust", pub, "--accept", SAMPLE_NAMESPACE, *cuda)
    assert clean.exit_code == 0 and "0 finding(s)" in clean.output
    unsigned = _run("lint-core", core, "--format", "json", *cuda)
    assert unsigned.exit_code == 0 and json.loads(unsigned.output)["findings"] == []
    # By default lint checks every backend: the sample's kernel is no NumPy reference op.
    every = json.loads(_run("lint-core", core, "--format", "json").output)["findings"]
    assert [(f["rule"], f["path"], f["value"]) for f in every] == [
        ("runtime.reference_op", "manifest.kernels[1].reference_op", "greedy_sample")]
    assert every[0]["detail"].startswith("not executed by the cpu backend: kernel ")


def test_lint_core_reports_findings(keyed, tmp_path):
    from helios_contract.schema import core_pb2
    from helios_tools.core import CoreWriter
    from helios_tools.core.sample import sample_contract, sample_manifest, sample_resources

    priv, pub, _ = keyed
    manifest = sample_manifest()
    manifest.targets.append("sm_100")  # no kernel has a binary for it
    path = tmp_path / "l.core"
    with CoreWriter(path, load_private_key(priv), None, SAMPLE_NAMESPACE) as w:
        for rid, kind, data in sample_resources():
            if kind != core_pb2.RESOURCE_KIND_CHAT_TEMPLATE:
                w.add_resource(rid, kind, data)
        w.finish(sample_contract(), manifest)
    result = _run("lint-core", path, "--trust", pub, "--format", "json")
    assert result.exit_code == 1
    rules = {(f["rule"], f["value"]) for f in json.loads(result.output)["findings"]}
    assert ("kernel.target", "embedding@sm_100") in rules
    assert ("resource.frontend_assets", "RESOURCE_KIND_CHAT_TEMPLATE") in rules
    text = _run("lint-core", path)
    assert text.exit_code == 1 and "kernel.target: manifest.kernels[0].binaries" in text.output


def test_lint_core_signature_failure_is_a_finding(keyed, tmp_path):
    _, pub, core = keyed
    other = tmp_path / "o"
    assert _run("keygen", "--out", other).exit_code == 0
    result = _run("lint-core", core, "--trust", f"{other}.pub", "--format", "json")
    assert result.exit_code == 1
    assert json.loads(result.output)["findings"][0]["rule"] == "core.UntrustedKey"
    garbage = tmp_path / "g.core"
    garbage.write_bytes(b"HELIOSC\x00" + bytes(8))
    assert _run("lint-core", garbage).exit_code == 2
    assert _run("lint-core", core, "--accept", "x").exit_code == 2  # --accept needs --trust


def _tampered(core: Path, out: Path) -> Path:
    data = bytearray(core.read_bytes())
    data[-100] ^= 1  # inside the last frame: a resource fails its signed digest
    out.write_bytes(data)
    return out


def test_lint_core_lists_an_integrity_failure_first_and_says_so_last(keyed, tmp_path):
    """A tampered core's digest finding was one line among the others, under a plain
    "N finding(s)"; it now leads, marked, and the summary says not to serve the core."""
    _, pub, core = keyed
    path = _tampered(core, tmp_path / "t.core")
    text = _run("lint-core", path, "--trust", pub)  # every backend: the cpu finding too
    assert text.exit_code == 1
    lines = text.output.strip().splitlines()
    assert lines[0].startswith("INTEGRITY FAILURE resource.integrity: resources[")
    assert "ChunkDigestMismatch" in lines[0]
    assert lines[1].startswith("runtime.reference_op: manifest.kernels[1].reference_op")
    assert lines[-1] == f"{path}: 2 finding(s), {INTEGRITY_SUMMARY}"
    data = json.loads(_run("lint-core", path, "--trust", pub, "--format", "json").output)
    assert [f["rule"] for f in data["findings"]] == ["resource.integrity",
                                                     "runtime.reference_op"]
    assert (data["integrity_findings"], data["signature_checked"]) == (1, True)


def test_integrity_findings_come_first_in_their_own_order():
    from helios_contract import ContractError
    from helios_tools.lint import Finding, integrity_first

    found = [Finding.of(rule, ContractError, path) for rule, path in (
        ("runtime.storage", "a"), ("resource.integrity", "b"), ("graph.missing", "c"),
        ("core.UntrustedKey", "d"))]  # fmt: skip
    assert [f.path for f in integrity_first(found)] == ["b", "d", "a", "c"]


def test_lint_core_without_trust_says_the_signature_was_not_checked(keyed):
    _, pub, core = keyed
    unsigned = _run("lint-core", core, "--backend", *SAMPLE_BACKENDS)
    assert unsigned.exit_code == 0
    assert unsigned.output.strip().splitlines() == [f"note: {UNSIGNED_NOTE}",
                                                    f"{core}: 0 finding(s)"]
    data = json.loads(_run("lint-core", core, "--format", "json", "--backend",
                           *SAMPLE_BACKENDS).output)
    assert (data["signature_checked"], data["notes"]) == (False, [UNSIGNED_NOTE])
    trusted = _run("lint-core", core, "--trust", pub, "--backend", *SAMPLE_BACKENDS)
    assert trusted.output.strip().splitlines() == [f"{core}: 0 finding(s)"]


def test_lint_core_names_the_backend_a_core_does_not_fit_and_the_option(keyed):
    """The sample's kernel runs on cuda only: a default (every backend) lint says so and
    names `--backend cuda`; a gguf-weights core's mirror image (cpu only):
    tests/ignition/export/test_lint.py."""
    _, pub, core = keyed
    every = _run("lint-core", core, "--trust", pub)
    assert every.exit_code == 1
    assert every.output.strip().splitlines()[-2:] == [
        "note: the cpu backend cannot execute this core (1 finding(s)): `--backend cuda` "
        "lints it for the cuda backend alone", f"{core}: 1 finding(s)"]
    assert _run("lint-core", core, "--trust", pub, "--backend", "cuda").exit_code == 0


def _console_script() -> str:
    found = shutil.which("helios-tools", path=str(Path(sys.executable).parent))
    assert found, "the helios-tools console script is not installed in this environment"
    return found


def test_console_script_exit_codes(keyed, tmp_path):
    _, pub, core = keyed
    exe = _console_script()
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}

    def run(*args):
        return subprocess.run([exe, *map(str, args)], capture_output=True, text=True,
                              timeout=60, env=env)

    ok = run("verify", core, "--trust", pub, "--accept", SAMPLE_NAMESPACE)
    assert ok.returncode == 0, ok.stderr
    mismatch = run("verify", core, "--trust", pub, "--accept", "someone.else")
    assert mismatch.returncode == 1 and "NamespaceMismatch" in mismatch.stderr
    missing = run("inspect", tmp_path / "nope.core")
    assert missing.returncode == 2
    assert run("--help").returncode == 0


def test_protected_v4_core_needs_the_resource_key(keyed, tmp_path):
    priv, pub, _ = keyed
    key = bytes(range(32))
    core = tmp_path / "v4.core"
    write_sample_core(core, load_private_key(priv), protected_version=4, resource_key=key)
    key_file = tmp_path / "aes.key"
    key_file.write_text(key.hex() + "\n")
    args = ["verify", core, "--trust", pub, "--accept", SAMPLE_NAMESPACE]
    assert _run(*args, "--resource-key", key_file).exit_code == 0
    without = _run(*args)
    assert without.exit_code == 1 and "ProtectedKeyRequired" in without.output
    wrong = tmp_path / "wrong.key"
    wrong.write_bytes(bytes(32))
    assert _run(*args, "--resource-key", wrong).exit_code == 1
    short = tmp_path / "short.key"
    short.write_text("abcd")
    assert _run(*args, "--resource-key", short).exit_code == 2
    assert json.loads(_run("inspect", core, "--json").output)["format"].endswith("version 4)")
    assert _run("lint-core", core, "--trust", pub, "--resource-key", key_file, "--backend",
                *SAMPLE_BACKENDS).exit_code == 0


@pytest.mark.parametrize("command", ["inspect", "lint-core"])
def test_unreadable_core_names_its_path_once(tmp_path, command):
    garbage = tmp_path / "g.core"
    garbage.write_bytes(b"not a core at all")
    short = tmp_path / "s.core"
    short.write_bytes(b"HELIOSC\x00" + (1000).to_bytes(8, "little"))
    missing = tmp_path / "missing.core"
    for path, why in ((garbage, "not a Helios core (bad magic)"),
                      (short, "header declares a 1000-byte body in a 16-byte file"),
                      (missing, "No such file or directory")):
        result = _run(command, path)
        assert result.exit_code == 2, result.output
        line = result.output.strip().splitlines()[-1]
        assert line.startswith(f"helios-tools: error: {path}: {why}"), line
        assert line.count(str(path)) == 1, line


def test_lint_core_json_reports_an_unreadable_core_as_json(tmp_path):
    garbage = tmp_path / "g.core"
    garbage.write_bytes(b"not a core at all")
    result = CliRunner().invoke(main, ["lint-core", str(garbage), "--format", "json"])
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert data == {"core": str(garbage), "findings": [],
                    "error": f"{garbage}: not a Helios core (bad magic) (offset 0)"}


@pytest.fixture
def wrong_location_length(keyed, tmp_path) -> tuple[Path, str]:
    """The sample core with one unsigned location one byte shorter than the signed stored
    length (the body keeps its size, so only the LocationSet disagrees)."""
    from helios_contract.schema import core_pb2

    _, _, core = keyed
    data = core.read_bytes()
    frames_start = 16 + int.from_bytes(data[8:16], "little")
    body = core_pb2.CoreBody.FromString(data[16:frames_start])
    loc = body.locations.locations[0]
    loc.length -= 1
    new = body.SerializeToString()
    assert len(new) == frames_start - 16
    out = tmp_path / "wrong-length.core"
    out.write_bytes(data[:16] + new + data[frames_start:])
    return out, loc.resource_id


def test_location_length_mismatch_is_one_line_everywhere(keyed, wrong_location_length):
    _, pub, _ = keyed
    path, rid = wrong_location_length
    why = "location length "
    verify = _run("verify", path, "--trust", pub, "--accept", SAMPLE_NAMESPACE)
    assert verify.exit_code == 1
    assert verify.output.startswith(f"FAIL {path}: LengthMismatch: {why}")
    inspect = _run("inspect", path)
    assert inspect.exit_code == 2, inspect.output
    assert inspect.output.strip().splitlines()[-1].startswith(
        f"helios-tools: error: {path}: {why}")
    assert f"resource {rid!r}" in inspect.output
    for args, notes in (([], [f"note: {UNSIGNED_NOTE}"]), (["--trust", pub], [])):
        lint = _run("lint-core", path, *args, "--backend", *SAMPLE_BACKENDS)
        assert lint.exit_code == 1, lint.output
        lines = lint.output.strip().splitlines()
        assert lines[0].startswith("INTEGRITY FAILURE core.LengthMismatch: locations = "
                                   f"{rid}: {why}"), lines
        assert lines[1:] == [*notes, f"{path}: 1 finding(s), {INTEGRITY_SUMMARY}"]
    data = json.loads(_run("lint-core", path, "--format", "json", "--backend",
                           *SAMPLE_BACKENDS).output)
    assert [(f["rule"], f["value"]) for f in data["findings"]] == [("core.LengthMismatch", rid)]


def test_keygen_aes_writes_a_resource_key_once(tmp_path):
    from helios_tools.core.protected import load_resource_key

    out = tmp_path / "resource.key"
    assert _run("keygen", "--aes", "--out", out).exit_code == 0
    data = out.read_bytes()
    assert len(data) == 32 and out.stat().st_mode & 0o777 == 0o600
    assert load_resource_key(out) == data
    again = _run("keygen", "--aes", "--out", out)
    assert again.exit_code == 2 and f"refusing to overwrite {out}" in again.output
    assert out.read_bytes() == data
    hexed = tmp_path / "hex.key"
    hexed.write_text(data.hex() + "\n")
    assert load_resource_key(hexed) == data
    for bad in (b"", bytes(33), b"zz" * 32):
        out.write_bytes(bad)
        with pytest.raises(ValueError, match="a resource key is 32 raw bytes or 64 hex digits"):
            load_resource_key(out)


def test_a_usage_error_is_one_line_with_status_2(tmp_path):
    """A bad option value is one ``helios-tools: error:`` line (not click's Usage / Try
    block), exit 2, as ignition and helios-serve print theirs."""
    result = subprocess.run([_console_script(), "lint-core", str(tmp_path / "x.core"),
                             "--backend", "gpu"], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "helios-tools: error: Invalid value for '--backend': 'gpu' is not one of 'cpu', "
        "'cuda'."]
    assert result.stdout == ""
