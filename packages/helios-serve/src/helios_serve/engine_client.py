"""The frontend's side of the engine process (helios-serve --engine-process): the
`EngineClient`, the engine handle (`handle.EngineHandle`) of a model worker running in
another process.

    frontend process (this side)             engine process (engine_process)
    EngineClient.submit -> WireRequest.of  -- Admit -->   engine_request -> ModelWorker
    EngineClient._deliver <- decode_event  <-- step events --   _Channel <- deliver

docs/serving.md, "Design: engine process + frontend process"; the engine side's
docstring (engine_process) describes the split of the work. `EngineClient.spawn` starts
the engine process and waits until it loaded the model; from then on every method runs
on the HTTP event loop except `start` and `stop`.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import logging
import os
import queue
import socket
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from helios_serve.bootstrap import StartupError
from helios_serve.engine.plan import ModelGeometry
from helios_serve.events import (
    EventSink,
    Failed,
    Finished,
    GenerationRequest,
    Output,
    Rejected,
)
from helios_serve.liveness import DEFAULT_STALL_TIMEOUT_S, StallWatch
from helios_serve.metrics import Metrics, dead_engine_families
from helios_serve.wire import (
    HEARTBEAT,
    METRICS_REPLY,
    STEP_EVENTS,
    Admit,
    Cancel,
    EngineSpec,
    Scrape,
    Stop,
    WireRequest,
    decode_event,
    decode_logprobs,
    encoder,
    to_frontend_decoder,
)

log = logging.getLogger(__name__)

ENGINE_START_TIMEOUT_S = 3600.0  # a large core's verification and load (cuda: capture)
ENGINE_STOP_TIMEOUT_S = 15.0
# /metrics waits this long at most for the engine's families (its main thread answers
# at once when it runs); then it serves the last ones received, marked stale.
ENGINE_SCRAPE_TIMEOUT_S = 2.0


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


@dataclass
class _Remote:
    """Frontend side: one request the engine runs."""

    request: GenerationRequest
    unfinished: int  # choices without a Finished yet
    relayed: bool
    first: int = 0  # the first choice's index in the response
    pipelines: list = dataclasses.field(default_factory=list)  # relayed: by choice - first


class EngineClient:
    """Frontend side of the engine process: the engine handle (`handle.EngineHandle`:
    `submit`, `cancel`, `geometry`, `healthy`, `start`, `attach`, `scrape`, `stop`) of the
    model worker there. Every method runs on the HTTP event loop except `spawn`, `start`
    and `stop`.

    Liveness: the engine's heartbeats carry its worker's step counter; the requests
    this side waits on are its work (`liveness.StallWatch`). A stopped (SIGSTOP) or
    stuck engine sends nothing, so it stalls once it has work for `stall_timeout_s`.

    Args:
        process: the spawned engine process.
        conn: the frontend's end of the channel.
        geometry: the serving geometry the engine reported.
        stall_timeout_s: helios-serve --engine-stall-timeout (seconds, > 0).
    """

    def __init__(self, process: _Process, conn: Connection, geometry: ModelGeometry,
                 stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S) -> None:  # fmt: skip
        self._process = process
        self._conn = conn
        self.geometry = geometry
        self.metrics: Metrics | None = None  # the frontend's (`attach`): relayed finishes
        self.crashed: str | None = None
        self._live: dict[int, _Remote] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scrapes: dict[int, asyncio.Future] = {}
        self._scrape_ids = 0  # FINAL_SNAPSHOT (0) is never a scrape's token
        self._families: list = []  # the engine's metric families last received
        self._stopping = False
        self._watch = StallWatch(stall_timeout_s)
        self._steps = 0  # the engine worker's step counter, as its last heartbeat said
        # Writes never block the HTTP loop (`_send`): a frame goes out at once when the
        # socket takes it whole, else through the writer thread, and then every later
        # frame too, in order, until that thread has caught up.
        self._sock: socket.socket | None = None  # a duplicate of the channel's descriptor
        self._write_lock = threading.Lock()
        self._queued = 0  # frames handed to the writer thread and not yet written
        self._writes: queue.SimpleQueue | None = None
        self._write_broken = False

    @property
    def pid(self) -> int:
        return self._process.pid

    @classmethod
    def spawn(cls, spec: EngineSpec) -> EngineClient:
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
        return cls(process, parent, reply[1], spec.options.engine_stall_timeout)

    def attach(self, loop: asyncio.AbstractEventLoop, metrics: Metrics) -> None:
        """On the HTTP event loop, before serving: read the channel there; count the
        relayed choices' finishes (decided here) into `metrics`."""
        self.metrics = metrics
        self._loop = loop
        fd = self._conn.fileno()
        loop.add_reader(fd, self._readable)
        # libuv (uvloop) makes a polled descriptor non-blocking; the channel's reads and
        # writes are whole messages: blocking, like the Connection expects.
        os.set_blocking(fd, True)
        self._sock = socket.socket(fileno=os.dup(fd))  # MSG_DONTWAIT sends (`_send`)

    # -- the engine handle (HTTP loop) ----------------------------------------------

    @property
    def healthy(self) -> bool:
        return (self.crashed is None and self._process.is_alive()
                and not self.liveness.stalled)

    @property
    def liveness(self) -> StallWatch:
        self._watch.observe(self._steps, bool(self._live))
        return self._watch

    def submit(self, request: GenerationRequest) -> bool:
        """Hand a prepared request to the engine; False when the engine is not running
        (a full engine ingress answers with a Rejected event instead)."""
        if self.crashed is not None or self._stopping:
            return False
        wire = WireRequest.of(request)
        self._live[request.request_id] = _Remote(
            request, wire.data.n, wire.relayed, wire.first_index,
            [c.pipeline for c in request.choices] if wire.relayed else [])
        if not self._send(Admit([wire])):
            del self._live[request.request_id]
            return False
        self._watch.observe(self._steps, True)  # work arrived: the bound starts now
        return True

    def cancel(self, request_id: int) -> None:
        if self._live.pop(request_id, None) is not None:
            self._send(Cancel([request_id]))

    async def scrape(self, timeout_s: float = ENGINE_SCRAPE_TIMEOUT_S) -> list:
        """The engine's metric families (`metrics.engine_families`), within `timeout_s`.
        A stalled engine (`liveness`), or one that does not answer in time: the last
        families received, as they were. Once the engine process has exited: the last
        families it sent (a scrape's reply or its final snapshot) as
        `metrics.dead_engine_families` (counters kept, live gauges 0). [] before the
        channel is attached. Sets `metrics.engine_metrics_stale` (1 unless this
        scrape's reply came)."""
        if self._loop is None:
            return []
        fresh = False
        try:
            if self.crashed is not None:
                return dead_engine_families(self._families)
            if self.liveness.stalled:  # asking would only wait out the timeout
                return self._families
            self._scrape_ids += 1
            token = self._scrape_ids
            future = self._loop.create_future()
            self._scrapes[token] = future
            if not self._send(Scrape(token)):
                self._scrapes.pop(token, None)
                return dead_engine_families(self._families)
            try:
                families = await asyncio.wait_for(future, timeout_s)
            except TimeoutError:
                self._scrapes.pop(token, None)
                return self._families
            fresh = self.crashed is None  # else the final snapshot answered it
            return families
        finally:
            if self.metrics is not None:
                self.metrics.engine_metrics_stale.set(0 if fresh else 1)

    def start(self) -> None:
        """Nothing to start: the engine runs since `spawn`."""

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
            self._close_writer()

    # -- channel --------------------------------------------------------------------

    def _send(self, message: Any) -> bool:
        """Send one message without blocking the caller (any thread): False when the
        channel is broken (the engine is gone). A stopped engine (SIGSTOP) that reads
        nothing leaves the frames queued here, in order, for when it runs again."""
        data = encoder.encode(message)
        if self._sock is None:  # before `attach`: the Connection's own blocking send
            try:
                self._conn.send_bytes(data)
            except OSError:
                return False
            return True
        frame = _frame(data)
        with self._write_lock:
            if self._write_broken:
                return False
            if self._queued == 0:
                try:
                    sent = self._sock.send(frame, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    self._write_broken = True
                    return False
                if sent == len(frame):
                    return True
                frame = frame[sent:]
            if self._writes is None:
                self._writes = queue.SimpleQueue()
                threading.Thread(target=self._write_behind, args=(self._writes,),
                                 name="helios-engine-writer", daemon=True).start()
            self._queued += 1
            self._writes.put(frame)
        return True

    def _write_behind(self, writes: queue.SimpleQueue) -> None:
        """Writer thread: the frames the socket did not take at once, blocking, in
        order; a None ends it."""
        sock = self._sock
        assert sock is not None
        try:
            while (frame := writes.get()) is not None:
                try:
                    sock.sendall(frame)
                except OSError:  # the engine is gone (its reader fails the requests)
                    with self._write_lock:
                        self._write_broken = True
                    return
                with self._write_lock:
                    self._queued -= 1
        finally:
            sock.close()  # this thread owns the duplicate once it runs (`_close_writer`)

    def _detach(self) -> None:
        try:
            self._loop.remove_reader(self._conn.fileno())  # type: ignore[union-attr]
        except (OSError, ValueError):
            pass
        self._conn.close()
        self._close_writer()

    def _close_writer(self) -> None:
        """No more writes; the writer thread, when there is one, closes the duplicate
        descriptor after its last write (never under a send in progress)."""
        with self._write_lock:
            self._write_broken = True
            if self._writes is not None:
                self._writes.put(None)
                return
        if self._sock is not None:
            self._sock.close()

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
        elif message[0] == HEARTBEAT:
            self._steps = message[1]
            self._watch.observe(self._steps, bool(self._live))
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


def _frame(data: bytes) -> bytes:
    """`data` framed as `multiprocessing.connection.Connection.send_bytes` frames it (a
    signed 32-bit big-endian length; past 2 GiB, -1 then an unsigned 64-bit length)."""
    n = len(data)
    header = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
    return header + data


def _put(sink: EventSink, events: list) -> None:
    """Loop thread: events to a sink at once (the engine's terminal rule applies)."""
    if sink._accept(events):
        sink._put_all(events)


__all__ = ["EngineClient"]
