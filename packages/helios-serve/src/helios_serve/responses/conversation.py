"""Canonical Responses items -> the chat path's `ChatInput` (messages, tools, format).

The conversation is the stored turns' items (a previous response's input items and its
output) followed by the new input; `instructions` become a leading system message and,
as in OpenAI's API, are not carried over from a previous response. Item to message:

    message               {"role", "content": its text parts joined}
    reasoning             the next assistant message's `reasoning_content`
    function_call         a tool call of the assistant message it follows (a new
                          assistant message when the previous message is not one)
    function_call_output  {"role": "tool", "tool_call_id", "content"}

Function tools become chat tools, a named tool_choice becomes chat's
{"type": "function", "function": {"name"}}, and text.format becomes `response_format`,
so the frontend prepares exactly what it prepares for /v1/chat/completions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from helios_serve.frontend.prepare import ChatInput, GenerationInput
from helios_serve.responses.schema import FunctionToolChoice, ResponsesRequest


def chat_messages(instructions: str | None, items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages of canonical items (module docstring)."""
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    reasoning: list[str] = []
    assistant_open = False  # the last message is an assistant message calls may join

    def assistant(content: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
            reasoning.clear()
        return message

    for item in items:
        kind = item["type"]
        if kind == "message":
            text = "".join(p.get("text", "") for p in item["content"])
            if item["role"] == "assistant":
                out.append(assistant(text))
                assistant_open = True
            elif any(p["type"] == "input_image" for p in item["content"]):
                out.append({"role": item["role"], "content": [_chat_part(p)
                                                              for p in item["content"]]})
                assistant_open = False
            else:
                out.append({"role": item["role"], "content": text})
                assistant_open = False
        elif kind == "reasoning":
            parts = item["content"] or item["summary"]
            reasoning.extend(p["text"] for p in parts)
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if not assistant_open:
                out.append(assistant(""))
                assistant_open = True
            out[-1].setdefault("tool_calls", []).append(call)
        else:  # function_call_output
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": item["output"]})  # fmt: skip
            assistant_open = False
    return out


def _chat_part(part: dict[str, Any]) -> dict[str, Any]:
    """A canonical content part as a chat content part (input_image -> image_url)."""
    if part["type"] == "input_image":
        return {"type": "image_url",
                "image_url": {"url": part["image_url"], "detail": part["detail"]}}
    return {"type": "text", "text": part["text"]}


def _response_format(r: ResponsesRequest) -> dict[str, Any] | None:
    fmt = r.text.format if r.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    spec: dict[str, Any] = {"name": fmt.name, "schema": fmt.schema_}
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    if fmt.description is not None:
        spec["description"] = fmt.description
    return {"type": "json_schema", "json_schema": spec}


def chat_tools(r: ResponsesRequest) -> tuple[dict[str, Any], ...] | None:
    if not r.tools:
        return None
    return tuple(
        {"type": "function",
         "function": t.model_dump(exclude_none=True, exclude={"type"})}
        for t in r.tools
    )  # fmt: skip


def chat_input(r: ResponsesRequest, items: Sequence[dict[str, Any]],
               prompt_prefix: tuple[int, ...], logprobs: int | None) -> ChatInput:  # fmt: skip
    """The frontend's input for a validated Responses request over `items` (the whole
    conversation). Every request observes its generated ids (`observe_ids`): they are
    what a stored response keeps, so the next turn continues from them exactly.

    Args:
        prompt_prefix: the previous response's prompt and output ids, or ().
        logprobs: None, or the alternatives to report beside each output text token.
    """
    choice: Any = r.tool_choice if r.tool_choice is not None else "auto"
    if isinstance(choice, FunctionToolChoice):
        choice = {"type": "function", "function": {"name": choice.name}}
    generation = GenerationInput(
        max_tokens=r.max_output_tokens,
        limit_field="max_output_tokens",
        temperature=r.temperature,
        top_p=r.top_p,
        seed=r.seed,
        logprobs=logprobs,
        top_field="top_logprobs",
        observe_ids=True,
    )
    return ChatInput(
        messages=tuple(chat_messages(r.instructions, items)),
        generation=generation,
        tools=chat_tools(r),
        tool_choice=choice,
        parallel_tool_calls=r.parallel_tool_calls is not False,
        response_format=_response_format(r),
        prompt_prefix=prompt_prefix,
    )
