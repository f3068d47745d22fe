"""Mixed generation programs on the real SmolLM2 (issue 27, item 2): greedy identity of
mixed steps with the steps planned without them, through NativeModel and through HTTP.

Both tests ride on the session's `real_server` (tests/e2e/conftest.py: the f32 core,
max_active 4, queue 8): its bootstrap is only read here, and the HTTP test compares
metric deltas, so a second bootstrap, model load and server would only repeat its work.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest
from helios_serve.bootstrap import Bootstrap
from helios_serve.engine.plan import SamplingParams, StepKind
from helios_serve.runtime.native_model import NativeModel
from helios_serve.scheduler import FinishReason, SchedRequest, Scheduler

pytestmark = pytest.mark.slow

STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
LONG = [{"role": "user", "content": "Summarize the following notes in one sentence. "
         + " ".join(f"Note {i}: the tide was {'high' if i % 3 else 'low'} at dawn and the "
                    f"keeper logged {i * 7 % 23} ships." for i in range(24))}]


@pytest.fixture(scope="module")
def bootstrap(real_server) -> Bootstrap:
    """The session server's bootstrap (read only: prepared graphs, tokenizer, resources)."""
    return real_server.bootstrap


def test_the_smollm2_core_captures_mixed_programs(bootstrap):
    graphs = [g.name for g in bootstrap.prepared.graphs.values()
              if g.name.startswith("mixed_")]
    assert graphs == [f"mixed_b{b}_t256" for b in (2, 4, 8, 16, 32)]


def _run(model, geometry, requests):
    """Greedy outputs of `requests` [(id, prompt ids, output limit, arrival step)] and the
    step kinds issued, one step at a time."""
    sched = Scheduler(geometry, frames=1, device_pending=model.device_pending)
    limits = {rid: limit for rid, _, limit, _ in requests}
    outputs = {rid: [] for rid in limits}
    kinds = []
    for step in range(2000):
        for rid, prompt, limit, at in requests:
            if at == step:
                assert sched.add(SchedRequest(rid, tuple(prompt), limit,
                                              sampling=SamplingParams())) is None
        plan = sched.schedule()
        if plan is None:
            if step > max(r[3] for r in requests) and not sched.has_work():
                return outputs, kinds
            continue
        kinds.append(plan.kind)
        for r in sched.complete(plan, model.execute(plan)):
            if r.token_id is not None:
                outputs[r.request_id].append(r.token_id)
                if r.output_tokens == limits[r.request_id]:
                    sched.finish(r.request_id, FinishReason.LENGTH)
    raise AssertionError("did not drain")


def test_native_model_greedy_identity_with_mixed_steps(bootstrap):
    tok = bootstrap.tokenizer
    model = NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu")
    try:
        story = tok.encode("Once upon a time, a lighthouse keeper").ids
        other = tok.encode("The three primary colors are").ids
        long = tok.encode(LONG[0]["content"]).ids
        assert len(long) > 300  # prefilled over several mixed steps of 256 tokens
        # 12 tokens: requests 1 and 2 have 1 (prefill) + 3 (decode) + 2 or 3 (mixed) when
        # request 3's prompt is in, and decode 3 or more after it (the f32 model's cpu
        # decode steps are most of this test's time: no more than that).
        requests = [(1, story, 12, 0), (2, other, 12, 0), (3, long, 6, 4)]
        mixed, kinds = _run(model, model.manifests, requests)
        plain, plain_kinds = _run(model, dataclasses.replace(model.manifests,
                                                             mixed_capacities=()), requests)
        assert mixed == plain
        # Requests 1 and 2 get a token in every step while request 3's prompt is prefilled.
        assert kinds.count(StepKind.MIXED) == -(-len(long) // 254)
        assert StepKind.MIXED not in plain_kinds
    finally:
        model.close()


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name))


def test_http_greedy_identity_while_a_long_prompt_joins(real_server):
    import httpx
    import openai

    server = real_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                           timeout=600.0)
    name = server.settings.served_name
    # 24 tokens: the long prompt joins after the story's first token and is prefilled in
    # 2 or 3 mixed steps; the story then decodes on beside the summary.
    story = dict(model=name, messages=STORY, temperature=0, max_tokens=24)
    summary = dict(model=name, messages=LONG, temperature=0, max_tokens=8)
    alone = client.chat.completions.create(**story).choices[0].message.content
    alone_summary = client.chat.completions.create(**summary).choices[0].message.content
    before = httpx.get(server.url + "/metrics").text
    joined: dict[str, str] = {}
    started = threading.Event()

    def long_prompt() -> None:
        started.wait(600)
        joined["summary"] = client.chat.completions.create(
            **summary).choices[0].message.content

    thread = threading.Thread(target=long_prompt)
    thread.start()
    parts = []
    for chunk in client.chat.completions.create(**story, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
            started.set()  # the story decodes: the long prompt joins it
    thread.join(600)
    after = httpx.get(server.url + "/metrics").text
    assert "".join(parts) == alone
    assert joined["summary"] == alone_summary
    launches = 'helios_graph_launches_total{operation="mixed"}'
    assert _metric(after, launches) > _metric(before, launches)
    assert _metric(after, "helios_mixed_lanes_total") > _metric(
        before, "helios_mixed_lanes_total")
