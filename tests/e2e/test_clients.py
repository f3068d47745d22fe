"""Real clients, unchanged, against helios-serve: the official openai client, litellm,
langchain-openai, instructor and guidellm (issue 14, "Done when").

The tiny-model server (real weights, real kernels on the CPU) serves the clients whose
answers need no meaning; structured output through langchain and instructor uses the
scripted server, whose answer is chosen, so the parsed object can be checked exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from helios_serve.testing.harness import ScriptedServer
from pydantic import BaseModel


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)  # fmt: skip


def test_openai_client_against_the_tiny_model(tiny_server):
    client = _client(tiny_server)
    name = tiny_server.settings.served_name
    messages = [{"role": "user", "content": "hello"}]
    r = client.chat.completions.create(model=name, messages=messages, max_tokens=6, user="u1",
                                       seed=3, temperature=0.8)  # fmt: skip
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 6
    again = client.chat.completions.create(model=name, messages=messages, max_tokens=6,
                                           user="u1", seed=3, temperature=0.8)  # fmt: skip
    assert again.choices[0].message.content == r.choices[0].message.content  # seeded
    r = client.chat.completions.create(model=name, messages=messages, max_tokens=6, n=2,
                                       seed=3, temperature=0.8)  # fmt: skip
    assert [c.index for c in r.choices] == [0, 1]
    # Choice 0 of a seeded n=2 request is the seeded n=1 answer (choice i: seed + i).
    assert r.choices[0].message.content == again.choices[0].message.content
    chunks = list(client.chat.completions.create(model=name, messages=messages, max_tokens=6,
                                                 stream=True))  # fmt: skip
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    c = client.completions.create(model=name, prompt="once upon a time", max_tokens=5)
    assert c.object == "text_completion" and c.usage.completion_tokens <= 5
    assert client.models.retrieve(name).id == name
    with pytest.raises(openai.InternalServerError) as info:  # raised at once: no retry
        openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="x").chat.completions.create(
            model=name, messages=messages, max_tokens=10_000)
    assert info.value.code == "context_length_exceeded"


def test_litellm(tiny_server):
    import litellm

    name = tiny_server.settings.served_name
    kwargs = dict(model=f"openai/{name}", api_base=tiny_server.url + "/v1", api_key="unused",
                  messages=[{"role": "user", "content": "hello"}], max_tokens=5, user="u1")
    r = litellm.completion(**kwargs)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 5
    pieces = [c.choices[0].delta.content or "" for c in litellm.completion(**kwargs, stream=True)]
    assert len(pieces) >= 1


class City(BaseModel):
    name: str
    country: str


@pytest.fixture(scope="module")
def scripted_json():
    # Context 2048 tokens: instructor's JSON-mode system prompt is long.
    with ScriptedServer(geometry={"max_pages_per_request": 512, "num_pages": 1024}) as server:
        server.book.add("Paris", server.tok.byte_ids(b'{"name": "Paris", "country": "France"}'))
        yield server


def test_langchain_with_structured_output(scripted_json):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=scripted_json.model_name, base_url=scripted_json.url + "/v1",
                     api_key="unused", max_retries=0)  # fmt: skip
    city = llm.with_structured_output(City).invoke("Tell me about Paris.")
    assert city == City(name="Paris", country="France")
    plain = llm.invoke("say hi")
    assert plain.content == "Hello, world!"


def test_instructor_json_mode(scripted_json):
    import instructor

    client = instructor.from_openai(_client(scripted_json), mode=instructor.Mode.JSON)
    city = client.chat.completions.create(
        model=scripted_json.model_name, response_model=City, max_retries=0,
        messages=[{"role": "user", "content": "Tell me about Paris."}])
    assert city.model_dump() == {"name": "Paris", "country": "France"}


def test_guidellm_short_benchmark(tiny_server, tmp_path):
    """guidellm sends stream_options.continuous_usage_stats and ignore_eos; a bounded
    synchronous run of four requests must complete with no errored request."""
    processor = tmp_path / "tokenizer"
    processor.mkdir()
    (processor / "tokenizer.json").write_text(tiny_server.bootstrap.tokenizer_json)
    (processor / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>"}))
    out = tmp_path / "guidellm.json"
    guidellm = Path(sys.executable).parent / "guidellm"
    proc = subprocess.run(
        [str(guidellm), "benchmark", "run", "--target", tiny_server.url,
         "--model", tiny_server.settings.served_name, "--processor", str(processor),
         "--data", "prompt_tokens=24,output_tokens=8", "--rate-type", "synchronous",
         "--max-requests", "4", "--disable-progress", "--output-path", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    totals = report["benchmarks"][0]["request_totals"]
    assert totals == {"successful": 4, "incomplete": 0, "errored": 0, "total": 4}, totals
