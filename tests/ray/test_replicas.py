"""Helios replicas on a local Ray Serve cluster (helios_serve.ray, docs/deploy.md).

The session's Ray cluster (tests/ray/conftest.py) with Serve started for the module; the
tiny core's application first (2 replicas), then the real SmolLM2 core's replaces it for
the replica-failure test. Each replica is a full helios-serve process.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import httpx
import pytest

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # before Ray reads it: see cli.py
ray = pytest.importorskip("ray")
from helios_serve.ray.app import APP_NAME, REPLICA_DEPLOYMENT, RayOptions, application  # noqa: E402
from helios_serve.ray.ingress import REPLICA_HEADER  # noqa: E402
from helios_serve.ray.prompt import PromptRouting  # noqa: E402
from ray import serve  # noqa: E402

from tests.tiny_model import NAMESPACE, SERVED_ID, ServeProcess  # noqa: E402

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(ray_cluster):
    """Serve on the session's Ray cluster, its HTTP proxy on a free port; yields its URL."""
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()


def _deploy(core, **options) -> None:
    opts = RayOptions(core=str(core.path), trust=(str(core.public_key),), accept=core.namespace,
                      replica_cpus=1, health_check_period_s=1.0, **options)
    serve.run(application(opts), name=APP_NAME, route_prefix="/")


@pytest.fixture(scope="module")
def tiny_app(cluster, tiny_served):
    _deploy(tiny_served.core, replicas=2)
    return cluster


@pytest.fixture(scope="module")
def single(tiny_served):
    """One plain helios-serve of the same core: the reference answers."""
    core = tiny_served.core
    with ServeProcess(core.path, "--trust", core.public_key, "--accept", NAMESPACE) as served:
        yield served.url


def _chat(messages, **extra) -> dict:
    return {"model": SERVED_ID, "messages": messages, "max_tokens": 12, "min_tokens": 12,
            "temperature": 0, "return_token_ids": True, **extra}


def _strip(obj):
    """An answer without what differs between two servers' runs (ids, clocks)."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items()
                if k not in ("id", "created", "system_fingerprint")}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _events(url: str, body: dict) -> tuple[int, list]:
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        return r.status_code, [line[6:] if line == "data: [DONE]" else json.loads(line[6:])
                               for line in lines]


def test_json_and_sse_through_the_ingress_equal_a_single_server(tiny_app, single):
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    ours = httpx.post(tiny_app + "/v1/chat/completions", json=_chat(messages), timeout=120)
    ref = httpx.post(single + "/v1/chat/completions", json=_chat(messages), timeout=120)
    assert ours.status_code == ref.status_code == 200, ours.text
    assert ours.headers[REPLICA_HEADER]
    mine, theirs = ours.json(), ref.json()
    assert len(mine["choices"][0]["token_ids"]) == 12
    mine["usage"].pop("prompt_tokens_details"), theirs["usage"].pop("prompt_tokens_details")
    mine.pop("reused_prompt_tokens", None), theirs.pop("reused_prompt_tokens", None)
    assert _strip(mine) == _strip(theirs)
    body = _chat([{"role": "user", "content": "A poem, please."}], stream=True,
                 stream_options={"include_usage": True})
    status, streamed = _events(tiny_app, body)
    ref_status, ref_streamed = _events(single, body)
    assert status == ref_status == 200
    assert streamed[-1] == "[DONE]" and len(streamed) > 12
    assert _strip(streamed) == _strip(ref_streamed)


def test_models_and_errors_pass_through(tiny_app):
    models = httpx.get(tiny_app + "/v1/models", timeout=30)
    assert models.status_code == 200 and models.json()["data"][0]["id"] == SERVED_ID
    bad = httpx.post(tiny_app + "/v1/chat/completions", timeout=30,
                     json={"model": SERVED_ID, "messages": [], "max_tokens": "x"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


def test_affinity_keeps_a_five_turn_conversation_on_one_replica(tiny_app):
    messages = [{"role": "system", "content": "You are terse."}]
    replicas, reused = [], []
    for turn in range(5):
        messages.append({"role": "user", "content": f"Turn {turn}: go on."})
        r = httpx.post(tiny_app + "/v1/chat/completions", timeout=120,
                       json=_chat(messages, max_tokens=4, min_tokens=4))  # fmt: skip
        assert r.status_code == 200, r.text
        replicas.append(r.headers[REPLICA_HEADER])
        reused.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]
                         ["content"]})  # fmt: skip
    assert len(set(replicas)) == 1, replicas
    assert all(n > 0 for n in reused[1:]), reused


def test_the_ingress_renders_prompts_as_the_server_does(tiny_served, single):
    """The affinity keys hash the token ids a replica's cache holds: the ingress's
    rendering equals the server's own /tokenize, for a chat and for Messages' system."""
    core = tiny_served.core
    routing = PromptRouting.from_core(str(core.path), [str(core.public_key)], core.namespace)
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is a prefix cache?"},
                {"role": "assistant", "content": "Reused pages."},
                {"role": "user", "content": "And a page?"}]
    served = httpx.post(single + "/tokenize", timeout=30,
                        json={"model": SERVED_ID, "messages": messages}).json()["tokens"]
    assert routing.token_ids("/v1/chat/completions", {"messages": messages}) == served
    anthropic = {"system": "Be brief.", "messages": [
        {"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
        for m in messages[1:]]}
    assert routing.token_ids("/v1/messages", anthropic) == served
    view = routing.view("/v1/chat/completions", json.dumps({"messages": messages}).encode())
    assert len(view.keys) == len(served) // routing.page_tokens
    assert routing.view("/v1/chat/completions", b"{not json").keys == ()


def _stored(url: str, stream: bool) -> tuple[str, str]:
    """(response id, replica) of a stored response, created as JSON or as SSE (whose
    response.created event carries the id the ingress remembers)."""
    body = {"model": SERVED_ID, "input": "Remember the word lantern.",
            "max_output_tokens": 4, "stream": stream}
    with httpx.stream("POST", url + "/v1/responses", json=body, timeout=120) as r:
        assert r.status_code == 200
        text = r.read().decode()
        replica = r.headers[REPLICA_HEADER]
    if not stream:
        return json.loads(text)["id"], replica
    created = next(json.loads(line[6:]) for line in text.splitlines()
                   if line.startswith("data: ") and "response.created" in line)
    return created["response"]["id"], replica


@pytest.mark.parametrize("stream", [False, True])
def test_previous_response_id_goes_to_the_replica_that_stored_it(tiny_app, stream):
    rid, home = _stored(tiny_app, stream)
    for _ in range(4):  # unpinned, each would find the response on one replica of two
        r = httpx.post(tiny_app + "/v1/responses", timeout=120, json={
            "model": SERVED_ID, "input": "Which word?", "max_output_tokens": 4,
            "previous_response_id": rid})
        assert r.status_code == 200, r.text
        assert r.headers[REPLICA_HEADER] == home


def test_a_killed_replica_ends_its_stream_with_an_error_and_the_next_requests_succeed(
        cluster, smollm2_core_f32):
    _deploy(smollm2_core_f32, replicas=2)
    body = {"model": "smollm2", "stream": True, "max_tokens": 200,
            "temperature": 0, "messages": [{"role": "user", "content": "Write a long story."}]}
    lines = []
    waiting = {}  # a JSON request in flight on the same replica when it dies

    def post_json() -> None:
        r = httpx.post(cluster + "/v1/chat/completions", timeout=300,
                       json={**body, "stream": False})  # fmt: skip
        waiting.update(status=r.status_code, body=r.json())

    worker = threading.Thread(target=post_json)
    with httpx.stream("POST", cluster + "/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        victim = r.headers[REPLICA_HEADER]
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            lines.append(line[6:])
            if len(lines) == 2:
                # The same prompt: affinity sends it to the victim (its queue of 1 is
                # within the imbalance allowance of the idle replica's 0).
                worker.start()
            if len(lines) == 10:  # mid-stream: kill the replica actor (its server dies too)
                actor = ray.get_actor(f"SERVE_REPLICA::{APP_NAME}#{REPLICA_DEPLOYMENT}#{victim}",
                                      namespace="serve")
                ray.kill(actor, no_restart=True)
    worker.join()
    assert waiting == {"status": 500, "body": {"error": {
        "message": "the replica serving this request failed (ActorDiedError)",
        "type": "server_error", "param": None, "code": None}}}
    assert lines[-1] != "[DONE]"
    error = json.loads(lines[-1])["error"]
    assert error == {"message": "the replica serving this request failed (ActorDiedError)",
                     "type": "server_error", "param": None, "code": None}
    assert all("choices" in json.loads(x) for x in lines[:-1])
    # The controller notices the death and starts a replacement; meanwhile the survivor
    # serves (bounded wait for the router to drop the dead replica).
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = serve.status().applications[APP_NAME].deployments[REPLICA_DEPLOYMENT]
        if status.replica_states.get("RUNNING", 0) < 2:
            break
        time.sleep(0.2)
    for _ in range(2):
        ok = httpx.post(cluster + "/v1/chat/completions", timeout=300,
                        json={**body, "stream": False, "max_tokens": 4})  # fmt: skip
        assert ok.status_code == 200, ok.text
        assert ok.headers[REPLICA_HEADER] != victim
