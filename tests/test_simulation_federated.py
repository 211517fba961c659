"""Federated simulation end to end: the real `fedweave` command, Flower's engine, real data."""

import json
import subprocess
import sys

import numpy as np
import pytest

FEDWEAVE = [sys.executable, "-m", "fedweave.cli"]


def run_cli(*args: str, cwd=None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*FEDWEAVE, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


@pytest.mark.slow
def test_three_sites_two_rounds_beat_chance(tmp_path):
    out = tmp_path / "report.json"
    result = run_cli(
        "simulate",
        "--mode",
        "federated",
        "--task",
        "digits",
        "--clients",
        "3",
        "--rounds",
        "2",
        "--partition",
        "dirichlet",
        "--alpha",
        "0.5",
        "--seed",
        "0",
        "--out",
        str(out),
        "--db",
        f"sqlite:///{tmp_path / 'h.db'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "federated" and report["task"] == "digits"
    assert report["clients"] == 3
    assert [row["round"] for row in report["rounds"]] == [1, 2]
    for row in report["rounds"]:
        assert {"round", "accuracy", "loss", "seconds"} <= row.keys()
        assert row["replied"] == 3 and row["failed"] == 0
    assert report["final_accuracy"] == report["rounds"][-1]["accuracy"]
    assert report["final_accuracy"] > 0.5  # chance is 0.1
    assert "round    2" in result.stderr  # per-round progress lines


@pytest.mark.slow
def test_sampling_k_of_n(tmp_path):
    out = tmp_path / "r.json"
    result = run_cli(
        "simulate",
        "--clients",
        "5",
        "--clients-per-round",
        "3",
        "--rounds",
        "2",
        "--out",
        str(out),
        "--db",
        f"sqlite:///{tmp_path / 'h.db'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert all(row["replied"] == 3 for row in json.loads(out.read_text())["rounds"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "nope"], "unknown task 'nope'"),
        (["--partition", "dirichlet", "--alpha", "0"], "--alpha must be > 0"),
        (["--partition", "dirichlet", "--alpha", "-1"], "--alpha must be > 0"),
        (["--clients", "5000"], "more than the 1438 training examples"),
        (["--rounds", "0"], "--rounds must be at least 1"),
        (["--out", "/nonexistent-dir/report.json"], "does not exist"),
        (["--clients", "3", "--clients-per-round", "4"], "--clients-per-round"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    result = run_cli("simulate", *args, cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {lines[0][7:]}"] and message in lines[0]
    assert "Traceback" not in result.stderr


def test_out_that_is_a_directory_is_refused(tmp_path):
    result = run_cli("simulate", "--out", str(tmp_path), timeout=120)
    assert result.returncode == 2 and "is a directory" in result.stderr


def test_data_split_writes_site_files(tmp_path):
    out = tmp_path / "split"
    result = run_cli(
        "data",
        "split",
        "--task",
        "digits",
        "--clients",
        "4",
        "--partition",
        "dirichlet",
        "--alpha",
        "0.5",
        "--seed",
        "1",
        "--out",
        str(out),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    sizes = [len(np.load(out / f"site-{i}.npz")["y"]) for i in range(4)]
    assert sum(sizes) == 1438 and len(np.load(out / "test.npz")["y"]) == 359
    again = run_cli(
        "data",
        "split",
        "--clients",
        "4",
        "--partition",
        "dirichlet",
        "--seed",
        "1",
        "--out",
        str(tmp_path / "again"),
        timeout=120,
    )
    assert again.returncode == 0
    assert np.array_equal(
        np.load(out / "site-2.npz")["x"], np.load(tmp_path / "again/site-2.npz")["x"]
    )


@pytest.mark.slow
def test_a_run_none_of_whose_rounds_took_an_update_fails_with_the_reason(tmp_path):
    """Issue 75: a run whose every round halted ended ``completed`` at chance. Every site
    of this one crashes while training: the run is recorded ``failed`` with the first round's
    reason, and the command says so in one line, exit 2."""
    import os
    from pathlib import Path

    from fedweave.history import open_store
    from fedweave.history.metrics import nothing_learned

    db = f"sqlite:///{tmp_path / 'history.db'}"
    tests = str(Path(__file__).parent)
    result = subprocess.run(
        [*FEDWEAVE, "simulate", "--task", "fault_tasks:EverySiteRaisingDigits", "--clients", "3",
         "--rounds", "2", "--partition", "iid", "--no-secure-agg", "--round-timeout", "60",
         "--db", db],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (tests, os.environ.get("PYTHONPATH")) if p)},
    )  # fmt: skip
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert "failed: none of the run's 2 rounds took a site's update (round 1: site s" in lines[0]
    assert " failed: RuntimeError: injected fault: this site crashes while training" in lines[0]
    assert lines[0].count("injected fault") == 1  # the same words said once
    assert "Traceback" not in result.stderr
    with open_store(db) as store:
        (run,) = store.list_runs()
        assert run.status == "failed" and run.reason.startswith("none of the run's 2 rounds")
        rows = store.rounds(run.run_id)
        first = store.site_results(run.run_id, 1)
        assert nothing_learned(rows, run.run_id, first) == run.reason
    assert f"`fedweave history show {run.run_id} --sites` gives each site's reason" in lines[0]
    assert nothing_learned([]) is None
    assert nothing_learned([{"round": 1, "replied": 1}, {"round": 2, "replied": 0}]) is None
