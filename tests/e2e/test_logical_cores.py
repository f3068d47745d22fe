"""Logical-resource cores end to end: `ignition export --carrier logical --protected-version
6|4` writes them, `helios-tools verify`/`lint-core` and `helios-serve` read them (version 4
with `--resource-key FILE` or HELIOS_RESOURCE_KEY_FILE), and they serve the payload core's
greedy ids, which are the plain NumPy forward's."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from helios_tools.cli import main as tools_main
from helios_tools.core import load_public_key, open_core

from tests.ignition.export.tiny import run_export
from tests.tiny_model import (
    LLAMA_RECIPE,
    NAMESPACE,
    PROMPTS,
    ServeProcess,
    plain_greedy,
    prompt_ids,
    serve_fails,
    until_eos,
)

STEPS = 12


@pytest.fixture(scope="module")
def resource_key(module_tmp) -> Path:
    out = module_tmp("aes") / "resource.key"
    result = CliRunner().invoke(tools_main, ["keygen", "--aes", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output == f"wrote {out} (AES-256 resource key, 32 bytes, 0600)\n"
    return out


@pytest.fixture(scope="module")
def logical(tiny_served, resource_key, module_tmp) -> dict[int, Path]:
    """The tiny checkpoint exported as ProtectedIndex version 6 and 4 cores (CLI)."""
    folder = module_tmp("logical")
    private = tiny_served.core.private_key
    cores = {}
    for version, extra in ((6, ()), (4, ("--resource-key", resource_key))):
        out = folder / f"tiny-v{version}.core"
        result = run_export(LLAMA_RECIPE, "--checkpoint", tiny_served.checkpoint, "--key",
                            private, "--namespace", NAMESPACE, "--out", out, "--weight-dtype",
                            "f32", "--carrier", "logical", "--protected-version", str(version),
                            *extra)
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith(f"wrote {out} (logical-resource core (ProtectedIndex "
                                        f"version {version})): served id tiny-served, ")
        cores[version] = out
    return cores


@pytest.fixture(scope="module")
def expected(tiny_served) -> dict[str, list[int]]:
    """Greedy ids of the plain NumPy forward, cut after EOS as a served response is."""
    return {text: until_eos(plain_greedy(tiny_served.checkpoint, prompt_ids(text), STEPS))
            for text in PROMPTS}


def test_the_cores_are_what_they_say(tiny_served, logical, resource_key):
    from helios_tools.core.protected import load_resource_key

    key = load_public_key(tiny_served.core.public_key)
    with open_core(logical[6], [key]) as v6:
        assert (v6.format_version, v6.protected_version) == (1, 6)
        assert all(r.chunk_sha256 for r in v6.resources.values())
    with open_core(logical[4], [key], resource_key=load_resource_key(resource_key)) as v4:
        assert (v4.format_version, v4.protected_version) == (1, 4)
        assert all(r.HasField("protected_chunks") for r in v4.resources.values())
        with open_core(tiny_served.core.path, [key]) as payload:
            assert v4.read_resource("weights/embed") == payload.read_resource("weights/embed")
    template = b"{% for message in messages %}"  # the chat template resource's first bytes
    assert template in tiny_served.checkpoint.joinpath("tokenizer_config.json").read_bytes()
    assert template not in logical[4].read_bytes()  # encrypted


@pytest.mark.parametrize("command", ["verify", "lint-core"])
def test_tools_read_them_with_the_key_from_a_flag_or_the_environment(
        tiny_served, logical, resource_key, command):
    core = tiny_served.core
    args = [command, "--trust", str(core.public_key), "--accept", NAMESPACE]
    runner = CliRunner()
    for version, path in logical.items():
        flag = ["--resource-key", str(resource_key)] if version == 4 else []
        result = runner.invoke(tools_main, [*args, str(path), *flag])
        assert result.exit_code == 0, result.output
    env = runner.invoke(tools_main, [*args, str(logical[4])],
                        env={"HELIOS_RESOURCE_KEY_FILE": str(resource_key)})
    assert env.exit_code == 0, env.output
    without = runner.invoke(tools_main, [*args, str(logical[4])])
    assert without.exit_code == 1 and "ProtectedKeyRequired" in without.output


def test_logical_cores_serve_the_payload_cores_greedy_ids(tiny_served, logical, resource_key,
                                                         expected):
    core = tiny_served.core
    trust = ("--trust", core.public_key, "--accept", NAMESPACE)
    served = {}
    with ServeProcess(core.path, *trust) as payload:
        served["payload"] = {text: payload.chat_ids(text, STEPS) for text in PROMPTS}
    with ServeProcess(logical[6], *trust) as v6:
        served["v6"] = {text: v6.chat_ids(text, STEPS) for text in PROMPTS}
    with ServeProcess(logical[4], *trust, "--resource-key", resource_key) as v4:
        served["v4"] = {text: v4.chat_ids(text, STEPS) for text in PROMPTS}
    with ServeProcess(logical[4], *trust, env={"HELIOS_RESOURCE_KEY_FILE": str(resource_key)}) \
            as v4_env:
        served["v4 (env)"] = {PROMPTS[0]: v4_env.chat_ids(PROMPTS[0], STEPS)}
    assert served["payload"] == expected
    assert served["v6"] == expected and served["v4"] == expected
    assert served["v4 (env)"] == {PROMPTS[0]: expected[PROMPTS[0]]}


def _fails(*args) -> str:
    """helios-serve ARGS exits 2 with one error line (after any startup phase lines)."""
    return serve_fails("--port", "0", *args)


def test_a_missing_or_wrong_key_is_one_line(tiny_served, logical, tmp_path):
    core = tiny_served.core
    trust = ("--trust", core.public_key, "--accept", NAMESPACE)
    path = logical[4]
    assert _fails(path, *trust) == (
        f"helios-serve: error: {path} is a logical-resource core with encrypted resources "
        "(ProtectedIndex version 4): pass --resource-key FILE or set HELIOS_RESOURCE_KEY_FILE")
    wrong = tmp_path / "wrong.key"
    wrong.write_bytes(bytes(32))
    line = _fails(path, *trust, "--resource-key", wrong)
    assert line.startswith(f"helios-serve: error: wrong resource key for {path} (or a damaged "
                           "core): AES-GCM chunk 0 of 1 fails authentication")
    short = tmp_path / "short.key"
    short.write_bytes(bytes(31))
    assert _fails(path, *trust, "--resource-key", short) == (
        f"helios-serve: error: cannot read resource key: {short}: a resource key is 32 raw "
        "bytes or 64 hex digits (31 bytes found)")
    missing = tmp_path / "absent.key"
    assert _fails(path, *trust, "--resource-key", missing) == (
        f"helios-serve: error: cannot read resource key {missing}: No such file or directory")


def test_export_refuses_carrier_options_that_do_not_fit(tiny_served, resource_key, tmp_path):
    base = (LLAMA_RECIPE, "--checkpoint", tiny_served.checkpoint, "--key",
            tiny_served.core.private_key, "--namespace", NAMESPACE, "--out", tmp_path / "x.core")
    cases = {
        ("--protected-version", "4"): "--protected-version applies only with --carrier logical",
        ("--carrier", "logical", "--protected-version", "4"):
            "--protected-version 4 needs --resource-key FILE (32 random bytes: "
            "`helios-tools keygen --aes --out FILE`)",
        ("--carrier", "logical", "--resource-key", resource_key):
            "--resource-key applies only with --protected-version 4 (version 6 resources are "
            "not encrypted)",
        ("--resource-key", resource_key):
            "--resource-key applies only with --carrier logical --protected-version 4",
        ("--carrier", "logical", "--protected-version", "4", "--resource-key",
         tiny_served.core.public_key):
            f"cannot read resource key: {tiny_served.core.public_key}: a resource key is 32 "
            "raw bytes or 64 hex digits",  # the path once, as helios-serve's line has it
    }
    for extra, why in cases.items():
        result = run_export(*base, *extra)
        # options that do not go together are usage (2); a bad resource key, a failed export (1)
        usage = "applies only with" in why or "needs --resource-key" in why
        assert result.exit_code == (2 if usage else 1), (extra, result.output)
        assert result.stderr.startswith(f"ignition: error: {why}"), (extra, result.stderr)
    assert list(tmp_path.iterdir()) == []
