"""The worker's sampler inputs and outputs on the scripted backend: min_tokens reaches
the model as a mask on exactly the rows below the minimum (and still runs ahead), and
each sampled token's logprobs reach the request's Output events, the ending EOS aside."""

from __future__ import annotations

import asyncio

import numpy as np
from helios_serve.clock import ObservationClock
from helios_serve.engine.plan import SamplingParams, StepKind, TokenLogprob
from helios_serve.events import EventSink, Finished, GenerationRequest, Output
from helios_serve.frontend.prepare import OutputRecipe, PipelineArgs, PreparedRequest
from helios_serve.frontend.stops import StopSpec
from helios_serve.metrics import Metrics
from helios_serve.testing.scripted import ScriptBook, ScriptedModel, tiny_geometry
from helios_serve.testing.tiny import tiny_bootstrap
from helios_serve.testing.tokenizer import EOS_ID
from helios_serve.worker import ModelWorker

SCRIPT = ["Hello", ",", " world", "!"]


def _run(tok, sampling: SamplingParams, *, max_tokens: int = 16, **geometry):
    """Serve one request through a ModelWorker; returns (events, model, masks seen: one
    (output index, mask words or None) per sampling row)."""
    bootstrap = tiny_bootstrap(tok)
    model = ScriptedModel(tiny_geometry(tok.vocab_size, **geometry),
                          ScriptBook(tok.decode, default=tok.ids(SCRIPT)),
                          frames=2, device_pending=True)
    prompt = tuple(tok.byte_ids(b"user: hi\nassistant: "))
    seen: list[tuple[int, np.ndarray | None]] = []
    submit = model.submit

    def watched(plan):
        for r in plan.rows:
            if r.sample:
                index = r.start_position + len(r.tokens) - len(prompt)
                seen.append((index, None if r.grammar_mask is None else r.grammar_mask.copy()))
        return submit(plan)

    model.submit = watched
    worker = ModelWorker(model, ObservationClock(), Metrics(), max_active=2, queue_capacity=4)
    worker.start()

    async def main():
        sink = EventSink(asyncio.get_running_loop())
        prepared = PreparedRequest(
            prompt_text="", prompt_token_ids=prompt, sampling=sampling,
            max_output_tokens=max_tokens, limit_field=None, prompt_field="prompt",
            stops=StopSpec(), output=OutputRecipe(bootstrap.frontend, PipelineArgs(prompt, StopSpec()), None))
        request = GenerationRequest.build(1, prepared, sink, enqueue_ns=None)
        assert worker.submit(request)
        events = []
        while not isinstance(events[-1:] and events[-1], Finished):
            events.append(await asyncio.wait_for(sink.get(), 10))
        return events

    try:
        events = asyncio.run(main())
    finally:
        worker.stop()
    return events, model, seen


def _bits(words) -> set[int]:
    bits = np.unpackbits(np.asarray(words).view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits).tolist())


def test_min_tokens_masks_eos_below_the_minimum_and_runs_ahead(tok):
    sampling = SamplingParams(min_tokens=3, min_tokens_banned=(EOS_ID, 7))
    events, model, seen = _run(tok, sampling)
    assert events[-1].reason.value == "stop" and events[-1].completion_tokens == 5
    by_index = dict(seen)  # ahead rows whose request ended are planned, then dropped
    for index in (0, 1, 2):
        assert _bits(by_index[index]) == set(range(32 * model.manifests.mask_words)) - {EOS_ID, 7}
    assert all(mask is None for index, mask in seen if index >= 3)
    assert model.max_outstanding == 2  # no completion feedback needed


def test_each_sampled_token_gets_its_logprob_except_the_ending_eos(tok):
    events, model, _ = _run(tok, SamplingParams(logprobs=2), top_logprobs=5)
    logprobs = [lp for e in events if isinstance(e, Output) for lp in e.logprobs]
    ids = tok.ids(SCRIPT)
    assert logprobs == [TokenLogprob(t, -0.25, ((t, -0.25), ((t + 1) % tok.vocab_size, -1.25)))
                        for t in ids]
    assert events[-1].completion_tokens == len(ids) + 1  # the EOS counts, without logprobs


def test_requests_without_logprobs_get_none(tok):
    events, _, _ = _run(tok, SamplingParams(), top_logprobs=5)
    assert all(e.logprobs == () for e in events if isinstance(e, Output))


def test_speculative_cores_decode_logprobs_and_logit_bias_requests(tok):
    """Speculative programs apply no logit bias and record no logprobs: such requests run
    as DECODE rows of the speculative core (the scripted model refuses them in a lane)."""
    spec = {"speculative_widths": (1, 2, 4), "top_logprobs": 5, "logit_bias": True}
    events, model, _ = _run(tok, SamplingParams(logprobs=2), **spec)
    logprobs = [lp.token_id for e in events if isinstance(e, Output) for lp in e.logprobs]
    assert logprobs == tok.ids(SCRIPT)
    assert model.launches[StepKind.SPECULATIVE] == 0 and model.launches[StepKind.DECODE] >= 4
    events, model, _ = _run(tok, SamplingParams(logit_bias=((5, 1.0),)), **spec)
    assert events[-1].completion_tokens == len(SCRIPT) + 1
    assert model.launches[StepKind.SPECULATIVE] == 0
    events, model, _ = _run(tok, SamplingParams(), **spec)
    assert events[-1].completion_tokens == len(SCRIPT) + 1
    assert model.launches[StepKind.SPECULATIVE] >= 1 and model.launches[StepKind.DECODE] == 0


def test_speculative_lanes_stay_width_one_below_min_tokens(tok):
    sampling = SamplingParams(min_tokens=3, min_tokens_banned=(EOS_ID, 7))
    events, model, seen = _run(tok, sampling, speculative_widths=(1, 2, 4))
    assert events[-1].completion_tokens == 5
    # Output 0 comes from prefill; lanes at outputs 1 and 2 are masked and one long.
    assert model.lane_lengths[:2] == [1, 1] and max(model.lane_lengths) > 1
    by_index = dict(seen)
    assert all(_bits(by_index[i]).isdisjoint({EOS_ID, 7}) for i in (0, 1, 2))
