"""Flower's unexported names that fedweave uses as they are (``fedweave/flower_patches/``
``message_records``, ``default_workflow``, ``control_api``) refuse, in one line, where they
are not flwr 1.42.0's as released. ``tests/test_layout.py`` keeps every other module to
Flower's exported API; ``tests/test_flower_patches.py`` checks their fingerprints."""

import importlib
import sys

import flwr
import pytest

from fedweave import flower_patches
from fedweave.errors import UserError
from fedweave.flower_patches import fingerprints

GUARDED = ("message_records", "default_workflow", "control_api")


def test_each_use_is_fingerprinted_and_trusted_on_the_pinned_flower():
    assert set(GUARDED) == set(flower_patches.INTERNAL_USES)
    for name in GUARDED:
        assert fingerprints.WRAPPED[name], name
    assert flower_patches.internal_use_problem() is None


def test_another_flower_refuses_each_use_in_one_line(monkeypatch):
    monkeypatch.setattr(flwr, "__version__", "1.43.0")
    monkeypatch.setattr(flower_patches, "_relied_on", set())
    for name in GUARDED:
        line = flower_patches.internal_use_problem(name)
        assert line is not None and "\n" not in line and f"'{name}'" in line
        assert line.startswith("fedweave needs flwr 1.42.0 (installed: 1.43.0): ")
        assert line.endswith("install flwr==1.42.0")
    assert "registers site keys" in flower_patches.internal_use_problem("control_api")


def test_an_altered_flower_function_is_named_and_its_module_refuses_to_import(monkeypatch):
    ref = "flwr.cli.build:build_fab_from_files"
    monkeypatch.setitem(fingerprints.WRAPPED, "control_api", {ref: "0" * 16})
    monkeypatch.setattr(flower_patches, "_relied_on", set())
    line = flower_patches.internal_use_problem()
    assert line is not None and ref in line and "reinstall flwr==1.42.0" in line
    module = "fedweave.flower_patches.control_api"
    monkeypatch.delitem(sys.modules, module, raising=False)  # restored after the test
    with pytest.raises(UserError, match="build_fab_from_files differ here"):
        importlib.import_module(module)
