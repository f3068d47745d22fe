"""Chat templates at startup and per request: a template that loads other templates or
exceeds its limits on one message fails startup; one that exceeds them only for some
conversations fails those requests with 400 and keeps serving."""

from __future__ import annotations

import httpx
import pytest
from helios_serve.bootstrap import Bootstrap, StartupError
from helios_serve.clock import ObservationClock
from helios_serve.config import ServeOptions, resolve
from helios_serve.server import Server
from helios_serve.testing.scripted import ScriptBook, ScriptedModel, tiny_geometry
from helios_serve.testing.tiny import SERVED_ID, tiny_contract
from helios_serve.testing.tokenizer import CHAT_TEMPLATE


def _bootstrap(tok, template: str) -> Bootstrap:
    return Bootstrap.from_parts(tiny_contract(tok), tok.to_json(), template)


@pytest.mark.parametrize(("template", "why"), [
    ('{% include "system.jinja" %}' + CHAT_TEMPLATE,
     "bad chat template: chat template uses {% include %} (line 1): a chat template cannot "
     "load other templates"),
    ('{% extends "base.jinja" %}',
     "bad chat template: chat template uses {% extends %} (line 1): a chat template cannot "
     "load other templates"),
    ("{{ 'a' * 10**10 }}" + CHAT_TEMPLATE,
     "bad chat template: chat template exceeded its limits: the * operator would create "
     "10000000000 items; the limit is 4194304"),
    ("{% for m in messages %}", "bad chat template: chat template does not compile: "),
])
def test_startup_refuses_templates_that_cannot_serve(tok, template, why):
    with pytest.raises(StartupError) as info:
        _bootstrap(tok, template)
    assert str(info.value).startswith(why)


def test_a_template_refusing_some_conversations_still_starts(tok):
    template = "{{ raise_exception('needs a system message') }}"
    assert _bootstrap(tok, template).chat_template == template


def test_a_request_past_the_limits_is_a_400_and_serving_goes_on(tok):
    # Three or more messages repeat the first one's text 10**7 times.
    template = ("{% if messages|length > 2 %}{{ messages[0]['content'] * 10**7 }}{% endif %}"
                + CHAT_TEMPLATE)
    bootstrap = _bootstrap(tok, template)
    book = ScriptBook(tok.decode, default=tok.ids(["Hello", "!"]))
    model = ScriptedModel(tiny_geometry(tok.vocab_size), book)
    options = ServeOptions(port=0, max_active=2, queue_capacity=2, frontend_workers=1)
    server = Server.start(bootstrap, model, resolve(options, bootstrap.contract),
                          ObservationClock())
    try:
        url = server.url + "/v1/chat/completions"
        many = [{"role": "user", "content": "abc"}] * 3
        r = httpx.post(url, json={"model": SERVED_ID, "messages": many}, timeout=30)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "messages"
        assert error["message"] == ("messages: chat template exceeded its limits: the * "
                                    "operator would create 30000000 items; the limit is 4194304")
        ok = httpx.post(url, json={"model": SERVED_ID, "messages": many[:1]}, timeout=30)
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "Hello!"
    finally:
        server.stop()
