"""Sites of unequal speed on a simulated clock, and buffered asynchronous aggregation
(FedBuff) in the simulation engine: the speed model, the synchronous round's simulated
length and its stragglers, FedBuff's staleness rule, its refusals, and real simulated runs
whose history records every applied buffer with its members, their staleness and the clock."""

from __future__ import annotations

import math

import pytest
from test_secure_agg import run_recorded

from fedweave.config import RunConfig
from fedweave.config.commands import check_settings
from fedweave.coordinator.rounds.fedbuff import staleness_weight
from fedweave.coordinator.rounds.simulated_clock import round_seconds
from fedweave.errors import UserError
from fedweave.history.records import SiteResult
from fedweave.learning.site_speeds import SiteSpeeds, share_done_by


def test_site_speeds_are_fixed_by_seed_and_name_and_parse_in_one_line():
    speeds = SiteSpeeds.parse("lognormal:1", seed=3)
    assert speeds.factors("site-1") == SiteSpeeds.parse("lognormal:1", 3).factors("site-1")
    assert speeds.factors("site-1") != speeds.factors("site-2")
    assert speeds.factors("site-1") != SiteSpeeds.parse("lognormal:1", 4).factors("site-1")
    assert SiteSpeeds.parse("equal", 0).factors("anything") == (1.0, 1.0)
    heavy = [max(SiteSpeeds.parse("pareto:1.2", 0).factors(f"s{i}")) for i in range(300)]
    assert min(heavy) >= 1.0 and max(heavy) > 5 * sorted(heavy)[150]  # a heavy tail
    equal = SiteSpeeds.parse("equal", 0)
    assert equal.job_seconds("a", 1000, 2, 5_000_000) == pytest.approx(2.0 + 1.0)
    refused = (("fast", "unknown spread 'fast'"), ("lognormal", "is not a number"),
               ("pareto:-1", "must be above 0"), ("equal:2", "takes no parameter"))  # fmt: skip
    for bad, said in refused:
        with pytest.raises(UserError, match=said):
            SiteSpeeds.parse(bad, 0)


def test_a_round_lasts_as_long_as_its_slowest_site_or_its_deadline():
    def site(status, seconds=None):
        return SiteResult("s", status, 10, {} if seconds is None else {"sim_seconds": seconds})

    assert round_seconds([site("ok", 3.0), site("ok", 7.5)], None) == 7.5
    assert round_seconds([site("ok", 3.0), site("late")], 10.0) == 10.0
    assert round_seconds([site("ok", 3.0), site("ok", 10.0)], 10.0) == 10.0  # partial work
    assert round_seconds([site("failed"), site("lost")], 10.0) == 10.0  # a halted round
    assert share_done_by(10.0, 4.0, 1.0) == 1.0
    assert share_done_by(10.0, 18.0, 1.0) == pytest.approx(0.5)
    assert share_done_by(10.0, 5.0, 12.0) == 0.0


def test_stale_updates_count_less():
    assert staleness_weight(0) == 1.0
    assert staleness_weight(3) == pytest.approx(0.5)
    assert staleness_weight(8) == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    "values, said",
    [
        ({"schedule": "async", "buffer": 7}, "--buffer 7 is more than the 6 sites"),
        ({"schedule": "async", "strategy": "krum"}, "--strategy krum works on a round's whole"),
        ({"schedule": "async", "secure_agg": True, "buffer": 2}, r"needs at least 3 sites"),
        ({"schedule": "async", "clients_per_round": 3}, "--clients-per-round samples"),
        ({"buffer": 3}, "--buffer is for --schedule async"),
        ({"max_staleness": 2}, "--max-staleness is for --schedule async"),
        ({"server_lr": 0.5}, "--server-lr is for --schedule async"),
        ({"simulated_deadline": 5.0}, "--simulated-deadline needs a simulated clock"),
        ({"site_speeds": "lognormal:1", "stragglers": 0.2}, "pick one"),
        ({"site_speeds": "warp:9"}, "unknown spread 'warp'"),
    ],
)
def test_the_schedule_refuses_what_it_cannot_do(values, said):
    config = RunConfig.of(**{"clients": 6, "secure_agg": False, **values})
    with pytest.raises(UserError, match=said):
        check_settings(config, "simulate")  # the sites: --clients 6


def test_the_command_refuses_a_bad_schedule_in_one_line(tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "fedweave.cli", "simulate", "--clients", "4", "--rounds", "2",
         "--schedule", "async", "--buffer", "9", "--no-secure-agg", "--db", "none",
         "--out", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: --buffer 9 is more than")


@pytest.mark.slow
def test_fedbuff_records_each_buffer_with_its_members_staleness_and_clock(tmp_path):
    sim = RunConfig.of(
        task="digits", clients=6, rounds=6, partition="iid", secure_agg=False,
        schedule="async", buffer=2, max_staleness=4, site_speeds="lognormal:1", seed=1,
    )  # fmt: skip
    rows, rounds, sites, _ = run_recorded(sim, tmp_path, "fedbuff")
    assert [r["round"] for r in rounds] == [1, 2, 3, 4, 5, 6]
    clocks = [r["extra"]["simulated_clock"] for r in rounds]
    assert clocks == sorted(clocks) and clocks[0] > 0  # the simulated clock only moves on
    for row in rounds:
        assert row["extra"]["simulated_seconds"] == pytest.approx(
            row["extra"]["simulated_clock"] - (0 if row["round"] == 1 else
                                               clocks[row["round"] - 2]))  # fmt: skip
    members = [s for s in sites if s["status"] == "ok"]
    for r in rounds:  # every buffer took 2 updates, from 2 different sites
        taken = [s["site_id"] for s in members if s["round"] == r["round"]]
        assert len(taken) == len(set(taken)) == 2, (r["round"], taken)
    assert all("staleness" in s["metrics"] for s in members)
    assert max(s["metrics"]["staleness"] for s in members) >= 1  # slow sites arrive late
    assert {s["site_id"] for s in sites} <= {f"site-{i}" for i in range(6)}
    # six steps of two updates: learning, well above chance (0.1); this seed gives 0.49
    assert rows[-1]["accuracy"] > 0.3 and math.isfinite(rows[-1]["loss"])
    assert rows[-1]["simulated_clock"] == clocks[-1]  # in the report too


@pytest.mark.slow
def test_a_seeded_fedbuff_run_on_the_simulated_clock_repeats_exactly(tmp_path):
    sim = RunConfig.of(
        task="digits", clients=4, rounds=4, partition="iid", secure_agg=False,
        schedule="async", buffer=2, site_speeds="lognormal:1", seed=5,
    )  # fmt: skip
    first = run_recorded(sim, tmp_path, "first")[1]
    again = run_recorded(sim, tmp_path, "again")[1]
    assert [r["model_sha256"] for r in first] == [r["model_sha256"] for r in again]


@pytest.mark.slow
def test_a_synchronous_round_waits_for_its_slowest_site_or_drops_it_at_the_deadline(tmp_path):
    """FedAvg under a simulated deadline: exactly the sites whose job (from the speed model,
    their examples and the model's size) does not fit are late, each round, with the reason;
    a round lasts as long as its slowest site, or its deadline when one was late."""
    import numpy as np

    from fedweave.learning.weights import load_weights_npz

    deadline = 0.5
    sim = RunConfig.of(
        task="digits", clients=4, rounds=2, partition="iid", secure_agg=False, local_epochs=1,
        site_speeds="pareto:1", seed=2, simulated_deadline=deadline, eval_fraction=0.0,
        evaluate_every=0,
    )  # fmt: skip
    _, rounds, sites, split = run_recorded(sim, tmp_path, "sync-speeds")
    model_bytes = sum(w.nbytes for w in load_weights_npz(rounds[0]["checkpoint_path"]))
    speeds = SiteSpeeds.parse("pareto:1", 2)
    jobs = {
        f"site-{i}": speeds.job_seconds(
            f"site-{i}", len(np.load(split / f"site-{i}.npz")["y"]), 1, model_bytes)
        for i in range(4)
    }  # fmt: skip
    expected_late = {name for name, job in jobs.items() if job > deadline}
    assert 0 < len(expected_late) < 4, jobs  # the seed gives both kinds
    for row in rounds:
        in_round = [s for s in sites if s["round"] == row["round"]]
        assert {s["site_id"] for s in in_round if s["status"] == "late"} == expected_late
        assert row["extra"]["simulated_seconds"] == pytest.approx(deadline)
        for site in in_round:
            if site["status"] == "ok":
                assert site["metrics"]["sim_seconds"] == pytest.approx(jobs[site["site_id"]])
            else:
                assert "simulated: its job takes" in site["reason"]


@pytest.mark.slow
def test_two_insiders_in_a_fedbuff_run_cannot_carry_the_model_off(tmp_path):
    """Issue 39's FedBuff rows, replayed in arrival order (no simulated clock): five digits
    sites, ``--buffer 2``, 30 steps. One site (its install rewritten:
    ``fault_tasks.MarkedDigits``) sends NaN weights after its own update check; another sends
    zero weights claiming 10**12 examples. Before the arrivals were checked and bounded the
    model sat at chance (0.10) from step 2 on; now the NaN updates are ``rejected`` with the
    reason, the claim weighs in as two median sites, its change counts at most as much as
    the median site's, the first step waits for three sites' figures, and no site fills two
    slots of a buffer: the model learns (0.82 and 0.67 at step 30 in two runs here; arrival
    order makes each run differ)."""
    from fault_tasks import NAN_SENDING_MARK, ZEROS_CLAIMING_MARK
    from insider_runs import run_with_insiders

    rounds, sites = run_with_insiders(
        tmp_path, {3: NAN_SENDING_MARK, 4: ZEROS_CLAIMING_MARK},
        ["--rounds", "30", "--no-secure-agg", "--schedule", "async", "--buffer", "2"],
    )  # fmt: skip
    accuracy = [r["eval_accuracy"] for r in rounds]
    assert len(rounds) == 30 and all(math.isfinite(r["eval_loss"]) for r in rounds), accuracy
    assert sum(accuracy[-5:]) / 5 >= 0.5, accuracy
    nan_site = [s for s in sites if s["site_id"] == "site-3"]
    # a simulation worker's first reply is made before the rewritten install takes over
    assert sum(s["status"] == "rejected" for s in nan_site) >= 3, nan_site
    assert all("non-finite" in s["reason"] for s in nan_site if s["status"] == "rejected")
    claimed = [s for s in sites if s["site_id"] == "site-4" and s["status"] == "ok"]
    assert claimed and all(s["num_examples"] == 10**12 for s in claimed), claimed
    for row in claimed:  # bounded from step 1: it waited for three sites' figures
        notes = rounds[row["round"] - 1]["extra"]["warnings"]
        assert any("claimed 1e+12 examples" in w and "run's median site" in w for w in notes)
    for r in rounds:  # one slot a site in every buffer
        taken = [s["site_id"] for s in sites if s["round"] == r["round"] and s["status"] == "ok"]
        assert len(taken) == len(set(taken)) == 2, (r["round"], taken)
