"""Check the import graph of the workspace packages: no cycle, no upward import, and a
reason beside every import inside a function.

    uv run python scripts/check_imports.py [ROOT]     (ROOT: the repository, default ..)

Reads every `.py` file under `packages/*/src/` with `ast` (nothing is imported) and
prints one line per finding, then exits 1 if there was any (0 otherwise):

- `cycle: a -> b -> a`: helios-serve modules that import each other, directly or
  through others (a strongly connected component of its import graph);
- `upward: a imports b (floor X below floor Y)`: an import that runs up a floor;
- `no floor: a`: a helios-serve module that no floor below names (add it to FLOORS);
- `unexplained: path:line imports b inside a function`: an import inside a function
  (of any module, the standard library's included) without a comment on its line or the
  line above, or on an import right before it in one block, saying why (a process boundary, an optional dependency, start-up time);
  move it to the top otherwise. Checked in REASONED's packages.

Every import counts, wherever it stands (inside a function, under `TYPE_CHECKING`): an
arrow hidden in a function is still an arrow.

Floors, lowest first. Across packages (PACKAGE_FLOORS): helios_contract <
helios_tools < {helios_ignition, helios_serve}; a package imports only lower floors, so
ignition and serve never import each other. Inside helios-serve (FLOORS, by the longest
module prefix that names a module; a module imports its own floor or lower ones):

    0 base       clock, config, startup, metrics, liveness, engine (the plan's data-only
                 types), testing.tokenizer
    1 host       frontend, scheduler, speculation, runtime (host logic over plain data;
                 the runtime loads and executes the model)
    2 requests   events, handle, wire (the request and event types every side shares,
                 the engine handle, the engine-process channel's messages)
    3 worker     worker, worker_host, bootstrap, loading, testing (the model worker, its
                 one assembly and in-process handle, what loads it from a core; the
                 test backends)
    4 engine     engine_process, engine_client (the two sides of the engine process)
    5 http       http, responses (the HTTP API; the Responses API's schema, conversation,
                 presenter and store)
    6 server     server, testing.harness (a Server around a test backend)
    7 cli        cli, __main__, ray (helios-serve-ray: replicas on Ray Serve)
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE_FLOORS = {"helios_contract": 0, "helios_tools": 1, "helios_ignition": 2,
                  "helios_serve": 2}  # fmt: skip

# helios-serve's floors: (floor, name, module prefixes relative to helios_serve).
FLOORS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (0, "base", ("clock", "config", "startup", "metrics", "liveness", "engine",
                  "testing.tokenizer")),
    (1, "host", ("frontend", "scheduler", "speculation", "runtime")),
    (2, "requests", ("events", "handle", "wire")),
    (3, "worker", ("worker", "worker_host", "bootstrap", "loading", "testing")),
    (4, "engine", ("engine_process", "engine_client")),
    (5, "http", ("http", "responses")),
    (6, "server", ("server", "testing.harness")),
    (7, "cli", ("cli", "__main__", "ray")),
)
LAYERED = "helios_serve"  # the package with floors inside, checked for cycles
# The packages whose imports inside functions must say why (all four).
REASONED = ("helios_contract", "helios_tools", "helios_ignition", "helios_serve")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module (dotted)
    target: str  # the imported module (dotted; a workspace module)
    path: Path
    line: int
    nested: bool  # inside a function
    explained: bool  # a comment on its line or the line above


def modules(root: Path) -> dict[str, Path]:
    """Every workspace module under packages/*/src: dotted name -> file."""
    found: dict[str, Path] = {}
    for src in sorted(root.glob("packages/*/src")):
        for path in sorted(src.rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if parts and parts[0] in PACKAGE_FLOORS and "_gen" not in parts:
                found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[Import]:
    """The workspace modules `name` (at `path`) imports, one Import per arrow."""
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text, str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def commented(node: ast.stmt) -> bool:
        here = lines[node.lineno - 1]
        above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
        return "#" in here or above.startswith("#")

    def visit(node: ast.AST, nested: bool) -> Iterator[Import]:
        grouped = False  # the previous statement was an explained import (one block)
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import | ast.ImportFrom):
                grouped = grouped or commented(child)
                yield from statement(child, nested, grouped)
            else:
                grouped = False
                yield from visit(child, inner)

    def statement(child: ast.Import | ast.ImportFrom, nested: bool,
                  explained: bool) -> Iterator[Import]:
        if isinstance(child, ast.Import):
            for alias in child.names:
                yield from arrow(child, alias.name, nested, explained)
            return
        base = child.module or ""
        if child.level:
            up = package.split(".")
            up = up[: len(up) - (child.level - 1)]
            base = ".".join(up + ([base] if base else []))
        for alias in child.names:
            full = f"{base}.{alias.name}"
            yield from arrow(child, full if full in known else base, nested, explained)

    def arrow(node: ast.stmt, target: str, nested: bool, explained: bool) -> Iterator[Import]:
        outside = target
        while target and target not in known:  # a name inside a module: the module
            target = target.rpartition(".")[0]
        if not target:  # not a workspace module: only where it is imported matters
            if nested:
                yield Import(name, outside, path, node.lineno, nested, explained)
        elif target != name:
            yield Import(name, target, path, node.lineno, nested, explained)

    yield from visit(tree, False)


def serve_floor(module: str) -> tuple[int, str] | None:
    """The floor (number, name) of a helios_serve module, by its longest named prefix."""
    rest = module[len(LAYERED) + 1:] if module != LAYERED else ""
    best: tuple[int, int, str] | None = None
    for floor, label, prefixes in FLOORS:
        for prefix in prefixes:
            if rest == prefix or rest.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), floor, label)
    return None if best is None else (best[1], best[2])


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a
    cycle through its members (sorted, so the findings are stable)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_walk(sorted(component), edges))

    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
    for v in sorted(edges):
        if v not in index:
            connect(v)
    return sorted(found)


def _walk(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A closed path from the component's first module back to it (breadth first)."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges.get(v, set()) & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    return [*component, start]  # unreachable for a strongly connected component


def check(root: Path) -> list[str]:
    """Every finding for the workspace at `root`, one line each."""
    known = modules(root)
    found: list[str] = []
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        for arrow in imports(name, path, known):
            src_pkg, dst_pkg = arrow.source.split(".")[0], arrow.target.split(".")[0]
            where = f"{path.relative_to(root)}:{arrow.line}"
            if arrow.nested and not arrow.explained and src_pkg in REASONED:
                found.append(f"unexplained: {where} imports {arrow.target} inside a function")
            if dst_pkg not in PACKAGE_FLOORS:
                continue
            if src_pkg != dst_pkg:
                if PACKAGE_FLOORS[dst_pkg] >= PACKAGE_FLOORS[src_pkg]:
                    found.append(f"upward: {arrow.source} imports {arrow.target} ({src_pkg} may "
                                 f"not import {dst_pkg}) at {where}")
                continue
            if src_pkg != LAYERED:
                continue
            edges.setdefault(arrow.source, set()).add(arrow.target)
            if src_pkg == LAYERED:
                src, dst = serve_floor(arrow.source), serve_floor(arrow.target)
                if src is not None and dst is not None and dst[0] > src[0]:
                    found.append(f"upward: {arrow.source} imports {arrow.target} (floor "
                                 f"{src[1]} below floor {dst[1]}) at {where}")
    for name in known:
        if name.split(".")[0] == LAYERED and name != LAYERED and serve_floor(name) is None:
            found.append(f"no floor: {name}")
    for cycle in cycles(edges):
        found.append("cycle: " + " -> ".join(cycle))
    return list(dict.fromkeys(found))  # one line per finding (`from m import a, b`: one)


def main(argv: Iterable[str] = ()) -> int:
    args = list(argv)
    root = Path(args[0]) if args else Path(__file__).resolve().parents[1]
    found = check(root)
    for line in found:
        print(line)
    if found:
        print(f"check_imports: {len(found)} findings", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
