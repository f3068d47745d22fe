"""Server.start: the model worker plus the HTTP listener (uvicorn) around one model.

    Bootstrap.load -> NativeModel.load -> Server.start

HTTP shutdown allows five seconds for connection drain, then drops remaining
connections (the specification, admission paragraphs); the worker then stops and the
backend closes. On SIGTERM or SIGINT new connections are refused at once, requests in
flight may finish within the five seconds, and a stream still open then is dropped: its
client sees the connection close without [DONE] (an incomplete chunked body), its
request is cancelled, and the log carries one line per dropped connection.

One Ctrl-C may arrive as two SIGINTs: a terminal signals its whole foreground process
group, and `uv run` (scripts/demo.sh) forwards the SIGINT it got to helios-serve as well. A
repeat within DUPLICATE_SIGNAL_S of the first signal is that duplicate and is ignored; a
later SIGINT (a second, deliberate Ctrl-C) ends the drain at once, dropping the streams
still open. Either way the process exits 0 without a traceback.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import socket
import threading
import time

import uvicorn

from helios_serve.bootstrap import Bootstrap
from helios_serve.clock import ObservationClock
from helios_serve.config import ServeSettings
from helios_serve.handle import EngineHandle
from helios_serve.http.access import QuietCancelledConnections
from helios_serve.http.app import build_app
from helios_serve.http.service import ApiService
from helios_serve.metrics import Metrics
from helios_serve.worker import ModelBackend, ModelWorker
from helios_serve.worker_host import WorkerHost, build_worker

SHUTDOWN_DRAIN_S = 5.0
# `uv run` forwards a terminal's SIGINT within milliseconds; a person's second Ctrl-C
# comes later than this.
DUPLICATE_SIGNAL_S = 1.0

log = logging.getLogger(__name__)
_uvicorn_log = logging.getLogger("uvicorn.error")
if not any(isinstance(f, QuietCancelledConnections) for f in _uvicorn_log.filters):
    _uvicorn_log.addFilter(QuietCancelledConnections())
LISTEN_BACKLOG = 2048


def bind_listener(host: str, port: int) -> socket.socket:
    """Bind and listen on (host, port) now; port 0 picks a free port.

    helios-serve binds before it loads the model, so a busy port is reported at once;
    connections made before uvicorn starts accepting wait in the backlog.

    Raises:
        OSError: the address cannot be bound (in use, not local, no permission).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


class _Listener(uvicorn.Server):
    """uvicorn's server with Helios's stop signals (the module docstring): the first
    SIGINT or SIGTERM starts the drain; a repeat within DUPLICATE_SIGNAL_S is ignored; a
    later SIGINT ends the drain at once, and the application's lifespan still shuts down.

    uvicorn's own handler makes any second SIGINT a force quit that skips the lifespan
    shutdown and re-raises every SIGINT it saw once serving ends: the second one
    interrupted the event loop's teardown, whose cancelled lifespan task printed a
    CancelledError traceback, and one Ctrl-C through `uv run` dropped every open stream.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._first_signal_s: float | None = None  # time.monotonic() of the first signal

    def handle_exit(self, sig: int, frame) -> None:
        now = time.monotonic()
        if self._first_signal_s is None:
            self._first_signal_s = now
            super().handle_exit(sig, frame)  # starts the drain; re-raised once serving ends
        elif sig == signal.SIGINT and now - self._first_signal_s >= DUPLICATE_SIGNAL_S:
            self.force_exit = True  # ends the drain; not recorded, so raised once in all

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        if self.force_exit:  # uvicorn skips the lifespan shutdown on a force quit
            await self.lifespan.shutdown()


class Server:
    """One served model: worker thread, API service, Litestar app and uvicorn listener.

    Args:
        bootstrap: the loaded core's serving metadata and frontend assets.
        model: NativeModel (or the test-only ScriptedModel); None with `engine`.
        settings: resolved settings (host, port 0 picks a free port).
        clock: the observation clock made right before the model loaded.
        listener: a socket from `bind_listener`, or None to bind settings.host/port here.
        engine: the engine handle serving the model (helios-serve --engine-process: an
            `engine_client.EngineClient`); None: a worker thread here around `model`.

    Attributes:
        engine: the engine handle HTTP submits to.
        worker: the worker thread built here around `model` (tests inspect it), or None
            with a given `engine`.
    """

    def __init__(
        self,
        bootstrap: Bootstrap,
        model: ModelBackend,
        settings: ServeSettings,
        clock: ObservationClock,
        listener: socket.socket | None = None,
        *,
        engine: EngineHandle | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.metrics = Metrics()
        self.worker: ModelWorker | None = None
        if engine is None:
            self.worker = build_worker(model, settings, clock, self.metrics)
            engine = WorkerHost(self.worker, settings.engine_stall_timeout_s)
        self.engine: EngineHandle = engine
        slots = engine.geometry.slots
        if settings.max_active > slots:
            # Load-time selection may reduce captured concurrency, never raise it; HTTP
            # admission must count the requests that can actually run.
            log.warning("--max-active %d exceeds the core's %d request slots; serving at most "
                        "%d at once", settings.max_active, slots, slots)
            settings = dataclasses.replace(settings, max_active=slots)
        self.settings = settings
        self.service = ApiService(bootstrap, engine, settings, self.metrics, clock)
        self.app = build_app(self.service)
        self._socket = listener or bind_listener(settings.host, settings.port)
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            timeout_graceful_shutdown=int(SHUTDOWN_DRAIN_S),
            lifespan="on",
        )
        self._uvicorn = _Listener(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    @classmethod
    def start(
        cls,
        bootstrap: Bootstrap,
        model: ModelBackend,
        settings: ServeSettings,
        clock: ObservationClock,
        *,
        timeout_s: float = 30.0,
        engine: EngineHandle | None = None,
    ) -> Server:
        """Start the worker and the listener in background threads; return once serving.

        Raises:
            RuntimeError: the listener did not come up within timeout_s.
        """
        server = cls(bootstrap, model, settings, clock, engine=engine)
        server.serve_in_background(timeout_s)
        return server

    def serve_in_background(self, timeout_s: float = 30.0) -> None:
        """Start the worker and the listener in background threads; return once serving.

        Raises:
            RuntimeError: the listener did not come up within timeout_s.
        """
        self.engine.start()
        self._thread = threading.Thread(target=self._serve, name="helios-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the HTTP listener did not start")
            time.sleep(0.01)

    def _serve(self) -> None:
        self._uvicorn.run(sockets=[self._socket])

    def run(self) -> None:
        """Serve in this thread until interrupted (SIGINT/SIGTERM), then shut down."""
        self.engine.start()
        if threading.current_thread() is threading.main_thread():
            # uvicorn re-raises the captured signal after draining, under the handler it
            # found: SIGTERM's default would end the process before the worker (and a
            # process rank 0's peers) stops, so it interrupts as SIGINT does.
            signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            self._serve()
        except KeyboardInterrupt:  # uvicorn re-raises the captured SIGINT/SIGTERM
            pass
        finally:
            self.engine.stop()
            self.bootstrap.close()

    def stop(self) -> None:
        """Drain HTTP for up to five seconds, stop the worker, close the backend."""
        self.service.draining = True
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(SHUTDOWN_DRAIN_S + 5.0)
        self.engine.stop()
        self._socket.close()
