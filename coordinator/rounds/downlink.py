"""The global model to every site at half precision (``--downlink fp16``): a grid wrapper.

Every workflow of a synchronous run (plain rounds, SecAgg+'s stages, federated and private
evaluation, the federated statistics) sends its instructions through the run's grid, and
FedBuff pushes its jobs through it. ``HalfPrecisionGrid`` rounds the model each instruction
carries (``fitins.parameters``, ``evaluateins.parameters``) with
``fedweave/downlink.halved`` and writes the mark of what it rounded
(``DOWNLINK_KEY``) into the instruction's config, just before the message leaves: the grids
it wraps (``OutcomeGrid`` counts the bytes) see the bytes that are sent. The coordinator's
own model, its aggregation, its checkpoints and its central evaluation keep the task's
precision. The instructions of one exchange share one model, so it is rounded once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flwr.common import bytes_to_ndarray

from fedweave.contract import DOWNLINK_KEY
from fedweave.downlink import halved, legacy_record, model_records


class HalfPrecisionGrid:
    """A grid that sends every model at half precision (see the module); everything else is
    the wrapped grid's.

    Parameters
    ----------
    grid : Grid
        The grid to send through (the run's ``OutcomeGrid``, which counts the bytes sent).
    """

    def __init__(self, grid: Any) -> None:
        self._grid = grid

    def send_and_receive(self, messages, *, timeout: float | None = None):  # type: ignore[no-untyped-def]
        return self._grid.send_and_receive(self.halve(messages), timeout=timeout)

    def push_messages(self, messages):  # type: ignore[no-untyped-def]
        return self._grid.push_messages(self.halve(messages))

    @staticmethod
    def halve(messages: Iterable[Any]) -> list[Any]:
        """``messages``, each model they carry rounded in place (once per distinct model)."""
        messages = list(messages)
        done: dict[tuple[int, ...], tuple[Any, str]] = {}
        for message in messages:
            content = message.content
            for arrays_name, config_name in model_records(content):
                config = content.config_records[config_name]
                if DOWNLINK_KEY in config:
                    continue  # already rounded: a content this call saw before
                record = content.array_records[arrays_name]
                if not record:
                    continue  # no model (a secure buffer's delivery): nothing to round
                key = tuple(id(array.data) for array in record.values())
                if key not in done:
                    sent, mark = halved([bytes_to_ndarray(a.data) for a in record.values()])
                    done[key] = (legacy_record(sent, record), mark)
                content.array_records[arrays_name], config[DOWNLINK_KEY] = done[key]
        return messages

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._grid, name)
