"""Structured-output strictness (docs/api.md): the JSON schemas a grammar enforces.

Two rules, applied to every JSON schema Helios constrains (a ``response_format`` schema,
a forced tool call's parameters, a JSON-typed tagged parameter):

- An object schema that lists ``properties`` (or ``patternProperties``) but says nothing
  about ``additionalProperties`` is closed: ``additionalProperties: false``, OpenAI strict
  mode's and xgrammar's default. Keys outside the declared ones can then never be
  generated (a small model otherwise copies schema keywords such as ``"type"`` into its
  arguments). An explicit ``additionalProperties`` (true or a schema) is kept; an object
  schema without declared properties (``{"type": "object"}``: any object) stays open.
  Members of an ``allOf`` are left as written (closing each would forbid the others'
  properties); the schemas they reference are closed where they are defined. Required
  properties are required as the schema says.
- Free whitespace is bounded: at each place JSON allows whitespace, at most one space or
  tab, or one line break followed by up to 16 spaces or tabs of indentation (compact,
  spaced and pretty-printed JSON all fit), so a model cannot emit whitespace until the
  output limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# llguidance `x-guidance.whitespace_pattern`: matched at most once per location.
JSON_WHITESPACE = r"[\x20\x09]?|\x0D?\x0A[\x20\x09]{0,16}"

_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SCHEMA_VALUES = ("items", "not", "if", "then", "else", "contains", "additionalProperties",
                  "propertyNames", "unevaluatedProperties")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions",
                "dependentSchemas")


def close_objects(schema: Any) -> Any:
    """A copy of `schema` with every object schema that declares properties closed
    (``additionalProperties: false`` unless it says otherwise); see the module docstring."""
    return _close(schema, in_all_of=False)


def _close(schema: Any, in_all_of: bool) -> Any:
    if not isinstance(schema, Mapping):
        return schema  # true / false schemas and malformed parts: llguidance judges them
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {k: _close(v, False) for k, v in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_close(v, False) for v in value]
        elif key == "allOf" and isinstance(value, list):
            out[key] = [_close(v, True) for v in value]
        elif key in _SCHEMA_VALUES:
            out[key] = _close(value, False)
        else:
            out[key] = value
    declares = "properties" in out or "patternProperties" in out
    if declares and "additionalProperties" not in out and not in_all_of:
        out["additionalProperties"] = False
    return out


def strict_schema(schema: Any) -> Any:
    """The schema a grammar enforces: objects closed and whitespace bounded (the
    top-level ``x-guidance`` options of llguidance; a request's own are kept)."""
    closed = close_objects(schema)
    if not isinstance(closed, dict):
        closed = {} if closed is True else closed
        if not isinstance(closed, dict):
            return closed
    guidance = dict(closed.get("x-guidance") or {})
    guidance.setdefault("whitespace_pattern", JSON_WHITESPACE)
    return {**closed, "x-guidance": guidance}
