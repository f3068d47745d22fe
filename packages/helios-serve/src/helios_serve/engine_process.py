"""helios-serve --engine-process: the engine's side, the model worker in its own
process (the frontend's side is `engine_client.EngineClient`).

    frontend process                         engine process (spawned)
    uvicorn + Litestar, admission,   Admit   Bootstrap.load -> NativeModel.load
    preparation, relayed pipelines  ------>  ModelWorker (scheduler, model, packing,
    SSE / JSON, /metrics            <------  feedback requests' pipelines, grammar)
                                     step
                                    events

docs/serving.md, "Design: engine process + frontend process (vLLM V1's split)". One
process serves at most 1 / (worker + HTTP loop) GIL-held time per token; split, each
process's GIL holds only its own share.

The channel is a `multiprocessing.connection.Connection` over a socket pair
(length-prefixed messages);
its payloads are msgspec MessagePack (`wire`). Frontend -> engine: one `Admit` per
admitted request, `Cancel` when a reader drops its response, `Scrape` for /metrics and
`Stop`. Engine -> frontend: one message per step with every response's events of that
step (the worker's `deliver` posts them to `_Channel`), scrape replies, and a heartbeat
(the worker's step counter, every HEARTBEAT_S while it moves) from which the frontend
judges liveness (docs/api.md, "Engine liveness": a stopped or stuck engine with work
makes /health 503 after --engine-stall-timeout; /metrics stays bounded).

A request without host feedback (no grammar, string or token stop) is *relayed*: its
choices run a `TokenRelay` in the engine (EOS and the output limit decided there, as
the worker always does), its token ids cross the channel and its real `OutputPipeline`
runs in the frontend, which decides the finish reason (`tool_calls` from its tool
parser) and counts the finished request. A request with feedback runs its pipeline and
grammar in the engine (the host-stop barrier needs the decision before the next round)
and its presentation deltas cross the channel.

Kept from the one-process server: TTFT / ITL stamps are taken in the engine right after
`complete` on a clock with the frontend's origin (CLOCK_MONOTONIC is system-wide);
`Finished` carries the scheduler's reused-prompt counts; `Rejected` / `Failed` before
headers are 503 / 500 (a full engine ingress answers `Rejected`); a dropped reader
cancels through the channel. The engine process exiting fails every live request
(`Failed`: 500 before headers, an SSE error event after; counted
requests_finished{reason="error"} in the frontend) and makes /health 503; /metrics keeps
the engine's last counters (each scrape's reply, and the snapshot the engine sends as
it exits) with its gauges at 0 (`metrics.dead_engine_families`). A startup failure in the engine process comes back as one `StartupError` line (exit 2).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from helios_serve.bootstrap import Bootstrap, StartupError
from helios_serve.clock import ObservationClock
from helios_serve.events import (
    ChoiceState,
    FinishReason,
    GenerationRequest,
    SinkBase,
)
from helios_serve.frontend.grammar import GrammarCompiler
from helios_serve.frontend.pipeline import Frontend
from helios_serve.frontend.prepare import OutputRecipe, PipelineArgs, PreparedRequest
from helios_serve.loading import cache_sizing, core_path, load_model, resolve_settings, startup_log
from helios_serve.metrics import Metrics, engine_families
from helios_serve.scheduler.finish import ending_eos_ids
from helios_serve.wire import (
    FINAL_SNAPSHOT,
    HEARTBEAT,
    METRICS_REPLY,
    STEP_EVENTS,
    Admit,
    Cancel,
    EngineSpec,
    Scrape,
    Stop,
    TokenDelta,
    WireRequest,
    encode_event,
    encoder,
    to_engine_decoder,
)
from helios_serve.worker_host import build_worker

log = logging.getLogger(__name__)

WORKER_CHECK_S = 0.2  # the engine's main thread notices a crashed worker this often
# The worker's step counter goes to the frontend this often (when it moved): its
# liveness.StallWatch judges progress from it, so this must stay well below the
# smallest --engine-stall-timeout an operator would set.
HEARTBEAT_S = 0.5


class TokenRelay:
    """Engine side: the output pipeline of a relayed choice (no host feedback).

    The worker asks it what an `OutputPipeline` answers before the text exists: whether it
    finished (at EOS; the request's end itself is scheduler/finish.py's rule). `feed` hands
    the id on as a `TokenDelta`; the frontend's pipeline turns it into text.
    """

    matched_stop = False  # no stops: relayed requests have none

    # One TokenDelta per id, shared by every relay (immutable; at most the vocabulary):
    # `feed` runs for every relayed token of every step.
    _deltas: dict[int, TokenDelta] = {}

    def __init__(self, eos_token_ids: frozenset[int]) -> None:
        self._eos = eos_token_ids
        self.finish_reason: FinishReason | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def feed(self, token_id: int) -> list[Any]:
        if token_id in self._eos:
            self.finish_reason = FinishReason.STOP  # the frontend may say tool_calls
        delta = self._deltas.get(token_id)
        if delta is None:
            delta = self._deltas[token_id] = TokenDelta(token_id)
        return [delta]

    def finish(self, reason: FinishReason | str) -> list[Any]:
        if self.finish_reason is None:
            self.finish_reason = FinishReason(reason)
        return []


class _Channel:
    """Engine side: the one "mailbox" of every remote sink. `deliver` posts a step's
    accepted events here: one message per step for every response."""

    def __init__(self, conn) -> None:
        self._conn = conn
        self._lock = threading.Lock()  # worker thread (events) and main thread (replies)
        self.broken = False

    def post(self, accepted: list[tuple[SinkBase, list]]) -> None:
        self.send([STEP_EVENTS, [[sink.request_id, [encode_event(e) for e in events]]  # type: ignore[attr-defined]
                                 for sink, events in accepted]])

    def send(self, message: Any) -> None:
        data = encoder.encode(message)
        with self._lock:
            if self.broken:
                return
            try:
                self._conn.send_bytes(data)
            except OSError:  # the frontend is gone: the main thread stops the engine
                self.broken = True


class _RemoteSink(SinkBase):
    """Engine side: a request's sink; its events go to the frontend through the channel."""

    def __init__(self, request_id: int, choices: int, channel: _Channel) -> None:
        super().__init__(choices)
        self.request_id = request_id
        self._mailbox = channel


def engine_request(wire: WireRequest, frontend: Frontend, grammars: GrammarCompiler,
                   channel: _Channel, eos: frozenset[int]) -> GenerationRequest:
    """The engine's GenerationRequest for an admitted request: the one place the output
    objects that cannot cross are rebuilt from data. Relayed choices get a TokenRelay,
    the others their own pipeline and grammar (compiled again here)."""
    data = wire.data
    grammar = grammars.compile(wire.grammar) if wire.grammar else None
    pipeline = wire.pipeline or PipelineArgs(data.prompt_token_ids, data.stops)
    prepared = PreparedRequest.rebuild(data, OutputRecipe(frontend, pipeline, grammar))
    sink = _RemoteSink(wire.request_id, data.n, channel)
    if not wire.relayed:
        return GenerationRequest.build(wire.request_id, prepared, sink, wire.enqueue_ns,
                                       wire.first_index)
    relay_eos = ending_eos_ids(eos, data.ignore_eos)
    choices = tuple(ChoiceState(wire.first_index + i, prepared.choice_sampling(i),
                                TokenRelay(relay_eos), None, relayed=True)  # type: ignore[arg-type]
                    for i in range(data.n))
    return GenerationRequest(wire.request_id, prepared, choices, sink, wire.enqueue_ns)


def run_engine(fd: int) -> None:
    """The engine process's entry: its end of the channel is file descriptor `fd`; the
    first message on it is the pickled EngineSpec."""
    conn = Connection(fd)
    try:
        spec = conn.recv()
    except (EOFError, OSError):
        sys.exit(1)
    engine_main(conn, spec)


def engine_main(conn: Connection, spec: EngineSpec) -> None:
    """The engine process: load, report ("ready", geometry) or ("error", line, rule),
    then serve the channel until Stop or until the frontend disappears."""
    # The frontend owns this process's lifetime (Stop, or EOF when it is gone): a
    # terminal's Ctrl-C or a SIGTERM sent to the process group must let the frontend
    # drain its requests through this engine, not kill it first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s engine %(name)s: %(message)s")
    options = spec.options
    try:
        cache = cache_sizing(options)
        startup = startup_log("engine: ")
        path = core_path(spec.core)
        bootstrap = Bootstrap.load(path, spec.trust, spec.accept,
                                   resource_key=spec.resource_key, log=startup)
        settings = resolve_settings(options, bootstrap)
        model = (spec.model_factory(bootstrap, settings) if spec.model_factory is not None
                 else load_model(bootstrap, path, options, settings, cache, startup))
        clock = ObservationClock()
        clock.origin_ns = spec.clock_origin_ns
        metrics = Metrics()
        worker = build_worker(model, settings, clock, metrics)
        grammars = GrammarCompiler(bootstrap.frontend, vocab_size=worker.geometry.vocab_size)
    except StartupError as exc:
        try:
            conn.send(("error", str(exc), exc.rule))
        except OSError:  # the frontend is gone
            pass
        conn.close()
        sys.exit(2)
    try:
        conn.send(("ready", worker.geometry))
    except OSError:  # the frontend died while this engine loaded
        model.close()
        bootstrap.close()
        sys.exit(1)
    channel = _Channel(conn)
    eos = frozenset(bootstrap.eos_token_ids)
    worker.start()
    code = 0
    beat_at, beat_steps = 0.0, -1
    try:
        while True:
            if channel.broken:
                break
            now = time.monotonic()
            if now - beat_at >= HEARTBEAT_S:
                beat_at = now
                if worker.steps != beat_steps:  # a stuck worker sends nothing new
                    beat_steps = worker.steps
                    channel.send([HEARTBEAT, beat_steps])
            if not worker.alive:  # crashed: its requests failed; the frontend sees us exit
                code = 1
                break
            if not conn.poll(WORKER_CHECK_S):
                continue
            try:
                message = to_engine_decoder.decode(conn.recv_bytes())
            except (EOFError, OSError):  # the frontend is gone
                break
            if type(message) is Admit:
                for wire in message.requests:
                    request = engine_request(wire, bootstrap.frontend, grammars, channel, eos)
                    if not worker.submit(request):
                        why = ("the model worker is not running" if not worker.alive
                               else "the model queue is full; retry later")
                        worker._reject(request, why)
            elif type(message) is Cancel:
                for request_id in message.request_ids:
                    worker.cancel(request_id)
            elif type(message) is Scrape:
                channel.send([METRICS_REPLY, message.token, engine_families(metrics)])
            elif type(message) is Stop:
                break
    finally:
        worker.stop()
        # The last counts (the requests the worker failed as it stopped or crashed
        # included): the frontend keeps serving them after this process is gone.
        channel.send([METRICS_REPLY, FINAL_SNAPSHOT, engine_families(metrics)])
        bootstrap.close()
        conn.close()
    sys.exit(code)


__all__ = ["TokenRelay", "engine_main", "engine_request", "run_engine"]
