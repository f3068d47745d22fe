"""Chat completion request schema: strict pydantic models (`extra="forbid"`).

Unknown or ill-typed fields are 400s naming the field; `check_semantics` adds the
cross-field rules of model-contract.md ("String stops", "Token and timing observation")
that a type cannot express. Semantics of tools, tool_choice and response_format belong
to the frontend; they are accepted here and handed to the output pipeline.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from helios_serve.http.errors import InvalidRequest

_STRICT = ConfigDict(extra="forbid", strict=True)


class TextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = _STRICT
    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = _STRICT
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def text(self) -> str | None:
        """Content as one string (text parts joined), or None."""
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionDefinition(BaseModel):
    model_config = _STRICT
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: FunctionDefinition


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool | None = None


class ChatCompletionRequest(BaseModel):
    """POST /v1/chat/completions body."""

    model_config = _STRICT

    model: str
    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=2.0)] | None = None
    seed: Annotated[int, Field(ge=-(2**63), lt=2**64)] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    stop_token_sequences: list[list[Annotated[int, Field(ge=0)]]] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None
    return_token_timestamps: bool | None = None
    n: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def structured(self) -> bool:
        """Whether a grammar constrains the output (structured output)."""
        fmt = (self.response_format or {}).get("type")
        named = isinstance(self.tool_choice, dict)
        return fmt in ("json_object", "json_schema") or self.tool_choice == "required" or named


def _field_name(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in ("str", "list[TextPart]", "int", "float", "bool") or "[" in str(item):
            continue  # union branch names, not fields
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def parse_request(body: bytes) -> ChatCompletionRequest:
    """Decode and validate a request body.

    Raises:
        InvalidRequest: malformed JSON, an unknown or ill-typed field (named in `param`),
            or a violated cross-field rule.
    """
    try:
        request = ChatCompletionRequest.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        if first["type"] == "json_invalid":
            raise InvalidRequest(f"request body is not valid JSON: {first['msg']}") from None
        name = _field_name(tuple(first["loc"]))
        if not name:  # the body itself: an array, a string, a number or null
            raise InvalidRequest("the request body must be a JSON object") from None
        if first["type"] == "extra_forbidden":
            message = f"unknown field {name!r}"
        else:
            message = f"invalid field {name!r}: {first['msg']}"
        raise InvalidRequest(message, param=name) from None
    check_semantics(request)
    return request


def check_semantics(request: ChatCompletionRequest) -> None:
    """Cross-field rules a type cannot express. Stop limits are checked by the
    frontend's `parse_stops` during preparation (one place for those rules).

    Raises:
        InvalidRequest: naming the offending field.
    """
    for i, message in enumerate(request.messages):
        if message.role != "assistant" and message.content is None:
            raise InvalidRequest(
                f"a {message.role} message needs content", param=f"messages[{i}].content"
            )
    if request.n is not None and request.n != 1:
        raise InvalidRequest(f"n must be 1 (got {request.n}): one choice per request", param="n")
    if request.return_token_timestamps and not request.return_token_ids:
        raise InvalidRequest(
            "return_token_timestamps requires return_token_ids", param="return_token_timestamps"
        )
    if request.stream_options is not None and not request.stream:
        raise InvalidRequest("stream_options requires stream=true", param="stream_options")
    if request.max_tokens is not None and request.max_completion_tokens is not None:
        if request.max_tokens != request.max_completion_tokens:
            raise InvalidRequest(
                "max_tokens and max_completion_tokens disagree", param="max_completion_tokens"
            )
