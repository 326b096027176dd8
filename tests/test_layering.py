"""The package's dependencies point one way (``docs/architecture.md``).

Builds the import graph of ``a2trio/`` from the source, imports under
``TYPE_CHECKING`` included, and asserts it has no cycle; that every import
goes down the layers ``docs/architecture.md`` draws (:data:`LAYERS`), private
modules included; and that no module imports another module's private name.
Needs nothing outside the repository: ``pytest tests/test_layering.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "a2trio"

#: The layers of ``docs/architecture.md``, top to bottom: a module imports
#: modules of its own layer or of a lower one. A name is a top-level module
#: or subpackage of ``a2trio`` (all its modules, private ones included), or a
#: module of a subpackage drawn module by module (``engine.drain``); the
#: package itself (``a2trio/__init__.py``, the public face) may import any.
LAYERS: list[set[str]] = [
    {"__main__", "serve", "inspect", "new"},
    {"cli", "testing", "otel"},
    {"transport"},
    {"server"},
    # The engine's old paths: re-exports of the names the docs give them.
    {"drain", "session", "fanout", "actor_calls", "inspection"},
    # The engine, one layer per line (engine/__init__.py imports nothing).
    {"engine", "engine.inspection", "engine.actor_calls", "engine.gauges"},
    {"engine.actions", "engine.retention"},
    {"engine.inspection_records", "engine.crons"},
    {"engine.writes"},
    {"engine.drains"},
    {"engine.drain"},
    {"engine.runs"},
    {"engine.suspend"},
    {"engine.abort", "engine.handlers"},
    {"engine.handler_context"},
    {"engine.durable"},
    {"engine.session"},
    {"engine.presence"},
    {"engine.inputs"},
    {"engine.context"},
    {"engine.fanout", "engine.state", "engine.watchdogs", "engine.flow"},
    # The nursery, the mailbox, the outcome rules, the pacing and the app's
    # transaction: they import nothing of the engine.
    {
        "engine.background",
        "engine.mailbox",
        "engine.attempt",
        "engine.pacing",
        "engine.transaction",
    },
    {"schedulers"},
    {"push", "scheduler"},
    {"stores"},
    {"contract", "actor", "upcasting"},
    {
        "identifiers",
        "ids",
        "errors",
        "clock",
        "timings",
        "backoff",
        "telemetry",
        "metrics",
        "tuning",
        "signatures",
    },
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: set[str]) -> set[tuple[str, str]]:
    """(module imported, name) pairs; name is "" for a whole module."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update((alias.name, "") for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level > 1:
                base = base[: len(base) - (node.level - 1)]
            target = (
                ".".join([*base, node.module] if node.module else base)
                if node.level
                else node.module or ""
            )
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.add((submodule, "") if submodule in modules else (target, alias.name))
    return {(module, item) for module, item in found if module in modules}


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    private: list[str] = []
    for name, path in paths.items():
        imported = _imports(path, set(paths))
        graph[name] = {module for module, _ in imported if module != name}
        private += [
            f"{name} imports {module}.{item}"
            for module, item in imported
            if item.startswith("_") and not item.startswith("__")
        ]
    return graph, private


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    visiting: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> list[str] | None:
        if node in visiting:
            return [*visiting[visiting.index(node) :], node]
        if node in done:
            return None
        visiting.append(node)
        for child in sorted(graph[node]):
            # A package's __init__ re-exports its modules; they import siblings,
            # never the package itself, so edges into a package are not cycles.
            if node.startswith(child + "."):
                continue
            found = visit(child)
            if found is not None:
                return found
        visiting.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start)
        if found is not None:
            return found
    return None


def test_the_import_graph_has_no_cycle() -> None:
    graph, _ = _graph()
    assert "a2trio.server" in graph["a2trio.transport.server.app"]
    assert _cycle(graph) is None


def test_the_engine_parts_do_not_import_the_server() -> None:
    graph, _ = _graph()
    parts = [module for module in graph if module.startswith("a2trio.engine.")]
    for part in [*parts, "a2trio.scheduler"]:
        assert "a2trio.server" not in graph[part], part
    # The context is what every part receives: it imports none of them.
    parts_above = {f"a2trio.engine.{m}" for m in ("drain", "drains", "session", "presence")}
    assert not parts_above & graph["a2trio.engine.context"]


def _layer(module: str) -> int:
    name = module.removeprefix("a2trio.")
    top = name.split(".")[0]
    # A subpackage drawn module by module (``engine.drain``) names every one of
    # its modules, its __init__ as the subpackage; others are drawn whole.
    by_module = any(drawn.startswith(top + ".") for layer in LAYERS for drawn in layer)
    key = name if by_module else top
    for depth, layer in enumerate(LAYERS):
        if key in layer:
            return depth
    raise AssertionError(f"{module} is in no layer of LAYERS (docs/architecture.md)")


def test_every_import_goes_down_the_drawn_layers() -> None:
    graph, _ = _graph()
    upward = [
        f"{module} imports {imported}"
        for module, imports in sorted(graph.items())
        if module != "a2trio"
        for imported in sorted(imports)
        if imported != "a2trio" and _layer(imported) < _layer(module)
    ]
    assert upward == []


def test_the_layer_check_sees_an_upward_import() -> None:
    assert (
        _layer("a2trio.stores.postgres.conn")
        > _layer("a2trio.engine.context")
        > _layer("a2trio.engine.drain")
        > _layer("a2trio.server")
    )
    assert _layer("a2trio.transport.asgi") == _layer("a2trio.transport")
    # A module of the engine must be drawn by name: it has no layer otherwise.
    with pytest.raises(AssertionError, match=r"^a2trio.engine.nowhere is in no layer"):
        _layer("a2trio.engine.nowhere")


def _transport_part(module: str) -> str | None:
    """``server``, ``client``, ``codecs`` (``wire``, ``sse``) or ``face`` (the
    package and the modules kept at their first paths); None outside it."""
    parts = module.split(".")
    if parts[:2] != ["a2trio", "transport"]:
        return None
    if len(parts) > 2 and parts[2] in ("server", "client"):
        return parts[2]
    return "codecs" if len(parts) > 2 and parts[2] in ("wire", "sse") else "face"


#: What each part of the transport may import of the others.
TRANSPORT_PARTS: dict[str, set[str]] = {
    "face": {"face", "server", "client", "codecs"},
    "server": {"server", "codecs"},
    "client": {"client", "codecs"},
    "codecs": {"codecs"},
}


def test_the_transport_halves_meet_only_in_the_codecs() -> None:
    """``transport/server`` and ``transport/client`` import neither each other
    nor the package's face; ``wire`` and ``sse`` (sans-I/O) import neither."""
    graph, _ = _graph()
    crossings = [
        f"{module} imports {imported}"
        for module, imports in sorted(graph.items())
        if (part := _transport_part(module)) is not None
        for imported in sorted(imports)
        if (other := _transport_part(imported)) is not None and other not in TRANSPORT_PARTS[part]
    ]
    assert crossings == []


def test_no_module_imports_another_modules_private_name() -> None:
    _, private = _graph()
    assert private == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


#: The text modules (SQL, Lua) may be long: each statement or script is one
#: named constant, read where it is defined.
_TEXT_MODULES = {"stores/postgres/sql.py", "stores/redis/scripts.py", "stores/sqlite/sql.py"}


def test_modules_stay_a_few_hundred_lines() -> None:
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        lines = len(path.read_text().splitlines())
        most = 450 if name.startswith("engine/") else 600
        if name not in _TEXT_MODULES and lines > most:
            too_long.append(f"{name}: {lines} lines (at most {most})")
    assert not too_long, "split by concept (docs/architecture.md): " + ", ".join(too_long)
