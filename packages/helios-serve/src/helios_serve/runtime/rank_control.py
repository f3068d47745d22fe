"""The control channel of RankPeers::Processes: authenticated TCP with deadlines.

Rank r > 0 listens on its `--peers` address; rank 0 dials it. Both ends authenticate
each other with `multiprocessing.connection`'s HMAC challenge (the shared `--rank-key`),
then exchange JSON messages (bytes, never pickles) over the same framing.

The listening side serves strangers too, so it holds two rules:

- A connection that fails authentication, sends garbage or stays silent is dropped and
  the rank keeps listening; only the deadline ends the wait. Each caller is
  authenticated on its own thread within HANDSHAKE_S, so a silent one holds nothing.
- Every receive during bootstrap has a deadline (the socket's SO_RCVTIMEO), so no wait
  outlives the bootstrap timeout by more than the polling interval below.

After bootstrap the connection blocks without a deadline: its end is how each side
learns that the other is gone.
"""

from __future__ import annotations

import json
import logging
import queue
import socket
import struct
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

# The most a caller may take to authenticate (a challenge each way over one TCP round
# trip each); a stranger that stays silent is dropped after this.
HANDSHAKE_S = 10.0
# How often a waiting accept checks its deadline (bounds how late a timeout fires).
POLL_S = 0.1
MAX_MESSAGE_BYTES = 1 << 20

log = logging.getLogger(__name__)


class ControlTimeout(TimeoutError):
    """A bootstrap wait ran past its deadline."""


def _set_deadline(conn: Connection, deadline: float | None) -> None:
    """Receives and sends on `conn` fail (OSError) once `deadline` (time.monotonic) has
    passed; None: they block."""
    seconds = 0.0 if deadline is None else max(deadline - time.monotonic(), 0.001)
    whole = int(seconds)
    timeval = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    with socket.socket(fileno=conn.fileno()) as sock:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
        finally:
            sock.detach()  # the Connection owns the descriptor


def settle(conn: Connection) -> None:
    """Bootstrap is over: `conn` blocks without a deadline from now on."""
    _set_deadline(conn, None)


def send(conn: Connection, message: dict) -> None:
    conn.send_bytes(json.dumps(message).encode())


def recv(conn: Connection, deadline: float) -> dict:
    """The next JSON message, by `deadline` (time.monotonic).

    Raises:
        ControlTimeout: nothing arrived by the deadline.
        EOFError / OSError / ValueError: the peer left or sent a malformed message.
    """
    _set_deadline(conn, deadline)
    try:
        return json.loads(conn.recv_bytes(MAX_MESSAGE_BYTES).decode())
    except BlockingIOError:  # SO_RCVTIMEO expired (EAGAIN)
        raise ControlTimeout("no message by the deadline") from None


def _authenticated(sock: socket.socket, key: bytes, deadline: float, dialing: bool
                   ) -> Connection:
    """`sock` as a Connection once both ends proved the key (the dialer answers first).

    Raises:
        AuthenticationError: the peer holds another key or answered with garbage.
        ControlTimeout / EOFError / OSError: it stayed silent or left.
    """
    sock.setblocking(True)
    conn = Connection(sock.detach())
    try:
        _set_deadline(conn, deadline)
        if dialing:
            answer_challenge(conn, key)
            deliver_challenge(conn, key)
        else:
            deliver_challenge(conn, key)
            answer_challenge(conn, key)
    except BlockingIOError:
        conn.close()
        raise ControlTimeout("the handshake did not finish in time") from None
    except BaseException:
        conn.close()
        raise
    return conn


def dial(address: tuple[str, int], key: bytes, deadline: float) -> Connection:
    """Connect to a listening rank and authenticate both ways, retrying refused
    connections (the rank is not listening yet) until `deadline`.

    Raises:
        AuthenticationError: the listener holds another key.
        ControlTimeout: nobody accepted and authenticated by the deadline (the message
            names the last refusal).
    """
    last = "nothing answered"
    while (left := deadline - time.monotonic()) > 0:
        try:
            sock = socket.create_connection(address, timeout=left)
        except OSError as exc:  # not listening yet
            last = exc.strerror or str(exc)
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))
            continue
        try:
            return _authenticated(sock, key, min(deadline, time.monotonic() + HANDSHAKE_S),
                                  dialing=True)
        except (ControlTimeout, EOFError, OSError) as exc:  # dropped: try again
            last = f"the handshake failed ({exc or type(exc).__name__})"
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))
    raise ControlTimeout(last)


class ControlListener:
    """Listen on `address` for the one caller that holds `key`.

    Strangers (garbage, a replayed handshake, a silent connection, another key) are
    dropped and counted in `dropped` (address, reason), and the listener keeps waiting.
    A context manager: leaving it closes the listening socket and drops callers still
    authenticating.
    """

    def __init__(self, address: tuple[str, int], key: bytes) -> None:
        self._key = key
        self._address = address
        self._sock = socket.create_server(address, backlog=16)
        self._sock.settimeout(POLL_S)
        self._authenticated: queue.SimpleQueue[Connection] = queue.SimpleQueue()
        self._closed = threading.Event()
        self.dropped: list[tuple[str, str]] = []

    def __enter__(self) -> ControlListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        self._sock.close()

    def dropped_summary(self, listed: int = 3) -> str:
        """The dropped callers, for the timeout's message: '' or '; dropped A: why, ...'."""
        if not self.dropped:
            return ""
        shown = [f"{who}: {why}" for who, why in self.dropped[:listed]]
        more = len(self.dropped) - listed
        return "; dropped " + "; ".join(shown) + (f"; and {more} more" if more > 0 else "")

    def accept(self, deadline: float) -> Connection:
        """The first caller that authenticates by `deadline` (time.monotonic).

        Raises:
            ControlTimeout: none did.
        """
        while time.monotonic() < deadline:
            try:
                return self._authenticated.get_nowait()
            except queue.Empty:
                pass
            try:
                sock, peer = self._sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._handshake, args=(sock, peer), daemon=True,
                             name="helios-rank-handshake").start()
        try:  # one that authenticated in the last poll interval still counts
            return self._authenticated.get_nowait()
        except queue.Empty:
            raise ControlTimeout("nobody authenticated by the deadline") from None

    def _handshake(self, sock: socket.socket, peer: tuple) -> None:
        who = f"{peer[0]}:{peer[1]}"
        try:
            conn = _authenticated(sock, self._key, time.monotonic() + HANDSHAKE_S,
                                  dialing=False)
        except AuthenticationError:
            self._drop(who, "failed authentication (another --rank-key, or not a rank)")
            return
        except ControlTimeout:
            self._drop(who, "stayed silent")
            return
        except EOFError:
            self._drop(who, "hung up before authenticating")
            return
        except (OSError, ValueError) as exc:
            self._drop(who, f"sent garbage ({exc})")
            return
        if self._closed.is_set():
            conn.close()
        else:
            self._authenticated.put(conn)

    def _drop(self, who: str, why: str) -> None:
        self.dropped.append((who, why))
        log.warning("control port %s:%s dropped %s: %s", *self._address, who, why)
