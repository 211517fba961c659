"""Round deadlines and k-of-n rounds in the simulation engine: a site that stalls past the
deadline is recorded late, the round closes on time with the replies it has, a round with fewer
replies than --min-replies is recorded as failed and keeps the model, and the run goes on.

In a simulation, round 1 also waits for the engine to start (Ray workers importing torch,
~15 s here). The plain case uses a deadline shorter than that on purpose (round 1 then fails
whole and the run goes on), yet long enough that the healthy sites of round 2 reply in time
on a loaded machine (6 s was not: a loaded run saw round 2 with no reply at all); the SecAgg+
case keeps its deadline above it, because the engine may hand one site's late messages to two
workers at once, which SecAgg+'s per-site state does not survive (a deployed site handles its
messages one at a time).
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone

import pytest
from fault_tasks import SLOW_ONCE_ENV, STALL_SECONDS_ENV
from test_secure_agg import run_recorded

from fedweave.config import RunConfig
from fedweave.coordinator.rounds.deadlines import (
    DEADLINE_FLOOR_SECONDS,
    MEASURED_FACTOR,
    NO_DATA_DEADLINE_SECONDS,
    RoundDeadline,
)
from fedweave.history.records import SiteResult
from fedweave.history.round_summary import RoundSummary


@pytest.mark.alone  # times the round against its deadline (a loaded run saw no reply in time)
@pytest.mark.parametrize(
    "secure_agg, deadline", [(False, 12.0), (True, 25.0)], ids=["plain", "secagg"]
)
def test_a_stalled_site_is_late_and_the_round_closes_at_its_deadline(
    tmp_path, monkeypatch, secure_agg, deadline
):
    # the stall's marker reaches the sites through this job's runtime environment: the
    # workers of the tests' shared Ray cluster do not inherit this process's environment.
    # Flower's engine joins a Ray already initialised in this process as it is (and shuts it
    # down at the end); the path lets its actors import fault_tasks, as Flower's own init does
    import os

    import ray

    stall, stall_seconds = str(tmp_path / "stall"), deadline * 1.1 + 2  # just past the close
    path = os.pathsep.join([*sys.path, *filter(None, [os.environ.get("PYTHONPATH")])])
    ray.init(address=os.environ.get("RAY_ADDRESS") or "local", include_dashboard=False,
             logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, SLOW_ONCE_ENV: stall,
                                       STALL_SECONDS_ENV: str(stall_seconds)}})  # fmt: skip
    sim = RunConfig.of(
        task="fault_tasks:StallsInRound2Digits", clients=3, rounds=3, partition="iid",
        secure_agg=secure_agg, round_timeout=deadline, min_replies=3 if not secure_agg else None,
    )  # fmt: skip
    try:
        rows, rounds, sites, _ = run_recorded(sim, tmp_path, "deadline")
    finally:
        ray.shutdown()  # Flower's engine did, unless it failed first
    assert (tmp_path / "stall.2").exists()  # the stall really happened (in round 2)
    _, first, second = rounds  # round 1 includes the engine's start-up: not timed here
    assert first["sampled"] == 3 and first["replied"] == 2
    # the round closed at its deadline (plus central evaluation), not when the site woke up
    assert first["extra"]["seconds"] <= deadline * 1.1 < stall_seconds
    late = [s for s in sites if s["status"] == "late" and s["round"] == 2]
    assert len(late) == 1, sites
    assert f"round deadline ({deadline:g} s)" in late[0]["reason"]
    # the late reply was discarded: round 3 is a fresh round with every site in it
    assert second["replied"] == 3 and second["extra"].get("failed") is None
    if secure_agg:  # 2 of 3 is above SecAgg+'s threshold: the round aggregated without it
        assert first["extra"].get("failed") is None
        assert rows[1]["accuracy"] != rows[0]["accuracy"]
    else:  # --min-replies 3: the round failed and kept round 1's model
        assert "--min-replies 3" in first["extra"]["failed"]
        assert first["model_sha256"] == rounds[0]["model_sha256"]
        assert second["model_sha256"] != first["model_sha256"]


def _round_with(*seconds: float, late: int = 0) -> RoundSummary:
    sites = [SiteResult(str(i), "ok", 10, seconds=s) for i, s in enumerate(seconds)]
    sites += [SiteResult(str(100 + i), "late", reason="no reply") for i in range(late)]
    now = datetime.now(timezone.utc)
    return RoundSummary(
        round=1, loss=None, accuracy=None, seconds=1.0, started_at=now, ended_at=now,
        weights=[], sites=sites,
    )  # fmt: skip


def test_a_measured_deadline_follows_the_slowest_site_between_its_floor_and_ceiling():
    deadline = RoundDeadline(NO_DATA_DEADLINE_SECONDS, measured=True)
    deadline.on_round(_round_with(late=3))  # nothing measured yet: the starting deadline
    assert deadline.seconds == NO_DATA_DEADLINE_SECONDS
    deadline.on_round(_round_with(2.0, 30.0, late=1))
    assert deadline.seconds == MEASURED_FACTOR * 30.0
    deadline.on_round(_round_with(1.0, 1.0))  # the slowest site so far still counts
    assert deadline.seconds == MEASURED_FACTOR * 30.0
    deadline.on_round(_round_with(1e9))  # a site's claim cannot hold rounds open longer
    assert deadline.seconds == NO_DATA_DEADLINE_SECONDS
    quick = RoundDeadline(NO_DATA_DEADLINE_SECONDS, measured=True)
    quick.on_round(_round_with(0.5, 0.2))
    assert quick.seconds == DEADLINE_FLOOR_SECONDS
    fixed = RoundDeadline(60.0)  # --round-timeout, or sized on the coordinator's data
    fixed.on_round(_round_with(100.0))
    assert fixed.seconds == 60.0


def test_a_given_deadline_keeps_torch_out_of_the_coordinator_process():
    """The coordinator's own process needs torch only to time a default deadline: given one
    (``--round-timeout``), its modules and its deadline load none (torch and the optimizer's
    first step cost ~5 s of CPU at every coordinator start). A fresh interpreter, because this
    one has torch loaded already."""
    code = (
        "import sys\n"
        "from fedweave.config import RunConfig\n"
        "from fedweave.coordinator.command import cli, run_checks, run_header, supervisor\n"
        "from fedweave.coordinator.command import training_setup\n"
        "from fedweave.coordinator.rounds.round_settings import ServerSettings\n"
        "config = RunConfig.of(task='digits', round_timeout=45.0)\n"
        "deadline = ServerSettings(config, 3, 2).deadline(test_data=object())\n"
        "assert deadline.seconds == 45.0 and not deadline.measured, deadline\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:5])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", done.stdout[-2000:]
