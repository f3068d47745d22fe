"""HTTP round trip: `helios-serve CORE --backend cuda` answers the openai client."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_openai_chat_round_trip_on_cuda(core_path, tmp_path):
    openai = pytest.importorskip("openai")
    path, key = core_path
    port = _free_port()
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from helios_serve.cli import main; main()", str(path),
         "--trust", str(key) + ".pub", "--accept", "gpu.test", "--backend", "cuda",
         "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        deadline = time.time() + 240
        while True:
            try:
                models = client.models.list()
                break
            except Exception:
                if proc.poll() is not None or time.time() > deadline:
                    log.seek(0)
                    pytest.fail("server did not start:\n" + log.read()[-4000:])
                time.sleep(1)
        name = models.data[0].id
        r = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=16, temperature=0)
        text = r.choices[0].message.content
        print("cuda answer:", repr(text))
        assert "Paris" in text
        stream = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8,
            temperature=0.7, seed=5, stream=True)
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert "".join(pieces)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.seek(0)
        Path(tmp_path / "serve.log").write_text(log.read())
