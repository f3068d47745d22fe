"""Tensor-parallel ranks: `RankedBackend` (what NativeModel drives) over rank peers.

Specification: "Ownership and bootstrap" (NativeModel.load loads each rank's resources;
tensor-parallel peers on the serving host use RankPeers::Threads, ranks on other hosts
connect as RankPeers::Processes). A tensor-parallel core's programs are SPMD: every rank
runs the same launches over its own buffers (helios_ignition capture/programs.py and the family trunk), so a step is the same
message to every rank:

1. Rank 0's host packs the plan into the host mirror (`staging`), exactly as for one rank.
2. `launch` hands every rank the graph, the frame, the request inputs of that graph and
   the persistent-state ranges packing wrote (the cuda backend uploads the same ranges).
   Each rank writes them into its buffers and runs the program; the collectives inside
   join the ranks (runtime.collectives).
3. `wait` collects every rank's completion record. Rank agreement (specification:
   "validation agreement suppresses commit on all ranks if a rank rejects"): every
   rank's record must equal rank 0's byte for byte (rank 0's host then validates it for
   all: every rank validates the same completion), else nothing of the step reaches the
   scheduler. A SPECULATIVE step that disagrees raises SpeculativeRejection: exactly
   that step's requests fail and the ranks serve on (the step's device writes belong to
   its own lanes' requests: their pending tokens, histograms, K/V and draft context past
   their committed endpoints, all released with them). Any other disagreement raises
   RankDisagreement, and a rank that failed or left RankLost; both are RankFailure: the
   model is unhealthy afterwards.

`ThreadPeers` (RankPeers::Threads): one CpuBackend per rank in this process, one thread
each, collectives through shared memory (`ThreadGroup`).
``runtime.rank_processes.ProcessPeers`` (RankPeers::Processes): rank 0 here, the other
ranks in `helios-serve --rank R` processes.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from helios_contract import rank_count
from helios_contract.schema import contract_pb2 as cpb
from helios_contract.schema import manifest_pb2 as mpb

from ..startup import StartupLog
from .cache_sizing import CacheSizing
from .collectives import ThreadGroup
from .completion import framed_confidence, rank_record_buffers
from .cpu_backend import CpuBackend
from .errors import (
    RankDisagreement,
    RankFailure,
    RankLost,
    RuntimeLoadError,
    SpeculativeRejection,
)
from .tiers import TierRows

PER_FRAME_ROLES = (mpb.BUFFER_ROLE_REQUEST_INPUT, mpb.BUFFER_ROLE_OUTPUT)


@dataclass(frozen=True)
class Step:
    """What every rank receives for one step: the graph, the execution frame, the
    graph's request inputs (buffer -> array) and the persistent-state writes of packing
    (buffer, row, first element, values)."""

    graph: str
    frame: int
    inputs: dict[str, np.ndarray]
    writes: tuple[tuple[str, int, int, np.ndarray], ...] = ()


@dataclass
class RankStep:
    """One rank's backend and what a step needs of the manifest (shared by the peers):
    per graph the buffers of its record (runtime.completion.rank_record_buffers) and the
    framed confidence buffer among them, if any (`rank_steps` builds both)."""

    backend: CpuBackend
    completion: dict[str, tuple[str, ...]] = field(default_factory=dict)
    framed: dict[str, str] = field(default_factory=dict)

    def run(self, step: Step) -> dict[str, np.ndarray]:
        """Apply `step` to this rank's buffers, run it; returns the completion arrays
        (views of this rank's frame staging, valid until its next step in that frame;
        of a framed confidence buffer, which both frames share, a copy of the step's
        frame plane: the other frame's step may rewrite the other plane meanwhile)."""
        backend = self.backend
        staged = backend.staging(step.frame)
        for name, values in step.inputs.items():
            staged[name][...] = values
        for name, row, start, values in step.writes:
            _row(backend.buffers[name], row)[start:start + len(values)] = values
        backend.launch(step.graph, step.frame)
        framed = self.framed.get(step.graph)
        return {name: staged[name][step.frame].copy() if name == framed else staged[name]
                for name in self.completion[step.graph]}

    def write_state(self, name: str, byte_offset: int, values: np.ndarray) -> None:
        self.backend.write_state(name, byte_offset, values)


def rank_step(manifest: mpb.ExecutionManifest, backend: CpuBackend) -> RankStep:
    """`backend`'s RankStep for `manifest`'s graphs."""
    return RankStep(backend, {g.name: rank_record_buffers(g.completion)
                              for g in manifest.graphs}, framed_confidence(manifest.graphs))


def _row(array: np.ndarray, row: int) -> np.ndarray:
    return array[row].reshape(-1) if array.ndim > 1 else array.reshape(-1)


class RankPeers(Protocol):
    """How a step reaches every rank (Threads or Processes)."""

    ranks: int

    def start(self, step: Step) -> None:
        """Begin `step` on every rank (returns without waiting)."""

    def finish(self, frame: int) -> list[dict[str, np.ndarray]]:
        """Every rank's completion arrays of the step started in `frame`, rank 0 first.

        Raises:
            RankLost: a rank failed or left.
        """

    def run_producers(self, names: list[str]) -> None:
        """Run tuning producers on every rank, then give every rank rank 0's results."""

    def write_state(self, name: str, byte_offset: int, values: np.ndarray) -> None:
        """The same persistent-state write on every rank (between steps)."""

    def close(self) -> None: ...


class RankedBackend:
    """A tensor-parallel core's backend: rank 0's host mirror, steps on every rank.

    Presents the CpuBackend interface NativeModel uses (staging, launch, wait,
    run_producers, read_buffer, write_state, num_pages, cache, frames, counters).

    Args:
        manifest: the execution manifest (rank_count > 1).
        rank0: rank 0's loaded CpuBackend (this process's).
        peers: the rank peers (rank 0 is their member 0).
    """

    def __init__(self, manifest: mpb.ExecutionManifest, rank0: CpuBackend, peers: RankPeers):
        self.name = f"cpu ({peers.ranks} ranks)"
        self.rank0 = rank0
        self.peers = peers
        self.frames = rank0.frames
        self.cache = rank0.cache
        roles = {b.name: b.role for b in manifest.buffers}
        self._completion = {g.name: rank_record_buffers(g.completion) for g in manifest.graphs}
        # What packing writes (binding destinations) and the completion reader reads.
        mirrored = {t.destination for g in manifest.graphs for t in g.transports}
        mirrored |= {n for names in self._completion.values() for n in names}
        like = rank0.staging(0)
        state = {name: np.zeros_like(like[name]) for name in mirrored
                 if roles[name] not in PER_FRAME_ROLES}
        self._staging = [{name: (np.zeros_like(like[name]) if roles[name] in PER_FRAME_ROLES
                                 else state[name]) for name in mirrored}
                         for _ in range(self.frames)]
        self._inputs = {g.name: [t.destination for t in g.transports
                                 if roles.get(t.destination) in PER_FRAME_ROLES]
                        for g in manifest.graphs}
        self._graphs: list[str | None] = [None] * self.frames
        self._speculative = {g.name for g in manifest.graphs
                             if g.operation == cpb.OPERATION_SPECULATIVE}
        self._framed = framed_confidence(manifest.graphs)
        self.failed: RankFailure | None = None

    @property
    def num_pages(self) -> int:
        return self.cache.num_pages

    @property
    def counters(self) -> Counter[str]:
        return self.rank0.counters

    def staging(self, frame: int) -> dict[str, np.ndarray]:
        """The host mirror packing writes for `frame` (request inputs and completion per
        frame; persistent-state rows shared by the frames)."""
        return self._staging[frame]

    def _check(self) -> None:
        if self.failed is not None:
            raise RankLost(f"the model's ranks failed earlier: {self.failed}")

    def launch(self, graph: str, frame: int, dirty=()) -> None:
        """Start `graph` from `frame` on every rank with the mirror's inputs and the
        `dirty` persistent-state ranges (packing's DirtyRange list)."""
        self._check()
        staged = self._staging[frame]
        inputs = {name: staged[name].copy() for name in self._inputs[graph]}
        writes = tuple((d.destination, d.row, d.start,
                        _row(staged[d.destination], d.row)[d.start:d.end].copy())
                       for d in dirty)
        self._graphs[frame] = graph
        try:
            self.peers.start(Step(graph, frame, inputs, writes))
        except RankFailure as exc:
            self.failed = exc
            raise

    def wait(self, frame: int) -> None:
        """Wait for every rank's completion of `frame`'s step, check that they agree, and
        copy the record into the mirror.

        Raises:
            RankLost: a rank failed or left (now or earlier).
            SpeculativeRejection: a rank's record of a SPECULATIVE step differs from rank
                0's (that step fails; the ranks serve on).
            RankDisagreement: a rank's record of any other step differs from rank 0's.
        """
        self._check()
        graph = self._graphs[frame]
        try:
            records = self.peers.finish(frame)
        except RankFailure as exc:
            self.failed = exc
            raise
        for rank, record in enumerate(records[1:], start=1):
            for name in self._completion[graph]:
                if not np.array_equal(record[name], records[0][name]):
                    why = (f"rank {rank}'s completion record ({name}) of {graph} differs "
                           "from rank 0's")
                    if graph in self._speculative:
                        raise SpeculativeRejection(f"{why}: the speculative step is rejected "
                                                   "on every rank")
                    self.failed = RankDisagreement(why)
                    raise self.failed
        framed = self._framed.get(graph)
        for name in self._completion[graph]:
            if name == framed:  # rank 0's plane of this frame
                self._staging[frame][name][frame] = records[0][name]
            else:
                self._staging[frame][name][...] = records[0][name]

    def run(self, graph: str, dirty=()) -> None:
        self.launch(graph, 0, dirty)
        self.wait(0)

    def run_producers(self, names: list[str]) -> None:
        self.peers.run_producers(names)

    def read_buffer(self, name: str) -> np.ndarray:
        """A copy of rank 0's buffer `name`."""
        return self.rank0.read_buffer(name)

    def write_state(self, name: str, byte_offset: int, values: np.ndarray) -> None:
        self._check()
        self.peers.write_state(name, byte_offset, values)

    def close(self) -> None:
        self.peers.close()


class ThreadPeers:
    """RankPeers::Threads: rank r is a thread owning `rank_steps[r]`.

    Args:
        rank_steps: every rank's backend, rank 0 first, each bound to `group`.
        group: their shared-memory collectives.
    """

    def __init__(self, rank_steps: Sequence[RankStep], group: ThreadGroup):
        self.ranks = len(rank_steps)
        self._ranks = list(rank_steps)
        self._group = group
        self._jobs: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in rank_steps]
        self._results: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in rank_steps]
        self._threads = [threading.Thread(target=self._serve, args=(r,), daemon=True,
                                          name=f"helios-rank-{r}")
                         for r in range(self.ranks)]
        for t in self._threads:
            t.start()

    def _serve(self, rank: int) -> None:
        """Rank `rank`'s thread: run jobs in order until None."""
        while True:
            job = self._jobs[rank].get()
            if job is None:
                return
            try:
                result = job(self._ranks[rank])
            except BaseException as exc:  # the rank failed: no other rank may wait for it
                self._group.abort(f"rank {rank} failed: {exc!r}")
                self._results[rank].put(RankLost(f"rank {rank} failed: {exc}"))
            else:
                self._results[rank].put(result)

    def _all(self, job: Callable[[RankStep], object]) -> None:
        for q in self._jobs:
            q.put(job)

    def _collect(self) -> list:
        results = [q.get() for q in self._results]
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:  # the first failure is the cause; the others are abandoned collectives
            cause = next((f for f in failures if "collective abandoned" not in str(f)),
                         failures[0])
            raise cause
        return results

    def start(self, step: Step) -> None:
        if self._group.broken_by is not None:
            raise RankLost(self._group.broken_by)
        self._all(lambda rank: rank.run(step))

    def finish(self, frame: int) -> list[dict[str, np.ndarray]]:
        return self._collect()

    def run_producers(self, names: list[str]) -> None:
        self._all(lambda rank: rank.backend.run_producers(names))
        self._collect()
        _share_tuned(self._ranks)

    def write_state(self, name: str, byte_offset: int, values: np.ndarray) -> None:
        for rank in self._ranks:
            rank.write_state(name, byte_offset, values)

    def close(self) -> None:
        self._group.abort("the model was closed")
        for q in self._jobs:
            q.put(None)
        for t in self._threads:
            t.join(5.0)


def _share_tuned(ranks: Sequence[RankStep]) -> None:
    """Give every rank rank 0's tuned buffers (a producer's timing differs between ranks;
    the programs must use one choice, rank 0's, as speculation broadcasts rank 0's
    confidence)."""
    first = ranks[0].backend
    tuned = [d.name for d in first._decls.values() if d.role == mpb.BUFFER_ROLE_TUNED]
    for rank in ranks[1:]:
        for name in tuned:
            rank.backend.buffers[name][...] = first.buffers[name]


def load_thread_ranks(manifest: mpb.ExecutionManifest, read_resource: Callable[[str], bytes],
                      cache: CacheSizing | None = None, frames: int = 1,
                      log: StartupLog | None = None, tiers: TierRows | None = None
                      ) -> RankedBackend:
    """Load every rank of a tensor-parallel core in this process (RankPeers::Threads):
    each rank's weights (its resources), buffers and cache, bound to shared-memory
    collectives.

    Raises:
        RuntimeLoadError: a rank cannot be loaded (as CpuBackend), or the ranks chose
            different cache capacities.
    """
    ranks = rank_count(manifest)
    group = ThreadGroup(ranks)
    backends: list[CpuBackend] = []
    for r in range(ranks):
        backends.append(CpuBackend(manifest, read_resource, cache, frames,
                                   log if r == 0 else StartupLog(), tiers, rank=r,
                                   collectives=group.member(r)))
    pages = {b.num_pages for b in backends}
    if len(pages) != 1:
        raise RuntimeLoadError(f"the ranks chose different page counts: {sorted(pages)}")
    with (log or StartupLog()).phase("ranks") as phase:
        peers = ThreadPeers([rank_step(manifest, b) for b in backends], group)
        phase.detail = (f"{ranks} tensor-parallel ranks (threads), each with its own "
                        "weights, buffers and cache")
    return RankedBackend(manifest, backends[0], peers)
