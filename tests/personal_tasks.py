"""Digits tasks that keep layers at each site (``local_layers``, issue 35's personal head), for
``tests/test_personal_layers.py`` (``--task personal_tasks:PERSONAL`` with this folder on
``PYTHONPATH``)."""

from __future__ import annotations

from fedweave.learning.tasks.digits import DigitsTask


class PersonalDigits(DigitsTask):
    """Digits' MLP with its output layer (``4``) kept at each site: a personal head."""

    local_layers = ("4",)


class WholeModelLocal(DigitsTask):
    """A declaration that leaves nothing to share (refused)."""

    local_layers = ("0", "2", "4")


class NoSuchLayer(DigitsTask):
    """A declaration naming no module of the model (refused)."""

    local_layers = ("head",)


PERSONAL = PersonalDigits()
WHOLE = WholeModelLocal()
NO_SUCH = NoSuchLayer()
