"""Gossip learning on real digits with real peer processes: it learns, it survives dead peers,
and a late joiner catches up. Slow (tens of seconds each): marked ``slow``, still run in CI."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedweave.config import RunConfig
from fedweave.simulations.gossip_simulation import GossipSimulation, run_gossip_simulation

pytestmark = pytest.mark.slow


def test_five_peers_on_digits_beat_chance_clearly(tmp_path: Path) -> None:
    report = run_gossip_simulation(
        GossipSimulation(
            RunConfig.of(clients=5, rounds=12, partition="iid", seed=1, db="none"), timeout_s=240
        ),
        work_dir=tmp_path,
    )
    assert report["mode"] == "gossip" and len(report["rounds"]) == 12
    assert report["final_accuracy"] > 0.6  # chance is 0.1
    assert all(p["final_accuracy"] > 0.5 for p in report["peers"])  # every peer, not the mean
    first, last = report["rounds"][0], report["rounds"][-1]
    assert last["accuracy"] > first["accuracy"]
    assert last["consensus_distance"] >= 0
    assert last["network_accuracy"] > 0.6  # the peers' mean model, evaluated by the launcher


def test_killing_two_of_six_peers_does_not_stall_the_rest(tmp_path: Path) -> None:
    timeout = 1.0
    report = run_gossip_simulation(
        GossipSimulation(
            RunConfig.of(
                clients=6,
                rounds=16,
                partition="iid",
                seed=2,
                kill="0.34@4",
                exchange_timeout=timeout,
                db="none",
            ),
            timeout_s=240,
        ),
        work_dir=tmp_path,
    )
    assert len(report["killed"]) == 2
    survivors = [p for p in report["peers"] if not p["killed"]]
    assert len(survivors) == 4 and all(p["done"] and p["rounds"] == 16 for p in survivors)
    # a round costs at most the deadlines of the neighbours it tried, plus training
    after = [r for r in report["rounds"] if r["round"] > report["killed_at_round"]]
    assert max(r["seconds"] for r in after) <= 2 * timeout + 3.0
    assert report["final_accuracy"] > 0.6
    assert all(p["final_accuracy"] > 0.5 for p in survivors)
    # the survivors keep mixing: their models end closer together than mid-run divergence
    distances = [r["consensus_distance"] for r in after]
    assert distances[-1] <= max(distances) + 1e-9


def test_a_late_joiner_catches_up_instead_of_starting_from_scratch(tmp_path: Path) -> None:
    report = run_gossip_simulation(
        GossipSimulation(
            # 60 paced rounds (~15 s) leave a loaded machine time to start the joiner's process
            RunConfig.of(
                clients=5, rounds=60, partition="iid", seed=3, round_interval=0.25, db="none"
            ),
            late="1@4",
            timeout_s=240,
        ),
        work_dir=tmp_path,
    )
    import json

    events = [json.loads(line) for line in (tmp_path / "peer-4.jsonl").read_text().splitlines()]
    rounds = [e for e in events if e["event"] == "round"]
    assert rounds, "the late joiner never completed a round"
    first = rounds[0]
    assert first["round"] > 4  # it took over the network's round count...
    others = next(r for r in report["rounds"] if r["round"] == first["round"])
    # ...and the model: its first accuracy is close to the others', far above a fresh model's
    assert first["accuracy"] > 0.6
    # closer to the others' than to what the network had after its first round (a fresh
    # start: 0.47-0.61 here); quiet, the joiner is within 0.01 of them, and a loaded CI
    # machine once had it at 0.77 against 0.93, which a fixed margin of 0.15 failed
    fresh = next(r for r in report["rounds"] if r["round"] == 1)["accuracy"]
    assert first["accuracy"] >= (fresh + others["accuracy"]) / 2, (fresh, others["accuracy"])


def test_every_peer_records_its_rounds_in_the_launchers_history_run(tmp_path: Path) -> None:
    from fedweave.history import open_store

    url = f"sqlite:///{tmp_path / 'history.db'}"
    report = run_gossip_simulation(
        GossipSimulation(
            RunConfig.of(clients=3, rounds=3, seed=4, db=url, checkpoint_dir=tmp_path / "ckpt"),
            timeout_s=180,
        ),
        work_dir=tmp_path / "work",
    )
    store = open_store(url)
    info = store.get_run(report["run_id"])
    assert (info.mode, info.status) == ("gossip", "completed")
    rows = store.rounds(report["run_id"])
    assert len(rows) == 9 and len({r["actor"] for r in rows}) == 3
    assert all(r["eval_accuracy"] is not None and r["model_sha256"] for r in rows)
    # every peer's model out: its last round checkpointed under the run's folder
    last = [r for r in rows if r["round"] == 3]
    assert len(last) == 3 and all(
        Path(r["checkpoint_path"]).is_relative_to(tmp_path / "ckpt" / report["run_id"])
        for r in last
    )
    sites = store.site_results(report["run_id"])
    assert sites and {s["site_id"] for s in sites} <= {r["actor"] for r in rows}


@pytest.mark.alone  # three peers' round starts within one 0.3 s slot: late under two-way load
def test_simulate_command_runs_gossip_in_slotted_rounds(tmp_path: Path) -> None:
    """The real ``fedweave simulate --mode gossip``: the report contract, and
    ``--round-interval`` reaching the peers (slotted rounds, recorded in the history)."""
    import json
    import subprocess
    import sys

    out = tmp_path / "report.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedweave.cli",
            "simulate",
            "--mode",
            "gossip",
            "--clients",
            "3",
            "--rounds",
            "6",
            "--round-interval",
            "0.3",
            "--db",
            f"sqlite:///{tmp_path / 'h.db'}",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "gossip" and report["config"]["gossip"]["round_interval"] == 0.3
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3, 4, 5, 6]
    # the peers agree on one slot lattice through their messages (their clocks are never
    # compared): whatever their start-up lag, within a few rounds every peer's round r runs
    # in the same 0.3 s slot, and no round is skipped
    from fedweave.history import open_store

    store = open_store(f"sqlite:///{tmp_path / 'h.db'}")
    rows = store.rounds(report["run_id"])
    store.close()
    starts: dict[int, list[float]] = {}
    for row in rows:
        starts.setdefault(row["round"], []).append(row["started_at"].timestamp())
    assert sorted(starts) == list(range(1, 7)) and all(len(s) == 3 for s in starts.values())
    in_step = [max(starts[r]) - min(starts[r]) for r in (5, 6)]
    assert all(spread < 0.3 for spread in in_step), starts
    assert 0.25 < min(starts[6]) - min(starts[5]) < 0.35, starts
    assert all(r["accuracy"] is not None for r in report["rounds"])
    assert all(0 <= r["network_accuracy"] <= 1 for r in report["rounds"])
