"""The helios-serve command: startup errors are one line and exit 2; a real core serves.

The startup errors run `main` in this process (click's runner), as the installed command
would, except test_usage_errors, which runs the command itself: the failures are the
same code either way, and a process start costs seconds of imports per case."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from helios_serve import cli
from helios_tools.core import generate_key, write_key_pair

from tests.tiny_model import serve_error_line, serve_fails

pytestmark = pytest.mark.slow

SERVE = str(Path(sys.executable).parent / "helios-serve")
# The demo's question (the README's and the startup `Try:` line's) and llama.cpp's greedy
# answer to it on the same Q4_1 GGUF (tests/golden/make_llamacpp_reference.py): the demo
# serves that GGUF's blocks, so its greedy answer is llama.cpp's, token for token.
_LLAMACPP = json.loads((Path(__file__).parents[1] / "golden" / "smollm2_llamacpp.json")
                       .read_text())
DEMO_REFERENCE = next(p for p in _LLAMACPP["runs"]["f32_cache"]["prompts"]
                      if p["name"] == "demo_germany")


def _fails(*args) -> str:
    """helios-serve ARGS (in this process) exits 2 with one error line (after any startup
    phase lines); test_usage_errors runs the installed command."""
    return serve_fails("--port", "0", *args)


def _command_fails(*args) -> str:
    """`_fails` through the installed `helios-serve` command, in its own process."""
    proc = subprocess.run([SERVE, "--port", "0", *map(str, args)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    return serve_error_line(proc.stderr)


def test_bad_core(smollm2_core_f32, tmp_path):
    core = smollm2_core_f32
    truncated = tmp_path / "truncated.core"
    truncated.write_bytes(core.path.read_bytes()[:4096])
    line = _fails(str(truncated), "--trust", str(core.public_key), "--accept", core.namespace)
    assert "bad core" in line
    line = _fails(str(tmp_path / "absent.core"), "--trust", str(core.public_key),
                  "--accept", core.namespace)
    assert "no such file" in line


def test_wrong_namespace(smollm2_core_f32):
    core = smollm2_core_f32
    line = _fails(str(core.path), "--trust", str(core.public_key), "--accept",
                  core.namespace.upper())
    assert "wrong namespace" in line


def test_untrusted_key(smollm2_core_f32, tmp_path):
    from helios_tools.core import generate_key, write_key_pair

    _, other = write_key_pair(generate_key(), tmp_path / "other.key")
    core = smollm2_core_f32
    line = _fails(str(core.path), "--trust", str(other), "--accept", core.namespace)
    assert "bad core" in line


def test_missing_graph_variant(smollm2_core_f32, tmp_path):
    from helios_contract.schema import core_pb2
    from helios_tools.core import CoreWriter, load_private_key, load_public_key, open_core

    core = smollm2_core_f32
    src = open_core(core.path, [load_public_key(core.public_key)])
    manifest = type(src.manifest)()
    manifest.CopyFrom(src.manifest)
    dropped = manifest.graphs[1].name
    keep = [g for g in manifest.graphs if g.name != dropped]
    del manifest.graphs[:]
    manifest.graphs.extend(keep)
    out = tmp_path / "missing.core"
    with CoreWriter(out, load_private_key(core.private_key), None, src.namespace) as w:
        for rid, res in src.resources.items():
            if res.kind in (core_pb2.RESOURCE_KIND_TOKENIZER, core_pb2.RESOURCE_KIND_CHAT_TEMPLATE):
                w.add_resource(rid, res.kind, src.read_resource(rid))
        w.finish(src.contract, manifest)
    src.close()
    line = _fails(str(out), "--trust", str(core.public_key), "--accept", core.namespace)
    assert "missing graph variant" in line and dropped in line


def test_an_unreadable_trusted_key_names_its_file_once(tmp_path):
    """Was "cannot read trusted key K: [Errno 2] No such file or directory: 'K'", and
    for a private key "cannot read trusted key K: K: Valid PEM ..."."""
    core = tmp_path / "x.core"
    core.write_bytes(b"keys are read before the core")
    missing = tmp_path / "absent.pub"
    assert _fails(str(core), "--trust", str(missing), "--accept", "ns") == (
        f"helios-serve: error: cannot read trusted key {missing}: No such file or directory")
    private = tmp_path / "k"
    write_key_pair(generate_key(), private)
    line = _fails(str(core), "--trust", str(private), "--accept", "ns")
    assert line.startswith(f"helios-serve: error: cannot read trusted key: {private}: "), line
    assert line.count(str(private)) == 1, line


def test_an_interrupt_during_startup_is_one_line_exit_130(monkeypatch):
    """Ctrl-C during an export or a load printed click's "Aborted!" and exited 1."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "start", interrupted)
    result = CliRunner().invoke(cli.main, ["x.core", "--trust", "k.pub", "--accept", "ns",
                                           "--port", "0"])
    assert (result.exit_code, result.stderr) == (130, "helios-serve: error: interrupted\n")
    assert result.stdout == ""


def test_usage_errors():
    assert "missing CORE" in _command_fails()
    assert "--trust" in _command_fails("x.core", "--accept", "ns")


def test_serves_a_core_and_startup_options_beat_defaults(smollm2_core_f32):
    core = smollm2_core_f32
    proc = subprocess.Popen(
        [SERVE, str(core.path), "--trust", str(core.public_key), "--accept", core.namespace,
         "--port", "0", "--max-active", "2", "--served-name", "local-smol"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        first = proc.stdout.readline()
        assert first.startswith("Helios is serving local-smol at http://127.0.0.1:"), (
            first + proc.stderr.read() if proc.poll() is not None else first)
        url = first.split(" at ")[1].split()[0]
        assert proc.stdout.readline().startswith("Try: curl " + url)
        models = httpx.get(url + "/v1/models", timeout=30).json()
        assert models["data"][0]["id"] == "local-smol"
        loaded = _runtime_resources(httpx.get(url + "/metrics", timeout=30).text)
        assert loaded["graph_captures"] > 0 and loaded["device_allocations"] > 0
        r = httpx.post(url + "/v1/chat/completions", timeout=300, json={
            "model": "local-smol", "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]})
        assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["message"]["content"]
        metrics = httpx.get(url + "/metrics", timeout=30).text
        assert "helios_request_slots_capacity 2.0" in metrics  # --max-active beat the core
        assert "\nhelios_execution_frames 1.0\n" in metrics  # the cpu backend
        assert _runtime_resources(metrics) == loaded  # nothing allocated or captured serving
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    assert proc.returncode in (0, -signal.SIGINT)


def _runtime_resources(metrics: str) -> dict[str, float]:
    prefix = 'helios_runtime_resources{kind="'
    return {line[len(prefix):].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines() if line.startswith(prefix)}


def test_demo_fingerprint_follows_the_recipe_the_options_and_the_sources(tmp_path):
    from helios_serve.cli import DEMO_EXPORT_OPTIONS, demo_fingerprint

    recipe, src = tmp_path / "recipe.py", tmp_path / "pkg"
    (src / "sub").mkdir(parents=True)
    recipe.write_text("RECIPE = 1\n")
    (src / "sub" / "a.py").write_text("x = 1\n")
    first = demo_fingerprint(recipe, [src])
    assert len(first) == 16 and demo_fingerprint(recipe, [src]) == first
    (src / "sub" / "a.py").write_text("x = 2\n")
    second = demo_fingerprint(recipe, [src])
    recipe.write_text("RECIPE = 2\n")
    assert len({first, second, demo_fingerprint(recipe, [src])}) == 3
    # the export options count: a demo core of another weight dtype is exported again
    quantized = demo_fingerprint(recipe, [src], DEMO_EXPORT_OPTIONS)
    assert DEMO_EXPORT_OPTIONS == ("--weight-dtype", "gguf")
    assert quantized != demo_fingerprint(recipe, [src])
    assert quantized != demo_fingerprint(recipe, [src], ("--weight-dtype", "bf16"))
    assert len(demo_fingerprint(Path(__file__))) == 16  # the installed packages resolve


def _demo_serves(env: dict, repo: Path) -> str:
    """Run `helios-serve --demo --port 0` until it answers the example question as
    llama.cpp does on the same GGUF; its stderr."""
    from helios_serve.cli import EXAMPLE_QUESTION

    proc = subprocess.Popen([SERVE, "--demo", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=repo)
    try:
        first = proc.stdout.readline()
        assert first.startswith("Helios is serving"), (
            first + (proc.stderr.read() if proc.poll() is not None else ""))
        url = first.split(" at ")[1].split()[0]
        assert EXAMPLE_QUESTION in proc.stdout.readline()  # the `Try:` line asks it
        messages = [{"role": "user", "content": EXAMPLE_QUESTION}]
        model = first.split()[3]
        tokens = httpx.post(url + "/tokenize", timeout=60,
                            json={"model": model, "messages": messages}).json()["tokens"]
        assert tokens == DEMO_REFERENCE["prompt_ids"]  # the prompt llama.cpp answered
        answer = DEMO_REFERENCE["greedy_ids"]
        answer = answer[:answer.index(_LLAMACPP["eos_token_id"])]
        expected = httpx.post(url + "/detokenize", timeout=60,
                              json={"model": model, "tokens": answer}).json()["prompt"]
        assert expected == "The capital of Germany is Berlin."
        r = httpx.post(url + "/v1/chat/completions", timeout=300, json={
            "model": model, "max_tokens": 24, "temperature": 0, "messages": messages})
        choice = r.json()["choices"][0]
        # the quantized core's greedy answer, token for token llama.cpp's on the GGUF
        assert choice["message"]["content"] == expected and choice["finish_reason"] == "stop"
        assert r.json()["usage"]["completion_tokens"] == len(answer) + 1  # and its EOS
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    return proc.stderr.read()


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_demo_prepares_once_keeps_other_versions_cores_and_serves(tmp_path):
    """A core of this export code is exported once and then served as found (the cache
    unchanged); cores of other versions (another checkout's) are kept up to DEMO_KEEP,
    the oldest removed."""
    from helios_serve.cli import DEMO_KEEP

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    repo = Path(__file__).resolve().parents[2]
    demo = tmp_path / "cache" / "helios" / "demo"
    demo.mkdir(parents=True)
    stale = [demo / f"smollm2-135m-instruct-{i:016d}.core" for i in range(DEMO_KEEP)]
    for age, path in enumerate(stale):  # never served: their digests differ
        path.write_bytes(b"exported by another Helios")
        os.utime(path, (1e9 - age, 1e9 - age))  # stale[0] the newest
    err = _demo_serves(env, repo)
    assert "in quantized blocks" in err and "whole-program ggml graphs" in err  # gguf
    assert ("preparing the demo core for this version of the export code (the cached "
            "cores were exported by other versions)") in err
    cores = sorted(demo.glob("smollm2-135m-instruct-*.core"))
    assert len(cores) == DEMO_KEEP and not stale[-1].exists()
    assert [p for p in stale if p.exists()] == stale[:DEMO_KEEP - 1]
    assert (demo / "publisher.key.pub").is_file()
    before = _listing(demo)
    err = _demo_serves(env, repo)  # the same code again: reused, nothing in the cache changes
    assert "preparing" not in err
    assert _listing(demo) == before
