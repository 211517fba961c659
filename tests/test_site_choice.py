"""What each site takes part in (issue 38): its policy file, its other tasks, and runs that
name their sites. Flower's real Message, Context and client manager; the deployed path is
``tests/test_deploy_operators.py``."""

from __future__ import annotations

import logging
import os
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
from flwr.app import Context, Message, Metadata, RecordDict
from flwr.app.message_type import MessageType

from fedweave.client.mods import FLOOR_KEYS, site_policy_guard
from fedweave.config import RunConfig
from fedweave.config.commands import check_settings
from fedweave.contract import (
    LOCAL_EPOCHS_KEY,
    NODE_MAX_DELTA_KEY,
    NODE_MAX_EPSILON_KEY,
    NODE_POLICY_KEY,
    NODE_REQUIRE_DP_KEY,
    NODE_REQUIRE_SECURE_AGG_KEY,
    RUN_OPERATOR_KEY,
    RUN_TASK_KEY,
    SiteRefusal,
)
from fedweave.coordinator.rounds.named_sites import NamedSites
from fedweave.errors import UserError
from fedweave.site_policy import PolicyFile, parse_policy, read_policy

POLICY = """
tasks = ["digits", "heart"]
operators = ["alice", "coordinator"]
hours = ["08:00-18:00", "22:00-02:00"]
require_secure_agg = true
require_dp = "local"
max_epsilon = 4.0
"""


def _at(hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 12, 7, hour, minute, tzinfo=timezone.utc)


def test_a_policy_takes_its_tasks_operators_and_hours_and_says_why_it_refuses():
    policy = parse_policy(POLICY, "site-policy.toml")
    assert policy.refusal("digits", "alice", _at(9)) is None
    assert policy.refusal("heart", None, _at(23, 30)) is None  # the command line's own run
    assert policy.refusal("heart", "alice", _at(1, 59)) is None  # a window across midnight
    assert policy.refusal("iris", "alice", _at(9)) == (
        "this site's policy (site-policy.toml) trains tasks digits, heart only, not 'iris'"
    )
    assert policy.refusal("digits", "mallory", _at(9)) == (
        "this site's policy (site-policy.toml) takes runs of alice, coordinator only, not "
        "operator mallory's run"
    )
    assert "trains in 08:00-18:00, 22:00-02:00 UTC only; it is 18:00 UTC" in policy.refusal(
        "digits", "alice", _at(18)
    )
    assert parse_policy("", "empty.toml").refusal("anything", "anyone", _at(3)) is None


def test_a_policy_bounds_what_a_job_asks_of_the_sites_time():
    """The review: a study asking ``local_epochs = 1000000`` held every site. A site's policy
    bounds a job's local epochs; a job over it is refused at the site with the reason."""
    policy = parse_policy("max_local_epochs = 5\nmax_delta = 1e-6\n", "p.toml")
    assert policy.job_refusal({LOCAL_EPOCHS_KEY: 5}) is None
    assert policy.job_refusal({LOCAL_EPOCHS_KEY: 1000000}) == (
        "this site's policy (p.toml) allows at most 5 local epochs a round, and the run asks "
        "1000000"
    )
    assert policy.job_refusal({}) is None  # the site's own default then
    # a coordinator rewriting the round's config gets a refusal, not a failed site
    assert policy.job_refusal({LOCAL_EPOCHS_KEY: "lots"}) == (
        "the run's local epochs 'lots' are not a whole number"
    )
    assert parse_policy("", "p.toml").job_refusal({LOCAL_EPOCHS_KEY: 10**6}) is None
    floor = policy.floor({NODE_MAX_DELTA_KEY: "1e-05"}, FLOOR_KEYS)
    assert floor == {NODE_MAX_DELTA_KEY: "1e-06"}  # the policy's is stricter


def test_the_policy_floor_adds_to_the_flags_the_stricter_holding():
    policy = parse_policy(POLICY, "p.toml")
    floor = policy.floor({NODE_REQUIRE_DP_KEY: "sample", NODE_MAX_EPSILON_KEY: "8.0"}, FLOOR_KEYS)
    assert floor == {
        NODE_REQUIRE_SECURE_AGG_KEY: "true",
        NODE_REQUIRE_DP_KEY: "sample",  # the flag's is stricter than the policy's "local"
        NODE_MAX_EPSILON_KEY: "4.0",
    }
    assert parse_policy("", "p.toml").floor({}, FLOOR_KEYS) == {}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tasks = [", "p.toml is not TOML"),
        ("task = ['digits']", "p.toml: unknown key 'task'; a site policy says tasks,"),
        ("tasks = 'digits'", "p.toml: tasks must be a list of names"),
        ("operators = [1]", "p.toml: operators must be a list of names"),
        ("hours = ['8-18']", "p.toml: hours entry '8-18' is not HH:MM-HH:MM (UTC)"),
        ("hours = ['08:00-08:00']", "p.toml: hours entry '08:00-08:00' is empty"),
        ("hours = []", "p.toml: hours must be a list of windows"),
        ("require_secure_agg = 'yes'", "p.toml: require_secure_agg must be true or false"),
        ("require_dp = 'strict'", "p.toml: require_dp must be one of off, any, local, sample"),
        ("max_epsilon = 0", "p.toml: max_epsilon must be a number above 0"),
        ("max_epsilon = true", "p.toml: max_epsilon must be a number above 0"),
        ("max_delta = 1.5", "p.toml: max_delta must be a number between 0 and 1"),
        ("max_local_epochs = 0", "p.toml: max_local_epochs must be a whole number of at least"),
        ("max_local_epochs = 2.5", "p.toml: max_local_epochs must be a whole number of at least"),
    ],
)
def test_a_policy_that_does_not_parse_is_one_line_naming_it(text: str, says: str):
    with pytest.raises(UserError) as refused:
        parse_policy(text, "p.toml")
    assert str(refused.value).startswith(says) and "\n" not in str(refused.value)


def test_a_policy_file_is_read_again_when_it_changes(tmp_path: Path):
    path = tmp_path / "policy.toml"
    with pytest.raises(UserError, match="cannot be read"):
        read_policy(path)
    path.write_text('tasks = ["digits"]\n')
    watched = PolicyFile(path)
    assert watched.current().tasks == ("digits",)
    path.write_text('tasks = ["heart", "digits"]\n')
    os.utime(path, ns=(1, 1))  # a changed modification time, even within the clock's grain
    assert watched.current().tasks == ("heart", "digits")
    path.write_text("tasks = [\n")
    os.utime(path, ns=(2, 2))
    with pytest.raises(UserError, match="policy.toml is not TOML"):
        watched.current()
    path.write_bytes(b"x" * (64 * 1024 + 1))
    with pytest.raises(UserError, match="is over 64 KB"):
        read_policy(path)


def _message(run_id: int) -> Message:
    metadata = Metadata(
        run_id=run_id, message_id="m1", src_node_id=0, dst_node_id=5, reply_to_message_id="",
        group_id="1", created_at=0.0, ttl=60.0, message_type=MessageType.TRAIN,
    )  # fmt: skip
    return Message(content=RecordDict(), metadata=metadata)


def test_the_site_refuses_a_run_its_policy_does_not_take_before_anything_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    path = tmp_path / "policy.toml"
    path.write_text('tasks = ["digits"]\noperators = ["alice"]\n')
    reached = []

    def app(msg: Message, _ctx: Context) -> Message:
        reached.append(msg)
        return Message(RecordDict(), reply_to=msg)

    def context(task: str, operator: str | None) -> Context:
        run_config = {RUN_TASK_KEY: task, **({RUN_OPERATOR_KEY: operator} if operator else {})}
        return Context(run_id=7, node_id=5, node_config={NODE_POLICY_KEY: str(path)},
                       state=RecordDict(), run_config=run_config)  # fmt: skip

    site_policy_guard(_message(7), context("digits", "alice"), app)
    assert len(reached) == 1
    caplog.set_level(logging.WARNING, logger="fedweave.site.console")
    for _ in range(2):  # said once a run on the site's console, refused every time
        with pytest.raises(SiteRefusal, match="trains tasks digits only, not 'heart'"):
            site_policy_guard(_message(8), context("heart", "alice"), app)
    with pytest.raises(SiteRefusal, match="takes runs of alice only, not the coordinator's own"):
        site_policy_guard(_message(9), context("digits", None), app)
    said = [r.getMessage() for r in caplog.records if r.name == "fedweave.site.console"]
    assert len(said) == 2 and said[0].startswith("refused operator alice's study (Flower run 8")
    assert len(reached) == 1

    path.write_text("tasks = \n")  # broken while the site serves: every run refused, said why
    os.utime(path, ns=(5, 5))
    with pytest.raises(SiteRefusal, match="not TOML.*refuses every run until it is fixed"):
        site_policy_guard(_message(7), context("digits", "alice"), app)
    no_policy = Context(run_id=7, node_id=5, node_config={}, state=RecordDict(), run_config={})
    site_policy_guard(_message(7), no_policy, app)
    assert len(reached) == 2


def _site_config(tmp_path: Path, more: str, policy: Path | None = None) -> RunConfig:
    data = tmp_path / "digits.npz"
    data.write_bytes(b"")
    return RunConfig().replace(
        task="digits", data=data, coordinator="127.0.0.1:9092", insecure=True, more_tasks=more,
        policy=policy,
    )  # fmt: skip


def test_more_tasks_name_each_task_once_with_a_file(tmp_path: Path, monkeypatch):
    from fedweave.client.site_checks import check_site_inputs, more_tasks

    monkeypatch.chdir(tmp_path)
    (tmp_path / "heart.csv").write_text("a\n")
    assert more_tasks(_site_config(tmp_path, "heart=heart.csv")) == {"heart": Path("heart.csv")}
    assert more_tasks(_site_config(tmp_path, "")) == {}
    for given, says in [
        ("heart", "--more-tasks entry 'heart' is not TASK=DATA"),
        ("digits=heart.csv", "--more-tasks names task 'digits' twice"),
        ("heart=heart.csv,heart=heart.csv", "--more-tasks names task 'heart' twice"),
        ("heart=nothing.csv", "--more-tasks heart=nothing.csv: no such file"),
    ]:
        with pytest.raises(UserError, match=says):
            more_tasks(_site_config(tmp_path, given))
    (tmp_path / "bad.toml").write_text("hours = ['9-5']\n")
    with pytest.raises(UserError, match="bad.toml: hours entry"):
        check_site_inputs(_site_config(tmp_path, "", tmp_path / "bad.toml"))


def test_a_run_names_its_sites_by_their_keys_and_waits_for_no_more():
    def problem(**values) -> str | None:
        config = RunConfig().replace(tls_dir=Path("tls"), secure_agg=False, **values)
        try:
            check_settings(config, "coordinator")
        except UserError as exc:
            return str(exc)
        return None

    assert problem(sites="a,b", min_clients=2) is None
    assert "waits for more sites than --sites names (2)" in problem(sites="a,b", min_clients=3)
    assert "names a site twice" in problem(sites="a,a", min_clients=1)
    assert "needs TLS and site keys" in problem(sites="a", min_clients=1,
                                                allow_unregistered_sites=True)  # fmt: skip
    assert "--sites takes synchronous rounds" in problem(sites="a,b", min_clients=2,
                                                         schedule="async")  # fmt: skip


def test_a_run_naming_its_sites_is_refused_a_name_not_registered(tmp_path: Path):
    from fedweave.coordinator.command.run_checks import check_named_sites

    (tmp_path / "sites").mkdir()
    for name in ("hospital-a", "hospital-b"):
        (tmp_path / "sites" / f"{name}.pub").write_text("ecdsa-sha2-nistp384 AAAA\n")
    config = RunConfig().replace(tls_dir=tmp_path, sites="hospital-a,clinic", min_clients=1)
    with pytest.raises(UserError) as refused:
        check_named_sites(config)
    assert str(refused.value).startswith(
        "--sites names clinic, not registered here (registered: hospital-a, hospital-b)"
    )
    check_named_sites(config.replace(sites="hospital-b"))


def test_a_run_naming_its_sites_samples_and_evaluates_only_them():
    registered = {"1": "hospital-a", "2": "hospital-b", "3": "clinic"}
    manager = NamedSites(
        frozenset({"hospital-a", "hospital-b"}), lambda: registered, bound_seconds=60.0
    )
    for node in (1, 2, 3, 4):  # 4: connected, its key not named yet
        assert manager.register(SimpleNamespace(cid=str(node), node_id=node))
    assert manager.num_available() == 2
    assert sorted(manager.all()) == ["1", "2"]
    assert sorted(p.node_id for p in manager.sample(2)) == [1, 2]
    assert manager.sample(3, min_num_clients=1) == []  # never more than the named ones

    class OddOnly:
        def select(self, client) -> bool:
            return client.node_id % 2 == 1

    assert [p.node_id for p in manager.sample(1, criterion=OddOnly())] == [1]
    registered["3"] = "hospital-b"  # names read again: a re-keyed site joins
    assert manager.num_available() == 3


def test_a_site_whose_policy_or_tasks_do_not_parse_ends_in_one_line_before_connecting(tmp_path):
    from test_deploy_support import run_fedweave

    (tmp_path / "policy.toml").write_text("hours = ['9-5']\n")
    (tmp_path / "digits.npz").write_bytes(b"")
    base = ("client", "--coordinator", "127.0.0.1:9", "--task", "digits", "--data",
            "digits.npz", "--insecure")  # fmt: skip
    for extra, says in (
        (("--policy", "policy.toml"), "policy.toml: hours entry '9-5' is not HH:MM-HH:MM"),
        (("--policy", "nothing.toml"), "site policy nothing.toml cannot be read"),
        (("--more-tasks", "heart"), "--more-tasks entry 'heart' is not TASK=DATA"),
    ):
        done = run_fedweave(*base, *extra, cwd=tmp_path, timeout=60)
        assert done.returncode == 2, done.stderr
        assert says in done.stderr and done.stderr.strip().count("\n") == 0, done.stderr
