"""The vision tower on the cuda backend (device machine only, ``pytest -m gpu``):

- every vision kernel (kernels_triton/vision.py) against its NumPy reference, at the
  tiny fixture's and at SmolVLM-256M's geometry (1024 patches a window, 768 wide, 12
  heads), with fewer live windows than captured;
- the tiny Idefics3 core (tests/fixtures/idefics3_tiny), compiled for this GPU, served
  by ``helios-serve --backend cuda`` through the openai client: transformers' prompt ids
  and greedy tokens, as the cpu backend gives them (tests/e2e/test_vision.py).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from gpu_harness import bf16_round
from helios_tools import kernels as K

pytestmark = pytest.mark.gpu
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "idefics3_tiny"


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "GPU output holds NaN/inf (unwritten or poisoned)"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# (windows captured, S, P, D, heads, shuffle R): the tiny fixture, SmolVLM-256M
GEOMETRIES = [(5, 64, 16, 32, 2, 2), (3, 512, 16, 768, 12, 4)]


@pytest.mark.parametrize("W,S,P,D,H,R", GEOMETRIES)
def test_vision_kernels(gpu, W, S, P, D, H, R):
    rng = np.random.default_rng(W * S)
    G, NP, HD = S // P, (S // P) ** 2, D // H
    T = W * NP
    count = np.array([W - 1], np.int32)  # the last captured window is dead
    windows = rng.standard_normal((W, 3, S, S)).astype(np.float32)
    ref = np.zeros((T, 3 * P * P), np.float32)
    K.patchify(windows, count, ref, W, S, P)
    got = gpu.run("patchify", windows, count, np.full_like(ref, np.nan), W, S, P)["out"]
    assert rel(got, ref) == 0.0
    x = rng.standard_normal((T, D)).astype(np.float32)
    bits, pos = bf16_round(rng.standard_normal((NP, D)).astype(np.float32))
    ref = x.copy()
    K.position_add(ref, pos, T, NP, D)
    got = gpu.run("position_add", x.copy(), bits, T, NP, D, bf16=("positions",))["x"]
    assert rel(got, ref) < 1e-7
    g, b = rng.standard_normal(D).astype(np.float32), rng.standard_normal(D).astype(np.float32)
    ref = np.zeros_like(x)
    K.layernorm(x, g, b, ref, T, D, 1e-6)
    got = gpu.run("layernorm", x, g, b, np.full_like(x, np.nan), T, D, 1e-6)["out"]
    assert rel(got, ref) < 1e-6
    ref = x.copy()
    K.bias_add(ref, b, T, D)
    assert rel(gpu.run("bias_add", x.copy(), b, T, D)["x"], ref) == 0.0
    big = 4 * x
    ref = np.zeros_like(x)
    K.gelu_tanh(big, ref, T, D)
    assert rel(gpu.run("gelu_tanh", big, np.full_like(x, np.nan), T, D)["out"], ref) < 1e-6
    qkv = rng.standard_normal((T, 3 * D)).astype(np.float32)
    ref = np.zeros((T, D), np.float32)
    K.window_attention(qkv, count, ref, W, NP, H, HD, 1 / np.sqrt(HD))
    got = gpu.run("window_attention", qkv, count, np.full_like(ref, np.nan), W, NP, H, HD,
                  float(1 / np.sqrt(HD)))["out"]
    assert rel(got, ref) < 1e-5
    F = T // (R * R)
    ref = np.zeros((F, D * R * R), np.float32)
    K.pixel_shuffle(x, ref, W, G, D, R)
    got = gpu.run("pixel_shuffle", x, np.full_like(ref, np.nan), W, G, D, R)["out"]
    assert rel(got, ref) == 0.0
    index = rng.integers(-1, F, T).astype(np.int32)
    feats = rng.standard_normal((F, D)).astype(np.float32)
    ref = x.copy()
    K.image_merge(feats, index, ref, T, F, D)
    assert rel(gpu.run("image_merge", feats, index, x.copy(), T, F, D)["x"], ref) == 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tiny_idefics3_on_cuda_equals_transformers(gpu, tmp_path):
    openai = pytest.importorskip("openai")
    from helios_ignition.export import export_core
    from helios_tools.core import generate_key, write_key_pair

    key = tmp_path / "key.pem"
    write_key_pair(generate_key(), key)
    core = tmp_path / "idefics3-tiny.core"
    export_core(FIXTURE / "recipe.py", checkpoint=str(FIXTURE / "checkpoint"), key_path=key,
                namespace="gpu.test", out=core, weight_dtype="f32", targets=(gpu.target,))
    meta = json.loads((FIXTURE / "reference.json").read_text())
    ids = np.load(FIXTURE / "reference.npz")["input_ids"].tolist()
    port = _free_port()
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from helios_serve.cli import main; main()", str(core),
         "--trust", str(key) + ".pub", "--accept", "gpu.test", "--backend", "cuda",
         "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                               max_retries=0)
        deadline = time.time() + 240
        while True:
            try:
                client.models.list()
                break
            except Exception:
                if proc.poll() is not None or time.time() > deadline:
                    log.seek(0)
                    pytest.fail("server did not start:\n" + log.read()[-4000:])
                time.sleep(1)

        def url(name: str) -> str:
            return "data:image/png;base64," + base64.b64encode(
                (FIXTURE / name).read_bytes()).decode()

        messages = [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url("wide.png")}},
            {"type": "text", "text": "Compare the two images."},
            {"type": "image_url", "image_url": {"url": url("square.png")}},
            {"type": "text", "text": "What is in this image?"}]}]
        reply = client.chat.completions.create(
            model="idefics3-tiny", messages=messages, max_tokens=8, temperature=0,
            extra_body={"return_token_ids": True, "ignore_eos": True})
        prompt = [meta["image_token_id"] if t == meta["vocab"] else t
                  for t in reply.model_extra["prompt_token_ids"]]
        assert prompt == ids
        assert reply.choices[0].model_extra["token_ids"] == meta["greedy"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
