"""The import graph of the two packages: no cycle, and the ring knows nothing of the monitor.

Read from the source (every ``import``, function-level ones included), so an
import hidden inside a function to dodge a cycle counts as what it is.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sampler", "ringbuf")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports (``from pkg import name``: the
    module ``pkg.name`` where there is one, else ``pkg``)."""
    known = modules()

    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {owner(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in known else owner(node.module))
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_through_others() -> None:
    assert cycles(import_graph()) == []


def test_the_ring_imports_nothing_of_the_monitor() -> None:
    graph = import_graph()
    assert {
        m: sorted(t)
        for m, t in graph.items()
        if m.startswith("ringbuf") and any(x.startswith("sampler") for x in t)
    } == {}


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


LAYERS: tuple[tuple[str, ...], ...] = (
    ("sampler", "sampler.__main__", "sampler.commands"),
    ("sampler.integrations",),
    ("sampler.api",),
    ("sampler.views",),
    ("sampler.analysis",),
    ("sampler.supervision",),
    ("sampler.pipeline", "sampler.child"),
    ("sampler.signals",),
    ("sampler.store", "sampler.prometheus", "sampler.postmortems"),
    ("sampler.ipc",),
    ("sampler.collectors",),
    ("sampler.settings",),
    ("sampler.catalogue",),
    ("sampler.util",),
    ("ringbuf",),
)
"""The folders along the data path, the public face on top: a module may import
its own layer and those below it, never one above."""


def layer_of(module: str) -> int:
    """The index in ``LAYERS`` of the longest prefix naming ``module``'s folder."""
    best, depth = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            deeper = prefix.count(".") > depth
            if (module == prefix or module.startswith(prefix + ".")) and deeper:
                best, depth = index, prefix.count(".")
    assert best >= 0, f"{module} is in no layer: add its folder to LAYERS"
    return best


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if layer_of(target) < layer_of(module)
    )


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    assert upward_imports(import_graph()) == []


def test_an_upward_import_is_found() -> None:
    graph = {"sampler.collectors.host": {"sampler.api.monitor"}, "sampler.api.monitor": {"ringbuf"}}
    assert upward_imports(graph) == ["sampler.collectors.host -> sampler.api.monitor"]


def test_every_folder_is_in_a_layer() -> None:
    for module in import_graph():
        layer_of(module)
