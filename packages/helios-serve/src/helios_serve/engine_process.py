"""helios-serve --engine-process: the model worker in its own process.

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
step (the worker's `deliver` posts them to `_Channel`), and scrape replies.

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

import asyncio
import atexit
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from helios_serve.bootstrap import StartupError
from helios_serve.config import ServeOptions
from helios_serve.engine.plan import ModelGeometry
from helios_serve.events import (
    ChoiceState,
    EventSink,
    Failed,
    Finished,
    FinishReason,
    GenerationRequest,
    Output,
    Rejected,
    SinkBase,
)
from helios_serve.metrics import dead_engine_families, engine_families
from helios_serve.scheduler.finish import ending_eos_ids
from helios_serve.wire import (
    METRICS_REPLY,
    STEP_EVENTS,
    Admit,
    Cancel,
    Scrape,
    Stop,
    TokenDelta,
    WireRequest,
    decode_event,
    decode_logprobs,
    encode_event,
    encoder,
    to_engine_decoder,
    to_frontend_decoder,
)

log = logging.getLogger(__name__)

ENGINE_START_TIMEOUT_S = 3600.0  # a large core's verification and load (cuda: capture)
ENGINE_STOP_TIMEOUT_S = 15.0
WORKER_CHECK_S = 0.2  # the engine's main thread notices a crashed worker this often
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


# -- engine side ----------------------------------------------------------------------


class TokenRelay:
    """Engine side: the output pipeline of a relayed choice (no host feedback).

    The worker asks it what an `OutputPipeline` answers before the text exists: whether it
    finished (at EOS; the request's end itself is scheduler/finish.py's rule). `feed` hands
    the id on as a `TokenDelta`; the frontend's pipeline turns it into text.
    """

    matched_stop = False  # no stops: relayed requests have none

    def __init__(self, eos_token_ids: frozenset[int]) -> None:
        self._eos = eos_token_ids
        self.finish_reason: FinishReason | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def feed(self, token_id: int) -> list[Any]:
        if token_id in self._eos:
            self.finish_reason = FinishReason.STOP  # the frontend may say tool_calls
        return [TokenDelta(token_id)]

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


def _engine_requests(wire: WireRequest, frontend, grammars, channel: _Channel,
                     eos: frozenset[int]) -> GenerationRequest:
    """The engine's GenerationRequest for an admitted request: relayed choices get a
    TokenRelay, the others their own pipeline and grammar (compiled again here)."""
    from helios_serve.frontend.prepare import OutputRecipe, PipelineArgs, PreparedRequest

    grammar = grammars.compile(wire.grammar, wire.grammar_field) if wire.grammar else None
    pipeline = wire.pipeline or PipelineArgs(wire.prompt_token_ids, wire.stops)
    prepared = PreparedRequest(
        prompt_text=wire.prompt_text, prompt_token_ids=wire.prompt_token_ids,
        sampling=wire.sampling, max_output_tokens=wire.max_output_tokens,
        limit_field=wire.limit_field, prompt_field=wire.prompt_field, stops=wire.stops,
        output=OutputRecipe(frontend, pipeline, grammar), n=wire.n, logprobs=wire.logprobs,
        logit_bias=wire.logit_bias, ignore_eos=wire.ignore_eos, min_tokens=wire.min_tokens,
        observe_ids=wire.observe_ids, observe_timestamps=wire.observe_timestamps,
        publish_endpoints=wire.publish_endpoints,
    )  # fmt: skip
    sink = _RemoteSink(wire.request_id, wire.n, channel)
    if not wire.relayed:
        return GenerationRequest.build(wire.request_id, prepared, sink, wire.enqueue_ns,
                                       wire.first_index)
    relay_eos = ending_eos_ids(eos, wire.ignore_eos)
    choices = tuple(ChoiceState(wire.first_index + i, prepared.choice_sampling(i),
                                TokenRelay(relay_eos), None, relayed=True)  # type: ignore[arg-type]
                    for i in range(wire.n))
    return GenerationRequest(wire.request_id, prepared, choices, sink, wire.enqueue_ns)


class _Process:
    """The engine's `subprocess.Popen` with the few process calls the client makes."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self._popen = popen
        self.pid = popen.pid

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()

    def join(self, timeout_s: float | None = None) -> None:
        try:
            self._popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()


def run_engine(fd: int) -> None:
    """The engine process's entry: its end of the channel is file descriptor `fd`; the
    first message on it is the pickled EngineSpec."""
    conn = Connection(fd)
    try:
        spec = conn.recv()
    except (EOFError, OSError):
        sys.exit(1)
    engine_main(conn, spec)


def engine_main(conn, spec: EngineSpec) -> None:
    """The engine process: load, report ("ready", geometry) or ("error", line, rule),
    then serve the channel until Stop or until the frontend disappears."""
    from helios_serve.bootstrap import Bootstrap
    from helios_serve.cli import _cache_sizing, _core_path, _startup_log, load_model
    from helios_serve.clock import ObservationClock
    from helios_serve.config import resolve
    from helios_serve.frontend.grammar import GrammarCompiler
    from helios_serve.metrics import Metrics
    from helios_serve.worker import ModelWorker

    # The frontend owns this process's lifetime (Stop, or EOF when it is gone): a
    # terminal's Ctrl-C or a SIGTERM sent to the process group must let the frontend
    # drain its requests through this engine, not kill it first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s engine %(name)s: %(message)s")
    options = spec.options
    try:
        cache = _cache_sizing(options)
        startup = _startup_log("engine: ")
        path = _core_path(spec.core)
        bootstrap = Bootstrap.load(path, spec.trust, spec.accept,
                                   resource_key=spec.resource_key, log=startup)
        try:
            settings = resolve(options, bootstrap.contract)
        except ValueError as exc:
            raise StartupError(str(exc)) from None
        model = (spec.model_factory(bootstrap, settings) if spec.model_factory is not None
                 else load_model(bootstrap, path, options, settings, cache, startup))
        clock = ObservationClock()
        clock.origin_ns = spec.clock_origin_ns
        metrics = Metrics()
        counters = getattr(getattr(model, "backend", None), "counters", None)
        if counters is not None:
            metrics.watch_runtime(lambda: counters, model.frames)
        worker = ModelWorker(model, clock, metrics, max_active=settings.max_active,
                             queue_capacity=settings.queue_capacity,
                             history_drafting=settings.history_drafting,
                             width_policy=settings.width_policy,
                             stream_interval=settings.stream_interval)
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
    try:
        while True:
            if channel.broken:
                break
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
                    request = _engine_requests(wire, bootstrap.frontend, grammars, channel, eos)
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


# -- frontend side --------------------------------------------------------------------


@dataclass
class _Remote:
    """Frontend side: one request the engine runs."""

    request: GenerationRequest
    unfinished: int  # choices without a Finished yet
    relayed: bool
    first: int = 0  # the first choice's index in the response
    pipelines: list = dataclasses.field(default_factory=list)  # relayed: by choice - first


class EngineClient:
    """Frontend side of the engine process: what the HTTP layer needs of a model worker
    (`submit`, `cancel`, `geometry`, `alive`, `crashed`, `start`, `stop`) plus the scrape
    of the engine's metrics. Every method runs on the HTTP event loop except `start` and
    `stop`.

    Args:
        process: the spawned engine process.
        conn: the frontend's end of the channel.
        geometry: the serving geometry the engine reported.
    """

    def __init__(self, process: _Process, conn: Connection, geometry: ModelGeometry) -> None:
        self._process = process
        self._conn = conn
        self.geometry = geometry
        self.metrics = None  # the frontend's Metrics (Server sets it): relayed finishes
        self.crashed: str | None = None
        self._live: dict[int, _Remote] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scrapes: dict[int, asyncio.Future] = {}
        self._scrape_ids = 0  # FINAL_SNAPSHOT (0) is never a scrape's token
        self._families: list = []  # the engine's metric families last received
        self._stopping = False

    @property
    def pid(self) -> int:
        return self._process.pid

    @classmethod
    def start(cls, spec: EngineSpec) -> EngineClient:
        """Start the engine process and wait until it loaded the model.

        The engine is a fresh interpreter (`python -c ... run_engine(fd)`) given one end
        of a socket pair: unlike multiprocessing's spawn it never re-imports the caller's
        main module, so a script without a `__main__` guard can start a server too.

        Raises:
            StartupError: the engine's own startup error (one line, its rule), or the
                process exited without one.
        """
        ours, theirs = socket.socketpair()
        code = f"from helios_serve.engine_process import run_engine; run_engine({theirs.fileno()})"
        process = _Process(subprocess.Popen([sys.executable, "-c", code],
                                            pass_fds=(theirs.fileno(),)))
        atexit.register(_reap, process)  # an engine left running when this process exits
        theirs.close()  # the engine holds the other end: its exit reads as EOF here
        parent = Connection(ours.detach())
        try:
            parent.send(spec)
            if not parent.poll(ENGINE_START_TIMEOUT_S):
                raise StartupError("the engine process did not finish loading within "
                                   f"{ENGINE_START_TIMEOUT_S:.0f} s")
            reply = parent.recv()
        except (EOFError, OSError):
            process.join(5.0)
            parent.close()
            raise StartupError(f"the engine process exited during startup (exit code "
                               f"{process.exitcode})") from None
        except BaseException:
            process.kill()
            parent.close()
            raise
        if reply[0] == "error":
            process.join(5.0)
            parent.close()
            raise StartupError(reply[1], reply[2])
        return cls(process, parent, reply[1])

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the HTTP event loop, before serving: read the channel there."""
        self._loop = loop
        fd = self._conn.fileno()
        loop.add_reader(fd, self._readable)
        # libuv (uvloop) makes a polled descriptor non-blocking; the channel's reads and
        # writes are whole messages: blocking, like the Connection expects.
        os.set_blocking(fd, True)

    # -- the model worker's interface (HTTP loop) -----------------------------------

    @property
    def alive(self) -> bool:
        return self.crashed is None and self._process.is_alive()

    def submit(self, request: GenerationRequest) -> bool:
        """Hand a prepared request to the engine; False when the engine is not running
        (a full engine ingress answers with a Rejected event instead)."""
        if self.crashed is not None or self._stopping:
            return False
        prepared = request.prepared
        relayed = not prepared.needs_feedback
        grammar = prepared.output.grammar
        wire = WireRequest(
            request.request_id, request.enqueue_ns, request.choices[0].index, relayed,
            "" if relayed else prepared.prompt_text, prepared.prompt_token_ids,
            prepared.sampling, prepared.max_output_tokens, prepared.limit_field,
            prepared.prompt_field, prepared.stops, prepared.n, prepared.logprobs,
            prepared.logit_bias, prepared.ignore_eos, prepared.min_tokens,
            prepared.observe_ids, prepared.observe_timestamps, prepared.publish_endpoints,
            None if relayed else prepared.output.pipeline,
            None if grammar is None else grammar.lark,
        )  # fmt: skip
        self._live[request.request_id] = _Remote(
            request, prepared.n, relayed, request.choices[0].index,
            [c.pipeline for c in request.choices] if relayed else [])
        if not self._send(Admit([wire])):
            del self._live[request.request_id]
            return False
        return True

    def cancel(self, request_id: int) -> None:
        if self._live.pop(request_id, None) is not None:
            self._send(Cancel([request_id]))

    async def scrape(self) -> list:
        """The engine's metric families (`metrics.engine_families`). Once the engine
        process has exited: the last families it sent (a scrape's reply or its final
        snapshot) as `metrics.dead_engine_families` (counters kept, live gauges 0); []
        before the channel is attached."""
        if self._loop is None:
            return []
        if self.crashed is not None:
            return dead_engine_families(self._families)
        self._scrape_ids += 1
        token = self._scrape_ids
        future = self._loop.create_future()
        self._scrapes[token] = future
        if not self._send(Scrape(token)):
            self._scrapes.pop(token, None)
            return dead_engine_families(self._families)
        return await future

    def start_worker(self) -> None:
        """Nothing to start: the engine runs since `start`."""

    def stop(self, timeout_s: float = ENGINE_STOP_TIMEOUT_S) -> None:
        """Stop the engine (its live requests fail) and reap the process."""
        self._stopping = True
        if self._process.is_alive():
            self._send(Stop())
            self._process.join(timeout_s)
        if self._process.is_alive():  # it ignores SIGTERM: the frontend owns its lifetime
            self._process.kill()
            self._process.join()
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._detach)
            except RuntimeError:
                pass
        else:
            self._conn.close()

    # -- channel --------------------------------------------------------------------

    def _send(self, message: Any) -> bool:
        try:
            self._conn.send_bytes(encoder.encode(message))
        except OSError:
            return False
        return True

    def _detach(self) -> None:
        try:
            self._loop.remove_reader(self._conn.fileno())  # type: ignore[union-attr]
        except (OSError, ValueError):
            pass
        self._conn.close()

    def _readable(self) -> None:
        """Loop callback: every whole message already sent, in order."""
        conn = self._conn
        try:
            while conn.poll():
                self._handle(to_frontend_decoder.decode(conn.recv_bytes()))
        except (EOFError, OSError):
            self._engine_gone()

    def _handle(self, message: list) -> None:
        if message[0] == STEP_EVENTS:
            for request_id, events in message[1]:
                remote = self._live.get(request_id)
                if remote is not None:
                    self._deliver(request_id, remote, events)
        elif message[0] == METRICS_REPLY:
            self._families = message[2]
            future = self._scrapes.pop(message[1], None)
            if future is not None and not future.done():
                future.set_result(message[2])

    def _deliver(self, request_id: int, remote: _Remote, encoded: list) -> None:
        """One request's events of one step, to its sink (we are on its loop)."""
        events: list = []
        for item in encoded:
            if item[0] == 0 and item[4] is not None:  # a relayed choice's tokens: the
                _, choice, completion, _, tokens, logprobs = item  # pipeline runs here
                pipeline = remote.pipelines[choice - remote.first]
                deltas: list = []
                for token in tokens:
                    if not pipeline.finished:
                        deltas += pipeline.feed(token)
                if deltas or logprobs:
                    events.append(Output(tuple(deltas), choice,
                                         decode_logprobs(logprobs) if logprobs else (),
                                         completion))
                continue
            event = decode_event(item)
            if type(event) is Finished:
                remote.unfinished -= 1
                if remote.relayed:
                    event = self._relayed_finish(remote, event, events)
            elif type(event) is Rejected or type(event) is Failed:
                remote.unfinished = 0
            events.append(event)
        if remote.unfinished <= 0:
            self._live.pop(request_id, None)
        _put(remote.request.sink, events)

    def _relayed_finish(self, remote: _Remote, event: Finished, events: list) -> Finished:
        """The frontend pipeline's end of a relayed choice: flushed text (output limit),
        its finish reason (tool_calls after completed calls), the finished count."""
        pipeline = remote.pipelines[event.choice - remote.first]
        if not pipeline.finished:
            tail = pipeline.finish(event.reason)
            if tail:
                events.append(Output(tuple(tail), event.choice, (), event.completion_tokens))
        reason = pipeline.finish_reason or event.reason
        if self.metrics is not None:
            self.metrics.requests_finished.labels(reason.value).inc()
        return dataclasses.replace(event, reason=reason)

    def _engine_gone(self) -> None:
        """The engine process exited: every live request fails, /health reports it."""
        if self._loop is not None:
            try:
                self._loop.remove_reader(self._conn.fileno())
            except (OSError, ValueError):
                pass
        self._process.join(1.0)
        code = self._process.exitcode
        message = ("the server is shutting down" if self._stopping else
                   f"the engine process exited (exit code {code})")
        if self.crashed is None:
            self.crashed = message
            if not self._stopping:
                log.error("%s; failing %d live requests", message, len(self._live))
        live, self._live = self._live, {}
        for remote in live.values():
            # Failed here, not in the engine: counted here, once per request (as the
            # worker's _fail_request counts a failed request).
            if self.metrics is not None:
                self.metrics.requests_finished.labels("error").inc()
            _put(remote.request.sink, [Failed(message)])
        families = dead_engine_families(self._families)
        for future in self._scrapes.values():
            if not future.done():
                future.set_result(families)
        self._scrapes.clear()


def _reap(process) -> None:
    """At interpreter exit: an engine still running (no `stop`) is killed (it ignores
    SIGTERM)."""
    if process.is_alive():
        process.kill()
        process.join(5.0)


def _put(sink: EventSink, events: list) -> None:
    """Loop thread: events to a sink at once (the engine's terminal rule applies)."""
    if sink._accept(events):
        sink._put_all(events)


__all__ = ["EngineClient", "EngineSpec", "TokenRelay", "engine_main", "run_engine"]
