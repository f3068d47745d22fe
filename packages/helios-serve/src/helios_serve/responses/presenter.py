"""The worker's events -> OpenAI Responses stream events and the response object.

One `ResponseBuilder` per response. The streamed events and the non-streamed body come
from the same builder: a non-streaming request feeds every event and
returns `response()`, which is the `response` of the terminal stream event.

Event order (every event carries `sequence_number`, 0, 1, 2, ...):

    response.created, response.in_progress
    per output item, in the order the output pipeline produced them:
      response.output_item.added
      message:       content_part.added, output_text.delta*, output_text.done,
                     content_part.done
      reasoning:     content_part.added, reasoning_text.delta*, reasoning_text.done,
                     content_part.done
      function_call: function_call_arguments.delta*, function_call_arguments.done
      response.output_item.done
    response.completed | response.incomplete (output limit) | response.failed

An item opens at the first delta of its kind and closes when a delta of another item
arrives or the response ends. Log probabilities of a step's tokens go to that step's
first output_text delta (held text: the next one); a step that produced no output text
reports none (OpenAI reports log probabilities of output text only).
"""

from __future__ import annotations

import copy
import time
from typing import Any

from helios_serve.engine.plan import TokenLogprob
from helios_serve.events import Finished, Output, TokenObserved
from helios_serve.frontend.deltas import (
    ContentDelta,
    Delta,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallStart,
)
from helios_serve.frontend.vocab import TokenPieces
from helios_serve.responses.schema import new_id
from helios_serve.scheduler.request import FinishReason

StreamEvent = dict[str, Any]


class ResponseBuilder:
    """Builds one response's stream events and final object.

    Args:
        skeleton: the response object's request-derived fields (id, created_at, model,
            instructions, tools, tool_choice, ...); status, output, usage and the
            terminal fields are filled here.
        pieces: token texts and bytes (log probabilities), or None when not requested.
    """

    def __init__(self, skeleton: dict[str, Any], pieces: TokenPieces | None) -> None:
        self._response = {**skeleton, "status": "in_progress", "output": [], "usage": None,
                          "error": None, "incomplete_details": None, "completed_at": None}
        self._pieces = pieces
        self._sequence = 0
        self._open: dict[str, Any] | None = None  # the item receiving deltas
        self._call_index = -1  # the open function call's index in the pipeline's count
        self._held: list[dict[str, Any]] = []  # logprobs awaiting an output_text delta
        self.output_ids: list[int] = []  # generated ids (observed), EOS included
        self.finished: Finished | None = None

    # -- events ---------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> StreamEvent:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _snapshot(self) -> dict[str, Any]:
        return copy.deepcopy(self._response)

    def start(self) -> list[StreamEvent]:
        """The first two events."""
        return [self._event("response.created", response=self._snapshot()),
                self._event("response.in_progress", response=self._snapshot())]  # fmt: skip

    def feed(self, event: Output | TokenObserved | Finished) -> list[StreamEvent]:
        """The stream events of one worker event of the response's only choice."""
        if isinstance(event, TokenObserved):
            self.output_ids.append(event.token_id)
            return []
        if isinstance(event, Finished):
            return self._finish(event)
        out: list[StreamEvent] = []
        if event.logprobs and self._pieces is not None:
            self._held.extend(self._logprob(lp) for lp in event.logprobs)
        for delta in event.deltas:
            out.extend(self._delta(delta))
        return out

    def fail(self, code: str, message: str) -> StreamEvent:
        """The terminal event of a response whose generation was rejected or failed."""
        self._response.update(status="failed", error={"code": code, "message": message})
        return self._event("response.failed", response=self._snapshot())

    def response(self) -> dict[str, Any]:
        """The response object (complete once the terminal event was produced)."""
        return self._snapshot()

    # -- items ----------------------------------------------------------------------

    @property
    def _index(self) -> int:
        return len(self._response["output"]) - 1

    def _logprob(self, lp: TokenLogprob) -> dict[str, Any]:
        assert self._pieces is not None

        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            raw = self._pieces.bytes_of(token_id)  # type: ignore[union-attr]
            return {"token": raw.decode("utf-8", errors="replace"), "bytes": list(raw),
                    "logprob": logprob}  # fmt: skip

        return {**entry(lp.token_id, lp.logprob),
                "top_logprobs": [entry(t, v) for t, v in lp.top]}  # fmt: skip

    def _add(self, item: dict[str, Any]) -> list[StreamEvent]:
        self._response["output"].append(item)
        self._open = item
        return [self._event("response.output_item.added", output_index=self._index,
                            item=copy.deepcopy(item))]  # fmt: skip

    def _part_added(self, part: dict[str, Any]) -> StreamEvent:
        assert self._open is not None
        return self._event("response.content_part.added", item_id=self._open["id"],
                           output_index=self._index, content_index=0,
                           part=copy.deepcopy(part))  # fmt: skip

    def _delta(self, delta: Delta) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        item = self._open
        if isinstance(delta, ContentDelta | ReasoningDelta):
            if not delta.text:
                return out
            kind = "message" if isinstance(delta, ContentDelta) else "reasoning"
            if item is None or item["type"] != kind:
                out.extend(self._close("completed"))
                if kind == "message":
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                    out.extend(self._add({"id": new_id("msg"), "type": "message",
                                          "role": "assistant", "status": "in_progress",
                                          "content": []}))  # fmt: skip
                else:
                    part = {"type": "reasoning_text", "text": ""}
                    out.extend(self._add({"id": new_id("rs"), "type": "reasoning",
                                          "summary": [], "content": [],
                                          "status": "in_progress"}))  # fmt: skip
                self._open["content"].append(part)  # type: ignore[index]
                out.append(self._part_added(part))
                item = self._open
            part = item["content"][0]  # type: ignore[index]
            part["text"] += delta.text
            if kind == "message":
                logprobs, self._held = self._held, []
                part["logprobs"].extend(logprobs)
                out.append(self._event("response.output_text.delta", item_id=item["id"],  # type: ignore[index]
                                       output_index=self._index, content_index=0,
                                       delta=delta.text, logprobs=logprobs))  # fmt: skip
            else:
                out.append(self._event("response.reasoning_text.delta", item_id=item["id"],  # type: ignore[index]
                                       output_index=self._index, content_index=0,
                                       delta=delta.text))  # fmt: skip
            return out
        self._held.clear()  # a tool call's tokens: no output text to report them on
        if isinstance(delta, ToolCallStart):
            out.extend(self._close("completed"))
            self._call_index = delta.index
            out.extend(self._add({"id": new_id("fc"), "type": "function_call",
                                  "call_id": delta.id, "name": delta.name, "arguments": "",
                                  "status": "in_progress"}))  # fmt: skip
            return out
        assert isinstance(delta, ToolCallArguments)
        if item is None or item["type"] != "function_call" or delta.index != self._call_index:
            raise AssertionError(f"arguments of tool call {delta.index} outside its item")
        if delta.text:
            item["arguments"] += delta.text
            out.append(self._event("response.function_call_arguments.delta",
                                   item_id=item["id"], output_index=self._index,
                                   delta=delta.text))  # fmt: skip
        return out

    def _close(self, status: str) -> list[StreamEvent]:
        """The done events of the open item, which gets `status`."""
        item = self._open
        if item is None:
            return []
        self._open = None
        out: list[StreamEvent] = []
        index = self._index
        common = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            part = item["content"][0]
            out.append(self._event("response.output_text.done", **common, content_index=0,
                                   text=part["text"], logprobs=part["logprobs"]))  # fmt: skip
            out.append(self._event("response.content_part.done", **common, content_index=0,
                                   part=copy.deepcopy(part)))  # fmt: skip
        elif item["type"] == "reasoning":
            part = item["content"][0]
            out.append(self._event("response.reasoning_text.done", **common, content_index=0,
                                   text=part["text"]))  # fmt: skip
            out.append(self._event("response.content_part.done", **common, content_index=0,
                                   part=copy.deepcopy(part)))  # fmt: skip
        else:
            out.append(self._event("response.function_call_arguments.done", **common,
                                   name=item["name"], arguments=item["arguments"]))  # fmt: skip
        item["status"] = status
        out.append(self._event("response.output_item.done", output_index=index,
                               item=copy.deepcopy(item)))  # fmt: skip
        return out

    def _finish(self, finished: Finished) -> list[StreamEvent]:
        self.finished = finished
        length = finished.reason is FinishReason.LENGTH
        out = self._close("incomplete" if length else "completed")
        self._response.update(
            status="incomplete" if length else "completed",
            incomplete_details={"reason": "max_output_tokens"} if length else None,
            completed_at=int(time.time()),
            usage={
                "input_tokens": finished.prompt_tokens,
                "input_tokens_details": {"cached_tokens": finished.reused_prompt_tokens,
                                         "cache_write_tokens": 0},
                "output_tokens": finished.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": finished.prompt_tokens + finished.completion_tokens,
            },
        )  # fmt: skip
        kind = "response.incomplete" if length else "response.completed"
        out.append(self._event(kind, response=self._snapshot()))
        return out
