"""`helios-serve` as a child process for the benchmarks (bench/serve_cpu.py, serve_load.py,
snapshots.py): one starter, one way to stop.

    with ServeProcess(core, trust, accept, log=OUT / "x.log", options=["--max-active", "8"]) as s:
        ... s.url, s.metric("helios_prefill_tokens_total"), s.cpu_s() ...

The child runs `helios_serve.cli.main` under this interpreter (no console script needed:
the GPU machine runs from a source tree on PYTHONPATH) on 127.0.0.1 with port 0; the URL is
read from its "Helios is serving ... at URL" log line and it counts as started once
/health answers 200. It is stopped with SIGINT (the server drains for five seconds), then
SIGKILL. One `httpx.Client` (no proxies from the environment) serves every control
request: building a client costs ~20 ms (its TLS context), which must not land on a timed
request.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

CLI = "import sys; from helios_serve.cli import main; sys.argv[0] = 'helios-serve'; main()"


class ServeProcess:
    """One helios-serve child.

    Args:
        core, trust, accept: the core file, its publisher's public key, the namespace.
        log: the child's stdout and stderr (its folder is created).
        backend: --backend.
        options: further helios-serve arguments (--max-active, --snapshots, ...).
        startup_timeout_s: how long to wait for /health.

    Raises:
        SystemExit: the child exited or did not become healthy in time (the log's tail).
    """

    def __init__(self, core: Path | str, trust: Path | str, accept: str, *, log: Path,
                 backend: str = "cpu", options: Sequence[str] = (),
                 startup_timeout_s: float = 900.0) -> None:
        self.argv = [sys.executable, "-c", CLI, str(core), "--trust", str(trust),
                     "--accept", accept, "--host", "127.0.0.1", "--port", "0",
                     "--backend", backend, *options]
        self.log = log
        self.url = ""
        self.client = httpx.Client(timeout=60.0, trust_env=False)
        log.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with log.open("w") as f:
            self.proc = subprocess.Popen(self.argv, stdout=f, stderr=subprocess.STDOUT)
        try:
            self._wait_healthy(startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - started

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"helios-serve exited {self.proc.returncode}:\n"
                                 f"{self.log.read_text()[-3000:]}")
            if not self.url:
                for line in self.log.read_text().splitlines():
                    if line.startswith("Helios is serving") and " at http://" in line:
                        self.url = line.split(" at ", 1)[1].split()[0]
            if self.url:
                try:
                    if self.client.get(self.url + "/health", timeout=2.0).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        raise SystemExit(f"helios-serve not healthy after {timeout_s:.0f} s; see {self.log}")

    def metrics_text(self) -> str:
        """GET /metrics (Prometheus text)."""
        return self.client.get(self.url + "/metrics").text

    def metric(self, name: str) -> float:
        """The unlabelled sample `name` of /metrics (0.0 when absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        for family in text_string_to_metric_families(self.metrics_text()):
            for s in family.samples:
                if s.name == name and not s.labels:
                    return s.value
        return 0.0

    def cpu_s(self) -> float:
        """The child's user + system CPU seconds so far, its own child processes (the
        --engine-process engine) included (Linux /proc)."""
        total = 0.0
        pids = [self.proc.pid]
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        try:
            pids += [int(p) for p in children.read_text().split()]
        except OSError:
            pass
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # exited meanwhile
                continue
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def stop(self) -> None:
        """SIGINT (the server drains), then SIGKILL after 20 s; idempotent."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.client.close()

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
