"""/v1/responses with real clients against the tiny-model server (real weights, real
kernels on the CPU; model worker thread and engine process): the official openai client,
litellm.responses and langchain-openai with use_responses_api=True; the --responses-db
file store across a restart and its startup refusal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from helios_serve.cli import start
from helios_serve.config import ServeOptions
from prometheus_client.parser import text_string_to_metric_families

from tests.tiny_model import serve_error_line


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)  # fmt: skip


def _counter(server, name: str) -> float:
    for family in text_string_to_metric_families(httpx.get(server.url + "/metrics").text):
        for s in family.samples:
            if s.name == name and not s.labels:
                return s.value
    raise KeyError(name)


def test_openai_responses_stream_and_not(tiny_server):
    client = _client(tiny_server)
    name = tiny_server.settings.served_name
    r = client.responses.create(model=name, input="hello", max_output_tokens=6, temperature=0)
    assert r.status in ("completed", "incomplete") and r.usage.output_tokens <= 6
    events = list(client.responses.create(model=name, input="hello", max_output_tokens=6,
                                          temperature=0, stream=True))  # fmt: skip
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert events[-1].type == f"response.{r.status}"
    final = events[-1].response
    assert "".join(deltas) == final.output_text == r.output_text  # greedy: the same text
    assert final.usage.output_tokens == r.usage.output_tokens


def test_previous_response_id_prefills_only_the_new_turn(tiny_server):
    client = _client(tiny_server)
    name = tiny_server.settings.served_name
    first = client.responses.create(model=name, input="Tell me a story.", temperature=0,
                                    max_output_tokens=12)  # fmt: skip
    committed = first.usage.input_tokens + first.usage.output_tokens - 1  # the last id unfed
    hits = _counter(tiny_server, "helios_prefix_cache_hit_tokens_total")
    second = client.responses.create(model=name, input="And then?", temperature=0,
                                     previous_response_id=first.id, max_output_tokens=4)
    assert second.usage.input_tokens_details.cached_tokens == committed
    assert _counter(tiny_server, "helios_prefix_cache_hit_tokens_total") - hits == committed
    items = client.responses.input_items.list(second.id, order="asc").data
    assert [i.role for i in items] == ["user", "assistant", "user"]
    assert items[1].content[0].text == first.output_text


def test_litellm_responses(tiny_thread_server):
    litellm = pytest.importorskip("litellm")
    server = tiny_thread_server
    r = litellm.responses(model="openai/" + server.settings.served_name, input="hello",
                          max_output_tokens=16, api_base=server.url + "/v1",
                          api_key="unused")  # (litellm raises a smaller limit to 16)
    assert r.status in ("completed", "incomplete") and r.usage.output_tokens <= 16
    assert r.output[0].type == "message"


def test_langchain_openai_with_the_responses_api(tiny_thread_server):
    langchain_openai = pytest.importorskip("langchain_openai")
    server = tiny_thread_server
    llm = langchain_openai.ChatOpenAI(model=server.settings.served_name,
                                      base_url=server.url + "/v1", api_key="unused",
                                      use_responses_api=True, max_tokens=5, max_retries=0)
    message = llm.invoke("hello")
    assert message.response_metadata["id"].startswith("resp_")
    assert message.usage_metadata["output_tokens"] <= 5
    assert isinstance(message.text, str)


def test_a_responses_db_file_outlives_the_server(tiny_served, tmp_path):
    core = tiny_served.core
    options = ServeOptions(port=0, max_active=2, queue_capacity=2,
                           responses_db=str(tmp_path / "responses.db"))  # fmt: skip
    servers = []
    try:
        for _ in range(2):
            server = start(core.path, [str(core.public_key)], core.namespace, options)
            server.serve_in_background()
            servers.append(server)
            client = _client(server)
            if len(servers) == 1:
                first = client.responses.create(model=server.settings.served_name,
                                                input="hello", max_output_tokens=3)  # fmt: skip
                server.stop()
            else:
                assert client.responses.retrieve(first.id).model_dump() == first.model_dump()
    finally:
        servers[-1].stop()
        for server in servers:
            server.bootstrap.close()


def test_a_foreign_responses_db_fails_startup_in_one_line(tiny_served, tmp_path):
    foreign = tmp_path / "notes.db"
    foreign.write_text("not a database, only text " * 20)
    core = tiny_served.core
    proc = subprocess.run([str(Path(sys.executable).parent / "helios-serve"), str(core.path),
                           "--trust", str(core.public_key), "--accept", core.namespace,
                           "--port", "0", "--responses-db", str(foreign)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert serve_error_line(proc.stderr) == \
        f"helios-serve: error: {foreign}: file is not a database"
