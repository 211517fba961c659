"""Crash and resume with real processes: kill -9 a federated simulation, resume it, and
find every round recorded exactly once, the run completed, and every round's score the same
as an uninterrupted run's."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fedweave.history import open_store

ROUNDS = 10
COMMON = [
    "--task",
    "digits",
    "--clients",
    "3",
    "--rounds",
    str(ROUNDS),
    "--local-epochs",
    "4",
    "--partition",
    "iid",
    "--seed",
    "7",
]


def fedweave(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fedweave.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def recorded_rounds(db_url: str) -> list[int]:
    store = open_store(db_url)
    try:
        runs = store.list_runs()
        return [r["round"] for r in store.rounds(runs[0].run_id)] if runs else []
    finally:
        store.close()


@pytest.mark.slow
def test_kill_9_after_round_3_then_resume(tmp_path):
    db = f"sqlite:///{tmp_path / 'history.db'}"
    flags = [*COMMON, "--db", db, "--checkpoint-dir", str(tmp_path / "ckpt")]
    victim = fedweave(
        "simulate", *flags, "--out", str(tmp_path / "first.json"), start_new_session=True
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and victim.poll() is None:
        if (tmp_path / "history.db").exists() and len(recorded_rounds(db)) >= 3:
            break
        time.sleep(0.05)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.communicate(timeout=30)
    done_before = recorded_rounds(db)
    assert 3 <= len(done_before) < ROUNDS, f"kill came too late: {done_before}"

    store = open_store(db)  # the next start notices the dead process
    run = store.list_runs()[0]
    assert run.status == "interrupted"
    store.close()

    resumed = fedweave(
        "simulate",
        "--resume",
        "latest",
        "--db",
        db,
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--out",
        str(tmp_path / "resumed.json"),
    )
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert f"resuming run {run.run_id} after round {len(done_before)}" in err

    store = open_store(db)
    rounds = [r["round"] for r in store.rounds(run.run_id)]
    final = store.get_run(run.run_id)
    store.close()
    assert rounds == list(range(1, ROUNDS + 1))
    assert final.status == "completed" and final.rounds_completed == ROUNDS
    report = json.loads((tmp_path / "resumed.json").read_text())
    assert [row["round"] for row in report["rounds"]] == list(range(1, ROUNDS + 1))

    straight = fedweave(
        "simulate",
        *COMMON,
        "--db",
        f"sqlite:///{tmp_path / 'other.db'}",
        "--checkpoint-dir",
        str(tmp_path / "ckpt2"),
        "--out",
        str(tmp_path / "straight.json"),
    )
    _, err = straight.communicate(timeout=300)
    assert straight.returncode == 0, err[-3000:]
    uninterrupted = json.loads((tmp_path / "straight.json").read_text())
    # a seeded run repeats exactly, so resuming from round k's checkpoint must reproduce it
    assert [row["accuracy"] for row in report["rounds"]] == [
        row["accuracy"] for row in uninterrupted["rounds"]
    ]
    assert [row["loss"] for row in report["rounds"]] == pytest.approx(
        [row["loss"] for row in uninterrupted["rounds"]], rel=1e-9
    )


def test_resume_errors(tmp_path):
    db = f"sqlite:///{tmp_path / 'h.db'}"
    store = open_store(db)
    done = store.start_run("federated", "digits", {"task": "digits", "rounds": 2}, 0)
    store.finish_run(done, "completed")
    gossip = store.start_run("gossip", "digits", {"task": "digits"}, 0)
    store.finish_run(gossip, "interrupted")
    open_run = store.start_run(
        "federated", "digits", {"task": "digits", "rounds": 5, "clients": 3}, 0
    )
    store.finish_run(open_run, "interrupted")
    store.close()
    cases = [
        ("nosuchrun", "run 'nosuchrun' is not in"),
        (done, "already completed"),
        (gossip, "is a gossip run"),
    ]
    for ref, message in cases:
        proc = fedweave("simulate", "--resume", ref, "--db", db, "--out", str(tmp_path / "r.json"))
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2 and message in err, err
    proc = fedweave(
        "simulate",
        "--resume",
        open_run,
        "--rounds",
        "9",
        "--db",
        db,
        "--out",
        str(tmp_path / "r.json"),
    )
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "cannot resume run" in err and "--rounds 9 (run has 5)" in err


@pytest.mark.slow
def test_a_sample_dp_run_resumed_keeps_every_sites_ledger(tmp_path):
    """--dp sample killed after round 2 and resumed without naming --checkpoint-dir (from
    another folder): the run's recorded --checkpoint-dir, where its sites' ledgers are, is
    used, so every site's epsilon after round 3 is that of three rounds (the uninterrupted
    run's); with those ledgers gone the resume is refused in one line."""
    from fedweave.learning.sample_dp import SiteLedger

    db = f"sqlite:///{tmp_path / 'history.db'}"
    flags = ["--task", "digits", "--clients", "3", "--rounds", "3", "--partition", "iid",
             "--dp", "sample", "--noise-multiplier", "1.0", "--evaluate-every", "0",
             "--db", db]  # fmt: skip
    checkpoints = tmp_path / "ckpt"
    victim = fedweave(
        "simulate", *flags, "--checkpoint-dir", str(checkpoints),
        "--out", str(tmp_path / "first.json"), start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and victim.poll() is None:
        if (tmp_path / "history.db").exists() and len(recorded_rounds(db)) >= 2:
            break
        time.sleep(0.05)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.communicate(timeout=30)
    assert recorded_rounds(db) == [1, 2], "the kill came too late or too early"
    with open_store(db) as store:
        run_id = store.list_runs()[0].run_id
    ledgers = checkpoints / run_id / "site-ledgers"
    steps_after_two = {p.name: _steps(SiteLedger(p)) for p in ledgers.glob("*.json")}
    assert len(steps_after_two) == 3

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ledgers.rename(tmp_path / "moved-away")
    refused = fedweave("simulate", "--resume", "latest", "--db", db, "--out", "r.json",
                       cwd=elsewhere)  # fmt: skip
    _, err = refused.communicate(timeout=120)
    assert refused.returncode == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(
        f"error: cannot resume run {run_id}: its sites' privacy ledgers are not in {ledgers}"
    )
    (tmp_path / "moved-away").rename(ledgers)

    resumed = fedweave("simulate", "--resume", "latest", "--db", db, "--out", "r.json",
                       cwd=elsewhere)  # fmt: skip
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert not (elsewhere / "checkpoints").exists()  # nothing written beside the new cwd
    with open_store(db) as store:
        rounds = store.rounds(run_id)
    assert [r["round"] for r in rounds] == [1, 2, 3]
    sites = rounds[-1]["extra"]["privacy"]["sites"]
    reported = sorted(sites.values())
    kept = []
    for path in ledgers.glob("*.json"):
        ledger = SiteLedger(path)
        # three rounds' steps in one ledger: the uninterrupted run's, none counted from zero
        assert _steps(ledger) * 2 == steps_after_two[path.name] * 3
        kept.append(ledger.epsilon(1e-5))
    assert len(sites) == 3 and reported == sorted(kept)


def _steps(ledger) -> int:
    return sum(steps for _, _, steps in ledger.history)
