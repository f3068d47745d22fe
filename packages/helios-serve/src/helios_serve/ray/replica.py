"""One Ray Serve replica: a full Helios server (`helios-serve`, its own process and
engine) and the calls the ingress and the router make on it.

The server is a child process of the replica actor, bound to 127.0.0.1 on a free port;
the kernel kills it when the actor dies (PR_SET_PDEATHSIG), so a replica Ray replaces
leaves no server behind. Ray reads readiness and health from `check_health` (the
server's own /health) and routing load from `record_routing_stats` (its /metrics: the
inference-gateway gauges, docs/deploy.md).
"""

from __future__ import annotations

import collections
import ctypes
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from helios_serve.ray.affinity import RouteHint

READY_LINE = "Helios is serving "  # helios-serve's first stdout line (cli.py)
# Headers of one hop (RFC 9110 section 7.6.1) and those the next hop recomputes.
HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer",
                         "upgrade", "proxy-authorization", "proxy-authenticate",
                         "content-length", "host", "date", "server"})
LOAD_GAUGES = {"helios_requests_waiting": "waiting", "helios_requests_running": "running",
               "helios_kv_cache_usage_perc": "kv_usage"}


class ReplicaStartError(RuntimeError):
    """The replica's server exited or timed out before serving."""


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the replica actor dies (Linux prctl 1 =
    PR_SET_PDEATHSIG); a no-op elsewhere. The signal follows the thread that started the
    child: Ray Serve runs a replica's constructor on the replica's user-code thread,
    which lives as long as the replica."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


class ServerProcess:
    """`helios-serve ARGS --host 127.0.0.1 --port 0` until it prints its address.

    Args:
        args: helios-serve's arguments (core, --trust, --accept, options).
        start_timeout_s: seconds to wait for the ready line.

    Raises:
        ReplicaStartError: the server exited or did not serve in time (the message
            carries its last stderr line: helios-serve's one-line error).
    """

    def __init__(self, args: Sequence[str], start_timeout_s: float) -> None:
        # helios-serve's entry point through this interpreter: the same environment as
        # the replica, with or without the console script installed (a source tree).
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from helios_serve.cli import main; main()", *args,
             "--host", "127.0.0.1", "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=_die_with_parent,
        )  # fmt: skip
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=20)
        # Drain stderr for the server's lifetime (a full pipe would block its logging);
        # the lines go on to the actor's stderr, which Ray keeps in its logs.
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        timer = threading.Timer(start_timeout_s, self.proc.kill)
        timer.start()
        try:
            first = self.proc.stdout.readline()
        finally:
            timer.cancel()
        if not first.startswith(READY_LINE):
            self.proc.kill()
            self.proc.wait()
            last = self.stderr_tail[-1] if self.stderr_tail else f"exit code {self.proc.returncode}"
            raise ReplicaStartError(f"helios-serve did not start: {last}")
        self.url = first.split(" at ")[1].split()[0]
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def _drain_stderr(self) -> None:
        for line in self.proc.stderr:
            self.stderr_tail.append(line.rstrip("\n"))
            sys.stderr.write(line)

    def exited(self) -> int | None:
        return self.proc.poll()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class HeliosReplica:
    """The replica deployment's class (helios_serve.ray.app configures and binds it).

    Args:
        serve_args: helios-serve's arguments (core, --trust, --accept, options).
        start_timeout_s: seconds the server may take to load.
    """

    def __init__(self, serve_args: Sequence[str], start_timeout_s: float = 600.0) -> None:
        # Ray is imported here, not at the top: the router and ingress modules import this
        # one, and the plain parts stay importable without the optional `ray` extra.
        from ray import serve

        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.server = ServerProcess(serve_args, start_timeout_s)
        # No read timeout: a stream is as long as its generation; the server bounds it.
        self.client = httpx.AsyncClient(base_url=self.server.url,
                                        timeout=httpx.Timeout(None, connect=10.0))  # fmt: skip

    async def check_health(self) -> None:
        """Ray's health check: the server process lives and its /health answers 200.

        Raises:
            RuntimeError: it does not (Ray then replaces this replica).
        """
        code = self.server.exited()
        if code is not None:
            raise RuntimeError(f"the Helios server exited (exit code {code})")
        r = await self.client.get("/health", timeout=10.0)
        if r.status_code != 200:
            raise RuntimeError(f"/health answered {r.status_code}: {r.text[:200]}")

    async def record_routing_stats(self) -> dict[str, float]:
        """The router's load view: {"waiting": n, "running": n, "kv_usage": fraction}
        from the server's /metrics."""
        r = await self.client.get("/metrics", timeout=10.0)
        stats = {}
        for family in text_string_to_metric_families(r.text):
            if family.name in LOAD_GAUGES:
                stats[LOAD_GAUGES[family.name]] = family.samples[0].value
        return stats

    async def forward(self, method: str, path: str, query: str, headers: list[tuple[str, str]],
                      body: bytes, hint: RouteHint | None = None
                      ) -> AsyncIterator[dict[str, Any] | bytes]:  # fmt: skip
        """One HTTP exchange with this replica's server, streamed.

        Yields:
            First {"status": int, "headers": [(name, value)], "replica": id}, then the
            response body's bytes as the server writes them (SSE events unchanged).
            `hint` is read by the router only.
        """
        request = self.client.build_request(
            method, path, params=query or None, content=body,
            headers=[(k, v) for k, v in headers if k.lower() not in HOP_HEADERS])  # fmt: skip
        response = await self.client.send(request, stream=True)
        try:
            yield {"status": response.status_code, "replica": self.replica_id,
                   "headers": [(k, v) for k, v in response.headers.items()
                               if k.lower() not in HOP_HEADERS]}  # fmt: skip
            async for chunk in response.aiter_raw():
                yield chunk
        finally:
            await response.aclose()

    def pid(self) -> int:
        """The server process's pid (tests kill it)."""
        return self.server.proc.pid

    def __del__(self) -> None:
        server = getattr(self, "server", None)
        if server is not None:
            server.stop()
