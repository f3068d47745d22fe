"""Gemma 3 270M served over HTTP: a real helios-serve (Bootstrap -> NativeModel on the cpu
backend -> Server) on a free port of 127.0.0.1 around the core of recipes/gemma3_270m.py,
spoken to with the OpenAI client. Its greedy chat completion is llama.cpp's on the same
GGUF (tests/golden/gemma3/llamacpp_reference.json): the recipe's chat template renders
the prompt, the converted SentencePiece vocabulary tokenizes it, the windowed and global
layers run, and the text is detokenized."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helios_serve.bootstrap import Bootstrap
from helios_serve.clock import ObservationClock
from helios_serve.config import ServeOptions, resolve
from helios_serve.runtime.native_model import NativeModel
from helios_serve.server import Server
from helios_tools.frontend_assets import load_tokenizer

REFERENCE = json.loads((Path(__file__).parents[1] / "golden" / "gemma3" /
                        "llamacpp_reference.json").read_text())

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def gemma3_server(gemma3_core):
    bootstrap = Bootstrap.load(gemma3_core.path, [gemma3_core.public_key],
                               gemma3_core.namespace)
    settings = resolve(ServeOptions(port=0, max_active=2, queue_capacity=4), bootstrap.contract)
    model = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu",
                             max_concurrency=settings.max_active)
    server = Server.start(bootstrap, model, settings, ObservationClock())
    yield server, bootstrap
    server.stop()
    bootstrap.close()


def test_greedy_chat_completion_is_llama_cpps(gemma3_server):
    import openai

    server, bootstrap = gemma3_server
    prompt = next(p for p in REFERENCE["prompts"] if p["name"] == "france")
    # Steps 0-6 are decided (reference margins >= 0.5); step 7 is a near-tie (0.08).
    ids = [s["id"] for s in prompt["steps"][:7]]
    tokenizer = load_tokenizer(bootstrap.core.read_resource("tokenizer.json").decode())
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                           timeout=300.0)
    reply = client.chat.completions.create(model="gemma3-270m", messages=prompt["messages"],
                                           max_tokens=len(ids), temperature=0)
    assert reply.choices[0].message.content == tokenizer.decode(ids)
    assert reply.choices[0].message.content == "What is the capital of France?"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens == len(prompt["prompt_ids"])
    assert reply.usage.completion_tokens == len(ids)
