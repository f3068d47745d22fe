"""Chat template rendering and tokenizer loading shared by ignition and serve.

The renderer reproduces `transformers`' `apply_chat_template(..., tokenize=False)` byte for
byte (transformers 5.x `utils/chat_template_utils.py`): a Jinja2
`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the
`loopcontrols` extension, a `{% generation %}` block that renders its body, a `tojson` filter
that does not HTML-escape, and the globals `raise_exception`, `strftime_now`, `dict` and a
`namespace` that refuses underscore names. Messages are rebuilt from plain JSON types and
keys whose value is None are dropped, as transformers does. Chat templates are untrusted
code: the sandbox blocks attribute escapes; never render with a plain `Environment`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

# Message fields that carry reasoning; transformers aliases them so templates see each name.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """The template failed to compile or called `raise_exception` while rendering."""


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
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

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
            jinja2.utils.Namespace.__setitem__(self, name, value)

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

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    try:
        return env.from_string(template_text)
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from exc


def render_chat(
    template_text: str,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    **extra: Any,
) -> str:
    """Render a conversation with a chat template exactly as transformers does.

    Args:
        template_text: the Jinja2 chat template, verbatim.
        messages: OpenAI-style messages (`role`, `content`, optional `tool_calls`, ...);
            keys whose value is None are dropped.
        add_generation_prompt: append the assistant turn opener.
        tools: JSON-schema tool descriptions, or None.
        **extra: further template variables (`bos_token`, `eos_token`, `documents`,
            `enable_thinking`, ...); transformers passes the tokenizer's special tokens here.

    Returns:
        The prompt text.

    Raises:
        ChatTemplateError: the template does not compile or calls `raise_exception`
            (including sandbox security errors).
        TypeError: a message is not a mapping.
    """
    import jinja2

    template = _compile(template_text)
    variables = {k: _plain(v) for k, v in extra.items()}
    variables.setdefault("documents", None)
    try:
        return template.render(
            messages=_normalize_messages(messages),
            tools=_plain(list(tools)) if tools is not None else None,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"chat template raised: {exc}") from exc


def load_tokenizer(tokenizer_json: str):  # -> tokenizers.Tokenizer
    """Build a HF `tokenizers.Tokenizer` from its JSON text.

    Raises:
        ValueError: the JSON is not a valid tokenizer description.
    """
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(tokenizer_json)
    except Exception as exc:  # tokenizers raises a bare Exception subclass from Rust
        raise ValueError(f"invalid tokenizer.json: {exc}") from exc
