"""`helios-serve --recipe R --checkpoint PATH`: one command from a checkpoint to a server
(exported once per content, cached, concurrent starts sharing one export), its one-line
failures, and the startup example's API key header."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from helios_serve.bootstrap import StartupError
from helios_serve.cli import CHECKPOINT_NAMESPACE, checkpoint_fingerprint, prepare_checkpoint

from tests.tiny_model import (
    LLAMA_RECIPE,
    SERVED_ID,
    serve_error_line,
    serve_fails,
    write_tiny_checkpoint,
)

pytestmark = pytest.mark.slow

SERVE = str(Path(sys.executable).parent / "helios-serve")
START = "preparing the llama-tiny_served core"


def _start(env: dict[str, str], *args: str | Path) -> subprocess.Popen:
    return subprocess.Popen([SERVE, *map(str, args), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _serving(proc: subprocess.Popen) -> tuple[str, list[str]]:
    """The URL of a started helios-serve and its stdout lines after the first two."""
    first = proc.stdout.readline()
    assert first.startswith(f"Helios is serving {SERVED_ID} at http://127.0.0.1:"), (
        first + (proc.stderr.read() if proc.poll() is not None else ""))
    url = first.split(" at ")[1].split()[0]
    # Answered once serving: a SIGINT before that would interrupt startup instead.
    assert httpx.get(url + "/health", timeout=60).status_code == 200
    return url, [proc.stdout.readline()]


def _stop(proc: subprocess.Popen) -> str:
    """SIGINT, wait; its stderr."""
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, -signal.SIGINT), err
    return err


def _chat(url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=60, headers=headers, json={
        "model": SERVED_ID, "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "user", "content": "Hello, world!"}]})


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_recipe_and_checkpoint_export_once_and_serve(tmp_path):
    """Two starts at once share one export; a third serves the cached core untouched; a
    changed checkpoint byte exports again."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("HELIOS_API_KEY", None)
    checkpoint = write_tiny_checkpoint(tmp_path)
    folder = tmp_path / "cache" / "helios" / "checkpoints"
    args = ("--recipe", LLAMA_RECIPE, "--checkpoint", checkpoint)
    procs = [_start(env, *args) for _ in range(2)]
    errs = []
    try:
        for proc in procs:
            url, _ = _serving(proc)
            r = _chat(url)
            assert r.status_code == 200 and len(r.json()["choices"][0]["message"]["content"])
    finally:
        errs = [_stop(proc) for proc in procs]
    assert sum(err.count(START) for err in errs) == 1  # one exported, the other waited
    assert f"{START} once, into {folder} ..." in "".join(errs)
    cores = sorted(p.name for p in folder.glob("*.core"))
    assert cores == [f"llama-tiny_served-{_digest(checkpoint)}.core"]
    assert sorted(p.name for p in folder.iterdir()) == [".lock", *cores, "publisher.key",
                                                        "publisher.key.pub"]
    assert f"namespace {CHECKPOINT_NAMESPACE}" in errs[0]

    before = _listing(folder)
    proc = _start(env, *args)
    _serving(proc)
    assert START not in _stop(proc)
    assert _listing(folder) == before  # served as found

    weights = checkpoint / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of the last weight: same size, a new content digest
    weights.write_bytes(bytes(data))
    proc = _start(env, *args)
    _serving(proc)
    assert (f"{START} again (the recipe, the checkpoint or the export code changed since "
            "the cached core)") in _stop(proc)
    assert len(list(folder.glob("*.core"))) == 2


def _digest(checkpoint: Path) -> str:
    return checkpoint_fingerprint(LLAMA_RECIPE, checkpoint,
                                  ["--checkpoint-name", checkpoint.name])


def test_checkpoint_fingerprint_covers_content_name_recipe_and_options(tmp_path):
    recipe = tmp_path / "recipe.py"
    recipe.write_text("RECIPE = 1\n")
    code = tmp_path / "code"
    code.mkdir()
    (code / "a.py").write_text("x = 1\n")
    ckpt = tmp_path / "ckpt"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "sub" / "w.bin").write_bytes(b"\x00" * 10)

    def digest(options=("o",)):
        return checkpoint_fingerprint(recipe, ckpt, list(options), [code])

    seen = {digest()}
    assert digest() in seen and len(digest()) == 16
    (ckpt / "sub" / "w.bin").write_bytes(b"\x00" * 9 + b"\x01")  # same size
    seen.add(digest())
    (ckpt / "sub" / "w.bin").rename(ckpt / "w.bin")  # same bytes, another relative path
    seen.add(digest())
    seen.add(digest(("p",)))
    recipe.write_text("RECIPE = 2\n")
    seen.add(digest())
    (code / "a.py").write_text("x = 2\n")
    seen.add(digest())
    assert len(seen) == 6
    gguf = tmp_path / "m.gguf"  # a single file
    gguf.write_bytes(b"GGUF")
    assert len(checkpoint_fingerprint(recipe, gguf, [], [code])) == 16


def _fails(env: dict[str, str], *args: str | Path) -> str:
    """helios-serve ARGS (in this process, `env` over os.environ) exits 2 with one error
    line: the option checks fail before anything loads or starts."""
    return serve_fails(*args, env=env)


def test_recipe_checkpoint_failures_are_one_line_exit_2(tmp_path):
    """The option checks in this process; the failed export through the command's own
    process (it runs `ignition export` as a child)."""
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    checkpoint = write_tiny_checkpoint(tmp_path)
    assert _fails(env, "--recipe", tmp_path / "absent.py", "--checkpoint", checkpoint) == (
        f"helios-serve: error: --recipe {tmp_path / 'absent.py'}: no such file")
    assert _fails(env, "--recipe", LLAMA_RECIPE, "--checkpoint", tmp_path / "absent") == (
        f"helios-serve: error: --checkpoint {tmp_path / 'absent'}: no such file or directory")
    assert _fails(env, "--recipe", LLAMA_RECIPE, "--checkpoint", "smollm2").endswith(
        "no such file or directory (the embedded SmolLM2: use --demo)")
    assert _fails(env, "--recipe", LLAMA_RECIPE) == (
        "helios-serve: error: --recipe needs --checkpoint PATH (a .gguf file or a "
        "safetensors directory)")
    assert _fails(env, "--checkpoint", checkpoint) == (
        "helios-serve: error: --checkpoint needs --recipe RECIPE")
    assert _fails(env, "x.core", "--recipe", LLAMA_RECIPE, "--checkpoint", checkpoint) == (
        "helios-serve: error: --recipe and --checkpoint take no CORE, --trust or --accept "
        "(the core they export is signed by a local key)")
    assert "--demo takes no" in _fails(env, "--demo", "--recipe", LLAMA_RECIPE)
    # Options that need no core are refused before any export (a first --demo takes a minute).
    for first in (("--demo",), ("--recipe", LLAMA_RECIPE, "--checkpoint", checkpoint)):
        assert _fails(env, *first, "--engine-process", "--world", "2") == (
            "helios-serve: error: --engine-process does not serve process ranks (--world) yet")
        assert _fails(env, *first, "--resource-key", tmp_path / "absent.key") == (
            f"helios-serve: error: cannot read resource key {tmp_path / 'absent.key'}: "
            "No such file or directory")
        # These were refused only once the exported core loaded.
        assert _fails(env, *first, "--max-active", "0") == (
            "helios-serve: error: --max-active must be at least 1")
        assert _fails(env, *first, "--num-pages", "8", "--kv-cache-memory", "1GiB") == (
            "helios-serve: error: --num-pages and --kv-cache-memory are exclusive: choose "
            "one way to size the KV cache")
        assert _fails(env, *first, "--rank", "1") == (
            "helios-serve: error: --rank, --peers and --rank-key need --world N")
        assert _fails(env, *first, "--world", "2", "--rank", "5") == (
            "helios-serve: error: --rank 5 is outside [0, 2) for --world 2")
        assert _fails(env, *first, "--responses-db", tmp_path / "absent" / "r.db") == (
            f"helios-serve: error: {tmp_path / 'absent' / 'r.db'}: unable to open database "
            "file")
    assert not (tmp_path / "cache").exists()
    bad = tmp_path / "bad"  # a directory without safetensors: ignition export fails
    bad.mkdir()
    proc = subprocess.run([SERVE, "--recipe", str(LLAMA_RECIPE), "--checkpoint", str(bad),
                           "--port", "0"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})
    folder = tmp_path / "cache" / "helios" / "checkpoints"
    progress, line = proc.stderr.splitlines()  # the export's progress line, then the error
    assert proc.returncode == 2 and progress == f"preparing the llama-bad core once, into {folder} ..."
    # One prefix: the export's own `ignition: error: ` is dropped.
    assert line == f"helios-serve: error: llama-bad export failed: {bad}: no config.json", line
    assert not list(folder.glob("*.core")) and not list(folder.glob(".*.partial"))


def test_a_busy_port_is_reported_before_the_export(tmp_path):
    """It was reported after the whole export (minutes for a large checkpoint); a wrong
    --recipe or --checkpoint path is still reported first (with the demo serving on the
    default port, a missing recipe was reported as the busy port)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    checkpoint = write_tiny_checkpoint(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert serve_fails("--recipe", tmp_path / "absent.py", "--checkpoint", checkpoint,
                           "--port", str(port), env={"XDG_CACHE_HOME": env["XDG_CACHE_HOME"]}) == (
            f"helios-serve: error: --recipe {tmp_path / 'absent.py'}: no such file")
        assert serve_fails("--recipe", LLAMA_RECIPE, "--checkpoint", tmp_path / "absent",
                           "--port", str(port), env={"XDG_CACHE_HOME": env["XDG_CACHE_HOME"]}) == (
            f"helios-serve: error: --checkpoint {tmp_path / 'absent'}: no such file or directory")
        proc = subprocess.run([SERVE, "--recipe", str(LLAMA_RECIPE), "--checkpoint",
                               str(checkpoint), "--port", str(port)],
                              capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stderr
    assert serve_error_line(proc.stderr) == (
        f"helios-serve: error: cannot listen on 127.0.0.1:{port}: Address already in use")
    assert "preparing" not in proc.stderr  # nothing was exported
    assert not (tmp_path / "cache" / "helios").exists()


def test_recipe_without_ignition_is_one_line(tmp_path, monkeypatch):
    """No `ignition` beside the interpreter or on PATH: the one line names the package."""
    checkpoint = write_tiny_checkpoint(tmp_path)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(StartupError) as caught:
        prepare_checkpoint(str(LLAMA_RECIPE), str(checkpoint))
    assert str(caught.value) == ("--recipe needs the `ignition` command (install "
                                 "helios-ignition, part of the Helios workspace)")
    assert not (tmp_path / "cache").exists()  # nothing read or written before the check


def test_api_key_example_carries_the_header(tiny_served, tmp_path):
    """The printed curl example works when pasted into a shell whose HELIOS_API_KEY holds
    the key; the key itself is never printed."""
    core = tiny_served.core
    secret = "s3cret-key-42"
    for source, env in (("env", {"HELIOS_API_KEY": secret}), ("option", {})):
        extra = ("--api-key", secret) if source == "option" else ()
        base = {k: v for k, v in os.environ.items() if k != "HELIOS_API_KEY"}
        proc = _start({**base, **env}, core.path, "--trust", core.public_key, "--accept",
                      core.namespace, *extra)
        try:
            url, (try_line,) = _serving(proc)
            note = proc.stdout.readline() if source == "option" else ""
            assert try_line.startswith(f'Try: curl {url}/v1/chat/completions -H '
                                       f'"Authorization: Bearer $HELIOS_API_KEY" '), try_line
            assert secret not in try_line + note
            if source == "option":
                assert note == ("(the example reads the key from $HELIOS_API_KEY: set it to "
                                "the --api-key value first)\n")
            command = try_line.removeprefix("Try: ").strip()
            pasted = subprocess.run(["bash", "-c", command + " -s -w '\\n%{http_code}'"],
                                    capture_output=True, text=True, timeout=120,
                                    env={**base, "HELIOS_API_KEY": secret})
            assert pasted.stdout.rsplit("\n", 1)[1] == "200", pasted.stdout
            without = subprocess.run(["bash", "-c", command + " -s -o /dev/null -w "
                                      "'%{http_code}'"], capture_output=True, text=True,
                                     timeout=120, env=base)
            assert without.stdout == "401"
        finally:
            _stop(proc)


def _slots_capacity(url: str) -> float:
    metrics = httpx.get(url + "/metrics", timeout=30).text
    (line,) = [x for x in metrics.splitlines() if x.startswith("helios_request_slots_capacity ")]
    return float(line.split()[1])


def test_inspect_reports_the_concurrency_the_server_runs(tiny_served):
    """`helios-tools inspect` says what helios-serve runs at once: the core's default
    (not its captured concurrency) without --max-active, the request slots at most."""
    core = tiny_served.core
    tools = str(Path(sys.executable).parent / "helios-tools")
    text = subprocess.run([tools, "inspect", str(core.path)], capture_output=True, text=True,
                          timeout=60, check=True).stdout
    (line,) = [x for x in text.splitlines() if x.startswith("concurrency  ")]
    assert line == ("concurrency  serves 8 requests at once by default (serving default "
                    "max_active 8); --max-active up to 64 request slots; captured "
                    "concurrency 64")
    served = {}
    env = {k: v for k, v in os.environ.items() if k != "HELIOS_API_KEY"}
    for extra in ((), ("--max-active", "100")):
        proc = _start(env, core.path, "--trust", core.public_key, "--accept", core.namespace,
                      *extra)
        try:
            url, _ = _serving(proc)
            served[extra] = _slots_capacity(url)
        finally:
            _stop(proc)
    assert served == {(): 8.0, ("--max-active", "100"): 64.0}
