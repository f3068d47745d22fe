"""Request schemas: strict pydantic models (`extra="forbid"`) and their plain-data inputs.

Unknown or ill-typed fields are 400s naming the field; `check_*` add the cross-field
rules of the specification ("String stops", "Token and timing observation") that a type
cannot express. The models are also the OpenAPI document's request bodies
(`http/openapi.py`), so what is documented is what is parsed. `*_input` turn a validated
model into the frontend's plain-data input (`frontend.prepare`); semantics of tools,
tool_choice, response_format and stops belong to the frontend.

Fields accepted because they do not change the output (OpenAI's `user`, `store: false`,
`metadata`, `service_tier`, `prediction: null`, `functions: null`, `logprobs: false`)
are parsed and not used.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from helios_serve.frontend.prepare import ChatInput, CompletionInput, GenerationInput
from helios_serve.http.errors import InvalidRequest

_STRICT = ConfigDict(extra="forbid", strict=True)


def _integral(value: Any) -> Any:
    """JSON Schema's integers include integral numbers such as 2.0 (what the OpenAPI
    document promises); strings and booleans stay invalid."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def api_int(**bounds: int) -> Any:
    """An integer field with `bounds` (pydantic's ge / gt / le / lt) that accepts integral
    numbers (`_integral`). The bounds come before the validator: after it, pydantic checks
    them through floats (a limit of 2**64 read "18446744073709552000") and writes them to
    the JSON schema as "ge" / "le" rather than JSON Schema's minimum / maximum."""
    return Annotated[int, Field(**bounds), BeforeValidator(_integral)]


Int = api_int(ge=0)
PositiveInt = api_int(ge=1)
TopLogprobs = api_int(ge=0, le=20)
TopK = api_int(ge=-1)  # -1: off, as vLLM
Seed = api_int(ge=-(2**63), lt=2**64)  # int64 or uint64


class TextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: str


class ImageUrl(BaseModel):
    model_config = _STRICT
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(BaseModel):
    model_config = _STRICT
    type: Literal["image_url"]
    image_url: ImageUrl


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
    content: str | list[TextPart | ImagePart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def plain(self) -> dict[str, Any]:
        """The message as plain data (content parts as dicts)."""
        return self.model_dump(exclude_none=True)


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
    continuous_usage_stats: bool | None = None  # vLLM: usage on every chunk


class _Sampling(BaseModel):
    """Fields shared by chat and legacy completions."""

    model_config = _STRICT

    model: str
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: TopK | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=2.0)] | None = None
    seed: Seed | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Int] | None = None
    n: PositiveInt | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    ignore_eos: bool | None = None
    min_tokens: Int | None = None


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions body."""

    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    stop_token_sequences: list[list[Int]] | None = None
    return_token_ids: bool | None = None
    return_token_timestamps: bool | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    store: Literal[False] | None = None
    metadata: dict[str, str] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    prediction: None = None
    functions: None = None
    function_call: None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    # vLLM's extension: log probabilities of the rendered prompt's tokens, with this many
    # alternatives each (top-level `prompt_logprobs` of the response).
    prompt_logprobs: TopLogprobs | None = Field(
        default=None, description="vLLM's extension: report the rendered prompt's log "
        "probabilities (top-level `prompt_logprobs`: null for the first token, then per token "
        "a map from token id to {logprob, rank, decoded_token}) with this many alternatives; "
        "not with stream")


class CompletionRequest(_Sampling):
    """POST /v1/completions body (legacy completions)."""

    prompt: str | list[str] | list[Int] | list[list[Int]]
    # 0 only with echo: the prompt (and its logprobs) back, nothing generated.
    max_tokens: Int | None = Field(default=16, description=(  # OpenAI's and vLLM's default
        "output limit in tokens; 0 only with echo (the prompt and its logprobs back, nothing "
        "generated)"))
    logprobs: TopLogprobs | None = Field(default=None, description=(
        "log probabilities of the generated tokens with this many alternatives each; with "
        "echo, of the prompt's tokens too (the first one null)"))
    echo: bool | None = None
    best_of: PositiveInt | None = None
    suffix: str | None = None


class TokenizeRequest(BaseModel):
    """POST /tokenize body (vLLM's): a `prompt`, or chat `messages` rendered first."""

    model_config = _STRICT
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    tools: list[Tool] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool | None = None


class DetokenizeRequest(BaseModel):
    """POST /detokenize body (vLLM's)."""

    model_config = _STRICT
    model: str | None = None
    tokens: list[Int]


REQUEST_MODELS: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
}


def _is_branch(item: Any) -> bool:
    """Whether a pydantic error location item names a union branch, not a field."""
    return not isinstance(item, int) and (
        item in ("str", "int", "float", "bool", "none") or "[" in str(item)
        or str(item) in ("TextPart", "ImagePart")
        or str(item).startswith(("function-", "literal", "json-or-python")))


def _field_name(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif _is_branch(item):
            continue  # union branch names, not fields
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def _reported(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The error a 400 names: the first, or where it is one branch of a union (a message's
    content: a string or a list of parts), the deepest error of that union's branches:
    the branch the input took (`[{"type": "text"}]` lacks its text; "Input should be a
    valid string" named the branch it did not take)."""
    first = errors[0]
    loc = tuple(first["loc"])
    cut = next((i for i, item in enumerate(loc) if _is_branch(item)), len(loc))
    union = loc[:cut]
    return max((e for e in errors if tuple(e["loc"])[:cut] == union),
               key=lambda e: len(e["loc"]), default=first)


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], body: bytes) -> M:
    """Decode and validate a request body against `model`.

    Raises:
        InvalidRequest: malformed JSON, or an unknown or ill-typed field (named in
            `param`; code `unknown_parameter` or `invalid_value`).
    """
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            raise InvalidRequest(f"request body is not valid JSON: {first['msg']}") from None
        first = _reported(exc.errors())
        name = _field_name(tuple(first["loc"]))
        if not name:  # the body itself: an array, a string, a number or null
            raise InvalidRequest("the request body must be a JSON object") from None
        if first["type"] == "extra_forbidden":
            raise InvalidRequest(f"unknown field {name!r}", param=name,
                                 code="unknown_parameter") from None  # fmt: skip
        raise InvalidRequest(f"invalid field {name!r}: {first['msg']}", param=name,
                             code="invalid_value") from None  # fmt: skip


def _check_stream(r: _Sampling) -> None:
    if r.stream_options is not None and not r.stream:
        raise InvalidRequest("stream_options requires stream=true", param="stream_options")


def _generation(r: _Sampling, max_tokens: int | None, limit_field: str, **extra) -> GenerationInput:
    stop = tuple(r.stop) if isinstance(r.stop, list) else r.stop
    return GenerationInput(
        max_tokens=max_tokens,
        limit_field=limit_field,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        min_p=r.min_p,
        presence_penalty=r.presence_penalty,
        frequency_penalty=r.frequency_penalty,
        repetition_penalty=r.repetition_penalty,
        seed=r.seed,
        n=r.n or 1,
        stop=stop,
        stop_token_ids=tuple(r.stop_token_ids) if r.stop_token_ids is not None else None,
        logit_bias=tuple((r.logit_bias or {}).items()),
        ignore_eos=bool(r.ignore_eos),
        min_tokens=r.min_tokens or 0,
        **extra,
    )


def chat_input(r: ChatCompletionRequest) -> ChatInput:
    """The frontend's input for a validated chat request.

    Raises:
        InvalidRequest: a cross-field rule is violated (naming the field).
    """
    for i, message in enumerate(r.messages):
        if message.role != "assistant" and message.content is None:
            raise InvalidRequest(
                f"a {message.role} message needs content", param=f"messages[{i}].content"
            )
    if r.return_token_timestamps and not r.return_token_ids:
        raise InvalidRequest(
            "return_token_timestamps requires return_token_ids", param="return_token_timestamps"
        )
    _check_stream(r)
    if r.max_tokens is not None and r.max_completion_tokens is not None:
        if r.max_tokens != r.max_completion_tokens:
            raise InvalidRequest(
                "max_tokens and max_completion_tokens disagree", param="max_completion_tokens"
            )
    if r.top_logprobs is not None and not r.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs=true", param="top_logprobs")
    if r.prompt_logprobs is not None and r.stream:  # as vLLM
        raise InvalidRequest("prompt_logprobs are not available with stream=true",
                             param="prompt_logprobs")
    limit_field = "max_completion_tokens" if r.max_completion_tokens is not None else "max_tokens"
    generation = _generation(
        r,
        r.max_completion_tokens or r.max_tokens,
        limit_field,
        stop_token_sequences=tuple(tuple(s) for s in r.stop_token_sequences)
        if r.stop_token_sequences is not None else None,
        logprobs=(r.top_logprobs or 0) if r.logprobs else None,
        observe_ids=bool(r.return_token_ids),
        observe_timestamps=bool(r.return_token_timestamps),
        prompt_logprobs=r.prompt_logprobs,
    )  # fmt: skip
    return ChatInput(
        messages=tuple(m.plain() for m in r.messages),
        generation=generation,
        tools=tuple(t.model_dump(exclude_none=True) for t in r.tools) if r.tools else None,
        tool_choice=r.tool_choice if r.tool_choice is not None else "auto",
        parallel_tool_calls=r.parallel_tool_calls is not False,
        response_format=r.response_format,
        chat_template_kwargs=r.chat_template_kwargs or {},
        add_generation_prompt=r.add_generation_prompt if r.add_generation_prompt is not None
        else not r.continue_final_message,
        continue_final_message=bool(r.continue_final_message),
    )


def completion_inputs(r: CompletionRequest) -> list[CompletionInput]:
    """One frontend input per prompt of a validated completions request (a string, a
    list of strings, token ids, or a list of token-id lists).

    Raises:
        InvalidRequest: `suffix`, `best_of` other than n, or an empty prompt list.
    """
    if r.suffix is not None:
        raise InvalidRequest("suffix is not supported: this server does not insert text",
                             param="suffix")  # fmt: skip
    if r.best_of is not None and r.best_of != (r.n or 1):
        raise InvalidRequest("best_of must equal n (no choices are generated and dropped)",
                             param="best_of")  # fmt: skip
    if r.max_tokens == 0 and not r.echo:
        raise InvalidRequest("max_tokens 0 generates nothing: it needs echo=true (the prompt "
                             "and its logprobs back)", param="max_tokens")  # fmt: skip
    _check_stream(r)
    # max_tokens 0 (echo only) runs one token, which the response leaves out (vLLM's
    # echo without generation).
    generation = _generation(r, r.max_tokens or (None if r.max_tokens is None else 1),
                             "max_tokens", logprobs=r.logprobs, top_field="logprobs",
                             prompt_logprobs=r.logprobs if r.echo else None,
                             prompt_field_logprobs="logprobs")
    prompt = r.prompt
    if isinstance(prompt, str):
        prompts: list[str | tuple[int, ...]] = [prompt]
    elif not prompt:
        raise InvalidRequest("prompt must not be empty", param="prompt")
    elif all(isinstance(p, int) for p in prompt):
        prompts = [tuple(prompt)]  # type: ignore[arg-type]
    else:
        prompts = [p if isinstance(p, str) else tuple(p) for p in prompt]  # type: ignore[misc]
    return [CompletionInput(p, generation) for p in prompts]
