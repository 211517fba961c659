"""What the dashboard shows, read from the history as plain JSON-able dicts: the runs, one
run's rounds, sites, round in flight and alerts, a site's own record, and runs to compare.

Reading is incremental: a ``RunFold`` per run keeps what it has read (the rounds' figures and
each site's record), so a poll for new rounds reads only the rows recorded since, however
long the run. Nothing here writes to the database.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from fedweave.history.alerts import AlertRules, LateStreaks, overdue_round
from fedweave.history.liveness import run_is_dead
from fedweave.history.metrics import (
    best_round,
    evaluation_of,
    round_metrics,
    site_evaluations,
    site_metrics,
)
from fedweave.history.records import RunInfo

OUTCOMES = ("ok", "late", "rejected", "failed", "refused", "lost")
"""Site statuses counted per round (``fedweave.history.models.SITE_STATUSES``)."""
HIDDEN_WORDS = (
    "db", "url", "dir", "path", "file", "key", "cert", "secret", "token", "password",
    "address", "data", "resume", "track", "out",
)  # fmt: skip
"""A config entry whose name holds one of these words is never shown (database URLs, key
and data paths, addresses)."""
PROBLEMS_KEPT = 50
"""Each site's latest non-ok records kept for its page."""


def _short(value: float) -> float:
    """A figure as the page shows it: 6 significant digits (keeps a long run's JSON small)."""
    return float(f"{value:.6g}")


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(timezone.utc).isoformat() if value is not None else None


def _hidden(name: str) -> bool:
    words = name.lower().replace("-", "_").split("_")
    return any(word in HIDDEN_WORDS for word in words)


def shown_config(value: Any) -> Any:
    """The run's stored config without anything secret or local: no entry named like a path,
    URL, key or address (``HIDDEN_WORDS``), and no text that looks like a path or URL."""
    if isinstance(value, dict):  # a section is kept by name; its entries are judged one by one
        return {
            str(k): shown_config(v)
            for k, v in value.items()
            if (isinstance(v, dict) or not _hidden(str(k))) and shown_config(v) is not _DROP
        }
    if isinstance(value, list):
        return [item for item in (shown_config(v) for v in value) if item is not _DROP]
    if isinstance(value, str) and ("/" in value or "\\" in value or "://" in value):
        return _DROP
    return value


_DROP = object()


def run_summary(run: RunInfo, now: datetime) -> dict[str, Any]:
    """One line of the runs list: who, what, how far, how protected."""
    settings = (run.config or {}).get("settings") or {}
    planned = (settings.get("training") or {}).get("rounds")
    dead = run.status == "running" and run_is_dead(run.pid, run.hostname, run.heartbeat_at, now)
    federation = settings.get("federation") or {}
    gossip = settings.get("gossip") or {}
    return {
        "run_id": run.run_id,
        "mode": run.mode,
        "task": run.task,
        "status": run.status,
        "looks_dead": dead,
        "reason": run.reason,
        "command": (run.config or {}).get("command"),
        "started_at": _iso(run.started_at),
        "ended_at": _iso(run.ended_at),
        "heartbeat_at": _iso(run.heartbeat_at),
        "rounds_completed": run.rounds_completed,
        "rounds_planned": planned,
        "actors": run.actors,
        "strategy": federation.get("strategy") if run.mode == "federated" else gossip.get("mix"),
        "protections": shown_config((run.config or {}).get("protections") or {}),
    }


@dataclass
class _SiteRecord:
    """What one site did over a run, folded round by round."""

    name: str
    rounds: int = 0
    examples: int = 0
    last_seen_round: int | None = None
    last_seen_at: str | None = None
    counts: Counter = field(default_factory=Counter)
    last_metrics: dict[str, float] = field(default_factory=dict)
    problems: list[dict[str, Any]] = field(default_factory=list)

    def view(self) -> dict[str, Any]:
        return {
            "site": self.name,
            "rounds": self.rounds,
            "examples": self.examples,
            "last_seen_round": self.last_seen_round,
            "last_seen_at": self.last_seen_at,
            "counts": dict(self.counts),
            "last_metrics": self.last_metrics,
            "problems": self.problems[-PROBLEMS_KEPT:],
        }


class RunFold:
    """One federated run as read so far: its round figures and each site's record.

    ``update`` reads the rounds recorded after the last one it saw; ``view`` is what the run
    page shows. Thread-safe: the dashboard serves polls from a thread pool.
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.rounds: list[dict[str, Any]] = []
        self.raw: list[dict[str, Any]] = []
        self.sites: dict[str, _SiteRecord] = {}
        self.streaks = LateStreaks()
        self.last_round = 0
        self.lock = threading.Lock()

    def update(self, store) -> None:
        with self.lock:
            rows = store.rounds(self.run_id, after=self.last_round)
            if not rows:
                return
            site_rows = store.site_results(self.run_id, after=self.last_round)
            by_round: dict[int, list[dict[str, Any]]] = {}
            for site in site_rows:
                by_round.setdefault(int(site["round"]), []).append(site)
            for row in rows:
                self._fold(row, by_round.get(int(row["round"]), []))
            self.last_round = max(int(row["round"]) for row in rows)

    def _fold(self, row: dict[str, Any], site_rows: list[dict[str, Any]]) -> None:
        number = int(row["round"])
        extra = row.get("extra") or {}
        counts = Counter(str(site["status"]) for site in site_rows)
        metrics = {name: _short(value) for name, value in round_metrics(row).items()}
        for name, key in (("accuracy", "eval_accuracy"), ("loss", "eval_loss")):
            if row.get(key) is not None:
                metrics[name] = _short(float(row[key]))
        self.raw.append(row)
        self.rounds.append(
            {
                "round": number,
                "ended_at": _iso(row["ended_at"]),
                "seconds": _short(float(extra.get("seconds", row["seconds"]))),
                "deadline_seconds": extra.get("deadline_seconds"),
                "sampled": row["sampled"],
                "replied": row["replied"],
                "outcomes": {status: counts[status] for status in OUTCOMES if counts[status]},
                "metrics": metrics,
                "failed": extra.get("failed"),
                "warnings": list(extra.get("warnings") or []),
            }
        )
        ended = _iso(row["ended_at"])
        for site in site_rows:
            record = self._site(str(site["site_id"]))
            record.counts[str(site["status"])] += 1
            self.streaks.add(number, record.name, str(site["status"]), site.get("reason"))
            if site["status"] == "ok":
                record.rounds += 1
                record.examples = int(site["num_examples"] or 0)
                record.last_seen_round, record.last_seen_at = number, ended
                record.last_metrics.update(
                    {
                        f"train.{k.removeprefix('train_')}": float(v)
                        for k, v in (site.get("metrics") or {}).items()
                        if k.startswith("train_") and isinstance(v, (int, float))
                    }
                )
            else:
                record.problems.append(
                    {"round": number, "part": "training", "status": site["status"],
                     "reason": site.get("reason")}  # fmt: skip
                )
        for name, values in site_metrics(row).items():
            self._site(name).last_metrics.update(
                {f"evaluation.{k}": v for k, v in values.items()}
            )
        for evaluation in site_evaluations(row):
            if evaluation.get("status") != "ok":
                self._site(str(evaluation.get("site"))).problems.append(
                    {"round": number, "part": "evaluation", "status": evaluation.get("status"),
                     "reason": evaluation.get("reason")}  # fmt: skip
                )

    def _site(self, name: str) -> _SiteRecord:
        if name not in self.sites:
            self.sites[name] = _SiteRecord(name)
        return self.sites[name]

    def view(self, after: int) -> dict[str, Any]:
        """The rounds numbered above ``after``, every metric name so far, each site's record,
        the best round and the latest cross-site matrix."""
        with self.lock:
            names = sorted({name for row in self.rounds for name in row["metrics"]})
            return {
                "rounds": [row for row in self.rounds if row["round"] > after],
                "metric_names": names,
                "sites": [self.sites[name].view() for name in sorted(self.sites)],
                "cross_site": _cross_site(self.raw),
            }


def _cross_site(raw: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    for row in reversed(raw):
        entries = evaluation_of(row).get("cross_site")
        if entries:
            return [
                {
                    "model": str(entry.get("model")),
                    "site": str(entry.get("site")),
                    "status": entry.get("status"),
                    "metrics": {k: v for k, v in (entry.get("metrics") or {}).items()
                                if isinstance(v, (int, float)) and not isinstance(v, bool)},
                    "reason": entry.get("reason"),
                }
                for entry in entries
            ]
    return None


def gossip_rounds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A gossip run's rounds, one per round number over every peer that recorded it: peers,
    exchanges (asked / answered / missed), drops, the mean of the peers' figures and their
    consensus estimate."""
    by_round: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_round.setdefault(int(row["round"]), []).append(row)
    found = []
    for number in sorted(by_round):
        group = by_round[number]
        metrics: dict[str, float] = {}
        for name, key in (("accuracy", "eval_accuracy"), ("loss", "eval_loss")):
            values = [float(r[key]) for r in group if r.get(key) is not None]
            if values:
                metrics[name] = metrics[f"peers.{name}"] = sum(values) / len(values)
        consensus = [
            float(c) for r in group
            if isinstance(c := (r.get("extra") or {}).get("consensus_estimate"), (int, float))
        ]  # fmt: skip
        if consensus:
            metrics["consensus"] = sum(consensus) / len(consensus)
        drops = sum(
            int(v) for r in group for v in ((r.get("extra") or {}).get("drops") or {}).values()
            if isinstance(v, (int, float))
        )  # fmt: skip
        seconds = [float(r["seconds"]) for r in group if r.get("seconds") is not None]
        found.append(
            {
                "round": number,
                "ended_at": _iso(max(r["ended_at"] for r in group)),
                "peers": len(group),
                "seconds": sum(seconds) / len(seconds) if seconds else None,
                "exchanges": sum(int(r["sampled"]) for r in group),
                "answered": sum(int(r["replied"]) for r in group),
                "missed": sum(int(r["failed"]) for r in group),
                "drops": drops,
                "bytes_in": sum(int(r["bytes_in"] or 0) for r in group),
                "bytes_out": sum(int(r["bytes_out"] or 0) for r in group),
                "metrics": metrics,
            }
        )
    return found


def gossip_peers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each peer of a gossip run: rounds, last round and its figures, exchanges it missed."""
    peers: dict[str, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: int(r["round"])):
        peer = peers.setdefault(
            str(row["actor"]),
            {"peer": str(row["actor"]), "rounds": 0, "missed": 0, "drops": 0, "last_round": None,
             "last_seen_at": None, "accuracy": None, "loss": None},  # fmt: skip
        )
        peer["rounds"] += 1
        peer["missed"] += int(row["failed"])
        peer["drops"] += sum(
            int(v) for v in ((row.get("extra") or {}).get("drops") or {}).values()
            if isinstance(v, (int, float))
        )  # fmt: skip
        peer["last_round"], peer["last_seen_at"] = int(row["round"]), _iso(row["ended_at"])
        peer["accuracy"], peer["loss"] = row.get("eval_accuracy"), row.get("eval_loss")
    return [peers[name] for name in sorted(peers)]


class Views:
    """The dashboard's reads over one history store.

    Args:
        store: an open ``HistoryStore`` (opened read-only by ``fedweave dashboard``).
        rules: when figures become alerts (``fedweave/history/alerts.py``).
    """

    def __init__(self, store, rules: AlertRules) -> None:
        self.store, self.rules = store, rules
        self._folds: dict[str, RunFold] = {}
        self._lock = threading.Lock()

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def runs(self) -> list[dict[str, Any]]:
        """Every run, newest first, with its alert flag when it runs and, for an operator's
        study, its submission (``study``: its number and operator)."""
        now = self.now()
        studies = {s["run_id"]: s for s in self.studies() if s["run_id"] is not None}
        found = []
        for run in self.store.list_runs():
            summary = run_summary(run, now)
            summary["alert"] = bool(run.status == "running" and self.alerts(run, now)["any"])
            study = studies.get(run.run_id)
            summary["study"] = None if study is None else {
                "id": study["id"], "operator": study["operator"], "source": study["source"]
            }  # fmt: skip
            found.append(summary)
        return found

    def site_jobs(self) -> list[dict[str, Any]]:
        """Each site's current jobs: every running federated run whose latest recorded round
        asked it, with what it did there (``ok``, or ``refused`` by its policy, ...), by site
        name, in site order."""
        jobs: dict[str, list[dict[str, Any]]] = {}
        for run in self.store.list_runs():
            if run.status != "running" or run.mode != "federated" or not run.rounds_completed:
                continue
            last = run.rounds_completed
            for site in self.store.site_results(run.run_id, last):
                jobs.setdefault(str(site["site_id"]), []).append(
                    {"run_id": run.run_id, "task": run.task, "round": last,
                     "status": site["status"]}  # fmt: skip
                )
        return [{"site": name, "runs": jobs[name]} for name in sorted(jobs)]

    def studies(self) -> list[dict[str, Any]]:
        """The operators' studies (``fedweave run submit``), oldest first: queued (with how
        many are ahead), running (with their run) and ended (with why)."""
        from fedweave.history.submissions import Submissions

        listed = [s.as_dict() for s in Submissions(self.store).all()]
        ahead = 0
        for study in listed:
            study["ahead"] = ahead if study["state"] == "queued" else None
            ahead += study["state"] == "queued"
        return listed

    def fold(self, run: RunInfo) -> RunFold:
        with self._lock:
            fold = self._folds.get(run.run_id)
            if fold is None or fold.last_round > run.rounds_completed:  # rounds were discarded
                fold = self._folds[run.run_id] = RunFold(run.run_id)
        fold.update(self.store)
        return fold

    def alerts(self, run: RunInfo, now: datetime) -> dict[str, Any]:
        """The run's overdue round, its wait for sites and the sites late in a row
        (federated runs)."""
        if run.mode != "federated":
            return {"any": False, "overdue": None, "waiting": None, "late_sites": []}
        overdue = overdue_round(run, now, self.rules)
        late = self.fold(run).streaks.flagged(self.rules)
        waiting = run.sites_wait if run.status == "running" else None
        return {
            "any": bool(overdue or late or waiting),
            "overdue": None if overdue is None else {**overdue.__dict__, "line": overdue.line()},
            "waiting": None if waiting is None else {
                "connected": waiting.connected, "needed": waiting.needed,
                "missing": list(waiting.missing), "since": _iso(waiting.since),
                "gives_up_at": _iso(waiting.gives_up_at), "line": waiting.line(),
            },  # fmt: skip
            "late_sites": [
                {"site": s.site, "rounds": list(s.rounds), "reason": s.reason, "line": s.line()}
                for s in late
            ],
        }

    def run(self, run_id: str, after: int = 0) -> dict[str, Any]:
        """One run's page: its summary, the rounds after ``after``, its sites (or peers), the
        round in flight and the alerts. ``KeyError`` when no such run."""
        run = self._get(run_id)
        now = self.now()
        page: dict[str, Any] = {
            "server_time": _iso(now),
            "run": {**run_summary(run, now), "config": shown_config(
                ((run.config or {}).get("settings")) or {})},  # fmt: skip
            "alerts": self.alerts(run, now),
            "in_flight": None,
            "rules": {"late_in_a_row": self.rules.late_in_a_row,
                      "grace_seconds": self.rules.grace_seconds},  # fmt: skip
        }
        if run.mode == "gossip":
            rows = self.store.rounds(run.run_id)
            rounds = gossip_rounds(rows)
            page.update(
                rounds=[r for r in rounds if r["round"] > max(0, after - 2)],
                metric_names=sorted({n for r in rounds for n in r["metrics"]}),
                peers=gossip_peers(rows),
            )
            return page
        fold = self.fold(run)
        page.update(fold.view(after))
        settings = (run.config or {}).get("settings") or {}
        evaluation = settings.get("evaluation") or {}
        best = best_round(fold.raw, evaluation.get("select_metric") or "loss",
                          evaluation.get("select_mode") or "auto")  # fmt: skip
        page["best"] = None if best is None else {"round": best[0], "metric": best[1],
                                                  "value": best[2]}  # fmt: skip
        flight = run.round_in_flight
        if run.status == "running" and flight is not None:
            page["in_flight"] = {
                "round": flight.round,
                "started_at": _iso(flight.started_at),
                "deadline_seconds": flight.deadline_seconds,
                "sampled": flight.sampled,
                "connected": flight.connected,
                "seconds_running": (now - flight.started_at).total_seconds(),
            }
        return page

    def site(self, run_id: str, site: str) -> dict[str, Any]:
        """One site's record in a federated run, round by round. ``KeyError`` when the run or
        the site is unknown."""
        run = self._get(run_id)
        if run.mode != "federated":
            raise KeyError(site)
        fold = self.fold(run)
        with fold.lock:
            record = fold.sites.get(site)
            if record is None:
                raise KeyError(site)
            view = record.view()
            view["late_streak"] = fold.streaks.streak(site)
        rows = [r for r in self.store.site_results(run.run_id) if r["site_id"] == site]
        view["history"] = [
            {"round": r["round"], "status": r["status"], "examples": r["num_examples"],
             "seconds": r["seconds"], "reason": r["reason"],
             "metrics": {k: v for k, v in (r.get("metrics") or {}).items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool)}}
            for r in rows
        ]  # fmt: skip
        view["evaluations"] = [
            {"round": row["round"], **{k: e.get(k) for k in ("status", "examples", "reason")},
             "metrics": e.get("metrics") or {}}
            for row in fold.raw for e in site_evaluations(row) if str(e.get("site")) == site
        ]  # fmt: skip
        view["run"] = run_summary(run, self.now())
        return view

    def compare(self, run_ids: list[str]) -> dict[str, Any]:
        """Runs side by side: each run's summary and per-round metrics (``accuracy`` and
        ``loss`` are every run's headline figures, gossip's the peers' mean)."""
        runs = []
        for run_id in run_ids:
            run = self._get(run_id)
            if run.mode == "gossip":
                rounds = gossip_rounds(self.store.rounds(run.run_id))
            else:
                rounds = self.fold(run).view(0)["rounds"]
            runs.append(
                {**run_summary(run, self.now()),
                 "rounds": [{"round": r["round"], "metrics": r["metrics"]} for r in rounds]}
            )  # fmt: skip
        names = sorted({n for run in runs for r in run["rounds"] for n in r["metrics"]})
        return {"runs": runs, "metric_names": names}

    def run_info(self, run_id: str) -> RunInfo:
        """The run ``run_id`` names (an id, a unique prefix or ``latest``); ``KeyError`` when
        none."""
        return self._get(run_id)

    def _get(self, run_id: str) -> RunInfo:
        from fedweave.errors import UserError
        from fedweave.history.store_errors import HistoryUnavailableError

        try:
            return self.store.get_run(run_id)
        except HistoryUnavailableError:
            raise
        except UserError as exc:
            raise KeyError(run_id) from exc
