"""Anthropic Messages requests (POST /v1/messages, /v1/messages/count_tokens): strict
pydantic models and their translation into the chat path's `ChatInput`.

The Messages API is served by the chat path: a Messages request becomes the chat request
it means (system text first; `tool_use` blocks become assistant `tool_calls`,
`tool_result` blocks `tool` messages; `stop_sequences` the string stops; `tool_choice`
auto / any / tool / none the chat's auto / required / named / none), and the frontend
prepares it as it prepares a chat request: one template, one set of parsers, stops and
admission rules. Fields the specification governs keep its rules (at most four stop
strings, no stop strings with a forced tool call, ...); a rejection names the Messages
field (`MESSAGES_FIELDS`).

`metadata` (Anthropic's `user_id`), `service_tier`, `cache_control` and
`output_config.effort` are parsed and not used, as the chat path's `user`. The SDK of
2026 sends temperature / top_p / top_k only through `extra_body`; they are accepted as
fields.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from helios_serve.frontend.prepare import ChatInput, GenerationInput
from helios_serve.http.errors import InvalidRequest
from helios_serve.http.schema import PositiveInt, TopK

_STRICT = ConfigDict(extra="forbid", strict=True)
_BLOCK = ConfigDict(extra="forbid", strict=True)


class CacheControl(BaseModel):
    """Anthropic's prompt-caching marker: accepted and not needed (the prefix cache
    reuses every published prompt prefix by itself)."""

    model_config = _STRICT
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(BaseModel):
    model_config = _BLOCK
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: None = None


class ImageSource(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: str


class ImageBlock(BaseModel):
    model_config = _BLOCK
    type: Literal["image"]
    source: ImageSource
    cache_control: CacheControl | None = None


class ToolUseBlock(BaseModel):
    model_config = _BLOCK
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(BaseModel):
    model_config = _BLOCK
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


class ThinkingBlock(BaseModel):
    model_config = _BLOCK
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(BaseModel):
    model_config = _BLOCK
    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock
    | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class MessageParam(BaseModel):
    model_config = _STRICT
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class ToolParam(BaseModel):
    """A client tool: `input_schema` is the JSON Schema of its input object."""

    model_config = _STRICT
    name: Annotated[str, Field(min_length=1, max_length=128)]
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None


class ToolChoiceAuto(BaseModel):
    model_config = _STRICT
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(BaseModel):
    model_config = _STRICT
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(BaseModel):
    model_config = _STRICT
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(BaseModel):
    model_config = _STRICT
    type: Literal["none"]


ToolChoice = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone,
    Field(discriminator="type"),
]


class Metadata(BaseModel):
    model_config = _STRICT
    user_id: str | None = None


class ThinkingEnabled(BaseModel):
    model_config = _STRICT
    type: Literal["enabled"]
    budget_tokens: PositiveInt


class ThinkingDisabled(BaseModel):
    model_config = _STRICT
    type: Literal["disabled"]


class ThinkingAdaptive(BaseModel):
    model_config = _STRICT
    type: Literal["adaptive"]


class JsonOutputFormat(BaseModel):
    model_config = _STRICT
    type: Literal["json_schema"]
    schema_: Annotated[dict[str, Any], Field(alias="schema")]


class OutputConfig(BaseModel):
    """Anthropic's output settings: `format` constrains the answer to a JSON schema (the
    chat path's `response_format` json_schema, through the same grammar); `effort` is
    accepted and changes nothing here."""

    model_config = _STRICT
    format: JsonOutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


class _Conversation(BaseModel):
    """What a Messages request and a count_tokens request share."""

    model_config = _STRICT
    model: str
    messages: Annotated[list[MessageParam], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Annotated[ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive,
                        Field(discriminator="type")] | None = None  # fmt: skip
    output_config: OutputConfig | None = None
    cache_control: CacheControl | None = None


class MessagesRequest(_Conversation):
    """POST /v1/messages body (Anthropic's Messages API)."""

    max_tokens: PositiveInt
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: TopK | None = None
    metadata: Metadata | None = None
    stream: bool | None = None
    service_tier: Literal["auto", "standard_only"] | None = None


class CountTokensRequest(_Conversation):
    """POST /v1/messages/count_tokens body."""


MESSAGES_REQUEST_MODELS = {
    "/v1/messages": MessagesRequest,
    "/v1/messages/count_tokens": CountTokensRequest,
}

# chat-path field -> the Messages field a rejection names
MESSAGES_FIELDS = {"stop": "stop_sequences", "max_completion_tokens": "max_tokens"}


def messages_field(param: str | None) -> str | None:
    """The Messages request's name for a chat-path field."""
    return MESSAGES_FIELDS.get(param, param) if param is not None else None


def _image_part(block: ImageBlock) -> dict[str, Any]:
    """An image block as a chat image part: a base64 source becomes a data: URL and a url
    source its URL (the chat path's image preparation decides what it accepts)."""
    source = block.source.model_dump()
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', '')};base64,{source.get('data', '')}"
    else:
        url = str(source.get("url") or f"{source.get('type')}-image")
    return {"type": "image_url", "image_url": {"url": url}}


def _text_of(blocks: str | list[TextBlock] | list[TextBlock | ImageBlock] | None,
             where: str) -> str | list[dict[str, Any]]:  # fmt: skip
    """A content string, or chat content parts (an image becomes an image part, which the
    frontend rejects where the model takes no images)."""
    if blocks is None:
        return ""
    if isinstance(blocks, str):
        return blocks
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        else:
            parts.append(_image_part(block))
    return parts


def _chat_messages(r: _Conversation) -> list[dict[str, Any]]:
    """The chat messages a Messages conversation means (`_chat_messages_from`)."""
    return _chat_messages_from(r)[0]


# Where a chat message came from: the Messages path of the message (or "system", or a
# tool_result block) and those of its content parts, in order.
Origin = tuple[str, tuple[str, ...]]


def _chat_messages_from(r: _Conversation) -> tuple[list[dict[str, Any]], list[Origin]]:
    """The chat messages a Messages conversation means, and the origin of each.

    A user turn's tool_result blocks become `tool` messages (in their order, before the
    turn's other content); an assistant turn's thinking becomes `reasoning_content`, its
    text `content` and its tool_use blocks `tool_calls` (arguments as a JSON string).

    Raises:
        InvalidRequest: a block where its role cannot carry it (named by its index).
    """
    out: list[dict[str, Any]] = []
    origins: list[Origin] = []
    if r.system is not None:
        system = r.system if isinstance(r.system, str) else "".join(b.text for b in r.system)
        out.append({"role": "system", "content": system})
        origins.append(("system", ()))
    for i, m in enumerate(r.messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            origins.append((f"messages[{i}]", ()))
            continue
        if m.role == "assistant":
            texts, thinking, calls = [], [], []
            for j, block in enumerate(m.content):
                where = f"messages[{i}].content[{j}]"
                if isinstance(block, TextBlock):
                    texts.append(block.text)
                elif isinstance(block, ThinkingBlock):
                    thinking.append(block.thinking)
                elif isinstance(block, RedactedThinkingBlock):
                    continue  # opaque to this server: nothing to render
                elif isinstance(block, ToolUseBlock):
                    calls.append({"id": block.id, "type": "function", "function": {
                        "name": block.name,
                        "arguments": json.dumps(block.input, ensure_ascii=False)}})
                else:
                    raise InvalidRequest(f"an assistant message cannot carry a {block.type} "
                                         "block", param=f"{where}.type")  # fmt: skip
            message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
            if thinking:
                message["reasoning_content"] = "".join(thinking)
            if calls:
                message["tool_calls"] = calls
            out.append(message)
            origins.append((f"messages[{i}]", ()))
            continue
        parts: list[dict[str, Any]] = []
        part_origins: list[str] = []
        for j, block in enumerate(m.content):
            where = f"messages[{i}].content[{j}]"
            if isinstance(block, ToolResultBlock):
                out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                            "content": _text_of(block.content, where)})  # fmt: skip
                origins.append((where, ()))
            elif isinstance(block, TextBlock):
                parts.append({"type": "text", "text": block.text})
                part_origins.append(where)
            elif isinstance(block, ImageBlock):
                parts.append(_image_part(block))
                part_origins.append(where)
            else:
                raise InvalidRequest(f"a user message cannot carry a {block.type} block",
                                     param=f"{where}.type")  # fmt: skip
        if parts or not any(isinstance(b, ToolResultBlock) for b in m.content):
            out.append({"role": "user", "content": parts})
            origins.append((f"messages[{i}]", tuple(part_origins)))
    return out, origins


_CHAT_PATH = re.compile(r"messages\[(\d+)\](?:\.content\[(\d+)\])?(.*)", re.DOTALL)


def messages_param(r: _Conversation, param: str | None) -> str | None:
    """The Messages request's name for a chat-path rejection's field: MESSAGES_FIELDS, and
    a chat message's path as the Messages block it came from (the system text is chat
    message 0; a user turn's tool_result blocks are chat messages of their own, so chat
    indexes differ from the request's)."""
    if param is None:
        return None
    match = _CHAT_PATH.fullmatch(param)
    if match is None:
        return messages_field(param)
    k, j, rest = int(match[1]), match[2], match[3]
    origins = _chat_messages_from(r)[1]
    if k >= len(origins):
        return param
    where, parts = origins[k]
    if where == "system":
        return "system"
    if j is not None:
        return parts[int(j)] + rest if int(j) < len(parts) else f"{where}.content[{j}]{rest}"
    return where + rest


def _tools(r: _Conversation) -> tuple[dict[str, Any], ...] | None:
    if not r.tools:
        return None
    return tuple(
        {"type": "function", "function": {
            "name": t.name, "parameters": t.input_schema,
            **({"description": t.description} if t.description is not None else {})}}
        for t in r.tools
    )  # fmt: skip


def _tool_choice(r: _Conversation) -> tuple[str | dict[str, Any], bool]:
    """(the chat tool_choice, parallel_tool_calls)."""
    choice = r.tool_choice
    if choice is None:
        return "auto", True
    parallel = not getattr(choice, "disable_parallel_tool_use", False)
    if isinstance(choice, ToolChoiceAuto):
        return "auto", parallel
    if isinstance(choice, ToolChoiceAny):
        return "required", parallel
    if isinstance(choice, ToolChoiceTool):
        return {"type": "function", "function": {"name": choice.name}}, parallel
    return "none", True


def _template_kwargs(r: _Conversation) -> dict[str, Any]:
    """`thinking` as the chat template's `enable_thinking` switch (what a reasoning
    template reads; a template without it ignores it)."""
    if r.thinking is None:
        return {}
    return {"enable_thinking": not isinstance(r.thinking, ThinkingDisabled)}


def conversation_input(r: _Conversation, generation: GenerationInput | None = None) -> ChatInput:
    """The chat path's input for a Messages conversation (count_tokens: no generation).

    Raises:
        InvalidRequest: a cross-field rule is violated (naming the Messages field).
    """
    if r.tool_choice is not None and not isinstance(r.tool_choice, ToolChoiceNone) \
            and not r.tools:
        raise InvalidRequest("tool_choice requires tools", param="tool_choice")
    choice, parallel = _tool_choice(r)
    fmt = r.output_config.format if r.output_config is not None else None
    return ChatInput(
        messages=tuple(_chat_messages(r)),
        generation=generation or GenerationInput(),
        tools=_tools(r),
        tool_choice=choice,
        parallel_tool_calls=parallel,
        response_format={"type": "json_schema", "json_schema": {
            "name": "output", "schema": fmt.schema_}} if fmt is not None else None,
        chat_template_kwargs=_template_kwargs(r),
    )


def messages_input(r: MessagesRequest, *, observe_ids: bool) -> ChatInput:
    """The chat path's input for a validated Messages request.

    Args:
        observe_ids: observe the raw generated ids (the response names the stop sequence
            that ended it from them).

    Raises:
        InvalidRequest: a cross-field rule is violated (naming the Messages field).
    """
    generation = GenerationInput(
        max_tokens=r.max_tokens,
        limit_field="max_tokens",
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        stop=tuple(r.stop_sequences) if r.stop_sequences is not None else None,
        observe_ids=observe_ids,
    )
    return conversation_input(r, generation)
