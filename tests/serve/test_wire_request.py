"""A request crosses to the engine process as its `RequestData`, as it is: the frontend's
`WireRequest.of` and the engine's `engine_request` agree field for field."""

from __future__ import annotations

import asyncio

import msgspec
from helios_serve.engine.plan import SamplingParams
from helios_serve.engine_process import TokenRelay, engine_request
from helios_serve.events import EventSink, FinishReason, GenerationRequest
from helios_serve.frontend.pipeline import Frontend
from helios_serve.frontend.prepare import (
    OutputRecipe,
    PipelineArgs,
    PreparedRequest,
    RequestData,
)
from helios_serve.frontend.stops import StopSpec
from helios_serve.frontend.syntax import (
    CHATML_BOUNDARIES,
    FrontendSyntax,
    ReasoningParser,
    ToolParser,
)
from helios_serve.frontend.testing import ScriptTokenizer
from helios_serve.wire import Admit, WireRequest, encoder, to_engine_decoder


def _frontend() -> tuple[Frontend, int]:
    st = ScriptTokenizer(["<|eos|>"])
    eos = st.special_id("<|eos|>")
    syntax = FrontendSyntax(tool_parser=ToolParser.NONE, reasoning_parser=ReasoningParser.NONE,
                            assistant_boundaries=CHATML_BOUNDARIES)
    return Frontend(syntax, st.tokenizer, [eos]), eos


def _prepared(frontend: Frontend, stops: StopSpec) -> PreparedRequest:
    prompt = (5, 6, 7)
    return PreparedRequest(
        prompt_text="hi there", prompt_token_ids=prompt,
        sampling=SamplingParams(temperature=0.5, seed=11, logit_bias=((3, -1.5),)),
        max_output_tokens=9, limit_field="max_tokens", prompt_field="prompt", stops=stops,
        output=OutputRecipe(frontend, PipelineArgs(prompt, stops, "hi there"), None), n=2,
        logprobs=1, logit_bias=((3, -1.5),), min_tokens=2, observe_ids=True,
        publish_endpoints=(2,),
    )  # fmt: skip


def _crossed(request: GenerationRequest) -> WireRequest:
    """`request` as the engine decodes it from the channel."""
    message = to_engine_decoder.decode(encoder.encode(Admit([WireRequest.of(request)])))
    assert type(message) is Admit and len(message.requests) == 1
    return message.requests[0]


def test_a_request_with_host_feedback_crosses_as_it_is():
    frontend, eos = _frontend()
    prepared = _prepared(frontend, StopSpec(token_ids=(4,)))

    async def run():
        sink = EventSink(asyncio.get_running_loop(), choices=2)
        return GenerationRequest.build(17, prepared, sink, 1234, first_index=3)

    wire = _crossed(asyncio.run(run()))
    assert (wire.request_id, wire.enqueue_ns, wire.first_index, wire.relayed) == (17, 1234, 3,
                                                                                  False)
    assert wire.data == prepared.data
    assert type(wire.data) is RequestData
    assert wire.pipeline == prepared.output.pipeline and wire.grammar is None

    rebuilt = engine_request(wire, frontend, None, None, frozenset([eos]))
    assert rebuilt.prepared.data == prepared.data
    assert rebuilt.prepared.output.pipeline == prepared.output.pipeline
    assert [c.index for c in rebuilt.choices] == [3, 4]
    assert [c.sampling.seed for c in rebuilt.choices] == [11, 12]
    assert not any(c.relayed for c in rebuilt.choices)


def test_a_relayed_request_crosses_without_its_prompt_text():
    frontend, eos = _frontend()
    prepared = _prepared(frontend, StopSpec())

    async def run():
        sink = EventSink(asyncio.get_running_loop(), choices=2)
        return GenerationRequest.build(18, prepared, sink, None)

    wire = _crossed(asyncio.run(run()))
    assert wire.relayed and wire.pipeline is None and wire.grammar is None
    assert wire.data == msgspec.structs.replace(prepared.data, prompt_text="")

    rebuilt = engine_request(wire, frontend, None, None, frozenset([eos]))
    assert rebuilt.prepared.data == wire.data
    assert all(c.relayed and type(c.pipeline) is TokenRelay for c in rebuilt.choices)
    for choice in rebuilt.choices:  # the relay ends its choice at the core's EOS id
        choice.pipeline.feed(eos)
    assert [c.pipeline.finish_reason for c in rebuilt.choices] == [FinishReason.STOP] * 2
