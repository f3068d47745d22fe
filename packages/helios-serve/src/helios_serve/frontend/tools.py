"""Tool-call parsers: turn answer text into content and streamed tool calls.

Each parser is incremental: `feed(token_id, text)` and `finish()` return presentation
deltas (`ContentDelta`, `ToolCallStart`, `ToolCallArguments`). Syntax strings come only
from `ToolSyntax`; see docs/frontend-syntax.md for each family.

Streaming shape: a call's `ToolCallStart` (index, id, name) is emitted when its name is
complete; its arguments follow as fragments of one compact JSON object, one fragment per
completed parameter (`{"a":1`, `,"b":2`, then `}`), so accumulating the fragments by index
gives exactly the final arguments string. Markup never reaches content; whitespace that
only separates tags or calls is dropped. A call to a name the request did not register is
consumed and dropped.
"""

from __future__ import annotations

import html
import json
import math
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from .deltas import ContentDelta, Delta, ToolCallArguments, ToolCallStart
from .markup import Scan, TokenMarks
from .syntax import ToolSyntax


def random_call_id() -> str:
    """A unique tool-call id: "call_" and 24 random hex digits."""
    return "call_" + secrets.token_hex(12)


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400
        raise ValueError(f"{text} overflows a double")
    return value


def _loads(text: str) -> Any:
    """json.loads without NaN and Infinity (Python accepts them; JSON and clients do not)."""
    return json.loads(text, parse_constant=_not_json, parse_float=_finite)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def convert_parameter(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """Convert a raw parameter value with its JSON schema type.

    Types are tried in the schema's order: integer, number, boolean, null, object and
    array parse the value; string keeps it. A value no declared type accepts stays the raw
    string (the call is never dropped).
    """
    types = (schema or {}).get("type")
    if types is None:
        return raw
    for t in [types] if isinstance(types, str) else list(types):
        if t == "string":
            return raw
        text = raw.strip()
        try:
            if t == "integer":
                value = _loads(text)
                if isinstance(value, int) and not isinstance(value, bool):
                    return value
                if isinstance(value, float) and value.is_integer():
                    return int(value)
            elif t == "number":
                value = _loads(text)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    return value
            elif t == "boolean":
                if text.lower() in ("true", "false"):
                    return text.lower() == "true"
            elif t == "null":
                if text == "null":
                    return None
            elif t == "object":
                value = _loads(text)
                if isinstance(value, dict):
                    return value
            elif t == "array":
                value = _loads(text)
                if isinstance(value, list):
                    return value
        except ValueError:
            continue
    return raw


def parameter_schema(params: Mapping[str, Any] | None, name: str) -> Any:
    """The JSON schema of parameter `name` of a function's parameters schema, standalone.

    A local reference ("#/$defs/X" or "#/definitions/X": pydantic's nested models) is
    resolved, and the root's definitions come along so nested references still resolve
    once the schema stands alone (in a grammar, or for conversion). None when undeclared.
    """
    params = params if isinstance(params, Mapping) else {}
    schema = (params.get("properties") or {}).get(name)
    if not isinstance(schema, Mapping):
        return schema
    defs = {k: params[k] for k in ("$defs", "definitions") if isinstance(params.get(k), Mapping)}
    ref = schema.get("$ref")
    for key, table in defs.items():
        prefix = f"#/{key}/"
        if isinstance(ref, str) and ref.startswith(prefix):
            target = table.get(ref[len(prefix):])
            if isinstance(target, Mapping):
                schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
            break
    return {**defs, **schema} if defs else dict(schema)


class CallSink:
    """Shared call numbering and registration for one response.

    Args:
        tools: registered function name -> its parameters JSON schema. Calls to other
            names are dropped.
        call_id: factory of unique call ids.
    """

    def __init__(
        self, tools: Mapping[str, Mapping[str, Any]], call_id: Callable[[], str] = random_call_id
    ) -> None:
        self.tools = tools
        self._call_id = call_id
        self.count = 0

    def start(self, name: str) -> ToolCallStart | None:
        """A new call's first delta, or None when `name` is not registered."""
        if name not in self.tools:
            return None
        self.count += 1
        return ToolCallStart(self.count - 1, self._call_id(), name)

    def property_schema(self, name: str, parameter: str) -> Mapping[str, Any] | None:
        return parameter_schema(self.tools.get(name), parameter)


class NoToolParser:
    """TOOL_PARSER_NONE (or a request without tools): all answer text is content."""

    def __init__(self) -> None:
        pass

    def feed(self, token_id: int, text: str) -> list[Delta]:
        return [ContentDelta(text)] if text else []

    def finish(self) -> list[Delta]:
        return []


class AnswerOrCalls:
    """A response_format answer that may be tool calls instead (pipeline.answers_or_calls:
    the grammar admits the schema's document or the syntax's call envelopes, one or the
    other). The answer's first non-whitespace text decides: the call opener hands the
    whole answer to the syntax's tool parser; anything else makes it an opaque document,
    whose literal tags stay text (NoToolParser). Text is held while it is whitespace or a
    proper prefix of the opener, then replayed, ids and all, into the chosen parser.

    Args:
        calls: the syntax's tool parser for this request.
        opener: the syntax's call opener (ToolSyntax.call_open), nonempty.
    """

    def __init__(self, calls: JsonInTagsToolParser | TaggedToolParser, opener: str) -> None:
        self._calls = calls
        self._opener = opener
        self._held: list[tuple[int, str]] = []
        self._text = ""
        self._chosen: JsonInTagsToolParser | TaggedToolParser | NoToolParser | None = None

    def feed(self, token_id: int, text: str) -> list[Delta]:
        if self._chosen is not None:
            return self._chosen.feed(token_id, text)
        self._held.append((token_id, text))
        self._text += text
        head = self._text.lstrip()
        if not head or (len(head) < len(self._opener) and self._opener.startswith(head)):
            return []  # undecided
        return self._choose(self._calls if head.startswith(self._opener) else NoToolParser())

    def finish(self) -> list[Delta]:
        out = self._choose(NoToolParser()) if self._chosen is None else []
        assert self._chosen is not None
        return out + self._chosen.finish()

    def _choose(self, parser: JsonInTagsToolParser | TaggedToolParser | NoToolParser
                ) -> list[Delta]:
        self._chosen = parser
        out: list[Delta] = []
        for token_id, text in self._held:
            out += parser.feed(token_id, text)
        self._held = []
        return out


class _Content:
    """Content around calls. Whitespace that only separates content from a call (before
    it, or after it up to the next text) is tag separation and is dropped."""

    def __init__(self, sink: CallSink, emit_content: bool) -> None:
        self._sink = sink
        self._emit = emit_content
        self._ws = ""  # trailing whitespace held until the next text or call
        self._after_call = False

    def text(self, text: str, out: list[Delta]) -> None:
        if not self._emit:
            return
        if self._after_call:
            text = text.lstrip()
            if not text:
                return
        body = text.rstrip()
        if not body:
            self._ws += text
            return
        out.append(ContentDelta(self._ws + body))
        self._ws = text[len(body) :]
        self._after_call = False

    def before_call(self) -> None:
        self._ws = ""
        self._after_call = True

    def finish(self, out: list[Delta]) -> None:
        if self._ws and self._sink.count == 0 and self._emit:
            out.append(ContentDelta(self._ws))
        self._ws = ""


class TaggedToolParser:
    """Tag-structured calls: Qwen Coder function tags, GLM argument tags, DSML, XTML, and
    the ATEM call blocks inside tool recipient frames.

    Grammar of a block (every string from `ToolSyntax`; whitespace between tags ignored):
        call_open ( function_name_open NAME function_name_close
                    ( parameter_name_open P parameter_name_close
                      [parameter_kind_open KIND parameter_kind_close]
                      parameter_value_open VALUE parameter_value_close )*
                    function_close )+ call_close
    With an empty function_name_open the name follows call_open directly and ends at a tag
    separator, parameter_name_open or call_close (one function per block).

    Args:
        syntax: the tool syntax.
        marks: single-token markers.
        sink: call numbering and the registered tools.
        xml_escaped: names and values use XML character entities (XTML).
        emit_content: False inside a tool frame, where text outside blocks is dropped.
        required_name: the only accepted name (a named tool recipient), or None.
        max_calls: invocations accepted by this parser (later ones are dropped), or None.
    """

    def __init__(
        self,
        syntax: ToolSyntax,
        marks: TokenMarks,
        sink: CallSink,
        *,
        xml_escaped: bool = False,
        emit_content: bool = True,
        required_name: str | None = None,
        max_calls: int | None = None,
    ) -> None:
        self._s = syntax
        self._scan = Scan(marks)
        self._sink = sink
        self._xml = xml_escaped
        self._content = _Content(sink, emit_content)
        self._required = required_name
        self._calls_left = max_calls
        self._state = "content"
        self._buf = ""  # name / parameter / kind / value being read
        self._call: ToolCallStart | None = None  # the open call (None: dropped or none)
        self._in_function = False
        self._params = 0
        self._param = ""
        self._kind = ""

    # ---- input ----

    def feed(self, token_id: int, text: str) -> list[Delta]:
        self._scan.push(token_id, text)
        return self._drain(False)

    def finish(self) -> list[Delta]:
        out = self._drain(True)
        if self._state == "value":
            self._end_value(out, closed=False)
        if self._state in ("param_name", "kind_open", "kind", "before_value"):
            self._state = "function"
        if self._state == "function_name":
            self._begin_function(out)
        if self._in_function:
            self._end_function(out)
        self._content.finish(out)
        return out

    # ---- state machine ----

    def _wanted(self) -> tuple[str, ...]:
        s = self._s
        st = self._state
        if st == "content":
            return (s.call_open, s.call_close)
        if st == "block":
            return (s.function_name_open, s.call_close)
        if st == "function_name":
            if s.function_name_close:
                return (s.function_name_close, s.call_close)
            return (s.tag_separator or "\n", s.parameter_name_open, s.call_close)
        if st == "function":
            return (s.parameter_name_open, s.function_close, s.call_close)
        if st == "param_name":
            return (s.parameter_name_close,)
        if st == "kind_open":
            return (s.parameter_kind_open, s.parameter_value_open)
        if st == "kind":
            return (s.parameter_kind_close,)
        if st == "before_value":
            return (s.parameter_value_open,)
        # "value": its close, or (close missing) the next parameter's opener or a function
        # or block close, which end the value: markup never becomes argument text.
        return (s.parameter_value_close, s.parameter_name_open, s.function_close, s.call_close)

    def _drain(self, final: bool) -> list[Delta]:
        out: list[Delta] = []
        while (step := self._scan.next(self._wanted(), final)) is not None:
            if step.text:
                self._text(step.text, out)
            if step.marker is not None:
                self._marker(step.marker, out)
        return out

    def _text(self, text: str, out: list[Delta]) -> None:
        st = self._state
        if st == "content":
            self._content.text(text, out)
        elif st in ("function_name", "param_name", "kind", "value"):
            self._buf += text
        elif st == "before_value" and text.strip():
            # No value opener arrived: the text is the value itself.
            self._state = "value"
            self._buf += text
        # "block", "function", "kind_open": text between tags is separation, dropped.

    def _marker(self, marker: str, out: list[Delta]) -> None:
        s = self._s
        st = self._state
        if st == "content":
            if marker == s.call_open:
                self._content.before_call()
                self._state = "block" if s.function_name_open else "function_name"
                self._buf = ""
            # A stray call_close (or another marker token) is markup: dropped.
        elif st == "block":
            if marker == s.function_name_open:
                self._state, self._buf = "function_name", ""
            elif marker == s.call_close:
                self._state = "content"
        elif st == "function_name":
            self._begin_function(out)  # -> "function"
            if marker == s.parameter_name_open:
                self._state, self._buf = "param_name", ""
            elif marker == s.call_close:
                self._end_function(out)
                self._state = "content"
        elif st == "function":
            if marker == s.parameter_name_open:
                self._state, self._buf = "param_name", ""
            elif marker == s.function_close:
                self._end_function(out)
                self._state = "block"
            elif marker == s.call_close:
                if self._in_function:
                    self._end_function(out)
                self._state = "content"
        elif st == "param_name":
            if marker == s.parameter_name_close:
                self._param, self._buf, self._kind = self._unescape(self._buf.strip()), "", ""
                if s.parameter_kind_open:
                    self._state = "kind_open"
                else:
                    self._state = "before_value" if s.parameter_value_open else "value"
        elif st == "kind_open":
            if marker == s.parameter_kind_open:
                self._state, self._buf = "kind", ""
            elif marker == s.parameter_value_open:
                self._state, self._buf = "value", ""
        elif st == "kind":
            if marker == s.parameter_kind_close:
                self._kind, self._buf = self._buf.strip(), ""
                self._state = "before_value" if s.parameter_value_open else "value"
        elif st == "before_value":
            if marker == s.parameter_value_open:
                self._state, self._buf = "value", ""
        elif st == "value":
            if marker == s.parameter_value_close:
                self._end_value(out)
            elif marker in (s.parameter_name_open, s.function_close, s.call_close, s.call_open):
                # A missing value close: the next parameter's opener, the function or block
                # close, or a new block ends the value; the marker then acts as itself.
                self._end_value(out, closed=False)
                if marker == s.call_open:  # a new block: this one ends first
                    self._marker(s.call_close, out)
                self._marker(marker, out)
            else:
                self._buf += marker

    # ---- calls ----

    def _begin_function(self, out: list[Delta]) -> None:
        name = self._unescape(self._buf.strip())
        self._buf = ""
        self._in_function = True
        self._params = 0
        self._state = "function"
        start = None
        if (self._required is None or name == self._required) and self._calls_left != 0:
            start = self._sink.start(name)
            if self._calls_left is not None:
                self._calls_left -= 1
        self._call = start
        if start is not None:
            out.append(start)

    def _end_value(self, out: list[Delta], closed: bool = True) -> None:
        """Emit the parameter read so far. `closed`: ended by its own close tag; else by
        a later tag, so a tag separator before that tag is syntax, not value."""
        raw, self._buf = self._buf, ""
        self._state = "function"
        kind = self._kind
        s = self._s
        if not closed and s.tag_separator:
            raw = raw.removesuffix(s.tag_separator)
        wrap = s.wrapping_newline
        if wrap:
            raw = raw.removeprefix(wrap).removesuffix(wrap)
        raw = self._unescape(raw)
        if self._call is None:
            return
        if kind and kind == s.parameter_kind_string:
            value: Any = raw
        elif kind and kind == s.parameter_kind_json:
            try:
                value = _loads(raw)
            except ValueError:
                value = convert_parameter(raw, self._sink.property_schema(self._call.name, self._param))
        else:
            value = convert_parameter(raw, self._sink.property_schema(self._call.name, self._param))
        lead = "{" if self._params == 0 else ","
        self._params += 1
        out.append(ToolCallArguments(self._call.index, lead + _dumps(self._param) + ":" + _dumps(value)))

    def _end_function(self, out: list[Delta]) -> None:
        if self._call is not None:
            out.append(ToolCallArguments(self._call.index, "}" if self._params else "{}"))
        self._call = None
        self._in_function = False

    def _unescape(self, text: str) -> str:
        return html.unescape(text) if self._xml else text


class JsonInTagsToolParser:
    """`call_open {"name": ..., "arguments": {...}} call_close` (TOOL_PARSER_JSON_IN_TAGS).

    A block holds one or more JSON call objects; each is emitted when its block closes,
    as a start delta and one arguments fragment. A body that is not valid JSON is dropped.
    A block cut by the end of output (`finish`: the output limit) still returns a call
    whose name and arguments object are complete; a call cut before its arguments are
    complete JSON is not returned (clients json.loads a call's arguments; the response's
    finish "length" says the output was cut: docs/api.md, "Tool calls cut by max_tokens").
    """

    def __init__(
        self, syntax: ToolSyntax, marks: TokenMarks, sink: CallSink, *, emit_content: bool = True
    ) -> None:
        self._s = syntax
        self._scan = Scan(marks)
        self._sink = sink
        self._content = _Content(sink, emit_content)
        self._in_block = False
        self._body = ""
        self._marker_ids = marks.by_id
        # Characters a text marker starts with: text outside a block that holds none of
        # them can neither contain a marker nor end with a marker's prefix.
        self._marker_starts = frozenset(m[0] for m in (syntax.call_open, syntax.call_close) if m)

    def feed(self, token_id: int, text: str) -> list[Delta]:
        if (not self._in_block and token_id not in self._marker_ids
                and self._scan.empty()):
            # Plain answer text between calls (every token of a reply without calls):
            # what _drain makes of it, without the scan: the whole text is content.
            starts = self._marker_starts
            if not any(c in starts for c in text):
                out: list[Delta] = []
                if text:
                    self._content.text(text, out)
                return out
        self._scan.push(token_id, text)
        return self._drain(False)

    def finish(self) -> list[Delta]:
        out = self._drain(True)
        if self._in_block:
            self._end_block(out, cut=True)
        self._content.finish(out)
        return out

    def _drain(self, final: bool) -> list[Delta]:
        out: list[Delta] = []
        s = self._s
        while (step := self._scan.next(
            (s.call_close,) if self._in_block else (s.call_open, s.call_close), final
        )) is not None:
            if step.text:
                if self._in_block:
                    self._body += step.text
                else:
                    self._content.text(step.text, out)
            if step.marker == s.call_open and not self._in_block:
                self._content.before_call()
                self._in_block, self._body = True, ""
            elif step.marker == s.call_close and self._in_block:
                self._end_block(out)
        return out

    def _end_block(self, out: list[Delta], cut: bool = False) -> None:
        self._in_block = False
        body, self._body = self._body.strip(), ""
        decoder = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)
        pos = 0
        while pos < len(body):
            try:
                obj, end = decoder.raw_decode(body, pos)
            except ValueError:
                if cut:
                    self._cut_call(body[pos:], out)
                return
            pos = end
            while pos < len(body) and body[pos] in " \t\r\n,":
                pos += 1
            if not isinstance(obj, dict) or not isinstance(obj.get(self._s.json_name_key), str):
                continue
            args = obj.get(self._s.json_arguments_key, {})
            if isinstance(args, str):
                try:
                    args = _loads(args)
                except ValueError:
                    pass
            start = self._sink.start(obj[self._s.json_name_key])
            if start is not None:
                out.append(start)
                out.append(ToolCallArguments(start.index, _dumps(args)))

    def _cut_call(self, text: str, out: list[Delta]) -> None:
        """A call object cut by the end of output: emitted when its name (registered)
        and its arguments value are complete JSON, else dropped."""
        s = self._s
        decoder = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)
        name = arguments = None
        pos = _skip_ws(text, 0)
        if not text.startswith("{", pos):
            return
        pos = _skip_ws(text, pos + 1)
        while pos < len(text) and (name is None or arguments is None):
            try:  # one complete key, then its value (complete or cut)
                key, pos = decoder.raw_decode(text, pos)
            except ValueError:
                break
            pos = _skip_ws(text, pos)
            if not (isinstance(key, str) and text.startswith(":", pos)):
                break
            pos = _skip_ws(text, pos + 1)
            if key == s.json_arguments_key:
                try:  # complete: re-encode compactly, like a closed block's arguments
                    value, pos = decoder.raw_decode(text, pos)
                except ValueError:
                    return  # cut inside the arguments: no call
                if isinstance(value, str):  # arguments as a JSON string, as a closed block
                    try:
                        value = _loads(value)
                    except ValueError:
                        pass
                arguments = _dumps(value)
            else:
                try:
                    value, pos = decoder.raw_decode(text, pos)
                except ValueError:
                    break
                if key == s.json_name_key and isinstance(value, str):
                    name = value
            pos = _skip_ws(text, pos)
            if text.startswith(",", pos):
                pos = _skip_ws(text, pos + 1)
        if name is None or arguments is None:
            return
        start = self._sink.start(name)
        if start is not None:
            out.append(start)
            out.append(ToolCallArguments(start.index, arguments))


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos
