"""Speculative generation on the real model (SmolLM2-135M-Instruct, CPU backend): greedy
output equals the decode programs' output token for token, alone and in a batch of 8
(the specification, "Complete speculative generation"; the verify rows use the same
row-invariant kernels as decode, so this holds by construction, not by luck); so does
seeded sampled output (coupled verification: every emitted token is the target's own
draw) at W = 1..4, under the fixed and the adaptive width policy, alone and in a batch.

The head is the committed trained drafter when recipes/drafters/ has it, else a seeded
random head (then few drafts are accepted and the identity is mostly width-one rounds).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helios_serve.runtime import NativeModel
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native
from helios_tools.core import authorize, load_public_key, open_core

REPO = Path(__file__).resolve().parents[2]
GOLDENS = json.loads((REPO / "tests" / "golden" / "smollm2_goldens.json").read_text())
PROMPTS = [p["prompt_ids"] for p in GOLDENS["prompts"]]
TRAINED = REPO / "recipes" / "drafters" / "smollm2-135m-instruct-eagle.safetensors"
TOKENS = 32  # the goldens' length (HF transformers' 32 greedy tokens per prompt)

RECIPE = """
from dataclasses import replace
import importlib.util
spec = importlib.util.spec_from_file_location("base", {base!r})
base = importlib.util.module_from_spec(spec); spec.loader.exec_module(base)
from helios_ignition.recipe import Capacities, DrafterDecl
RECIPE = replace(base.RECIPE, drafter=DrafterDecl({drafter!r}, widths=(1, 2, 3, 4)),
                 capacities=replace(base.RECIPE.capacities, decode_batch=(1, 8),
                                    prefill_tokens=(64, 256), mixed_tokens=()))
"""


@pytest.fixture(scope="module")
def spec_core(module_tmp, signing_key_pair, smollm2_checkpoint):
    """The real model exported with the drafter (widths 1..4): (path, public key)."""
    from helios_ignition.export import export_core

    folder = module_tmp("spec-core")
    drafter = str(TRAINED) if TRAINED.is_file() else "random:7:8192"
    recipe = folder / "smollm2_spec.py"
    recipe.write_text(RECIPE.format(base=str(REPO / "recipes" / "smollm2_135m_instruct.py"),
                                    drafter=drafter))
    private, public = signing_key_pair
    out = folder / "spec.core"
    export_core(recipe, checkpoint=smollm2_checkpoint, key_path=private,
                namespace="helios.test/models", out=out, weight_dtype="f32")
    return out, public


@pytest.fixture(scope="module")
def model(spec_core):
    out, public = spec_core
    core = open_core(out, [load_public_key(public)])
    authorize(core, "helios.test/models")
    m = load_native(core, "cpu")
    yield m
    m.close()


@pytest.mark.slow
@pytest.mark.timeout(1500)  # ~1 min on an idle CI machine; far more on a shared one
def test_greedy_speculative_equals_decode_alone_and_in_a_batch_of_8(model):
    assert model.manifests.speculative_widths == (1, 2, 3, 4)
    batch = [PROMPTS[i % len(PROMPTS)] for i in range(8)]
    decoded = Driver(model).generate(batch, TOKENS)
    speculative, records = Driver(model).generate_speculative(batch, TOKENS, 4)
    assert speculative == decoded
    for i, prompt in enumerate(PROMPTS):
        alone, _ = Driver(model).generate_speculative([prompt], TOKENS, 4)
        assert alone[0] == decoded[i]
    # The goldens (HF transformers, 32 greedy tokens) agree too.
    for p, out in zip(GOLDENS["prompts"], decoded, strict=False):
        assert out[:32] == p["greedy_ids"][:32]
    offered = sum(int(r[:, 1].sum()) for r in records)
    assert offered > len(records) * 8  # lanes of width 4 ran (not only width one)


SAMPLED_TOKENS = 24


@pytest.fixture(scope="module")
def scheduled_model(spec_core):
    """A second load that only the real Scheduler drives (its slot generations would
    collide with the Driver's in the shared page-table upload cache)."""
    out, public = spec_core
    core = open_core(out, [load_public_key(public)])
    authorize(core, "helios.test/models")
    m = load_native(core, "cpu")
    yield m
    m.close()


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_seeded_sampled_speculative_equals_decode(model, scheduled_model):
    """A seeded sampled request (T 0.8, top_p 0.95) emits the decode programs' token ids
    with speculation at W = 1..4, in a batch of 4 and alone; through the real scheduler
    too, under the fixed and the adaptive width policy, against a plain DECODE run."""
    from helios_serve.engine.plan import SamplingParams

    from tests.serve.runtime.test_speculative_programs import _seeded, _serve

    batch = [PROMPTS[i % len(PROMPTS)] for i in range(4)]  # a repeated prompt: other seed
    params = [SamplingParams(temperature=0.8, top_p=0.95, seed=300 + i) for i in range(4)]
    decoded = Driver(model).generate(batch, SAMPLED_TOKENS, params)
    accepted = 0
    for width in (1, 2, 3, 4):
        out, records = Driver(model).generate_speculative(batch, SAMPLED_TOKENS, width, params)
        assert out == decoded, width
        accepted += sum(int(r[:, 2].sum()) for r in records)
        alone, _ = Driver(model).generate_speculative(batch[3:], SAMPLED_TOKENS, width,
                                                      params[3:])
        assert alone[0] == decoded[3], width
    assert accepted >= 8, "sampled drafts must be accepted (the coupled head's path)"
    requests = [_seeded(i, p, 300 + i, max_tokens=SAMPLED_TOKENS) for i, p in enumerate(batch)]
    plain, _, _ = _serve(scheduled_model, requests, widths=())
    assert list(plain.values()) == decoded
    for policy in (False, True):
        out, _, _ = _serve(scheduled_model, requests, policy=policy)
        assert list(out.values()) == decoded, policy


@pytest.fixture(scope="module")
def spec_server(spec_core):
    from helios_serve.bootstrap import Bootstrap
    from helios_serve.clock import ObservationClock
    from helios_serve.config import ServeOptions, resolve
    from helios_serve.server import Server

    out, public = spec_core
    bootstrap = Bootstrap.load(out, [public], "helios.test/models")
    settings = resolve(ServeOptions(port=0, max_active=4, queue_capacity=8), bootstrap.contract)
    m = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu",
                          max_concurrency=settings.max_active)
    server = Server.start(bootstrap, m, settings, ObservationClock())
    yield server
    server.stop()
    bootstrap.close()


def _client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=600.0)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_speculative_http_json_and_stream_with_stop_limit_and_observation(spec_server, model):
    import httpx

    client = _client(spec_server)
    name = spec_server.settings.served_name
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model=name, messages=messages, temperature=0,
                                       max_tokens=24, extra_body={"return_token_ids": True})
    ids = r.choices[0].token_ids
    decoded = Driver(model).generate([r.model_extra["prompt_token_ids"]], len(ids))[0]
    assert ids == decoded  # greedy through HTTP = the decode programs' tokens
    assert "Paris" in r.choices[0].message.content
    assert r.usage.completion_tokens == len(ids) <= 24
    # Streaming, cut by a stop string inside the answer and by the output limit.
    stream = client.chat.completions.create(
        model=name, messages=messages, temperature=0, max_tokens=24, stop=["Paris"],
        stream=True, stream_options={"include_usage": True},
        extra_body={"return_token_ids": True})
    text, observed, usage, finish = "", [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            observed += (choice.model_extra or {}).get("token_ids") or []
            finish = choice.finish_reason or finish
    assert "Paris" not in text and finish == "stop"
    assert usage.completion_tokens == len(observed) < len(ids)  # the crossing token counted
    assert observed == ids[:len(observed)]
    metrics = httpx.get(spec_server.url + "/metrics").text
    drafts = [line for line in metrics.splitlines()
              if line.startswith('helios_spec_decode_draft_tokens_total{source="learned"}')]
    assert drafts and float(drafts[0].split()[-1]) > 0


@pytest.fixture(scope="module")
def history_server(spec_core):
    """The speculative core served with history drafting under the fixed width policy.

    The adaptive policy picks programs from measured step costs, so on a loaded machine it
    may run plain DECODE for a whole answer; the copied-acceptance assertions below need
    speculation to run (the adaptive policy's choices are tested with scripted costs in
    tests/serve/scheduler and over HTTP in test_structured_speculative)."""
    from helios_serve.bootstrap import Bootstrap
    from helios_serve.clock import ObservationClock
    from helios_serve.config import ServeOptions, resolve
    from helios_serve.loading import check_options
    from helios_serve.server import Server

    out, public = spec_core
    bootstrap = Bootstrap.load(out, [public], "helios.test/models")
    options = ServeOptions(port=0, max_active=4, queue_capacity=8, history_drafting=True,
                           speculative_policy="fixed")
    settings = resolve(options, bootstrap.contract)
    check_options(bootstrap.prepared, options)
    m = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu",
                          max_concurrency=settings.max_active)
    server = Server.start(bootstrap, m, settings, ObservationClock())
    yield server
    server.stop()
    bootstrap.close()


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_history_drafting_over_http_keeps_greedy_identity(history_server, model):
    """Copied candidates (a prompt the answer quotes) under the fixed policy, two
    requests at once: each greedy answer is the decode programs' own, and copied drafts
    were offered and accepted."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    client = _client(history_server)
    name = history_server.settings.served_name
    quote = ("The old bridge over the river Aldane was built in 1432 and is closed to cars, "
             "but pedestrians still cross it every day.")
    prompts = [f"Repeat this sentence exactly, twice: {quote}",
               f"Copy the following text word for word: {quote}"]

    def ask(content):
        return client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": content}], temperature=0,
            max_tokens=32, extra_body={"return_token_ids": True})

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(ask, prompts))
    for r in answers:
        ids = r.choices[0].token_ids
        prompt_ids = r.model_extra["prompt_token_ids"]
        assert ids == Driver(model).generate([prompt_ids], len(ids))[0]
    metrics = httpx.get(history_server.url + "/metrics").text

    def value(prefix):
        lines = [line for line in metrics.splitlines() if line.startswith(prefix)]
        return float(lines[0].split()[-1]) if lines else 0.0

    assert value('helios_spec_decode_draft_tokens_total{source="copied"}') > 0
    assert value('helios_spec_decode_accepted_tokens_total{source="copied"}') > 0


@pytest.fixture(scope="module")
def plain_server(spec_core):
    """The same drafter core served with speculation off (--speculative-width 0)."""
    from helios_serve.bootstrap import Bootstrap
    from helios_serve.clock import ObservationClock
    from helios_serve.config import ServeOptions, resolve
    from helios_serve.server import Server

    out, public = spec_core
    bootstrap = Bootstrap.load(out, [public], "helios.test/models")
    settings = resolve(ServeOptions(port=0, max_active=2, queue_capacity=4,
                                    speculative_width=0), bootstrap.contract)
    m = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu",
                          max_concurrency=settings.max_active, speculative_width=0)
    server = Server.start(bootstrap, m, settings, ObservationClock())
    yield server
    server.stop()
    bootstrap.close()


CITIES = {"type": "object", "additionalProperties": False, "required": ["cities"],
          "properties": {"cities": {"type": "array", "minItems": 3, "maxItems": 3, "items": {
              "type": "object", "additionalProperties": False,
              "required": ["name", "country"],
              "properties": {"name": {"type": "string"}, "country": {"type": "string"}}}}}}


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_json_schema_requests_speculate_through_copied_candidates(history_server,
                                                                  plain_server):
    """response_format json_schema with history drafting: the constrained lanes verify
    the copied candidates their grammar accepts, under per-position grammar masks; the
    answer is exactly the one served without speculation (streaming and not), and copied
    drafts are accepted (the repeated keys of the array's objects)."""
    import httpx

    messages = [{"role": "user", "content": "List three large cities in Europe with their "
                                            "countries, as JSON."}]
    rf = {"type": "json_schema", "json_schema": {"name": "cities", "schema": CITIES}}

    def ask(server, **extra):
        return _client(server).chat.completions.create(
            model=server.settings.served_name, messages=messages, temperature=0,
            max_tokens=80, response_format=rf, extra_body={"return_token_ids": True}, **extra)

    def value(server, prefix):
        lines = [line for line in httpx.get(server.url + "/metrics").text.splitlines()
                 if line.startswith(prefix)]
        return float(lines[0].split()[-1]) if lines else 0.0

    copied = 'helios_spec_decode_accepted_tokens_total{source="copied"}'
    before = value(history_server, copied)
    want = ask(plain_server)
    got = ask(history_server)
    assert got.choices[0].token_ids == want.choices[0].token_ids
    text = got.choices[0].message.content
    assert text == want.choices[0].message.content
    if got.choices[0].finish_reason == "stop":
        assert len(json.loads(text)["cities"]) == 3
    assert value(history_server, copied) - before > 0
    stream = ask(history_server, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == text
