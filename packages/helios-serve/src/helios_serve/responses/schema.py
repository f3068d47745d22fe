"""POST /v1/responses: the strict request model and the canonical input items.

The body is parsed like the chat body (`http.schema.parse`: unknown or ill-typed fields
are 400s naming the field). `input` is a string (one user message) or a list of items;
each item is checked here and rewritten in its canonical form, the shape OpenAI returns
from GET /v1/responses/{id}/input_items (every item has an `id`):

    {"type": "message", "id", "role", "content": [{"type": "input_text" | "output_text",
        "text"} | {"type": "input_image", "image_url", "detail"}], "status": "completed"}
    {"type": "function_call", "id", "call_id", "name", "arguments", "status"}
    {"type": "function_call_output", "id", "call_id", "output": str, "status"}
    {"type": "reasoning", "id", "summary": [{"type": "summary_text", "text"}],
        "content": [{"type": "reasoning_text", "text"}]}

Served: text and image content (input_text, output_text; input_image in user and
system messages, as {"type": "input_image", "image_url", "detail"}: a file, audio or
file-id part is a 400), function tools, text.format json_schema / json_object / text, and the include
value `message.output_text.logprobs`. Fields accepted because they change nothing here:
`user`, `metadata` (echoed), `service_tier`, `safety_identifier`, `prompt_cache_key`,
`truncation: "disabled"`, `background: false`, `reasoning: null`.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from helios_serve.http.errors import InvalidRequest
from helios_serve.http.schema import PositiveInt, Seed, TopLogprobs

_STRICT = ConfigDict(extra="forbid", strict=True)

LOGPROBS_INCLUDE = "message.output_text.logprobs"
METADATA_KEYS = 16  # OpenAI's metadata limits: 16 pairs, keys <= 64 and values <= 512 chars
METADATA_KEY_CHARS = 64
METADATA_VALUE_CHARS = 512


class FunctionTool(BaseModel):
    """A Responses function tool: flat, unlike chat's {"function": {...}}."""

    model_config = _STRICT
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    """text.format: "text", "json_object", or "json_schema" with its schema inline."""

    model_config = _STRICT
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = _STRICT
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_obfuscation: bool | None = None  # nothing is obfuscated here


class ResponsesRequest(BaseModel):
    """POST /v1/responses body."""

    model_config = _STRICT

    model: str
    input: str | list[Any]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    seed: Seed | None = None
    top_logprobs: TopLogprobs | None = None
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    truncation: Literal["disabled"] | None = None
    background: Literal[False] | None = None
    reasoning: None = None


def new_id(prefix: str) -> str:
    """An OpenAI-style object id: `prefix` + "_" + 32 hex digits."""
    return f"{prefix}_{uuid.uuid4().hex}"


def check_request(r: ResponsesRequest) -> None:
    """Cross-field rules a type cannot express.

    Raises:
        InvalidRequest: naming the field.
    """
    if r.stream_options is not None and not r.stream:
        raise InvalidRequest("stream_options requires stream=true", param="stream_options")
    for value in r.include or ():
        if value != LOGPROBS_INCLUDE:
            raise InvalidRequest(f"include value {value!r} is not served here; served: "
                                 f"{LOGPROBS_INCLUDE!r}", param="include")  # fmt: skip
    if r.top_logprobs is not None and LOGPROBS_INCLUDE not in (r.include or ()):
        raise InvalidRequest(f"top_logprobs requires include=[{LOGPROBS_INCLUDE!r}]",
                             param="top_logprobs")  # fmt: skip
    metadata = r.metadata or {}
    if len(metadata) > METADATA_KEYS:
        raise InvalidRequest(f"metadata has {len(metadata)} keys; at most {METADATA_KEYS}",
                             param="metadata")  # fmt: skip
    for key, value in metadata.items():
        if len(key) > METADATA_KEY_CHARS or len(value) > METADATA_VALUE_CHARS:
            raise InvalidRequest(f"metadata keys are at most {METADATA_KEY_CHARS} characters "
                                 f"and values at most {METADATA_VALUE_CHARS}",
                                 param=f"metadata.{key}")  # fmt: skip
    fmt = r.text.format if r.text is not None else None
    if fmt is not None and fmt.type == "json_schema":
        if not fmt.name:
            raise InvalidRequest("text.format json_schema needs a name", param="text.format.name")
        if fmt.schema_ is None:
            raise InvalidRequest("text.format json_schema needs a schema",
                                 param="text.format.schema")  # fmt: skip
    if isinstance(r.tool_choice, FunctionToolChoice):
        names = {t.name for t in r.tools or ()}
        if r.tool_choice.name not in names:
            raise InvalidRequest(f"tool_choice names {r.tool_choice.name!r}, which is not "
                                 "among the request's tools", param="tool_choice")  # fmt: skip


# -- input items --------------------------------------------------------------------

_TEXT_PARTS = ("input_text", "output_text")
_INPUT_PARTS = ("input_text", "input_image")  # what a user or system message may hold
_UNSERVED_PARTS = ("input_file", "input_audio", "refusal")
_ROLES = ("user", "system", "developer", "assistant")
_STATUSES = ("in_progress", "completed", "incomplete")


def _bad(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="invalid_value")


def _string(item: dict[str, Any], key: str, param: str, *, optional: bool = False) -> str | None:
    value = item.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _bad(f"{param}.{key}", f"{param}.{key} must be a string")
    return value


def _only(item: dict[str, Any], allowed: tuple[str, ...], param: str) -> None:
    for key in item:
        if key not in allowed:
            raise InvalidRequest(f"unknown field {param}.{key!r}", param=f"{param}.{key}",
                                 code="unknown_parameter")  # fmt: skip


def _texts(parts: Any, allowed: tuple[str, ...], param: str) -> list[dict[str, Any]]:
    """Text parts as {"type", "text"} (output_text also gets its empty annotations)."""
    if not isinstance(parts, list):
        raise _bad(param, f"{param} must be a string or a list of content parts")
    out = []
    for j, part in enumerate(parts):
        where = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise _bad(where, f"{where} must be an object")
        kind = part.get("type")
        if kind in _UNSERVED_PARTS:
            raise _bad(where, f"{where}: {kind} content is not served here (text and images only)")
        if kind not in allowed:
            raise _bad(f"{where}.type", f"{where}.type must be one of {', '.join(allowed)}")
        if kind == "input_image":
            out.append(_image(part, where))
            continue
        _only(part, ("type", "text", "annotations", "logprobs"), where)
        text = _string(part, "text", where)
        out.append({"type": kind, "text": text, "annotations": []} if kind == "output_text"
                   else {"type": kind, "text": text})  # fmt: skip
    return out


def _image(part: dict[str, Any], where: str) -> dict[str, Any]:
    """An input_image part: its image_url (a data: URL, or http(s) where the server
    allows image URLs: the chat path decides) and detail; file ids are not served."""
    _only(part, ("type", "image_url", "detail", "file_id"), where)
    if part.get("file_id") is not None:
        raise _bad(f"{where}.file_id", f"{where}: file ids are not served here: send the "
                   "image as image_url")
    detail = part.get("detail") or "auto"
    if detail not in ("auto", "low", "high"):
        raise _bad(f"{where}.detail", f"{where}.detail must be one of auto, low, high")
    return {"type": "input_image", "image_url": _string(part, "image_url", where),
            "detail": detail}


def _message(item: dict[str, Any], param: str) -> dict[str, Any]:
    _only(item, ("type", "id", "role", "content", "status"), param)
    role = item.get("role")
    if role not in _ROLES:
        raise _bad(f"{param}.role", f"{param}.role must be one of {', '.join(_ROLES)}")
    content = item.get("content")
    if isinstance(content, str):
        kind = "output_text" if role == "assistant" else "input_text"
        parts = _texts([{"type": kind, "text": content}], _TEXT_PARTS, f"{param}.content")
    else:
        allowed = _TEXT_PARTS if role == "assistant" else (*_TEXT_PARTS, "input_image")
        parts = _texts(content, allowed, f"{param}.content")
    return {"type": "message", "id": _string(item, "id", param, optional=True) or new_id("msg"),
            "role": role, "content": parts, "status": "completed"}  # fmt: skip


def _function_call(item: dict[str, Any], param: str) -> dict[str, Any]:
    _only(item, ("type", "id", "call_id", "name", "arguments", "status"), param)
    return {"type": "function_call",
            "id": _string(item, "id", param, optional=True) or new_id("fc"),
            "call_id": _string(item, "call_id", param), "name": _string(item, "name", param),
            "arguments": _string(item, "arguments", param), "status": "completed"}  # fmt: skip


def _function_call_output(item: dict[str, Any], param: str) -> dict[str, Any]:
    _only(item, ("type", "id", "call_id", "output", "status"), param)
    output = item.get("output")
    if not isinstance(output, str):
        output = "".join(p["text"] for p in _texts(output, ("input_text",), f"{param}.output"))
    return {"type": "function_call_output",
            "id": _string(item, "id", param, optional=True) or new_id("fco"),
            "call_id": _string(item, "call_id", param), "output": output,
            "status": "completed"}  # fmt: skip


def _reasoning(item: dict[str, Any], param: str) -> dict[str, Any]:
    _only(item, ("type", "id", "summary", "content", "encrypted_content", "status"), param)
    if item.get("encrypted_content") is not None:
        raise _bad(f"{param}.encrypted_content",
                   "encrypted reasoning is not served here: send the reasoning text as content")
    summary = []
    for j, part in enumerate(item.get("summary") or []):
        where = f"{param}.summary[{j}]"
        if not isinstance(part, dict) or part.get("type") != "summary_text":
            raise _bad(where, f"{where} must be a summary_text part")
        _only(part, ("type", "text"), where)
        summary.append({"type": "summary_text", "text": _string(part, "text", where)})
    content = _texts(item.get("content") or [], ("reasoning_text",), f"{param}.content")
    return {"type": "reasoning", "id": _string(item, "id", param, optional=True) or new_id("rs"),
            "summary": summary, "content": content}  # fmt: skip


_ITEMS = {
    "message": _message,
    "function_call": _function_call,
    "function_call_output": _function_call_output,
    "reasoning": _reasoning,
}


def input_items(value: str | list[Any]) -> list[dict[str, Any]]:
    """The request's `input` as canonical items (module docstring).

    Raises:
        InvalidRequest: an item or part that is malformed or not served, naming it
            (`input[i]...`).
    """
    if isinstance(value, str):
        return [_message({"role": "user", "content": value}, "input")]
    if not value:
        raise _bad("input", "input must not be empty")
    out = []
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(param, f"{param} must be an object")
        kind = item.get("type", "message")  # EasyInputMessage: {"role", "content"}
        build = _ITEMS.get(kind)
        if build is None:
            raise _bad(f"{param}.type", f"{param}.type {kind!r} is not served here; served: "
                       f"{', '.join(_ITEMS)}")  # fmt: skip
        out.append(build(item, param))
    return out
