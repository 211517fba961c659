"""Which coordinators a site takes runs from (``fedweave.versions``, ``client.mods.version_guard``).
The deployed refusal, with real processes: ``test_deploy_e2e.py``'s sites holding another
task or release; the versions on every dashboard page and in ``/metrics``: ``test_dashboard``."""

from __future__ import annotations

import logging

import pytest
from flwr.app import Context, Message, RecordDict
from test_site_choice import _message

from fedweave.client.mods import version_guard
from fedweave.config import RunConfig
from fedweave.contract import RUN_ID_KEY, RUN_TASK_KEY, RUN_VERSIONS_KEY, SiteRefusal
from fedweave.coordinator.plan import DeployPlan
from fedweave.versions import described, mismatch, parse_described, running


def test_a_site_takes_runs_of_its_own_release_lines_only():
    here = ("0.1.0", "1.42.0")
    assert parse_described(described(here)) == here
    assert mismatch("fedweave 0.1.3, flwr 1.42.1", here) is None  # patch releases speak
    assert mismatch("fedweave 0.2.0, flwr 1.42.0", here) == (
        "the coordinator runs fedweave 0.2.0, flwr 1.42.0 and this site fedweave 0.1.0, flwr "
        "1.42.0: install the coordinator's release at this site (pip install "
        "'fedweave==0.2.0' 'flwr==1.42.0'), or the site's at the coordinator"
    )
    assert "runs fedweave 0.1.0, flwr 1.41.0 and this site" in mismatch(
        "fedweave 0.1.0, flwr 1.41.0", here
    )  # Flower's own release lines must match too
    assert mismatch(None, here).startswith("the coordinator does not say its versions")
    hostile_versions = f"fedweave {'9' * 5000}, flwr 1.42.0"
    for hostile in ["", "fedweave", "flwr 1.42.0", "x" * 10_000, hostile_versions,
                    "fedweave 0.1.0 <script>, flwr 1.42.0"]:  # fmt: skip
        problem = mismatch(hostile, here)
        assert problem.startswith("the coordinator sent versions that are not"), problem
        assert len(problem) < 300  # a hostile coordinator's text is never echoed


def test_the_site_refuses_a_run_of_another_release_line_before_anything_else(caplog):
    reached = []

    def app(msg: Message, _ctx: Context) -> Message:
        reached.append(msg)
        return Message(RecordDict(), reply_to=msg)

    def context(run_config: dict) -> Context:
        return Context(run_id=7, node_id=5, node_config={}, state=RecordDict(),
                       run_config={RUN_TASK_KEY: "digits", **run_config})  # fmt: skip

    plan = DeployPlan("abc123", RunConfig())
    version_guard(_message(7), context(plan.to_run_config()), app)  # this coordinator's own
    version_guard(_message(7), context({}), app)  # a simulation: one process, not checked
    assert len(reached) == 2
    fedweave, flower = running()
    caplog.set_level(logging.WARNING, logger="fedweave.site.console")
    other = {RUN_ID_KEY: "abc123", RUN_VERSIONS_KEY: f"fedweave 9.0.0, flwr {flower}"}
    for _ in range(2):  # refused every time, said once a run
        with pytest.raises(SiteRefusal, match=f"this site fedweave {fedweave}, flwr {flower}"):
            version_guard(_message(8), context(other), app)
    with pytest.raises(SiteRefusal, match="does not say its versions"):
        version_guard(_message(9), context({RUN_ID_KEY: "abc123"}), app)  # an older coordinator
    said = [r.getMessage() for r in caplog.records if r.name == "fedweave.site.console"]
    assert len(said) == 2 and said[0].startswith("refused the coordinator's run (Flower run 8)")
    assert len(reached) == 2
