"""PacedBackend: a device emulated by time, for measuring the host side of serving.

It implements the execution-backend interface NativeModel drives (`frames`,
`staging`, `launch`, `wait`, `close`, `counters`), so a NativeModel built over it runs
the real graph selection and shared packing of a real core; only the device is
replaced. Each launch occupies the emulated device for the step time of its graph
variant, queued behind the previous launch as on one CUDA stream; `wait(frame)` sleeps
(releasing the GIL, as `cuEventSynchronize` does) until that frame's step would end.
The completion record gets plausible token ids: row i of step n samples
`token_ids[(n + 31 * i) % len(token_ids)]`, so each row walks through real text tokens
(the bench passes the ids of an English paragraph, none of them EOS or special).

Benchmarks only (bench/serve_overhead.py): nothing here checks the plan against a
model, and weights, cache planes and scratch buffers are not allocated.
"""

from __future__ import annotations

import json
import os
import socketserver
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from helios_contract import PreparedContract
from helios_contract.schema import contract_pb2 as cpb
from helios_contract.schema import manifest_pb2 as mpb

from helios_serve.runtime.cpu_backend import COMPUTE_DTYPE
from helios_serve.runtime.native_model import NativeModel, _geometry


class PacedBackend:
    """Staging buffers of a manifest and a device that takes `step_s(graph)` per launch.

    Args:
        contract: the serving contract (binding destinations).
        manifest: the execution manifest (buffer declarations, completion buffer).
        step_s: graph variant name -> device seconds of one step.
        token_ids: ids the completion record cycles through (non-empty).
        frames: execution frames (2, as the cuda backend).

    Raises:
        ValueError: empty token_ids.
    """

    name = "paced"

    def __init__(self, contract: cpb.ServingContract, manifest: mpb.ExecutionManifest,
                 step_s: Callable[[str], float], token_ids: Sequence[int], *, frames: int = 2):
        if not token_ids:
            raise ValueError("token_ids must not be empty")
        self.frames = frames
        self.counters: Counter[str] = Counter()
        self._step_s = {g.name: float(step_s(g.name)) for g in manifest.graphs}
        # Graphs without a completion record (RESTORE copies) fill none.
        self._completion = {g.name: g.completion.buffer for g in manifest.graphs
                            if g.completion.buffer}
        needed = {b.destination for g in contract.model.graphs for b in g.bindings}
        needed |= set(self._completion.values())
        decls = {b.name: b for b in manifest.buffers if b.name in needed
                 or b.role == mpb.BUFFER_ROLE_OUTPUT}  # completion records (logprobs too)
        per_frame = {n for n, b in decls.items()
                     if b.role in (mpb.BUFFER_ROLE_REQUEST_INPUT, mpb.BUFFER_ROLE_OUTPUT)}
        shared = {n: _zeros(b) for n, b in decls.items() if n not in per_frame}
        self._staging = [{**shared, **{n: _zeros(decls[n]) for n in per_frame}}
                         for _ in range(frames)]
        # Completion records by step (mod len(token_ids)): row i of step n samples
        # token_ids[(n + 31 i) % len] (precomputed: launch costs one row copy).
        ids = np.asarray(token_ids, dtype=np.int64)
        width = max(self._staging[0][b].size for b in set(self._completion.values()))
        self._records = ids[(np.arange(len(ids))[:, None] + 31 * np.arange(width)) % len(ids)]
        self._ready_s = [0.0] * frames  # perf_counter time each frame's step ends
        self._busy_until_s = 0.0  # the emulated stream's tail
        self._steps = 0
        self.device_busy_s = 0.0  # sum of step times launched
        self.idle_s: dict[str, float] = {}  # device idle time before launches, by graph
        self.queued = 0  # launches queued behind a running step (no idle gap)

    def staging(self, frame: int) -> Mapping[str, np.ndarray]:
        return self._staging[frame]

    def launch(self, graph: str, frame: int, dirty=()) -> None:
        """Queue one step of `graph` on the emulated stream; fill `frame`'s completion."""
        now = time.perf_counter()
        duration = self._step_s[graph]
        start = max(now, self._busy_until_s)
        gap = max(0.0, now - self._busy_until_s) if self._steps else 0.0
        self.idle_s[graph] = self.idle_s.get(graph, 0.0) + gap
        self.queued += gap == 0.0
        self._busy_until_s = self._ready_s[frame] = start + duration
        self.device_busy_s += duration
        if graph in self._completion:
            record = self._staging[frame][self._completion[graph]].reshape(-1)
            record[:] = self._records[self._steps % len(self._records), :len(record)]
        self._steps += 1
        self.counters["graph_launches"] += 1

    def wait(self, frame: int) -> None:
        """Sleep until `frame`'s step ends on the emulated device."""
        left = self._ready_s[frame] - time.perf_counter()
        if left > 0:
            time.sleep(left)

    def write_state(self, name: str, byte_offset: int, values: np.ndarray) -> None:
        """Host restoration of persistent state: ignored (no model state is emulated)."""

    def close(self) -> None:
        pass


def _zeros(decl: mpb.Buffer) -> np.ndarray:
    return np.zeros([int(s) for s in decl.shape], COMPUTE_DTYPE[decl.dtype])


def paced_model(core: Any, step_s: Callable[[str], float], token_ids: Sequence[int], *,
                max_concurrency: int | None = None) -> NativeModel:
    """A NativeModel of `core` (an object with `contract` and `manifest`: real graph
    selection and packing of its validated contract) over a PacedBackend."""
    prepared = PreparedContract.from_contract(core.contract, core.manifest)
    backend = PacedBackend(prepared.serving, prepared.manifest, step_s, token_ids)
    geometry = _geometry(prepared, int(prepared.serving.prepared_pages), max_concurrency, None)
    return NativeModel(prepared, backend, geometry)


def thread_cpu_s(roles: Mapping[str, str] | None = None) -> dict[str, float]:
    """This process's CPU seconds (user + system) by thread role, from
    /proc/self/task/<native id>/stat: `roles` maps thread names to roles (default: the
    HTTP event loop is MainThread, the model worker helios-model-worker); preparation
    threads are "prepare", the rest "other"."""
    roles = roles or {"MainThread": "http_loop", "helios-model-worker": "worker"}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for t in threading.enumerate():
        role = roles.get(t.name, "prepare" if t.name.startswith("helios-prepare") else "other")
        try:
            fields = Path(f"/proc/self/task/{t.native_id}/stat").read_text().rsplit(")", 1)[1]
        except OSError:  # the thread ended meanwhile
            continue
        user, system = fields.split()[11:13]
        out[role] = out.get(role, 0.0) + (int(user) + int(system)) / tick
    return out


def backend_stats(backend: PacedBackend, roles: Mapping[str, str] | None = None) -> dict:
    """The emulated device's counters and this process's thread CPU (one JSON object)."""
    return {"device_busy_s": backend.device_busy_s, "launches": backend.counters["graph_launches"],
            "queued": backend.queued, "idle_s": dict(backend.idle_s),
            "thread_cpu_s": thread_cpu_s(roles)}


ENGINE_ROLES = {"MainThread": "engine_channel", "helios-model-worker": "worker"}


class PacedEngineModel:
    """A picklable model factory for `helios-serve --engine-process`
    (`EngineSpec.model_factory`): the paced NativeModel built in the engine process, and
    `backend_stats` served on the Unix socket `stats_path` (one JSON line per line read).

    Args:
        step_s_by_graph: graph variant name -> device seconds of one step.
        token_ids: ids the completion record cycles through.
        stats_path: the Unix socket the engine binds to answer stats requests (None:
            not served); its directory must exist (a short one: AF_UNIX paths end at
            107 bytes).
    """

    def __init__(self, step_s_by_graph: Mapping[str, float], token_ids: Sequence[int],
                 stats_path: str | None = None) -> None:
        self.step_s_by_graph = dict(step_s_by_graph)
        self.token_ids = list(token_ids)
        self.stats_path = stats_path

    def __call__(self, bootstrap: Any, settings: Any) -> NativeModel:
        model = paced_model(bootstrap.core, self.step_s_by_graph.__getitem__, self.token_ids,
                            max_concurrency=settings.max_active)
        if self.stats_path is not None:
            _serve_stats(self.stats_path, model.backend)
        return model


def _serve_stats(path: str, backend: PacedBackend) -> None:
    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            for _ in self.rfile:
                self.wfile.write((json.dumps(backend_stats(backend, ENGINE_ROLES)) + "\n")
                                 .encode())
                self.wfile.flush()

    server = socketserver.UnixStreamServer(path, Handler)
    threading.Thread(target=server.serve_forever, name="paced-stats", daemon=True).start()
