"""The site's state comes from events its SuperNode writes as data
(``fedweave.flower_patches.supernode_state``), never from Flower's log text: the reader, the
site's follower, and the wrapped retry handlers, without a network."""

from __future__ import annotations

import json
import os
import ssl
from pathlib import Path

import httpx
import pytest

from fedweave.flower_patches import supernode_state
from fedweave.flower_patches.supernode_state import (
    MAX_EVENT_LINE_BYTES,
    EventWriter,
    describe_error,
    read_events,
)


def test_reader_skips_garbled_unknown_and_oversized_lines_and_waits_for_a_whole_line(tmp_path):
    path = tmp_path / "state.jsonl"
    good = {"event": "connected", "node_id": 7}
    path.write_bytes(
        b"not json at all\n"
        + b"[1, 2, 3]\n"  # JSON, but not an event
        + b'{"no_event": true}\n'
        + b'{"event": 5}\n'  # an event name that is not a string
        + b"\xff\xfe\n"  # not UTF-8
        + json.dumps({"event": "x", "pad": "y" * MAX_EVENT_LINE_BYTES}).encode() + b"\n"
        + json.dumps(good).encode() + b"\n"
        + b'{"event": "retrying", "wai'  # still being written
    )  # fmt: skip
    events, offset = read_events(path, 0)
    assert events == [good]
    assert path.read_bytes()[offset:] == b'{"event": "retrying", "wai'
    with open(path, "ab") as out:
        out.write(b't_s": 2.5}\n')
    more, offset = read_events(path, offset)
    assert more == [{"event": "retrying", "wait_s": 2.5}]
    assert read_events(path, offset) == ([], offset)
    assert read_events(tmp_path / "missing.jsonl", 0) == ([], 0)


def test_writer_stops_at_its_size_limit(tmp_path, monkeypatch):
    path = tmp_path / "state.jsonl"
    monkeypatch.setattr(supernode_state, "MAX_STATE_FILE_BYTES", 200)
    emit = EventWriter(str(path))
    for n in range(20):
        emit("retrying", wait_s=n)
    assert 200 < path.stat().st_size < 400
    events, _ = read_events(path, 0)
    assert [e["wait_s"] for e in events] == list(range(len(events)))


def _events(tmp_path: Path, *events: dict) -> Path:
    path = tmp_path / "site.log.state.jsonl"
    with open(path, "a", encoding="utf-8") as out:
        for event in events:
            out.write(json.dumps(event) + "\n")
    return path


def test_the_site_says_connected_lost_rounds_and_a_run_end_from_events(tmp_path, capsys):
    from fedweave.client.cli import _SupernodeEvents

    path = _events(tmp_path, {"event": "retrying", "wait_s": 1.25, "error": "connect"})
    follower = _SupernodeEvents(path, "coord:9092")
    state = follower.poll()
    assert not state.connected and not state.lost
    _events(
        tmp_path,
        {"event": "connected", "node_id": 42},
        {"event": "message", "run_id": 9, "round": "1"},
        {"event": "message", "run_id": 9, "round": "1"},  # said once
        {"event": "message", "run_id": 9, "round": "2"},
        {"event": "unheard-of", "run_id": 9},  # a newer writer's event: ignored
        {"event": "retrying", "wait_s": 3, "error": "connect"},
    )
    state = follower.poll()
    assert state.connected and state.lost
    _events(
        tmp_path,
        {"event": "recovered", "call": "PullMessages"},
        {"event": "run-ended", "run_id": 9},
    )
    state = follower.poll()
    assert not state.lost
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "coordinator coord:9092 unreachable; retrying in 1.2 s",
        "connected to coord:9092 as node 42",
        "taking part in run 9, round 1",
        "taking part in run 9, round 2",
        "coordinator coord:9092 lost; reconnecting in 3.0 s",
        "coordinator coord:9092 answers again",
        "run 9 ended; waiting for the next run",
    ]


def test_a_refusal_names_the_key_file_to_send(tmp_path):
    from fedweave.client.cli import _SupernodeEvents, refusal_text

    path = _events(tmp_path, {"event": "refused", "why": "unknown-key", "http_status": 412})
    assert _SupernodeEvents(path, "c:1").poll().refused == "unknown-key"
    line = refusal_text("unknown-key", "c:1", Path("keys/hospital-a.key"), "SHA256:abc")
    assert line == (
        "coordinator c:1 refused this site: its key is not registered there (SHA256:abc); "
        "send keys/hospital-a.pub to the coordinator's operator "
        "(`fedweave sites add-key DIR hospital-a.pub`), then start this site again "
        "(a revoked key is refused the same way)"
    )
    assert "--site-key site.key" in refusal_text("needs-key", "c:1", None, None)
    assert "clock" in refusal_text("signature", "c:1", Path("s.key"), None)


def _status_error(status: int, body: dict | None = None) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "https://coord:9092/api/v0/fleet/activate-node")
    response = httpx.Response(status, json=body or {}, request=request)
    return httpx.HTTPStatusError("refused", request=request, response=response)


def test_failures_are_classified_by_type_status_and_flower_code_not_text():
    refused = describe_error(_status_error(412, {"code": 2004, "detail": "any words"}))
    assert refused == {"error": "http-412", "http_status": 412, "flower_code": 2004}
    verify = ssl.SSLCertVerificationError(1, "whatever the text says")
    verify.verify_code = 20
    wrapped = httpx.ConnectError("no words about it")
    wrapped.__cause__ = verify
    assert describe_error(wrapped) == {"error": "tls", "tls_verify_code": 20}
    assert describe_error(httpx.ConnectError("certificate ssl tls")) == {"error": "connect"}
    assert describe_error(httpx.ConnectTimeout("x")) == {"error": "timeout"}


def test_the_wrapped_retry_invoker_reports_retries_refusals_and_recovery(tmp_path):
    from flwr.supercore.retry import make_simple_http_retry_invoker

    path = tmp_path / "state.jsonl"
    invoker = supernode_state._with_events(make_simple_http_retry_invoker(), EventWriter(str(path)))
    invoker.wait_function = lambda _seconds: None
    failures = [httpx.ConnectError("down"), httpx.ConnectError("down")]

    def PullMessages() -> str:  # noqa: N802 - Flower's request names the event
        if failures:
            raise failures.pop()
        return "ok"

    def ActivateNode() -> None:  # noqa: N802
        raise _status_error(412, {"code": 2004, "detail": "Failed to activate SuperNode."})

    assert invoker.invoke(PullMessages) == "ok"
    with pytest.raises(httpx.HTTPStatusError):
        invoker.invoke(ActivateNode)
    events, _ = read_events(path, 0)
    assert [(e["event"], e.get("call")) for e in events] == [
        ("retrying", "PullMessages"),
        ("retrying", "PullMessages"),
        ("recovered", "PullMessages"),
        ("refused", "ActivateNode"),
    ]
    assert events[0]["error"] == "connect" and events[0]["wait_s"] >= 0
    assert events[-1]["why"] == "unknown-key" and events[-1]["flower_code"] == 2004


def test_a_run_that_no_longer_runs_is_reported_once(tmp_path, monkeypatch):
    from flwr.supercore.run import RunNotRunningException

    path = tmp_path / "state.jsonl"
    finished: set[int] = set()

    def get_run(run_id: int) -> None:
        if run_id in finished:
            raise RunNotRunningException

    watch = supernode_state._RunWatch(EventWriter(str(path)), get_run)
    watch.seen(5, "1")
    watch.seen(5, "1")
    watch.next_check = 0.0
    watch.idle()  # still running: nothing to say
    finished.add(5)
    watch.next_check = 0.0
    watch.idle()
    watch.next_check = 0.0
    watch.idle()  # said once
    watch.seen(6, "1")
    watch.seen(7, "")  # a new run's message ends the one before
    events, _ = read_events(path, 0)
    assert [(e["event"], e["run_id"]) for e in events] == [
        ("message", 5),
        ("run-ended", 5),
        ("message", 6),
        ("run-ended", 6),
        ("message", 7),
    ]


def test_the_patch_is_a_correctness_patch_applied_in_the_supernode(tmp_path, monkeypatch):
    import subprocess
    import sys

    import flwr

    from fedweave import flower_patches

    assert flower_patches.correctness_problem("supernode_state") is None
    monkeypatch.setattr(flwr, "__version__", "1.43.0")
    line = flower_patches.correctness_problem("supernode_state")
    assert line is not None and "\n" not in line and "connected, refused" in line
    code = (
        "from fedweave.flower_patches import launch\n"
        "launch._supernode()\n"
        "from flwr.supernode import start_client_internal as loop, fleet_http_connection as c\n"
        "print(loop._fedweave_state_patched, c.make_simple_http_retry_invoker.__module__)\n"
    )
    env = {**os.environ, supernode_state.SUPERNODE_STATE_FILE_ENV: str(tmp_path / "s.jsonl")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "fedweave.flower_patches.supernode_state"]
