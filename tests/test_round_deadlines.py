"""Round deadlines and k-of-n rounds in the simulation engine: a site that stalls past the
deadline is recorded late, the round closes on time with the replies it has, a round with fewer
replies than --min-replies is recorded as failed and keeps the model, and the run goes on.

In a simulation, round 1 also waits for the engine to start (Ray workers importing torch,
~15 s here). The plain case uses a deadline shorter than that on purpose (round 1 then fails
whole and the run goes on); the SecAgg+ case keeps its deadline above it, because the engine
may hand one site's late messages to two workers at once, which SecAgg+'s per-site state does
not survive (a deployed site handles its messages one at a time).
"""

from __future__ import annotations

import pytest
from fault_tasks import SLOW_ONCE_ENV, SLOW_SECONDS
from test_secure_agg import run_recorded

from fedweave.config import RunConfig


@pytest.mark.parametrize(
    "secure_agg, deadline", [(False, 6.0), (True, 20.0)], ids=["plain", "secagg"]
)
def test_a_stalled_site_is_late_and_the_round_closes_at_its_deadline(
    tmp_path, monkeypatch, secure_agg, deadline
):
    monkeypatch.setenv(SLOW_ONCE_ENV, str(tmp_path / "stall"))
    sim = RunConfig.of(
        task="fault_tasks:StallsInRound2Digits", clients=3, rounds=3, partition="iid",
        secure_agg=secure_agg, round_timeout=deadline, min_replies=3 if not secure_agg else None,
    )  # fmt: skip
    rows, rounds, sites, _ = run_recorded(sim, tmp_path, "deadline")
    assert (tmp_path / "stall.2").exists()  # the stall really happened (in round 2)
    _, first, second = rounds  # round 1 includes the engine's start-up: not timed here
    assert first["sampled"] == 3 and first["replied"] == 2
    # the round closed at its deadline (plus central evaluation), not when the site woke up
    assert first["extra"]["seconds"] <= deadline * 1.1 < SLOW_SECONDS
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
