"""The Python versions pyproject.toml claims are the ones tested.

- ``requires-python`` admits exactly the minor versions the classifiers list, and the pinned
  Flower admits them all (Flower 1.41 needs 3.11+: a 3.10 claim was untrue).
- The interpreter running this suite runs every test (CI: the Python the README installs
  with). For every other claimed version found on this machine (pyenv's, or ``python3.X`` on
  PATH; skipped with the reason when absent), a cached virtual environment without torch
  (torch's CPU wheel exists here for one Python only) runs the torch-free unit tests:
  SecAgg+'s masks and Shamir sharing, the Flower patches' version guard and fingerprints,
  the gossip wire protocol and the config layer.

The environments live in ``.cache/python-versions/`` (git-ignored), one per interpreter and
requirement set, built in parallel on a first run (pip, the machine's package index) and
reused afterwards; delete the folder to rebuild. They are built with uv (the dev extra) in
seconds, or with pip (about 100 s each here) where uv is missing or fails.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
CACHE = REPO / ".cache" / "python-versions"

# Unit tests whose modules import no torch, less the few cases that build a task or import
# the coordinator's strategies (torch) at run time.
TORCH_FREE_TESTS = [
    "tests/test_secagg_masks.py",
    "tests/test_secagg_crypto.py",
    "tests/test_flower_patches.py",
    "tests/test_gossip_units.py",
    "tests/test_config.py",
]
NEED_TORCH = [
    "tests/test_flower_patches.py::test_secagg_stages_wait_what_the_policy_says_and_forget_silent_sites",
    "tests/test_gossip_units.py::test_task_describe_prints_the_wire_schema_protocol_md_documents",
    "tests/test_config.py::test_the_task_declares_training_defaults_and_flags_and_files_override_them",
    "tests/test_config.py::test_flags_override_the_file_and_the_file_overrides_defaults",
    "tests/test_config.py::test_declared_choices_are_the_ones_the_modes_implement",
]
# Runtime dependencies those tests do not touch (torch and what only training, data or plots
# use); everything else in [project] dependencies and the simulation extra is installed with
# its declared range (Flower with its own simulation extra: Ray, whose engine the patches
# fingerprint).
NOT_NEEDED = {
    "torch", "flwr-datasets", "scikit-learn", "matplotlib", "pillow", "safetensors",
    "opacus",  # DP-SGD at a site (it brings torch)
}


def claimed_versions() -> list[str]:
    prefix = "Programming Language :: Python :: 3."
    return [
        "3." + c[len(prefix):]
        for c in PYPROJECT["project"].get("classifiers", [])
        if c.startswith(prefix) and c[len(prefix):].isdigit()
    ]


def requirements() -> list[str]:
    out = []
    extras = PYPROJECT["project"]["optional-dependencies"]
    # the simulation extra too: its Flower brings Ray, whose engine the patches fingerprint
    for line in [*PYPROJECT["project"]["dependencies"], *extras["simulation"]]:
        req = Requirement(line)
        if req.name.lower() in NOT_NEEDED:
            continue
        out.append(str(req))
    dev = [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["dev"]]
    out += [str(r) for r in dev if r.name in ("pytest", "pytest-timeout")]
    return out


def find_interpreter(version: str) -> Path | None:
    """pyenv's newest 3.X.Y (``$PYENV_ROOT``, default ~/.pyenv), else ``python3.X`` on PATH."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(
        (p for p in root.glob(f"{version}.*") if re.fullmatch(rf"{re.escape(version)}\.\d+", p.name)
         and (p / "bin" / "python").exists()),
        key=lambda p: int(p.name.rsplit(".", 1)[1]),
    )
    if found:
        return found[-1] / "bin" / "python"
    on_path = shutil.which(f"python{version}")
    return Path(on_path) if on_path else None


def _run(cmd: list[str], extra_env: dict[str, str] | None = None,
         **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV",
                                                          "PYTHONHOME")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", **(extra_env or {}))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, **kwargs)


# fedweave's packages from this checkout, as setuptools' package-dir maps them (an editable
# install would write build files into the checkout; this writes nothing there)
_FINDER = '''"""fedweave from the checkout {repo} (tests/test_python_versions.py)."""
import importlib.abc
import importlib.util
import os
import sys

MAPPING = {mapping!r}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        root = MAPPING.get(name)
        if root is None:
            return None
        return importlib.util.spec_from_file_location(
            name, os.path.join(root, "__init__.py"), submodule_search_locations=[root])


sys.meta_path.insert(0, _Finder())
'''


def _source_mapping() -> dict[str, str]:
    mapping = {"fedweave": str(REPO / "fedweave")}
    for package, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items():
        mapping[package] = str(REPO / folder)
    return mapping


def _built_with_uv(interpreter: Path, building: Path, reqs: list[str]) -> bool:
    """Whether uv made the environment at ``building`` with ``reqs`` (False: uv is missing or
    failed, and nothing is left at ``building``)."""
    try:
        from uv import find_uv_bin

        uv = find_uv_bin()
    except (ImportError, FileNotFoundError):
        return False
    shutil.rmtree(building, ignore_errors=True)
    # relocatable: its scripts (``bin/ray``, ``bin/flwr``...) still run once ``building`` is
    # renamed to the environment's folder (an absolute shebang would name ``building``)
    made = _run([uv, "venv", "-q", "--relocatable", "-p", str(interpreter), str(building)],
                timeout=300)
    if made.returncode == 0:
        installed = _run([uv, "pip", "install", "-q", "--python", str(building / "bin" / "python"),
                          *reqs], timeout=900)
        if installed.returncode == 0:
            return True
    shutil.rmtree(building, ignore_errors=True)
    return False


def _built_with_pip(interpreter: Path, building: Path, reqs: list[str], full: str) -> None:
    shutil.rmtree(building, ignore_errors=True)
    made = _run([str(interpreter), "-m", "venv", str(building)], timeout=300)
    if made.returncode != 0:
        raise RuntimeError(f"{interpreter} -m venv failed: {made.stderr[-1500:]}")
    installed = _run([str(building / "bin" / "python"), "-m", "pip", "install", "-q", *reqs],
                     timeout=900)
    if installed.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        raise RuntimeError(f"installing {reqs} on Python {full} failed:\n"
                           f"{installed.stdout[-3000:]}\n{installed.stderr[-3000:]}")


def build_environment(version: str) -> tuple[Path | None, str]:
    """(the environment's python, "") or (None, why not)."""
    interpreter = find_interpreter(version)
    if interpreter is None:
        return None, f"no Python {version} on this machine (pyenv or python{version} on PATH)"
    full = _run([str(interpreter), "-c", "import sys; print(sys.version.split()[0])"],
                timeout=60).stdout.strip()
    reqs = requirements()
    key = hashlib.sha256("\n".join([str(interpreter), full, *reqs]).encode()).hexdigest()[:12]
    env_dir = CACHE / f"py{version}-{key}"
    python = env_dir / "bin" / "python"
    if not python.exists():
        building = CACHE / f".building-{env_dir.name}-{os.getpid()}"
        if not _built_with_uv(interpreter, building, reqs):
            _built_with_pip(interpreter, building, reqs, full)
        try:
            building.rename(env_dir)
        except OSError:  # another run finished the same environment first
            shutil.rmtree(building, ignore_errors=True)
        for stale in CACHE.glob(f"py{version}-*"):  # built for other requirements
            if stale != env_dir:
                shutil.rmtree(stale, ignore_errors=True)
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   timeout=60).stdout.strip()
    (Path(purelib) / "_fedweave_source.py").write_text(
        _FINDER.format(repo=REPO, mapping=_source_mapping()), encoding="utf-8")
    (Path(purelib) / "_fedweave_source.pth").write_text("import _fedweave_source\n",
                                                        encoding="utf-8")
    return python, ""


def other_versions() -> list[str]:
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    return [v for v in claimed_versions() if v != running]


def run_torch_free_tests(version: str) -> tuple[str, str]:
    """Build (or reuse) the version's environment and run the torch-free tests in it:
    ("passed" or "failed" or "skipped", what to show)."""
    try:
        python, why_not = build_environment(version)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return "failed", str(exc)
    if python is None:
        return "skipped", why_not
    if _run([str(python), "-c", "import torch"], timeout=60).returncode == 0:
        return "failed", f"{python} is meant to have no torch"
    deselect = [arg for test in NEED_TORCH for arg in ("--deselect", test)]
    # no shared Ray cluster: these tests start no simulation (tests/conftest.py starts one
    # unless told; under pytest-xdist the outer session names none for it to join)
    result = _run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   *TORCH_FREE_TESTS, *deselect], cwd=REPO, timeout=900,
                  extra_env={"FEDWEAVE_TEST_PRIVATE_RAY": "1"})
    tail = (result.stdout + result.stderr)[-4000:]
    summary = tail.strip().splitlines()[-1] if tail.strip() else ""
    if result.returncode or not re.search(r"\d+ passed", summary) or "skipped" in summary:
        return "failed", f"Python {version} ({python}):\n{tail}"
    return "passed", summary


@cache
def outcomes() -> dict[str, tuple[str, str]]:
    """Every other claimed version, built and tested in parallel (the builds mostly wait)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    versions = other_versions()
    with ThreadPoolExecutor(max_workers=max(1, len(versions))) as pool:
        return dict(zip(versions, pool.map(run_torch_free_tests, versions)))


def test_requires_python_is_exactly_the_classified_versions():
    claimed = claimed_versions()
    assert claimed, "pyproject.toml lists no 'Programming Language :: Python :: 3.X' classifier"
    spec = SpecifierSet(PYPROJECT["project"]["requires-python"])
    minors = [Version(v) for v in claimed]
    assert minors == sorted(minors) and all(
        b.minor == a.minor + 1 for a, b in zip(minors, minors[1:])), "a gap in the classifiers"
    for v in minors:
        assert f"{v}.0" in spec, f"requires-python {spec} refuses the classified {v}"
    below, above = f"3.{minors[0].minor - 1}.99", f"3.{minors[-1].minor + 1}.0"
    assert below not in spec, f"requires-python {spec} admits untested Python {below}"
    assert above not in spec, f"requires-python {spec} admits untested Python {above}"
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert running in claimed, f"this suite runs on Python {running}, which is not claimed"


def test_the_pinned_flower_supports_every_claimed_version():
    from importlib.metadata import metadata

    flower_spec = SpecifierSet(metadata("flwr")["Requires-Python"] or "")
    for version in claimed_versions():
        assert f"{version}.0" in flower_spec, f"flwr needs Python {flower_spec}, not {version}"


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("version", other_versions())
def test_torch_free_unit_tests_pass_on_every_claimed_version(version):
    outcome, shown = outcomes()[version]
    if outcome == "skipped":
        pytest.skip(shown)
    assert outcome == "passed", shown
    print(f"Python {version}: {shown}")


def test_vermin_holds_the_code_to_the_lowest_claimed_version():
    """The README's one test command is what .ci/run runs, and it runs vermin aimed at the
    floor of requires-python."""

    def vermin_lines(text: str) -> list[str]:
        return [line.split("#")[0].strip() for line in text.splitlines()
                if line.strip().startswith("vermin ")]

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    test_section = readme[readme.index("## Test\n"):readme.index("## Tour\n")]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "```bash\nscripts/test\n```" in test_section, "the README's test command moved"
    assert ci.rstrip().splitlines()[-1] == "scripts/test", "CI must end with the test command"
    lines = vermin_lines((REPO / "scripts" / "test").read_text(encoding="utf-8"))
    assert len(lines) == 1, lines
    assert f"--target={claimed_versions()[0]}-" in lines[0].split(), lines[0]
