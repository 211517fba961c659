"""The one version guard over fedweave's changes to Flower internals."""

import logging

import flwr
import pytest

from fedweave import flower_patches
from fedweave.errors import UserError


def test_the_pinned_flower_is_patchable():
    assert flwr.__version__ == flower_patches.PATCHED_FLOWER_VERSION
    assert flower_patches.tune_simulation_polling() is True


def test_another_flower_warns_once_and_runs_stock_or_refuses(monkeypatch, caplog):
    monkeypatch.setattr(flwr, "__version__", "9.9.9")
    monkeypatch.setattr(flower_patches, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="fedweave.flower_patches"):
        assert flower_patches.tune_simulation_polling() is False
        assert flower_patches.tune_simulation_polling() is False
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "stock 100 ms polls" in warnings[0]
    # SecAgg+ masks must match on every side: no silent fallback to Flower's generator
    with pytest.raises(UserError, match="SecAgg\\+ needs flwr 1.41.0 \\(installed: 9.9.9\\)"):
        flower_patches.use_fedweave_secagg_masks()
