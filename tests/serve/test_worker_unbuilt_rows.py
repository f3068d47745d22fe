"""The worker over decode plans whose rows stay unbuilt serves what it serves over RowPlans.

With 20 requests decoding together (decode capacity 32) the scheduler's plain DECODE
plans leave their RowPlans unbuilt (scheduler.COLUMN_ROWS) and complete returns
RowResults; the worker then reads request ids, logprobs asks and results from the
columns, and builds the rows while a request may need a mask (min_tokens here). The same
requests served with every row planned as a RowPlan (COLUMN_ROWS above the capacity) must
give every response the same events: tokens, text, logprobs, finish reason and counts.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from helios_serve.clock import ObservationClock
from helios_serve.engine.plan import SamplingParams, StepKind
from helios_serve.events import EventSink, Finished, GenerationRequest
from helios_serve.frontend.prepare import OutputRecipe, PipelineArgs, PreparedRequest
from helios_serve.frontend.stops import StopSpec
from helios_serve.metrics import Metrics
from helios_serve.scheduler import scheduler as scheduler_module
from helios_serve.testing.scripted import ScriptBook, ScriptedModel, tiny_geometry
from helios_serve.testing.tiny import tiny_bootstrap
from helios_serve.testing.tokenizer import EOS_ID
from helios_serve.worker import ModelWorker

SCRIPT = ["Hello", ",", " world", "!", "Hello", ",", " world", "!"]
REQUESTS = 20


def _sampling(i: int) -> SamplingParams:
    if i % 5 == 1:
        return SamplingParams(logprobs=2)
    if i % 7 == 3:  # a ban: the worker builds the rows of the steps it applies to
        return SamplingParams(min_tokens=4, min_tokens_banned=(EOS_ID,))
    return SamplingParams(temperature=0.7, seed=i)


def _serve(tok, with_masks: bool) -> tuple[list, list[int]]:
    bootstrap = tiny_bootstrap(tok)
    model = ScriptedModel(
        tiny_geometry(tok.vocab_size, slots=32, decode_capacities=(1, 8, 32),
                      prefill_row_capacity=8, top_logprobs=5),
        ScriptBook(tok.decode, default=tok.ids(SCRIPT)), frames=2, device_pending=True)
    unbuilt: list[int] = []  # rows of each DECODE plan submitted with its rows unbuilt
    submit = model.submit
    queued = threading.Event()  # the first step waits until every request is queued

    def watched(plan):
        assert queued.wait(10)
        if plan.kind is StepKind.DECODE and "rows" not in plan.__dict__:
            unbuilt.append(plan.row_count)
        return submit(plan)

    model.submit = watched
    worker = ModelWorker(model, ObservationClock(), Metrics(), max_active=REQUESTS,
                         queue_capacity=REQUESTS)
    prompt = tuple(tok.byte_ids(b"user: hi\nassistant: "))

    async def main():
        worker.start()
        sinks = []
        for i in range(REQUESTS if with_masks else REQUESTS - 1):
            sink = EventSink(asyncio.get_running_loop())
            sampling = _sampling(i) if with_masks or i % 7 != 3 else SamplingParams()
            prepared = PreparedRequest(
                prompt_text="", prompt_token_ids=prompt, sampling=sampling,
                max_output_tokens=6 + i % 9, limit_field=None, prompt_field="prompt",
                stops=StopSpec(),
                output=OutputRecipe(bootstrap.frontend, PipelineArgs(prompt, StopSpec()), None))
            assert worker.submit(GenerationRequest.build(i + 1, prepared, sink, enqueue_ns=None))
            sinks.append(sink)
        queued.set()
        responses = []
        for sink in sinks:
            events = []
            while not isinstance(events[-1:] and events[-1], Finished):
                events.append(await asyncio.wait_for(sink.get(), 10))
            responses.append(events)
        return responses

    try:
        responses = asyncio.run(main())
    finally:
        worker.stop()
    return responses, unbuilt


@pytest.mark.parametrize("with_masks", [False, True], ids=["plain", "min-tokens"])
def test_the_worker_serves_unbuilt_rows_as_it_serves_row_plans(tok, monkeypatch, with_masks):
    columns, unbuilt = _serve(tok, with_masks)
    # A live min_tokens request makes the worker build each plan's rows (its ban's masks);
    # complete still reads the columns then (RowResults).
    assert (max(unbuilt, default=0) >= 16) != with_masks
    monkeypatch.setattr(scheduler_module, "COLUMN_ROWS", 10**9)
    rows, none = _serve(tok, with_masks)
    assert none == []
    assert columns == rows
    finished = [r[-1] for r in columns]
    assert [f.completion_tokens for f in finished] == [
        min(6 + i % 9, len(SCRIPT) + 1) for i in range(len(finished))]
