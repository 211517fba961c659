"""The distribution installs one import name, ``fedweave``; the repository's mode folders
(client/, coordinator/, gossip/, simulations/) land inside it."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_wheel_provides_only_the_fedweave_import_name(tmp_path):
    # build from a copy: setuptools' build/ directory keeps files a checkout no longer has
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", "tests", "bench"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), "-q"],
        capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("fedweave-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/RECORD"))
    assert zipfile.ZipFile(wheel).read(f"{info}/top_level.txt").split() == [b"fedweave"]
    assert {n.split("/")[0] for n in names} == {"fedweave", info}
    # the light install (issue 22): the base requirements carry no Ray, flwr-datasets,
    # Hugging Face datasets or pyarrow; the simulation extra does
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    requires = [line.split(":", 1)[1].strip().lower() for line in metadata.splitlines()
                if line.startswith("Requires-Dist:")]  # fmt: skip
    base = [r for r in requires if "extra ==" not in r]
    assert "flwr==1.42.0" in base
    for heavy in ("ray", "flwr-datasets", "datasets", "pyarrow", "flwr[simulation]"):
        assert not [r for r in base if r.startswith(heavy)], (heavy, base)
    simulation = [r.split(";")[0] for r in requires if "extra == \"simulation\"" in r]
    assert sorted(simulation) == ["flwr-datasets<0.7,>=0.6.1", "flwr[simulation]==1.42.0"]
    for module in ("fedweave/client/site_app.py", "fedweave/coordinator/command/supervisor.py",
                   "fedweave/gossip/peer.py", "fedweave/gossip/PROTOCOL.md",
                   "fedweave/simulations/partition.py", "fedweave/learning/training.py",
                   "fedweave/history/migrations/versions/0001_initial_schema.py"):
        assert module in names, module


def test_public_task_api_and_module_entry_points():
    probe = (
        "import sys; from fedweave import ArrayData, ClassificationTask, Task, TrainConfig; "
        "import fedweave.gossip, fedweave.client, fedweave.coordinator, fedweave.simulations; "
        "print(ClassificationTask.__module__)"
    )
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           timeout=120, cwd="/")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "fedweave.learning.tasks.classification"
    peer_help = subprocess.run([sys.executable, "-m", "fedweave.gossip", "--help"],
                               capture_output=True, text=True, timeout=120, cwd="/")
    assert peer_help.returncode == 0 and "--listen" in peer_help.stdout


def test_import_fedweave_stays_light():
    probe = ("import sys, fedweave, fedweave.cli; "
             "print('torch' in sys.modules, 'flwr' in sys.modules)")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           timeout=120)
    assert shown.stdout.split() == ["False", "False"], shown.stderr


MODES = ("client", "coordinator", "gossip", "simulations")


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level?) for every import in ``path``."""
    import ast

    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, id(node) in top))
        elif isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
    return found


def _mode(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "fedweave" and parts[1] in MODES else None


def test_import_arrows():
    """coordinator → core ← gossip, client → core, simulations → all; the core imports no
    mode at module level; no mode imports another (only the simulations use them all)."""
    for path in (REPO / "fedweave").rglob("*.py"):
        for module, top_level in _imports(path):
            assert not (top_level and _mode(module)), f"{path} imports {module}"
    for mode in ("client", "coordinator", "gossip"):
        for path in (REPO / mode).rglob("*.py"):
            for module, _ in _imports(path):
                assert _mode(module) in (None, mode), f"{path} imports {module}"


def test_importing_any_fedweave_module_leaves_the_environment_alone():
    """No import with side effects: importing each fedweave module (its dependencies imported
    first, since flwr and scikit-learn set variables of their own) changes no environment
    variable; the entry point (``fedweave.cli.main``) and the simulation set Flower's offline
    settings when they run."""
    code = """
import importlib, os, pkgutil
import flwr.server, sklearn, torch  # what the dependencies set when imported is theirs
import fedweave
before, changed = dict(os.environ), {}
for info in pkgutil.walk_packages(fedweave.__path__, "fedweave."):
    if info.name.endswith("__main__"):
        continue
    importlib.import_module(info.name)
    now = dict(os.environ)
    if now != before:
        changed[info.name] = sorted(set(now.items()) ^ set(before.items()))
        before = now
print(changed)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLWR_", "RAY_"))}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "{}", done.stdout


THROUGH_AN_EXTRA_BY_DESIGN = {"ray": "flwr[simulation]", "datasets": "flwr-datasets"}
"""Distributions fedweave imports that come only through a declared dependency of an extra."""


def test_every_distribution_fedweave_imports_is_declared():
    """Each third-party module the package's code imports comes from a distribution that
    pyproject names, in the base install or an extra: not one that only happens to arrive
    with Flower (starlette, uvicorn, anyio and httpx did), which a Flower release could drop."""
    import ast
    import importlib.metadata
    import re

    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + [
        r for extra in project["optional-dependencies"].values() for r in extra
    ]

    def canonical(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    declared = {canonical(re.split(r"[\[<>=!~;\s]", r, maxsplit=1)[0]) for r in wanted}
    distributions = importlib.metadata.packages_distributions()
    imported: dict[str, set[str]] = {}
    for folder in ("fedweave", "client", "coordinator", "gossip", "simulations"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top != "fedweave" and top not in sys.stdlib_module_names:
                        imported.setdefault(top, set()).add(str(path.relative_to(REPO)))
    undeclared = {
        top: sorted(where)[:2] for top, where in imported.items()
        if top not in THROUGH_AN_EXTRA_BY_DESIGN
        and not {canonical(d) for d in distributions.get(top, [top])} & declared
    }  # fmt: skip
    assert not undeclared, f"imported, not in pyproject.toml: {undeclared}"
