"""One Ray Serve replica on one GPU: `helios-serve-ray`'s cuda path (docs/deploy.md).

N replicas on one card are not meaningful (they split its memory and compute), so this
checks one replica given the card by Ray (`--replica-gpus 1`, `--backend cuda`) answers
as a plain `helios-serve --backend cuda` does. Needs `ray[serve]` on the device machine.
"""

from __future__ import annotations

import os
import socket

import pytest

pytestmark = pytest.mark.gpu


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_gpu_replica_answers_greedy_chat(core_path):
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # before Ray reads it
    ray = pytest.importorskip("ray")
    import httpx
    from helios_serve.ray.app import APP_NAME, RayOptions, application
    from helios_serve.ray.ingress import REPLICA_HEADER
    from ray import serve

    path, key = core_path
    ray.init(num_gpus=1, include_dashboard=False, logging_level="WARNING")
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(application(RayOptions(
            core=str(path), trust=(str(key) + ".pub",), accept="gpu.test", replicas=1,
            replica_gpus=1, serve_args=("--backend", "cuda"))), name=APP_NAME, route_prefix="/")
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=300, json={
            "model": "smollm2", "max_tokens": 8, "min_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 8
        assert r.headers[REPLICA_HEADER]
    finally:
        serve.shutdown()
        ray.shutdown()
