"""The process ranks' control channel against strangers, over real TCP on 127.0.0.1
(runtime/rank_control.py; docs/tensor-parallel.md, "What operators see")."""

from __future__ import annotations

import secrets
import socket
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge

import pytest
from helios_serve.runtime import rank_control as control
from helios_serve.runtime.rank_processes import RankSetupError, interface_of

KEY = secrets.token_bytes(32)


def _listener() -> control.ControlListener:
    return control.ControlListener(("127.0.0.1", 0), KEY)


def _address(listener: control.ControlListener) -> tuple[str, int]:
    return listener._sock.getsockname()


def _raw(address) -> socket.socket:
    sock = socket.create_connection(address, timeout=10)
    sock.settimeout(None)  # (a timeout makes the descriptor non-blocking)
    return sock


def _replay(address, refused: list) -> None:
    """A valid answer to one connection's challenge, sent on a second connection."""
    first = _raw(address)
    challenge = Connection(first.detach()).recv_bytes(256)
    mine, theirs = socket.socketpair()
    recorder = Connection(theirs.detach())
    recorder.send_bytes(challenge)
    recorder.send_bytes(b"#WELCOME#")  # so answer_challenge returns
    answer_challenge(Connection(mine.detach()), KEY)
    answer = recorder.recv_bytes()
    second = Connection(_raw(address).detach())
    second.recv_bytes(256)  # its own challenge
    second.send_bytes(answer)
    refused.append(second.recv_bytes())  # #FAILURE#: the digest of another challenge


def _real_peer(address, got: list) -> None:
    conn = control.dial(address, KEY, time.monotonic() + 10)
    control.send(conn, {"hello": 1})
    got.append(control.recv(conn, time.monotonic() + 10))


@pytest.mark.parametrize("kind", ["garbage", "replay", "silent", "another key"])
def test_a_stranger_is_dropped_and_the_real_peer_is_accepted(kind):
    with _listener() as listener:
        address = _address(listener)
        accepted: list = []
        acceptor = threading.Thread(target=lambda: accepted.append(
            listener.accept(time.monotonic() + 30)))
        acceptor.start()  # listening before the stranger calls
        held, refused, stranger = None, [], None
        if kind == "garbage":
            held = _raw(address)
            held.sendall(b"\x7f" * 64)  # a frame of 2 GiB announced
        elif kind == "replay":
            stranger = threading.Thread(target=_replay, args=(address, refused))
        elif kind == "silent":
            held = _raw(address)  # connected, sends nothing, stays open
        else:
            def other() -> None:
                try:
                    control.dial(address, secrets.token_bytes(32), time.monotonic() + 10)
                except AuthenticationError as exc:
                    refused.append(str(exc))
            stranger = threading.Thread(target=other)
        if stranger is not None:
            stranger.start()
            stranger.join(10)
        got: list = []
        peer = threading.Thread(target=_real_peer, args=(address, got))
        peer.start()
        acceptor.join(30)
        conn = accepted[0]
        assert control.recv(conn, time.monotonic() + 10) == {"hello": 1}
        control.send(conn, {"ok": True})
        peer.join(10)
        assert got == [{"ok": True}]
        if held is not None:
            held.close()
    assert refused == {"replay": [b"#FAILURE#"], "another key": ["digest sent was rejected"]
                       }.get(kind, [])


def test_accept_honours_its_deadline_while_a_stranger_stays_silent():
    with _listener() as listener:
        silent = _raw(_address(listener))
        start = time.monotonic()
        with pytest.raises(control.ControlTimeout):
            listener.accept(start + 0.5)
        waited = time.monotonic() - start
        silent.close()
    # Not a speed claim: the silent caller, allowed HANDSHAKE_S (10 s) to authenticate,
    # does not hold the wait past its deadline (before: until the caller hung up).
    assert waited < control.HANDSHAKE_S, waited


def test_recv_honours_its_deadline():
    with _listener() as listener:
        got: list = []
        threading.Thread(target=lambda: got.append(
            control.dial(_address(listener), KEY, time.monotonic() + 10)), daemon=True).start()
        conn = listener.accept(time.monotonic() + 10)
        with pytest.raises(control.ControlTimeout):
            control.recv(conn, time.monotonic() + 0.2)  # the peer sends nothing


def test_the_garbage_and_the_reason_are_named():
    with _listener() as listener:
        address = _address(listener)
        garbage = _raw(address)
        garbage.sendall(b"\x7f" * 64)
        hung_up = _raw(address)
        hung_up.close()
        with pytest.raises(control.ControlTimeout):
            listener.accept(time.monotonic() + 1)
        garbage.close()
    assert sorted(why for _, why in listener.dropped) == [
        "hung up before authenticating", "sent garbage (bad message length)"]
    assert listener.dropped_summary().startswith("; dropped 127.0.0.1:")


def test_dial_gives_up_at_its_deadline_naming_the_refusal():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(control.ControlTimeout, match="^Connection refused$"):
        control.dial(("127.0.0.1", port), KEY, time.monotonic() + 0.5)


def test_interface_of_a_peer_address():
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("localhost") == "lo"
    with pytest.raises(RankSetupError, match=r"^--peers host '198\.51\.100\.7' \(198\.51\.100\.7\) "
                                             r"is not an address of this host's network "
                                             r"interfaces$"):
        interface_of("198.51.100.7")
    with pytest.raises(RankSetupError, match=r"^--peers host 'no-such-host\.invalid' does "
                                             r"not resolve"):
        interface_of("no-such-host.invalid")
