"""Bounded rendering of untrusted chat templates: Jinja2's immutable sandbox plus a time
and size budget per render.

The sandbox (`ImmutableSandboxedEnvironment`) blocks attribute escapes and mutation of
builtin containers but not denial of service: `'a' * 10**10` allocates 10 GB, `10**10**10`
never ends, `range(10**9)` raises OverflowError and `{% include %}` raises TypeError (there
is no loader). Here every way a template does work passes a budget check:

- operators (`+ - * / // % **`), calls (functions, methods, macros, `loop()`), filters,
  attribute and item lookups, every loop iteration and every output chunk check the
  render's deadline (`RenderLimits.max_seconds`);
- an operation that would create a string or sequence longer than
  `RenderLimits.max_value_items` is refused *before* it runs when its size follows from
  its arguments (`*` repetition, integer powers, padding widths such as `center(n)`,
  `replace`, `join`, printf and `str.format` field widths), and every value an operator,
  call or filter returns is measured after it runs (gradual growth through a namespace or
  macro recursion stops within one doubling);
- the rendered text is streamed and cut at `RenderLimits.max_output_chars`;
- templates that load other templates (`{% include %}`, `{% import %}`,
  `{% from ... import %}`, `{% extends %}`) are refused when compiled: a chat template is
  one self-contained text.

Each refusal raises `TemplateLimitError` naming the limit. The budget lives in a
context variable, so one compiled template renders concurrently from several threads.
"""

from __future__ import annotations

import contextvars
import math
import re
import string
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass
from functools import wraps
from typing import Any

import jinja2
import jinja2.nodes as nodes
import jinja2.runtime
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["LOADING_TAGS", "BoundedSandbox", "RenderLimits", "TemplateLimitError",
           "bound_loops", "bounded_render", "loading_tag", "measure_assigned"]

# Jinja2 node -> the tag that makes it: templates that load other templates.
LOADING_TAGS = {nodes.Include: "include", nodes.Import: "import", nodes.FromImport: "from",
                nodes.Extends: "extends"}
_MAX_POWER_BITS = 4096  # an integer power may produce at most this many bits
_PRINTF_WIDTH = re.compile(r"%[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
_DIGITS = re.compile(r"\d+")
# What Jinja2 passes to pass_context / pass_eval_context / pass_environment filters.
_PASSED = (jinja2.runtime.Context, nodes.EvalContext, jinja2.Environment)


class TemplateLimitError(jinja2.exceptions.TemplateError):
    """A render exceeded its RenderLimits (time, value size or output size)."""


@dataclass(frozen=True)
class RenderLimits:
    """The budget of one render.

    Attributes:
        max_seconds: wall-clock seconds one render may take.
        max_value_items: longest string (characters) or sequence (items) an operation of
            the template may create; inputs passed in are not limited by it.
        max_output_chars: longest rendered text, in characters.
    """

    max_seconds: float = 2.0
    max_value_items: int = 4 << 20
    max_output_chars: int = 4 << 20


@dataclass
class _Budget:
    limits: RenderLimits
    deadline: float

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(f"rendering took longer than "
                                     f"{self.limits.max_seconds:g} s")

    def items(self, n: int, what: str) -> None:
        if n > self.limits.max_value_items:
            raise TemplateLimitError(f"{what} would create {n} items; the limit is "
                                     f"{self.limits.max_value_items}")

    def measure(self, value: Any, what: str) -> Any:
        """Refuse `value` when it is longer than the limit; a list or tuple counts its items
        plus the characters of the strings it holds (one level)."""
        if isinstance(value, str | bytes | dict | set):
            self.items(len(value), what)
        elif isinstance(value, list | tuple):
            self.items(len(value) + sum(len(v) for v in value if isinstance(v, str)), what)
        return value


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("helios_template_budget",
                                                                         default=None)


def measure_assigned(value: Any) -> Any:
    """Bound a value a template stores (namespace attributes): `~` concatenation reaches
    no other hook, so a doubling string stops here within one doubling."""
    budget = _budget()
    return value if budget is None else budget.measure(value, "a namespace assignment")


def _budget() -> _Budget | None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.tick()
    return budget


def _length(value: Any) -> int:
    return len(value) if isinstance(value, Sized) and not isinstance(value, dict) else 0


def _check_int(budget: _Budget, value: Any, what: str) -> None:
    """An integer argument is a count or width somewhere: bound it like a created value."""
    if isinstance(value, int) and not isinstance(value, bool):
        budget.items(abs(value), what)


def _check_format(budget: _Budget, fmt: str, args: Iterable[Any], what: str) -> None:
    """Field widths and precisions of a printf or str.format string (and `*` widths)."""
    for match in _PRINTF_WIDTH.finditer(fmt):
        for group in match.groups():
            if group and group != "*":
                budget.items(int(group), what)
    if "{" in fmt:
        try:
            fields = list(string.Formatter().parse(fmt))
        except ValueError:
            fields = []  # str.format reports the malformed string itself
        for _, _, spec, _ in fields:
            for digits in _DIGITS.findall(spec or ""):
                budget.items(int(digits), what)
    if "*" in fmt:  # a printf width taken from the arguments
        for arg in args:
            _check_int(budget, arg, what)


def _precheck_call(budget: _Budget, obj: Any, args: tuple, kwargs: dict) -> None:
    """Sizes that follow from a call's arguments, refused before the call runs."""
    target = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format / format_map
    name = getattr(target, "__name__", "")
    owner = getattr(target, "__self__", None)
    what = f"calling {name or type(obj).__name__}()"
    for arg in (*args, *kwargs.values()):
        _check_int(budget, arg, what)
        budget.measure(arg, what)  # arguments built by `~` (macro recursion) stop here
    if isinstance(owner, str):
        if name == "join" and args and isinstance(args[0], Sized):  # never drain an iterator
            items = args[0]
            total = sum(_length(x) for x in items) + len(owner) * max(len(items) - 1, 0)
            budget.items(total, what)
        elif name == "replace" and len(args) >= 2:
            old, new = args[0], args[1]
            if isinstance(old, str) and isinstance(new, str):
                hits = owner.count(old) if old else len(owner) + 1
                budget.items(len(owner) + hits * max(len(new) - len(old), 0), what)
        elif name in ("format", "format_map"):
            _check_format(budget, owner, (*args, *kwargs.values()), what)


def _bounded_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a filter with the same checks as a call (Jinja2 calls filters directly)."""

    @wraps(fn)  # keeps jinja_pass_arg (pass_context / pass_environment)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        if budget is None:
            return fn(*args, **kwargs)
        what = f"the {name} filter"
        values = [a for a in args if not isinstance(a, _PASSED)]
        for arg in (*values[1:], *kwargs.values()):
            _check_int(budget, arg, what)
        if values and isinstance(values[0], str):
            if name == "format":
                _check_format(budget, values[0], values[1:], what)
            elif name == "replace" and len(values) >= 3:
                _precheck_call(budget, values[0].replace, tuple(values[1:3]), {})
        if name == "join" and values and isinstance(values[0], Sized):
            sep = values[1] if len(values) > 1 else kwargs.get("d", "")
            items = values[0]
            total = sum(_length(x) for x in items) + _length(sep) * max(len(items) - 1, 0)
            budget.items(total, what)
        return budget.measure(fn(*args, **kwargs), what)

    return bounded


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with every operator, call, filter and lookup budgeted.

    Outside `bounded_render` (no budget set) it behaves as the plain immutable sandbox.
    """

    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No constant folding: the optimizer would run filters such as `'x'|center(10**9)`
        # while compiling, outside any budget.
        kwargs.setdefault("optimized", False)
        super().__init__(*args, **kwargs)
        self.globals["helios_bounded_iter"] = _bounded_iter

    def bound_filters(self) -> None:
        """Wrap every registered filter; call after the last filter is registered."""
        for name, fn in list(self.filters.items()):
            self.filters[name] = _bounded_filter(name, fn)

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        if budget is None:
            return super().call_binop(context, operator, left, right)
        what = f"the {operator} operator"
        if operator == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(count, int):
                    budget.items(len(seq) * max(count, 0), what)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int):
            if abs(left) > 1 and right > 0 and right * math.log2(abs(left)) > _MAX_POWER_BITS:
                raise TemplateLimitError(f"{left} ** {right} has more than {_MAX_POWER_BITS} "
                                         "bits")
        elif operator == "+" and isinstance(left, str | list | tuple):
            budget.items(len(left) + _length(right), what)
        elif operator == "%" and isinstance(left, str):
            _check_format(budget, left, right if isinstance(right, tuple) else (right,), what)
        return budget.measure(super().call_binop(context, operator, left, right), what)

    def call(__self, __context, __obj, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget = _budget()
        if budget is None:
            return super().call(__context, __obj, *args, **kwargs)
        _precheck_call(budget, __obj, args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        return budget.measure(result, f"calling {getattr(__obj, '__name__', 'a callable')}()")

    def getattr(self, obj: Any, attribute: str) -> Any:
        _budget()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _budget()
        return super().getitem(obj, argument)


def _bounded_iter(iterable: Any) -> Iterator[Any]:
    """Every for-loop iterates through this: one deadline check per iteration."""
    for item in iterable:
        _budget()
        yield item


def loading_tag(ast: nodes.Template) -> tuple[str, int] | None:
    """(tag, line) of the first tag that loads another template, or None."""
    for node in ast.find_all(tuple(LOADING_TAGS)):
        return LOADING_TAGS[type(node)], node.lineno
    return None


def bound_loops(ast: nodes.Template) -> nodes.Template:
    """Route every for-loop's iterable through `helios_bounded_iter` (in place)."""
    for loop in ast.find_all(nodes.For):
        loop.iter = nodes.Call(nodes.Name("helios_bounded_iter", "load"), [loop.iter], [],
                               None, None, lineno=loop.lineno)
    return ast


def bounded_render(template: jinja2.Template, limits: RenderLimits, variables: dict) -> str:
    """Render `template` within `limits`.

    Raises:
        TemplateLimitError: a limit was exceeded.
        Whatever the template raises otherwise (callers turn it into ChatTemplateError).
    """
    token = _BUDGET.set(_Budget(limits, time.monotonic() + limits.max_seconds))
    try:
        out: list[str] = []
        total = 0
        for chunk in template.generate(**variables):
            total += len(chunk)
            if total > limits.max_output_chars:
                raise TemplateLimitError(f"the rendered prompt exceeds "
                                         f"{limits.max_output_chars} characters")
            out.append(chunk)
            _budget()
        return "".join(out)
    finally:
        _BUDGET.reset(token)
