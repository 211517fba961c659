"""A simulated run of five digits sites some of which are insiders (``fault_tasks.
MarkedDigits``: each marked site file says how its rewritten install behaves), recorded in
a history database: for the tests and the bench that replay issue 39's insiders."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fault_tasks import mark_site

from fedweave.history import open_store

TESTS = Path(__file__).resolve().parent


def run_with_insiders(
    work: Path, marks: dict[int, float], options: list[str], seed: int = 0
) -> tuple[list[dict], list[dict]]:
    """Split digits for five sites (iid, ``seed``) in ``work``, write ``marks`` (site index:
    mark) into their files, and run ``fedweave simulate --task fault_tasks:MarkedDigits`` with
    ``options`` there (``--no-secure-agg`` and the rest of the run's choices); return its
    recorded rounds and site results. A failed command fails with the end of its stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)}  # fmt: skip
    fedweave = [sys.executable, "-m", "fedweave.cli"]
    split = subprocess.run(
        [*fedweave, "data", "split", "--task", "digits", "--clients", "5", "--partition", "iid",
         "--seed", str(seed), "--out", "split"],
        capture_output=True, text=True, timeout=120, cwd=work, env=env,
    )  # fmt: skip
    assert split.returncode == 0, split.stderr[-2000:]
    (work / "split" / "test.npz").rename(work / "test.npz")
    for index, mark in marks.items():
        mark_site(work / "split" / f"site-{index}.npz", mark)
    db = f"sqlite:///{work / 'h.db'}"
    done = subprocess.run(
        [*fedweave, "simulate", "--task", "fault_tasks:MarkedDigits", "--data-dir", "split",
         "--test-data", "test.npz", "--seed", str(seed), "--db", db, "--out", "r.json",
         *options],
        capture_output=True, text=True, timeout=600, cwd=work, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    with open_store(db) as store:
        run_id = store.list_runs()[0].run_id
        return store.rounds(run_id), store.site_results(run_id)
