"""Federated statistics: what sites compute together before round 1, and how.

A task that needs them (a tabular task's feature means and standard deviations, its label
frequencies) declares ``statistics_stages`` and three methods; the platform runs each stage
as one exchange with every connected site, through SecAgg+ when the run has it, so the
coordinator learns only the example-weighted mean of the sites' vectors:

- ``statistics_size(stage, known) -> int``: the length of a stage's vector;
- ``local_statistics(data, stage, known) -> np.ndarray``: a site's vector, a mean over its
  own examples (so the weighted mean across sites is the mean over everyone's examples);
- ``add_statistics(stage, mean, known) -> dict``: the coordinator turns the mean vector into
  JSON-safe values added to ``known`` (what the next stage and the sites receive);
- ``prepare(data, statistics) -> ArrayData | Dataset``: a site's data as it trains on it.

Under differential privacy nothing is gathered: the statistics are not a DP release, so a DP
run takes the task's ``declared_statistics()`` (a tabular task's public column bounds, nothing
read from any site's data) and is refused for a task that has none (``dp_statistics_problem``).

Under SecAgg+, every value of ``vector * num_examples / max_weight`` must lie within the
clipping range; a site whose vector does not refuses the stage with the reason rather than
being clipped (``bound_problem``), because a clipped statistic silently mis-scales a model.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np


def needs_statistics(task: object) -> bool:
    """Whether ``task`` asks the sites for federated statistics before round 1."""
    return bool(getattr(task, "statistics_stages", ()))


def declared_statistics(task: object) -> dict[str, Any] | None:
    """The statistics ``task`` declares without any site's data (``declared_statistics()``),
    or ``None`` when it declares none."""
    declare = getattr(task, "declared_statistics", None)
    return declare() if callable(declare) else None


def dp_statistics_problem(task: object, name: str) -> str | None:
    """Why a DP run cannot take task ``name``: it needs statistics from the sites' data and
    declares none to use instead. ``None``: it can."""
    if not needs_statistics(task) or declared_statistics(task) is not None:
        return None
    undeclared = getattr(task, "undeclared_bounds", lambda: [])()
    shown = ", ".join(undeclared[:3])
    if len(undeclared) > 3:
        shown += f" and {len(undeclared) - 3} more"
    columns = f" ({shown})" if shown else ""
    return (
        f"task '{name}' scales its features with statistics gathered from the sites' data, "
        "which differential privacy does not cover; declare public bounds on every numeric "
        f"column{columns}, Numeric(name, bounds=(low, high)), which a DP run scales with "
        "instead, or run without --dp"
    )


def encode_known(known: dict[str, Any]) -> str:
    """Statistics as they travel in a round's config (JSON text)."""
    return json.dumps(known, sort_keys=True)


def decode_known(text: str) -> dict[str, Any]:
    return json.loads(text) if text else {}


def digest(known: dict[str, Any]) -> str:
    return hashlib.sha256(encode_known(known).encode()).hexdigest()[:12]


def bound_problem(
    vector: np.ndarray, weight: float, clipping_range: float, what: str = "statistic"
) -> str | None:
    """Why SecAgg+ would clip ``vector`` (of ``what``s) sent with ``weight``
    (``num_examples / max_weight``)."""
    largest = float(np.max(np.abs(vector))) * weight if vector.size else 0.0
    if not np.all(np.isfinite(vector)):
        return f"a {what} is not finite"
    if largest > clipping_range:
        return (
            f"a {what} ({largest:.3g} after weighting) exceeds the secure-aggregation "
            f"range ±{clipping_range:g} and would be clipped"
        )
    return None


def pinned_schema(task: Any) -> dict[str, Any] | None:
    """The data schema a run pins in its stored config (a tabular task's columns, kinds,
    order, categories and classes), or ``None`` for a task without one."""
    schema = getattr(task, "schema", None)
    if schema is None or not hasattr(schema, "pinned"):
        return None
    return {**schema.pinned(), "digest": schema.digest()}


def local_only_statistics(task: Any, data: Any) -> dict[str, Any]:
    """Statistics of one site's data alone (the coordinator's own test set, to time a
    site's local work before the federation's statistics exist)."""
    known: dict[str, Any] = {}
    for stage in task.statistics_stages:
        known.update(task.add_statistics(stage, task.local_statistics(data, stage, known), known))
    return known


def prepared(task: Any, data: Any, statistics: dict[str, Any] | None) -> Any:
    """``data`` as ``task`` trains on it: prepared with ``statistics`` when the task needs
    them (its own when none were gathered), else unchanged."""
    if not needs_statistics(task):
        return data
    return task.prepare(data, statistics if statistics else local_only_statistics(task, data))
