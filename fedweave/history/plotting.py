"""Accuracy and loss per round for one or more runs, in one PNG.

Gossip runs have one curve per peer; the plot shows their mean per round (with the
min-max band shaded) so federated and gossip runs of the same task compare directly.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedweave.history.errors import HistoryError


@dataclass
class Curve:
    """One metric of one run: per round, the mean over actors and the min/max band."""

    rounds: list[int]
    mean: list[float]
    low: list[float]
    high: list[float]


def mean_per_round(rows: list[dict[str, Any]], key: str) -> Curve:
    """Average ``key`` (e.g. ``"eval_accuracy"``) over actors per round; skip missing values."""
    by_round: dict[int, list[float]] = defaultdict(list)
    for row in rows:
        if row.get(key) is not None:
            by_round[row["round"]].append(float(row[key]))
    rounds = sorted(by_round)
    return Curve(
        rounds=rounds,
        mean=[sum(by_round[r]) / len(by_round[r]) for r in rounds],
        low=[min(by_round[r]) for r in rounds],
        high=[max(by_round[r]) for r in rounds],
    )


def plot_runs(runs: list[tuple[str, list[dict[str, Any]]]], out: Path) -> Path:
    """Draw eval accuracy (left) and eval loss (right) per round for each (label, rounds).

    Raises ``UserError`` when no run has any evaluated round (nothing to draw).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    curves = [(label, mean_per_round(rows, "eval_accuracy"), mean_per_round(rows, "eval_loss"))
              for label, rows in runs]
    if not any(acc.rounds or loss.rounds for _, acc, loss in curves):
        raise HistoryError("no evaluated rounds (eval accuracy/loss) in the chosen runs; "
                           "nothing to plot")
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 4.2))
    try:
        for label, acc, loss in curves:
            for axis, curve in ((ax_acc, acc), (ax_loss, loss)):
                if not curve.rounds:
                    continue
                (line,) = axis.plot(curve.rounds, curve.mean, marker="o", markersize=3,
                                    label=label)
                if curve.low != curve.high:
                    axis.fill_between(curve.rounds, curve.low, curve.high, alpha=0.15,
                                      color=line.get_color())
        for axis, title in ((ax_acc, "evaluation accuracy"), (ax_loss, "evaluation loss")):
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
