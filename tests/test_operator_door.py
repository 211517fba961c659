"""The operator door's app (``coordinator/command/operator_door.py``; issue 38) over a real
SQLite history, through Starlette's test client: what it refuses and what it records. The
door deployed, with ``fedweave run`` against a serving coordinator: test_deploy_operators.py.
"""

from __future__ import annotations

import hashlib
import os
import socket
import tempfile
from datetime import datetime, timezone

import pytest
from starlette.testclient import TestClient

from fedweave.config import RunConfig
from fedweave.coordinator.command.operator_door import make_door
from fedweave.coordinator.command.study import resolve_study
from fedweave.errors import UserError
from fedweave.history import HistoryError, RoundRecord, SiteResult, open_store
from fedweave.history.operators import OperatorRegistry
from fedweave.history.submissions import MAX_CONFIG_BYTES, Submissions

STUDY = b'[data]\ntask = "digits"\n[training]\nrounds = 2\n'


@pytest.fixture
def door(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'history.db'}")
    served = RunConfig().replace(task="digits", address="0.0.0.0:9092", insecure=True)

    def check(text: str, source: str, _operator) -> None:
        resolve_study(served, text, source)

    token = OperatorRegistry(store).add("alice", added_by="root@test")

    def app():  # a door of its own: its own count of a source's refused tokens
        return make_door(store, check, lambda run_id, after: ([], after))

    client = TestClient(app())
    client.headers["authorization"] = f"Bearer {token}"
    yield client, store, app
    store.close()


def test_every_route_wants_an_operators_token_and_refusals_are_audited(door):
    _client, store, app = door
    routes = [("POST", "/v1/runs"), ("GET", "/v1/runs"), ("GET", "/v1/runs/1"),
              ("GET", "/v1/runs/1/logs"), ("POST", "/v1/runs/1/stop")]  # fmt: skip
    for header in ({}, {"authorization": "Bearer fwop_nothing"}, {"authorization": "Basic x"}):
        anonymous = TestClient(app())
        for method, path in routes:
            reply = anonymous.request(method, path, headers=header, content=STUDY)
            assert reply.status_code == 401, (method, path, reply.text)
            assert "does not know that operator token" in reply.json()["error"]
        # a source that keeps trying is made to wait, and no longer fills the audit trail
        for _ in range(20):
            if anonymous.get("/v1/runs", headers=header).status_code == 429:
                break
        else:
            raise AssertionError("a source refused 25 times in a row was never made to wait")
    refused = [row for row in OperatorRegistry(store).audit(1000) if row.outcome == "refused"]
    shown = {"no token"} | {
        "unknown token sha256:" + hashlib.sha256(token).hexdigest()[:12]
        for token in (b"fwop_nothing", b"x")  # named by a digest, never in the clear
    }
    assert {row.actor for row in refused} == shown
    assert {row.action for row in refused} == {f"{m} {p}" for m, p in routes}
    assert len(refused) < 3 * 25
    assert Submissions(store).all() == []  # nothing queued by any of them


def test_a_study_is_checked_queued_listed_and_stopped(door):
    client, store, _app = door
    reply = client.post("/v1/runs", content=STUDY, headers={"x-fedweave-source": "a.toml"})
    assert reply.status_code == 201 and reply.json() == {"submission": 1, "ahead": 0}
    assert client.post("/v1/runs", content=STUDY).json() == {"submission": 2, "ahead": 1}
    for body, says in ((b"[training]\nrounds = 0\n", "rounds must be at least 1"),
                       (b'[connection]\ntls_dir = "/etc"\n', "coordinator's, not a study's"),
                       (b"rounds = [", "is not TOML"),
                       (b"\xff\xfe", "is not UTF-8")):  # fmt: skip
        refused = client.post("/v1/runs", content=body, headers={"x-fedweave-source": "b.toml"})
        assert refused.status_code == 422 and says in refused.json()["error"], refused.text
    huge = client.post("/v1/runs", content=b"#" * (MAX_CONFIG_BYTES + 1))
    assert huge.status_code == 413
    listed = client.get("/v1/runs").json()["submissions"]
    assert [(row["id"], row["state"], row["operator"]) for row in listed] == [
        (1, "queued", "alice"), (2, "queued", "alice")]  # fmt: skip
    shown = client.get("/v1/runs/2").json()
    assert shown["ahead"] == 1 and shown["config"] == STUDY.decode()
    assert client.get("/v1/runs/9").status_code == 404
    assert client.get("/v1/runs/x").status_code == 404
    assert client.get("/v1/runs/1/logs?after=z").status_code == 400
    assert client.get("/v1/runs/1/logs").json()["lines"] == []

    assert client.post("/v1/runs/1/stop").json() == {"was": "queued"}
    again = client.post("/v1/runs/1/stop")
    assert again.status_code == 409 and "stopped already" in again.json()["error"]
    assert Submissions(store).get(1).reason == "stopped by operator alice before it started"
    assert Submissions(store).next_queued().id == 2

    audit = [(r.actor, r.action, r.outcome) for r in OperatorRegistry(store).audit(100)]
    assert audit.count(("alice", "run-submit", "done")) == 2
    assert audit.count(("alice", "run-submit", "refused")) == 5  # the 413 too
    assert ("alice", "run-stop", "done") in audit and ("alice", "run-stop", "refused") in audit


def test_the_queue_keeps_each_studys_state_through_stops_and_a_coordinator_restart(tmp_path):
    with open_store(f"sqlite:///{tmp_path / 'history.db'}") as store:
        queue = Submissions(store)
        first, second, third = (queue.submit("alice", f"{n}.toml", "") for n in "abc")
        assert queue.next_queued().id == first and queue.queue_position(third) == 2
        assert queue.started(first, "run-a")
        assert queue.request_stop(first, "bob") == "running"  # the coordinator stops it
        assert queue.get(first).state == "running" and queue.get(first).stop_requested_by == "bob"
        assert queue.request_stop(second, "bob") == "queued"  # never runs
        assert not queue.started(second, "run-b") and queue.get(second).run_id is None
        assert queue.next_queued().id == third
        queue.ended(first, "stopped", "stopped by operator bob")
        queue.ended(first, "failed", "later")  # an end is recorded once
        assert queue.get(first).state == "stopped"
        with pytest.raises(HistoryError, match="it stopped already"):
            queue.request_stop(first, "bob")
        assert queue.started(third, "run-c")
        assert queue.requeue_running("the coordinator stopped during it") == [third]
        assert queue.get(third).state == "queued" and queue.get(third).run_id == "run-c"
        assert queue.next_queued().id == third  # it resumes run-c at its turn
        assert queue.started(third, "run-c")
        assert queue.requeue(third, "the coordinator stops")
        assert queue.started(third, "run-c") and queue.request_stop(third, "bob") == "running"
        assert not queue.requeue(third, "the coordinator stops")  # stopped: not run again
        assert queue.requeue_running("the coordinator stopped during it") == []
        assert queue.get(third).state == "stopped" and queue.next_queued() is None
        with pytest.raises(HistoryError, match="no submission 9"):
            queue.get(9)
        with pytest.raises(HistoryError, match="at most 256 KB"):
            queue.submit("alice", "big.toml", "#" * (MAX_CONFIG_BYTES + 1))


def test_studies_at_once_take_the_oldest_queued_not_taken_and_the_dashboard_counts_them(
    tmp_path,
):
    from fedweave.dashboard.prometheus import HistoryCollector, exposition
    from fedweave.dashboard.views import Views
    from fedweave.history.alerts import AlertRules

    with open_store(f"sqlite:///{tmp_path / 'history.db'}") as store:
        queue = Submissions(store)
        first, second, third = (queue.submit("alice", f"{n}.toml", "") for n in "abc")
        assert queue.next_queued(skip=frozenset({first})).id == second  # taken, not started
        assert queue.next_queued(skip=frozenset({first, second})).id == third
        assert queue.next_queued(skip=frozenset({first, second, third})) is None
        run_id = store.start_run("federated", "digits", {}, 0)
        assert queue.started(second, run_id)
        queue.note(second, "waits for its sites: 1 of 3 connected")  # `fedweave run list` says
        queue.note(first, "not running: not noted")
        assert queue.get(second).reason == "waits for its sites: 1 of 3 connected"
        assert queue.get(first).reason is None
        queue.note(second, None)
        views = Views(store, AlertRules(3, 60.0))
        studies = views.studies()
        assert [(s["id"], s["state"], s["ahead"]) for s in studies] == [
            (first, "queued", 0), (second, "running", None), (third, "queued", 1)
        ]  # fmt: skip
        assert views.runs()[0]["study"] == {"id": second, "operator": "alice", "source": "b.toml"}
        now = datetime.now(timezone.utc)
        store.record_round(run_id, RoundRecord(1, "coordinator", now, now, 2, 1), [
            SiteResult("site0", "ok", 10), SiteResult("site3", "refused", reason="policy")
        ])  # fmt: skip
        assert views.site_jobs() == [
            {"site": name, "runs": [{"run_id": run_id, "task": "digits", "round": 1,
                                     "status": status}]}
            for name, status in (("site0", "ok"), ("site3", "refused"))
        ]  # fmt: skip
        scraped = exposition(HistoryCollector(views)).decode()
        assert 'fedweave_studies{state="queued"} 2.0' in scraped
        assert 'fedweave_studies{state="running"} 1.0' in scraped
        assert 'fedweave_site_runs{site="site3"} 1.0' in scraped
        store.finish_run(run_id, "completed")
        assert views.site_jobs() == []  # an ended run is no site's job
        assert (
            "fedweave_studies{" not in exposition(HistoryCollector(views, run_id=run_id)).decode()
        )


def test_fedweave_run_says_in_one_line_what_keeps_it_from_the_door(tmp_path):
    from typer.testing import CliRunner

    from fedweave.run_cli import run_app

    token = tmp_path / "alice.token"
    token.write_text("fwop_x\n")
    (tmp_path / "ca.pem").write_text("not a certificate")
    cases = [
        (["--operator-token", str(tmp_path / "none.token")], "cannot read the operator token"),
        (["--operator-token", str(token)], "--ca-cert is required"),
        (["--operator-token", str(token), "--ca-cert", str(tmp_path / "ca.pem")],
         "cannot read the CA certificate"),
        (["--operator-token", str(token), "--insecure"], "cannot reach the operator door"),
    ]  # fmt: skip
    port = socket.socket()
    port.bind(("127.0.0.1", 0))  # bound, never listening: refused
    address = f"127.0.0.1:{port.getsockname()[1]}"
    try:
        for extra, says in cases:
            result = CliRunner().invoke(run_app, ["list", "--coordinator", address, *extra])
            assert result.exit_code == 2, result.output
            assert result.output.startswith("error: ") and says in result.output, result.output
            assert result.output.count("\n") == 1
    finally:
        port.close()


@pytest.mark.parametrize(
    "task", ["os:abort", "_thread:interrupt_main", "tempfile:mkdtemp", "os.path", "digits:x"]
)
def test_a_study_naming_an_import_path_is_refused_and_nothing_of_it_runs(door, task):
    """The review's attack: a study whose task is ``module:attr`` was imported and called
    while the door checked it (``os:abort`` killed the coordinator). A study is data: its
    task names a built-in task or an installed task package, nothing is imported or called,
    and the door answers on (this test's process is the door's)."""
    client, store, _app = door
    before = set(os.listdir(tempfile.gettempdir()))
    study = f'[data]\ntask = "{task}"\n[training]\nrounds = 2\n'.encode()
    refused = client.post("/v1/runs", content=study, headers={"x-fedweave-source": "s.toml"})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"].startswith(
        "s.toml: [data] task names no task this federation installed; a study names a "
        "built-in task or an installed task package (")
    assert set(os.listdir(tempfile.gettempdir())) == before  # mkdtemp was not called
    assert client.get("/v1/runs").status_code == 200  # the door serves on
    assert Submissions(store).all() == []


@pytest.mark.parametrize(
    "setting, value, bound",
    [("[training]\nlocal_epochs", "1000000", "study-max-local-epochs"),
     ("[training]\nrounds", "100000", "study-max-rounds"),
     ("[training]\nbatch_size", "100000", "study-max-batch-size"),
     ("[federation]\nround_timeout", "86400.0", "study-max-round-timeout")],
)
def test_a_study_over_the_coordinators_bounds_is_refused_at_submission(door, setting, value,
                                                                         bound):  # fmt: skip
    client, store, _app = door
    study = f'[data]\ntask = "digits"\n{setting} = {value}\n'.encode()
    refused = client.post("/v1/runs", content=study, headers={"x-fedweave-source": "s.toml"})
    assert refused.status_code == 422, refused.text
    said = refused.json()["error"]
    assert "over this coordinator's bound for studies" in said and f"(--{bound})" in said
    assert Submissions(store).all() == []


def test_a_study_reads_only_the_files_the_coordinator_gives_studies(tmp_path):
    """The review's attack: a study's test_data pointing at a CSV private to another user
    leaked its header, and the errors told whether a path existed. A study names files of
    --study-files only; anything else is refused in words that are the same whether the
    file exists or not."""
    given, private = tmp_path / "given", tmp_path / "private"
    given.mkdir()
    private.mkdir()
    (private / "patients.csv").write_text("patient_id,ssn,diagnosis\n1,123,x\n")
    (given / "test.csv").write_text("a,b\n")
    (given / "escape.csv").symlink_to(private / "patients.csv")
    served = RunConfig().replace(task="digits", address="0.0.0.0:9092", insecure=True,
                                 study_files=given)  # fmt: skip

    def said(path: str, coordinator: RunConfig = served) -> str:
        study = f'[data]\ntask = "digits"\ntest_data = "{path}"\n'
        with pytest.raises(UserError) as refused:
            resolve_study(coordinator, study, "s.toml")
        return str(refused.value)

    answers = {said(p) for p in (str(private / "patients.csv"), "../private/patients.csv",
                                 "escape.csv", str(tmp_path / "no-such.csv"), ".", "/etc")}
    assert answers == {
        "s.toml: [data] test_data is not a file this coordinator gives studies "
        "(--study-files); name one of those files, by its name in that folder"
    }  # fmt: skip
    assert "ssn" not in said("escape.csv") and "patients" not in said("escape.csv")
    assert said("test.csv", RunConfig().replace(task="digits")) in answers  # none given
    config, _ = resolve_study(served, '[data]\ntask = "digits"\ntest_data = "test.csv"\n', "s")
    assert config.data.test_data == (given / "test.csv").resolve()


def test_operators_see_and_stop_what_their_roles_allow(tmp_path):
    """The review: every operator could read and stop every study. Roles, kept in the
    history and checked at every request: by default an operator submits, reads and stops
    its own studies; another's is not there for it (404, as one that does not exist)."""
    store = open_store(f"sqlite:///{tmp_path / 'history.db'}")
    registry = OperatorRegistry(store)
    served = RunConfig().replace(task="digits", address="0.0.0.0:9092", insecure=True)
    app = make_door(store, lambda text, source, _who: resolve_study(served, text, source),
                    lambda run_id, after: ([], after))  # fmt: skip

    def client(name: str, roles: str) -> TestClient:
        door = TestClient(app)
        door.headers["authorization"] = f"Bearer {registry.add(name, 'root@test', roles)}"
        return door

    own = "submit,read-own,stop-own"
    alice, bob = client("alice", own), client("bob", own)
    reader, admin = client("reader", "read-all"), client("root", "admin")
    assert alice.post("/v1/runs", content=STUDY).status_code == 201  # submission 1
    assert bob.post("/v1/runs", content=STUDY).status_code == 201  # submission 2
    assert [row["id"] for row in bob.get("/v1/runs").json()["submissions"]] == [2]
    assert [row["id"] for row in reader.get("/v1/runs").json()["submissions"]] == [1, 2]
    for path in ("/v1/runs/1", "/v1/runs/1/logs"):
        unseen = bob.get(path)
        assert unseen.status_code == 404 and unseen.json()["error"] == (
            "no submission 1; `fedweave run list` shows them")  # fmt: skip
        assert reader.get(path).status_code == 200
    refused = bob.post("/v1/runs/1/stop")
    assert refused.status_code == 409 and "no submission 1" in refused.json()["error"]
    said = reader.post("/v1/runs/1/stop")
    assert said.status_code == 409 and "may not stop alice's study (role stop-all)" in said.text
    no_submit = reader.post("/v1/runs", content=STUDY)
    assert no_submit.status_code == 403
    assert "may not submit studies (role submit)" in no_submit.text
    assert Submissions(store).get(1).state == "queued"  # nobody but its own or an admin stopped it
    assert admin.post("/v1/runs/1/stop").json() == {"was": "queued"}
    assert bob.post("/v1/runs/2/stop").json() == {"was": "queued"}
    audit = [(r.actor, r.action, r.outcome) for r in registry.audit(100)]
    assert ("bob", "run-stop", "refused") in audit
    assert ("reader", "POST /v1/runs", "refused") in audit
    registry.set_roles("bob", "admin", "root@test")
    assert [row["id"] for row in bob.get("/v1/runs").json()["submissions"]] == [1, 2]
    with pytest.raises(UserError, match="unknown operator role 'root'; roles are submit"):
        registry.set_roles("bob", "root", "root@test")
    store.close()


def _recorded_digits_run(store, checkpoints, run_id: str) -> str:
    """A completed digits run of one round whose checkpoint is the task's fresh model."""
    import numpy as np

    from fedweave.history import CheckpointRef
    from fedweave.learning.tasks import load_task

    arrays = [t.detach().numpy() for t in load_task("digits").build_model().state_dict().values()]
    path = checkpoints / f"{run_id}.npz"
    np.savez(path, *arrays)
    data = path.read_bytes()
    now = datetime.now(timezone.utc)
    store.start_run("federated", "digits", {}, 0, run_id=run_id)
    store.record_round(
        run_id, RoundRecord(1, "coordinator", now, now, 2, 2, 0, {}, 0.5, 0.8),
        [SiteResult("s1", num_examples=10)],
        CheckpointRef(1, str(path), hashlib.sha256(data).hexdigest(), len(data)),
    )  # fmt: skip
    store.finish_run(run_id, "completed")
    return run_id


def test_a_study_starts_from_a_run_only_its_operator_may_read(tmp_path):
    """The review: ``initial_model`` accepted another run's exported model. A study names a
    run's model by its id (``run:RUN_ID``), and only a run its operator submitted, or any
    with ``read-all``: every other id, a run that does not exist, ``latest`` or a prefix get
    the same one line. The run's final model is exported into the coordinator's checkpoint
    folder and given as the study's initial model."""
    from fedweave.coordinator.command.study_models import run_model_for

    store = open_store(f"sqlite:///{tmp_path / 'history.db'}")
    registry, submissions = OperatorRegistry(store), Submissions(store)
    for name, roles in (("alice", "submit,read-own"), ("bob", "submit,read-own"),
                        ("reader", "submit,read-all")):  # fmt: skip
        registry.add(name, "root@test", roles)
    (checkpoints := tmp_path / "ckpt").mkdir()
    alices = _recorded_digits_run(store, checkpoints, "a1a1a1a1a1a1")
    submissions.started(submissions.submit("alice", "a.toml", STUDY.decode()), alices)
    coordinators = _recorded_digits_run(store, checkpoints, "c0c0c0c0c0c0")  # its command line
    served = RunConfig().replace(task="digits", address="0.0.0.0:9092", insecure=True)

    def study(who: str, run: str):
        text = f'[data]\ntask = "digits"\n[training]\ninitial_model = "run:{run}"\n'
        model = run_model_for(store, registry.named(who), checkpoints, "s.toml")
        return resolve_study(served, text, "s.toml", model)[0]

    config = study("alice", alices)
    exported = checkpoints / "study-models" / alices / "model.safetensors"
    assert config.training.initial_model == exported
    assert config.training.initial_model.is_file()
    assert study("reader", coordinators).training.initial_model.is_file()  # read-all
    for run in (coordinators, "ffffffffffff", "latest", alices[:6], "../../etc"):
        with pytest.raises(UserError) as refused:
            study("bob", run)
        assert str(refused.value) == (
            "s.toml: [training] initial_model names no run operator bob may read; name one of "
            "its own runs (fedweave run list) or ask the coordinator's administrator for the "
            "role read-all"
        )
    (checkpoints / "study-models" / "c0c0c0c0c0c0").rename(checkpoints / "kept")
    (checkpoints / "study-models" / "c0c0c0c0c0c0").write_text("")  # a file in the way
    with pytest.raises(UserError) as unwritable:
        study("reader", coordinators)
    assert str(unwritable.value).startswith(
        "s.toml: [training] initial_model: run c0c0c0c0c0c0's model could not be written out on "
        "the coordinator ("
    )
    assert str(checkpoints) not in str(unwritable.value)  # the coordinator's paths stay there
    assert sorted(p.name for p in (checkpoints / "study-models").iterdir()) == [
        alices, "c0c0c0c0c0c0"]  # no partial export left behind  # fmt: skip
    registry.remove("alice", "root@test")  # checked again at the study's turn
    with pytest.raises(UserError, match="no run operator that operator may read"):
        study("alice", alices)
    with pytest.raises(UserError, match="only a study submitted to a serving coordinator"):
        resolve_study(served, f'[training]\ninitial_model = "run:{alices}"\n', "c.toml")
    store.close()
