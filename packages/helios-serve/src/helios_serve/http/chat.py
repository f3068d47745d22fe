"""Chat completions: admission, preparation, submission and delivery of one request.

    parse (400) -> permit (429) -> preparation slot -> template, tokenize, stops,
    pipeline (400) -> enqueue (503 if the ingress channel is full) -> events -> JSON/SSE

Status codes come from the error table (`errors.ERROR_TABLE`): scheduler rejection is
503 before SSE headers and a terminal `admission_rejected` error event after them;
execution failure is 500 before headers and a terminal `server_error` event after them.
A dropped connection cancels the request; the permit is released when the reader
releases the response.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from helios_tools.frontend_assets import ChatTemplateError, render_chat

from helios_serve.bootstrap import Bootstrap
from helios_serve.clock import ObservationClock
from helios_serve.config import ServeSettings
from helios_serve.engine.plan import SamplingParams
from helios_serve.events import (
    EventSink,
    Failed,
    Finished,
    GenerationRequest,
    Output,
    Rejected,
    TokenObserved,
)
from helios_serve.frontend.deltas import accumulate, coalesce
from helios_serve.frontend.errors import FrontendRequestError
from helios_serve.frontend.grammar import GrammarCompiler
from helios_serve.frontend.stops import parse_stops
from helios_serve.http import responses
from helios_serve.http.admission import Admission, Permit
from helios_serve.http.errors import (
    AdmissionRejected,
    ApiError,
    ExecutionFailed,
    InvalidRequest,
    ModelNotFound,
    ShuttingDown,
)
from helios_serve.http.schema import ChatCompletionRequest, parse_request
from helios_serve.metrics import REJECT_INVALID, Metrics
from helios_serve.worker import ModelWorker

_request_ids = itertools.count(1)


@dataclass
class Prepared:
    """Output of preparation (runs in a preparation thread)."""

    prompt_text: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    max_output_tokens: int
    pipeline: Any
    grammar: Any
    has_string_stops: bool
    has_host_stops: bool = False


class ChatService:
    """Everything a chat request needs; one per server, used on the HTTP event loop."""

    def __init__(
        self,
        bootstrap: Bootstrap,
        worker: ModelWorker,
        settings: ServeSettings,
        metrics: Metrics,
        clock: ObservationClock,
    ) -> None:
        self.bootstrap = bootstrap
        self.worker = worker
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.admission: Admission | None = None  # made on the event loop (lifespan)
        self.created = int(time.time())
        self.draining = False
        # llguidance token table, built once; masks cover the sampled vocabulary.
        self.grammars = GrammarCompiler(bootstrap.frontend, vocab_size=worker.geometry.vocab_size)
        names = (settings.served_name, *settings.aliases)
        self.model_names = frozenset(n for n in names if n)

    def start(self) -> None:
        """On the event loop, before serving."""
        self.admission = Admission(
            self.settings.http_capacity, self.settings.frontend_workers, self.metrics
        )

    def close(self) -> None:
        if self.admission is not None:
            self.admission.close()

    # -- the handler ---------------------------------------------------------------

    async def chat(self, body: bytes, disconnected: asyncio.Future | None = None):
        """Serve one POST /v1/chat/completions body.

        Returns:
            A JSON-able dict plus the permit to release after sending (non-stream), or an
            async byte iterator of SSE events (stream).

        Raises:
            ApiError: mapped to a status by the error table.
        """
        self.metrics.requests_received.inc()
        if self.draining:
            raise ShuttingDown("the server is shutting down")
        try:
            request = parse_request(body)
        except InvalidRequest:
            self.metrics.requests_rejected.labels(REJECT_INVALID).inc()
            raise
        ingress_ns = self.clock.now_ns()  # after JSON decoding, before preparation
        if request.model not in self.model_names:
            self.metrics.requests_rejected.labels(REJECT_INVALID).inc()
            raise ModelNotFound(
                f"model {request.model!r} is not served here; available: "
                f"{', '.join(sorted(self.model_names))}",
                param="model",
            )
        assert self.admission is not None
        permit = self.admission.acquire()
        try:
            prepared = await self.admission.prepare(self._prepare, request)
        except FrontendRequestError as exc:
            permit.release()
            self.metrics.requests_rejected.labels(REJECT_INVALID).inc()
            raise InvalidRequest(exc.message, param=exc.field) from None
        except InvalidRequest:
            permit.release()
            self.metrics.requests_rejected.labels(REJECT_INVALID).inc()
            raise
        except BaseException:
            permit.release()
            raise
        sink = EventSink(asyncio.get_running_loop())
        observe_ids = bool(request.return_token_ids)
        observe_timestamps = bool(request.return_token_timestamps)
        enqueue_ns = self.clock.now_ns()  # immediately before submission
        generation = GenerationRequest(
            request_id=next(_request_ids),
            prompt_token_ids=prepared.prompt_token_ids,
            sampling=prepared.sampling,
            max_output_tokens=prepared.max_output_tokens,
            sink=sink,
            pipeline=prepared.pipeline,
            grammar=prepared.grammar,
            has_string_stops=prepared.has_string_stops,
            has_host_stops=prepared.has_host_stops,
            observe_ids=observe_ids,
            observe_timestamps=observe_timestamps,
            enqueue_ns=enqueue_ns,
        )
        if not self.worker.submit(generation):
            permit.release()
            self.metrics.requests_rejected.labels("scheduler").inc()
            if self.worker.crashed is not None or not self.worker.alive:
                raise AdmissionRejected("the model worker is not running")
            raise AdmissionRejected("the model queue is full; retry later")
        ctx = responses.ResponseContext(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=self.settings.served_name,
            prompt_token_ids=prepared.prompt_token_ids,
            observe_ids=observe_ids,
            observe_timestamps=observe_timestamps,
            include_usage=bool(request.stream_options and request.stream_options.include_usage),
            ingress_ns=ingress_ns,
            enqueue_ns=enqueue_ns,
            capacity_param=self._capacity_param(request, len(prepared.prompt_token_ids)),
        )
        if request.stream:
            return self._stream(ctx, generation, permit)
        return await self._complete(ctx, generation, permit, disconnected)

    # -- preparation (preparation thread) -----------------------------------------------

    def _prepare(self, request: ChatCompletionRequest) -> Prepared:
        b = self.bootstrap
        geometry = self.worker.geometry
        messages = [_message_dict(m) for m in request.messages]
        tools = [t.model_dump(exclude_none=True) for t in request.tools] if request.tools else None
        try:
            prompt_text = render_chat(
                b.chat_template,
                messages,
                add_generation_prompt=True,
                tools=tools,
                **b.template_variables,
            )
        except ChatTemplateError as exc:
            raise InvalidRequest(f"messages: {exc}", param="messages") from None
        prompt_ids = tuple(b.tokenizer.encode(prompt_text, add_special_tokens=False).ids)
        stops = parse_stops(
            request.stop,
            request.stop_token_ids,
            request.stop_token_sequences,
            vocab_size=geometry.vocab_size,
            structured_output=request.structured,
        )
        fmt = (request.response_format or {}).get("type")
        pipeline = b.frontend.output_pipeline(
            prompt_text=prompt_text,
            prompt_ids=prompt_ids,
            tools=tools,
            tool_choice=request.tool_choice if request.tool_choice is not None else "auto",
            parallel_tool_calls=request.parallel_tool_calls is not False,
            stops=stops,
            structured_answer=fmt in ("json_object", "json_schema"),
        )
        grammar = self.grammars.for_request(
            response_format=request.response_format,
            tools=tools,
            tool_choice=request.tool_choice if request.tool_choice is not None else "auto",
            parallel_tool_calls=request.parallel_tool_calls is not False,
            prompt_text=prompt_text,
        )
        return Prepared(
            prompt_text=prompt_text,
            prompt_token_ids=prompt_ids,
            sampling=self._sampling(request),
            max_output_tokens=self._output_limit(request, len(prompt_ids)),
            pipeline=pipeline,
            grammar=grammar,
            has_string_stops=stops.needs_host_stop_barrier,
            has_host_stops=stops.has_host_stops,
        )

    def _sampling(self, r: ChatCompletionRequest) -> SamplingParams:
        """Explicit request values win over the core's sampling defaults."""
        d = self.bootstrap.defaults.sampling

        def given(value, default):
            return default if value is None else value

        top_k = given(r.top_k, d.top_k)
        seed = r.seed if r.seed is not None else secrets.randbits(64)
        return SamplingParams(
            temperature=float(given(r.temperature, d.temperature)),
            top_p=float(given(r.top_p, d.top_p if d.top_p > 0 else 1.0)),
            top_k=max(0, int(top_k)),  # -1 (OpenAI-compatible "disabled") is 0 here
            min_p=float(given(r.min_p, d.min_p)),
            presence_penalty=float(given(r.presence_penalty, d.presence_penalty)),
            frequency_penalty=float(given(r.frequency_penalty, d.frequency_penalty)),
            repetition_penalty=float(
                given(
                    r.repetition_penalty, d.repetition_penalty if d.repetition_penalty > 0 else 1.0
                )
            ),
            seed=seed % 2**64,
        )

    def _output_limit(self, r: ChatCompletionRequest, prompt_tokens: int) -> int:
        """An explicit limit is kept (the scheduler rejects one outside the context); the
        default is the core's default output limit, cut to the context left."""
        explicit = r.max_completion_tokens or r.max_tokens
        if explicit is not None:
            return explicit
        room = self.worker.geometry.context_tokens - prompt_tokens
        default = self.bootstrap.defaults.sampling.max_output_tokens or room
        return max(1, min(default, room))

    def _capacity_param(self, r: ChatCompletionRequest, prompt_tokens: int) -> str | None:
        """The field a capacity rejection names: messages when the prompt with one output
        token already exceeds a prepared capacity, else the explicit output limit (None
        when the core's default limit applied)."""
        g = self.worker.geometry
        need = prompt_tokens + 1
        pages = -(-need // g.page_tokens)
        if need > g.context_tokens or pages > min(g.max_pages_per_request, g.num_pages):
            return "messages"
        if r.max_completion_tokens is not None:
            return "max_completion_tokens"
        return "max_tokens" if r.max_tokens is not None else None

    # -- delivery -----------------------------------------------------------------------

    async def _complete(
        self,
        ctx: responses.ResponseContext,
        generation: GenerationRequest,
        permit: Permit,
        disconnected: asyncio.Future | None,
    ) -> tuple[dict[str, Any], Permit]:
        deltas: list[Any] = []
        try:
            while True:
                event = await _next_event(generation.sink, disconnected)
                if isinstance(event, TokenObserved):
                    ctx.token_ids.append(event.token_id)
                    if event.timestamp_ns is not None:
                        ctx.token_timestamps_ns.append(event.timestamp_ns)
                elif isinstance(event, Output):
                    deltas.extend(event.deltas)
                elif isinstance(event, Finished):
                    result = accumulate(deltas, event.reason.value)
                    return responses.completion(ctx, result, event), permit
                elif isinstance(event, Rejected):
                    raise _rejection(ctx, event)
                elif isinstance(event, Failed):
                    raise ExecutionFailed(event.message)
        except ClientDisconnected:
            self.worker.cancel(generation.request_id)
            permit.release()
            raise
        except ApiError:
            permit.release()
            raise
        except BaseException:  # cancelled handler: the reader is gone
            self.worker.cancel(generation.request_id)
            permit.release()
            raise

    def _stream(
        self, ctx: responses.ResponseContext, generation: GenerationRequest, permit: Permit
    ) -> SseStream:
        return SseStream(self.worker, ctx, generation, permit)


class SseStream:
    """One SSE response: `events()` yields the bytes; `close()` (idempotent) cancels an
    unfinished request (the reader dropped it) and releases the admission permit.

    The HTTP layer calls `close` after the response ends however it ends (completed,
    disconnected, or never started); the generator calls it too when it finishes.
    """

    def __init__(
        self,
        worker: ModelWorker,
        ctx: responses.ResponseContext,
        generation: GenerationRequest,
        permit: Permit,
    ) -> None:
        self._worker = worker
        self._ctx = ctx
        self._generation = generation
        self._permit = permit
        self._terminal = False
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._terminal:
            self._worker.cancel(self._generation.request_id)
        self._permit.release()

    async def events(self) -> AsyncIterator[bytes]:
        """The SSE bytes: one write per batch of events that arrived together.

        After one awaited event, every event already queued joins it (a reader that fell
        behind writes its backlog at once); consecutive presentation deltas of an
        unobserved response become one chunk (frontend.deltas.coalesce).
        """
        ctx = self._ctx
        sink = self._generation.sink
        try:
            yield responses.role_chunk(ctx)
            while True:
                events = [await sink.get(), *sink.drain()]
                out: list[bytes] = []
                deltas: list = []  # presentation deltas not yet encoded, in order
                for event in events:
                    if isinstance(event, Output):
                        deltas.extend(event.deltas)
                        continue
                    if deltas:
                        out.append(responses.delta_chunks(ctx, coalesce(deltas)))
                        deltas = []
                    if isinstance(event, TokenObserved):
                        out.append(responses.observation_chunk(ctx, event.token_id,
                                                               event.timestamp_ns))
                    elif isinstance(event, Finished):
                        self._terminal = True
                        out.append(responses.terminal_chunks(ctx, event))
                        break
                    elif isinstance(event, Rejected | Failed):
                        self._terminal = True
                        error: ApiError = (
                            _rejection(ctx, event)
                            if isinstance(event, Rejected)
                            else ExecutionFailed(event.message)
                        )
                        out.append(responses.error_event(error.body()))
                        break
                if deltas:
                    out.append(responses.delta_chunks(ctx, coalesce(deltas)))
                data = b"".join(out)
                if data:  # (an empty chunk would end a chunked HTTP body)
                    yield data
                if self._terminal:
                    return
        finally:
            self.close()


def _rejection(ctx: responses.ResponseContext, event: Rejected) -> AdmissionRejected:
    return AdmissionRejected(event.message, param=ctx.capacity_param if event.capacity else None)


class ClientDisconnected(Exception):
    """The client closed the connection while a non-streaming request ran."""


async def _next_event(sink: EventSink, disconnected: asyncio.Future | None):
    if disconnected is None:
        return await sink.get()
    getter = asyncio.ensure_future(sink.get())
    done, _ = await asyncio.wait({getter, disconnected}, return_when=asyncio.FIRST_COMPLETED)
    if getter in done:
        return getter.result()
    getter.cancel()
    raise ClientDisconnected()


def _message_dict(message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.text()}
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls:
        out["tool_calls"] = [c.model_dump() for c in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.reasoning_content is not None:
        out["reasoning_content"] = message.reasoning_content
    return out
