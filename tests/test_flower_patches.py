"""The one version guard over fedweave's changes to Flower internals."""

import logging

import flwr
import pytest

from fedweave import flower_patches
from fedweave.errors import UserError


def test_the_pinned_flower_is_patchable():
    assert flwr.__version__ == flower_patches.PATCHED_FLOWER_VERSION
    assert flower_patches.tune_simulation_engine() is True


def test_another_flower_warns_once_and_runs_stock_or_refuses(monkeypatch, caplog):
    monkeypatch.setattr(flwr, "__version__", "9.9.9")
    monkeypatch.setattr(flower_patches, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="fedweave.flower_patches"):
        assert flower_patches.tune_simulation_engine() is False
        assert flower_patches.tune_simulation_engine() is False
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "stock polls and dispatcher" in warnings[0]
    # SecAgg+ masks must match on every side: no silent fallback to Flower's generator
    with pytest.raises(UserError, match="SecAgg\\+ needs flwr 1.42.0 \\(installed: 9.9.9\\)"):
        flower_patches.use_fedweave_secagg()


def test_supernode_reply_wait_ends_once_no_clientapp_is_left(monkeypatch):
    """On Flower's own node state: the wait lasts while a ClientApp task is alive and ends
    (nothing to push) once the task finished without a reply, instead of never."""
    import threading
    import time

    from flwr.supercore.constant import TaskType
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

    from fedweave.flower_patches import supernode_waits

    monkeypatch.setattr(supernode_waits, "NO_TASK_GRACE_SECONDS", 0.3)
    state = InMemoryNodeState(ObjectStoreFactory().store())
    task = state.create_task(task_type=TaskType.CLIENT_APP, run_id=7, fab_hash="f" * 64)
    finisher = threading.Timer(1.0, state.finish_task, (task, "failed", "exited, no reply"))
    finisher.start()
    started = time.monotonic()
    assert supernode_waits._wait_for_replies(state) is None
    waited = time.monotonic() - started
    # waited for the live task (1 s), then ended; the bound is loose for a loaded machine, and
    # still far below the forever the wait lasted before the patch
    assert 1.0 <= waited < 20.0, waited
    finisher.join()


def test_an_idle_supernode_asks_less_often_and_a_busy_one_at_once(monkeypatch):
    """The SuperNode's loop asks every 0.2 s for STARTING_SECONDS after its first ask and for
    ACTIVE_SECONDS after each message it handled, every IDLE_POLL_SECONDS once idle longer;
    its other waits (for the ClientApp's reply, an object's upload) stay capped at 0.2 s."""
    from fedweave.flower_patches import supernode_waits as waits
    from fedweave.poll_pace import PollPace

    now = [100.0]
    pace = PollPace(waits.SLEEP_CAP_SECONDS, waits.IDLE_POLL_SECONDS, waits.ACTIVE_SECONDS,
                    starting=waits.STARTING_SECONDS, clock=lambda: now[0])  # fmt: skip
    assert pace.wait() == waits.SLEEP_CAP_SECONDS  # just connected: the run may start soon
    now[0] += waits.STARTING_SECONDS - 0.5
    assert pace.wait() == waits.SLEEP_CAP_SECONDS
    now[0] += 1.0
    assert pace.wait() == waits.IDLE_POLL_SECONDS  # idle: asks every second
    pace.worked()
    now[0] += 1.0
    assert pace.wait() == waits.SLEEP_CAP_SECONDS  # a run is on: often again
    now[0] += waits.ACTIVE_SECONDS
    assert pace.wait() == waits.IDLE_POLL_SECONDS
    assert waits.SLEEP_CAP_SECONDS < waits.IDLE_POLL_SECONDS < waits.STOCK_IDLE_SLEEP_SECONDS

    slept: list[float] = []
    monkeypatch.setattr(waits.time, "sleep", slept.append)
    monkeypatch.setattr(waits, "_PACE", pace)
    waits._loop_sleep(3)  # Flower's sleep when the SuperLink had no message: paced
    waits._loop_sleep(0.5)  # Flower's look for a reply or an object: capped
    assert slept == [waits.IDLE_POLL_SECONDS, waits.SLEEP_CAP_SECONDS]


def test_stock_flower_switch_skips_the_speedups_only(monkeypatch):
    from fedweave.flower_patches import node_restarts, supernode_waits

    installed = []
    monkeypatch.setattr(flower_patches, "_applied", set())
    monkeypatch.setattr(supernode_waits, "install", lambda: installed.append("supernode_waits"))
    monkeypatch.setattr(node_restarts, "install", lambda: installed.append("node_restarts"))
    monkeypatch.setenv(flower_patches.STOCK_FLOWER_ENV, "1")
    assert flower_patches.tune_deployed_polling() is False
    assert flower_patches.quick_task_expiry() is False
    assert flower_patches.clientapp_worker_usable() is False
    # correctness fixes are not speed-ups: the switch leaves them on
    assert flower_patches.bound_supernode_waits() is True
    assert flower_patches.let_sites_rejoin_at_once() is True
    assert installed == ["supernode_waits", "node_restarts"]


def test_another_flower_refuses_the_correctness_patches_in_one_line(monkeypatch):
    monkeypatch.setattr(flwr, "__version__", "1.43.0")
    monkeypatch.setattr(flower_patches, "_applied", set())
    for start, why in (
        (flower_patches.bound_supernode_waits, "deaf to every later message"),
        (flower_patches.let_sites_rejoin_at_once, "refused for up to 60 s"),
    ):
        with pytest.raises(UserError) as refused:
            start()
        line = str(refused.value)
        assert "\n" not in line and why in line
        assert line.startswith("fedweave needs flwr 1.42.0 (installed: 1.43.0): ")
        assert line.endswith("install flwr==1.42.0")
    monkeypatch.setenv(flower_patches.STOCK_FLOWER_ENV, "1")  # no way around it
    with pytest.raises(UserError, match="needs flwr 1.42.0"):
        flower_patches.bound_supernode_waits()


def test_the_patched_supernode_does_not_start_on_another_flower():
    """``fedweave client``'s SuperNode command on another Flower: one line, exit status 1."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c",
         "import sys, flwr; flwr.__version__ = '1.43.0'\n"
         "from fedweave.flower_patches import launch\n"
         "sys.argv = ['launch', 'flower-supernode', '--help']\n"
         "launch.main()\n"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "fedweave: fedweave needs flwr 1.42.0 (installed: 1.43.0): its 'supernode_waits' fix "
        "to Flower is written for that version, and without it a site whose ClientApp ends "
        "without replying stays deaf to every later message; install flwr==1.42.0"
    ], done.stderr


def test_a_restarted_site_takes_its_online_node_back(monkeypatch):
    """On Flower's own SuperLink state: a node whose site was killed still counts as online
    until its heartbeat lapses; stock Flower refuses to activate it again meanwhile, the
    patched SuperLink lets its key's holder take it over at once."""
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.supercore.constant import NodeStatus
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.superlink.federation.noop_federation_manager import NoOpFederationManager

    from fedweave.flower_patches import node_restarts

    monkeypatch.setattr(InMemoryLinkState, "activate_node", InMemoryLinkState.activate_node)
    state = InMemoryLinkState(NoOpFederationManager(), ObjectStoreFactory().store())
    node = state.create_node("owner", "site0", b"site0-public-key", 30)
    assert state.activate_node(node, 30) is True  # the site's first process
    assert state.activate_node(node, 30) is False  # stock: its restart is refused
    node_restarts.install()
    assert state.activate_node(node, 30) is True  # patched: the restart takes the node
    (info,) = state.get_node_info(node_ids=[node])
    assert info.status == NodeStatus.ONLINE
    unknown = 12345
    assert state.activate_node(unknown, 30) is False  # no node, nothing to take over


def _fresh_python(code: str) -> str:
    """Run ``code`` in a new interpreter (no patch applied yet: an applied patch has replaced
    the very functions whose source is fingerprinted); its stdout."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_every_flower_function_a_patch_relies_on_matches_its_fingerprint():
    import json

    out = _fresh_python(
        "import json\n"
        "from fedweave.flower_patches.fingerprints import WRAPPED, mismatches\n"
        "print(json.dumps({patch: mismatches(patch) for patch in WRAPPED}))\n"
    )
    changed = json.loads(out.strip().splitlines()[-1])
    assert len(changed) >= 13  # every patch, the ClientApp worker and SecAgg+ stages included
    changed = {patch: refs for patch, refs in changed.items() if refs}
    assert not changed, f"Flower code changed under these patches: {changed}"


def test_fingerprints_read_from_the_files_agree_with_the_imported_code():
    """A process that has not imported Flower reads the fingerprints from Flower's files
    (``static_fingerprint``): each one it can tell is the imported code's, and a site's
    checks before it starts its SuperNode import no Flower at all."""
    import json

    out = _fresh_python(
        "import json, sys\n"
        "from fedweave import flower_patches as p\n"
        "from fedweave.flower_patches.fingerprints import WRAPPED, fingerprint, "
        "static_fingerprint\n"
        "assert p.correctness_problem('supernode_waits') is None\n"
        "assert p.correctness_problem('supernode_state') is None\n"
        "assert p.internal_use_problem('message_records') is None\n"
        "assert p.clientapp_worker_usable()\n"
        "flower_imported = sorted(m for m in sys.modules if m.split('.')[0] == 'flwr')\n"
        "refs = sorted({ref for refs in WRAPPED.values() for ref in refs})\n"
        "read = {ref: static_fingerprint(ref) for ref in refs}\n"
        "imported = {ref: fingerprint(ref) for ref in refs}\n"
        "print(json.dumps([flower_imported, read, imported]))\n"
    )
    flower_imported, read, imported = json.loads(out.strip().splitlines()[-1])
    assert flower_imported == []
    told = {ref: value for ref, value in read.items() if value is not None}
    assert len(told) > 0.8 * len(read), sorted(set(read) - set(told))
    assert told == {ref: imported[ref] for ref in told}


def test_an_altered_flower_function_is_named_and_its_patch_not_applied():
    out = _fresh_python(
        "import logging\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from flwr.superlink.grid import http_grid\n"
        "def send_and_receive(self, messages, *, timeout=None):\n"
        "    return []  # an edited copy of Flower\n"
        "http_grid.HttpGrid.send_and_receive = send_and_receive\n"
        "import flwr.superlink.main as main\n"
        "main._get_middleware = lambda: []\n"
        "from fedweave import flower_patches\n"
        "print('speed-up applied:', flower_patches.tune_deployed_polling())\n"
        "print('security:', flower_patches.security_patch_problem())\n"
    )
    assert "speed-up applied: False" in out
    assert "changed here: flwr.superlink.grid.http_grid:HttpGrid.send_and_receive" in out
    assert (
        "security: Flower's code differs from flwr 1.42.0's "
        "(flwr.superlink.main:_get_middleware)" in out
    )


def test_an_altered_flower_function_refuses_a_correctness_patch():
    out = _fresh_python(
        "import inspect, textwrap\n"
        "from flwr.server.superlink.linkstate import in_memory_linkstate as m\n"
        "source = textwrap.dedent(inspect.getsource(m.InMemoryLinkState.activate_node))\n"
        "edited = source.replace('NodeStatus.OFFLINE', 'NodeStatus.ONLINE')  # an edited copy\n"
        "assert edited != source\n"
        "namespace = dict(vars(m))\n"
        "exec(edited, namespace)\n"
        "m.InMemoryLinkState.activate_node = namespace['activate_node']\n"
        "from fedweave.errors import UserError\n"
        "from fedweave.flower_patches import let_sites_rejoin_at_once\n"
        "try:\n"
        "    let_sites_rejoin_at_once()\n"
        "except UserError as exc:\n"
        "    print('refused:', exc)\n"
    )
    assert out.startswith(
        "refused: fedweave needs flwr 1.42.0 as released: Flower's "
        "flwr.server.superlink.linkstate.in_memory_linkstate:InMemoryLinkState.activate_node "
        "differ here"
    ), out


def test_secagg_stages_wait_what_the_policy_says_and_forget_silent_sites(monkeypatch):
    """``StagedSecAggPlusWorkflow`` on Flower's own workflow state: each stage sends with the
    wait ``stage_wait`` chose, a halt stops before the stage, after the key advertisement the
    sites that sent no keys, and after the key shares the sites that sent no shares, are gone
    from the sampled sites and every neighbourhood (else Flower's unmasking asks the others
    for shares they never got, and the round halts for everyone)."""
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState

    from fedweave.coordinator.rounds.deadlines import DeadlineSecAggPlusWorkflow, RoundDeadline
    from fedweave.flower_patches.secagg_stages import STAGES

    sent, seen = [], []

    def stage(name):
        def run(self, grid, context, state):
            sent.append((name, self.timeout))
            if name == "setup":
                state.active_node_ids = {1, 2, 3, 5}  # site 4 advertised no keys
            if name == "share_keys":
                seen.append(set(state.sampled_node_ids))
                state.active_node_ids = {1, 2, 3}  # site 5 advertised keys, sent no shares
            return True

        return run

    workflow = DeadlineSecAggPlusWorkflow(
        RoundDeadline(60.0), num_shares=1.0, reconstruction_threshold=2, timeout=30.0
    )  # built on Flower's code as released (a workflow refuses to be built on other code)
    for name in STAGES:
        monkeypatch.setattr(SecAggPlusWorkflow, f"{name}_stage", stage(name))
    state = WorkflowState(
        sampled_node_ids={1, 2, 3, 4, 5},
        nid_to_neighbours={n: {1, 2, 3, 4, 5} - {n} for n in (1, 2, 3, 4, 5)},
    )
    workflow.begin_round()
    for name in STAGES:
        assert getattr(workflow, f"{name}_stage")(None, None, state) is True
    assert [name for name, _ in sent] == list(STAGES)
    assert all(29.0 < wait <= 30.0 for _, wait in sent)  # the per-stage cap, under 60 s left
    assert set(workflow.stage_seconds) == set(STAGES)
    assert seen == [{1, 2, 3, 5}]  # site 4 forgotten after the key advertisement
    assert state.sampled_node_ids == {1, 2, 3}
    assert state.nid_to_neighbours == {1: {2, 3}, 2: {1, 3}, 3: {1, 2}}
    workflow.end_round()
    workflow._deadline = 0.0  # the round's deadline has passed
    sent.clear()
    assert workflow.collect_masked_vectors_stage(None, None, state) is False
    assert workflow.unmask_stage(None, None, state) is True  # at least the floor, still
    assert sent == [("unmask", 5.0)]


class _Uploads:
    """Stands in for the SuperLink's Runtime API client (the real one needs a SuperLink and a
    site frozen between its reply's header and its weights, which no process can be made to do
    on cue): it hands out real reply headers with their object trees, each from the
    ``shown_from``-th pull on, and serves a reply's objects only once it is ``uploaded``."""

    def __init__(self) -> None:
        self.replies: dict[str, dict] = {}
        self.pulls = 0

    def add(self, asked_id: str, uploaded: bool = False, shown_from: int = 1) -> None:
        import numpy as np
        from flwr.app import ArrayRecord, Message, Metadata, RecordDict
        from flwr.supercore.inflatable.inflatable_object import (
            get_all_nested_objects,
            get_object_tree,
        )

        value = len(self.replies) + 1  # replies of their own content (objects are by hash)
        content = RecordDict({"arrays": ArrayRecord([np.full(3, value, dtype=np.float32)])})
        metadata = Metadata(
            run_id=1, message_id="", src_node_id=7, dst_node_id=0, reply_to_message_id=asked_id,
            group_id="1", created_at=0.0, ttl=60.0, message_type="train",
        )  # fmt: skip
        reply = Message(content=content, metadata=metadata)
        self.replies[asked_id] = {
            "reply": reply, "objects": get_all_nested_objects(reply),
            "tree": get_object_tree(reply), "uploaded": uploaded, "shown_from": shown_from,
        }  # fmt: skip

    def PullMessages(self, request):  # noqa: N802 - the client's own method names
        from flwr.app.message.message import remove_content_from_message
        from flwr.common.serde import message_to_proto
        from flwr.proto.runtime_pb2 import PullAppMessagesResponse

        self.pulls += 1
        headers, trees = [], []
        for asked_id, held in self.replies.items():
            if asked_id in request.message_ids and held["shown_from"] <= self.pulls:
                header = message_to_proto(remove_content_from_message(held["reply"]))
                header.metadata.message_id = held["reply"].object_id
                headers.append(header)
                trees.append(held["tree"])
        return PullAppMessagesResponse(messages_list=headers, message_object_trees=trees)

    def PullObject(self, request):  # noqa: N802
        from flwr.proto.message_pb2 import PullObjectResponse

        for held in self.replies.values():
            if request.object_id in held["objects"]:
                if not held["uploaded"]:
                    return PullObjectResponse(object_found=True, object_available=False)
                content = held["objects"][request.object_id].deflate()
                return PullObjectResponse(
                    object_found=True, object_available=True, object_content=content
                )
        return PullObjectResponse(object_found=False, object_available=False)

    def ConfirmMessageReceived(self, request):  # noqa: N802
        return None


def _grid_pulling_from(client, asked=("asked",)):
    from types import SimpleNamespace

    from flwr.superlink.grid.http_grid import HttpGrid

    grid = HttpGrid(token="test")
    grid._client, grid._run = client, SimpleNamespace(run_id=1)
    grid.push_messages = lambda messages: list(asked)
    return grid


@pytest.mark.timeout(60)
def test_a_reply_whose_weights_never_arrive_is_left_out_by_the_calls_deadline():
    """A site frozen after its reply's header (a stopped VM) held the coordinator inside
    Flower's pull for up to two hours (``PULL_MAX_TIME``); now the call returns by its timeout
    (plus ``LAST_PULL_SECONDS``) without that reply, so the round records the site late."""
    import time

    from fedweave.flower_patches import object_pulls

    assert flower_patches.tune_deployed_polling()
    frozen = _Uploads()
    frozen.add("asked")
    grid = _grid_pulling_from(frozen)
    started = time.monotonic()
    assert list(grid.send_and_receive([], timeout=1.0)) == []
    took = time.monotonic() - started
    assert took < 1.0 + object_pulls.LAST_PULL_SECONDS + 3.0, took

    frozen.replies["asked"]["uploaded"] = True  # the same reply with its weights: pulled whole
    (reply,) = grid.send_and_receive([], timeout=1.0)
    assert reply.metadata.reply_to_message_id == "asked" and not reply.has_error()
    assert reply.content.array_records["arrays"].to_numpy_ndarrays()[0].tolist() == [1, 1, 1]


@pytest.mark.timeout(60)
def test_a_reply_held_up_by_another_sites_missing_weights_is_still_on_time():
    """One site's header came first and its weights never: the pull that meets it is held to
    the deadline. A site whose whole reply came meanwhile answered in time and is kept (an
    insider sending headers early must not make the others late)."""
    assert flower_patches.tune_deployed_polling()
    uploads = _Uploads()
    uploads.add("frozen")
    uploads.add("honest", uploaded=True, shown_from=2)
    grid = _grid_pulling_from(uploads, asked=("frozen", "honest"))
    replies = list(grid.send_and_receive([], timeout=1.0))
    assert [r.metadata.reply_to_message_id for r in replies] == ["honest"]


@pytest.mark.timeout(60)
def test_an_async_run_reads_a_reply_whose_weights_never_arrive_as_late():
    import time

    from fedweave.coordinator.rounds.fedbuff import _Arrivals, _fit_result

    frozen = _Uploads()
    frozen.add("asked")
    arrivals = _Arrivals(_grid_pulling_from(frozen))
    started = time.monotonic()
    assert arrivals.first(["asked"], pulls_end=time.monotonic() + 1.0) == "asked"
    assert time.monotonic() - started < 6.0
    outcome = _fit_result(arrivals.replies.pop("asked"))
    assert outcome.status == "late"
    assert outcome.reason == "its update did not finish arriving in time"


def _running_task_expired_after(seconds: float, monkeypatch) -> bool:
    """Whether a SuperNode's state (Flower's own ``InMemoryNodeState``) counts a claimed,
    running ClientApp task as ended ``seconds`` after its last heartbeat."""
    from datetime import timedelta

    from flwr.supercore.constant import TaskType
    from flwr.supercore.corestate import in_memory_corestate
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

    state = InMemoryNodeState(ObjectStoreFactory().store())
    real_now = in_memory_corestate.now
    offset = timedelta(0)
    monkeypatch.setattr(in_memory_corestate, "now", lambda: real_now() + offset)
    task_id = state.create_task(TaskType.CLIENT_APP, run_id=7)
    token = state.claim_task(task_id)
    assert token is not None and state.activate_task(task_id)
    assert state.acknowledge_task_heartbeat(task_id)
    offset = timedelta(seconds=seconds)
    return state.get_task_by_token(token) is None


def test_a_task_without_a_heartbeat_ends_within_twenty_seconds_where_the_worker_beats_often(
    monkeypatch,
):
    """``task_expiry``: the SuperNode of a site that runs fedweave's worker (``--isolation
    process``) counts a ClientApp task as ended 20 s after its last heartbeat, not 60 s (it
    then answers the message "ClientApp stopped responding"); the worker beats every 3.5 to
    4.5 s, as Flower paces the shorter interval; stock Flower keeps its minute."""
    from flwr.supercore import heartbeat
    from flwr.supercore.corestate import in_memory_corestate

    from fedweave.flower_patches import task_expiry
    from fedweave.flower_patches.launch import _runs_external_worker

    assert _runs_external_worker(["--port", "9094", "--isolation", "process"])
    assert not _runs_external_worker(["--port", "9094", "--insecure"])
    assert not _runs_external_worker(["--isolation", "subprocess"])
    for module in (in_memory_corestate, heartbeat):
        monkeypatch.setattr(module, "HEARTBEAT_DEFAULT_INTERVAL", 30)  # stock; undone after
    assert not _running_task_expired_after(59, monkeypatch)  # stock: a minute
    assert _running_task_expired_after(61, monkeypatch)

    monkeypatch.setattr(flower_patches, "_applied", set())
    assert flower_patches.quick_task_expiry()
    assert not _running_task_expired_after(19, monkeypatch)
    assert _running_task_expired_after(21, monkeypatch)

    task_expiry.beat_often()  # the worker's side (clientapp_worker.task_heartbeat calls it)
    pace = heartbeat.HEARTBEAT_DEFAULT_INTERVAL - heartbeat.HEARTBEAT_CALL_TIMEOUT
    low, high = (pace * (heartbeat.HEARTBEAT_BASE_MULTIPLIER + r)
                 for r in heartbeat.HEARTBEAT_RANDOM_RANGE)  # fmt: skip
    assert (round(low, 6), round(high, 6)) == (3.5, 4.5)
