"""Every metric of a recorded round, read back in one way (show, CSV, plot, tracking, export).

A federated round keeps its evaluations in ``Round.extra["evaluation"]`` (written by
``coordinator/rounds/history_listener.py``)::

    {"central": {"loss": .., "accuracy": .., ...},      # the coordinator's test data
     "federated": {"loss": .., "auc": .., ...},         # example-weighted over the sites
     "sites": [{"site": name, "status": "ok", "examples": n, "metrics": {...}}, ...]}

``eval_loss`` / ``eval_accuracy`` stay the round's headline figures (central when the
coordinator has test data, else federated). Metric names here are ``central.<name>``,
``federated.<name>`` and ``train.<name>`` (a site's ``train_loss`` is ``train.loss``), and a
DP run's ledger ``privacy.epsilon`` (``Round.extra["privacy"]``); each site's own evaluation
is ``site_metrics``. A bare name (``auc``) means the federated one
when the run has it, else the central one.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from fedweave.errors import UserError

SOURCES = ("federated", "central", "train")

LOWER_IS_BETTER = ("loss", "mae", "mse", "rmse", "error")
"""``--select-mode auto`` takes the lowest value of a metric whose name contains one of
these, the highest otherwise."""


def _numeric(values: dict[str, Any] | None) -> dict[str, float]:
    return {
        name: float(value)
        for name, value in (values or {}).items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def evaluation_of(row: dict[str, Any]) -> dict[str, Any]:
    """The round's recorded evaluation (empty for gossip rounds and older runs)."""
    return (row.get("extra") or {}).get("evaluation") or {}


def round_metrics(row: dict[str, Any]) -> dict[str, float]:
    """Every numeric metric of one round row (``store.rounds``), by qualified name."""
    evaluation = evaluation_of(row)
    found: dict[str, float] = {}
    for source in ("central", "federated"):
        for name, value in _numeric(evaluation.get(source)).items():
            found[f"{source}.{name}"] = value
    if not evaluation and row.get("eval_loss") is not None:  # runs recorded before 21
        found["central.loss"] = float(row["eval_loss"])
        if row.get("eval_accuracy") is not None:
            found["central.accuracy"] = float(row["eval_accuracy"])
    for name, value in _numeric(row.get("train_metrics")).items():
        found[f"train.{name.removeprefix('train_')}"] = value
    privacy = (row.get("extra") or {}).get("privacy")
    if isinstance(privacy, dict):  # a DP run's ledger: a curve on the dashboard, /metrics
        for name, value in _numeric({"epsilon": privacy.get("epsilon")}).items():
            found[f"privacy.{name}"] = value
    return found


def headline_value(row: dict[str, Any], name: str) -> float | None:
    """Round ``row``'s metric ``name`` for its global model: the central evaluation's, else
    the federated one (``evaluated`` of a ``RoundSummary``, read back from the history)."""
    metrics = round_metrics(row)
    return metrics.get(f"central.{name}", metrics.get(f"federated.{name}"))


HEADLINES = ("accuracy", "mae", "f1")
"""The objectives' headline metrics (``fedweave/learning/objectives.py``), in the order a
recorded run is read for one (``recorded_headline``)."""


def recorded_headline(rows: list[dict[str, Any]]) -> str:
    """The headline metric ``rows`` recorded (accuracy, else a regression's MAE, else a
    multi-label F1), where the task that ran is not at hand; ``loss`` when none."""
    names = {name.split(".", 1)[1] for name in metric_names(rows) if not name.startswith("train.")}
    return next((name for name in HEADLINES if name in names), "loss")


def nothing_learned(
    rows: list[dict[str, Any]], run_id: str = "RUN", sites: list[dict[str, Any]] | None = None
) -> str | None:
    """Why a federated run whose rounds took no site's update learned nothing (every round
    halted, refused or late everywhere): the run ends ``failed`` with this, not ``completed``
    at its starting model; ``None`` where a round took at least one update. ``sites``: the
    first round's site rows, whose own words are said (up to three distinct ones)."""
    if not rows or any(int(row.get("replied") or 0) > 0 for row in rows):
        return None
    said: list[str] = []
    for site in sites or []:
        reason = site.get("reason")
        if reason and not any(line.endswith(str(reason)[:120]) for line in said):
            said.append(f"site {site.get('site_id')} {site.get('status')}: {str(reason)[:120]}")
    first = rows[0].get("extra") or {}
    warnings = first.get("warnings") or []
    why = "; ".join(said[:3]) or first.get("failed") or (warnings[0] if warnings else None)
    return (
        f"none of the run's {len(rows)} rounds took a site's update"
        + (f" (round {rows[0]['round']}: {str(why)[:400]})" if why else "")
        + "; the model is still the one it started from: `fedweave history show "
        f"{run_id} --sites` gives each site's reason"
    )


def final_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Every metric of the last round's global model (central, else federated), bare names."""
    if not rows:
        return {}
    metrics = round_metrics(rows[-1])
    source = "central" if any(n.startswith("central.") for n in metrics) else "federated"
    return {n.split(".", 1)[1]: v for n, v in metrics.items() if n.startswith(f"{source}.")}


def metric_names(rows: list[dict[str, Any]]) -> list[str]:
    """The qualified names of every metric any of ``rows`` holds, sorted."""
    return sorted({name for row in rows for name in round_metrics(row)})


def qualified(rows: list[dict[str, Any]], name: str) -> str | None:
    """``name`` as the rows hold it: as given when qualified, else the federated metric of
    that name if any round has one, else the central one; ``None`` when none has it."""
    names = set(metric_names(rows))
    if "." in name:
        return name if name in names else None
    for source in SOURCES:
        if f"{source}.{name}" in names:
            return f"{source}.{name}"
    return None


def series(rows: list[dict[str, Any]], name: str) -> list[tuple[int, str, float]]:
    """(round, actor, value) of the qualified metric ``name`` in every round that has it."""
    found = []
    for row in rows:
        value = round_metrics(row).get(name)
        if value is not None and math.isfinite(value):
            found.append((int(row["round"]), str(row.get("actor", "")), value))
    return found


def lower_is_better(name: str, mode: str = "auto") -> bool:
    """Whether the best value of ``name`` is its lowest (``mode`` min/max/auto)."""
    if mode in ("min", "max"):
        return mode == "min"
    bare = name.rsplit(".", 1)[-1]
    return any(word in bare for word in LOWER_IS_BETTER)


def best_round(
    rows: list[dict[str, Any]], metric: str = "loss", mode: str = "auto"
) -> tuple[int, str, float] | None:
    """(round, qualified metric, value) of the round whose ``metric`` was best, the first
    such round on a tie; ``None`` when no round has the metric. The value is the one the
    choice rests on (``choice_series``): no single site can steer it."""
    name = choice_metric(rows, metric)
    if name is None:
        return None
    values, _statistic = choice_series(rows, name)
    if not values:
        return None
    low = lower_is_better(name, mode)
    best = min(values, key=lambda v: v[2]) if low else max(values, key=lambda v: v[2])
    return best[0], name, best[2]


MIN_SITES_FOR_MEDIAN = 3
"""Sites' own figures a round needs for its median to be one no single site sets."""


def choice_metric(rows: list[dict[str, Any]], metric: str) -> str | None:
    """The qualified metric the best round is chosen on: ``metric`` as given when qualified;
    else the coordinator's own evaluation (``central``) where the run has it, which no site
    can steer; else as ``qualified`` finds it."""
    if "." not in metric and f"central.{metric}" in set(metric_names(rows)):
        return f"central.{metric}"
    return qualified(rows, metric)


def choice_series(
    rows: list[dict[str, Any]], name: str
) -> tuple[list[tuple[int, str, float]], str]:
    """(round, actor, value) the best round is chosen on, and the statistic said of it. A
    federated metric is each round's median of the answering sites' own figures where at
    least ``MIN_SITES_FOR_MEDIAN`` sites gave one (a site claiming a tiny loss on 10**9
    examples moves a weighted mean, not a median), else the recorded mean."""
    if not name.startswith("federated."):
        return series(rows, name), "the recorded figure"
    bare = name.split(".", 1)[1]
    found, medians = [], 0
    for number, actor, recorded in series(rows, name):
        row = next(
            r for r in rows if int(r["round"]) == number and str(r.get("actor", "")) == actor
        )
        own = [
            float(figure)
            for site in site_evaluations(row)
            if site.get("status") == "ok"
            and isinstance(figure := (site.get("metrics") or {}).get(bare), (int, float))
            and math.isfinite(figure)
        ]
        if len(own) >= MIN_SITES_FOR_MEDIAN:
            found.append((number, actor, float(statistics.median(own))))
            medians += 1
        else:
            found.append((number, actor, recorded))
    if medians == len(found):
        return found, "the median of the sites' own figures"
    if medians:
        return found, "the median of the sites' own figures (the mean where fewer answered)"
    return found, f"the recorded mean (fewer than {MIN_SITES_FOR_MEDIAN} sites answered)"


MIN_RANKING_EXAMPLES = 100
"""Below this many evaluation examples, a round's figure is too noisy to rank rounds by:
one example moves an accuracy by more than a point, and the best of many noisy figures is
mostly luck (``ranking_warning``)."""


def evaluated_examples(row: dict[str, Any], name: str) -> int | None:
    """How many examples round ``row``'s qualified metric ``name`` rests on: the sites'
    evaluation parts that answered, for a federated metric; ``None`` where the history does
    not say (the coordinator's own test data, a training metric)."""
    if not name.startswith("federated."):
        return None
    sites = [s for s in site_evaluations(row) if s.get("status") == "ok"]
    counts = [s.get("examples") for s in sites]
    if not counts or not all(isinstance(c, int) for c in counts):
        return None
    return int(sum(counts))


def ranking_warning(examples: int | None) -> str | None:
    """Why a best round chosen on ``examples`` evaluation examples says little, or ``None``."""
    if examples is None or examples >= MIN_RANKING_EXAMPLES:
        return None
    return (
        f"the best round was chosen on {examples} evaluation examples, too few to rank rounds "
        f"(under {MIN_RANKING_EXAMPLES}, the best figure is mostly luck); prefer the final "
        "model, or give the sites more evaluation data (--eval-fraction, --eval-data)"
    )


def site_evaluations(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Each asked site's evaluation in that round: site, status, examples, metrics,
    reason."""
    return list(evaluation_of(row).get("sites") or [])


def site_metrics(row: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Site name → the numeric metrics it reported for that round's federated evaluation,
    for each site whose evaluation succeeded (status ``ok``)."""
    return {
        str(site.get("site")): _numeric(site.get("metrics"))
        for site in site_evaluations(row)
        if site.get("status") == "ok"
    }


def evaluation_line(evaluation: dict[str, Any]) -> str | None:
    """One console line for a round's federated evaluation, e.g. ``federated (3/3 sites):
    loss 0.1021 accuracy 0.9650 auc 0.9931``; ``None`` when no site was asked."""
    sites = evaluation.get("sites") or []
    if not sites:
        return None
    ok = sum(1 for site in sites if site.get("status") == "ok")
    federated = _numeric(evaluation.get("federated"))
    ordered = sorted(federated, key=lambda name: (name != "loss", name))
    figures = " ".join(f"{name} {federated[name]:.4f}" for name in ordered)
    return f"federated ({ok}/{len(sites)} sites): {figures or 'no result'}"


def evaluation_lines(evaluation: dict[str, Any]) -> list[str]:
    """The console lines of a round's federated evaluation: the aggregate, then each site
    that failed or was late, with its reason."""
    line = evaluation_line(evaluation)
    if line is None:
        return []
    lines = [line]
    for site in evaluation.get("sites") or []:
        if site.get("status") != "ok":
            lines.append(
                f"  site {site.get('site')} evaluation {site.get('status')}: "
                f"{site.get('reason') or 'no reason given'}"
            )
    return lines


def recorded_statistics(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The federated statistics a run recorded with its first round (``store.rounds``):
    a resume reuses them, and an exported model needs them to predict."""
    for row in rows:
        statistics = (row.get("extra") or {}).get("statistics")
        if statistics:
            return statistics
    return None


def recorded_privacy(rows: list[dict[str, Any]], dp: str) -> dict[str, Any] | None:
    """The privacy ledger of a run's last recorded round (``store.rounds``), which a resume
    continues; ``None`` for a run without DP or before round 1. A DP run whose last round
    recorded no ledger cannot be resumed without losing what it spent: its one line."""
    if dp == "none" or not rows:
        return None
    privacy = (rows[-1].get("extra") or {}).get("privacy")
    if not isinstance(privacy, dict):
        raise UserError(
            f"round {rows[-1]['round']} of this --dp {dp} run recorded no privacy ledger "
            "(recorded before fedweave kept one, or edited), so what the run spent cannot be "
            "continued; start a new run"
        )
    return privacy


def final_privacy(rows: list[dict[str, Any]], dp: str) -> dict[str, Any] | None:
    """What a run's report and exported model say it spent: ``{"mechanism", "epsilon",
    "delta", "rounds"}`` after its last recorded round, with what the epsilon is a statement
    about (``privacy.statement``: relation, sensitivity, accountant, noise); ``None`` without
    DP (``no differential privacy``)."""
    if dp == "none":
        return None
    privacy = (rows[-1].get("extra") or {}).get("privacy") if rows else None
    from fedweave.privacy.statement import statement

    if not isinstance(privacy, dict):
        return {"mechanism": dp, "epsilon": 0.0, "delta": None, "rounds": 0, **statement(dp)}
    return {
        "mechanism": dp,
        "epsilon": privacy.get("epsilon"),
        "delta": privacy.get("delta"),
        "rounds": rows[-1]["round"],
        **statement(dp),
    }


def recorded_clock(rows: list[dict[str, Any]]) -> float:
    """The simulated clock at the run's last recorded round (``--site-speeds``; 0 without)."""
    for row in reversed(rows):
        clock = (row.get("extra") or {}).get("simulated_clock")
        if isinstance(clock, (int, float)):
            return float(clock)
    return 0.0


def cross_site_matrix(
    rows: list[dict[str, Any]], metric: str
) -> tuple[list[str], list[str], dict[tuple[str, str], str]] | None:
    """(models, sites, cell text by (model, site)) of the run's cross-site evaluation for
    ``metric`` (a bare name: ``loss``, ``auc``), or ``None`` when the run has none. A cell is
    the value, or the status (``failed``, ``late``)."""
    for row in reversed(rows):
        entries = evaluation_of(row).get("cross_site")
        if not entries:
            continue
        models = list(dict.fromkeys(str(e.get("model")) for e in entries))
        sites = sorted({str(e.get("site")) for e in entries})
        cells: dict[tuple[str, str], str] = {}
        for entry in entries:
            value = (entry.get("metrics") or {}).get(metric)
            ok = entry.get("status") == "ok" and isinstance(value, (int, float))
            cells[(str(entry.get("model")), str(entry.get("site")))] = (
                f"{value:.4f}" if ok else str(entry.get("status"))
            )
        return models, sites, cells
    return None
