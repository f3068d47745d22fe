"""Constrained requests speculate through copied candidates (history drafting) on the
tiny model with a drafter, served over real HTTP by the real worker and llguidance:
JSON-schema answers are exactly the text served without speculation, streaming and not,
and copied drafts are accepted (the specification's value sources, "Copied proposals":
per-position grammar masks; docs/speculative.md)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from helios_serve.bootstrap import Bootstrap
from helios_serve.clock import ObservationClock
from helios_serve.config import ServeOptions, resolve
from helios_serve.runtime import NativeModel
from helios_serve.server import Server

from tests.tiny_model import LLAMA_RECIPE, NAMESPACE

RECIPE = """
from dataclasses import replace
import importlib.util
spec = importlib.util.spec_from_file_location("base", {base!r})
base = importlib.util.module_from_spec(spec); spec.loader.exec_module(base)
from helios_ignition.recipe import DrafterDecl


def make_recipe(checkpoint):
    recipe = base.make_recipe(checkpoint)
    return replace(recipe, drafter=DrafterDecl("random:7:128", widths=(1, 2, 4)),
                   sampling=replace(recipe.sampling, max_output_tokens=128),
                   capacities=replace(recipe.capacities, decode_batch=(1, 2, 4),
                                      prefill_tokens=(16, 128), context_tokens=256,
                                      prepared_pages=128, prepared_snapshots=8,
                                      transfer_rows=8))
"""

# A schema whose answer repeats itself: the n-grams of the first items propose the rest.
SCHEMA = {"type": "object",
          "properties": {"items": {"type": "array", "items": {"type": "string",
                                                                "enum": ["red", "green"]},
                                   "minItems": 6, "maxItems": 6}},
          "required": ["items"], "additionalProperties": False}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "colours", "schema": SCHEMA}}
PROMPTS = ["Name three colours.", "What is the capital of France?"]


@pytest.fixture(scope="module")
def spec_tiny(module_tmp, tiny_served):
    """The tiny checkpoint exported with a seeded random drafter (widths 1, 2, 4)."""
    core = tiny_served.core
    folder = module_tmp("tiny-spec")
    recipe = folder / "tiny_spec.py"
    recipe.write_text(RECIPE.format(base=str(LLAMA_RECIPE)))
    out = folder / "tiny-spec.core"
    from helios_ignition.export import export_core

    export_core(recipe, checkpoint=str(tiny_served.checkpoint), key_path=core.private_key,
                namespace=NAMESPACE, out=out, weight_dtype="f32")
    return out, core.public_key


def _serve(core: tuple[Path, Path], **options):
    out, public = core
    bootstrap = Bootstrap.load(out, [public], NAMESPACE)
    settings = resolve(ServeOptions(port=0, max_active=4, queue_capacity=8, **options),
                       bootstrap.contract)
    model = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu",
                             max_concurrency=settings.max_active,
                             speculative_width=options.get("speculative_width"))
    return bootstrap, Server.start(bootstrap, model, settings, ObservationClock())


@pytest.fixture(scope="module")
def servers(spec_tiny):
    """(history drafting, speculation off, history drafting + adaptive policy) servers of
    the same drafter core."""
    started = [_serve(spec_tiny, history_drafting=True, speculative_policy="fixed"),
               _serve(spec_tiny, speculative_width=0),
               _serve(spec_tiny, history_drafting=True, speculative_policy="adaptive")]
    yield tuple(server for _, server in started)
    for bootstrap, server in started:
        server.stop()
        bootstrap.close()


def _metric(server, prefix: str) -> float:
    lines = [line for line in httpx.get(server.url + "/metrics").text.splitlines()
             if line.startswith(prefix)]
    return float(lines[0].split()[-1]) if lines else 0.0


def _ask(server, prompt: str, response_format=RESPONSE_FORMAT, **extra) -> httpx.Response:
    body = {"model": server.settings.served_name, "temperature": 0, "max_tokens": 120,
            "messages": [{"role": "user", "content": prompt}], "return_token_ids": True,
            **extra}
    if response_format is not None:
        body["response_format"] = response_format
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)


def test_json_schema_answers_equal_the_unspeculated_ones_and_copied_drafts_are_accepted(
        servers):
    import json

    history, off, _ = servers
    copied = 'helios_spec_decode_accepted_tokens_total{source="copied"}'
    before = _metric(history, copied)
    for prompt in PROMPTS:
        with_spec, without = _ask(history, prompt).json(), _ask(off, prompt).json()
        ids = with_spec["choices"][0]["token_ids"]
        assert ids == without["choices"][0]["token_ids"]
        text = with_spec["choices"][0]["message"]["content"]
        assert text == without["choices"][0]["message"]["content"]
        assert len(json.loads(text)["items"]) == 6  # the grammar held
    assert _metric(history, copied) - before > 0
    assert _metric(off, 'helios_graph_launches_total{operation="speculative"}') == 0


def test_streamed_json_schema_answer_equals_the_unspeculated_one(servers):
    from helios_serve.testing.harness import sse_post

    history, off, _ = servers
    want = _ask(off, PROMPTS[0]).json()["choices"][0]["message"]["content"]
    body = {"model": history.settings.served_name, "temperature": 0, "max_tokens": 120,
            "messages": [{"role": "user", "content": PROMPTS[0]}],
            "response_format": RESPONSE_FORMAT, "stream": True}
    status, events = sse_post(history.url, body)
    assert status == 200
    text = "".join(e["choices"][0]["delta"].get("content") or ""
                   for e in events if isinstance(e, dict) and e.get("choices"))
    assert text == want


def test_prefix_limit_steps_with_constrained_lanes_through_the_worker(servers):
    """The adaptive policy measuring every program (bounded_exploration off, so that
    prefix-limit programs run whatever they cost here; their framed proposal confidence
    is validated and read at each completion): concurrent constrained and free requests
    still answer exactly as without speculation."""
    from concurrent.futures import ThreadPoolExecutor

    _, off, adaptive = servers
    asks = [(p, rf) for p in PROMPTS for rf in (RESPONSE_FORMAT, None)]

    def ask(server, prompt, rf):
        return _ask(server, prompt, rf, max_tokens=48).json()["choices"][0]["token_ids"]

    policy = adaptive.worker.scheduler.policy
    policy.bounded_exploration = False
    try:
        with ThreadPoolExecutor(len(asks)) as pool:
            got = list(pool.map(lambda a: ask(adaptive, *a), asks))
    finally:
        policy.bounded_exploration = True
    want = [ask(off, *a) for a in asks]
    assert got == want
    decisions = adaptive.worker.scheduler.stats().spec_policy_decisions
    assert any(k.startswith("prefix_") for k in decisions), decisions
