"""``/metrics`` in Prometheus' text format, read from the history at every scrape.

Gauges per run (label ``run_id``): rounds completed and planned, the last round's seconds,
site outcomes and metrics, seconds since the last recorded round, the round in flight, sites
connected, and the stall alerts of ``fedweave/history/alerts.py``. Runs exported: every
running run and the ``RECENT_RUNS`` newest, so a finished run's last figures stay visible
without the label set growing with the history; with them, the operators' studies by state
(``studies``: how many wait in the queue), and ``build_info`` naming the fedweave and Flower
versions serving.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timezone

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fedweave.dashboard.views import OUTCOMES, Views
from fedweave.history.models import SUBMISSION_STATES
from fedweave.versions import running

RECENT_RUNS = 5
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.:/-]")


def _clean(value: str) -> str:
    return _LABEL_VALUE.sub("_", value)[:120]


class HistoryCollector(Collector):
    """The history's runs as Prometheus gauges.

    Args:
        views: the dashboard's reads over the history.
        run_id: export this run only (the coordinator's own ``--metrics-address``); default:
            running runs and the newest ones.
        connected: the coordinator's live count of connected sites, when it has one (else
            the count noted when the round in flight started).
        certificate_ends: when the coordinator's TLS certificate ends (read at each scrape),
            for ``fedweave_certificate_days_left``; None without TLS.
    """

    def __init__(
        self,
        views: Views,
        run_id: str | None = None,
        connected: Callable[[], int] | None = None,
        certificate_ends: Callable[[], datetime | None] | None = None,
    ) -> None:
        self.views, self.run_id, self.connected = views, run_id, connected
        self.certificate_ends = certificate_ends

    def collect(self) -> Iterator[GaugeMetricFamily]:
        def gauge(name: str, doc: str, labels: tuple[str, ...] = ("run_id",)):
            return GaugeMetricFamily(f"fedweave_{name}", doc, labels=list(labels))

        info = gauge("run_info", "A run (1): its mode, task and status.",
                     ("run_id", "mode", "task", "status"))  # fmt: skip
        completed = gauge("rounds_completed", "Rounds recorded.")
        planned = gauge("rounds_planned", "Rounds the run was started for.")
        seconds = gauge("round_seconds", "Seconds the last recorded round took.")
        outcomes = gauge("round_sites", "Sites of the last recorded round by outcome.",
                         ("run_id", "outcome"))  # fmt: skip
        metric = gauge("round_metric", "The last recorded round's metrics (central.*, "
                       "federated.*, train.*, accuracy, loss).", ("run_id", "metric"))  # fmt: skip
        age = gauge("seconds_since_last_round", "Seconds since the run's last recorded round "
                    "(or its start).")  # fmt: skip
        flight = gauge("round_in_flight", "The round under way (0: none).")
        flight_age = gauge("round_in_flight_seconds", "Seconds the round under way has run.")
        deadline = gauge("round_deadline_seconds", "The round under way's training deadline.")
        connected = gauge("sites_connected", "Sites connected to the coordinator.")
        missing = gauge("sites_missing", "Sites the run waits for (--min-clients less those "
                        "connected) while it waits for them; 0 when it does not.")  # fmt: skip
        stalled = gauge("run_stalled", "1 when the round under way is past its deadlines and "
                        "the grace.")  # fmt: skip
        late = gauge("site_late_in_a_row", "Rounds in a row a site was recorded late (sites "
                     "with at least one).", ("run_id", "site"))  # fmt: skip
        alert = gauge("alert", "1 when the run has an alert (a stalled round, a wait for "
                      "sites, or a site late --stall-after rounds in a row).")  # fmt: skip
        now = datetime.now(timezone.utc)
        for run in self._runs():
            rid = run.run_id
            info.add_metric([rid, run.mode, _clean(run.task), run.status], 1)
            completed.add_metric([rid], run.rounds_completed)
            rounds = ((run.config or {}).get("settings") or {}).get("training", {}).get("rounds")
            if isinstance(rounds, int):
                planned.add_metric([rid], rounds)
            if run.mode != "federated":
                continue
            fold = self.views.fold(run)
            last = fold.rounds[-1] if fold.rounds else None
            since = datetime.fromisoformat(last["ended_at"]) if last else run.started_at
            age.add_metric([rid], (now - since).total_seconds())
            if last is not None:
                if last["seconds"] is not None:
                    seconds.add_metric([rid], float(last["seconds"]))
                outcomes.add_metric([rid, "sampled"], last["sampled"])
                for outcome in OUTCOMES:
                    outcomes.add_metric([rid, outcome], last["outcomes"].get(outcome, 0))
                for name, value in sorted(last["metrics"].items()):
                    if math.isfinite(value):
                        metric.add_metric([rid, _clean(name)], value)
            in_flight = run.round_in_flight if run.status == "running" else None
            flight.add_metric([rid], in_flight.round if in_flight else 0)
            if in_flight is not None:
                flight_age.add_metric([rid], (now - in_flight.started_at).total_seconds())
                if in_flight.deadline_seconds is not None:
                    deadline.add_metric([rid], in_flight.deadline_seconds)
            live = rid == self.run_id or (self.run_id is None and run.status == "running")
            if self.connected is not None and live:
                connected.add_metric([rid], self.connected())
            elif in_flight is not None:
                connected.add_metric([rid], in_flight.connected)
            waiting = run.sites_wait if run.status == "running" else None
            missing.add_metric([rid], waiting.needed - waiting.connected if waiting else 0)
            alerts = self.views.alerts(run, now)
            stalled.add_metric([rid], 1 if alerts["overdue"] else 0)
            alert.add_metric([rid], 1 if alerts["any"] else 0)
            with fold.lock:
                for site in sorted(fold.sites):
                    streak = len(fold.streaks.streak(site))
                    if streak:
                        late.add_metric([rid, _clean(site)], streak)
        studies = gauge("studies", "Operators' studies (`fedweave run submit`) by state: "
                        "queued, running, completed, stopped, failed.", ("state",))  # fmt: skip
        site_runs = gauge("site_runs", "Running runs whose latest round asked the site (its "
                          "current jobs, whatever it answered).", ("site",))  # fmt: skip
        if self.run_id is None:
            counts = Counter(study["state"] for study in self.views.studies())
            for state in SUBMISSION_STATES:
                studies.add_metric([state], counts.get(state, 0))
            for site in self.views.site_jobs():
                site_runs.add_metric([_clean(site["site"])], len(site["runs"]))
        build = gauge("build_info", "The fedweave and Flower versions serving (1).",
                      ("version", "flwr"))  # fmt: skip
        build.add_metric(list(running()), 1)
        ends = self.certificate_ends() if self.certificate_ends is not None else None
        if ends is not None:
            days = gauge("certificate_days_left", "Days until the coordinator's TLS "
                         "certificate (server.pem) ends; renew it before 0.", ())  # fmt: skip
            days.add_metric([], (ends - now).total_seconds() / 86400)
            yield days
        yield from (info, completed, planned, seconds, outcomes, metric, age, flight,
                    flight_age, deadline, connected, missing, stalled, late, alert, studies,
                    site_runs, build)  # fmt: skip

    def _runs(self):
        if self.run_id is not None:
            return [self.views.store.get_run(self.run_id)]
        runs = self.views.store.list_runs()
        return [run for i, run in enumerate(runs) if run.status == "running" or i < RECENT_RUNS]


def exposition(collector: HistoryCollector) -> bytes:
    """One scrape: the collector's gauges in Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)
