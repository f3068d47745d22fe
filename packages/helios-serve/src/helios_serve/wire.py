"""The engine <-> frontend channel's messages (helios-serve --engine-process).

docs/serving.md, "Design: engine process + frontend process": the spawn specification
(`EngineSpec`, pickled once), one msgspec message per admission (frontend -> engine: the
request's `RequestData` as it is, see `WireRequest`), cancels
and scrapes on the same channel, and one message per step engine -> frontend holding
every response's events of that step, scrape replies and heartbeats. The framing is `multiprocessing.connection`'s
(length-prefixed messages over a socket pair); the payloads are MessagePack
(msgspec, as vLLM V1 sends msgpack over ZeroMQ).

Frontend -> engine messages are tagged msgspec Structs decoded with their types;
engine -> frontend events are plain MessagePack arrays (decoded untyped: the hot path)
whose first element names the event:

    Output         [0, choice, completion_tokens, deltas | None, token ids | None, logprobs]
    TokenObserved  [1, choice, token_id, timestamp_ns | None]
    Finished       [2, choice, reason, prompt_tokens, completion_tokens, reused_prompt_tokens]
    Rejected       [3, message, admission reason | None]
    Failed         [4, message]
    PromptScores   [5, choice, logprobs]

A delta is [0, text] (content), [1, text] (reasoning), [2, index, id, name] (tool call
start) or [3, index, text] (tool call arguments). An Output of a relayed choice (one
without host feedback: its pipeline runs in the frontend) carries token ids instead of
deltas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from helios_serve.config import ServeOptions
from helios_serve.engine.plan import TokenLogprob
from helios_serve.events import (
    AdmissionReason,
    Event,
    Failed,
    Finished,
    FinishReason,
    GenerationRequest,
    Output,
    PromptScores,
    Rejected,
    TokenObserved,
)
from helios_serve.frontend.deltas import (
    ContentDelta,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallStart,
)
from helios_serve.frontend.prepare import PipelineArgs, RequestData

# engine -> frontend message kinds (first element of the array)
STEP_EVENTS = 0  # [0, [[request_id, [event, ...]], ...]]
METRICS_REPLY = 1  # [1, token, families]  (see metrics.engine_families)
HEARTBEAT = 2  # [2, steps]: the worker's step counter (liveness.StallWatch)
FINAL_SNAPSHOT = 0  # the scrape token of the metrics the engine sends as it exits


@dataclass(frozen=True)
class EngineSpec:
    """What the engine process needs to load the model (pickled into the spawned process
    once, at startup)."""

    core: str
    trust: list[str]
    accept: str
    options: ServeOptions
    resource_key: bytes | None
    clock_origin_ns: int  # the frontend's ObservationClock origin
    # Benchmarks: a picklable `factory(bootstrap, settings) -> model` used in place of
    # NativeModel.load (testing.paced.PacedEngineModel: an emulated device).
    model_factory: Any = None


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """Engine side: one sampled id of a relayed choice, carried in `Output.deltas` in
    place of presentation deltas (the frontend's pipeline turns it into text)."""

    token_id: int


class WireRequest(msgspec.Struct, array_like=True):
    """One admitted request as it crosses to the engine: its `RequestData` as it is,
    where its choices sit in the response, and the data the engine rebuilds its output
    objects from (`engine_process.engine_request`): the pipeline's arguments and the
    grammar's source, only when the engine runs the choices' output pipelines."""

    request_id: int
    enqueue_ns: int | None
    first_index: int  # its first choice's index in the response
    relayed: bool  # no host feedback: the frontend runs the output pipeline
    data: RequestData  # prompt_text "" when relayed (only the frontend's pipeline reads it)
    pipeline: PipelineArgs | None  # the engine's pipelines (requests needing feedback)
    grammar: str | None  # the Lark grammar llguidance compiled in the frontend

    @classmethod
    def of(cls, request: GenerationRequest) -> WireRequest:
        """The frontend's side: `request` as the engine receives it."""
        prepared = request.prepared
        relayed = not prepared.needs_feedback
        grammar = prepared.output.grammar
        data = prepared.data
        if relayed:
            data = msgspec.structs.replace(data, prompt_text="")
        return cls(request.request_id, request.enqueue_ns, request.choices[0].index, relayed,
                   data, None if relayed else prepared.output.pipeline,
                   None if grammar is None else grammar.lark)


class Admit(msgspec.Struct, tag=True, array_like=True):
    requests: list[WireRequest]


class Cancel(msgspec.Struct, tag=True, array_like=True):
    request_ids: list[int]


class Scrape(msgspec.Struct, tag=True, array_like=True):
    token: int


class Stop(msgspec.Struct, tag=True, array_like=True):
    pass


ToEngine = Admit | Cancel | Scrape | Stop

encoder = msgspec.msgpack.Encoder()
to_engine_decoder = msgspec.msgpack.Decoder(ToEngine)
to_frontend_decoder = msgspec.msgpack.Decoder()


def encode_delta(d: Any) -> list:
    if type(d) is ContentDelta:
        return [0, d.text]
    if type(d) is ReasoningDelta:
        return [1, d.text]
    if type(d) is ToolCallStart:
        return [2, d.index, d.id, d.name]
    if type(d) is ToolCallArguments:
        return [3, d.index, d.text]
    raise TypeError(f"not a presentation delta: {d!r}")


def decode_delta(x: list) -> Any:
    kind = x[0]
    if kind == 0:
        return ContentDelta(x[1])
    if kind == 1:
        return ReasoningDelta(x[1])
    if kind == 2:
        return ToolCallStart(x[1], x[2], x[3])
    return ToolCallArguments(x[1], x[2])


def encode_event(e: Event) -> list:
    """One event as a MessagePack-ready array (the table in the module docstring)."""
    if type(e) is Output:
        deltas = e.deltas
        if len(deltas) == 1 and type(deltas[0]) is TokenDelta:  # a relayed token (per step)
            return [0, e.choice, e.completion_tokens, None, [deltas[0].token_id],
                    _encode_logprobs(e.logprobs) if e.logprobs else []]
        tokens = [d.token_id for d in e.deltas if type(d) is TokenDelta]
        deltas = None if tokens else [encode_delta(d) for d in e.deltas]
        return [0, e.choice, e.completion_tokens, deltas, tokens or None,
                _encode_logprobs(e.logprobs)]
    if type(e) is TokenObserved:
        return [1, e.choice, e.token_id, e.timestamp_ns]
    if type(e) is Finished:
        return [2, e.choice, e.reason.value, e.prompt_tokens, e.completion_tokens,
                e.reused_prompt_tokens]
    if type(e) is Rejected:
        return [3, e.message, None if e.reason is None else e.reason.value]
    if type(e) is Failed:
        return [4, e.message]
    if type(e) is PromptScores:
        return [5, e.choice, _encode_logprobs(e.logprobs)]
    raise TypeError(f"not an event: {e!r}")


def _encode_logprobs(logprobs: tuple[TokenLogprob, ...]) -> list:
    return [[lp.token_id, lp.logprob, [list(t) for t in lp.top]] for lp in logprobs]


def decode_logprobs(x: list) -> tuple[TokenLogprob, ...]:
    return tuple(TokenLogprob(t, lp, tuple((a, b) for a, b in top)) for t, lp, top in x)


def decode_event(x: list) -> Event:
    """The event an array encodes (a relayed choice's token Output is read by the
    frontend directly: its pipeline makes the deltas)."""
    kind = x[0]
    if kind == 0:
        if x[4] is not None:
            raise ValueError("a relayed choice's tokens have no presentation deltas yet")
        return Output(tuple(decode_delta(d) for d in x[3]), x[1], decode_logprobs(x[5]), x[2])
    if kind == 1:
        return TokenObserved(x[2], x[3], x[1])
    if kind == 2:
        return Finished(FinishReason(x[2]), x[3], x[4], x[5], x[1])
    if kind == 3:
        return Rejected(x[1], None if x[2] is None else AdmissionReason(x[2]))
    if kind == 5:
        return PromptScores(decode_logprobs(x[2]), x[1])
    return Failed(x[1])
