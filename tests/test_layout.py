"""The import graph keeps the layout's arrows (docs/architecture.md, DESIGN.md: Layout).

Read from the source with ``ast`` (nothing is imported: no torch, no Flower), so it runs in a
second. Every import that runs counts, at module level or inside a function (a function-local
import that closes a cycle still ties the two modules together for whoever reads or moves
them), and so does ``importlib.import_module("fedweave....")`` with a literal name. Only
imports under ``if TYPE_CHECKING:`` are left out: they never run, they name a type.

Checked:

- no cycle among modules;
- no cycle among packages (``fedweave.config`` ↔ ``fedweave.history`` was one), where each of
  the core's loose modules (``fedweave/errors.py``, ``fedweave/cli.py``, ...) counts on its own;
- pyproject.toml installs every package there is (``[tool.setuptools] packages`` is a list
  a new subpackage must join, or the wheel ships without it);
- nothing in the core or in a mode (``fedweave``, ``coordinator/``, ``client/``, ``gossip/``)
  imports ``fedweave.simulations`` or ``bench``: simulations import everything, nothing
  imports them, but for ``fedweave/cli.py``, the one command, which mounts ``fedweave
  simulate`` (lazily, as it mounts every mode's command);
- only ``fedweave/flower_patches/`` imports what Flower does not export: every other module
  takes from Flower only the names its public packages list (``FLOWER_PUBLIC``, each
  package's ``__all__`` read from the installed Flower's source), so that when Flower moves,
  that one folder (its version guard and fingerprints) says what broke.

Run ``python tests/test_layout.py`` to print the graph's cycles (none) and its package arrows.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import tomli

ROOT = Path(__file__).resolve().parent.parent

FOLDERS = {
    "fedweave": ROOT / "fedweave",
    "fedweave.client": ROOT / "client",
    "fedweave.coordinator": ROOT / "coordinator",
    "fedweave.gossip": ROOT / "gossip",
    "fedweave.simulations": ROOT / "simulations",
}
"""Import name → folder, as pyproject.toml's ``[tool.setuptools.package-dir]`` installs them."""

DISPATCHER = "fedweave.cli"
"""The one command: it mounts every mode's subcommand, ``fedweave simulate`` included."""

ALLOWED_MODULE_CYCLES: list[tuple[str, ...]] = []
"""Module cycles left on purpose, each with its reason (none today)."""

ALLOWED_PACKAGE_CYCLES: list[tuple[str, ...]] = []
"""Package cycles left on purpose, each with its reason (none today)."""


GUARDED_FLOWER_USES = "fedweave.flower_patches"
"""The one package that may import Flower's unexported modules and names (behind its version
guard, each one fingerprinted: ``fedweave/flower_patches/fingerprints.py``)."""

FLOWER_PUBLIC: dict[str, str] = {
    "flwr.app": "the Message API: Message, the records, Context, MessageType, Error",
    "flwr.common": "the legacy API's types (FitIns, Parameters, Code, ...) and conversions",
    "flwr.client": "ClientApp, NumPyClient",
    "flwr.client.mod": "Flower's own mods: SecAgg+, fixed clipping, local DP",
    "flwr.server": "ServerApp, Grid, LegacyContext, ServerConfig, the client managers",
    "flwr.server.strategy": "the legacy strategies fedweave wraps (FedAvg, ...)",
    "flwr.server.workflow": "DefaultWorkflow, SecAggPlusWorkflow",
    "flwr.simulation": "run_simulation (fedweave simulate)",
    "flwr.serverapp": "the privacy accountant (RdpAccountant, PrivacyConfig, its events)",
}
"""Flower packages a module outside ``GUARDED_FLOWER_USES`` may import from → what fedweave
takes there; of each, only the names its ``__init__`` lists in ``__all__`` (Flower's
documented API). Anything else goes through a module of ``fedweave/flower_patches/``."""


def modules() -> dict[str, Path]:
    """Every module of the installed import names: dotted name → file."""
    found: dict[str, Path] = {}
    for name, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if any(part in ("migrations", "__pycache__") for part in parts):
                continue  # Alembic's scripts: loaded by Alembic from files, never imported
            if name == "fedweave" and parts[0] in ("client", "coordinator", "gossip"):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((name, *parts))] = path
    return found


def _imported(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """Every name ``module`` imports (absolute), candidates included (``from a import b``
    yields ``a.b`` and ``a``: the caller keeps what is a module)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in _walk_running(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            yield source
            for alias in node.names:
                yield f"{source}.{alias.name}"
        elif isinstance(node, ast.Call) and _is_import_module_call(node):
            yield node.args[0].value  # type: ignore[attr-defined]


def _walk_running(tree: ast.AST) -> Iterator[ast.AST]:
    """``ast.walk`` without the bodies of ``if TYPE_CHECKING:``."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _is_type_checking(test: ast.expr) -> bool:
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", "")
    return name == "TYPE_CHECKING"


def _is_import_module_call(node: ast.Call) -> bool:
    """``importlib.import_module("fedweave.x")`` with a literal name."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return (
        name == "import_module"
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


def import_graph() -> dict[str, set[str]]:
    """Module → the project modules it imports (a package's ``__init__`` stands for it)."""
    found = modules()
    graph: dict[str, set[str]] = {}
    for module, path in found.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        targets = set()
        for name in _imported(tree, module, path.name == "__init__.py"):
            if name in found and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def package_of(module: str, graph: dict[str, set[str]]) -> str:
    """The package a module belongs to; the core's loose modules stand for themselves, and so
    does a ``__main__`` (an entry point: ``python -m fedweave.gossip`` runs the CLI, nothing
    imports it)."""
    if module.endswith(".__main__") or any(other.startswith(module + ".") for other in graph):
        return module  # a package's __init__
    parent = module.rpartition(".")[0]
    return module if parent == "fedweave" else parent


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = package_of(module, graph)
        out.setdefault(source, set())
        for target in targets:
            dest = package_of(target, graph)
            if dest != source and not source.startswith(dest + "."):
                out[source].add(dest)  # a subpackage importing its parent is no cycle
    return out


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Every strongly connected component of more than one node (Tarjan), each as one cycle
    through its members, sorted so the message is stable."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(_one_cycle(graph, set(c)) for c in components)


def _one_cycle(graph: dict[str, set[str]], members: set[str]) -> tuple[str, ...]:
    """A shortest cycle through the component's smallest member, for the message."""
    start = min(members)
    paths = {start: (start,)}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for target in sorted(graph[node] & members):
                if target == start:
                    return (*paths[node], start)
                if target not in paths:
                    paths[target] = (*paths[node], target)
                    nxt.append(target)
        frontier = nxt
    return tuple(sorted(members))


def _shown(found: list[tuple[str, ...]]) -> str:
    return "\n".join(" -> ".join(cycle) for cycle in found)


def test_no_module_cycle() -> None:
    found = [c for c in cycles(import_graph()) if c not in ALLOWED_MODULE_CYCLES]
    assert not found, "import cycles among modules:\n" + _shown(found)


def test_no_package_cycle() -> None:
    found = [c for c in cycles(package_graph(import_graph())) if c not in ALLOWED_PACKAGE_CYCLES]
    assert not found, "import cycles among packages:\n" + _shown(found)


def test_nothing_imports_simulations_or_bench() -> None:
    graph = import_graph()
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if not module.startswith("fedweave.simulations") and module != DISPATCHER
        for target in targets
        if target.startswith("fedweave.simulations")
    )
    for module, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        wrong += [
            f"{module} imports {name}"
            for name in _imported(tree, module, path.name == "__init__.py")
            if name == "bench" or name.startswith("bench.")
        ]
    assert not wrong, "only simulations/ (and tests, bench) may import these:\n" + "\n".join(wrong)


def flower_exports(package: str) -> set[str] | None:
    """The names ``package`` (installed Flower) lists in its ``__init__``'s ``__all__``, read
    with ``ast`` (Flower is located, not imported); None without such a package or list."""
    import importlib.util

    spec = importlib.util.find_spec("flwr")  # a top-level name: found, not executed
    if spec is None or not spec.submodule_search_locations:
        return None
    init = Path(spec.submodule_search_locations[0], *package.split(".")[1:], "__init__.py")
    if not init.is_file():
        return None
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return None


def flower_imports(tree: ast.AST) -> Iterator[tuple[str, str | None, str]]:
    """Every import of Flower in ``tree`` (``TYPE_CHECKING`` blocks included: a type named
    there breaks as surely when Flower moves) as (module, name or None, the import as
    written)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "flwr" or alias.name.startswith("flwr."):
                    yield alias.name, None, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module == "flwr" or node.module.startswith("flwr."):
                for alias in node.names:
                    yield node.module, alias.name, f"from {node.module} import {alias.name}"
        elif isinstance(node, ast.Call) and _is_import_module_call(node):
            name = node.args[0].value  # type: ignore[attr-defined]
            if name == "flwr" or name.startswith("flwr."):
                yield name, None, f"import_module({name!r})"


def unguarded_flower_uses() -> list[str]:
    """Each import of Flower outside ``GUARDED_FLOWER_USES`` that is not public API."""
    exports = {package: flower_exports(package) for package in FLOWER_PUBLIC}
    wrong = []
    for module, path in modules().items():
        if module == GUARDED_FLOWER_USES or module.startswith(GUARDED_FLOWER_USES + "."):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for source, name, written in flower_imports(tree):
            public = exports.get(source)
            if public is None or (name is not None and name not in public):
                wrong.append(f"{module}: {written}")
    return sorted(wrong)


def test_only_flower_patches_imports_what_flower_does_not_export() -> None:
    for package in FLOWER_PUBLIC:  # the allow-list reads real packages, or it allows nothing
        assert flower_exports(package), f"{package}: no such Flower package with an __all__"
    wrong = unguarded_flower_uses()
    assert not wrong, (
        "Flower names that Flower does not export, imported outside fedweave/flower_patches/ "
        "(move each behind the version guard there, fingerprinted; or, if it is public API, "
        "add its package to FLOWER_PUBLIC):\n" + "\n".join(wrong)
    )


def test_flower_check_sees_the_imports() -> None:
    """The check above would pass on a project that imports no Flower: make sure it reads
    the real imports, and would refuse an unexported one."""
    seen = [
        use
        for path in modules().values()
        for use in flower_imports(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert len(seen) > 50
    assert ("flwr.compat.common.recorddict_compat", "fitres_to_recorddict",
            "from flwr.compat.common.recorddict_compat import fitres_to_recorddict") in seen
    exports = flower_exports("flwr.common")
    assert exports and "FitIns" in exports and "serde" not in exports
    sample = ast.parse("from flwr.common import serde\nimport flwr.proto.control_pb2\n")
    assert [written for *_, written in flower_imports(sample)] == [
        "from flwr.common import serde", "import flwr.proto.control_pb2"
    ]


def test_pyproject_installs_every_package() -> None:
    setuptools = tomli.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]
    mapped = {name: ROOT / folder for name, folder in setuptools["package-dir"].items()}
    assert mapped == {name: folder for name, folder in FOLDERS.items() if name != "fedweave"}
    packages = {name for name, path in modules().items() if path.name == "__init__.py"}
    assert sorted(packages - set(setuptools["packages"])) == [], "add to pyproject.toml"
    assert sorted(set(setuptools["packages"]) - packages) == [], "no such package"


def test_graph_sees_the_project() -> None:
    """The checks above would pass on an empty graph: make sure it is the real one."""
    graph = import_graph()
    assert "fedweave.coordinator" in graph and "fedweave.learning.task" in graph
    assert "fedweave.errors" in graph["fedweave.learning.task"]
    assert sum(len(targets) for targets in graph.values()) > 300


if __name__ == "__main__":
    graph = import_graph()
    packages = package_graph(graph)
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports")
    print("module cycles:", _shown(cycles(graph)) or "none", sep="\n")
    print("package cycles:", _shown(cycles(packages)) or "none", sep="\n")
    print("Flower imports outside fedweave/flower_patches/ that Flower does not export:",
          "\n".join(unguarded_flower_uses()) or "none", sep="\n")  # fmt: skip
    if "--packages" in sys.argv:
        for source in sorted(packages):
            print(f"{source} -> {', '.join(sorted(packages[source])) or '-'}")
