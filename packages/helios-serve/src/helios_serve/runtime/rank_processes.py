"""RankPeers::Processes: tensor-parallel ranks as `helios-serve --rank R` processes.

Specification: "Ownership and bootstrap" (ranks on other hosts connect as
RankPeers::Processes). Every rank runs ``helios-serve CORE --world N --rank R --peers
ADDR_0,...,ADDR_{N-1} --rank-key FILE``; rank 0 serves HTTP, the others only execute.

Two channels, neither home-made:

- **Control** (bootstrap and liveness): TCP (runtime.rank_control), authenticated both
  ways by `multiprocessing.connection`'s HMAC challenge with the shared ``--rank-key``
  (32 random bytes; `helios-tools keygen --aes`). Rank r > 0 listens on ADDR_r; rank 0
  dials each in rank order, checks that the peer runs the same core (the signed
  manifest's SHA-256) at the same world size, and hands it the MPI port. Only bytes
  travel (JSON), never pickles. Strangers that connect are dropped without disturbing
  the wait, and every bootstrap wait has a deadline (``--rank-timeout``). The connection
  then stays open: its end is how each side learns the other is gone.
- **Data** (step inputs, collectives, completion records): MPI through mpi4py, with the
  MPICH wheel. Rank 0 opens an MPI port; the ranks join one at a time
  (``Comm.Accept`` / ``Comm.Connect`` + ``Intercomm.Merge``) into one communicator in
  rank order. Each rank runs under its own ``mpiexec.gforker -n 1`` (MPICH 5's
  connect/accept between singleton-initialized processes fails: pmodels/mpich#7805), so
  `helios-serve` re-executes itself under it when no MPI launcher started it. The data
  plane is not authenticated; it listens only on the interface of the rank's own
  ``--peers`` address (libfabric's FI_TCP_IFACE; the fork launcher opens no listener).

Per step, rank 0's MPI thread broadcasts the step (runtime.ranks.Step: a JSON header and
the arrays' bytes), every rank runs it (collectives: Allgather of the parts, then the
NumPy reference, so every rank holds the same bytes, as with threads), and rank 0 gathers
the completion records for the agreement check. MPI has no failure notification here: a
rank that dies leaves the others inside a collective. Rank 0 therefore never waits on
MPI from the worker thread: `finish` waits for its MPI thread while watching the control
connections, and a closed one fails the step with RankLost (the stuck MPI thread is
abandoned; the model is unhealthy). A rank that loses rank 0 exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import queue
import shutil
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
from helios_contract import rank_count
from helios_contract.schema import manifest_pb2 as mpb
from helios_tools.kernels import collective as reference

from ..startup import StartupLog
from . import rank_control as control
from .cache_sizing import CacheSizing
from .cpu_backend import CpuBackend
from .errors import RankLost, RuntimeLoadError
from .ranks import RankedBackend, RankStep, Step, rank_step

# Environment an MPICH launcher (gforker, hydra) gives the processes it starts.
LAUNCHED = ("PMI_FD", "PMI_PORT", "PMI_RANK")
# MPICH's fork launcher: it starts the rank as its child and talks PMI over an inherited
# socket pair, so it opens no listener (hydra's mpiexec and proxy listen on 0.0.0.0). It
# forwards SIGTERM and SIGINT to the rank and exits with the rank's status, silently.
LAUNCHER = "mpiexec.gforker"
REEXEC_MARK = "HELIOS_RANK_UNDER_MPIEXEC"


class RankSetupError(RuntimeLoadError):
    """The rank options, peers or bootstrap exchange are wrong (one line)."""


@dataclass(frozen=True)
class ProcessRanks:
    """How this process takes part in RankPeers::Processes.

    Attributes:
        rank: this process's rank (0 serves HTTP).
        world: ranks in all (the core's rank_count).
        peers: control address (host, port) of every rank, rank order; rank r > 0
            listens on peers[r], rank 0 dials them.
        key: the shared control-channel key (bytes).
        timeout_s: how long bootstrap waits for the peers.
    """

    rank: int
    world: int
    peers: tuple[tuple[str, int], ...]
    key: bytes
    timeout_s: float = 120.0

    @classmethod
    def parse(cls, rank: int, world: int, peers: str, key_file: str | os.PathLike | None,
              timeout_s: float = 120.0) -> ProcessRanks:
        """Check `--rank/--world/--peers/--rank-key` together.

        Raises:
            RankSetupError: a rank outside [0, world), a peer list of another length or
                an address that is not HOST:PORT, a missing or short key file, or this
                rank's own entry naming a host that is not an address of this machine.
        """
        if world < 2:
            raise RankSetupError(f"--world must be at least 2 for process ranks, not {world}")
        if not 0 <= rank < world:
            raise RankSetupError(f"--rank {rank} is outside [0, {world}) for --world {world}")
        entries = [p.strip() for p in peers.split(",") if p.strip()]
        if len(entries) != world:
            raise RankSetupError(f"--peers lists {len(entries)} addresses; --world {world} "
                                 f"needs one per rank (HOST:PORT, rank order)")
        parsed = []
        for entry in entries:
            host, _, port = entry.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise RankSetupError(f"--peers entry {entry!r} is not HOST:PORT")
            parsed.append((host.strip("[]"), int(port)))
        if key_file is None:
            raise RankSetupError("--rank-key FILE is required with --world (32 random bytes "
                                 "shared by every rank: `helios-tools keygen --aes --out FILE`)")
        try:
            key = Path(key_file).read_bytes()
        except OSError as exc:
            raise RankSetupError(f"--rank-key {key_file}: {exc.strerror or exc}") from None
        if len(key) < 32:
            raise RankSetupError(f"--rank-key {key_file}: {len(key)} bytes; the key needs at "
                                 "least 32 random bytes")
        interface_of(parsed[rank][0])  # this rank's listeners go there: a local address
        return cls(rank, world, tuple(parsed), key, timeout_s)


def under_mpi_launcher() -> bool:
    """Whether an MPI launcher (gforker, hydra) started this process."""
    return any(name in os.environ for name in LAUNCHED)


def reexec_under_mpiexec(argv: Sequence[str]) -> None:
    """Replace this process with ``mpiexec.gforker -n 1 python -m helios_serve.cli ARGV``
    (the MPICH wheel's fork launcher, beside this interpreter), unless one started it.

    Raises:
        RankSetupError: no mpiexec.gforker is installed (the `helios-serve[ranks]` extra).
    """
    if under_mpi_launcher() or os.environ.get(REEXEC_MARK):
        return
    launcher = Path(sys.executable).with_name(LAUNCHER)
    mpiexec = str(launcher) if launcher.exists() else shutil.which(LAUNCHER)
    if mpiexec is None:
        raise RankSetupError("process ranks need MPI: install helios-serve[ranks] (mpi4py and "
                             f"the mpich wheel, which provides {LAUNCHER})")
    os.environ[REEXEC_MARK] = "1"
    os.execv(mpiexec, [mpiexec, "-n", "1", sys.executable, "-m", "helios_serve.cli", *argv])


def core_digest(manifest: mpb.ExecutionManifest) -> str:
    """What the ranks compare to know they run the same programs."""
    return hashlib.sha256(manifest.SerializeToString(deterministic=True)).hexdigest()


# -- MPI: the data plane -------------------------------------------------------------


# MPICH's libfabric TCP transport: a dead peer leaves the survivors waiting (which the
# control channel resolves) instead of aborting them, as the wheel's default UCX shared-
# memory transport did when its peer vanished (process_vm_readv: No such process).
# FI_TCP_IFACE (set per rank, see mpi_environment) confines its listener to one interface.
MPI_ENVIRONMENT = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
SHM_PREFIX = "/dev/shm/mpich_shm_"
SIOCGIFADDR = 0x8915  # linux/sockios.h


def interface_of(host: str) -> str:
    """The name of this host's network interface that holds `host`'s address.

    Raises:
        RankSetupError: `host` does not resolve, or no interface here holds its address.
    """
    try:
        wanted = {ipaddress.ip_address(info[4][0].split("%")[0])
                  for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (OSError, ValueError) as exc:
        raise RankSetupError(f"--peers host {host!r} does not resolve ({exc})") from None
    for name, addresses in _interface_addresses().items():
        if wanted & addresses:
            return name
    raise RankSetupError(f"--peers host {host!r} ({', '.join(sorted(map(str, wanted)))}) is "
                         "not an address of this host's network interfaces")


def _interface_addresses() -> dict[str, set]:
    """Interface name -> its addresses (IPv4 through SIOCGIFADDR, IPv6 from procfs)."""
    out: dict[str, set] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(probe.fileno(), SIOCGIFADDR,
                                  struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address
                continue
            out.setdefault(name, set()).add(ipaddress.ip_address(raw[20:24]))
    try:
        with open("/proc/net/if_inet6") as lines:
            for line in lines:
                fields = line.split()
                out.setdefault(fields[5], set()).add(
                    ipaddress.ip_address(bytes.fromhex(fields[0])))
    except OSError:  # no IPv6
        pass
    return out


def mpi_environment(setup: ProcessRanks) -> dict[str, str]:
    """The MPI settings of this rank: the TCP transport, listening only on the
    interface of this rank's `--peers` entry."""
    return {**MPI_ENVIRONMENT, "FI_TCP_IFACE": interface_of(setup.peers[setup.rank][0])}


def _mpi(setup: ProcessRanks):
    for name, value in mpi_environment(setup).items():  # before MPI initializes
        os.environ.setdefault(name, value)  # (the operator's setting wins)
    import mpi4py  # optional dependency (the ranks extra): imported when ranks run

    # Never MPI_Finalize at exit: a rank that lost a peer may hold an abandoned MPI call
    # (a bootstrap accept past its deadline, a collective the dead rank never joins),
    # under which MPICH's finalize aborts with an assertion. The process exit releases
    # what MPI holds; its shared-memory segment is unlinked below.
    mpi4py.rc.finalize = False
    from mpi4py import MPI  # initializes MPI (thread level "multiple")

    _unlink_shared_memory()
    return MPI


def _unlink_shared_memory() -> None:
    """Unlink the POSIX shared-memory segment MPICH's initialization created and mapped.

    Each rank is a world of one (`mpiexec.gforker -n 1`), so no other process attaches the
    segment by name; MPICH unlinks it only in MPI_Finalize, which a rank that exits
    with os._exit (rank 0 lost) or is killed never reaches. Unlinked now, the mapping
    stays valid and the segment goes with the process however it ends.
    """
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if SHM_PREFIX in line}
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class MpiCollectives:
    """One rank's collectives over an MPI communicator: every rank gathers every part and
    computes the NumPy reference (rank-order sum), so all ranks hold the same bytes."""

    def __init__(self, comm):
        self._comm = comm
        self.ranks = comm.Get_size()

    def _parts(self, x: np.ndarray) -> list[np.ndarray]:
        mine = np.ascontiguousarray(x, dtype=np.float32)
        every = np.empty((self.ranks, *mine.shape), np.float32)
        self._comm.Allgather(mine, every)
        return list(every)

    def all_reduce_sum(self, x: np.ndarray, T: int, N: int) -> None:
        x[:T, :N] = reference.all_reduce_sum(self._parts(x[:T, :N]), T, N)

    def all_gather_columns(self, x: np.ndarray, out: np.ndarray, T: int, NL: int,
                           N: int) -> None:
        out[:T, :N] = reference.all_gather_columns(self._parts(x[:T, :NL]), T, NL, N)

    def broadcast_rank0(self, x: np.ndarray, T: int, N: int) -> None:
        x[:T, :N] = reference.broadcast_rank0(self._parts(x[:T, :N]), T, N)


def _pack(header: dict, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """header JSON (with each array's dtype and shape) + the arrays' bytes, as uint8."""
    header = {**header, "arrays": [[a.dtype.str, list(a.shape)] for a in arrays]}
    head = json.dumps(header).encode()
    body = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
    return np.frombuffer(len(head).to_bytes(8, "little") + head + body, np.uint8)


def _unpack(buffer: np.ndarray) -> tuple[dict, list[np.ndarray]]:
    raw = buffer.tobytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size].decode())
    arrays, offset = [], 8 + size
    for dtype, shape in header["arrays"]:
        dt = np.dtype(dtype)
        count = int(np.prod(shape)) if shape else 1
        arrays.append(np.frombuffer(raw, dt, count, offset).reshape(shape).copy())
        offset += count * dt.itemsize
    return header, arrays


def _broadcast(comm, message: np.ndarray | None) -> np.ndarray:
    """Rank 0's uint8 message on every rank (length first, then the bytes)."""
    size = np.array([0 if message is None else len(message)], np.int64)
    comm.Bcast(size, root=0)
    data = message if message is not None else np.empty(int(size[0]), np.uint8)
    comm.Bcast(data, root=0)
    return data


def _encode_step(step: Step) -> np.ndarray:
    names = list(step.inputs)
    writes = [[name, row, start] for name, row, start, _ in step.writes]
    return _pack({"op": "step", "graph": step.graph, "frame": step.frame, "inputs": names,
                  "writes": writes},
                 [*step.inputs.values(), *(values for *_, values in step.writes)])


def _decode_step(header: dict, arrays: list[np.ndarray]) -> Step:
    names = header["inputs"]
    inputs = dict(zip(names, arrays[:len(names)], strict=True))
    writes = tuple((name, row, start, values) for (name, row, start), values
                   in zip(header["writes"], arrays[len(names):], strict=True))
    return Step(header["graph"], header["frame"], inputs, writes)


def _gather_record(comm, rank_step: RankStep, record: dict[str, np.ndarray] | None,
                   graph: str) -> list[dict[str, np.ndarray]] | None:
    """Every rank's completion record at rank 0 (None elsewhere)."""
    names = rank_step.completion[graph]
    # A graph without a record (RESTORE programs) still gathers: zero bytes per rank.
    mine = np.concatenate([record[n].reshape(-1).view(np.uint8) for n in names]) \
        if record is not None and names else np.empty(0, np.uint8)
    every = np.empty((comm.Get_size(), len(mine)), np.uint8) if comm.Get_rank() == 0 else None
    comm.Gather(mine, every, root=0)
    if every is None:
        return None
    out = []
    for row in every:
        parts, offset = {}, 0
        for n in names:
            like = record[n]
            nbytes = like.nbytes
            parts[n] = row[offset:offset + nbytes].view(like.dtype).reshape(like.shape)
            offset += nbytes
        out.append(parts)
    return out


def execute(comm, rank_step: RankStep, message: np.ndarray | None):
    """Run one broadcast message on this rank (rank 0 passes it, the others receive it).

    Returns:
        ("step", [records]) at rank 0 for a step, ("close", None) to stop, else (op, None).
    """
    header, arrays = _unpack(_broadcast(comm, message))
    op = header["op"]
    if op == "step":
        step = _decode_step(header, arrays)
        record = rank_step.run(step)
        return op, _gather_record(comm, rank_step, record, step.graph)
    if op == "producers":
        rank_step.backend.run_producers(header["names"])
        for name, values in zip(header["tuned"], _tuned(comm, rank_step, header["tuned"]),
                                strict=True):
            rank_step.backend.buffers[name][...] = values
        return op, None
    if op == "write_state":
        rank_step.write_state(header["name"], header["byte_offset"], arrays[0])
        comm.Barrier()
        return op, None
    return "close", None


def _tuned(comm, rank_step: RankStep, names: list[str]) -> list[np.ndarray]:
    """Rank 0's tuned buffers on every rank (every rank runs rank 0's choice)."""
    out = []
    for name in names:
        values = rank_step.backend.buffers[name].copy()
        comm.Bcast(values, root=0)
        out.append(values)
    return out


# -- bootstrap ------------------------------------------------------------------------


def _mpi_wait(what: str, call: Callable[[], object], deadline: float) -> object:
    """`call()` (a blocking MPI connect or accept, which has no timeout of its own) on a
    thread, by `deadline`. A call still blocked at the deadline is abandoned: the process
    is failing its startup and exits.

    Raises:
        RankSetupError: the deadline passed, or the call failed.
    """
    done: queue.SimpleQueue = queue.SimpleQueue()

    def run() -> None:
        try:
            done.put(call())
        except BaseException as exc:  # handed to the waiting thread
            done.put(exc)

    threading.Thread(target=run, daemon=True, name="helios-rank-join").start()
    try:
        result = done.get(timeout=max(deadline - time.monotonic(), 0))
    except queue.Empty:
        raise RankSetupError(f"{what} did not finish within the bootstrap timeout") from None
    if isinstance(result, BaseException):
        raise RankSetupError(f"{what} failed: {result}")
    return result


def _merge_next(comm, port: str, deadline: float, what: str):
    """Accept the next joining rank into `comm` (a collective over `comm`'s ranks)."""
    def accept():
        inter = comm.Accept(port, root=0)
        merged = inter.Merge(high=False)
        inter.Free()
        return merged

    return _mpi_wait(what, accept, deadline)


def _join(MPI, port: str, deadline: float):
    """Connect this rank to rank 0's communicator (it is the newest, highest rank)."""
    def connect():
        inter = MPI.COMM_SELF.Connect(port, root=0)
        merged = inter.Merge(high=True)
        inter.Free()
        return merged

    return _mpi_wait("joining rank 0's MPI communicator", connect, deadline)


def bootstrap_rank0(setup: ProcessRanks, digest: str) -> tuple[object, list[Connection]]:
    """Rank 0: dial every rank's control address, check it, join them into one MPI
    communicator, all within `setup.timeout_s`. Returns (communicator, control
    connections of ranks 1..N-1).

    Raises:
        RankSetupError: a rank is unreachable or silent within the timeout, fails
            authentication, or runs another core or world size.
    """
    deadline = time.monotonic() + setup.timeout_s
    MPI = _mpi(setup)
    controls: list[Connection] = []
    for r in range(1, setup.world):
        controls.append(_dial(setup.peers[r], setup.key, r, deadline))
    port = MPI.Open_port()
    comm = MPI.COMM_SELF.Dup()
    for r, conn in enumerate(controls, start=1):
        where = f"rank {r} at {_address(setup.peers[r])}"
        control.send(conn, {"world": setup.world, "rank": r, "core": digest, "port": port})
        try:
            reply = control.recv(conn, deadline)
        except control.ControlTimeout:
            raise RankSetupError(f"{where} did not answer the hello within the bootstrap "
                                 "timeout") from None
        except (EOFError, OSError, ValueError) as exc:
            raise RankSetupError(f"{where} left during bootstrap ({exc or 'closed'})") from None
        if reply.get("error"):
            raise RankSetupError(f"{where} refused: {reply['error']}")
        # Ranks already joined accept the newcomer with rank 0 (a collective call).
        for joined in controls[:r - 1]:
            control.send(joined, {"accept": r})
        comm = _merge_next(comm, port, deadline, f"{where} joining the MPI communicator")
    MPI.Close_port(port)
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    for conn in controls:
        control.settle(conn)
    return comm, controls


def _address(peer: tuple[str, int]) -> str:
    return f"{peer[0]}:{peer[1]}"


def _dial(peer: tuple[str, int], key: bytes, rank: int, deadline: float) -> Connection:
    try:
        return control.dial(peer, key, deadline)
    except AuthenticationError:
        raise RankSetupError(f"rank {rank} at {_address(peer)} failed authentication "
                             "(another --rank-key)") from None
    except control.ControlTimeout as exc:
        raise RankSetupError(f"rank {rank} at {_address(peer)} did not answer within the "
                             f"bootstrap timeout ({exc})") from None


def bootstrap_rank(setup: ProcessRanks, digest: str) -> tuple[object, Connection]:
    """Rank r > 0: listen on its control address for rank 0 (strangers are dropped, see
    runtime.rank_control), check the hello, join the MPI communicator (and accept the
    ranks after it). Rank 0 must call within `setup.timeout_s`; after its hello, each
    later step gets `setup.timeout_s` again. Returns (communicator, control).

    Raises:
        RankSetupError: rank 0 runs another core or world size, or nobody holding the
            key calls within the timeout, or a later step misses its deadline.
    """
    host, port = setup.peers[setup.rank]
    started = time.monotonic()
    MPI = _mpi(setup)
    with control.ControlListener((host, port), setup.key) as listener:
        try:
            conn = listener.accept(started + setup.timeout_s)
        except control.ControlTimeout:
            raise RankSetupError(f"rank 0 did not call {host}:{port} within "
                                 f"{setup.timeout_s:g} s{listener.dropped_summary()}"
                                 ) from None
    deadline = time.monotonic() + setup.timeout_s
    try:
        hello = control.recv(conn, deadline)
        problem = None
        if hello["world"] != setup.world or hello["rank"] != setup.rank:
            problem = (f"rank 0 expects rank {hello['rank']} of {hello['world']}; this is "
                       f"rank {setup.rank} of {setup.world}")
        elif hello["core"] != digest:
            problem = "rank 0 serves another core (execution manifests differ)"
        control.send(conn, {"error": problem} if problem else {"ok": True})
    except control.ControlTimeout:
        raise RankSetupError("rank 0 sent no hello within the bootstrap timeout") from None
    except (EOFError, OSError, ValueError, KeyError) as exc:
        raise RankSetupError(f"rank 0 left or sent a bad hello ({exc or 'closed'})") from None
    if problem:
        raise RankSetupError(problem)
    comm = _join(MPI, hello["port"], deadline)
    for later in range(setup.rank + 1, setup.world):  # take part in the later joins
        deadline = time.monotonic() + setup.timeout_s
        try:
            control.recv(conn, deadline)
        except control.ControlTimeout:
            raise RankSetupError(f"rank {later} did not join within the bootstrap "
                                 "timeout") from None
        except (EOFError, OSError, ValueError) as exc:
            raise RankSetupError(f"rank 0 left during bootstrap ({exc or 'closed'})") from None
        comm = _merge_next(comm, hello["port"], deadline, f"rank {later} joining")
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    control.settle(conn)
    return comm, conn


# -- rank 0: ProcessPeers ---------------------------------------------------------------


class ProcessPeers:
    """RankPeers::Processes at rank 0: its own rank runs here, the others in their
    processes; every MPI call happens on one thread ("helios-rank-mpi")."""

    def __init__(self, comm, rank0: RankStep, controls: list[Connection]):
        self.ranks = comm.Get_size()
        self._comm = comm
        self._rank0 = rank0
        self._controls = controls
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self.lost: str | None = None
        self._lost = threading.Event()
        self._gone = [threading.Event() for _ in controls]  # rank r's at r - 1
        self._thread = threading.Thread(target=self._serve, name="helios-rank-mpi",
                                        daemon=True)
        self._thread.start()
        for r, conn in enumerate(controls, start=1):
            threading.Thread(target=self._watch, args=(r, conn), daemon=True,
                             name=f"helios-rank-watch-{r}").start()

    def _watch(self, rank: int, conn: Connection) -> None:
        """A rank's control connection ends only when its process does."""
        try:
            while True:
                conn.recv_bytes()
        except (EOFError, OSError):
            if self.lost is None:
                self.lost = f"rank {rank} exited (its control connection closed)"
            self._gone[rank - 1].set()
            self._lost.set()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                result = job()
            except BaseException as exc:  # MPI or rank 0's own step failed
                result = RankLost(f"rank 0's step failed: {exc}")
            self._results.put(result)
            if job is None:
                return

    def _call(self, job: Callable[[], object]) -> object:
        if self.lost is not None:
            raise RankLost(self.lost)
        self._jobs.put(job)
        return self._result()

    def _result(self) -> object:
        while True:
            try:
                result = self._results.get(timeout=0.05)
            except queue.Empty:
                if self._lost.is_set():
                    raise RankLost(self.lost) from None
                continue
            if isinstance(result, BaseException):
                raise result
            return result

    def start(self, step: Step) -> None:
        if self.lost is not None:
            raise RankLost(self.lost)
        message = _encode_step(step)
        self._jobs.put(lambda: execute(self._comm, self._rank0, message)[1])

    def finish(self, frame: int) -> list[dict[str, np.ndarray]]:
        return self._result()

    def run_producers(self, names: list[str]) -> None:
        tuned = [d.name for d in self._rank0.backend._decls.values()
                 if d.role == mpb.BUFFER_ROLE_TUNED]
        message = _pack({"op": "producers", "names": names, "tuned": tuned}, [])
        self._call(lambda: execute(self._comm, self._rank0, message))

    def write_state(self, name: str, byte_offset: int, values: np.ndarray) -> None:
        message = _pack({"op": "write_state", "name": name, "byte_offset": byte_offset},
                        [np.asarray(values)])
        self._call(lambda: execute(self._comm, self._rank0, message))

    def close(self) -> None:
        """Stop every rank unless one is lost (then MPI may be stuck): broadcast "close",
        then wait up to CLOSE_S for each rank to close its control connection (it does so
        once it left the step loop, so it exits 0 rather than 3 for a lost rank 0)."""
        if self.lost is None:
            message = _pack({"op": "close"}, [])
            try:
                self._call(lambda: execute(self._comm, self._rank0, message))
            except RankLost:
                pass
            else:
                deadline = time.monotonic() + CLOSE_S
                for gone in self._gone:
                    gone.wait(max(deadline - time.monotonic(), 0))
        for conn in self._controls:
            _hang_up(conn)


# How long rank 0's shutdown waits for the other ranks to leave after "close".
CLOSE_S = 10.0


def _hang_up(conn: Connection) -> None:
    """Close a control connection another thread may be reading: shut the socket down
    first, which wakes that reader and sends the FIN now (a plain close of a descriptor
    being read waits for the read to return)."""
    with contextlib.suppress(OSError), socket.socket(fileno=conn.fileno()) as sock:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.detach()
    conn.close()


def load_process_ranks(manifest: mpb.ExecutionManifest, read_resource: Callable[[str], bytes],
                       setup: ProcessRanks, cache: CacheSizing | None = None,
                       frames: int = 1, log: StartupLog | None = None) -> RankedBackend:
    """Rank 0 of RankPeers::Processes: load rank 0's part, bootstrap the other ranks.

    Raises:
        RankSetupError: the core's rank count is not --world, or bootstrap fails.
        RuntimeLoadError: rank 0's part cannot be loaded.
    """
    _check_world(manifest, setup)
    log = log if log is not None else StartupLog()
    with log.phase("ranks") as phase:
        comm, controls = bootstrap_rank0(setup, core_digest(manifest))
        phase.detail = (f"{setup.world} tensor-parallel ranks (processes; ranks 1.."
                        f"{setup.world - 1} at "
                        f"{', '.join(_address(p) for p in setup.peers[1:])})")
    backend = CpuBackend(manifest, read_resource, cache, frames, log, rank=0,
                         collectives=MpiCollectives(comm))
    _agree_on_pages(comm, backend, setup.timeout_s)
    peers = ProcessPeers(comm, rank_step(manifest, backend), controls)
    return RankedBackend(manifest, backend, peers)


def _agree_on_pages(comm, backend: CpuBackend, timeout_s: float) -> None:
    """Every rank must back the same physical page count (the same cache options); a
    rank that died after joining fails this within `timeout_s`."""
    pages = np.empty(comm.Get_size(), np.int64)
    mine = np.array([backend.num_pages], np.int64)
    _mpi_wait("agreeing on the KV page count with the other ranks",
              lambda: comm.Allgather(mine, pages), time.monotonic() + timeout_s)
    if len(set(pages.tolist())) != 1:
        raise RankSetupError(f"the ranks chose different KV page counts {pages.tolist()}: "
                             "give every rank the same cache options")


def _check_world(manifest: mpb.ExecutionManifest, setup: ProcessRanks) -> None:
    ranks = rank_count(manifest)
    if ranks != setup.world:
        raise RankSetupError(f"--world {setup.world}, but the core is split between {ranks} "
                             f"rank{'s' if ranks != 1 else ''}")


def serve_rank(manifest: mpb.ExecutionManifest, read_resource: Callable[[str], bytes],
               setup: ProcessRanks, cache: CacheSizing | None = None, frames: int = 1,
               log: StartupLog | None = None, ready: Callable[[], None] | None = None
               ) -> None:
    """Rank r > 0: load this rank's part, join rank 0, execute steps until rank 0 closes
    (returns) or disappears (the process exits with status 3: nothing left to serve), or
    SIGTERM/SIGINT stops it (exits 0).

    Raises:
        RankSetupError / RuntimeLoadError: as load_process_ranks.
    """
    _check_world(manifest, setup)
    log = log if log is not None else StartupLog()
    with log.phase("ranks") as phase:
        comm, to_rank0 = bootstrap_rank(setup, core_digest(manifest))
        phase.detail = f"rank {setup.rank} of {setup.world} joined rank 0"
    backend = CpuBackend(manifest, read_resource, cache, frames, log, rank=setup.rank,
                         collectives=MpiCollectives(comm))
    _agree_on_pages(comm, backend, setup.timeout_s)
    step_runner = rank_step(manifest, backend)

    closing = threading.Event()

    def watch() -> None:  # rank 0 gone: MPI would wait forever for its next message
        try:
            while True:
                to_rank0.recv_bytes()
        except (EOFError, OSError):
            if not closing.is_set():
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="helios-rank-watch-0").start()
    _exit_on_stop_signals()
    if ready is not None:
        ready()
    while execute(comm, step_runner, None)[0] != "close":
        pass
    closing.set()
    _hang_up(to_rank0)  # rank 0 waits for this before it closes its end


def _exit_on_stop_signals() -> None:
    """SIGTERM or SIGINT ends this rank at once with status 0 (stopped as asked; rank 0
    then sees a lost rank). The main thread may sit in an MPI call that Python's signal
    handlers cannot interrupt, so the signal reaches a thread through the wakeup fd."""
    readable, writable = os.pipe()
    os.set_blocking(writable, False)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)  # Python's C handler writes to the wakeup fd
    signal.set_wakeup_fd(writable)

    def stop() -> None:
        os.read(readable, 1)
        os._exit(0)

    threading.Thread(target=stop, daemon=True, name="helios-rank-signals").start()
