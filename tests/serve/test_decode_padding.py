"""Bucket fill of DECODE steps through /metrics' counters: three requests decoding
together run the 4-row variant of the scripted model's (1, 2, 4, 8) capacities, so each
such step counts 3 live rows and 1 padded row; the counters sum every step's."""

from __future__ import annotations

import asyncio
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

SCRIPT = ["Hello", ",", " world", "!"]


def test_decode_rows_and_padding_are_counted_per_step(tok):
    bootstrap = tiny_bootstrap(tok)
    model = ScriptedModel(tiny_geometry(tok.vocab_size),
                          ScriptBook(tok.decode, default=tok.ids(SCRIPT)), frames=1)
    assert model.manifests.decode_capacities == (1, 2, 4, 8)
    decode_rows: list[int] = []
    submit = model.submit
    queued = threading.Event()  # the first step waits until every request is queued

    def watched(plan):
        assert queued.wait(10)
        if plan.kind is StepKind.DECODE:
            decode_rows.append(len(plan.rows))
        return submit(plan)

    model.submit = watched
    metrics = Metrics()
    worker = ModelWorker(model, ObservationClock(), metrics, max_active=3, queue_capacity=4)
    prompt = tuple(tok.byte_ids(b"user: hi\nassistant: "))

    async def main():
        worker.start()
        sinks = []
        for i in range(3):
            sink = EventSink(asyncio.get_running_loop())
            prepared = PreparedRequest(
                prompt_text="", prompt_token_ids=prompt, sampling=SamplingParams(),
                max_output_tokens=16, limit_field=None, prompt_field="prompt",
                stops=StopSpec(),
                output=OutputRecipe(bootstrap.frontend, PipelineArgs(prompt, StopSpec()), None))
            assert worker.submit(GenerationRequest.build(i + 1, prepared, sink, enqueue_ns=None))
            sinks.append(sink)
        queued.set()
        for sink in sinks:
            while not isinstance(await asyncio.wait_for(sink.get(), 10), Finished):
                pass

    try:
        asyncio.run(main())
    finally:
        worker.stop()
    bucket = {1: 1, 2: 2, 3: 4}
    assert 3 in decode_rows  # the three requests decoded together
    assert metrics.decode_rows._value.get() == sum(decode_rows)
    assert metrics.decode_padded_rows._value.get() == sum(bucket[n] - n for n in decode_rows)
    assert metrics.decode_padded_rows._value.get() >= decode_rows.count(3) > 0
