"""Gemma 3 270M served over HTTP: a real helios-serve (Bootstrap -> NativeModel on the cpu
backend -> Server) on a free port of 127.0.0.1 around the core of recipes/gemma3_270m.py,
spoken to with the OpenAI client. Its greedy chat completion is llama.cpp's on the same
GGUF (tests/golden/gemma3/llamacpp_reference.json): the recipe's chat template renders
the prompt, the converted SentencePiece vocabulary tokenizes it, the windowed and global
layers run, and the text is detokenized."""

from __future__ import annotations

import json
import time
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


def _metric(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.split(" ")[0] == name)


def test_a_chat_past_the_window_frees_window_pages(gemma3_server):
    """A 982-token text as the user turn, past the local layers' 512-token window: the
    window pool (helios_cache_window_pages_*) gives back exactly the pages behind the
    window, then every page at the end; the paged region's gauge counts its own pages."""
    import httpx
    import openai

    server, bootstrap = gemma3_server
    text = next(p for p in REFERENCE["prompts"] if p["name"] == "long_text")["rendered"]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                           timeout=600.0)
    before = httpx.get(server.url + "/metrics", timeout=30).text
    window = bootstrap.prepared.serving.model.cache.regions[1]
    assert window.window_tokens == 512
    # 8 decode slots x (ceil((512 + 256 - 1) / 16) + 1) pages (capture's window pool)
    assert _metric(before, "helios_cache_window_pages_capacity") == 8 * 49
    reply = client.chat.completions.create(
        model="gemma3-270m", messages=[{"role": "user", "content": text.removeprefix("<bos>")}],
        max_tokens=20, temperature=0)
    computed = reply.usage.prompt_tokens + reply.usage.completion_tokens - 1
    assert computed > 512 + 16
    released = (computed - 512 + 1) // 16  # pages wholly behind the last query's window
    for _ in range(300):  # the worker publishes its gauges once idle
        after = httpx.get(server.url + "/metrics", timeout=30).text
        if _metric(after, "helios_cache_window_pages_used") == 0:
            break
        time.sleep(0.1)
    assert _metric(after, "helios_cache_window_pages_used") == 0
    assert _metric(after, "helios_cache_pages_used") == 0
    assert (_metric(after, "helios_cache_window_pages_released_total")
            - _metric(before, "helios_cache_window_pages_released_total")) == released
