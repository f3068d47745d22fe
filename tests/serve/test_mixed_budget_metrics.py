"""MIXED steps through /metrics, by the token budget the scheduler chose
(helios_mixed_steps_total{token_capacity}): a burst of two prompts into one running stream
takes the large budget, a single prompt into three running streams the small one
(docs/mixed.md, "Token budget"), and each submitted step counts once under its budget."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from helios_serve.clock import ObservationClock
from helios_serve.engine.plan import SamplingParams, StepKind
from helios_serve.events import EventSink, Finished, GenerationRequest
from helios_serve.frontend.prepare import OutputRecipe, PipelineArgs, PreparedRequest
from helios_serve.frontend.stops import StopSpec
from helios_serve.metrics import Metrics
from helios_serve.testing.scripted import ScriptBook, ScriptedModel, tiny_geometry
from helios_serve.testing.tiny import tiny_bootstrap
from helios_serve.worker import ModelWorker

SCRIPT = ["Hello", ",", " world", "!"] * 8


def _count(metrics: Metrics, tokens: str) -> float:
    return metrics.registry.get_sample_value("helios_mixed_steps_total",
                                             {"token_capacity": tokens})


def test_mixed_steps_are_counted_by_their_budget(tok):
    bootstrap = tiny_bootstrap(tok)
    geometry = dataclasses.replace(tiny_geometry(tok.vocab_size),
                                   mixed_capacities=((2, 16), (4, 16), (2, 64), (4, 64)))
    model = ScriptedModel(geometry, ScriptBook(tok.decode, default=tok.ids(SCRIPT)), frames=1)
    plans: list[tuple[StepKind, int, int, int]] = []  # kind, rows, lanes, token budget
    submit = model.submit
    paused, resume = threading.Event(), threading.Event()
    pause_at = [1, 3]  # hold the first DECODE of 1 row, then the first of 3 rows

    def watched(plan):
        plans.append((plan.kind, len(plan.rows), plan.lanes, plan.token_budget))
        if plan.kind is StepKind.DECODE and pause_at and len(plan.rows) == pause_at[0]:
            pause_at.pop(0)
            paused.set()  # the requests submitted now reach the next step together
            assert resume.wait(10)
            resume.clear()
        return submit(plan)

    model.submit = watched
    metrics = Metrics()
    worker = ModelWorker(model, ObservationClock(), metrics, max_active=4, queue_capacity=4)
    assert _count(metrics, "16") == _count(metrics, "64") == 0  # each budget from 0
    n = 22  # prompt tokens; each request's own, so no prefix is reused

    def prompt_of(rid: int) -> tuple[int, ...]:
        ids = tuple(tok.byte_ids(f"{rid} user: hi\nassistant: ".encode()))
        assert len(ids) == n
        return ids

    async def main():
        worker.start()
        sinks = []

        def arrive(rid: int) -> None:
            prompt = prompt_of(rid)
            sink = EventSink(asyncio.get_running_loop())
            prepared = PreparedRequest(
                prompt_text="", prompt_token_ids=prompt, sampling=SamplingParams(),
                max_output_tokens=12, limit_field=None, prompt_field="prompt",
                stops=StopSpec(),
                output=OutputRecipe(bootstrap.frontend, PipelineArgs(prompt, StopSpec()), None))
            assert worker.submit(GenerationRequest.build(rid, prepared, sink, enqueue_ns=None))
            sinks.append(sink)

        async def held() -> None:
            await asyncio.to_thread(paused.wait, 10)
            paused.clear()

        arrive(1)
        await held()  # request 1 decodes alone: a burst of two prompts joins it
        arrive(2)
        arrive(3)
        resume.set()
        await held()  # three streams decode: one prompt joins them
        arrive(4)
        resume.set()
        for sink in sinks:
            while not isinstance(await asyncio.wait_for(sink.get(), 10), Finished):
                pass

    try:
        asyncio.run(main())
    finally:
        worker.stop()
    mixed = [p for p in plans if p[0] is StepKind.MIXED]
    # W = 2 >= L = 1: one step of 64 tokens (a lane and both prompts); W = 1 < L = 3:
    # steps of 16 tokens (three lanes and 13 prompt tokens each).
    assert mixed == [(StepKind.MIXED, 3, 1, 64)] + [(StepKind.MIXED, 4, 3, 16)] * -(-n // 13)
    assert _count(metrics, "64") == 1
    assert _count(metrics, "16") == -(-n // 13)
    assert metrics.registry.get_sample_value(
        "helios_graph_launches_total", {"operation": "mixed"}) == len(mixed)
