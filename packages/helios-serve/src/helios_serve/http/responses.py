"""OpenAI response shapes: chat.completion(.chunk) and text_completion objects.

Pure functions over plain data. Observation fields follow the specification, "Token and
timing observation": prompt_token_ids (top level; the first SSE chunk), choices[i]
.token_ids and .token_timestamps_ns, reused_prompt_tokens on observed terminal
responses, and the performance object on timed ones. Every choice and chunk carries its
`index`; with n > 1 usage sums the choices' completion tokens and counts each prompt
once. Log probabilities use OpenAI's shapes: chat `{"content": [{token, logprob, bytes,
top_logprobs}]}`, legacy `{tokens, token_logprobs, top_logprobs, text_offset}`.

Prompt log probabilities (scored prefill, `events.PromptScores`): legacy completions with
`echo` and `logprobs` put the prompt's tokens first in `logprobs` (the first token's
logprob and alternatives null, as OpenAI and vLLM send them); chat's `prompt_logprobs`
(vLLM's extension) is a top-level list, null for the first token, then per token a map
from token id to `{logprob, rank, decoded_token}` holding the prompt token and the
requested alternatives.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any

from helios_serve.engine.plan import TokenLogprob
from helios_serve.events import Finished, Output
from helios_serve.frontend.deltas import (
    ContentDelta,
    Delta,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallStart,
    accumulate,
)
from helios_serve.frontend.vocab import TokenPieces
from helios_serve.http.errors import ApiError

DONE = b"data: [DONE]\n\n"


@dataclass
class ChoiceRecord:
    """What one choice produced (accumulated from its events)."""

    deltas: list[Delta] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    token_timestamps_ns: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # prompt's 1st choice
    completion_tokens: int = 0
    finished: Finished | None = None


@dataclass
class ResponseContext:
    """Per-response constants.

    Attributes:
        prompts: each prompt's token ids, in prompt order.
        first_choice: index of each prompt's first choice.
        prompt_logprobs: chat: report the prompt's log probabilities (vLLM's
            prompt_logprobs); legacy completions report them with `echo` and `logprobs`.
        echo_only: legacy completions with max_tokens 0: the echoed prompt only (the one
            token generated is left out of the text, logprobs and usage).
    """

    id: str
    created: int
    model: str
    prompts: tuple[tuple[int, ...], ...]
    first_choice: tuple[int, ...]
    choices: int
    observe_ids: bool = False
    observe_timestamps: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    logprobs: bool = False
    echo: bool = False
    prompt_texts: tuple[str, ...] = ()
    prompt_logprobs: bool = False
    echo_only: bool = False
    ingress_ns: int = 0
    enqueue_ns: int = 0


_SLOT = "\x00delta\x00"  # stands for the delta object while an envelope is encoded


# json.dumps(value, separators=(",", ":"), ensure_ascii=False), without building a new
# encoder per call (json.dumps does for any non-default argument).
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _json(value: Any) -> bytes:
    return _ENCODE(value).encode()


def _delta_json(delta: Delta) -> bytes:
    """`_json(delta_dict(delta))`: the text deltas (one per streamed token) spelled out
    with the JSON string encoder json.dumps uses (ensure_ascii=False), the others through
    `delta_dict`."""
    kind = type(delta)
    if kind is ContentDelta:
        return b'{"content":' + encode_basestring(delta.text).encode() + b"}"  # type: ignore[union-attr]
    if kind is ReasoningDelta:
        return (b'{"reasoning_content":' + encode_basestring(delta.text).encode()  # type: ignore[union-attr]
                + b"}")  # fmt: skip
    return _json(delta_dict(delta))


def event(body: dict[str, Any]) -> bytes:
    """One SSE `data:` event."""
    return b"data: " + _json(body) + b"\n\n"


def usage(ctx: ResponseContext, records: Sequence[ChoiceRecord]) -> dict[str, Any]:
    """Usage over every choice: prompts counted once, completion tokens summed."""
    prompt = sum(len(p) for p in ctx.prompts)
    completion = 0 if ctx.echo_only else sum(
        r.finished.completion_tokens if r.finished else r.completion_tokens for r in records
    )
    cached = sum(
        records[i].finished.reused_prompt_tokens  # type: ignore[union-attr]
        for i in ctx.first_choice
        if records[i].finished is not None
    )
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _reused(records: Sequence[ChoiceRecord]) -> int:
    first = records[0].finished
    return first.reused_prompt_tokens if first is not None else 0


def _observed_terminal(ctx: ResponseContext, records: Sequence[ChoiceRecord],
                       body: dict[str, Any]) -> None:  # fmt: skip
    if ctx.observe_ids:
        body["reused_prompt_tokens"] = _reused(records)
    if ctx.observe_timestamps:
        body["performance"] = {
            "ingress_ns": ctx.ingress_ns,
            "enqueue_ns": ctx.enqueue_ns,
            "reused_prompt_tokens": _reused(records),
        }


class ChatShapes:
    """chat.completion and chat.completion.chunk bodies of one response."""

    def __init__(self, ctx: ResponseContext, pieces: TokenPieces) -> None:
        self.ctx = ctx
        self.pieces = pieces
        self._envelopes: dict[int, tuple[bytes, bytes]] = {}  # choice -> (head, tail)

    # -- log probabilities ----------------------------------------------------------

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        raw = self.pieces.bytes_of(token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob,
                "bytes": list(raw)}  # fmt: skip

    def logprobs(self, items: Sequence[TokenLogprob]) -> dict[str, Any] | None:
        if not self.ctx.logprobs:
            return None
        content = []
        for lp in items:
            entry = self._entry(lp.token_id, lp.logprob)
            entry["top_logprobs"] = [self._entry(t, v) for t, v in lp.top]
            content.append(entry)
        return {"content": content, "refusal": None}

    # -- JSON -------------------------------------------------------------------------

    def completion(self, records: Sequence[ChoiceRecord]) -> dict[str, Any]:
        """The non-streaming chat.completion object."""
        ctx = self.ctx
        choices = []
        for index, record in enumerate(records):
            assert record.finished is not None
            result = accumulate(record.deltas, record.finished.reason.value)
            calls = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in result.tool_calls
            ]  # fmt: skip
            message: dict[str, Any] = {
                "role": "assistant",
                "content": result.content if result.content is not None
                else (None if calls else ""),
            }  # fmt: skip
            if result.reasoning_content is not None:
                message["reasoning_content"] = result.reasoning_content
            if calls:
                message["tool_calls"] = calls
            choice: dict[str, Any] = {
                "index": index,
                "message": message,
                "logprobs": self.logprobs(record.logprobs),
                "finish_reason": record.finished.reason.value,
            }
            if ctx.observe_ids:
                choice["token_ids"] = list(record.token_ids)
            if ctx.observe_timestamps:
                choice["token_timestamps_ns"] = list(record.token_timestamps_ns)
            choices.append(choice)
        body: dict[str, Any] = {
            "id": ctx.id,
            "object": "chat.completion",
            "created": ctx.created,
            "model": ctx.model,
            "choices": choices,
            "usage": usage(ctx, records),
        }
        if ctx.prompt_logprobs:
            body["prompt_logprobs"] = self.prompt_logprobs(records[0].prompt_logprobs)
        if ctx.observe_ids:
            body["prompt_token_ids"] = list(ctx.prompts[0])
        _observed_terminal(ctx, records, body)
        return body

    def prompt_logprobs(self, scores: Sequence[TokenLogprob]) -> list[dict[str, Any] | None]:
        """vLLM's prompt_logprobs: null for the first prompt token, then per token a map
        from token id (a string, as JSON keys are) to `{logprob, rank, decoded_token}` for
        the prompt token and its alternatives. `rank` is 1-based among the vocabulary;
        the prompt token's is known when it is one of the alternatives, else null (the
        record holds the top alternatives, not the token's rank)."""
        out: list[dict[str, Any] | None] = [None]
        for lp in scores:
            entry: dict[str, Any] = {}
            ranks = {t: i + 1 for i, (t, _) in enumerate(lp.top)}
            entry[str(lp.token_id)] = {"logprob": lp.logprob, "rank": ranks.get(lp.token_id),
                                       "decoded_token": self.pieces.text_of(lp.token_id)}
            for t, v in lp.top:
                entry.setdefault(str(t), {"logprob": v, "rank": ranks[t],
                                          "decoded_token": self.pieces.text_of(t)})
            out.append(entry)
        return out

    # -- SSE --------------------------------------------------------------------------

    def _chunk(self, choices: list[dict[str, Any]], records: Sequence[ChoiceRecord] | None = None
               ) -> dict[str, Any]:  # fmt: skip
        body: dict[str, Any] = {
            "id": self.ctx.id,
            "object": "chat.completion.chunk",
            "created": self.ctx.created,
            "model": self.ctx.model,
            "choices": choices,
        }
        if self.ctx.include_usage:
            body["usage"] = (
                usage(self.ctx, records)
                if self.ctx.continuous_usage and records is not None
                else None
            )
        return body

    @staticmethod
    def _choice(index: int, delta: dict[str, Any], finish_reason: str | None = None,
                logprobs: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        return {"index": index, "delta": delta, "logprobs": logprobs,
                "finish_reason": finish_reason}  # fmt: skip

    def first(self) -> bytes:
        """The first SSE chunk of every choice: the assistant role (prompt ids when
        observed, on the first)."""
        out = []
        for index in range(self.ctx.choices):
            body = self._chunk([self._choice(index, {"role": "assistant", "content": ""})])
            if self.ctx.observe_ids and index == 0:
                body["prompt_token_ids"] = list(self.ctx.prompts[0])
            out.append(event(body))
        return b"".join(out)

    def observation(self, index: int, token_id: int, timestamp_ns: int | None) -> bytes:
        """One metadata-only chunk per generated id: delta {} and token_ids."""
        choice = self._choice(index, {})
        choice["token_ids"] = [token_id]
        if timestamp_ns is not None:
            choice["token_timestamps_ns"] = [timestamp_ns]
        return event(self._chunk([choice]))

    def output(self, out: Output, records: Sequence[ChoiceRecord]) -> bytes:
        """The chunks of one Output event: one per delta; its logprobs on the first
        (or on a delta-less chunk when every delta is still held)."""
        if not out.logprobs and not self.ctx.continuous_usage:
            head, tail = self._envelope(out.choice)
            if not out.deltas:
                return head + b"{}" + tail
            return b"".join(head + _delta_json(delta) + tail for delta in out.deltas)
        deltas = [delta_dict(d) for d in out.deltas] or [{}]
        logprobs = self.logprobs(out.logprobs) if out.logprobs else None
        chunks = []
        for i, delta in enumerate(deltas):
            choice = self._choice(out.choice, delta, logprobs=logprobs if i == 0 else None)
            chunks.append(event(self._chunk([choice], records)))
        return b"".join(chunks)

    def _envelope(self, index: int) -> tuple[bytes, bytes]:
        """The bytes around the delta object of choice `index`'s plain delta chunks
        (no logprobs, no running usage): every such chunk of a response shares them, so
        they are encoded once and only the delta is encoded per chunk (the streaming
        path runs this once per token). Same bytes as `event(self._chunk(...))`."""
        envelope = self._envelopes.get(index)
        if envelope is None:
            encoded = event(self._chunk([self._choice(index, _SLOT)]))  # type: ignore[arg-type]
            head, _, tail = encoded.partition(_json(_SLOT))
            envelope = self._envelopes[index] = (head, tail)
        return envelope

    def finish(self, finished: Finished, records: Sequence[ChoiceRecord]) -> bytes:
        """A choice's finish chunk; with observation and no include_usage the last one
        carries the usage."""
        body = self._chunk([self._choice(finished.choice, {}, finished.reason.value)], records)
        last = all(r.finished is not None for r in records)
        if last and not self.ctx.include_usage and self.ctx.observe_ids:
            body["usage"] = usage(self.ctx, records)
            _observed_terminal(self.ctx, records, body)
        return event(body)

    def end(self, records: Sequence[ChoiceRecord]) -> bytes:
        """After every choice finished: the usage-only chunk (include_usage) and [DONE]."""
        out = []
        if self.ctx.include_usage:
            last = self._chunk([])
            last["usage"] = usage(self.ctx, records)
            _observed_terminal(self.ctx, records, last)
            out.append(event(last))
        out.append(DONE)
        return b"".join(out)

    def error(self, error: ApiError) -> bytes:
        """The terminal error event (after SSE headers; no [DONE] follows)."""
        return error_event(error.body())


class CompletionShapes:
    """text_completion bodies (legacy completions), JSON and SSE.

    With `echo`, a choice's text starts with its prompt; with `echo` and `logprobs` the
    prompt's tokens open its logprobs too (from the prompt's scored prefill), so a stream
    sends the echo chunk with the choice's first output or its finish, once the prompt's
    scores are in (they precede the prompt's first token).
    """

    def __init__(self, ctx: ResponseContext, pieces: TokenPieces) -> None:
        self.ctx = ctx
        self.pieces = pieces
        self._offsets = [0] * ctx.choices  # text offset of the next token, per choice
        self._echoed = [False] * ctx.choices  # stream: the choice's echo chunk was sent

    def _prompt_of(self, index: int) -> int:
        prompt = 0
        for p, first in enumerate(self.ctx.first_choice):
            if index >= first:
                prompt = p
        return prompt

    @property
    def _scored_echo(self) -> bool:
        return self.ctx.echo and self.ctx.logprobs

    def logprobs(self, index: int, items: Sequence[TokenLogprob]) -> dict[str, Any] | None:
        if not self.ctx.logprobs:
            return None
        tokens, values, tops, offsets = [], [], [], []
        for lp in items:
            text = self.pieces.text_of(lp.token_id)
            tokens.append(text)
            values.append(lp.logprob)
            tops.append({self.pieces.text_of(t): v for t, v in lp.top})
            offsets.append(self._offsets[index])
            self._offsets[index] += len(text)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                "text_offset": offsets}  # fmt: skip

    def prompt_logprobs(self, index: int, records: Sequence[ChoiceRecord]) -> dict[str, Any]:
        """The echoed prompt's logprobs: every prompt token, the first with null logprob
        and alternatives (nothing precedes it), offsets from 0 in the echoed text."""
        p = self._prompt_of(index)
        ids = self.ctx.prompts[p]
        scores = records[self.ctx.first_choice[p]].prompt_logprobs
        tokens = [self.pieces.text_of(t) for t in ids]
        offsets, at = [], 0
        for text in tokens:
            offsets.append(at)
            at += len(text)
        values: list[float | None] = [None, *(lp.logprob for lp in scores)]
        tops: list[dict[str, float] | None] = [
            None, *({self.pieces.text_of(t): v for t, v in lp.top} for lp in scores)]
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                "text_offset": offsets}  # fmt: skip

    def _echo(self, index: int) -> str:
        return self.ctx.prompt_texts[self._prompt_of(index)] if self.ctx.echo else ""

    def completion(self, records: Sequence[ChoiceRecord]) -> dict[str, Any]:
        choices = []
        for index, record in enumerate(records):
            assert record.finished is not None
            if self.ctx.echo:
                self._offsets[index] = len(self._echo(index))
            text = "".join(d.text for d in record.deltas if isinstance(d, ContentDelta))
            logprobs = self.logprobs(index, record.logprobs)
            if self._scored_echo:
                logprobs = _joined(self.prompt_logprobs(index, records),
                                   None if self.ctx.echo_only else logprobs)
            choices.append({
                "index": index,
                "text": self._echo(index) + ("" if self.ctx.echo_only else text),
                "logprobs": logprobs,
                "finish_reason": record.finished.reason.value,
            })  # fmt: skip
        return {
            "id": self.ctx.id,
            "object": "text_completion",
            "created": self.ctx.created,
            "model": self.ctx.model,
            "choices": choices,
            "usage": usage(self.ctx, records),
        }

    def _chunk(self, index: int, text: str, finish_reason: str | None,
               logprobs: dict[str, Any] | None, records: Sequence[ChoiceRecord] | None
               ) -> bytes:  # fmt: skip
        body: dict[str, Any] = {
            "id": self.ctx.id,
            "object": "text_completion",
            "created": self.ctx.created,
            "model": self.ctx.model,
            "choices": [{"index": index, "text": text, "logprobs": logprobs,
                         "finish_reason": finish_reason}],
        }  # fmt: skip
        if self.ctx.include_usage:
            body["usage"] = (usage(self.ctx, records)
                             if self.ctx.continuous_usage and records is not None else None)
        return event(body)

    def first(self) -> bytes:
        if not self.ctx.echo or self._scored_echo:  # a scored echo waits for its scores
            return b""
        out = []
        for index in range(self.ctx.choices):
            out.append(self._echo_chunk(index, None))
        return b"".join(out)

    def _echo_chunk(self, index: int, records: Sequence[ChoiceRecord] | None) -> bytes:
        self._echoed[index] = True
        self._offsets[index] = len(self._echo(index))
        logprobs = self.prompt_logprobs(index, records) if records is not None else None
        return self._chunk(index, self._echo(index), None, logprobs, None)

    def _pending_echo(self, index: int, records: Sequence[ChoiceRecord]) -> bytes:
        if self._scored_echo and not self._echoed[index]:
            return self._echo_chunk(index, records)
        return b""

    def observation(self, index: int, token_id: int, timestamp_ns: int | None) -> bytes:
        return b""  # legacy completions have no observation fields

    def output(self, out: Output, records: Sequence[ChoiceRecord]) -> bytes:
        echo = self._pending_echo(out.choice, records)
        if self.ctx.echo_only:
            return echo
        text = "".join(d.text for d in out.deltas if isinstance(d, ContentDelta))
        logprobs = self.logprobs(out.choice, out.logprobs) if out.logprobs else None
        return echo + self._chunk(out.choice, text, None, logprobs, records)

    def finish(self, finished: Finished, records: Sequence[ChoiceRecord]) -> bytes:
        return (self._pending_echo(finished.choice, records)
                + self._chunk(finished.choice, "", finished.reason.value, None, records))

    def end(self, records: Sequence[ChoiceRecord]) -> bytes:
        out = []
        if self.ctx.include_usage:
            body = {"id": self.ctx.id, "object": "text_completion", "created": self.ctx.created,
                    "model": self.ctx.model, "choices": [], "usage": usage(self.ctx, records)}
            out.append(event(body))
        out.append(DONE)
        return b"".join(out)

    def error(self, error: ApiError) -> bytes:
        """The terminal error event (after SSE headers; no [DONE] follows)."""
        return error_event(error.body())


def _joined(prompt: dict[str, Any], generated: dict[str, Any] | None) -> dict[str, Any]:
    """Legacy logprobs of the echoed prompt followed by those of the generated tokens."""
    if generated is None:
        return prompt
    return {key: prompt[key] + generated[key] for key in prompt}


Shapes = ChatShapes | CompletionShapes


def delta_dict(delta: Delta) -> dict[str, Any]:
    """A frontend presentation delta as an OpenAI chunk delta."""
    if isinstance(delta, ContentDelta):
        return {"content": delta.text}
    if isinstance(delta, ReasoningDelta):
        return {"reasoning_content": delta.text}
    if isinstance(delta, ToolCallStart):
        return {
            "tool_calls": [
                {
                    "index": delta.index,
                    "id": delta.id,
                    "type": "function",
                    "function": {"name": delta.name, "arguments": ""},
                }
            ]
        }
    if isinstance(delta, ToolCallArguments):
        return {"tool_calls": [{"index": delta.index, "function": {"arguments": delta.text}}]}
    raise TypeError(f"not a presentation delta: {delta!r}")


def error_event(body: dict[str, Any]) -> bytes:
    """One terminal SSE error event (no [DONE] follows)."""
    return event(body)
