"""A round waits for its sites for a bounded time, saying so (issue 80): the run's client
manager (``coordinator/rounds/site_wait.py``) on Flower's own client-manager bookkeeping,
real threads registering sites, and the wait as the history, the dashboard's alerts and
``/metrics`` read it from a real SQLite store."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from fedweave.coordinator.rounds.named_sites import NamedSites
from fedweave.coordinator.rounds.site_wait import BoundedSites, SitesMissing
from fedweave.dashboard.views import Views
from fedweave.history import RoundInFlight, open_store
from fedweave.history.alerts import AlertRules
from fedweave.history.records import SitesWait


def _node(node_id: int) -> SimpleNamespace:
    return SimpleNamespace(cid=str(node_id), node_id=node_id)


def test_a_site_that_never_comes_back_ends_the_wait_at_its_bound_naming_it():
    names = {"1": "hospital-a", "2": "hospital-b", "3": "hospital-c"}
    notes: list[SitesWait | None] = []
    manager = BoundedSites(1.5, notes.append, lambda: names, note_every=0.5)
    for node in (1, 2, 3):
        manager.register(_node(node))
    assert manager.wait_for(3) is True and notes == []  # enough: no wait, nothing noted
    manager.unregister(_node(3))  # hospital-c revoked, or unplugged
    started = time.monotonic()
    with pytest.raises(SitesMissing) as missing:
        manager.sample(3)  # Flower's own sampling waits through wait_for
    waited = time.monotonic() - started
    assert 1.5 <= waited < 3.5, waited  # Flower's default would be a day
    assert str(missing.value).startswith(
        "waited 1.5 s for sites: 2 of 3 connected (missing: hospital-c); start them or lower "
        "--min-clients (--wait-for-sites sets this wait)"
    )
    waits = [note for note in notes if note is not None]
    assert len(waits) >= 2 and notes[-1] is None  # noted while it lasted, cleared at the end
    assert {(w.connected, w.needed, w.missing) for w in waits} == {(2, 3, ("hospital-c",))}
    assert waits[0].gives_up_at - waits[0].since == timedelta(seconds=1.5)
    assert "waiting for sites: 2 of 3 connected since" in waits[0].line()
    assert "(missing: hospital-c)" in waits[0].line()


def test_a_site_that_joins_lets_the_waiting_round_go_on():
    notes: list[SitesWait | None] = []
    manager = BoundedSites(30.0, notes.append)
    manager.register(_node(1))
    joins = threading.Timer(0.5, manager.register, args=(_node(2),))
    joins.start()
    started = time.monotonic()
    try:
        assert sorted(p.node_id for p in manager.sample(2)) == [1, 2]
    finally:
        joins.cancel()
    assert time.monotonic() - started < 5
    assert notes[0] is not None and (notes[0].connected, notes[0].needed) == (1, 2)
    assert notes[0].missing == ()  # no site of this run has left: none to name
    assert notes[-1] is None


def test_a_named_run_waits_for_its_named_sites_not_for_any_node():
    """Three nodes connected, one of them under a name the run does not take: the run needs
    three of its own, so it waits (Flower's count of every node would have let it sample,
    fail and skip the round)."""
    names = {"1": "hospital-a", "2": "hospital-b", "3": "clinic"}
    manager = NamedSites(frozenset({"hospital-a", "hospital-b", "hospital-c"}), lambda: names,
                         bound_seconds=0.5)  # fmt: skip
    for node in (1, 2, 3):
        manager.register(_node(node))
    with pytest.raises(SitesMissing, match=r"2 of 3 connected \(missing: hospital-c\)"):
        manager.sample(3)
    names["3"] = "hospital-c"  # its key registered under a name the run takes
    assert len(manager.sample(3)) == 3


def test_a_note_that_cannot_be_written_costs_the_view_not_the_wait():
    def broken(_waiting) -> None:
        raise OSError("database away")

    manager = BoundedSites(5.0, broken)
    threading.Timer(0.3, manager.register, args=(_node(1),)).start()
    assert manager.wait_for(1) is True


def test_the_wait_is_kept_in_the_history_and_shown_as_an_alert_and_a_gauge(db_url: str):
    from fedweave.dashboard.prometheus import HistoryCollector

    now = datetime.now(timezone.utc)
    waiting = SitesWait(now, 2, 3, ("site2",), now + timedelta(seconds=900))
    with open_store(db_url) as store:
        run_id = store.start_run("federated", "digits", {"command": "coordinator"}, 0)
        store.note_round_started(run_id, RoundInFlight(4, now, 30.0, 3, 2))
        store.note_sites_wait(run_id, waiting)
        run = store.get_run(run_id)
        assert run.sites_wait == waiting and run.round_in_flight.round == 4  # both kept
        alerts = Views(store, AlertRules()).alerts(run, now)
        assert alerts["any"] and alerts["waiting"]["line"] == waiting.line()
        assert alerts["waiting"]["missing"] == ["site2"]
        gauges = {
            sample.name: sample.value
            for family in HistoryCollector(Views(store, AlertRules())).collect()
            for sample in family.samples
            if sample.labels.get("run_id") == run_id
        }
        assert gauges["fedweave_sites_missing"] == 1
        shown = subprocess.run(
            [sys.executable, "-m", "fedweave.cli", "history", "show", run_id, "--db", db_url],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert "waiting for sites: 2 of 3 connected since" in shown.stdout, shown.stdout
        assert "(missing: site2)" in shown.stdout
        store.note_sites_wait(run_id, None)  # the sites are back
        run = store.get_run(run_id)
        assert run.sites_wait is None and run.round_in_flight.round == 4
        store.note_sites_wait(run_id, waiting)
        store.finish_run(run_id, "interrupted", "waited 900 s for sites")
        assert store.get_run(run_id).sites_wait is None  # an ended run waits for nothing


def test_a_rounds_evaluation_asks_the_sites_connected_now_and_never_waits():
    """Evaluation samples through Flower's FedAvg, which asks for ``--min-clients`` sites: a
    site lost during the round must not hold the round open (issue 80)."""
    from flwr.common import Parameters
    from flwr.server.strategy import FedAvg

    from fedweave.coordinator.rounds.site_wait import ConnectedNow

    manager = BoundedSites(60.0)
    for node in (1, 2):
        manager.register(_node(node))
    strategy = FedAvg(fraction_evaluate=1.0, min_evaluate_clients=1, min_available_clients=3)
    started = time.monotonic()
    asked = strategy.configure_evaluate(1, Parameters([], ""), ConnectedNow(manager))
    assert sorted(proxy.node_id for proxy, _ in asked) == [1, 2]
    assert time.monotonic() - started < 1
    assert ConnectedNow(BoundedSites(60.0)).sample(3, 3) == []  # nobody there: nobody asked
