"""Say when a run has stopped learning: a loss that is no longer finite, or a global model
that fell back to chance after doing better. A wrapper around the round listeners: it adds
one warning line to the round's summary, which the progress line shows and the history keeps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

FIX = "lower --lr, set --clip-grad-norm, or use the task's defaults"
CHANCE_MARGIN = 0.02
"""Accuracy within this of chance counts as chance."""
LEARNED_MARGIN = 0.10
"""A model counts as having learned once it was this far above chance."""


def health_warnings(
    summary: Any, chance: float | None, best: float | None
) -> list[str]:
    """Warnings for one round's ``summary`` (``RoundSummary``), given the chance accuracy
    (``None``: no class labels) and the best accuracy of earlier rounds."""
    found = []
    nonfinite = [
        site.site_id for site in summary.sites
        if site.metrics.get("nonfinite")
        or (site.reason and "non-finite" in site.reason)  # the site's own update check
    ]  # fmt: skip
    if nonfinite:
        found.append(
            f"{len(nonfinite)} site(s)' training loss became NaN or infinite and their "
            f"updates were rejected; {FIX}"
        )
    if summary.loss is not None and not math.isfinite(summary.loss):
        found.append(f"the global model's loss is not finite; {FIX}")
    accuracy = summary.accuracy
    if (
        chance is not None and best is not None and accuracy is not None
        and accuracy <= chance + CHANCE_MARGIN and best >= chance + LEARNED_MARGIN
    ):  # fmt: skip
        found.append(
            f"the global model fell back to chance (accuracy {accuracy:.3f}, chance "
            f"{chance:.3f}, best so far {best:.3f}); {FIX}"
        )
    return found


class ModelHealth:
    """Round listeners whose summaries carry ``health_warnings``.

    Args:
        listeners: told about every round, after the warnings are added.
        num_classes: the task's classes (chance is ``1 / num_classes``); 0 or 1: no chance
            level (regression).
    """

    def __init__(self, listeners: Sequence[Any], num_classes: int) -> None:
        self.listeners = list(listeners)
        self.chance = 1.0 / num_classes if num_classes >= 2 else None
        self.best: float | None = None

    def on_round(self, summary: Any) -> None:
        summary.warnings = [*summary.warnings, *health_warnings(summary, self.chance, self.best)]
        accuracy = summary.accuracy
        if accuracy is not None and math.isfinite(accuracy):
            self.best = accuracy if self.best is None else max(self.best, accuracy)
        for listener in self.listeners:
            listener.on_round(summary)
