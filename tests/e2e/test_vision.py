"""Images in, text out: the tiny Idefics3 core (tests/fixtures/idefics3_tiny) exported,
linted and served on the cpu backend, checked against transformers' reference
(make_reference.py there) through the official openai client; every bad image a 400.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import openai
import pytest
from helios_serve.bootstrap import Bootstrap
from helios_serve.clock import ObservationClock
from helios_serve.config import ServeOptions, resolve
from helios_serve.runtime.native_model import NativeModel
from helios_serve.server import Server

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "idefics3_tiny"
REFERENCE = np.load(FIXTURE / "reference.npz")
META = json.loads((FIXTURE / "reference.json").read_text())
NAMESPACE = "example.org/helios-vision-tests"


def data_url(name: str, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode((FIXTURE / name).read_bytes()).decode()


@pytest.fixture(scope="module")
def vision_core(tmp_path_factory, signing_key_pair):
    from helios_ignition.export import export_core

    private, public = signing_key_pair
    out = tmp_path_factory.mktemp("vision") / "idefics3-tiny.core"
    export_core(FIXTURE / "recipe.py", checkpoint=str(FIXTURE / "checkpoint"),
                key_path=private, namespace=NAMESPACE, out=out)
    return out, public


@pytest.fixture(scope="module")
def server(vision_core):
    path, public = vision_core
    bootstrap = Bootstrap.load(path, [public], NAMESPACE)
    settings = resolve(ServeOptions(port=0, max_active=2, queue_capacity=4), bootstrap.contract)
    model = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu",
                             max_concurrency=settings.max_active)
    server = Server.start(bootstrap, model, settings, ObservationClock())
    yield server
    server.stop()
    bootstrap.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120.0)


MESSAGES = [{"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": data_url("wide.png"), "detail": "high"}},
    {"type": "text", "text": "Compare the two images."},
    {"type": "image_url", "image_url": {"url": data_url("square.png")}},
    {"type": "text", "text": "What is in this image?"}]}]


def test_lint_passes_on_cpu(vision_core):
    from helios_tools.core import open_core
    from helios_tools.lint import lint_core

    path, public = vision_core
    with open_core(path, [public.read_bytes()]) as core:
        assert [f.rule for f in lint_core(core, acceptance=NAMESPACE, backends=("cpu",))] == []
        cuda = lint_core(core, acceptance=NAMESPACE, backends=("cuda",))
    assert [(f.rule, f.path) for f in cuda] == [
        ("runtime.image", "model.frontend.image_preparation"),
        ("runtime.image", "model.frontend.image_layout")]


def test_greedy_equals_transformers(client):
    reply = client.chat.completions.create(
        model="idefics3-tiny", messages=MESSAGES, max_tokens=8, temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True})
    sentinel = META["vocab"]  # Helios' nonsampled sentinel where the processor has <image>
    prompt = [META["image_token_id"] if t == sentinel else t
              for t in reply.model_extra["prompt_token_ids"]]
    assert prompt == REFERENCE["input_ids"].tolist()
    assert reply.choices[0].model_extra["token_ids"] == META["greedy"]
    assert reply.usage.prompt_tokens == len(REFERENCE["input_ids"]) == 94
    assert reply.usage.completion_tokens == 8
