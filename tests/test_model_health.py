"""A run says when it stopped learning: a non-finite loss or a fall back to chance, on the
progress line and in the history."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import datetime, timezone

from fedweave.coordinator.rounds.model_health import ModelHealth
from fedweave.history import open_store
from fedweave.history.records import SiteResult
from fedweave.history.round_summary import RoundSummary


def _summary(round: int, accuracy: float, loss: float = 1.0, sites=()) -> RoundSummary:
    now = datetime.now(timezone.utc)
    return RoundSummary(round, loss, accuracy, 0.1, now, now, [], sites=list(sites))


class _Keep:
    def __init__(self) -> None:
        self.seen: list[RoundSummary] = []

    def on_round(self, summary: RoundSummary) -> None:
        self.seen.append(summary)


def test_a_fall_back_to_chance_is_said_once_the_model_had_learned():
    kept = _Keep()
    health = ModelHealth([kept], num_classes=10)
    for n, accuracy in enumerate([0.11, 0.79, 0.10, 0.71], start=1):
        health.on_round(_summary(n, accuracy))
    warned = [bool(s.warnings) for s in kept.seen]
    assert warned == [False, False, True, False]  # round 1 near chance has not learned yet
    assert "fell back to chance (accuracy 0.100, chance 0.100, best so far 0.790)" in (
        kept.seen[2].warnings[0]
    )


def test_non_finite_losses_are_said():
    kept = _Keep()
    health = ModelHealth([kept], num_classes=0)  # regression: no chance level
    bad_site = SiteResult("7", "rejected", reason="tensor 0 has non-finite values (NaN or inf)")
    health.on_round(_summary(1, None, float("nan"), [bad_site, SiteResult("8")]))
    text = " ".join(kept.seen[0].warnings)
    assert "1 site(s)' training loss became NaN or infinite" in text
    assert "the global model's loss is not finite" in text


def test_a_diverging_run_says_so_on_the_progress_line_and_in_the_history(tmp_path):
    db = f"sqlite:///{tmp_path / 'h.db'}"
    done = subprocess.run(
        [sys.executable, "-m", "fedweave.cli", "simulate", "--task", "digits", "--clients", "3",
         "--rounds", "2", "--lr", "1000", "--no-secure-agg", "--db", db,
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"warning: \d site\(s\)' training loss became NaN or infinite", done.stderr)
    with open_store(db) as store:
        rounds = store.rounds(store.list_runs()[0].run_id)
    assert any("NaN or infinite" in w for w in rounds[0]["extra"]["warnings"])


def test_sites_are_recorded_by_a_valid_name_only():
    from fedweave.contract import SITE_NAME_METRIC
    from fedweave.coordinator.rounds.site_names import SiteNames

    kept = _Keep()
    names = SiteNames([kept])
    sites = [
        SiteResult("11", metrics={SITE_NAME_METRIC: "hospital-a", "train_loss": 0.5}),
        SiteResult("12", metrics={SITE_NAME_METRIC: "x" * 300}),
        SiteResult("13", metrics={SITE_NAME_METRIC: "hospital-a"}),
    ]
    names.on_round(_summary(1, 0.5, sites=sites))
    ids = [s.site_id for s in kept.seen[0].sites]
    assert ids == ["hospital-a (node 11)", "12", "hospital-a (node 13)"]
    assert any("sent a name that is not one" in w for w in kept.seen[0].warnings)
    assert any("2 sites call themselves 'hospital-a'" in w for w in kept.seen[0].warnings)
    # a site that fails later is still recorded by the name it gave
    names.on_round(_summary(2, 0.5, sites=[SiteResult("11", "late", reason="no reply")]))
    assert kept.seen[1].sites[0].site_id == "hospital-a"
    assert kept.seen[1].sites[0].metrics["node_id"] == "11"


def test_a_registered_site_is_recorded_under_its_keys_name_whatever_it_claims(tmp_path):
    """Deployed with site keys: the coordinator's node id → registered name file binds each
    name to a key; a site claiming another's name (or none) is recorded under its own, with
    one warning per node; a site without a registered key keeps the name it gives."""
    import os

    from fedweave.contract import SITE_NAME_METRIC
    from fedweave.coordinator.plan import (
        MAX_SITE_NAMES_BYTES,
        SITE_NAMES_FILE,
        registered_site_names,
        write_site_names,
    )
    from fedweave.coordinator.rounds.site_names import SiteNames

    secrets = tmp_path / "secrets"
    write_site_names(secrets, {"11": "alpha", "12": "beta"})
    assert os.stat(secrets / SITE_NAMES_FILE).st_mode & 0o777 == 0o600
    registered = registered_site_names(secrets / "deployment.json")
    kept = _Keep()
    names = SiteNames([kept], registered)
    sites = [
        SiteResult("11", metrics={SITE_NAME_METRIC: "alpha"}),
        SiteResult("12", metrics={SITE_NAME_METRIC: "alpha"}),  # beta's key, alpha's name
        SiteResult("13", metrics={SITE_NAME_METRIC: "gamma"}),  # not registered (yet)
    ]
    names.on_round(_summary(1, 0.5, sites=sites))
    assert [s.site_id for s in kept.seen[0].sites] == ["alpha", "beta", "gamma"]
    claims = [w for w in kept.seen[0].warnings if "recorded under the name its key" in w]
    assert claims == ["site beta (node 12) sent the name 'alpha'; recorded under the name its "
                      "key is registered with"]  # fmt: skip
    # the next round: the same claim is not warned of again; a key registered meanwhile binds
    write_site_names(secrets, {"11": "alpha", "12": "beta", "13": "delta"})
    names.on_round(_summary(2, 0.5, sites=[SiteResult("12", metrics={SITE_NAME_METRIC: "alpha"}),
                                           SiteResult("13", metrics={SITE_NAME_METRIC: "gamma"})]))
    assert [s.site_id for s in kept.seen[1].sites] == ["beta", "delta"]
    assert [w for w in kept.seen[1].warnings if "recorded under" in w] == [
        "site delta (node 13) sent the name 'gamma'; recorded under the name its key is "
        "registered with"
    ]
    # an unregistered site (--allow-unregistered-sites) claiming a registered name: the
    # registered site keeps it, the claimant is told apart by its node id
    names.on_round(_summary(3, 0.5, sites=[SiteResult("12", metrics={SITE_NAME_METRIC: "beta"}),
                                           SiteResult("14", metrics={SITE_NAME_METRIC: "beta"})]))
    assert [s.site_id for s in kept.seen[2].sites] == ["beta", "beta (node 14)"]
    # what the ServerApp reads is bounded, and a broken file means no registered names
    (secrets / SITE_NAMES_FILE).write_text("{not json")
    assert registered() == {}
    (secrets / SITE_NAMES_FILE).write_bytes(b" " * (MAX_SITE_NAMES_BYTES + 1))
    assert registered() == {}
    assert registered_site_names(None) is None
