"""Chat template rendering and tokenizer loading shared by ignition and serve.

The renderer reproduces `transformers`' `apply_chat_template(..., tokenize=False)` byte for
byte (transformers 5.x `utils/chat_template_utils.py`): a Jinja2
`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the
`loopcontrols` extension, a `{% generation %}` block that renders its body, a `tojson` filter
that does not HTML-escape, and the globals `raise_exception`, `strftime_now`, `dict` and a
`namespace` that refuses underscore names. Messages are rebuilt from plain JSON types and
keys whose value is None are dropped, as transformers does. Chat templates are untrusted
code: the sandbox blocks attribute escapes; never render with a plain `Environment`.
Rendering is bounded in time and size (helios_tools.template_sandbox: `RenderLimits`), and
templates that load other templates are refused when compiled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from tokenizers import Tokenizer

from helios_tools.template_sandbox import (
    BoundedSandbox,
    RenderLimits,
    TemplateLimitError,
    bound_loops,
    bounded_render,
    loading_tag,
    measure_assigned,
)

# Message fields that carry reasoning; transformers aliases them so templates see each name.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

DEFAULT_LIMITS = RenderLimits()  # per request: 2 s, 4 Mi characters per value and output


class ChatTemplateError(ValueError):
    """The template failed to compile, or failed while rendering: it called
    `raise_exception`, broke a sandbox rule, exceeded its RenderLimits or raised."""


class ChatTemplateCompileError(ChatTemplateError):
    """The template cannot be used at all: a syntax error, or a tag that loads another
    template (`include`, `import`, `from`, `extends`). Startup and export refuse it."""


class ChatTemplateLimitError(ChatTemplateError):
    """Rendering exceeded its RenderLimits (time, value size or output size)."""


def _plain(value: Any) -> Any:
    """Rebuild `value` from JSON types so the sandbox only ever sees plain data."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise TypeError(f"chat messages must be mappings, got {type(message).__name__}")
        plain = {k: v for k, v in _plain(message).items() if v is not None}
        reasoning = next((plain[k] for k in _REASONING_FIELDS if plain.get(k) is not None), None)
        if reasoning is not None:
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        out.append(plain)
    return out


@lru_cache(maxsize=32)
def _compile(template_text: str):  # -> jinja2.Template
    class GenerationBlock(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` renders its body (assistant-mask marker)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno
            )

        def _body(self, caller):
            return caller()

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, measure_assigned(value))

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot set underscore attributes on a namespace: {name!r}"
                )

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = BoundedSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.bound_filters()
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    try:
        ast = env.parse(template_text)
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateCompileError(f"chat template does not compile: {exc}") from exc
    loads = loading_tag(ast)
    if loads is not None:
        tag, line = loads
        raise ChatTemplateCompileError(f"chat template uses {{% {tag} %}} (line {line}): a chat "
                                       "template cannot load other templates")
    try:
        return env.from_string(bound_loops(ast))
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateCompileError(f"chat template does not compile: {exc}") from exc


def render_chat(
    template_text: str,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    limits: RenderLimits = DEFAULT_LIMITS,
    **extra: Any,
) -> str:
    """Render a conversation with a chat template exactly as transformers does.

    Args:
        template_text: the Jinja2 chat template, verbatim.
        messages: OpenAI-style messages (`role`, `content`, optional `tool_calls`, ...);
            keys whose value is None are dropped.
        add_generation_prompt: append the assistant turn opener.
        tools: JSON-schema tool descriptions, or None.
        limits: the time and size budget of this render.
        **extra: further template variables (`bos_token`, `eos_token`, `documents`,
            `enable_thinking`, ...); transformers passes the tokenizer's special tokens here.

    Returns:
        The prompt text.

    Raises:
        ChatTemplateCompileError: the template does not compile or loads other templates.
        ChatTemplateLimitError: rendering exceeded `limits`.
        ChatTemplateError: rendering failed otherwise: `raise_exception`, a sandbox security error,
            or any error the template's code raised (TypeError,
            OverflowError, RecursionError, ...); the message names it.
        TypeError: a message is not a mapping.
    """
    template = _compile(template_text)
    variables = {k: _plain(v) for k, v in extra.items()}
    variables.setdefault("documents", None)
    variables.update(
        messages=_normalize_messages(messages),
        tools=_plain(list(tools)) if tools is not None else None,
        add_generation_prompt=add_generation_prompt,
    )
    try:
        return bounded_render(template, limits, variables)
    except TemplateLimitError as exc:
        raise ChatTemplateLimitError(f"chat template exceeded its limits: {exc}") from exc
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"chat template raised: {exc}") from exc
    except (ArithmeticError, LookupError, MemoryError, RecursionError, TypeError,
            ValueError) as exc:
        # Untrusted template code failed: the template's fault, reported as such.
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc


def load_tokenizer(tokenizer_json: str):  # -> tokenizers.Tokenizer
    """Build a HF `tokenizers.Tokenizer` from its JSON text.

    Raises:
        ValueError: the JSON is not a valid tokenizer description.
    """
    try:
        return Tokenizer.from_str(tokenizer_json)
    except Exception as exc:  # tokenizers raises a bare Exception subclass from Rust
        raise ValueError(f"invalid tokenizer.json: {exc}") from exc
