"""Adversarial tests of two execution frames through the real worker and HTTP server
(ScriptedServer: frames=2, device-owned pending token; the specification, completion
feedback): output limits, EOS, cancellation with an ahead row in flight, prefix reuse
after it, page pressure, the feedback barrier, and equality with a one-frame server."""

from __future__ import annotations

import json
import random
import threading
import time

import httpx
import pytest
from helios_serve.engine.plan import StepKind
from helios_serve.testing.harness import ScriptedServer, content_of

LETTERS = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _chat(server, prompt: str, **extra) -> dict:
    return {"model": server.model_name, "messages": [{"role": "user", "content": prompt}],
            **extra}


def _ask(server, prompt: str, **extra) -> dict:
    r = httpx.post(server.url + "/v1/chat/completions", json=_chat(server, prompt, **extra),
                   timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _answer(r: dict) -> tuple[str, str, int]:
    c = r["choices"][0]
    return c["message"]["content"], c["finish_reason"], r["usage"]["completion_tokens"]


class Watch:
    """Wraps the scripted model's submit on the worker thread and records violations of
    the frame rules: a slot shared by two requests across in-flight frames, a request
    needing feedback live while two frames are out, more frames than offered."""

    def __init__(self, server: ScriptedServer) -> None:
        self.server = server
        self.model = server.model
        self.worker = server.server.worker
        self.violations: list[str] = []
        self.inflight: list = []  # plans submitted, not yet waited
        self.max_outstanding = 0
        submit, wait = self.model.submit, self.model.wait_step

        def watched_submit(plan):
            for older in self.inflight:
                for a in older.rows:
                    for b in plan.rows:
                        if a.slot == b.slot and a.request_id != b.request_id:
                            self.violations.append(f"slot {a.slot} shared in flight")
            ticket = submit(plan)
            self.inflight.append(plan)
            n = self.model.outstanding
            self.max_outstanding = max(self.max_outstanding, n)
            if n > 1 and any(live.request.prepared.needs_feedback
                             for live in self.worker._live.values()):
                self.violations.append("two frames out with a feedback request live")
            return ticket

        def watched_wait(ticket):
            self.inflight.pop(0)
            return wait(ticket)

        self.model.submit = watched_submit
        self.model.wait_step = watched_wait


def _letters(rng: random.Random, n: int) -> bytes:
    return "".join(rng.choice(LETTERS) for _ in range(n)).encode()


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4])
def test_output_limit_exact_for_short_limits(tok, max_tokens):
    with ScriptedServer(tok) as server:
        watch = Watch(server)
        server.book.add("story", tok.byte_ids(b"abcdefgh"))
        assert _answer(_ask(server, "story", max_tokens=max_tokens)) == (
            "abcdefgh"[:max_tokens], "length", max_tokens)
        assert server.wait_idle()["pages_used"] == 0
        assert watch.violations == []


@pytest.mark.parametrize("script,max_tokens,want", [
    (b"", 5, ("", "stop", 1)),  # EOS as the prefill's token
    (b"a", 5, ("a", "stop", 2)),  # EOS as the first decode token
    (b"ab", 5, ("ab", "stop", 3)),  # EOS as the first ahead token
    (b"abc", 4, ("abc", "stop", 4)),  # EOS exactly at the limit
    (b"abcd", 4, ("abcd", "length", 4)),  # the limit exactly before EOS
    (b"", 1, ("", "stop", 1)),
])
def test_eos_around_the_ahead_row(tok, script, max_tokens, want):
    with ScriptedServer(tok) as server:
        watch = Watch(server)
        server.book.add("story", tok.byte_ids(script))
        for _ in range(3):  # again: prefix reuse after the ahead row was dropped
            assert _answer(_ask(server, "story", max_tokens=max_tokens)) == want
            assert server.wait_idle()["pages_used"] == 0
        assert watch.violations == []


def test_disconnect_mid_stream_with_an_ahead_row_then_the_same_prompt_again(tok):
    script = b"The quick brown fox jumps over the lazy dog"  # default limit: 64
    with ScriptedServer(tok, step_delay_s=0.01) as server:
        watch = Watch(server)
        server.book.add("fox", tok.byte_ids(script))
        with httpx.stream("POST", server.url + "/v1/chat/completions",
                          json=_chat(server, "fox please", stream=True), timeout=30) as r:
            seen = 0
            for line in r.iter_lines():
                if line.startswith("data: ") and '"content"' in line:
                    seen += 1
                    if seen == 5:
                        break
        snap = server.wait_idle()
        assert (snap["pages_used"], snap["running"], snap["slots_free"]) == (0, 0, 4)
        assert watch.max_outstanding == 2
        # The same prompt (and a longer one sharing it) get the whole script: the
        # pages published by the cancelled request hold only known tokens.
        first = _ask(server, "fox please", return_token_ids=True)
        assert _answer(first) == (script.decode(), "stop", len(script) + 1)
        assert first["reused_prompt_tokens"] > 0
        assert _answer(_ask(server, "fox please")) == (script.decode(), "stop", len(script) + 1)
        assert server.wait_idle()["pages_used"] == 0
        assert watch.violations == []


def test_many_disconnects_while_others_run_ahead(tok):
    rng = random.Random(7)
    scripts = {f"job{i}": _letters(rng, 40) for i in range(8)}
    with ScriptedServer(tok, step_delay_s=0.003) as server:
        watch = Watch(server)
        for k, v in scripts.items():
            server.book.add(k, tok.byte_ids(v))
        got: dict[str, str] = {}

        def full(name: str) -> None:
            got[name] = _ask(server, name)["choices"][0]["message"]["content"]

        def drop(name: str, after: int) -> None:
            with httpx.stream("POST", server.url + "/v1/chat/completions",
                              json=_chat(server, name, stream=True), timeout=30) as r:
                n = 0
                for line in r.iter_lines():
                    if line.startswith("data: ") and '"content"' in line:
                        n += 1
                        if n == after:
                            return

        threads = [threading.Thread(target=full if i % 2 else drop,
                                    args=(f"job{i}",) if i % 2 else (f"job{i}", 1 + i))
                   for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for i in range(1, 8, 2):
            assert got[f"job{i}"] == scripts[f"job{i}"].decode()
        snap = server.wait_idle()
        assert (snap["pages_used"], snap["slots_free"]) == (0, 4)
        # every dropped prompt, asked again, gets its whole script
        for i in range(0, 8, 2):
            assert _answer(_ask(server, f"job{i}")) == (
                scripts[f"job{i}"].decode(), "stop", 41)
        assert watch.violations == [] and watch.max_outstanding == 2


def _run_mix(tok, frames: int, device_pending: bool, seed: int, geometry=None,
             max_active: int = 4, stops: bool = True, step_delay_s: float = 0.001):
    rng = random.Random(seed)
    jobs = []
    for i in range(14):
        script = _letters(rng, rng.randint(0, 24))
        max_tokens = rng.randint(1, 26)
        extra: dict = {"max_tokens": max_tokens}
        if not stops:
            pass  # no request needs feedback: decode always runs ahead
        elif i % 5 == 3:
            extra["stop"] = [script[5:7].decode()] if len(script) > 8 else ["zz"]
        elif i % 7 == 6:
            extra["stop_token_ids"] = [tok.byte_ids(b"q")[0]]
        jobs.append((f"mix{i:02d} {'x' * rng.randint(0, 12)}", script, extra))
    out: dict[str, tuple] = {}
    with ScriptedServer(tok, frames=frames, device_pending=device_pending,
                        step_delay_s=step_delay_s, geometry=geometry, max_active=max_active,
                        queue_capacity=16) as server:
        watch = Watch(server)
        for name, script, _ in jobs:
            server.book.add(name.split()[0], tok.byte_ids(script))

        def ask(name: str, extra: dict) -> None:
            out[name] = _answer(_ask(server, name, **extra))

        threads = [threading.Thread(target=ask, args=(name, extra)) for name, _, extra in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        snap = server.wait_idle()
        assert snap["pages_used"] == 0
        assert watch.violations == []
        preempted = server.server.worker.scheduler.stats().preemptions
    return jobs, out, watch.max_outstanding, preempted


def _expected(tok, script: bytes, extra: dict) -> tuple[str, str, int]:
    limit = extra["max_tokens"]
    text = script.decode()
    ids = list(script)  # one token per letter
    stops = extra.get("stop") or []
    stop_ids = extra.get("stop_token_ids") or []
    for n in range(1, limit + 1):
        if n > len(ids):  # EOS sampled
            return text, "stop", n
        prefix = text[:n]
        for s in stops:
            if s in prefix:
                return prefix[: prefix.index(s)], "stop", n
        if stop_ids and tok.byte_ids(prefix[-1].encode())[0] in stop_ids:
            return prefix[:-1], "stop", n
    return text[:limit], "length", limit


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_two_frames_equal_one_frame_and_the_scripts(tok, seed):
    # With stop requests in the mix, whether two frames are ever out at once depends on
    # thread timing (a live stop request keeps one round outstanding); without them it
    # is certain.
    jobs, two, _, _ = _run_mix(tok, 2, True, seed)
    _, one, single, _ = _run_mix(tok, 1, False, seed)
    assert single == 1
    assert two == one
    for name, script, extra in jobs:
        assert two[name] == _expected(tok, script, extra), name
    jobs, ahead, outstanding, _ = _run_mix(tok, 2, True, seed, stops=False)
    assert outstanding == 2
    for name, script, extra in jobs:
        assert ahead[name] == _expected(tok, script, extra), name


def test_page_pressure_with_frames_outstanding(tok):
    # 16 pages of 4 tokens; prompts of ~30 tokens + up to 26 outputs (at most 14 pages),
    # 4 at once: any two long requests overflow the cache. Slow steps (20 ms) let all 14
    # requests queue before the first few finish, so preemption does not hinge on timing.
    jobs, two, outstanding, preempted = _run_mix(tok, 2, True, 11, geometry={"num_pages": 16},
                                                 stops=False, step_delay_s=0.02)
    assert preempted > 0 and outstanding == 2
    for name, script, extra in jobs:
        assert two[name] == _expected(tok, script, extra), name


def test_feedback_requests_arriving_while_two_frames_are_out(tok):
    long = b"x" * 120
    with ScriptedServer(tok, step_delay_s=0.004) as server:
        watch = Watch(server)
        server.book.add("plain", tok.byte_ids(long))
        server.book.add("stopper", tok.byte_ids(b"hello world, stop here please"))
        server.book.add("json please", tok.byte_ids(b'{"a": 1}'))
        got: dict[str, tuple] = {}

        def ask(key: str, prompt: str, **extra) -> None:
            got[key] = _answer(_ask(server, prompt, **extra))

        plain = threading.Thread(target=ask, args=("plain", "plain"), kwargs={"max_tokens": 150})
        plain.start()
        # wait until the plain request runs ahead
        deadline = time.monotonic() + 10
        while watch.max_outstanding < 2 and time.monotonic() < deadline:
            time.sleep(0.002)
        assert watch.max_outstanding == 2
        others = [
            threading.Thread(target=ask, args=("stop", "stopper"), kwargs={"stop": [" here"]}),
            threading.Thread(target=ask, args=("tok", "stopper"),
                             kwargs={"stop_token_ids": [tok.byte_ids(b",")[0]]}),
            threading.Thread(target=ask, args=("json", "json please"),
                             kwargs={"response_format": {"type": "json_object"}}),
        ]
        for t in others:
            t.start()
        for t in [plain, *others]:
            t.join(60)
        assert got == {
            "plain": (long.decode(), "stop", 121),
            "stop": ("hello world, stop", "stop", 22),
            "tok": ("hello world", "stop", 12),
            "json": ('{"a": 1}', "stop", 9),
        }
        assert server.wait_idle()["pages_used"] == 0
        assert watch.violations == []


def test_fault_in_the_first_frame_fails_only_its_requests(tok):
    with ScriptedServer(tok) as server:
        watch = Watch(server)
        server.book.add("alpha", tok.byte_ids(b"abcdefghijklmnop"))
        server.book.add("omega", tok.byte_ids(b"zyxwvutsrqponmlk"))
        model = server.model
        # fail the decode that feeds the token after "e" (another frame is in flight)
        e_id = tok.byte_ids(b"e")[0]
        fired = []

        def fault(plan):
            if not fired and plan.kind is StepKind.DECODE and len(plan.rows) == 1:
                seq = model.sequence(plan.rows[0].page_ids, plan.rows[0].start_position)
                if seq and seq[-1] == e_id:
                    fired.append(plan)
                    return True
            return False

        model.fail_when(fault)
        r = httpx.post(server.url + "/v1/chat/completions", json=_chat(server, "alpha"),
                       timeout=30)
        assert r.status_code == 500
        assert len(fired) == 1
        assert server.wait_idle()["pages_used"] == 0
        model.clear_faults()
        assert _answer(_ask(server, "alpha")) == ("abcdefghijklmnop", "stop", 17)
        assert _answer(_ask(server, "omega")) == ("zyxwvutsrqponmlk", "stop", 17)
        assert watch.violations == []


def test_stream_content_equals_json_content_when_running_ahead(tok):
    with ScriptedServer(tok) as server:
        server.book.add("story", tok.byte_ids(b"once upon a time"))
        with httpx.stream("POST", server.url + "/v1/chat/completions",
                          json=_chat(server, "story", stream=True, max_tokens=9),
                          timeout=30) as r:
            events = [json.loads(line[6:]) if line[6:] != "[DONE]" else "[DONE]"
                      for line in r.iter_lines() if line.startswith("data: ")]
        assert content_of(events) == "once upon"
        assert events[-1] == "[DONE]"
        assert [e["choices"][0]["finish_reason"] for e in events[:-1]
                if e["choices"] and e["choices"][0]["finish_reason"]] == ["length"]


def test_a_slot_draining_an_ahead_row_counts_as_free_for_the_admission_queue(tok):
    """max_active 1, queue_capacity 1: A finishes by EOS while its ahead row is in
    flight (its slot is released when that frame completes), B waits for the slot. A's
    HTTP permit is back, so C is admitted by HTTP and must be queued, not rejected
    with 503: with one frame A's slot would already be free, and A's slot is only
    draining. The worker is held right after A finished until C reaches its ingress."""
    with ScriptedServer(tok, max_active=1, queue_capacity=1, step_delay_s=0.005) as server:
        worker = server.server.worker
        sched = worker.scheduler
        held = []
        publish = worker._publish_gauges

        def hold_while_draining() -> None:
            s = sched.stats()
            if (not held and s.running == 0 and s.slots_free == 0 and s.waiting == 1
                    and sched.outstanding_frames == 1):
                held.append(s)  # A retiring with its ahead frame in flight, B queued
                deadline = time.monotonic() + 10
                while not worker._ingress and time.monotonic() < deadline:
                    time.sleep(0.002)
            publish()

        worker._publish_gauges = hold_while_draining
        server.script("long", ["Hello", ",", " world", "!"] * 10)
        results: dict[str, httpx.Response] = {}

        def post(name: str) -> threading.Thread:
            t = threading.Thread(target=lambda: results.__setitem__(
                name, httpx.post(server.url + "/v1/chat/completions",
                                 json=_chat(server, name), timeout=30)))
            t.start()
            return t

        a = post("long a")
        deadline = time.monotonic() + 10
        while len(worker._live) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.002)
        b = post("b")
        while sched.stats().waiting < 1:
            assert time.monotonic() < deadline
            time.sleep(0.002)
        a.join(30)
        assert held, "A did not finish with its ahead row in flight"
        c = post("c")
        for t in (b, c):
            t.join(30)
        assert results["long a"].json()["choices"][0]["message"]["content"] == (
            "Hello, world!" * 10)
        for name in "bc":
            assert results[name].status_code == 200, (name, results[name].text)
            assert results[name].json()["choices"][0]["message"]["content"] == "Hello, world!"
        assert server.wait_idle()["pages_used"] == 0
