"""Accuracy and loss per round for one or more runs, in one PNG.

Gossip runs have one curve per peer; the plot shows their mean per round (with the
min-max band shaded) so federated and gossip runs of the same task compare directly.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedweave.history.metrics import metric_names, qualified, recorded_headline, round_metrics
from fedweave.history.store_errors import HistoryError


@dataclass
class Curve:
    """One metric of one run: per round, the mean over actors and the min/max band."""

    rounds: list[int]
    mean: list[float]
    low: list[float]
    high: list[float]


def mean_per_round(rows: list[dict[str, Any]], key: str) -> Curve:
    """Average ``key`` over actors per round; skip missing values. ``key`` is a round column
    (``"eval_accuracy"``) or a qualified metric (``"federated.auc"``, ``metrics.py``)."""
    by_round: dict[int, list[float]] = defaultdict(list)
    for row in rows:
        value = row.get(key) if key in row else round_metrics(row).get(key)
        if value is not None:
            by_round[row["round"]].append(float(value))
    rounds = sorted(by_round)
    return Curve(
        rounds=rounds,
        mean=[sum(by_round[r]) / len(by_round[r]) for r in rounds],
        low=[min(by_round[r]) for r in rounds],
        high=[max(by_round[r]) for r in rounds],
    )


Panel = tuple[str, list[tuple[str, Curve]]]
"""A panel's title and its (legend label, curve) pairs."""


def plot_runs(
    runs: list[tuple[str, list[dict[str, Any]]]], out: Path, metrics: list[str] | None = None
) -> Path:
    """Draw eval accuracy (left) and eval loss (right) per round for each (label, rounds),
    the runs' own headline metric in accuracy's place when none has accuracy (a
    regression's MAE: ``metrics.recorded_headline``), or one panel per metric of ``metrics``
    (names as ``metrics.qualified`` takes them).

    Raises ``HistoryError`` when no run has any evaluated round (nothing to draw), or no run
    recorded one of ``metrics`` (naming the metrics they did record).
    """
    if metrics:
        return _draw([_metric_panel(runs, name) for name in metrics], out)
    headline = recorded_headline([row for _, rows in runs for row in rows])
    if headline not in ("accuracy", "loss"):
        return _draw([_metric_panel(runs, headline), _metric_panel(runs, "loss")], out)
    panels: list[Panel] = [
        (title, [(label, mean_per_round(rows, key)) for label, rows in runs])
        for title, key in (("evaluation accuracy", "eval_accuracy"),
                           ("evaluation loss", "eval_loss"))
    ]  # fmt: skip
    if not any(curve.rounds for _, curves in panels for _, curve in curves):
        raise HistoryError("no evaluated rounds (eval accuracy/loss) in the chosen runs; "
                           "nothing to plot")
    return _draw(panels, out)


def _metric_panel(runs: list[tuple[str, list[dict[str, Any]]]], name: str) -> Panel:
    """The curves of metric ``name`` of every run that recorded it (``HistoryError`` when
    none did, naming what they recorded)."""
    curves = []
    for label, rows in runs:
        key = qualified(rows, name)
        if key is not None:
            curves.append((f"{label} ({key})", mean_per_round(rows, key)))
    if not curves:
        recorded = sorted({m for _, rows in runs for m in metric_names(rows)})
        raise HistoryError(
            f"no chosen run recorded the metric '{name}'; they recorded: "
            f"{', '.join(recorded) or 'none'}"
        )
    return name, curves


def _draw(panels: list[Panel], out: Path) -> Path:
    """One panel per entry, side by side, each curve its mean with the min-max band."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    try:
        for axis, (title, curves) in zip(axes[0], panels, strict=True):
            for label, curve in curves:
                if not curve.rounds:
                    continue
                (line,) = axis.plot(curve.rounds, curve.mean, marker="o", markersize=3,
                                    label=label)
                if curve.low != curve.high:
                    axis.fill_between(curve.rounds, curve.low, curve.high, alpha=0.15,
                                      color=line.get_color())
            axis.set_title(title)
            axis.set_xlabel("round")
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
            axis.grid(alpha=0.3)
            if axis.lines:
                axis.legend(fontsize="small")
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=120)
    finally:
        plt.close(fig)
    return out
