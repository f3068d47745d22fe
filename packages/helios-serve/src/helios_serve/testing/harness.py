"""ScriptedServer: a real Server (worker, scheduler, output pipeline, HTTP) on 127.0.0.1
around a ScriptedModel, for tests."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from helios_serve.clock import ObservationClock
from helios_serve.config import ServeOptions, resolve
from helios_serve.liveness import DEFAULT_STALL_TIMEOUT_S
from helios_serve.server import Server
from helios_serve.testing.scripted import ScriptBook, ScriptedModel, tiny_geometry
from helios_serve.testing.tiny import SERVED_ID, tiny_bootstrap
from helios_serve.testing.tokenizer import TinyTokenizer


class ScriptedServer:
    """Starts a Server around a ScriptedModel; `close()` stops it.

    Speculative geometries serve with the "fixed" policy by default (every lane as long
    as its ceiling), so scripted lanes are known exactly; pass speculative_policy=
    "adaptive" for the width policy.

    Attributes:
        tok: the tiny tokenizer.
        book: the responder; `book.add(trigger, ids)` scripts prompts containing trigger.
        model: the ScriptedModel (fault injection, step counts).
        server: the running Server; url: its base URL.
    """

    def __init__(
        self,
        tok: TinyTokenizer | None = None,
        *,
        max_active: int = 4,
        queue_capacity: int = 8,
        frontend_workers: int = 2,
        step_delay_s: float = 0.0,
        default_script: Sequence[str] = ("Hello", ",", " world", "!"),
        geometry: dict[str, Any] | None = None,
        frames: int = 2,
        device_pending: bool = True,
        api_key: str | None = None,
        speculative_policy: str = "fixed",
        history_drafting: bool = False,
        history_proposer: str = "copy",
        stream_interval: int = 1,
        engine_stall_timeout: float = DEFAULT_STALL_TIMEOUT_S,
    ) -> None:
        self.tok = tok or TinyTokenizer()
        self.book = ScriptBook(self.tok.decode, default=self.tok.ids(list(default_script)))
        bootstrap = tiny_bootstrap(self.tok)
        clock = ObservationClock()
        self.model = ScriptedModel(
            tiny_geometry(self.tok.vocab_size, **(geometry or {})), self.book,
            step_delay_s=step_delay_s, frames=frames, device_pending=device_pending,
        )  # fmt: skip
        options = ServeOptions(
            port=0, max_active=max_active, queue_capacity=queue_capacity,
            frontend_workers=frontend_workers, api_key=api_key,
            speculative_policy=speculative_policy, history_drafting=history_drafting,
            history_proposer=history_proposer,
            stream_interval=stream_interval, engine_stall_timeout=engine_stall_timeout,
        )  # fmt: skip
        self.server = Server.start(
            bootstrap, self.model, resolve(options, bootstrap.contract), clock
        )
        self.url = self.server.url
        self.model_name = SERVED_ID

    def script(self, trigger: str, pieces: Sequence[str]) -> None:
        """Prompts containing `trigger` generate `pieces` (tiny-tokenizer tokens), then EOS."""
        self.book.add(trigger, self.tok.ids(list(pieces)))

    def openai(self):
        import openai  # start-up time: the openai client takes seconds to import

        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0,
                             timeout=30.0)  # fmt: skip

    def wait_idle(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """Wait until the worker is idle and every admission permit is released."""
        deadline = time.monotonic() + timeout_s
        while True:
            snap = self.server.worker.snapshot()
            admission = self.server.service.admission
            permits = admission.in_use if admission is not None else 0
            snap["permits"] = permits
            if snap["idle"] and permits == 0:
                return snap
            if time.monotonic() > deadline:
                raise AssertionError(f"server not idle after {timeout_s} s: {snap}")
            time.sleep(0.02)

    def close(self) -> None:
        self.server.stop()

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sse_post(url: str, body: dict[str, Any], timeout_s: float = 30.0) -> tuple[int, list[Any]]:
    """POST a streaming chat request; returns (status, events): each event is the decoded
    JSON of a `data:` line, or the string "[DONE]"."""

    import httpx  # start-up time: only the tests that stream through it import it

    events: list[Any] = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=timeout_s) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, [r.json()]
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            events.append("[DONE]" if data == "[DONE]" else json.loads(data))
    return 200, events


def content_of(events: list[Any]) -> str:
    """Concatenated content deltas of SSE events."""
    return "".join(
        e["choices"][0]["delta"].get("content") or ""
        for e in events
        if isinstance(e, dict) and e.get("choices")
    )
