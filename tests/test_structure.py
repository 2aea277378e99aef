"""The package's import graph (every module, every import, lazy and TYPE_CHECKING ones included): every module
imports, no import cycle, and the layers of prototype/__init__.py hold (lower never imports upper; protocol/ is sans-IO)."""

from __future__ import annotations

import ast
import graphlib
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

import prototype

PACKAGE = "prototype"
# Lower never imports upper (prototype/__init__.py).
LAYERS = ("protocol", "engine", "api", "designs", "server")


def module_names() -> list[str]:
    return sorted([PACKAGE, *(info.name for info in pkgutil.walk_packages(prototype.__path__, prefix=f"{PACKAGE}."))])


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def imports_of(name: str) -> tuple[set[str], set[str]]:
    """The prototype modules `name` imports anywhere in its source, and the top-level names of the others it imports
    (`from package import name` imports the submodule `name` where there is one, else the package)."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None
    package = name if spec.submodule_search_locations is not None else name.rpartition(".")[0]
    ours: set[str] = set()
    others: set[str] = set()
    for node in ast.walk(ast.parse(Path(spec.origin).read_text(encoding="utf-8"), filename=spec.origin)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            subs = [f"{module}.{alias.name}" for alias in node.names]
            targets = [sub if module.startswith(PACKAGE) and _is_module(sub) else module for sub in subs]
        else:
            continue
        for target in targets:
            if target == PACKAGE or target.startswith(f"{PACKAGE}."):
                if target != name:
                    ours.add(target)
            else:
                others.add(target.split(".")[0])
    return ours, others


def import_graph() -> dict[str, set[str]]:
    return {name: imports_of(name)[0] for name in module_names()}


def layer_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


@pytest.mark.parametrize("name", module_names())
def test_every_module_imports(name: str) -> None:
    importlib.import_module(name)


def test_no_import_cycle_in_the_package() -> None:
    graph = import_graph()
    assert "prototype.server.http" in graph["prototype.server.app"]  # relative imports are resolved
    assert "prototype.notebook" in graph["prototype.cli.figures"]  # an import inside a function counts
    assert "prototype.cli.compare" in graph["prototype.__main__"]  # `python -m prototype`'s module is in the graph
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as cycle:
        pytest.fail(f"import cycle: {cycle.args[1]}")


def test_lower_layers_never_import_upper_ones() -> None:
    def upward(name: str, target: str) -> bool:
        layer, other = layer_of(name), layer_of(target)
        return layer is not None and other is not None and LAYERS.index(other) > LAYERS.index(layer)

    assert [(name, target) for name, targets in import_graph().items() for target in targets if upward(name, target)] == []


def test_the_protocol_layer_is_sans_io() -> None:
    for name in module_names():
        if layer_of(name) == "protocol":
            assert not imports_of(name)[1] & {"trio", "trio_websocket", "socket", "h11", "asyncio"}, name
